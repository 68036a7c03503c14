"""The pooling and ordering of 'rerank' (`mtn_jax.inference.pipeline.Rankers.order`), its
ranker replaced by given scores, and what is shown of it (`pipeline.show`)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from mtn_jax.inference import pipeline


def rankers_with_scores(scores: dict[str, float], use_mbr: bool) -> pipeline.Rankers:
  rankers = pipeline.Rankers(ranker=None, mbr=use_mbr)
  rankers.score_lists = lambda sessions, lists, batch_rows: [
      [np.asarray([scores[q] for q in texts], np.float32) for texts in session_lists]
      for session_lists in lists]
  return rankers


def expected_utilities(scores: dict[str, float]) -> dict[str, float]:
  """MBR's expected utility of each candidate against all of them as evidence, weighted by
  the softmax of their scores, with sacrebleu's sentence BLEU (add-one smoothing of orders 2
  to 4, words as given): an independent reference for `mbr.rerank`."""
  bleu = BLEU(tokenize='none', smooth_method='add-k', smooth_value=1, effective_order=True)
  total = sum(math.exp(s) for s in scores.values())
  return {c: sum(math.exp(s) / total * bleu.sentence_score(c, [h]).score / 100
                 for h, s in scores.items())
          for c in scores}


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
  # The second position's five candidates (the beam's, the other source's and the session's)
  # are the evidence; each is scored by its expected utility, best first.
  utilities = expected_utilities({c['query']: SCORES[c['query']] for c in ranked})
  assert [c['query'] for c in with_mbr] == [
      'cheap flights paris hotel', 'cheap flights paris', 'cheap flights paris hotels',
      'paris hotel', 'cheap flights']
  assert [c['score'] for c in with_mbr] == pytest.approx(
      [utilities[c['query']] for c in with_mbr], rel=1e-6)
  assert [c['model_score'] for c in with_mbr] == pytest.approx(
      [SCORES[c['query']] for c in with_mbr])
  # The best-scored 'paris hotel' shares little with the rest of the mass; the consensus of
  # the three 'cheap flights paris ...' candidates is chosen.
  assert ranked[0]['query'] == 'paris hotel'
  assert {c['query'] for c in with_mbr} == {c['query'] for c in ranked}


def test_what_is_shown_under_the_user_facing_protocol_is_the_order_with_the_session_dropped():
  # MBR's evidence is every candidate, the session's queries too, as in the generator's own
  # MBR: the user-facing list is that order with the session's queries dropped, then cut (to
  # 2 of the 3 left: 'paris hotel' is not shown).
  rankers = rankers_with_scores(SCORES, use_mbr=True)
  with_mbr = rankers.order([SESSION], [[BEAM], [OTHER]], batch_rows=1)[0][1]
  shown = pipeline.show(with_mbr, SESSION, True, top_k=2)
  utilities = expected_utilities({q: SCORES[q] for q in (
      'cheap flights paris hotel', 'paris hotel', 'cheap flights paris',
      'cheap flights paris hotels', 'cheap flights')})
  assert [c['query'] for c in shown] == ['cheap flights paris hotel', 'cheap flights paris hotels']
  assert [c['score'] for c in shown] == pytest.approx(
      [utilities[c['query']] for c in shown], rel=1e-6)


def test_rerank_keeps_the_generators_order_on_ties_and_pools_no_empty_text():
  """Candidates the ranker scores alike keep the order they were pooled in (the beam's
  first); an empty or blank candidate is never pooled, however a ranker would score it."""
  scores = {'b': 1.0, 'a': 1.0, 'c': 1.0, 'x': 0.5, '': 9.0, ' ': 9.0}
  out = rankers_with_scores(scores, use_mbr=False).order(
      [['x']], [[[['b', '', 'a', ' ']]], [[['c']]]], batch_rows=1)
  assert [c['query'] for c in out[0][0]] == ['b', 'a', 'c', 'x']
  # Enough ties that an unstable sort reorders them (numpy's default does past a few dozen
  # bytes): every one in its pooled order.
  tied = [f'q{i}' for i in range(24)]
  out = rankers_with_scores({**dict.fromkeys(tied, 1.0), 'x': 0.5}, use_mbr=False).order(
      [['x']], [[[['x', *tied]]]], batch_rows=1)
  assert [c['query'] for c in out[0][0]] == [*tied, 'x']


def test_each_position_shows_its_list_without_any_query_of_the_session_so_far(tmp_path):
  """`Pipeline.suggest`: after each output position the user-facing protocol drops every
  query of the session up to it (not the last alone), and only those."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.suggest.strategy = 'generate'
  config.decode.exclude_session_queries = True
  config.decode.top_k = 10
  suggester = pipeline.Pipeline(pipeline.Settings.from_config(config), None, None, None, None,
                                None, str(tmp_path))
  ranked = [{'query': q, 'score': -float(i)} for i, q in enumerate(['a', 'b', 'c', 'd'])]
  suggester.ordered = lambda contexts, **_: [[ranked] * (len(c.queries) - c.first_output)
                                             for c in contexts]
  lists = suggester.suggest([Context(('a', 'b', 'c'), 0, {}), Context(('c', 'b'), 1, {})],
                            positions='all')
  assert [[[s['query'] for s in at] for at in by_context] for by_context in lists] == [
      [['b', 'c', 'd'], ['c', 'd'], ['d']], [['a', 'd']]]


def test_retrieve_keeps_top_k_after_the_session_queries_are_dropped(tmp_path, monkeypatch):
  """'retrieve' asks the ranker for enough pool entries that the user-facing list still holds
  top_k when the ranker's best are the session's own queries (dropped), and no more."""
  import types  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import sources as sources_lib  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  config = default.get_config()
  config.suggest.strategy = 'retrieve'
  config.decode.exclude_session_queries = True
  config.decode.top_k = 3
  session = ('a', 'b', 'c', 'd')
  asked = []

  class RankedSessionFirst:
    """A ranker whose best entries are the session's queries, then the pool's others."""

    def __init__(self, retriever, k, history_queries):
      del retriever, history_queries
      self.k = k
      asked.append(k)

    def propose(self, contexts, **_):
      pool = [*reversed(session), *(f'p{i}' for i in range(20))]
      return [[[{'query': q, 'score': -float(i)} for i, q in enumerate(pool[:self.k])]]
              for _ in contexts]

  monkeypatch.setattr(sources_lib, 'Retrieve', RankedSessionFirst)
  ranker = types.SimpleNamespace(cfg=types.SimpleNamespace(max_session_queries=len(session)))
  suggester = pipeline.Pipeline(pipeline.Settings.from_config(config), ranker, ranker,
                                object(), None, None, str(tmp_path))
  shown = suggester.suggest([Context(session, len(session) - 1, {})], positions='last')
  assert [s['query'] for s in shown[0][0]] == ['p0', 'p1', 'p2']
  assert asked == [3 + len(session)]
