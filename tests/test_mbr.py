"""Minimum-Bayes-risk reranking: the utility's exact values and the choice it makes."""

import math

import pytest

from mtn_jax.decoding import mbr


def test_sentence_bleu_plus_one_exact_values():
  # Identical 2-word queries: precisions 2/2, (1+1)/(1+1), (0+1)/(0+1), (0+1)/(0+1).
  assert mbr.sentence_bleu(['new', 'york'], ['new', 'york']) == pytest.approx(1.0)
  # 'cheap flights' against 'cheap flights paris': p = 2/2, 2/2, 1/1, 1/1, brevity e^(1-3/2).
  assert mbr.sentence_bleu(['cheap', 'flights'], ['cheap', 'flights', 'paris']) == (
      pytest.approx(math.exp(1 - 1.5)))
  # One word of three right: p1 = 1/3 (unsmoothed), p2 = 1/3, p3 = 1/2, p4 = 1/1; no brevity
  # penalty.
  expected = math.exp((math.log(1 / 3) + math.log(1 / 3) + math.log(1 / 2) + 0) / 4)
  assert mbr.sentence_bleu(['a', 'b', 'c'], ['a', 'x']) == pytest.approx(expected)
  # Repeated words are clipped to the reference's counts: p1 = 2/3, p2 = (1+1)/(2+1),
  # p3 = (0+1)/(1+1), p4 = 1 (no 4-gram); the hypothesis is the longer: no brevity penalty.
  expected = math.exp((2 * math.log(2 / 3) + math.log(1 / 2)) / 4)
  assert mbr.sentence_bleu(['a', 'a', 'a'], ['a', 'a']) == pytest.approx(expected)
  # No word in common scores 0, however short; so does an empty hypothesis.
  assert mbr.sentence_bleu(['ebay'], ['google']) == 0.0
  assert mbr.sentence_bleu([], ['a']) == 0.0


def test_rerank_picks_the_consensus_and_can_pick_a_session_query():
  ranked = [{'query': 'google', 'score': -1.0},
            {'query': 'make up schools ny', 'score': -1.2},
            {'query': 'make up schools nyc', 'score': -1.3},
            {'query': 'make up schools in ny', 'score': -1.4}]
  # 'google' is likeliest alone, the make-up-school variants together.
  reranked = mbr.rerank(ranked)
  assert reranked[0]['query'].startswith('make up schools')
  assert [r['query'] for r in reranked][-1] == 'google'
  assert {r['query'] for r in reranked} == {r['query'] for r in ranked}
  with_session = mbr.rerank(ranked, session=['ebay', 'make up schools'])
  assert len(with_session) == 6
  session_entry = next(r for r in with_session if r['query'] == 'ebay')
  # Every candidate is scored by its expected utility, the order of the list; the session
  # query, which the model did not propose, has no model score.
  assert session_entry['score'] == 0 and 'model_score' not in session_entry
  assert all(isinstance(r['score'], float) for r in with_session)
  utilities = [r['score'] for r in with_session]
  assert utilities == sorted(utilities, reverse=True)
  assert {r['query']: r['model_score'] for r in with_session if 'model_score' in r} == {
      r['query']: r['score'] for r in ranked}
  assert mbr.rerank([]) == []


def test_rerank_ties_among_session_queries_put_the_latest_first():
  # Neither session query shares a word with the evidence (utility 0 each): the documented
  # tie order is the session's, latest query first, the one a user most likely returns to.
  reranked = mbr.rerank([{'query': 'google', 'score': -1.0}], session=['ebay', 'yahoo'])
  assert [(r['query'], r['score']) for r in reranked] == [
      ('google', 1.0), ('yahoo', 0.0), ('ebay', 0.0)]


def test_rerank_ties_among_hypotheses_keep_the_beams_order():
  # Three equally likely hypotheses with no word in common: each has utility 1/3 exactly (its
  # own weight), so the order is the search's, not reversed or shuffled by the sort.
  ranked = [{'query': q, 'score': -2.0} for q in ('ebay', 'google', 'yahoo')]
  reranked = mbr.rerank(ranked)
  assert [r['query'] for r in reranked] == ['ebay', 'google', 'yahoo']
  assert [r['score'] for r in reranked] == [1 / 3] * 3


def test_rerank_session_query_that_the_beam_proposed_keeps_its_model_score():
  # A query both typed and proposed is one candidate: the model did propose it, so it keeps
  # the beam's score as 'model_score' (the session adds only queries the beam lacks).
  ranked = [{'query': 'google', 'score': -1.0}, {'query': 'ebay', 'score': -2.0}]
  reranked = mbr.rerank(ranked, session=['ebay', 'yahoo'])
  assert {r['query']: r.get('model_score') for r in reranked} == {
      'google': -1.0, 'ebay': -2.0, 'yahoo': None}


def test_rerank_a_query_proposed_twice_is_one_candidate_with_its_better_score():
  # Two token sequences can write the same text (subword pieces, pooled lists): one candidate,
  # which keeps the better of its scores (not the last one's); both weigh in as evidence.
  ranked = [{'query': 'c', 'score': -2.0}, {'query': 'a b', 'score': -1.0},
            {'query': 'a b', 'score': -5.0}]
  reranked = mbr.rerank(ranked)
  assert [r['query'] for r in reranked] == ['a b', 'c']
  assert {r['query']: r['model_score'] for r in reranked} == {'a b': -1.0, 'c': -2.0}


def test_rerank_reads_the_scores_as_log_weights_whatever_their_offset():
  # p = softmax(scores): only their differences matter. A ranker's scores (or a long query's
  # log-probability) can lie far below zero, where exp(score) alone is 0 for every one: the
  # list reranks as the same list shifted up, with the same utilities.
  ranked = [{'query': 'google', 'score': -1.0}, {'query': 'make up schools ny', 'score': -1.2},
            {'query': 'make up schools nyc', 'score': -1.3}]
  shifted = [{**r, 'score': r['score'] - 1000.0} for r in ranked]
  want = [(r['query'], r['score']) for r in mbr.rerank(ranked)]
  got = [(r['query'], r['score']) for r in mbr.rerank(shifted)]
  assert [q for q, _ in got] == [q for q, _ in want]
  assert [s for _, s in got] == pytest.approx([s for _, s in want], rel=1e-9)
