"""The IMDNA task: answer a question with several answers from its K retrieved documents.

The task brings its own data (`training_data`, which the trainer calls in place of the
session corpus: `mtn_jax.data.imdna_library`) and its own evaluation
(`mtn_jax.evaluation.answer_hits`, which `--mode=eval` calls for it), so the same CLI, checkpoints
and exact resume serve it.

The loss is the sigmoid cross-entropy of every candidate answer (multi-label), summed over
candidates, averaged over questions that have an answer.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mtn_jax import errors
from mtn_jax import models
from mtn_jax.data import imdna_library
from mtn_jax.data.imdna_library import Library
from mtn_jax.data.imdna_library import QuestionSet
from mtn_jax.models.base import ModelConfig
from mtn_jax.tasks import base


def check_config(config: ml_collections.ConfigDict) -> None:
  """One-line errors naming the key, for the values this task reads: its data's
  (`imdna_library.check_config`) and the model's reader."""
  imdna_library.check_config(config)
  if config.model.reader not in models.imdna.READERS:
    raise errors.Error(f'config.model.reader must be one of {models.imdna.READERS}, '
                       f'got {config.model.reader!r}')


@dataclasses.dataclass(frozen=True, eq=False)
class IMDNATask(base.ModelTask):
  """Multi-label answer prediction (see the module docstring); `cfg` is an IMDNAConfig."""

  input_keys = ('question', 'documents', 'answers')
  LOSS_KEYS = ('answers',)
  PACE_WORDS = ('question slots', 'questions')  # a batch's rows, the real questions among them
  check_config = staticmethod(check_config)  # config_lib.validate asks it before any work

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> IMDNATask:
    del train, data_dir  # the loss has no settings; the data comes with the batches
    return cls(cfg)

  @classmethod
  def training_data(cls, config: ml_collections.ConfigDict, workdir: str):
    """The trainer's `TrainingData`: the library's train and valid questions in batches of
    `config.imdna.batch_size` rounded down to a multiple of the device count."""
    check_config(config)
    if jax.process_count() > 1:
      raise errors.Error('the IMDNA task trains in one process (its batches are not sharded '
                         'by host)')
    library = imdna_library.load_library(config, workdir)
    task = cls(model_config(config, library))
    batch_size = max(jax.device_count(),
                     config.imdna.batch_size // jax.device_count() * jax.device_count())
    train = library.splits['train']
    batches = imdna_library.question_batches(train, library.document_tokens, batch_size,
                                             config.seed)
    valid = functools.partial(imdna_library.question_batches, library.splits['valid'],
                              library.document_tokens, batch_size)
    return base.TrainingData(
        library.vocab, task, batches, len(train) // batch_size, valid,
        f'{len(train):,} training questions ({config.imdna.task}), '
        f'{len(library.documents):,} documents, {len(library.answers):,} candidate answers',
        examples_key='question_ids', order_keys=('seed', 'imdna.batch_size'))

  def example_batch(self) -> dict[str, jax.Array]:
    return {'question': jnp.ones((1, self.cfg.max_query_words), jnp.int32),
            'documents': jnp.ones((1, 1, 2), jnp.int32)}

  def loss_sums(self, params, batch: Mapping[str, jax.Array], *, train: bool, rngs=None,
                groups: int = 1) -> dict[str, jax.Array]:
    """float32 sums over the batch's questions that have an answer: 'loss' and 'nll' (the
    summed sigmoid cross-entropy), 'correct' (the top answer is right: HITS@1), 'tokens'
    and 'pairs' (questions; the trainer's per-token figures are per question)."""
    del groups  # nothing is normalised per data-parallel group
    logits = self.model.apply({'params': params}, batch, train=train, rngs=rngs)
    targets = multi_hot(batch['answers'], logits.shape[-1])
    real = (batch['answers'][:, 0] >= 0).astype(jnp.float32)
    per_question = optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1) * real
    correct = jnp.take_along_axis(targets, jnp.argmax(logits, -1)[:, None], -1)[:, 0] * real
    loss = per_question.sum()
    return {'loss': loss, 'nll': loss, 'correct': correct.sum(), 'tokens': real.sum(),
            'pairs': real.sum()}

  def answer_scores(self, params, library: Library, questions: QuestionSet,
                    batch_size: int) -> np.ndarray:
    """float32 [N, A]: the model's probability of every candidate answer."""
    out = np.zeros((len(questions), len(library.answers)), np.float32)
    for batch in imdna_library.question_batches(questions, library.document_tokens,
                                                batch_size):
      rows = batch.pop('question_ids')
      probabilities = np.asarray(_answer_probabilities(
          params, {k: batch[k] for k in ('question', 'documents')}, task=self))
      out[rows[rows >= 0]] = probabilities[rows >= 0]
    return out

  @staticmethod
  def summarize(totals: Mapping[str, Any]) -> dict[str, float]:
    """Validation loss per question and HITS@1 (percent)."""
    questions = max(float(totals['tokens']), 1.0)
    return {'loss': float(totals['nll']) / questions,
            'hits_at_1': 100.0 * float(totals['correct']) / questions,
            'questions': float(totals['tokens'])}


def multi_hot(answers: jax.Array, num_items: int) -> jax.Array:
  """int32 [B, M] answer ids, -1-padded -> float32 [B, A] with 1 at every answer."""
  # Padding points past the last column, where mode='drop' leaves it out (a -1 would wrap).
  columns = jnp.where(answers >= 0, answers, num_items)
  return jnp.zeros((answers.shape[0], num_items), jnp.float32).at[
      jnp.arange(answers.shape[0])[:, None], columns].set(1.0, mode='drop')


def model_config(config: ml_collections.ConfigDict, library: Library) -> ModelConfig:
  return models.make_config(config.model, vocab_size=len(library.vocab),
                            max_query_words=config.imdna.max_question_words,
                            num_items=len(library.answers))


@functools.partial(jax.jit, static_argnames=('task',))
def _answer_probabilities(params, batch, *, task: IMDNATask) -> jax.Array:
  return jax.nn.sigmoid(task.model.apply({'params': params}, batch, train=False))
