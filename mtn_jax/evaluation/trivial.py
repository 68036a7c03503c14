"""The suggesters that learn nothing from sessions, scored beside every model.

- 'repeat_previous': the previous query again.
- 'most_frequent_next': the next queries that most often follow the previous query in
  the training split (by raw text; the previous query again when it never occurs there).
- 'most_popular' (MPC): the 10 most frequent next queries of the training split, the same
  for every session; 'most_cooccurring': the previous query's most frequent successors, then
  the popular list. Under the user-facing protocol these two are the bar a model has to
  clear: repeating is not allowed there.
Every list but the first is read from the training split's counts (`popular.LogCounts`).
"""

from __future__ import annotations

from collections.abc import Sequence

from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.inference import popular

# By their key in results.json['scores'].
SUGGESTERS = {'repeat_previous': 'Repeat previous query',
              'most_frequent_next': 'Most frequent next query (train)',
              'most_popular': 'Most popular next queries (MPC, train)',
              'most_cooccurring': 'Most co-occurring next queries, then MPC (train)'}
# Results written before these existed lack them.
OPTIONAL = ('most_popular', 'most_cooccurring')


def repeat_previous(previous: Sequence[str]) -> list[str]:
  """The trivial suggester that suggests the previous query again."""
  return list(previous)


def most_frequent_next_lists(counts: popular.LogCounts, previous: Sequence[str],
                             k: int = metrics.RANKING_CUTOFF) -> list[list[str]]:
  """For each previous query, the `k` next queries that most often follow it in the training
  split `counts` counted (by raw text, ties to the one seen first); a previous query never
  followed by anything there is suggested again."""
  return [counts.followers(p, k) or [p] for p in previous]


def lists(train: sessions.SessionSplit, previous: Sequence[str], contexts: Sequence[Sequence[str]],
          k: int = metrics.RANKING_CUTOFF) -> dict[str, list[list[str]]]:
  """{suggester: [pairs] its ranked list} of every suggester of `SUGGESTERS`."""
  counts = popular.LogCounts(train)
  return {'repeat_previous': [[p] for p in repeat_previous(previous)],
          'most_frequent_next': most_frequent_next_lists(counts, previous, k),
          'most_popular': counts.lists(contexts, k, 'popular'),
          'most_cooccurring': counts.lists(contexts, k, 'cooccurring')}
