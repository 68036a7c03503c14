"""The training log's suggesters without a model, by hand on a toy log: the most popular next
queries (MPC) and the co-occurring ones with MPC as their fallback."""

import numpy as np
import pytest

from mtn_jax.data.sessions import SessionSplit
from mtn_jax.evaluation import trivial
from mtn_jax.inference import popular


def toy_split(tmp_path):
  # Sessions: [a b], [a c], [a b], [x b c], [y d].
  texts = ['a', 'b', 'a', 'c', 'a', 'b', 'x', 'b', 'c', 'y', 'd']
  path = tmp_path / 'train.text.txt'
  path.write_text(''.join(t + '\n' for t in texts), encoding='utf-8')
  return SessionSplit('train', np.zeros((len(texts), 2), np.int32),
                      np.array([0, 2, 4, 6, 9, 11]), str(path))


def test_most_popular_counts_next_queries_only(tmp_path):
  counts = popular.LogCounts(toy_split(tmp_path))
  # Next queries: b (3: after a, a, x), c (2: after a, b), d (1). 'a', 'x' and 'y' only ever
  # open a session, so they are never a next query.
  assert counts.most_popular(10) == ['b', 'c', 'd']
  assert counts.most_popular(2) == ['b', 'c']
  assert counts.lists([['q'], ['a', 'z']], 2, 'popular') == [['b', 'c'], ['b', 'c']]


def test_cooccurring_then_the_popular_list(tmp_path):
  counts = popular.LogCounts(toy_split(tmp_path))
  # After 'a': b twice, c once. After 'b': c once. 'q' never occurs: the popular list.
  assert counts.cooccurring('a', 3) == ['b', 'c', 'd']
  assert counts.cooccurring('b', 2) == ['c', 'b']
  assert counts.cooccurring('q', 2) == ['b', 'c']
  assert counts.lists([['x', 'a'], ['b']], 2, 'cooccurring') == [['b', 'c'], ['c', 'b']]


def test_followers_are_the_k_most_frequent_next_queries_without_fallback(tmp_path):
  """The 'most frequent next' suggester asks for k followers: it gets at most k (k=1: the
  single most frequent, 'b' after 'a'), and none where the query was never followed."""
  counts = popular.LogCounts(toy_split(tmp_path))
  assert counts.followers('a', 1) == ['b']
  assert counts.followers('a', 5) == ['b', 'c']
  assert counts.followers('q', 3) == []


def test_counts_of_given_sessions_equal_the_split_file_counts(tmp_path):
  split = toy_split(tmp_path)
  from_file = popular.LogCounts(split)
  given = popular.LogCounts.of_sessions(split.session_texts(i) for i in range(5))
  assert (given.popular, given.following) == (from_file.popular, from_file.following)
  # Some sessions only (a user's held out): [a c] and [y d] alone.
  some = popular.LogCounts.of_sessions([['a', 'c'], ['y', 'd']])
  assert some.most_popular(5) == ['c', 'd'] and some.cooccurring('a', 2) == ['c', 'd']


def test_blend_fills_each_quota_with_queries_the_session_does_not_hold():
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  sources = {'generate': ['a', 's1', 'b', 'c'], 'popular': ['p', 'a', 'q'],
             'cooccurring': ['x']}
  plan = pipeline.parse_blend('popular:2,generate:2,cooccurring:1')
  ranked = pipeline.blended(sources, plan, session_so_far=['s1'])
  # popular's first 2 (p, a); generate's first 2 not in the session (a again, s1 kept in
  # place but not counted, b); cooccurring's x; then the rest: q, c.
  assert [r['query'] for r in ranked] == ['p', 'a', 's1', 'b', 'x', 'q', 'c']
  assert [r['source'] for r in ranked] == ['popular', 'popular', 'generate', 'generate',
                                           'cooccurring', 'popular', 'generate']
  assert [r['score'] for r in ranked] == [1 / k for k in range(1, 8)]
  shown = pipeline.show(ranked, ['s1'], exclude_session_queries=True, top_k=4)
  assert [r['query'] for r in shown] == ['p', 'a', 'b', 'x']
  assert [r['score'] for r in shown] == [1, 1 / 2, 1 / 4, 1 / 5]  # the blend's places
  # Shown as the pipeline shows the blend: scored by the places shown, with no gap where the
  # session's query was dropped.
  by_place = pipeline.show(ranked, ['s1'], exclude_session_queries=True, top_k=4,
                           scored_by_place=True)
  assert [(r['query'], r['score']) for r in by_place] == [('p', 1), ('a', 1 / 2), ('b', 1 / 3),
                                                          ('x', 1 / 4)]
  assert [r['score'] for r in ranked] == [1 / k for k in range(1, 8)]  # left as it was
  # An empty query (a model that ends the query at once) is not shown to a person; the
  # paper's protocol scores it as written.
  with_empty = [{'query': '', 'score': 1.0}] + ranked
  assert [r['query'] for r in pipeline.show(with_empty, ['s1'], exclude_session_queries=True,
                                            top_k=2)] == ['p', 'a']
  assert [r['query'] for r in pipeline.show(with_empty, ['s1'], exclude_session_queries=False,
                                            top_k=2)] == ['', 'p']
  # ... nor counted in its source's quota: the quotas are what the protocol shows.
  ranked = pipeline.blended({'generate': ['', 'a', 'b'], 'popular': ['p', 'q']},
                            pipeline.parse_blend('popular:1,generate:2'), session_so_far=['s'])
  assert [r['query'] for r in pipeline.show(ranked, ['s'], exclude_session_queries=True,
                                            top_k=3)] == ['p', 'a', 'b']
  for bad in ('popular', 'popular:0', 'nope:2', 'popular:1,popular:2', 'templates:2',
              'history:3'):  # the last two are sources, but none a blend draws from
    with pytest.raises(ValueError):
      pipeline.parse_blend(bad)
  # Spaces around an item or its count are no part of it.
  assert pipeline.parse_blend(' popular:2, generate: 7') == (('popular', 2), ('generate', 7))


