"""Metrics: BLEU exactly as multi-bleu.perl (M-NSRF's port) defines it, and ranking metrics."""

import collections
import json
import math
import random

import numpy as np
import pytest

from mtn_jax.evaluation import evaluate
from mtn_jax.evaluation import metrics


def _oracle_bleu(candidates, references):
  """The definition in mtn_jax.metrics' docstring, read literally: the engine's oracle."""
  correct, total = [0] * 4, [0] * 4
  c = r = 0
  for candidate, reference in zip(candidates, references, strict=True):
    cand, ref = candidate.strip().split(), reference.strip().split()
    c, r = c + len(cand), r + len(ref)
    for n in range(1, 5):
      cand_ngrams = collections.Counter(tuple(cand[i:i + n]) for i in range(len(cand) - n + 1))
      ref_ngrams = collections.Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
      total[n - 1] += max(0, len(cand) - n + 1)
      correct[n - 1] += sum(min(k, ref_ngrams[g]) for g, k in cand_ngrams.items())
  precisions = tuple(100 * k / t if k else 0.0 for k, t in zip(correct, total))
  bp = 1.0 if c >= r else (math.exp(1 - r / c) if c else 0.0)
  if not all(correct):
    return metrics.BleuScore(0.0, precisions, bp, c, r), correct
  log_mean = sum(math.log(k / t) for k, t in zip(correct, total)) / 4
  return metrics.BleuScore(100 * bp * math.exp(log_mean), precisions, bp, c, r), correct


def _assert_matches_oracle(score, oracle):
  assert (score.hyp_len, score.ref_len) == (oracle.hyp_len, oracle.ref_len)
  # Both sides compute 100 * correct / total and exp(1 - r / c): bit-identical floats.
  assert score.precisions == oracle.precisions
  assert score.bp == oracle.bp
  # sacrebleu averages logs of percentages, the oracle logs of fractions: last-bit differences.
  assert score.bleu == pytest.approx(oracle.bleu, rel=1e-12, abs=0)


def test_hand_computed_corpus_and_paper_format():
  # pair 1 'a b c d' vs itself: correct = total = 4, 3, 2, 1.
  # pair 2 'a b x' vs 'a b c': totals 3, 2, 1, 0; matches a, b | 'a b' | none.
  # p = 6/7, 4/5, 2/3, 1/1; c = r = 7 -> BP 1; BLEU = 100 * (48/105) ** (1/4) = 82.23.
  score = metrics.bleu(['a b c d', 'a b x'], ['a b c d', 'a b c'])
  assert score.precisions == (600 / 7, 400 / 5, 200 / 3, 100.0)
  assert (score.bp, score.hyp_len, score.ref_len) == (1.0, 7, 7)
  assert score.bleu == pytest.approx(100 * (6 / 7 * 4 / 5 * 2 / 3) ** 0.25, rel=1e-12)
  assert str(score) == 'BLEU = 82.23, 85.7/80.0/66.7/100.0'


def test_str_prints_the_papers_line():
  score = metrics.BleuScore(bleu=14.6213, precisions=(35.71, 21.54, 14.94, 10.249), bp=1.0,
                            hyp_len=10, ref_len=9)
  assert str(score) == 'BLEU = 14.62, 35.7/21.5/14.9/10.2'


def test_to_dict_survives_json_exactly():
  score = metrics.bleu(['a b c d', 'a b x'], ['a b c d', 'a b c'])
  restored = json.loads(json.dumps(score.to_dict()))
  assert restored == {'bleu': score.bleu, 'precisions': list(score.precisions),
                      'bp': score.bp, 'hyp_len': 7, 'ref_len': 7}
  assert metrics.BleuScore(**{**restored, 'precisions': tuple(restored['precisions'])}) == score
  # Each length under its own name: 2 candidate words against 3 reference words.
  short = metrics.bleu(['a b'], ['a b c']).to_dict()
  assert (short['hyp_len'], short['ref_len']) == (2, 3)


