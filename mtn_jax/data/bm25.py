"""BM25 retrieval of the K documents a question reads, with `bm25s`, built once and cached.

`open_index(folder, documents, k1=, b=)` returns a `Bm25Index` over `documents` (texts whose
whitespace-separated words are the terms; the texts here are already lower-cased and
tokenised by the data layer). The index lives in `folder` as bm25s' own files (numpy
arrays and JSON; loaded without pickle) beside `fingerprint.json`: a hash of the corpus,
the BM25 settings and the bm25s version. Opening it again with the same fingerprint loads
it; any change to the corpus or the settings rebuilds it (written aside, then renamed, so an
interrupted build never leaves a half index).

`Bm25Index.top_k(questions, k, exclude=)` -> (document ids int32 [N, k], scores float32
[N, k]), best first, -1 / 0 where fewer than k documents share a word with the question (a
document of score 0 is not a match). `exclude(question index, document ids) -> bool mask`
drops documents a question may not read (its own session, the same user's sessions);
`cached_top_k` keeps the result of a named question set in the index folder, keyed by a
hash of the questions, k and a description of the exclusion.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mtn_jax import files
from mtn_jax.data import top_k

_FINGERPRINT = 'fingerprint.json'
# Extra documents fetched per question to make up for excluded ones (four times as many
# again while that is not enough).
_EXCLUSION_MARGIN = 64


def _bm25s():
  """bm25s, imported on first use: importing it runs a jax op (a top-k, to quiet a GPU
  warning), which starts jax's backends before `--cpu_devices` can set the device count."""
  import bm25s  # pylint: disable=g-import-not-at-top
  # It announces every index it builds at INFO level.
  logging.getLogger('bm25s').setLevel(logging.WARNING)
  return bm25s


def _hash(*parts) -> str:
  digest = hashlib.sha256()
  for part in parts:
    digest.update(json.dumps(part, sort_keys=True).encode())
    digest.update(b'\0')
  return digest.hexdigest()[:16]


def corpus_fingerprint(documents: Sequence[str], k1: float, b: float) -> str:
  return _hash(_bm25s().__version__, {'k1': k1, 'b': b}, list(documents))


@dataclasses.dataclass
class Bm25Index:
  retriever: Any  # bm25s.BM25
  folder: str
  fingerprint: str
  num_documents: int
  built: bool  # False: loaded from the cache

  def top_k(self, questions: Sequence[str], k: int,
            exclude: Callable[[int, np.ndarray], np.ndarray] | None = None
            ) -> tuple[np.ndarray, np.ndarray]:
    """The best `k` documents of each question (see the module docstring)."""
    n = len(questions)
    ids = np.full((n, k), -1, np.int32)
    scores = np.zeros((n, k), np.float32)
    if n == 0:
      return ids, scores
    first_fetch = min(self.num_documents, k + (_EXCLUSION_MARGIN if exclude else 0))
    for i, question in enumerate(questions):
      # bm25s' own `retrieve` picks among tied documents by CPU (`top_k.best_first`).
      all_scores = self.retriever.get_scores(question.split() or [''])
      fetch = first_fetch
      while True:
        found = top_k.best_first(all_scores, fetch)
        found_scores = all_scores[found]
        keep = found_scores > 0
        if exclude is not None:
          keep &= ~exclude(i, found)
        # More excluded documents above the others than the margin (an AOL user's own
        # sessions, which repeat the question's words): look further down.
        if (keep.sum() >= k or fetch == self.num_documents or not len(found)
            or found_scores[-1] <= 0):
          break
        fetch = min(self.num_documents, 4 * fetch)
      row, row_scores = found[keep][:k], found_scores[keep][:k]
      ids[i, :len(row)], scores[i, :len(row)] = row, row_scores
    return ids, scores


def memory_index(documents: Sequence[str], *, k1: float = 1.2, b: float = 0.75) -> Bm25Index:
  """An index of `documents` built in memory, kept nowhere: for a corpus small enough to index
  at every start (a training log's distinct queries)."""
  if not documents:
    raise ValueError('no documents to index')
  retriever = _bm25s().BM25(k1=k1, b=b)
  retriever.index([d.split() for d in documents], show_progress=False)
  return Bm25Index(retriever, '', '', len(documents), built=True)


def open_index(folder: str, documents: Sequence[str], *, k1: float = 1.2,
               b: float = 0.75) -> Bm25Index:
  """The cached index of `documents` in `folder`, built when missing or stale."""
  fingerprint = corpus_fingerprint(documents, k1, b)
  try:
    with open(os.path.join(folder, _FINGERPRINT), encoding='utf-8') as f:
      current = json.load(f).get('fingerprint') == fingerprint
  except (OSError, ValueError):
    current = False
  if current:
    retriever = _bm25s().BM25.load(folder, allow_pickle=False, show_progress=False)
    return Bm25Index(retriever, folder, fingerprint, len(documents), built=False)
  if not documents:
    raise ValueError(f'no documents to index in {folder}')
  retriever = _bm25s().BM25(k1=k1, b=b)
  retriever.index([d.split() for d in documents], show_progress=False)
  parent = os.path.dirname(os.path.abspath(folder))
  os.makedirs(parent, exist_ok=True)
  build = tempfile.mkdtemp(prefix='.index-build-', dir=parent)
  try:
    retriever.save(build, allow_pickle=False, show_progress=False)
    with open(os.path.join(build, _FINGERPRINT), 'w', encoding='utf-8') as f:
      json.dump({'fingerprint': fingerprint, 'documents': len(documents), 'k1': k1, 'b': b,
                 'bm25s': _bm25s().__version__}, f)
    files.replace_dir(build, folder, '.index-old-')
  except BaseException:
    shutil.rmtree(build, ignore_errors=True)
    raise
  return Bm25Index(retriever, folder, fingerprint, len(documents), built=True)


def cached_top_k(index: Bm25Index, name: str, questions: Sequence[str], k: int,
                 exclude: Callable[[int, np.ndarray], np.ndarray] | None = None,
                 exclusion: str = 'none') -> tuple[np.ndarray, np.ndarray]:
  """`index.top_k`, kept in `<index folder>/<name>.top_k.npz` for these questions, k and
  `exclusion` (a description of `exclude`, part of the key) and the index's fingerprint."""
  # 'ties to the lower id': results cached before ties were broken so (by the CPU) are redone;
  # 'k after exclusions': so are those cached with exclusions before the excluded were made up
  # for from however far down (they held fewer than k documents where many were excluded).
  key = _hash(index.fingerprint, list(questions), k, exclusion, 'ties to the lower id',
              *([] if exclude is None else ['k after exclusions']))
  path = os.path.join(index.folder, f'{name}.top_k.npz')
  if os.path.exists(path):
    with np.load(path) as cached:
      if str(cached['key']) == key:
        return cached['ids'], cached['scores']
  ids, scores = index.top_k(questions, k, exclude)
  with files.atomic_open(path, 'wb') as f:
    np.savez(f, key=np.asarray(key), ids=ids, scores=scores)
  return ids, scores
