"""Tasks: what a kind of model learns, how it is measured in training, and how it suggests.

A task wraps a model of `mtn_jax.models` and owns what differs between kinds of model, so
that the trainer, the evaluation and the suggestion pipeline never ask which model they hold.
Its contract is `Task` (below); what only some tasks can do is a capability of its own, a
`typing.Protocol` checked with `isinstance` (or `issubclass` on a class):

  `Suggests`          writes suggestions: `suggest(params, batch, settings, ...)` -> ranked
                      hypotheses for each context (the generative models);
  `ScoresCandidates`  scores candidates given by their words (Bi-, Poly-, Cross-encoders),
                      and so learns from generated ones (`config.train.hypotheses_from`);
  `ScoresPool`        scores the whole candidate pool from vectors cached per checkpoint
                      (Bi- and Poly-encoders, the zero attention family), and says whether an
                      approximate nearest-neighbour index can search it (`vector_index`);
  `AttendsToMemory`   reports its attention on a user's memory (the zero attention family);
  `BringsOwnData`     makes its own training data (`TrainingData`) in place of the session
                      corpus, and is evaluated by its own measures (IMDNA);
  `AnswersQuestions`  scores a library's candidate answers to its questions (IMDNA, whose
                      answers to a session are the next queries of similar sessions).

What a model reads is the task's too: `context_inputs` gives the arrays of a split's sessions
it reads to suggest (evaluation gathers them from the corpus, decode and the service from the
sessions they are given, `mtn_jax.inference.inputs.context_batch`), `training_inputs` those
and what only its loss reads.

`ModelTask` is what every task shares (its model, the layout of its layer stacks, its
parameters). `GenerationTask` is next-query generation with teacher forcing (MTN, the
Transformer and the recurrent baselines). `RankingTask` is the base of the rankers, which score candidate queries
(the training split's distinct queries, `mtn_jax.data.candidate_pool`) rather than write one.
Which task serves which model is `mtn_jax.tasks.registry`'s table; `make_task` builds it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import models
from mtn_jax.data import extended
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import search
from mtn_jax.models.base import ModelConfig
from mtn_jax.tasks import losses


class Task(Protocol):
  """What every task does for the trainer, the evaluation and the pipeline.

  Attributes:
    cfg: the model's config; the model is built from it.
    input_keys: the batch keys its training and evaluation steps read, the ones put on the
      devices.
    context_keys: those the model reads to suggest after a context (`input_keys` but what
      only the loss reads: targets, negatives), which decode and the service give it.
    model: the Linen module.
    reads_users: whether the model reads who the user is or their earlier queries.
    PACE_WORDS: what the trainer's pace line counts a second (a batch's rows, the loss's
      'tokens').
  """

  cfg: ModelConfig
  PACE_WORDS: tuple[str, str]

  @property
  def input_keys(self) -> tuple[str, ...]: ...

  @property
  def context_keys(self) -> tuple[str, ...]: ...

  @property
  def reads_users(self) -> bool: ...

  @property
  def model(self) -> nn.Module: ...

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> Task: ...

  def with_layout(self, scan_layers: bool | None) -> Task:
    """This task with the model's layer stacks in the layout a checkpoint was saved in."""

  def init_params(self, rng: jax.Array) -> Any: ...

  def abstract_params(self) -> Any: ...

  def context_inputs(self, split, vocab) -> SplitInputs:
    """The arrays of `split` beyond its queries that the model reads to suggest: what
    evaluation, decode and the service give it."""

  def training_inputs(self, split, vocab) -> SplitInputs:
    """`context_inputs` and what only the training loss reads (targets, negatives)."""

  def loss_sums(self, params, batch: Mapping[str, jax.Array], *, train: bool, rngs=None,
                groups: int = 1) -> dict[str, jax.Array]:
    """float32 sums over the batch ('loss', 'nll', 'correct', 'tokens', 'pairs')."""

  @staticmethod
  def training_loss(sums: Mapping[str, jax.Array]) -> jax.Array:
    """The scalar the optimizer minimises."""

  @staticmethod
  def summarize(totals: Mapping[str, Any]) -> dict[str, float]:
    """The validation figures of summed eval-step outputs."""


@runtime_checkable
class Suggests(Protocol):
  """Writes suggestions word by word."""

  def suggest(self, params, batch: Mapping[str, jax.Array | np.ndarray],
              settings: search.SearchSettings, *, positions: str = 'all',
              lengths: np.ndarray | None = None) -> tuple[jax.Array, jax.Array]:
    """(sequences int32 [B, P, beam, max_len], scores float32 [B, P, beam]), best first."""