def test_empty_candidate_adds_only_its_reference_length():
  # '' vs 'x y z' adds r += 3 and nothing else; 'a b' vs 'a b': totals 2, 1, 0, 0.
  # p3 has no n-grams -> 0 -> BLEU 0; c = 2 < r = 5 -> BP = exp(1 - 5/2).
  score = metrics.bleu(['', 'a b'], ['x y z', 'a b'])
  assert score.precisions == (100.0, 100.0, 0.0, 0.0)
  assert (score.hyp_len, score.ref_len) == (2, 5)
  assert score.bp == math.exp(-1.5)
  assert score.bleu == 0.0


def test_candidates_shorter_than_n_add_no_ngrams():
  # 'a' contributes one unigram and no 2/3/4-grams: totals 5, 3, 2, 1, all matched.
  # (NLTK would count 'a' as one n-gram of each order and report 5/5, 3/4, 2/3, 1/2.)
  score = metrics.bleu(['a', 'a b c d'], ['a', 'a b c d'])
  assert score.precisions == (100.0, 100.0, 100.0, 100.0)
  # exp(mean of log 100.0) lands a few ulps off 100: the engine's rounding, not a bonus.
  assert score.bleu == pytest.approx(100.0, rel=1e-12)


def test_counts_are_clipped_by_the_reference():
  # 'the' thrice, the reference has it once: 1/3; 'the the' never occurs in 'the cat'.
  score = metrics.bleu(['the the the'], ['the cat'])
  assert score.precisions == (100 / 3, 0.0, 0.0, 0.0)
  assert (score.bp, score.bleu) == (1.0, 0.0)


def test_precisions_are_micro_averaged_over_the_corpus():
  # Pair-level unigram precisions 1/1 and 1/3 would average to 66.7; the corpus gives 2/4.
  score = metrics.bleu(['a', 'x y a'], ['a', 'a'])
  assert score.precisions[0] == 50.0


def test_unk_matches_only_a_literal_unk():
  assert metrics.bleu(['<unk> b'], ['rare b']).precisions[:2] == (50.0, 0.0)
  assert metrics.bleu(['<unk> b'], ['<unk> b']).precisions[:2] == (100.0, 100.0)


def test_any_unicode_whitespace_separates_words():
  # NBSP, tab, ideographic space, runs of spaces and padding all split like str.split().
  score = metrics.bleu(['a\u00a0b\tc  d', '\u3000e f '], [' a b c d\n', 'e\u2003f'])
  assert score == metrics.bleu(['a b c d', 'e f'], ['a b c d', 'e f'])
  assert (score.hyp_len, score.ref_len) == (6, 6)
  assert score.bleu == pytest.approx(100.0, rel=1e-12)


def test_words_are_case_sensitive():
  score = metrics.bleu(['Paris hotels'], ['paris hotels'])
  assert score.precisions[:2] == (50.0, 0.0)


def test_brevity_penalty_when_candidates_are_short():
  # Every n-gram matches; c = 4 < r = 6 -> BP = exp(1 - 6/4); BLEU = 100 * BP = 60.65.
  score = metrics.bleu(['a b c d'], ['a b c d e f'])
  assert score.precisions == (100.0, 100.0, 100.0, 100.0)
  assert score.bp == math.exp(-0.5)
  assert score.bleu == pytest.approx(100 * math.exp(-0.5), rel=1e-12)


def test_no_brevity_penalty_when_candidates_are_long():
  # p = 4/6, 3/5, 2/4, 1/3; c = 6 >= r = 4 -> BP 1; BLEU = 100 * (1/15) ** (1/4) = 50.81.
  score = metrics.bleu(['a b c d e f'], ['a b c d'])
  assert score.bp == 1.0
  assert score.bleu == pytest.approx(100 * (1 / 15) ** 0.25, rel=1e-12)


def test_no_match_at_all_gives_zero():
  score = metrics.bleu(['x y'], ['a b'])
  assert score == metrics.BleuScore(0.0, (0.0, 0.0, 0.0, 0.0), 1.0, 2, 2)


def test_nothing_suggested_gives_zero_brevity_penalty():
  # c = 0 < r = 2: BP 0 and BLEU 0, not a division by zero.
  score = metrics.bleu([''], ['a b'])
  assert score == metrics.BleuScore(0.0, (0.0, 0.0, 0.0, 0.0), 0.0, 0, 2)


