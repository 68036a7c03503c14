"""A user's habit query (`mtn_jax.habits`) and 'rerank' putting it first."""

from __future__ import annotations

import collections
import dataclasses
import random

import numpy as np
import pytest

from mtn_jax import errors
from mtn_jax.data import sessions
from mtn_jax.inference import habits
from mtn_jax.inference import pipeline


def by_definition(past: list[str]) -> tuple[int, int]:
  """(hits, past) of the module docstring's definition, with sorted counts."""
  counts, hits = collections.Counter(), 0
  for j, query in enumerate(past):
    if j:
      hits += next((q for q, _ in counts.most_common() if q != past[j - 1]), None) == query
    counts[query] += 1
  return hits, max(len(past) - 1, 0)


def test_habit_figures_by_hand():
  user = habits.Habits(['bank', 'mail', 'bank', 'news', 'bank', 'mail'])
  # Each query after the first against the most issued of those before, the one just before
  # left out: 'mail' (before it only 'bank', left out): no; 'bank' ('bank' 1, 'mail' left out):
  # a hit; 'news' ('mail', 'bank' left out): no; 'bank' ('bank' 2, 'news' left out): a hit;
  # 'mail' ('mail' and 'news' 1 each, 'bank' left out: 'mail', issued first): a hit.
  assert (user.hits, user.past) == (3, 5)
  assert user.rate == pytest.approx(0.6)
  assert user.habit_query(()) == 'bank'
  assert user.habit_query({'bank'}) == 'mail'  # 'mail' 2 against 'news' 1
  assert user.habit_query({'bank', 'mail', 'news'}) is None
  assert user.first(['bank'], rate=0.6, min_past=5) == 'mail'
  assert user.first(['bank'], rate=0.61, min_past=5) is None  # rate too low
  assert user.first(['bank'], rate=0.6, min_past=6) is None  # too short a past
  assert habits.Habits().first(['x'], 0.0, 0) is None  # no past, no habit
  # One query is no past to judge a habit by: its rate is 0, and no rate above 0 holds.
  assert habits.Habits(['bank']).rate == 0.0
  assert habits.Habits(['bank']).first(['x'], rate=0.5, min_past=0) is None
  # Every query of the session is left out, not only the last one.
  assert habits.Habits(['bank', 'mail', 'bank', 'news']).first(
      ['bank', 'news'], rate=0.0, min_past=0) == 'mail'


def test_incremental_ranking_equals_sorting_the_counts():
  rng = random.Random(0)
  for _ in range(200):
    past = [rng.choice('abcdefg'[:rng.randint(1, 7)]) for _ in range(rng.randint(0, 40))]
    user = habits.Habits(past)
    assert (user.hits, user.past) == by_definition(past), past
    counts = collections.Counter(past)
    session = set(rng.sample('abcdefg', 2))
    assert user.habit_query(session) == next(
        (q for q, _ in counts.most_common() if q not in session), None)


def write_split(data_dir, name, sessions_texts, users, start_times):
  texts = [q for s in sessions_texts for q in s]
  starts = np.concatenate([[0], np.cumsum([len(s) for s in sessions_texts])]).astype(np.int64)
  sessions.save_split(str(data_dir), name, np.zeros((len(texts), 10), np.int32), starts, texts,
                      np.asarray(users, np.int64), np.asarray(start_times, np.int64))


def test_past_queries_are_the_users_earlier_sessions_of_every_split(tmp_path):
  # User 1's sessions at times 10 (train), 20 (test), 30 (valid), 40 (train); user 2's at 15.
  write_split(tmp_path, 'train', [['a', 'b'], ['g'], ['x']], users=[1, 1, 2],
              start_times=[10, 40, 15])
  write_split(tmp_path, 'valid', [['e', 'f']], users=[1], start_times=[30])
  write_split(tmp_path, 'test', [['c', 'd']], users=[1], start_times=[20])
  test = sessions.load_split(str(tmp_path), 'test')
  assert habits.past_queries(str(tmp_path), test) == [('a', 'b')]
  valid = sessions.load_split(str(tmp_path), 'valid')
  assert habits.past_queries(str(tmp_path), valid) == [('a', 'b', 'c', 'd')]
  train = sessions.load_split(str(tmp_path), 'train')
  assert habits.past_queries(str(tmp_path), train) == [(), ('a', 'b', 'c', 'd', 'e', 'f'), ()]
  # The latest `keep` of them: across sessions, fewer where there are fewer.
  assert habits.past_queries(str(tmp_path), train, keep=3) == [(), ('d', 'e', 'f'), ()]
  assert habits.past_queries(str(tmp_path), valid, keep=3) == [('b', 'c', 'd')]
  assert habits.past_queries(str(tmp_path), test, keep=3) == [('a', 'b')]


def test_a_split_without_users_or_start_times_is_refused_in_one_line(tmp_path):
  write_split(tmp_path, 'train', [['a', 'b']], users=[1], start_times=[10])
  split = sessions.load_split(str(tmp_path), 'train')
  for missing in ({'users': None}, {'start_times': None}):
    with pytest.raises(errors.Error, match='keeps no users or start times'):
      habits.past_queries(str(tmp_path), dataclasses.replace(split, **missing))


