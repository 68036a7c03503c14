"""IMDNA's data: a library of documents and the questions that read them, in batches.

`config.imdna.task` picks the data:

- 'qa', 'recs' (`config.data.source='movies'`): the generated movie knowledge base
  (`mtn_jax.data.synthetic.movies`). Documents are the movies' texts; the candidate answers
  are the knowledge base's entities; questions come with their answers.
- 'aol' (a session corpus, `mtn_jax.data.preprocess`): a question is a session prefix
  (its queries joined by <sep>); the documents are training sessions of other users, each
  its queries joined by <sep>; the answers are the vocabulary words of the logged next query
  (the candidate answers are the vocabulary). `following_queries` gives the whole queries
  that follow, in each retrieved session, the query most like the prefix's last one.

Every question reads the top `config.imdna.num_documents` documents BM25 returns for it
(`mtn_jax.data.bm25`, cached in `<workdir>/retrieval/`); a training question never reads a
document of its own (AOL: a session of the same user).

Batches (numpy, then on the devices):
  'question'      int32 [B, Lq]     word ids, 0-padded (`config.imdna.max_question_words`,
                                     the last ones kept when longer)
  'documents'     int32 [B, K, Ld]  the retrieved documents' word ids, best first; a missing
                                     document is all padding
  'answers'       int32 [B, M]      answer ids (into the candidates), -1-padded
  'question_ids'  int32 [B]         the question's index in its split, -1 on padding rows
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import Any

import grain
import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax.data import bm25
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.data.synthetic import movies
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import SEP_ID
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab

TASKS = ('qa', 'recs', 'aol')
_READ_OPTIONS = grain.ReadOptions(num_threads=2, prefetch_buffer_size=8)

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


def pad_rows(rows: Sequence[Sequence[int]], width: int, fill: int, keep: str = 'first'
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
  index = bm25.open_index(_retrieval_dir(workdir, 'movies'), documents,
                               k1=settings.bm25_k1, b=settings.bm25_b)
  splits = {}
  for split in movies.SPLITS:
    questions = movies.load_questions(data_dir, settings.task, split)
    texts = [q.text for q in questions]
    ids, scores = bm25.cached_top_k(index, f'{settings.task}.{split}', texts,
                                         settings.num_documents)
    splits[split] = QuestionSet(
        question=pad_rows([vocab.encode_text(t) for t in texts],
                           settings.max_question_words, PAD_ID),
        documents=ids, document_scores=scores,
        answers=pad_rows([[answer_ids[a] for a in q.answers] for q in questions],
                          max(len(q.answers) for q in questions), -1),
        texts=texts, answer_texts=[' | '.join(q.answers) for q in questions])
  return Library(vocab, documents,
                 _document_tokens([vocab.encode_text(d) for d in documents], settings),
                 answers, np.asarray(vocab.encode(answers), np.int32), splits)


def _document_tokens(rows: Sequence[Sequence[int]], settings: ml_collections.ConfigDict
                     ) -> np.ndarray:
  """The documents' ids (`rows`), and an empty one last, padded to max_document_words."""
  return pad_rows(list(rows) + [[]], settings.max_document_words, PAD_ID)


def session_text(texts: Sequence[str]) -> str:
  """A session's queries as one text (what is shown and stored; `session_ids` encodes it)."""
  return ' <sep> '.join(texts)


def session_ids(vocab: Vocab, texts: Sequence[str]) -> list[int]:
  """A session's queries' ids, `<sep>` between them: by id, since a query's own text never
  encodes to a special token."""
  ids = []
  for k, text in enumerate(texts):
    ids += ([SEP_ID] if k else []) + vocab.encode_text(text)
  return ids


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
  documents = [session_text(train.session_texts(i)) for i in range(train.num_sessions)]
  document_users = np.asarray(train.users)
  # BM25 reads words: the documents' <sep> marks only the model's inputs.
  index = bm25.open_index(_retrieval_dir(workdir, 'aol'),
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
    ids, scores = bm25.cached_top_k(
        index, name, [' '.join(c) for c in contexts], settings.num_documents,
        exclude=lambda i, found, users=users: document_users[found] == users[i],
        exclusion='same user')
    answers = []
    for text in nexts:
      words = [w for w in dict.fromkeys(vocab.encode_text(text)) if w != UNK_ID]
      answers.append(words or [])
    splits[name] = QuestionSet(
        question=pad_rows([session_ids(vocab, c) for c in contexts],
                           settings.max_question_words, PAD_ID, keep='last'),
        documents=ids, document_scores=scores,
        answers=pad_rows(answers, max([len(a) for a in answers] + [1]), -1),
        texts=[session_text(c) for c in contexts], answer_texts=nexts)
    extra[name] = {'contexts': contexts}
  extra['train_split'] = train
  extra['document_queries'] = [train.session_texts(i) for i in range(train.num_sessions)]
  extra['document_users'] = document_users
  extra['index'] = index
  answers = list(vocab.words)
  document_ids = [session_ids(vocab, queries) for queries in extra['document_queries']]
  return Library(vocab, documents, _document_tokens(document_ids, settings), answers,
                 np.arange(len(vocab), dtype=np.int32), splits, extra)


def check_config(config: ml_collections.ConfigDict) -> None:
  """One-line errors naming the key, for the values the library reads."""
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


def load_library(config: ml_collections.ConfigDict, workdir: str) -> Library:
  """The task's data for `config.imdna.task` (see the module docstring)."""
  check_config(config)
  if config.imdna.task == 'aol':
    return _aol_library(config, workdir)
  return _movies_library(config, workdir)


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
