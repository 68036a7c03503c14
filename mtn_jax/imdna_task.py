"""The IMDNA task: answer a question with several answers from its K retrieved documents.

The task brings its own data (`training_data`, which the trainer calls in place of the
session corpus) and its own evaluation (`evaluate`, which `--mode=eval` calls), so the same
CLI, checkpoints and exact resume serve it. `config.imdna.task` picks the data:

- 'qa', 'recs' (`config.data.source='movies'`): the generated movie knowledge base
  (`mtn_jax.data.movies`). Documents are the movies' texts; the candidate answers are the
  knowledge base's entities; questions come with their answers.
- 'aol' (a session corpus, `mtn_jax.data.preprocess`): a question is a session prefix
  (its queries joined by <sep>); the documents are training sessions of other users, each
  its queries joined by <sep>; the answers are the vocabulary words of the logged next query
  (the candidate answers are the vocabulary). Whole queries are ranked too: the queries that
  follow, in each retrieved session, the query most like the prefix's last one, each scored
  by the mean probability of its words.

Every question reads the top `config.imdna.num_documents` documents BM25 returns for it
(`mtn_jax.retrieval`, cached in `<workdir>/retrieval/`); a training question never reads a
document of its own (AOL: a session of the same user).

Batches (numpy, then on the devices):
  'question'      int32 [B, Lq]     word ids, 0-padded (`config.imdna.max_question_words`,
                                     the last ones kept when longer)
  'documents'     int32 [B, K, Ld]  the retrieved documents' word ids, best first; a missing
                                     document is all padding
  'answers'       int32 [B, M]      answer ids (into the candidates), -1-padded
  'question_ids'  int32 [B]         the question's index in its split, -1 on padding rows
The loss is the sigmoid cross-entropy of every candidate answer (multi-label), summed over
candidates, averaged over questions that have an answer.

`evaluate` writes `<workdir>/eval/results.json`: HITS@1/10/100 (a question is a hit when one
of its answers is among the top k), for the model and for BM25 alone (each entity of the
retrieved documents scored by the summed BM25 scores of the documents holding it, the
question's own words left out); on AOL also Recall@k of the next query's words and the
query-level ranking metrics beside the trivial suggesters (`mtn_jax.evaluate`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from mtn_jax import errors
from mtn_jax import metrics
from mtn_jax import models
from mtn_jax import retrieval
from mtn_jax.data import movies
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.vocab import PAD_ID, SPECIAL_TOKENS, UNK_ID, Vocab
from mtn_jax.models.base import ModelConfig

TASKS = ('qa', 'recs', 'aol')
HITS_AT = (1, 10, 100)
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)


# ---------------------------------------------------------------------------------------------
# The data


@dataclasses.dataclass(frozen=True)
class QuestionSet:
  """One split's questions, row for row.

  question: int32 [N, Lq]; documents: int32 [N, K] retrieved document ids, best first, -1
  for none; document_scores: float32 [N, K] their BM25 scores; answers: int32 [N, M] answer
  ids, -1-padded; texts: the questions; answer_texts: each question's answers as text (on
  AOL the logged next query).
  """

  question: np.ndarray
  documents: np.ndarray
  document_scores: np.ndarray
  answers: np.ndarray
  texts: list[str]
  answer_texts: list[str]

  def __len__(self) -> int:
    return len(self.question)


@dataclasses.dataclass(frozen=True)
class Library:
  """Everything the task reads: the words, the documents, the candidate answers and the
  questions of each split.

  document_tokens: int32 [D + 1, Ld], row D all padding (where a -1 document id lands);
  answer_words: int32 [A] the word id of each candidate answer; splits: name -> QuestionSet;
  extra: the AOL splits' context for query-level evaluation.
  """

  vocab: Vocab
  documents: list[str]
  document_tokens: np.ndarray
  answers: list[str]
  answer_words: np.ndarray
  splits: dict[str, QuestionSet]
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def _pad_rows(rows: Sequence[Sequence[int]], width: int, fill: int, keep: str = 'first'
              ) -> np.ndarray:
  out = np.full((len(rows), width), fill, np.int32)
  for i, row in enumerate(rows):
    row = list(row)[:width] if keep == 'first' else list(row)[-width:]
    out[i, :len(row)] = row
  return out


def _retrieval_dir(workdir: str, name: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'retrieval', name)


def _movies_library(config: ml_collections.ConfigDict, workdir: str) -> Library:
  settings = config.imdna
  movies.prepare(config, workdir)
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  vocab = sessions.load_vocab(data_dir)
  documents = movies.load_documents(data_dir)
  answers = movies.answer_entities(documents)
  answer_ids = {a: i for i, a in enumerate(answers)}
  index = retrieval.open_index(_retrieval_dir(workdir, 'movies'), documents,
                               k1=settings.bm25_k1, b=settings.bm25_b)
  splits = {}
  for split in movies.SPLITS:
    questions = movies.load_questions(data_dir, settings.task, split)
    texts = [q.text for q in questions]
    ids, scores = retrieval.cached_top_k(index, f'{settings.task}.{split}', texts,
                                         settings.num_documents)
    splits[split] = QuestionSet(
        question=_pad_rows([vocab.encode_text(t) for t in texts],
                           settings.max_question_words, PAD_ID),
        documents=ids, document_scores=scores,
        answers=_pad_rows([[answer_ids[a] for a in q.answers] for q in questions],
                          max(len(q.answers) for q in questions), -1),
        texts=texts, answer_texts=[' | '.join(q.answers) for q in questions])
  return Library(vocab, documents, _document_tokens(documents, vocab, settings), answers,
                 np.asarray(vocab.encode(answers), np.int32), splits)


def _document_tokens(documents: Sequence[str], vocab: Vocab,
                     settings: ml_collections.ConfigDict) -> np.ndarray:
  rows = [vocab.encode_text(d) for d in documents] + [[]]
  return _pad_rows(rows, settings.max_document_words, PAD_ID)


def _session_text(texts: Sequence[str]) -> str:
  return ' <sep> '.join(texts)


def _aol_library(config: ml_collections.ConfigDict, workdir: str) -> Library:
  settings = config.imdna
  preprocess.prepare(config, workdir)
  data_dir = preprocess.data_dir(os.path.abspath(workdir))
  vocab = sessions.load_vocab(data_dir)
  splits_on_disk = {s: sessions.load_split(data_dir, s) for s in sessions.SPLITS}
  train = splits_on_disk['train']
  if train.users is None:
    raise errors.Error(f'{data_dir}: the corpus records no users, which retrieval needs to '
                       'keep a user\'s own sessions out of their documents')
  documents = [_session_text(train.session_texts(i)) for i in range(train.num_sessions)]
  document_users = np.asarray(train.users)
  # BM25 reads words: the documents' <sep> marks only the model's inputs.
  index = retrieval.open_index(_retrieval_dir(workdir, 'aol'),
                               [d.replace(' <sep> ', ' ') for d in documents],
                               k1=settings.bm25_k1, b=settings.bm25_b)
  splits, extra = {}, {}
  for name, split in splits_on_disk.items():
    session_of, position_of = [], []
    for i in range(split.num_sessions):
      for t in range(int(split.lengths[i]) - 1):
        session_of.append(i)
        position_of.append(t)
    contexts = [split.session_texts(i)[:t + 1] for i, t in zip(session_of, position_of)]
    nexts = [split.session_texts(i)[t + 1] for i, t in zip(session_of, position_of)]
    users = np.asarray(split.users)[session_of] if session_of else np.zeros(0, np.int64)
    ids, scores = retrieval.cached_top_k(
        index, name, [' '.join(c) for c in contexts], settings.num_documents,
        exclude=lambda i, found, users=users: document_users[found] == users[i],
        exclusion='same user')
    answers = []
    for text in nexts:
      words = [w for w in dict.fromkeys(vocab.encode_text(text)) if w != UNK_ID]
      answers.append(words or [])
    splits[name] = QuestionSet(
        question=_pad_rows([vocab.encode_text(_session_text(c)) for c in contexts],
                           settings.max_question_words, PAD_ID, keep='last'),
        documents=ids, document_scores=scores,
        answers=_pad_rows(answers, max([len(a) for a in answers] + [1]), -1),
        texts=[_session_text(c) for c in contexts], answer_texts=nexts)
    extra[name] = {'contexts': contexts}
  extra['train_split'] = train
  extra['document_queries'] = [train.session_texts(i) for i in range(train.num_sessions)]
  extra['document_users'] = document_users
  extra['index'] = index
  answers = list(vocab.words)
  return Library(vocab, documents, _document_tokens(documents, vocab, settings), answers,
                 np.arange(len(vocab), dtype=np.int32), splits, extra)


def load_library(config: ml_collections.ConfigDict, workdir: str) -> Library:
  """The task's data for `config.imdna.task` (see the module docstring)."""
  check_config(config)
  if config.imdna.task == 'aol':
    return _aol_library(config, workdir)
  return _movies_library(config, workdir)


