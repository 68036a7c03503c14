"""Ranked-suggestion metrics: exact values computed by hand, duplicates and empty lists, the
user-facing protocol that never repeats the session, and the trivial suggesters' lists."""

import numpy as np
import pytest

from mtn_jax.data.sessions import SessionSplit
from mtn_jax.evaluation import evaluate
from mtn_jax.evaluation import metrics
from mtn_jax.evaluation import trivial
from mtn_jax.inference import popular


def test_ranking_exact_values():
  suggestions = [
      ['a', 'a', 'b', 'c'],  # reference 'b': rank 2 among the distinct (a, b, c)
      ['x'],                 # reference 'y': not found
      [],                    # no suggestion at all
      ['q', 'r'],            # reference 'q': rank 1, and 'q' is in the session
      [f's{i}' for i in range(12)],  # reference 's10': rank 11, past the cut-off
      [f't{i}' for i in range(7)],   # reference 't5': rank 6
  ]
  references = ['b', 'y', 'z', 'q', 's10', 't5']
  sessions = [['a'], ['x'], ['z'], ['q', 'p'], ['u'], ['v']]
  score = metrics.suggestion_ranking(suggestions, references, sessions)
  assert score.pairs == 6
  assert score.exact_match == pytest.approx(100 / 6)
  assert score.recall_at_5 == pytest.approx(100 * 2 / 6)
  assert score.recall_at_10 == pytest.approx(100 * 3 / 6)
  assert score.mrr_at_10 == pytest.approx(100 * (1 / 2 + 1 + 1 / 6) / 6)
  # Top suggestions 'a' (in session 0) and 'x' (in session 1) and 'q' (in session 3).
  assert score.repeats_session == pytest.approx(100 * 3 / 6)


def test_ranking_refuses_mismatched_lists():
  with pytest.raises(ValueError, match='one each per pair'):
    metrics.suggestion_ranking([['a']], ['a', 'b'], [[]])
  with pytest.raises(ValueError, match='no pairs'):
    metrics.suggestion_ranking([], [], [])


def test_without_session_queries_keeps_order():
  assert metrics.without_session_queries(['a', 'b', 'c', 'b'], ['b', 'z']) == ['a', 'c']
  assert metrics.distinct(['a', 'b', 'a', 'c', 'b']) == ['a', 'b', 'c']


def test_score_suggesters_in_both_protocols():
  p, n = 'cheap new york hotels', 'new york city hotels'  # BLEU needs 4-grams
  suggestions = {'model': [[p, n]], 'repeat_previous': [[p]]}
  paper = evaluate.score_suggesters(suggestions, [n], [[p]], exclude_session=False)
  user = evaluate.score_suggesters(suggestions, [n], [[p]], exclude_session=True)
  assert paper['model']['ranking']['exact_match'] == 0
  assert paper['model']['ranking']['recall_at_5'] == 100
  assert paper['model']['ranking']['repeats_session'] == 100
  # Dropping the session's query p promotes n to the top: an exact match, BLEU 100.
  assert user['model']['ranking']['exact_match'] == 100
  assert user['model']['bleu'] == pytest.approx(100)
  assert paper['model']['bleu'] < 100
  assert user['repeat_previous']['ranking']['recall_at_10'] == 0
  assert user['repeat_previous']['bleu'] == 0  # nothing left to suggest


def test_most_frequent_next_lists(tmp_path):
  texts = ['a', 'b', 'a', 'c', 'a', 'b', 'a', 'd', 'x', 'y']
  # Sessions: [a b], [a c], [a b], [a d], [x y].
  path = tmp_path / 'train.text.txt'
  path.write_text(''.join(t + '\n' for t in texts), encoding='utf-8')
  split = SessionSplit('train', np.zeros((10, 2), np.int32), np.array([0, 2, 4, 6, 8, 10]),
                       str(path))
  assert trivial.most_frequent_next_lists(popular.LogCounts(split), ['a', 'x', 'q'], k=2) == [
      ['b', 'c'], ['y'], ['q']]
  assert trivial.most_frequent_next_lists(popular.LogCounts(split), ['a', 'q'], k=1) == [
      ['b'], ['q']]
  # trivial.lists cuts the list at its k too.
  assert trivial.lists(split, ['a'], [['a']], k=1)['most_frequent_next'] == [['b']]
  # Unasked, as deep as any ranking metric reads (RANKING_CUTOFF), no deeper.
  followers = [f'f{i:02d}' for i in range(metrics.RANKING_CUTOFF + 2)]
  counts = popular.LogCounts.of_sessions([['s', f] for f in followers])
  assert trivial.most_frequent_next_lists(counts, ['s']) == [
      followers[:metrics.RANKING_CUTOFF]]