def test_the_blends_log_lists_run_deep_enough_to_fill_top_k_without_the_session(tmp_path):
  """`blend_sources`: the log's lists hold top_k + the session's length, so that top_k are
  left once the session's queries (here the most popular) are dropped."""
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  counts = popular.LogCounts(toy_split(tmp_path))
  got = pipeline.blend_sources(['z'], ['b', 'a'], counts, top_k=1)
  assert got == {'generate': ['z'], 'popular': ['b', 'c', 'd'], 'cooccurring': ['b', 'c']}


def test_every_trivial_suggester_has_its_lists(tmp_path):
  split = toy_split(tmp_path)
  lists = trivial.lists(split, ['a', 'q'], [['a'], ['z', 'q']], k=2)
  assert set(lists) == set(trivial.SUGGESTERS)
  assert lists == {'repeat_previous': [['a'], ['q']],
                   'most_frequent_next': [['b', 'c'], ['q']],
                   'most_popular': [['b', 'c'], ['b', 'c']],
                   'most_cooccurring': [['b', 'c'], ['b', 'c']]}


def test_mpc_is_one_list_for_every_session_and_co_occurring_follows_the_previous_query(
    tmp_path):
  """The two log suggesters scored beside every model differ after a query with followers
  of its own: MPC lists the log's most popular next queries whatever the session, the
  co-occurring suggester the previous query's followers first ('c' after 'b')."""
  lists = trivial.lists(toy_split(tmp_path), ['b', 'q'], [['a', 'b'], ['q']], k=2)
  assert lists['most_popular'] == [['b', 'c'], ['b', 'c']]
  assert lists['most_cooccurring'] == [['c', 'b'], ['b', 'c']]
  assert lists['most_frequent_next'] == [['c'], ['q']]


def test_the_counts_keep_as_many_as_asked_and_every_bigram_each_time_logged(tmp_path):
  """`keep` bounds the popular and co-occurring lists (100 by default: a source 100 deep runs
  full); a word pair counts each time a next query holds it."""
  assert popular.LogCounts.of_sessions([['s', q] for q in 'abcde'], keep=3).most_popular(5) == [
      'a', 'b', 'c']
  assert popular.LogCounts.of_sessions([['s', q] for q in 'abcde'], keep=3).followers('s', 5) == [
      'a', 'b', 'c']
  followers = [f'q{i:02d}' for i in range(15)]
  assert popular.LogCounts.of_sessions([['s', q] for q in followers]).followers('s', 20) == (
      followers)
  counts = popular.LogCounts.of_sessions([['a', 'b c'], ['d', 'b c']])
  assert counts.bigrams[('b', 'c')] == 2 and counts.bigram_starts['b'] == 2
  many = [['s', f'q{i:03d}'] for i in range(150)]
  assert len(popular.LogCounts.of_sessions(many).most_popular(100)) == 100
  texts = [q for session in many for q in session]
  path = tmp_path / 'train.text.txt'
  path.write_text(''.join(t + '\n' for t in texts), encoding='utf-8')
  split = SessionSplit('train', np.zeros((300, 2), np.int32), np.arange(0, 301, 2), str(path))
  from_file = popular.LogCounts(split)
  assert len(from_file.most_popular(100)) == 100 and len(from_file.followers('s', 100)) == 100