def test_rerank_puts_the_habit_query_first_where_the_rate_holds():
  scores = {'cheap hotels': 0.5, 'cheap flights': 0.2, 'paris hotel': 2.1,
            'cheap flights paris': 1.0, 'bank': -5.0, 'mail': -6.0, 'news': 0.0}
  rankers = pipeline.Rankers(ranker=None, habit_rate=0.5, habit_min_past=3)
  scored = []

  def score_lists(sessions_, lists, batch_rows):
    del batch_rows
    scored.append(lists)
    return [[np.asarray([scores[q] for q in texts], np.float32) for texts in session_lists]
            for session_lists in lists]

  rankers.score_lists = score_lists
  session = ['cheap flights', 'cheap flights paris']
  beam = [['cheap hotels'], ['paris hotel']]
  habitual = ['bank', 'mail', 'bank', 'mail', 'bank']  # 3 hits of 4
  occasional = ['bank', 'mail', 'news', 'shop', 'bank']  # one hit of four
  out = rankers.order([session, session], [[beam, beam]], batch_rows=2,
                      histories=[habitual, occasional])
  # The habitual user's habit query joins the candidates (scored) and goes first, the rest in
  # the ranker's order; the other user's list is the ranker's.
  assert 'bank' in scored[0][0][1] and 'bank' not in scored[0][1][1]
  assert [c['query'] for c in out[0][1]] == ['bank', 'paris hotel', 'cheap flights paris',
                                             'cheap flights']
  assert [c['query'] for c in out[1][1]] == ['paris hotel', 'cheap flights paris',
                                             'cheap flights']
  # The user-facing protocol keeps it first (it is never a query of the session).
  shown = pipeline.show(rankers.order([session], [[beam]], batch_rows=1,
                                      histories=[habitual])[0][1], session, True, top_k=10)
  assert [c['query'] for c in shown] == ['bank', 'paris hotel']
  # One user's sessions in a row, each past extending the last (the figures carried over),
  # then another user's: the lists of each session alone.
  later = ['news', 'paris hotel']
  pasts = [habitual[:3], habitual, habitual + session, occasional]
  queries = [session, session, later, session]
  together = rankers.order(queries, [[beam] * 4], batch_rows=4, histories=pasts)
  assert together == [rankers.order([q], [[beam]], batch_rows=1, histories=[h])[0]
                      for q, h in zip(queries, pasts)]
  assert together[0][1][0]['query'] == 'paris hotel'  # a past of 2 later queries: too short
  assert together[2][1][0]['query'] == 'bank'
  with pytest.raises(ValueError, match='habit_rate'):
    rankers.order([session], [[beam]], batch_rows=1)


def test_config_refuses_habits_outside_rerank_and_rates_outside_0_1():
  from configs import aol  # pylint: disable=g-import-not-at-top
  from mtn_jax import config_lib  # pylint: disable=g-import-not-at-top
  config = aol.get_config('small')
  config.data.raw_files, config.suggest.habit_rate = 'log.tsv', 0.15
  with pytest.raises(config_lib.ConfigError,
                     match="config.suggest.habit_rate is read by 'rerank' only"):
    config_lib.validate(config, 'eval')
  config.suggest.strategy, config.suggest.ranker_workdir = 'rerank', 'ranker'
  config_lib.validate(config, 'eval')
  for key, value, message in (('habit_rate', 1.5, r'in \[0, 1\]'),
                              ('habit_min_past', -1, '>= 0')):
    bad = config.copy_and_resolve_references()
    bad.suggest[key] = value
    with pytest.raises(config_lib.ConfigError, match=f'habit_.*{message}'):
      config_lib.validate(bad, 'eval')


def test_user_habits_script_suggests_the_habit_or_the_previous_query(tmp_path):
  from experiments import user_habits  # pylint: disable=g-import-not-at-top
  # User 1 comes back to 'bank' and 'mail'; user 2 has a single earlier session.
  write_split(tmp_path, 'train', [['bank', 'mail'], ['bank', 'mail'], ['news', 'bank'],
                                  ['x', 'y'], ['y', 'z']],
              users=[1, 1, 1, 2, 2], start_times=[1, 2, 3, 4, 5])
  for name in ('valid', 'test'):
    write_split(tmp_path, name, [], users=[], start_times=[])
  contexts = user_habits.split_contexts(str(tmp_path), 'train')
  assert [(c.user, c.session, c.reference) for c in contexts] == [
      (1, ('bank',), 'mail'), (1, ('bank',), 'mail'), (1, ('news',), 'bank'),
      (2, ('x',), 'y'), (2, ('y',), 'z')]
  # Before session 3 user 1's past is 'bank mail bank mail', 2 of its 3 later queries hits:
  # its habit query 'bank' (issued first of the two) after 'news'. Shorter pasts: the previous.
  assert user_habits.suggest(contexts, rate=0.6, min_past=3) == [
      'bank', 'bank', 'bank', 'x', 'y']
  assert user_habits.suggest(contexts, rate=0.7, min_past=3) == [
      'bank', 'bank', 'news', 'x', 'y']
  # Summed per-pair counts give the corpus metric, on any subset of the pairs.
  suggested = ['cheap flights to rome', 'rome hotels near the station', 'a b c d e',
               'weather in rome today', 'flights']
  references = ['cheap flights to rome italy', 'rome hotels', 'a b c d e',
                'rome weather today in march', 'cheap flights']
  counts = user_habits.pair_counts(suggested, references)
  from mtn_jax.evaluation import metrics  # pylint: disable=g-import-not-at-top
  for rows in ([0, 1, 2, 3, 4], [0, 1, 3], [2, 3, 4]):
    expected = metrics.bleu([suggested[i] for i in rows], [references[i] for i in rows]).bleu
    assert expected > 0
    assert user_habits.corpus_bleu(counts[rows]) == pytest.approx(expected)
