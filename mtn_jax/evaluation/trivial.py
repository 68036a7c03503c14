"""The suggesters that learn nothing from sessions, scored beside every model.

- `repeat_previous`: the previous query again.
- `most_frequent_next_lists`: the next queries that most often follow the previous query in
  the training split (by raw text; the previous query again when it never occurs there).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics

# By their key in results.json['scores'].
SUGGESTERS = {'repeat_previous': 'Repeat previous query',
              'most_frequent_next': 'Most frequent next query (train)'}


def repeat_previous(previous: Sequence[str]) -> list[str]:
  """The trivial suggester that suggests the previous query again."""
  return list(previous)


def most_frequent_next_lists(train: sessions.SessionSplit, previous: Sequence[str],
                             k: int = metrics.RANKING_CUTOFF) -> list[list[str]]:
  """For each previous query, the `k` next queries that most often follow it in `train`.

  Texts are compared raw, as logged. Ties go to the next query seen first in the training
  split; a previous query never followed by anything in `train` is suggested again. The
  training texts are streamed from their file: only pairs whose previous query is asked
  about are counted, so memory stays small on the full AOL training split.
  """
  if train.text_path is None:
    raise ValueError(f'split {train.name!r} has no text file')
  wanted = set(previous)
  follow_counts: dict[str, collections.Counter] = {}
  session_start = np.zeros(len(train.queries) + 1, bool)
  session_start[train.starts] = True
  with open(train.text_path, encoding='utf-8') as f:
    before = None
    for row, line in enumerate(f):
      if row >= len(train.queries):
        break
      text = line.rstrip('\n')
      if not session_start[row] and before in wanted:
        follow_counts.setdefault(before, collections.Counter())[text] += 1
      before = text
  # most_common is sorted by count, stably over insertion order: first seen wins a tie.
  best = {p: [q for q, _ in counts.most_common(k)] for p, counts in follow_counts.items()}
  return [best.get(p, [p]) for p in previous]


def most_frequent_next(train: sessions.SessionSplit, previous: Sequence[str]) -> list[str]:
  """For each previous query, the next query that most often follows it in `train` (the top
  of `most_frequent_next_lists`)."""
  return [ranked[0] for ranked in most_frequent_next_lists(train, previous, k=1)]