def test_empty_corpus_scores_zero_with_zero_lengths():
  assert metrics.bleu([], []) == metrics.BleuScore(0.0, (0.0, 0.0, 0.0, 0.0), 1.0, 0, 0)


def test_mismatched_lengths_name_both():
  with pytest.raises(ValueError, match='3 candidates and 2 references'):
    metrics.bleu(['a', 'b', 'c'], ['a', 'b'])


def test_non_string_entry_is_named():
  with pytest.raises(TypeError, match=r'references\[1\] must be a string, got list'):
    metrics.bleu(['a', 'b'], ['a', ['b']])


def test_agrees_with_the_definition_on_random_queries():
  rng = random.Random(0)
  words = ['a', 'b', 'c', 'A', 'the', 'cat', '<unk>', 'new-york']
  separators = [' ', '  ', '\t', '\u00a0', '\u3000']

  def words_of_a_query():
    return [rng.choice(words) for _ in range(rng.randint(0, 6))]

  def edited(query_words):
    # Suggestions resemble their references in practice; edits keep some n-grams shared.
    kept = [w if rng.random() < 0.8 else rng.choice(words) for w in query_words]
    return kept[:rng.randint(len(kept) - 1, len(kept))] if kept else kept

  def text(query_words):
    padding = rng.choice(['', ' ', '\t'])
    return padding + ''.join(w + rng.choice(separators) for w in query_words)

  regimes = collections.Counter()
  for corpus_size in [1, 2, 3, 5, 8] * 8 + [400]:
    references = [words_of_a_query() for _ in range(corpus_size)]
    candidates = [edited(r) if rng.random() < 0.7 else words_of_a_query() for r in references]
    candidates, references = [text(c) for c in candidates], [text(r) for r in references]
    oracle, correct = _oracle_bleu(candidates, references)
    _assert_matches_oracle(metrics.bleu(candidates, references), oracle)
    regimes['scored' if oracle.bleu > 0 else 'zero'] += 1
    regimes['short' if oracle.bp < 1 else 'long'] += 1
    regimes['some order unmatched' if 0 in correct and any(correct) else 'all or none'] += 1
  # The seed must exercise every branch of the definition, or the cross-check proves little.
  assert all(regimes[k] >= 3 for k in ('scored', 'zero', 'short', 'long',
                                        'some order unmatched', 'all or none')), regimes


def test_ranks_count_ties_against_the_true_candidate():
  scores = np.array([[0.1, 0.9, 0.5],   # true 0.5: only 0.9 beats it -> 2
                     [0.3, 0.3, 0.3],   # all tied: both others count -> 3
                     [2.0, 1.0, 0.0],   # true is the best -> 1
                     [1.0, 2.0, 2.0]])  # true 2.0 ties with 2.0 -> 2
  ranks = metrics.ranks_from_scores(scores, np.array([2, 1, 0, 1]))
  np.testing.assert_array_equal(ranks, [2, 3, 1, 2])
  assert ranks.dtype == np.int64


def test_ranks_equal_argsort_position_and_ignore_candidate_order():
  rng = np.random.default_rng(0)
  distinct = rng.permutation(20 * 7).reshape(20, 7).astype(np.float32)
  true_index = rng.integers(0, 7, size=20)
  by_score = np.argsort(-distinct, axis=1)
  expected = 1 + np.argmax(by_score == true_index[:, None], axis=1)
  np.testing.assert_array_equal(metrics.ranks_from_scores(distinct, true_index), expected)
  tied = rng.integers(0, 3, size=(20, 7)).astype(np.float32)
  order = rng.permutation(7)
  np.testing.assert_array_equal(
      metrics.ranks_from_scores(tied[:, order], np.argsort(order)[true_index]),
      metrics.ranks_from_scores(tied, true_index))


@pytest.mark.parametrize('scores, true_index, message', [
    (np.zeros(3), np.zeros(3, int), r'\[examples, candidates\], got shape \(3,\)'),
    (np.zeros((2, 3)), np.zeros(3, int), r'\[examples\] = \[2\], got shape \(3,\)'),
    (np.zeros((2, 3)), np.zeros(2), 'integers, got dtype float64'),
    (np.zeros((2, 3)), np.array([0, 3]), r'true_index\[1\] = 3 is not a column of the 3'),
    (np.zeros((2, 3)), np.array([0, -1]), r'true_index\[1\] = -1 is not a column of the 3'),
    (np.array([[0.0, 1.0], [np.nan, 1.0]]), np.array([0, 1]), 'example 1 contain NaN'),
])
def test_bad_scores_are_refused(scores, true_index, message):
  with pytest.raises(ValueError, match=message):
    metrics.ranks_from_scores(scores, true_index)