def check_config(config: ml_collections.ConfigDict) -> None:
  """One-line errors naming the key, for the values this task reads."""
  if 'imdna' not in config:
    raise errors.Error('config.model.name=imdna reads config.imdna: use '
                       'configs/imdna_movies.py or configs/imdna_aol.py')
  settings = config.imdna
  if settings.task not in TASKS:
    raise errors.Error(f'config.imdna.task must be one of {TASKS}, got {settings.task!r}')
  if (settings.task == 'aol') == (config.data.source == 'movies'):
    raise errors.Error(f'config.imdna.task={settings.task!r} does not read '
                       f'config.data.source={config.data.source!r} (the movie tasks read '
                       "'movies', 'aol' a query log)")
  for key in ('num_documents', 'max_document_words', 'max_question_words', 'batch_size'):
    if settings[key] < 1:
      raise errors.Error(f'config.imdna.{key} must be positive, got {settings[key]}')
  if config.model.reader not in models.imdna.READERS:
    raise errors.Error(f'config.model.reader must be one of {models.imdna.READERS}, '
                       f'got {config.model.reader!r}')


class _Batches:
  """Maps a step to its batch of `questions` (see the module docstring). With a seed, step
  s is batch s % steps_per_epoch of epoch s // steps_per_epoch's permutation, seeded by
  (seed, epoch), so the stream is a pure function of the step and resumes exactly; without,
  the questions in order, the last batch padded."""

  def __init__(self, questions: QuestionSet, document_tokens: np.ndarray, batch_size: int,
               seed: int | None):
    self._questions, self._tokens = questions, document_tokens
    self._batch_size, self._seed = batch_size, seed
    n = len(questions)
    self.steps_per_epoch = n // batch_size if seed is not None else -(-n // batch_size)
    self._epoch_order = (-1, np.zeros(0, np.int64))  # the latest epoch's permutation

  def _order(self, epoch: int) -> np.ndarray:
    # One tuple, replaced whole: grain's reader threads may race here, never on half of it.
    cached_epoch, order = self._epoch_order
    if cached_epoch != epoch:
      order = np.random.default_rng([self._seed, epoch]).permutation(len(self._questions))
      self._epoch_order = (epoch, order)
    return order

  def __call__(self, step: int) -> dict[str, np.ndarray]:
    epoch, position = divmod(int(step), self.steps_per_epoch)
    if self._seed is not None:
      rows = self._order(epoch)[position * self._batch_size:(position + 1) * self._batch_size]
    else:
      rows = np.arange(position * self._batch_size,
                       min((position + 1) * self._batch_size, len(self._questions)))
    ids = np.full(self._batch_size, -1, np.int32)
    ids[:len(rows)] = rows
    q = self._questions

    def take(values, fill):
      out = np.full((self._batch_size,) + values.shape[1:], fill, values.dtype)
      out[:len(rows)] = values[rows]
      return out

    return {'question': take(q.question, PAD_ID),
            'documents': self._tokens[take(q.documents, -1)],
            'answers': take(q.answers, -1), 'question_ids': ids}


