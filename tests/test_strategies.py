"""The pooling and ordering of 'rerank' (`mtn_jax.strategies.Rankers.rerank`), its ranker
replaced by given scores."""

from __future__ import annotations

import numpy as np

from mtn_jax import mbr
from mtn_jax import strategies


def rankers_with_scores(scores: dict[str, float], use_mbr: bool,
                        previous_query_bias: float = 0.0) -> strategies.Rankers:
  rankers = strategies.Rankers(ranker=None, retriever=None, retriever_workdir='', retrieved=0,
                               proposed=0, proposer=None, mbr=use_mbr,
                               previous_query_bias=previous_query_bias)
  rankers.score_lists = lambda sessions, lists, batch_rows: [
      [np.asarray([scores[q] for q in texts], np.float32) for texts in session_lists]
      for session_lists in lists]
  return rankers


SESSION = ['cheap flights', 'cheap flights paris']
BEAM = [['cheap hotels'], ['cheap flights paris hotel', 'paris hotel', 'cheap flights paris']]
OTHER = [['flights'], ['cheap flights paris hotels']]
SCORES = {'cheap hotels': 0.5, 'flights': 0.1, 'cheap flights': 0.2,
          'cheap flights paris hotel': 2.0, 'paris hotel': 2.1,
          'cheap flights paris hotels': 1.9, 'cheap flights paris': 1.0}


def test_rerank_pools_deduplicates_and_orders_by_score():
  out = rankers_with_scores(SCORES, use_mbr=False).rerank([SESSION], [[BEAM], [OTHER]],
                                                          batch_rows=1)
  first, second = out[0]
  assert [c['query'] for c in first] == ['cheap hotels', 'cheap flights', 'flights']
  # 'cheap flights paris' is in the beam and the session: once. Best score first.
  assert [c['query'] for c in second] == ['paris hotel', 'cheap flights paris hotel',
                                          'cheap flights paris hotels', 'cheap flights paris',
                                          'cheap flights']
  excluded = rankers_with_scores(SCORES, use_mbr=False).rerank(
      [SESSION], [[BEAM], [OTHER]], batch_rows=1, exclude_session_queries=True)[0][1]
  assert {c['query'] for c in excluded} == {'paris hotel', 'cheap flights paris hotel',
                                            'cheap flights paris hotels'}


def test_rerank_with_mbr_picks_the_consensus_of_the_rankers_distribution():
  ranked = rankers_with_scores(SCORES, use_mbr=False).rerank([SESSION], [[BEAM], [OTHER]],
                                                             batch_rows=1)[0][1]
  with_mbr = rankers_with_scores(SCORES, use_mbr=True).rerank([SESSION], [[BEAM], [OTHER]],
                                                              batch_rows=1)[0][1]
  assert with_mbr == mbr.rerank(ranked)
  # The best-scored 'paris hotel' shares little with the rest of the mass; the consensus of
  # the three 'cheap flights paris ...' candidates is chosen.
  assert ranked[0]['query'] == 'paris hotel'
  assert with_mbr[0]['query'].startswith('cheap flights paris')
  assert {c['query'] for c in with_mbr} == {c['query'] for c in ranked}


def test_previous_query_bias_lifts_only_the_query_before_the_suggestion():
  # After position 1 the previous query is 'cheap flights paris' (score 1.0); + 1.15 puts it
  # first, above 'paris hotel' (2.1) but leaves 'cheap flights' (position 0's) where it was.
  biased = rankers_with_scores(SCORES, use_mbr=False, previous_query_bias=1.15).rerank(
      [SESSION], [[BEAM], [OTHER]], batch_rows=1)[0]
  assert [c['query'] for c in biased[1]] == ['cheap flights paris', 'paris hotel',
                                             'cheap flights paris hotel',
                                             'cheap flights paris hotels', 'cheap flights']
  assert biased[1][0]['score'] == np.float32(1.0) + 1.15
  # After position 0 the previous query is 'cheap flights' (0.2 + 1.15 > 0.5).
  assert biased[0][0]['query'] == 'cheap flights'
  # Excluded from the list, it is not brought back.
  excluded = rankers_with_scores(SCORES, use_mbr=False, previous_query_bias=1.15).rerank(
      [SESSION], [[BEAM], [OTHER]], batch_rows=1, exclude_session_queries=True)[0][1]
  assert 'cheap flights paris' not in {c['query'] for c in excluded}


class GainByText:
  """A gain model whose gain of each candidate is given."""

  def __init__(self, gains: dict[str, float]):
    self.gains = gains

  def gains_after(self, session, generated, candidates):
    del session, generated
    return np.asarray([self.gains[q] for q in candidates])


def test_user_facing_lists_choose_among_what_is_shown_from_one_scoring():
  # The gain prefers the previous query, then the second-scored beam hypothesis.
  gains = {q: 0.0 for q in SCORES} | {'cheap flights paris': 3.0, 'cheap flights': 2.5,
                                      'cheap flights paris hotel': 1.0}
  rankers = rankers_with_scores(SCORES, use_mbr=False)
  rankers.gain = GainByText(gains)
  scored = rankers.score_lists
  calls = []
  rankers.score_lists = lambda *args, **kwargs: calls.append(1) or scored(*args, **kwargs)
  full, shown = rankers.rerank_both_protocols([SESSION], [[BEAM], [OTHER]], batch_rows=1)
  assert len(calls) == 1  # both protocols from one scoring
  assert full == rankers.rerank([SESSION], [[BEAM], [OTHER]], batch_rows=1)
  assert shown == rankers.rerank([SESSION], [[BEAM], [OTHER]], batch_rows=1,
                                 exclude_session_queries=True)
  assert full[0][1][0]['query'] == 'cheap flights paris'
  # Dropping the session's queries from the full list would show the ranker's first; the
  # user-facing list puts the best gain among the rest first, then the ranker's order.
  assert [c['query'] for c in shown[0][1]] == ['cheap flights paris hotel', 'paris hotel',
                                               'cheap flights paris hotels']
  assert [c['query'] for c in shown[0][0]] == ['cheap hotels', 'flights']
  # MBR's evidence is every candidate, as in the generator's own MBR: the user-facing list is
  # its order with the session's queries dropped.
  rankers.gain, rankers.mbr = None, True
  with_mbr = rankers.rerank([SESSION], [[BEAM], [OTHER]], batch_rows=1)[0][1]
  assert rankers.rerank([SESSION], [[BEAM], [OTHER]], batch_rows=1,
                        exclude_session_queries=True)[0][1] == [
                            c for c in with_mbr if c['query'] not in SESSION]