def test_recall_at_k():
  ranks = [1, 2, 3, 1, 5]
  assert metrics.recall_at_k(ranks, 1) == 2 / 5
  assert metrics.recall_at_k(ranks, 3) == 4 / 5
  assert metrics.recall_at_k(np.array(ranks), 5) == 1.0


def test_mean_reciprocal_rank():
  # (1 + 1/2 + 1/4 + 1) / 4 = 0.6875, exact in binary.
  assert metrics.mean_reciprocal_rank([1, 2, 4, 1]) == 0.6875


@pytest.mark.parametrize('ranks, k, message', [
    ([1, 2], 0, 'k must be at least 1, got 0'),
    ([], 1, r'non-empty \[examples\] list, got shape \(0,\)'),
    ([[1, 2]], 1, r'non-empty \[examples\] list, got shape \(1, 2\)'),
    ([1.0, 2.0], 1, 'integers, got dtype float64'),
    ([1, 0], 1, r'ranks\[1\] = 0, but rank 1 is the best'),
])
def test_bad_ranks_are_refused(ranks, k, message):
  with pytest.raises(ValueError, match=message):
    metrics.recall_at_k(ranks, k)
  if k >= 1:
    with pytest.raises(ValueError, match=message):
      metrics.mean_reciprocal_rank(ranks)


# Ranked suggestions: every expected value below is counted by hand from the lists.


def test_ranking_over_distinct_suggestions_by_hand():
  suggestions = [
      ['a', 'a', 'a', 'b'],                    # distinct a, b: 'b' at rank 2
      ['c', 'c', 'd', 'd', 'e', 'f', 'g'],     # distinct c d e f g: 'g' at rank 5
      ['h', 'i', 'j', 'k', 'l', 'm', 'n'],     # 'n' at rank 7: only in the top 10
      [],                                      # nothing suggested
      ['Paris', 'paris hotels'],               # 'paris' is not 'Paris': not found
      ['x', 'y'],                              # 'x' at rank 1, and the session typed it
  ]
  references = ['b', 'g', 'n', 'o', 'paris', 'x']
  sessions = [['a'], ['z'], ['y'], ['o'], ['paris'], ['w', 'x']]
  score = metrics.suggestion_ranking(suggestions, references, sessions)
  assert score.pairs == 6
  assert score.exact_match == pytest.approx(100 * 1 / 6)  # pair 5
  assert score.recall_at_5 == pytest.approx(100 * 3 / 6)  # pairs 0, 1, 5
  assert score.recall_at_10 == pytest.approx(100 * 4 / 6)  # and pair 2
  assert score.mrr_at_10 == pytest.approx(100 * (1 / 2 + 1 / 5 + 1 / 7 + 1) / 6)
  # Top-1 'a' is session 0's query, 'x' session 5's; 'Paris' is not session 4's 'paris',
  # and the empty list has no top suggestion.
  assert score.repeats_session == pytest.approx(100 * 2 / 6)
  assert score.to_dict() == {
      'exact_match': score.exact_match, 'recall_at_5': score.recall_at_5,
      'recall_at_10': score.recall_at_10, 'mrr_at_10': score.mrr_at_10,
      'repeats_session': score.repeats_session, 'pairs': 6,
      'longest_list': max(len(set(s)) for s in suggestions)}
  json.dumps(score.to_dict())


