"""The pooling and ordering of 'rerank' (`mtn_jax.inference.pipeline.Rankers.order`), its
ranker replaced by given scores, and what is shown of it (`pipeline.show`)."""

from __future__ import annotations

import numpy as np

from mtn_jax.decoding import mbr
from mtn_jax.inference import pipeline


def rankers_with_scores(scores: dict[str, float], use_mbr: bool) -> pipeline.Rankers:
  rankers = pipeline.Rankers(ranker=None, mbr=use_mbr)
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
  out = rankers_with_scores(SCORES, use_mbr=False).order([SESSION], [[BEAM], [OTHER]],
                                                         batch_rows=1)
  first, second = out[0]
  assert [c['query'] for c in first] == ['cheap hotels', 'cheap flights', 'flights']
  # 'cheap flights paris' is in the beam and the session: once. Best score first.
  assert [c['query'] for c in second] == ['paris hotel', 'cheap flights paris hotel',
                                          'cheap flights paris hotels', 'cheap flights paris',
                                          'cheap flights']
  excluded = pipeline.show(second, SESSION, True, top_k=10)
  assert [c['query'] for c in excluded] == ['paris hotel', 'cheap flights paris hotel',
                                            'cheap flights paris hotels']
  # The paper's protocol shows the first top_k, the session's queries among them.
  assert pipeline.show(second, SESSION, False, top_k=2) == second[:2]
  assert pipeline.show(second, SESSION, True, top_k=2) == excluded[:2]


def test_rerank_with_mbr_picks_the_consensus_of_the_rankers_distribution():
  ranked = rankers_with_scores(SCORES, use_mbr=False).order([SESSION], [[BEAM], [OTHER]],
                                                            batch_rows=1)[0][1]
  with_mbr = rankers_with_scores(SCORES, use_mbr=True).order([SESSION], [[BEAM], [OTHER]],
                                                             batch_rows=1)[0][1]
  assert with_mbr == mbr.rerank(ranked)
  # The best-scored 'paris hotel' shares little with the rest of the mass; the consensus of
  # the three 'cheap flights paris ...' candidates is chosen.
  assert ranked[0]['query'] == 'paris hotel'
  assert with_mbr[0]['query'].startswith('cheap flights paris')
  assert {c['query'] for c in with_mbr} == {c['query'] for c in ranked}


def test_what_is_shown_under_the_user_facing_protocol_is_the_order_with_the_session_dropped():
  # MBR's evidence is every candidate, as in the generator's own MBR: the user-facing list is
  # its order with the session's queries dropped, then cut.
  rankers = rankers_with_scores(SCORES, use_mbr=True)
  with_mbr = rankers.order([SESSION], [[BEAM], [OTHER]], batch_rows=1)[0][1]
  assert pipeline.show(with_mbr, SESSION, True, top_k=10) == [
      c for c in with_mbr if c['query'] not in SESSION]