def question_batches(questions: QuestionSet, document_tokens: np.ndarray, batch_size: int,
                     seed: int | None = None) -> grain.IterDataset:
  """With `seed`: endless shuffled training batches; without: one pass in order."""
  batches = _Batches(questions, document_tokens, batch_size, seed)
  if batches.steps_per_epoch < 1:
    raise errors.Error(f'{len(questions)} questions make no batch of {batch_size} '
                       '(config.imdna.batch_size)')
  length = sys.maxsize if seed is not None else batches.steps_per_epoch
  return grain.MapDataset.range(length).map(batches).to_iter_dataset(_READ_OPTIONS)


# ---------------------------------------------------------------------------------------------
# The task


@dataclasses.dataclass(frozen=True, eq=False)
class IMDNATask:
  """Multi-label answer prediction (see the module docstring); `cfg` is an IMDNAConfig."""

  cfg: ModelConfig

  input_keys = ('question', 'documents', 'answers')

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> IMDNATask:
    del train, data_dir  # the loss has no settings; the data comes with the batches
    return cls(cfg)

  @classmethod
  def training_data(cls, config: ml_collections.ConfigDict, workdir: str):
    """The trainer's `TrainingData` (`mtn_jax.train`): the library's train and valid
    questions in batches of `config.imdna.batch_size` rounded down to a multiple of the
    device count."""
    from mtn_jax import train as train_lib  # pylint: disable=g-import-not-at-top
    if jax.process_count() > 1:
      raise errors.Error('the IMDNA task trains in one process (its batches are not sharded '
                         'by host)')
    library = load_library(config, workdir)
    task = cls(model_config(config, library))
    batch_size = max(jax.device_count(),
                     config.imdna.batch_size // jax.device_count() * jax.device_count())
    train = library.splits['train']
    batches = question_batches(train, library.document_tokens, batch_size, config.seed)
    valid = functools.partial(question_batches, library.splits['valid'],
                              library.document_tokens, batch_size)
    return train_lib.TrainingData(
        library.vocab, task, batches, len(train) // batch_size, valid,
        f'{len(train):,} training questions ({config.imdna.task}), '
        f'{len(library.documents):,} documents, {len(library.answers):,} candidate answers',
        examples_key='question_ids')

  @functools.cached_property
  def model(self) -> nn.Module:
    return models.create_model(self.cfg)

  def with_layout(self, scan_layers: bool | None) -> IMDNATask:
    del scan_layers  # no layer stacks
    return self

  def example_batch(self) -> dict[str, jax.Array]:
    return {'question': jnp.ones((1, self.cfg.max_query_words), jnp.int32),
            'documents': jnp.ones((1, 1, 2), jnp.int32)}

  def init_params(self, rng: jax.Array) -> Any:
    return self.model.init({'params': rng}, self.example_batch(), train=False)['params']

  def abstract_params(self) -> Any:
    return jax.eval_shape(self.init_params, jax.random.PRNGKey(0))

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

  @staticmethod
  def training_loss(sums: Mapping[str, jax.Array]) -> jax.Array:
    return sums['loss'] / jnp.maximum(sums['tokens'], 1.0)

  @staticmethod
  def summarize(totals: Mapping[str, Any]) -> dict[str, float]:
    """Validation loss per question and HITS@1 (percent)."""
    questions = max(float(totals['tokens']), 1.0)
    return {'loss': float(totals['nll']) / questions,
            'hits_at_1': 100.0 * float(totals['correct']) / questions,
            'questions': float(totals['tokens'])}

  def evaluate(self, trained, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """`--mode=eval` (see the module docstring)."""
    return evaluate(trained, config, workdir)


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


# ---------------------------------------------------------------------------------------------
# Evaluation


def hits_at(ranked: np.ndarray, answers: np.ndarray, ks: Sequence[int] = HITS_AT
            ) -> dict[str, float]:
  """Percent of questions with one of their answers among the first k.

  ranked: int [N, >= max(ks)] candidate ids best first; answers: int [N, M], -1-padded."""
  out = {}
  for k in ks:
    top = ranked[:, :k]
    hit = ((top[:, :, None] == answers[:, None, :]) & (answers[:, None, :] >= 0)).any((1, 2))
    out[f'hits_at_{k}'] = 100.0 * float(hit.mean()) if len(hit) else 0.0
  return out


def recall_at(ranked: np.ndarray, answers: np.ndarray, ks: Sequence[int] = HITS_AT
              ) -> dict[str, float]:
  """Percent of a question's answers among the first k, averaged over questions (a question
  without an answer counts 0)."""
  out = {}
  counts = (answers >= 0).sum(1)
  for k in ks:
    top = ranked[:, :k]
    found = ((answers[:, :, None] == top[:, None, :]).any(2) & (answers >= 0)).sum(1)
    out[f'recall_at_{k}'] = 100.0 * float(np.mean(found / np.maximum(counts, 1)))
  return out


def bm25_answer_scores(library: Library, questions: QuestionSet,
                       exclude_question_words: bool) -> np.ndarray:
  """BM25 alone: float32 [N, A], each candidate scored by the summed BM25 scores of the
  retrieved documents holding it; special tokens, and with `exclude_question_words` the
  question's own words (a movie question's entity is never its answer), score -1."""
  word_to_answer = np.full(len(library.vocab), -1, np.int64)
  word_to_answer[library.answer_words] = np.arange(len(library.answers))
  scores = np.zeros((len(questions), len(library.answers)), np.float32)
  special = word_to_answer[:len(SPECIAL_TOKENS)]
  scores[:, special[special >= 0]] = -1.0
  word_to_answer[:len(SPECIAL_TOKENS)] = -1
  for i in range(len(questions)):
    for doc, score in zip(questions.documents[i], questions.document_scores[i]):
      if doc < 0:
        continue
      words = np.unique(library.document_tokens[doc])
      found = word_to_answer[words]
      scores[i, found[found >= 0]] += score
    if exclude_question_words:
      own = word_to_answer[questions.question[i]]
      scores[i, own[own >= 0]] = -1.0
  return scores


def model_answer_scores(trained, library: Library, questions: QuestionSet,
                        batch_size: int) -> np.ndarray:
  """float32 [N, A]: the model's probability of every candidate answer."""
  apply = jax.jit(lambda params, batch: jax.nn.sigmoid(
      trained.task.model.apply({'params': params}, batch, train=False)))
  out = np.zeros((len(questions), len(library.answers)), np.float32)
  for batch in question_batches(questions, library.document_tokens, batch_size):
    rows = batch.pop('question_ids')
    probabilities = np.asarray(apply(trained.params, {k: batch[k] for k in
                                                      ('question', 'documents')}))
    out[rows[rows >= 0]] = probabilities[rows >= 0]
  return out


def ranked_answers(scores: np.ndarray, k: int) -> np.ndarray:
  """int64 [N, k]: the k best candidates of each row, best first (ties: lower id first)."""
  k = min(k, scores.shape[1])
  top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  order = np.lexsort((top, -np.take_along_axis(scores, top, 1)), axis=1)
  return np.take_along_axis(top, order, 1)


def following_queries(library: Library, questions: QuestionSet, i: int,
                      context: Sequence[str]) -> list[str]:
  """AOL: the candidate next queries of question i: in each retrieved session (best first),
  the queries after the one sharing most words with the context's last query."""
  last = set(context[-1].split())
  candidates: list[str] = []
  for doc in questions.documents[i]:
    if doc < 0:
      continue
    queries = library.extra['document_queries'][doc]
    overlap = [len(last & set(q.split())) for q in queries]
    candidates += queries[int(np.argmax(overlap)) + 1:]
  return list(dict.fromkeys(q for q in candidates if q not in context))


class NextQueryProposer:
  """IMDNA on AOL as a source of candidate next queries for the 'rerank' strategy
  (`config.suggest.imdna_workdir`, `mtn_jax.strategies`): for a session prefix, the queries
  that follow in the K training sessions BM25 finds most like it (`following_queries`),
  ranked by the model's word probabilities -- what its own evaluation ranks. It hands over
  texts, so its vocabulary need not be the generator's; its sessions must be
  (`mtn_jax.strategies` checks)."""

  def __init__(self, trained, workdir: str):
    """`trained`: the IMDNA run of `workdir` (`inference.load_trained`)."""
    self.config = ml_collections.ConfigDict(trained.meta['config'])
    if self.config.get('imdna', {}).get('task') != 'aol':
      raise errors.Error(f'{workdir} holds an IMDNA run on '
                         f'{self.config.get("imdna", {}).get("task")!r}: the candidate next '
                         'queries come from a run of configs/imdna_aol.py')
    self.trained, self.workdir = trained, os.path.abspath(workdir)
    self.library = load_library(self.config, workdir)

  def propose(self, contexts: Sequence[Sequence[str]], k: int,
              users: Sequence[Any] | None = None) -> list[list[str]]:
    """[N] the k best candidate next queries after each context (its queries so far); with
    `users` (each context's user), a user's own training sessions are never read, as in
    training."""
    settings, library = self.config.imdna, self.library
    if not contexts:
      return []
    exclude = None
    if users is not None:
      document_users, users = library.extra['document_users'], np.asarray(users)
      exclude = lambda i, found: document_users[found] == users[i]
    ids, scores = library.extra['index'].top_k([' '.join(c) for c in contexts],
                                               settings.num_documents, exclude)
    texts = [_session_text(c) for c in contexts]
    questions = QuestionSet(
        question=_pad_rows([library.vocab.encode_text(t) for t in texts],
                           settings.max_question_words, PAD_ID, keep='last'),
        documents=ids, document_scores=scores,
        answers=np.full((len(contexts), 1), -1, np.int32), texts=texts,
        answer_texts=[''] * len(contexts))
    probabilities = model_answer_scores(self.trained, library, questions, settings.batch_size)
    return [_query_scores(following_queries(library, questions, i, c), probabilities[i],
                          library.vocab)[:k] for i, c in enumerate(contexts)]


def _query_scores(candidates: Sequence[str], word_probabilities: np.ndarray,
                  vocab: Vocab) -> list[str]:
  """Candidates ranked by the mean probability of their known words."""
  def score(query):
    ids = [w for w in vocab.encode_text(query) if w != UNK_ID]
    return float(np.mean(word_probabilities[ids])) if ids else 0.0
  return sorted(candidates, key=lambda q: -score(q))


def evaluate(trained, config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Scores the best checkpoint and BM25 alone on `config.decode.eval_split`; writes
  `<workdir>/eval/[valid_]results.json` and returns its dict."""
  started = time.time()
  workdir = os.path.abspath(workdir)
  library = load_library(config, workdir)
  if library.vocab.fingerprint != trained.vocab.fingerprint:
    raise errors.Error(f'the checkpoint in {workdir} was trained on other data (vocabulary '
                       f'{trained.vocab.fingerprint}, this data {library.vocab.fingerprint})')
  split = config.decode.eval_split
  questions = library.splits[split]
  task_name, cfg = config.imdna.task, trained.cfg
  print(f'Evaluating IMDNA ({cfg.reader}, checkpoint step {trained.step}) on '
        f'{len(questions):,} {split} questions ({task_name}).', flush=True)
  depth = max(HITS_AT)
  scores = {'model': model_answer_scores(trained, library, questions,
                                         config.imdna.batch_size),
            'bm25': bm25_answer_scores(library, questions,
                                       exclude_question_words=task_name != 'aol')}
  ranked = {name: ranked_answers(s, depth) for name, s in scores.items()}
  figures = {name: hits_at(r, questions.answers) for name, r in ranked.items()}
  if task_name == 'aol':
    for name, r in ranked.items():
      figures[name].update(recall_at(r, questions.answers))
  results = {'model': cfg.name, 'reader': cfg.reader, 'task': task_name,
             'model_config': trained.meta['model'], 'step': trained.step,
             'num_params': models.count_params(trained.params), 'split': split,
             'questions': len(questions), 'documents': len(library.documents),
             'num_documents': config.imdna.num_documents,
             'candidate_answers': len(library.answers), 'answers': figures}
  for name, entry in figures.items():
    print(f'  {name:<6} ' + ', '.join(f'{k.replace("_", " ")} {v:.1f}'
                                     for k, v in entry.items()))
  if task_name == 'aol':
    results['queries'] = _aol_query_figures(library, questions, split, scores['model'],
                                            ranked['bm25'])
    for name, entry in results['queries'].items():
      print(f'  next query, {name}: ' + ', '.join(f'{k.replace("_", " ")} {v:.2f}'
                                                  for k, v in entry.items() if k != 'pairs'))
  results.update(wall_seconds=time.time() - started,
                 date=datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec='seconds'))
  samples = []
  for i in range(min(20, len(questions))):
    samples.append({'question': questions.texts[i], 'answers': questions.answer_texts[i],
                    'predicted': [library.answers[a] for a in ranked['model'][i, :5]],
                    'bm25': [library.answers[a] for a in ranked['bm25'][i, :5]]})
  eval_dir = os.path.join(workdir, 'eval')
  os.makedirs(eval_dir, exist_ok=True)
  prefix = '' if split == 'test' else f'{split}_'
  for name, text in ((f'{prefix}results.json', json.dumps(results, indent=2) + '\n'),
                     (f'{prefix}samples.jsonl',
                      ''.join(json.dumps(s) + '\n' for s in samples))):
    path = os.path.join(eval_dir, name)
    with open(path + '.tmp', 'w', encoding='utf-8') as f:
      f.write(text)
    os.replace(path + '.tmp', path)
  print(f'Results: {os.path.join(eval_dir, prefix + "results.json")}', flush=True)
  return results


def _aol_query_figures(library: Library, questions: QuestionSet, split: str,
                       model_scores: np.ndarray, bm25_ranked: np.ndarray) -> dict:
  """Next-query ranking (`metrics.suggestion_ranking`) of the model's candidate queries, of
  the same candidates in BM25's order, and of the trivial suggesters."""
  from mtn_jax import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  del bm25_ranked
  contexts = library.extra[split]['contexts']
  references = questions.answer_texts
  candidates = [following_queries(library, questions, i, contexts[i])
                for i in range(len(questions))]
  previous = [c[-1] for c in contexts]
  suggestions = {
      'model': [_query_scores(c, model_scores[i], library.vocab)
                for i, c in enumerate(candidates)],
      'bm25': candidates,
      'repeat_previous': [[p] for p in previous],
      'most_frequent_next': evaluate_lib.most_frequent_next_lists(
          library.extra['train_split'], previous)}
  return {name: metrics.suggestion_ranking(s, references, contexts).to_dict()
          for name, s in suggestions.items()}
