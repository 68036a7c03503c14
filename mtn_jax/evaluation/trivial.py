"""The suggesters that learn nothing from sessions, scored beside every model.

- `repeat_previous`: the previous query again.
- `most_frequent_next_lists`: the next queries that most often follow the previous query in
  the training split (by raw text; the previous query again when it never occurs there).
- 'most_popular' (MPC): the 10 most frequent next queries of the training split, the same
  for every session; 'cooccurrence': the previous query's most frequent successors, then
  the popular list (`mtn_jax.inference.popular`). Under the user-facing protocol these two
  are the bar a model has to clear: repeating is not allowed there.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence


from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.inference import popular

# By their key in results.json['scores'].
SUGGESTERS = {'repeat_previous': 'Repeat previous query',
              'most_frequent_next': 'Most frequent next query (train)',
              'most_popular': 'Most popular next queries (MPC, train)',
              'cooccurrence': 'Co-occurring next queries, then MPC (train)'}
# Results written before these existed lack them.
OPTIONAL = ('most_popular', 'cooccurrence')


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
  wanted = set(previous)
  follow_counts: dict[str, collections.Counter] = {}
  for before, text in popular.next_query_pairs(train):
    if before in wanted:
      follow_counts.setdefault(before, collections.Counter())[text] += 1
  # most_common is sorted by count, stably over insertion order: first seen wins a tie.
  best = {p: [q for q, _ in counts.most_common(k)] for p, counts in follow_counts.items()}
  return [best.get(p, [p]) for p in previous]


def most_frequent_next(train: sessions.SessionSplit, previous: Sequence[str]) -> list[str]:
  """For each previous query, the next query that most often follows it in `train` (the top
  of `most_frequent_next_lists`)."""
  return [ranked[0] for ranked in most_frequent_next_lists(train, previous, k=1)]


def lists(train: sessions.SessionSplit, previous: Sequence[str], contexts: Sequence[Sequence[str]],
          k: int = metrics.RANKING_CUTOFF) -> dict[str, list[list[str]]]:
  """{suggester: [pairs] its ranked list} of every suggester of `SUGGESTERS`."""
  counts = popular.LogCounts(train)
  return {'repeat_previous': [[p] for p in repeat_previous(previous)],
          'most_frequent_next': most_frequent_next_lists(train, previous, k),
          'most_popular': counts.lists(contexts, k, 'popular'),
          'cooccurrence': counts.lists(contexts, k, 'cooccurring')}
