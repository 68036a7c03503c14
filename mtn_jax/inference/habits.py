"""A user's habit query as the first suggestion (`config.suggest.habit_rate`, 'rerank').

Many users come back to the same few queries (a bank, a web mail, a shop), and for them the
query they issue most is a better first suggestion than anything judged from the session
alone, repeating the previous query included (docs/RESULTS.md, "A user's habits"). From the
user's earlier queries q_0..q_{m-1}, oldest first (every earlier session of theirs):

- the habit query of a context is the query of the past issued most often, the session's
  queries so far left out (on a tie, the one issued first);
- the habit rate is the share of q_1..q_{m-1} that were the habit query of their moment (the
  most issued of the queries before, the one just before left out): how often the rule
  would have been right for this user; `past` = m - 1 is what it is measured over.

'rerank' puts the habit query first where the rate is at least `config.suggest.habit_rate`
over at least `config.suggest.habit_min_past` queries; the rest of the list is unchanged.
Nothing is fitted: a user's figures come from their own past alone, so they are as good for
a user never seen in training as for any other.

Where the past comes from: in evaluation, the user's sessions of the corpus (every split)
that started before the evaluated one (`past_queries`); in `decode` of a raw log, the user's
earlier sessions in the log; in `suggest`, the sessions typed before.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Collection, Iterator, Sequence

import numpy as np

from mtn_jax import errors
from mtn_jax.data import sessions


class Habits:
  """One user's past queries, added oldest first, and the figures above."""

  def __init__(self, past: Sequence[str] = ()):
    self.counts: dict[str, int] = {}
    self.hits = 0  # past queries that were the habit query of their moment
    self.past = 0  # past queries after the first
    self._last: str | None = None
    # The distinct queries by count, then first issue: the habit query is the first of them
    # outside the session, found in a few steps (sorting the counts at every query would make
    # replaying a long past quadratic).
    self._ranked: list[str] = []
    self._position: dict[str, int] = {}  # in _ranked
    self._first_issue: dict[str, int] = {}
    for query in past:
      self.add(query)

  def add(self, query: str) -> None:
    if self._last is not None:
      self.hits += self.habit_query((self._last,)) == query
      self.past += 1
    if query not in self.counts:
      self.counts[query] = 0
      self._first_issue[query] = self._position[query] = len(self._ranked)
      self._ranked.append(query)
    self.counts[query] += 1
    key = lambda q: (-self.counts[q], self._first_issue[q])
    i = self._position[query]
    while i and key(self._ranked[i - 1]) > key(query):  # up past those it now outranks
      ahead = self._ranked[i - 1]
      self._ranked[i - 1], self._ranked[i] = query, ahead
      self._position[query], self._position[ahead] = i - 1, i
      i -= 1
    self._last = query

  def habit_query(self, session: Collection[str]) -> str | None:
    """The most issued past query not in `session` (on a tie, the one issued first)."""
    return next((q for q in self._ranked if q not in session), None)

  @property
  def rate(self) -> float:
    return self.hits / self.past if self.past else 0.0

  def first(self, session: Sequence[str], rate: float, min_past: int) -> str | None:
    """The habit query to suggest first after `session` (the queries so far), or None where
    the user's rate is below `rate` or measured over fewer than `min_past` queries."""
    if not habitual(self.rate, self.past, rate, min_past):
      return None
    return self.habit_query(set(session))


def habitual(user_rate: float, user_past: int, rate: float, min_past: int) -> bool:
  """Whether a user's habit rate `user_rate` over `user_past` queries puts their habit query
  first, at the thresholds `rate` and `min_past`."""
  return user_past >= min_past and user_rate >= rate


def carried(histories: Sequence[Sequence[str]]) -> Iterator[Habits]:
  """Each history's figures, in order. A user's sessions come one after another, each past
  the one before plus that session: where a history extends the previous one the figures are
  carried over, not replayed from the start (which grows with the square of a user's
  sessions). The object yielded is updated at the next step: read it before."""
  user, replayed = Habits(), ()
  for history in histories:
    past = tuple(history)
    if past[:len(replayed)] != replayed:
      user, replayed = Habits(), ()
    for query in past[len(replayed):]:
      user.add(query)
    replayed = past
    yield user


def past_queries(data_dir: str, split: sessions.SessionSplit, keep: int | None = None
                 ) -> list[tuple[str, ...]]:
  """[split.num_sessions] each session's user's earlier queries, oldest first: the queries of
  the corpus's sessions of that user (every split of `data_dir`) that started before it, the
  latest `keep` of them (None: all)."""
  if split.users is None or split.start_times is None:
    raise errors.Error(f'the {split.name} split in {data_dir} keeps no users or start times '
                       'to read a user\'s past from (the habit rule, the history source): '
                       'run --mode=preprocess again')
  by_user = collections.defaultdict(list)  # user -> [(start time, texts)]
  for name in sessions.SPLITS:
    other = sessions.load_split(data_dir, name)
    for i in range(other.num_sessions):
      by_user[int(other.users[i])].append((int(other.start_times[i]), other.session_texts(i)))
  starts, flat, offsets = {}, {}, {}
  for user, found in by_user.items():
    found.sort(key=lambda s: s[0])
    starts[user] = [s for s, _ in found]
    flat[user] = tuple(q for _, texts in found for q in texts)
    offsets[user] = np.cumsum([0] + [len(texts) for _, texts in found]).tolist()
  out = []
  for user, start in zip(split.users.tolist(), split.start_times.tolist()):
    end = offsets[user][bisect.bisect_left(starts[user], start)]  # sessions started before
    out.append(flat[user][0 if keep is None else max(0, end - keep):end])
  return out
