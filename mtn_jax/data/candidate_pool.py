"""The candidate pool: the distinct queries of the training split, which rankers retrieve.

A ranker (`mtn_jax.tasks.rankers`) suggests a real logged query rather than writing one: always
well formed, never an unknown word. Its candidates are every distinct query text of the
training split, with how often it was issued. Preprocessing writes, beside the splits:
  `candidates.txt`          one query text per line, most frequent first (ties by text)
  `candidates.queries.npy`  int32 [C, max_query_words]  their token ids, as the splits hold them
  `candidates.counts.npy`   int64 [C]                   times each was issued in training
and, with `config.data.history_queries` > 0, each split's `{split}.history_items.npy`, int32
[num_sessions, M]: the pool index of each history query (`sessions.SessionSplit.history`),
-1 where there is none or it is not in the pool (a query first issued in a valid or test
session). Everything is read without pickle.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import numpy as np

from mtn_jax import errors

_FILES = {'texts': 'candidates.txt', 'queries': 'candidates.queries.npy',
          'counts': 'candidates.counts.npy'}
POOL_FILES = tuple(_FILES.values())


@dataclasses.dataclass(frozen=True)
class CandidatePool:
  """The distinct training queries.

  Attributes:
    queries: int32 [C, n] token ids, 0-padded (n: the corpus's tokens per query).
    counts: int64 [C] times each was issued in the training split.
    texts: the C query texts (the cleaned texts the splits' `text.txt` hold).
  """

  queries: np.ndarray
  counts: np.ndarray
  texts: list[str]

  def __len__(self) -> int:
    return len(self.texts)

  @functools.cached_property
  def _index(self) -> dict[str, int]:
    return {text: i for i, text in enumerate(self.texts)}

  def ids_of(self, texts: Sequence[str]) -> np.ndarray:
    """int32 [len(texts)]: each text's index in the pool, -1 where it is not there."""
    index = self._index
    return np.fromiter((index.get(t, -1) for t in texts), np.int32, count=len(texts))

  @functools.cached_property
  def fingerprint(self) -> str:
    """Identifies the pool's contents (for caches of candidate vectors)."""
    import hashlib  # pylint: disable=g-import-not-at-top
    digest = hashlib.sha256()
    digest.update('\n'.join(self.texts).encode('utf-8'))
    digest.update(np.ascontiguousarray(self.queries).tobytes())
    return digest.hexdigest()[:16]


def build_pool(texts: Sequence[str], queries: np.ndarray) -> tuple[CandidatePool, np.ndarray]:
  """The pool of the training split's query rows and each row's index in it.

  Args:
    texts: the training split's query texts, one per row.
    queries: int32 [len(texts), n] their token ids.
  Returns:
    the pool (most frequent first, ties by text) and int32 [len(texts)] the pool index of
    every row.
  """
  unique, first_row, inverse, counts = np.unique(
      np.asarray(texts, dtype=object), return_index=True, return_inverse=True,
      return_counts=True)
  order = np.lexsort((np.arange(len(unique)), -counts))  # unique is sorted by text already
  rank = np.empty(len(order), np.int64)
  rank[order] = np.arange(len(order))
  pool = CandidatePool(queries=np.asarray(queries)[first_row[order]].astype(np.int32),
                       counts=counts[order].astype(np.int64),
                       texts=[str(t) for t in unique[order]])
  return pool, rank[inverse.reshape(-1)].astype(np.int32)


def save_pool(folder: str, pool: CandidatePool) -> None:
  np.save(os.path.join(folder, _FILES['queries']), pool.queries, allow_pickle=False)
  np.save(os.path.join(folder, _FILES['counts']), pool.counts, allow_pickle=False)
  with open(os.path.join(folder, _FILES['texts']), 'w', encoding='utf-8') as f:
    f.write(''.join(t + '\n' for t in pool.texts))


def load_pool(data_dir: str) -> CandidatePool:
  """The pool preprocessing wrote into `data_dir`.

  One evaluation reads it in several places (a zero attention model's noise words and pool,
  the retriever of a rerank): the files are read once while they stay as they are (the same
  files, sizes and modification times), and the arrays come back read-only, as they are
  shared.

  Raises:
    errors.Error: a file is missing (a corpus written before pools were kept) or the files
      disagree on the number of candidates.
  """
  folder = os.path.abspath(data_dir)
  stamps = []
  for name in _FILES.values():
    try:
      st = os.stat(os.path.join(folder, name))
    except FileNotFoundError:
      raise errors.Error(f'{os.path.join(folder, name)} is missing: run --mode=preprocess '
                         'again (the corpus was written before candidate pools were kept)'
                         ) from None
    stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
  return _read_pool(folder, tuple(stamps))


@functools.lru_cache(maxsize=2)  # a workdir's pool, and a rerank retriever's of another
def _read_pool(folder: str, stamps: tuple) -> CandidatePool:
  """`load_pool`'s reading of `folder`, cached by its files' `stamps`."""
  del stamps  # the cache's key only
  paths = {kind: os.path.join(folder, name) for kind, name in _FILES.items()}
  queries = np.load(paths['queries'], allow_pickle=False)
  counts = np.load(paths['counts'], allow_pickle=False)
  with open(paths['texts'], encoding='utf-8') as f:
    texts = f.read().split('\n')[:len(queries)]
  if not len(queries) == len(counts) == len(texts):
    raise errors.Error(f'{folder}: the candidate files disagree ({len(texts)} texts, '
                       f'{len(queries)} token rows, {len(counts)} counts): run '
                       '--mode=preprocess again')
  queries.flags.writeable = counts.flags.writeable = False
  return CandidatePool(queries=queries, counts=counts, texts=texts)


def history_items_path(data_dir: str, split: str) -> str:
  return os.path.join(data_dir, f'{split}.history_items.npy')


def load_history_items(data_dir: str, split: str, num_sessions: int) -> np.ndarray | None:
  """int32 [num_sessions, M] (see the module docstring), or None without a history."""
  path = history_items_path(data_dir, split)
  if not os.path.exists(path):
    return None
  items = np.load(path, allow_pickle=False)
  if items.ndim != 2 or len(items) != num_sessions:
    raise errors.Error(f'{path}: shape {items.shape} for {num_sessions} sessions: run '
                       '--mode=preprocess again')
  return items