@runtime_checkable
class ScoresCandidates(Protocol):
  """Scores candidate next queries given by their words."""

  def score_candidates(self, params, batch: Mapping[str, jax.Array],
                       candidates: jax.Array) -> jax.Array:
    """candidates int32 [B, S-1, K, n] -> float32 [B, S-1, K]."""


@runtime_checkable
class ScoresPool(Protocol):
  """Scores every entry of the candidate pool from per-candidate vectors."""

  @classmethod
  def vector_index(cls, cfg: ModelConfig) -> bool:
    """Whether the model `cfg` describes scores an entry by the inner product of one context
    vector (`mtn_jax.inference.retrieval.bi_contexts`) and the entry's cached vector, so that
    an approximate nearest-neighbour index finds its best (`config.suggest.index`)."""

  def encode_candidates(self, params, candidates: jax.Array) -> jax.Array:
    """candidates int32 [C, n] -> the part of the scoring that depends on them alone,
    computed once per checkpoint (`mtn_jax.inference.retrieval.candidate_cache`)."""

  def score_pool(self, params, batch: Mapping[str, jax.Array], cache: jax.Array) -> jax.Array:
    """-> float32 [B, S-1, C], every pool candidate scored after each session prefix."""


@runtime_checkable
class AttendsToMemory(Protocol):
  """Reports how its attention over a user's memory falls."""

  def attention(self, params, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """{'zero_weight': float32 [B, S-1], the mass on the zero vector, ...}."""


@dataclasses.dataclass(frozen=True)
class SplitInputs:
  """Arrays of a split that the input pipeline gathers into batches beside its queries.

  Attributes:
    per_query: {batch key: [num_queries, ...]}, row for row with the split's queries.
    per_session: {batch key: [num_sessions, ...]}.
  """

  per_query: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
  per_session: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  def __or__(self, other: SplitInputs) -> SplitInputs:
    """Both inputs' arrays (`other`'s where both have a key)."""
    return SplitInputs({**self.per_query, **other.per_query},
                       {**self.per_session, **other.per_session})


@dataclasses.dataclass(frozen=True)
class TrainingData:
  """What the loop trains and validates on, whichever task supplies it.

  Attributes:
    vocab: the words the model reads (its fingerprint goes into every checkpoint).
    task: the task, built for the data's sizes.
    train: endless training batches (numpy dicts, a grain dataset whose iterator state
      resumes exactly), each with `examples_key` (int32 [batch], -1 on padding rows).
    steps_per_epoch: global batches per pass over the training data.
    valid_batches: () -> one pass over the validation batches, padded like `train`'s.
    description: what the data holds, for the run's first log line.
    examples_key: the batch key that marks real rows.
    order_keys: the config keys that fix the batches and their order besides the data (a
      resumed run continues the checkpoint's iterator, so it refuses other values of them).
  """

  vocab: Vocab
  task: Any
  train: grain.IterDataset
  steps_per_epoch: int
  valid_batches: Callable[[], Iterable[dict]]
  description: str
  examples_key: str = 'session_ids'
  order_keys: tuple[str, ...] = ('seed', 'input.train_queries_per_batch')


@runtime_checkable
class BringsOwnData(Protocol):
  """Makes its own training data in place of the session corpus, and is evaluated by its
  own measures (checked on the class: `issubclass(task_class, BringsOwnData)`)."""

  @classmethod
  def training_data(cls, config: ml_collections.ConfigDict, workdir: str) -> TrainingData:
    """The trainer's data (`TrainingData`)."""


@runtime_checkable
class AnswersQuestions(Protocol):
  """Scores every candidate answer of a library (`mtn_jax.data.imdna_library`) to each of
  its questions."""

  def answer_scores(self, params, library, questions, batch_size: int) -> np.ndarray:
    """float32 [questions, answers]: the model's probability of every candidate answer."""


# (task class, model config) -> the parameters' shapes and dtypes. A parameter tree is a
# function of the model's config alone (every task's example batch is), and tracing a model's
# init is most of loading a checkpoint, time the service's batches wait for during a reload
# (the interpreter is shared; docs/notes/2026-11-27-figures-from-code-comments.md).
_ABSTRACT_PARAMS: dict[tuple[type, ModelConfig], Any] = {}


def shapes_of_params(task) -> Any:
  """`task`'s parameters as `jax.ShapeDtypeStruct`s, at no compute cost; traced once per task
  class and model config in a process. A new tree each call (the leaves are immutable)."""
  key = (type(task), task.cfg)
  if key not in _ABSTRACT_PARAMS:
    _ABSTRACT_PARAMS[key] = jax.eval_shape(task.init_params, jax.random.PRNGKey(0))
  return jax.tree.map(lambda leaf: leaf, _ABSTRACT_PARAMS[key])


@dataclasses.dataclass(frozen=True, eq=False)
class ModelTask:
  """What every task shares: its model, built once from `cfg`, the layout of the model's layer
  stacks, its parameters and the mean training loss. A subclass adds its inputs, its loss and
  its capabilities; one whose model takes another batch than a session's queries overrides
  `example_batch`.

  Attributes:
    cfg: the model's config; the model is built from it.
  """

  cfg: ModelConfig

  # The keys of `input_keys` that only the loss reads (a subclass's targets, negatives).
  LOSS_KEYS: ClassVar[tuple[str, ...]] = ()
  # What the trainer's pace line counts a second: a batch's rows, and the loss's 'tokens'.
  PACE_WORDS: ClassVar[tuple[str, str]] = ('sessions', 'tokens')

  @property
  def context_keys(self) -> tuple[str, ...]:
    """The batch keys the model reads to suggest: `input_keys` but `LOSS_KEYS`."""
    return tuple(k for k in self.input_keys if k not in self.LOSS_KEYS)

  @functools.cached_property
  def model(self) -> nn.Module:
    # One module object per task: the search compiles once per model (a static argument).
    return models.create_model(self.cfg)

  @property
  def spec(self) -> models.ModelSpec:
    return models.spec(self.cfg.name)

  @property
  def reads_users(self) -> bool:
    """Whether the model reads each user's earlier queries (its config class decides)."""
    return type(self.cfg).reads_user_history(self.cfg)

  @property
  def copies(self) -> bool:
    """Whether the model mixes copied session words into its output (its config class
    decides)."""
    return type(self.cfg).copies(self.cfg)

  def with_layout(self, scan_layers: bool | None) -> ModelTask:
    """This task with the model's layer stacks in the layout `scan_layers` (unchanged for
    None or a model without layer stacks): the layout a checkpoint was saved in."""
    if scan_layers is None or getattr(self.cfg, 'scan_layers', scan_layers) == scan_layers:
      return self
    return dataclasses.replace(self, cfg=self.cfg.replace(scan_layers=scan_layers))

  def example_batch(self) -> dict[str, jax.Array]:
    """The smallest batch the model takes (`models.ModelSpec.example_batch`), with a user's
    earlier queries for a model that reads them."""
    batch = self.spec.example_batch(self.cfg)
    if self.reads_users:
      batch['history'] = jnp.ones((1, 1, self.cfg.max_query_words), jnp.int32)
    return batch

  def init_params(self, rng: jax.Array) -> Any:
    """The model's initial parameters, made from its example batch."""
    return self.model.init({'params': rng}, self.example_batch(), train=False)['params']

  def abstract_params(self) -> Any:
    """The parameters' shapes and dtypes (`jax.ShapeDtypeStruct`s), at no compute cost."""
    return shapes_of_params(self)

  @staticmethod
  def training_loss(sums: Mapping[str, jax.Array]) -> jax.Array:
    """The mean training loss per real target token (per scored context, or question, for a
    task that counts those as its 'tokens')."""
    return sums['loss'] / jnp.maximum(sums['tokens'], 1.0)


@dataclasses.dataclass(frozen=True)
class GenerationTask(ModelTask):
  """Generate the next query word by word (see the module docstring).

  Attributes:
    cfg: the model's config; the model is built from it.
    label_smoothing, entropy_weight: as for `losses.token_losses`.
    chunk_tokens: target slots the fused loss head projects at a time, per data-parallel
      group (`losses.output_layer_losses`).
  """

  label_smoothing: float = 0.0
  entropy_weight: float = 0.0
  chunk_tokens: int = 256

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> GenerationTask:
    del data_dir  # everything it needs is in the model's config
    return cls(cfg, label_smoothing=train.label_smoothing,
               entropy_weight=train.entropy_weight, chunk_tokens=train.loss_chunk_tokens)

  @property
  def input_keys(self) -> tuple[str, ...]:
    """The batch keys the model reads: the queries, for a copying model the numbers of the
    words outside the vocabulary (`mtn_jax.data.extended`), and for a model with a user
    memory the user's earlier queries."""
    return (('queries',) + (('oov',) if self.copies else ())
            + (('history',) if self.reads_users else ()))

  def context_inputs(self, split, vocab) -> SplitInputs:
    """'oov' [num_queries, n] for a copying model (the numbers of the words outside the
    vocabulary, `mtn_jax.data.extended`); 'history' [num_sessions, M, n] for a model with a
    user memory."""
    inputs = SplitInputs()
    if self.copies:
      inputs.per_query['oov'] = extended.split_oov_numbers(split, vocab)
    if self.reads_users:
      if split.history is None or split.history.shape[1] == 0:
        raise errors.Error(f'config.model.user_memory={self.cfg.user_memory!r} needs the '
                           f'users\' earlier queries: set config.data.history_queries > 0 '
                           f'(the {split.name} split has none)')
      inputs.per_session['history'] = split.history
    return inputs

  def training_inputs(self, split, vocab) -> SplitInputs:
    """`context_inputs`: teacher forcing reads nothing else."""
    return self.context_inputs(split, vocab)

  def loss_sums(self, params, batch: Mapping[str, jax.Array], *, train: bool, rngs=None,
                groups: int = 1) -> dict[str, jax.Array]:
    """`losses.session_losses`: float32 'loss', 'nll', 'correct', 'tokens', 'pairs' sums."""
    return losses.session_losses(
        self.model, params, batch, train=train, rngs=rngs,
        label_smoothing=self.label_smoothing if train else 0.0,
        entropy_weight=self.entropy_weight if train else 0.0,
        chunk_tokens=self.chunk_tokens, groups=groups)

  @staticmethod
  def summarize(totals: Mapping[str, Any]) -> dict[str, float]:
    """Validation loss (nll per target token), perplexity, token accuracy and pairs, from
    eval-step sums added over a split."""
    tokens = max(float(totals['tokens']), 1.0)
    loss = float(totals['nll']) / tokens
    return {'loss': loss, 'perplexity': math.exp(min(loss, 50.0)),
            'token_accuracy': float(totals['correct']) / tokens,
            'pairs': float(totals['pairs'])}

  def suggest(self, params, batch: Mapping[str, jax.Array | np.ndarray],
              settings: search.SearchSettings, *, positions: str = 'all',
              lengths: np.ndarray | None = None) -> tuple[jax.Array, jax.Array]:
    """Beam-searched suggestions: `search.search_sessions` (sequences int32
    [B, P, beam, max_len], scores float32 [B, P, beam], best first)."""
    return search.search_sessions(self.model, params, batch, settings, positions=positions,
                                  lengths=lengths)


@dataclasses.dataclass(frozen=True, eq=False)
class RankingTask(ModelTask):
  """The base of the rankers: models that score candidate next queries.

  A subclass sets `from_config` (and `example_batch`, where its model reads more than the
  queries), its loss (`loss_sums`, with
  'loss', 'nll', 'correct', 'tokens', 'pairs' sums, 'tokens' counting the scored contexts so
  the trainer's per-token figures are per context, `PACE_WORDS` saying so), and how it scores
  candidates:
    `encode_candidates(params, candidates int32 [C, n])` -> the part of the pool's scoring
      that depends on the candidates alone, computed once per checkpoint
      (`mtn_jax.inference.retrieval` caches it);
    `score_pool(params, batch, cache)` -> float32 [B, S-1, C], every pool candidate scored
      after each session prefix (position t predicts query t+1);
    `score_candidates(params, batch, candidates int32 [B, S-1, K, n])` -> float32
      [B, S-1, K], for candidates given by their words (a model that can only score the
      pool's own entries does not define it).
  Which of these a subclass defines are its capabilities (`ScoresPool`, `ScoresCandidates`).

  Attributes:
    cfg: the model's config.
  """

  PACE_WORDS: ClassVar[tuple[str, str]] = ('sessions', 'contexts')

  def context_inputs(self, split, vocab) -> SplitInputs:
    """Nothing beyond the queries (a subclass that reads a user says what)."""
    del split, vocab
    return SplitInputs()

  def training_inputs(self, split, vocab) -> SplitInputs:
    """`context_inputs` (a subclass adds its targets and negatives)."""
    return self.context_inputs(split, vocab)

  @staticmethod
  def summarize(totals: Mapping[str, Any]) -> dict[str, float]:
    """Validation loss (the target's negative log-likelihood among the candidates, per
    context), its perplexity (how many candidates the model hesitates between) and how often
    the target ranks first."""
    contexts = max(float(totals['tokens']), 1.0)
    loss = float(totals['nll']) / contexts
    return {'loss': loss, 'perplexity': math.exp(min(loss, 50.0)),
            'accuracy': float(totals['correct']) / contexts,
            'pairs': float(totals['pairs'])}