def test_ranking_cutoffs_count_distinct_suggestions_not_list_positions():
  twelve = [f'q{i}' for i in range(12)]
  # With each of the first suggestions doubled, q4 sits at list position 9 but is the 5th
  # distinct one, and q9 at position 19 is the 10th distinct one.
  doubled = [q for q in twelve for _ in range(2)]
  cases = [  # (suggestions, reference, recall@5, recall@10, reciprocal rank @10)
      (doubled, 'q4', 1, 1, 1 / 5),
      (doubled, 'q5', 0, 1, 1 / 6),
      (doubled, 'q9', 0, 1, 1 / 10),
      (doubled, 'q10', 0, 0, 0),  # the 11th distinct: past every cut-off
      (twelve, 'q11', 0, 0, 0),
      (['q0'] * 30 + ['q1'], 'q1', 1, 1, 1 / 2),  # 30 copies are one suggestion
  ]
  for suggestions, reference, at_5, at_10, reciprocal in cases:
    score = metrics.suggestion_ranking([suggestions], [reference], [[]])
    assert (score.exact_match, score.recall_at_5, score.recall_at_10) == (0, 100 * at_5,
                                                                          100 * at_10)
    assert score.mrr_at_10 == pytest.approx(100 * reciprocal), reference


def test_ranking_with_no_suggestions_at_all_scores_zero():
  score = metrics.suggestion_ranking([[], []], ['a', 'b'], [['a'], []])
  assert score.to_dict() == {'exact_match': 0, 'recall_at_5': 0, 'recall_at_10': 0,
                             'mrr_at_10': 0, 'repeats_session': 0, 'pairs': 2,
                             'longest_list': 0}


def test_recall_at_a_rank_no_list_reaches_is_not_reported():
  # Lists of at most 5 distinct suggestions: R@10 could only repeat R@5.
  score = metrics.suggestion_ranking([['a', 'b', 'b', 'c', 'd', 'e'], ['x']], ['e', 'y'],
                                     [[], []])
  assert score.longest_list == 5 and score.recall_at_5 == score.recall_at_10 == 50
  ranking = score.to_dict()
  assert metrics.RankingScore.reaches(ranking, 5) and not metrics.RankingScore.reaches(ranking, 10)
  line = evaluate.ranking_line(ranking)
  assert 'R@5 50.0' in line and 'R@10 n/a (lists of 5)' in line
  # Results written before the field existed are read as reaching every rank.
  del ranking['longest_list']
  assert 'R@10 50.0' in evaluate.ranking_line(ranking)


def test_perfect_ranking_scores_one_hundred():
  score = metrics.suggestion_ranking([['b', 'a'], ['c']], ['b', 'c'], [['a'], ['a', 'b']])
  assert (score.exact_match, score.recall_at_5, score.recall_at_10, score.mrr_at_10,
          score.repeats_session) == (100, 100, 100, 100, 0)


@pytest.mark.parametrize('suggestions, references, sessions, error, message', [
    (['abc'], ['abc'], [[]], TypeError,
     r"suggestions\[0\] must be a list of strings, got the string 'abc'"),
    ([['a']], ['a'], ['a'], TypeError, r"sessions\[0\] must be a list of strings"),
    ([['a', None]], ['a'], [[]], TypeError, r'suggestions\[0\]\[1\] must be a string, got '
     'NoneType'),
    ([['a']], [('a',)], [[]], TypeError, r'references\[0\] must be a string, got tuple'),
    ([['a'], []], ['a'], [[], []], ValueError, 'one each per pair'),
])
def test_ranking_refuses_malformed_input(suggestions, references, sessions, error, message):
  with pytest.raises(error, match=message):
    metrics.suggestion_ranking(suggestions, references, sessions)


def test_without_session_queries_compares_exactly_and_keeps_order():
  suggestions = ['paris', 'Paris', 'paris hotels', 'paris', 'rome', 'paris ']
  assert metrics.without_session_queries(suggestions, ['paris', 'rome']) == [
      'Paris', 'paris hotels', 'paris ']
  assert metrics.without_session_queries(suggestions, []) == suggestions
  assert metrics.without_session_queries([], ['paris']) == []
  # An empty suggestion (a model that ends the query at once) is no suggestion to a person.
  assert metrics.without_session_queries(['', 'rome', ''], ['paris']) == ['rome']
  # The protocol that never repeats the session: the next distinct one moves up to rank 1.
  kept = metrics.without_session_queries(['a', 'b', 'a', 'c'], ['a'])
  score = metrics.suggestion_ranking([kept], ['b'], [['a']])
  assert (score.exact_match, score.repeats_session) == (100, 0)
