"""The preprocessed corpus on disk, and its in-memory view.

`<workdir>/data/` holds, for each split in `SPLITS`:
  `{split}.queries.npy`   int32 [num_queries, max_query_words]  word ids, 0-padded on the right
  `{split}.sessions.npy`  int64 [num_sessions + 1]              row offsets: session i is
                                                                rows starts[i]:starts[i+1]
  `{split}.text.txt`      one line per query row, the query's words joined by single spaces,
                          exactly as cleaned and cut to max_query_words, NOT mapped through the
                          vocabulary (metrics compare against these raw references)
  `{split}.users.npy`     int64 [num_sessions]  each session's user (the log's AnonID)
  `{split}.start_times.npy` int64 [num_sessions]  its first query's time, seconds since
                          1970-01-01 on the log's clock
  `{split}.history.npy`   int32 [num_sessions, M, max_query_words]  the user's M most recent
                          queries before the session, oldest first, zero rows in front where
                          there are fewer (M = config.data.history_queries, 0 without)
plus `vocab.json`, `stats.json` and `manifest.json` (the cache fingerprint). Every file is
read without pickle. The users and start times are for work that needs to know whose session
it is and when (personalisation, splits by time); a corpus written before they were kept
still loads, with `users` and `start_times` None, and `preprocess.prepare` rebuilds it (its
format number is older).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from mtn_jax import errors
from mtn_jax.data import candidate_pool
from mtn_jax.data.vocab import Vocab

SPLITS = ('train', 'valid', 'test')


# Files a corpus written before the sessions' users and start times were kept lacks.
OPTIONAL_KINDS = ('users', 'start_times')  # per session; 'history' is optional too


def split_paths(data_dir: str, split: str) -> dict[str, str]:
  """{kind: path} of every file of one split (see the module docstring)."""
  return {kind: os.path.join(data_dir, f'{split}.{kind}.{ext}')
          for kind, ext in (('queries', 'npy'), ('sessions', 'npy'), ('text', 'txt'),
                            ('users', 'npy'), ('start_times', 'npy'), ('history', 'npy'))}


def save_split(data_dir: str, split: str, queries: np.ndarray, starts: np.ndarray,
               texts: list[str], users: np.ndarray, start_times: np.ndarray,
               history: np.ndarray | None = None) -> None:
  """Writes one split; `texts[i]` is the raw text of `queries[i]`; `users` and `start_times`
  are [num_sessions]."""
  if len(texts) != len(queries) or starts[-1] != len(queries):
    raise ValueError(f'{split}: {len(queries)} query rows, {len(texts)} texts, '
                     f'sessions end at row {starts[-1]}')
  if not len(users) == len(start_times) == len(starts) - 1:
    raise ValueError(f'{split}: {len(starts) - 1} sessions, {len(users)} users, '
                     f'{len(start_times)} start times')
  paths = split_paths(data_dir, split)
  np.save(paths['queries'], queries.astype(np.int32), allow_pickle=False)
  np.save(paths['sessions'], starts.astype(np.int64), allow_pickle=False)
  np.save(paths['users'], np.asarray(users, np.int64), allow_pickle=False)
  np.save(paths['start_times'], np.asarray(start_times, np.int64), allow_pickle=False)
  if history is None:  # no history asked for: an empty one, [num_sessions, 0, n]
    history = np.zeros((len(starts) - 1, 0, queries.shape[1]), np.int32)
  if history.shape[0] != len(starts) - 1 or history.shape[2:] != queries.shape[1:]:
    raise ValueError(f'{split}: history of shape {history.shape} for {len(starts) - 1} '
                     f'sessions of queries {queries.shape[1:]}')
  np.save(paths['history'], history.astype(np.int32), allow_pickle=False)
  with open(paths['text'], 'w', encoding='utf-8') as f:
    f.write(''.join(t + '\n' for t in texts))


@dataclasses.dataclass(frozen=True)
class SessionSplit:
  """One split of sessions: `queries` int32 [num_queries, max_query_words], `starts` [N + 1]."""

  name: str
  queries: np.ndarray
  starts: np.ndarray
  text_path: str | None = None
  users: np.ndarray | None = None  # int64 [num_sessions]
  start_times: np.ndarray | None = None  # int64 [num_sessions], seconds
  # int32 [num_sessions, M, max_query_words]: the user's M most recent queries before each
  # session, oldest first, zero rows in front where there are fewer (config.data.
  # history_queries; M = 0 without).
  history: np.ndarray | None = None
  # int32 [num_sessions, M]: the history's queries as candidate-pool entries, -1 for none or
  # one outside the pool (`mtn_jax.data.candidate_pool`).
  history_items: np.ndarray | None = None
  # int64 [num_queries]: the text file's line of each query row, for a selection of another
  # split's sessions (`select_sessions`); None: row i is line i.
  text_rows: np.ndarray | None = None
  # The query rows' texts themselves, for a split made in memory (`text_path` None).
  text_lines: tuple[str, ...] | None = None

  @property
  def num_sessions(self) -> int:
    return len(self.starts) - 1

  @functools.cached_property
  def lengths(self) -> np.ndarray:
    """int64 [num_sessions]: number of queries of each session."""
    return np.diff(self.starts)

  @property
  def num_pairs(self) -> int:
    """(session prefix -> next query) examples: sum over sessions of (queries - 1)."""
    return int((self.lengths - 1).sum())

  @functools.cached_property
  def first_pairs(self) -> np.ndarray:
    """int64 [num_sessions]: each session's first pair. Pairs go session by session, then
    position: pair first_pairs[i] + t predicts query t+1 of session i after queries 0..t."""
    pairs_per_session = self.lengths - 1
    return np.cumsum(pairs_per_session) - pairs_per_session

  def pair_positions(self) -> tuple[np.ndarray, np.ndarray]:
    """(session int64 [pairs], position t int64 [pairs]) of every pair, in pair order."""
    session = np.repeat(np.arange(self.num_sessions), self.lengths - 1)
    return session, np.arange(len(session)) - self.first_pairs[session]

  def pair_texts(self) -> tuple[list[str], list[str]]:
    """(previous query [pairs], next query [pairs]) raw texts, in pair order."""
    session, position = self.pair_positions()
    rows = self.starts[session] + position
    texts = self.texts
    return [texts[r] for r in rows], [texts[r + 1] for r in rows]

  @property
  def max_query_words(self) -> int:
    return self.queries.shape[1]

  def session(self, i: int) -> np.ndarray:
    """int32 [queries, max_query_words] word ids of session `i`."""
    return self.queries[self.starts[i]:self.starts[i + 1]]

  @functools.cached_property
  def texts(self) -> list[str]:
    """Raw text of every query row (loaded on first use)."""
    if self.text_lines is not None:
      return list(self.text_lines)
    if self.text_path is None:
      raise ValueError(f'split {self.name!r} has no text file')
    with open(self.text_path, encoding='utf-8') as f:
      lines = f.read().split('\n')
    rows = self.text_rows
    needed = len(self.queries) if rows is None else (int(rows.max()) + 1 if len(rows) else 0)
    if len(lines) - 1 < needed:  # each text ends with a line end
      raise CorpusFileError(f'{self.text_path}: {len(lines) - 1} lines, but the split holds '
                            f'{needed} queries: run --mode=preprocess again')
    if self.text_rows is None:
      return lines[:len(self.queries)]
    return [lines[i] for i in self.text_rows]

  def session_texts(self, i: int) -> list[str]:
    return self.texts[self.starts[i]:self.starts[i + 1]]


def session_rows(split: SessionSplit, session_ids: np.ndarray) -> np.ndarray:
  """int64 [their queries]: the query rows of sessions `session_ids` of `split`, in order."""
  if not len(session_ids):
    return np.zeros(0, np.int64)
  return np.concatenate([np.arange(split.starts[i], split.starts[i + 1], dtype=np.int64)
                         for i in session_ids])


def select_sessions(split: SessionSplit, session_ids: np.ndarray) -> SessionSplit:
  """The sessions `session_ids` (int [k], in this order) of `split`, as a split of their own
  (same name; its texts are read from the same file)."""
  session_ids = np.asarray(session_ids, np.int64)
  lengths = split.lengths[session_ids]
  rows = session_rows(split, session_ids)
  per_session = {k: None if v is None else np.asarray(v)[session_ids] for k, v in (
      ('users', split.users), ('start_times', split.start_times), ('history', split.history),
      ('history_items', split.history_items))}
  text_rows = rows if split.text_rows is None else split.text_rows[rows]
  return SessionSplit(split.name, np.asarray(split.queries)[rows],
                      np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                      split.text_path, **per_session, text_rows=text_rows)


def user_folds(users: np.ndarray, folds: int, seed: int) -> np.ndarray:
  """int64 [num_sessions]: each session's fold in 0..folds-1, all of a user's sessions in one.

  Users are dealt to the folds in a seeded random order, one at a time (so fold sizes differ
  by at most one user): the same users, folds and seed give the same folds in every run.
  """
  unique, user_index = np.unique(np.asarray(users), return_inverse=True)
  fold_of_user = np.empty(len(unique), np.int64)
  fold_of_user[np.random.default_rng(seed).permutation(len(unique))] = (
      np.arange(len(unique)) % folds)
  return fold_of_user[user_index]


def session_folds(split: SessionSplit, folds: int, seed: int) -> np.ndarray:
  """int64 [num_sessions]: `user_folds` of the split's sessions.

  Raises:
    errors.Error: the split has no users (a corpus written before they were kept).
  """
  if split.users is None:
    raise errors.Error(f'the {split.name} split has no users (a corpus written before they '
                       'were kept), so no folds of users: run --mode=preprocess again')
  return user_folds(split.users, folds, seed)


class CorpusFileError(errors.Error, ValueError):
  """A corpus file that does not fit the others of its split, or cannot be read; the message
  names it."""


def _array(path: str, mmap_mode: str | None = None) -> np.ndarray:
  """The array of a corpus file, or an error naming a file that is not one (truncated, or
  garbage)."""
  try:
    return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
  except (ValueError, OSError, EOFError) as e:
    raise CorpusFileError(f'{path}: not a readable array ({e}): run --mode=preprocess '
                          'again') from None


def load_split(data_dir: str, split: str, mmap: bool = True) -> SessionSplit:
  """One split of the corpus in `data_dir`; `queries` memory-mapped with `mmap`.

  `users` and `start_times` are None for a corpus written before they were kept.

  Raises:
    FileNotFoundError: a required file is missing.
    CorpusFileError (a ValueError): `users` or `start_times` does not hold one value per
      session.
  """
  paths = split_paths(data_dir, split)
  for kind, p in paths.items():
    if kind not in OPTIONAL_KINDS + ('history',) and not os.path.exists(p):
      workdir = os.path.dirname(os.path.abspath(data_dir))
      if not os.path.isdir(workdir):  # a mistyped workdir, not an unprepared one
        raise FileNotFoundError(f'{workdir}: no such folder (a workdir whose data/ holds the '
                                'corpus)')
      raise FileNotFoundError(f'{p} is missing: run --mode=preprocess first')
  mode = 'r' if mmap else None
  starts = _array(paths['sessions'])
  per_session = {}
  for kind in OPTIONAL_KINDS:
    if not os.path.exists(paths[kind]):
      per_session[kind] = None
      continue
    per_session[kind] = _array(paths[kind])
    if per_session[kind].shape != (len(starts) - 1,):
      raise CorpusFileError(f'{paths[kind]}: shape {per_session[kind].shape}, but '
                            f'{paths["sessions"]} holds {len(starts) - 1} sessions: run '
                            '--mode=preprocess again')
  history = None
  if os.path.exists(paths['history']):
    history = _array(paths['history'])
    if history.shape[0] != len(starts) - 1:
      raise CorpusFileError(f'{paths["history"]}: {history.shape[0]} sessions, but '
                            f'{paths["sessions"]} holds {len(starts) - 1}: run '
                            '--mode=preprocess again')
  history_items = candidate_pool.load_history_items(data_dir, split, len(starts) - 1)
  return SessionSplit(split, _array(paths['queries'], mmap_mode=mode),
                      starts, paths['text'], **per_session, history=history,
                      history_items=history_items)


def load_vocab(data_dir: str) -> Vocab:
  return Vocab.load(os.path.join(data_dir, 'vocab.json'))
