"""The k best of a score vector, best first, the same on every CPU.

numpy's `argpartition` and `argsort` (the default kind) leave the order of equal scores to the
algorithm, and numpy picks its algorithm by the CPU: on a CPU with AVX-512 its vectorised sorts
put ties elsewhere than on one without. Where scores tie at the k-th place, which document or
answer makes the top k then depended on the machine (IMDNA's BM25 answers did, between two
CPUs). Here ties go to the lower id, on any CPU.
"""

from __future__ import annotations

import numpy as np


def best_first(scores: np.ndarray, k: int) -> np.ndarray:
  """int64 [k'] (k' = min(k, M)): the ids of the k highest of `scores` (float [M]), highest
  first, ties to the lower id (NaN the lowest of all).

  The k-th highest value (a value: the same whatever the partition's algorithm) bounds the
  candidates; only those (every tie included) are sorted.
  """
  k = min(k, scores.shape[0])
  if k <= 0:
    return np.zeros((0,), np.int64)
  # A NaN (a diverged model's score) ranks last, as the worst score, not out of the list.
  scores = np.where(np.isnan(scores), -np.inf, scores)
  threshold = np.partition(scores, scores.shape[0] - k)[scores.shape[0] - k]
  candidates = np.flatnonzero(scores >= threshold)
  order = np.lexsort((candidates, -scores[candidates]))  # lexsort is stable: a fixed order
  return candidates[order[:k]]


def best_first_rows(scores: np.ndarray, k: int) -> np.ndarray:
  """int64 [N, min(k, M)]: `best_first` of each row of `scores` (float [N, M])."""
  k = min(k, scores.shape[1])
  ranked = np.zeros((scores.shape[0], k), np.int64)
  for i, row in enumerate(scores):
    ranked[i] = best_first(row, k)
  return ranked
