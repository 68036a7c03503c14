"""The first suggestion chosen by its expected gain in corpus BLEU (`mtn_jax.bleu_gain`)."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest

from mtn_jax import bleu_gain
from mtn_jax import metrics
from mtn_jax import strategies
from mtn_jax.data import sessions


def hand_matches(a: str, b: str, n: int) -> int:
  grams = lambda w: collections.Counter(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
  ga, gb = grams(a.split()), grams(b.split())
  return sum(min(c, gb[g]) for g, c in ga.items())


def test_match_matrix_is_metrics_clipped_matches():
  texts = ['a a b', 'a b b a', 'b', '', 'a b a b a', 'c a b b a']
  got = bleu_gain.match_matrix(texts)
  for n in range(1, 5):
    for i, a in enumerate(texts):
      for j, b in enumerate(texts):
        assert got[n - 1, i, j] == hand_matches(a, b, n), (n, a, b)
  # By hand: 'a a b' against 'a b b a': unigrams a 2, b 1; bigram 'a b'; no trigram.
  assert got[:, 0, 1].tolist() == [3, 1, 0, 0]
  # Against the corpus metric: one pair's precisions times its n-grams are its matches.
  score = metrics.bleu(['a b b a'], ['c a b b a'])
  totals = bleu_gain.ngram_totals(['a b b a'])[0]
  np.testing.assert_allclose(np.array(score.precisions) / 100 * totals, got[:, 1, 5])


def make_split(tmp_path, sessions_texts, users, name='train') -> sessions.SessionSplit:
  texts = [q for s in sessions_texts for q in s]
  path = tmp_path / f'{name}.text.txt'
  path.write_text(''.join(t + '\n' for t in texts))
  starts = np.concatenate([[0], np.cumsum([len(s) for s in sessions_texts])]).astype(np.int64)
  return sessions.SessionSplit(name, np.zeros((len(texts), 10), np.int32), starts, str(path),
                               users=np.asarray(users, np.int64))


def test_popularity_leaves_the_users_own_queries_out(tmp_path):
  train = make_split(tmp_path, [['a', 'b'], ['a', 'b', 'c'], ['a', 'b'], ['a', 'c']],
                     users=[1, 1, 2, 2])
  popularity = bleu_gain.Popularity(train)
  # Everyone: 'b' issued 3 times, 3 times right after 'a', of 4 queries that followed 'a'.
  np.testing.assert_allclose(popularity.of('a', 'b'), [math.log1p(3), math.log1p(3), 3 / 4])
  # User 1 issued 'b' after 'a' twice: the others, once of twice.
  np.testing.assert_allclose(popularity.of('a', 'b', user=1),
                             [math.log1p(1), math.log1p(1), 1 / 2])
  # Nothing followed 'c' (share 0, not a division by zero); 'z' was never issued.
  np.testing.assert_allclose(popularity.of('c', 'z', user=2), [0, 0, 0])


def test_features_by_hand(tmp_path):
  popularity = bleu_gain.Popularity(make_split(tmp_path, [['x y', 'x y z']], users=[7]))
  session, generated = ['x y', 'x y z'], ['x y z w', 'x z']
  candidates = bleu_gain.candidates_of(session, generated)
  assert candidates == ['x y z w', 'x z', 'x y z', 'x y']
  f = {name: bleu_gain.features(session, generated, candidates, popularity)[:, i]
       for i, name in enumerate(bleu_gain.FEATURES)}
  assert f['session_distance_1'].tolist() == [0, 0, 1, 0]
  assert f['session_distance_2'].tolist() == [0, 0, 0, 1]
  assert f['generated'].tolist() == [1, 1, 0, 0]
  assert f['inverse_rank'].tolist() == [1, 0.5, 0, 0]
  assert f['novel_words'].tolist() == [1, 0, 0, 0]  # 'w'
  assert f['positions'].tolist() == [2] * 4
  assert f['length_4'].tolist() == [1, 0, 0, 0] and f['length_2'].tolist() == [0, 1, 0, 1]
  # The previous query 'x y z': 3 words with 'x y z w' and 2 with 'x z' (mean 2.5); 2
  # bigrams with the first; all its n-grams with itself; 2 words and 1 bigram with 'x y'.
  assert f['beam_mean_1'][2] == 2.5 and f['beam_first_2'][2] == 2
  assert [f[f'previous_{n}'][2] for n in (1, 2, 3, 4)] == [3, 2, 1, 0]
  assert [f[f'earlier_max_{n}'][2] for n in (1, 2, 3, 4)] == [2, 1, 0, 0]
  assert f['log_issued'][2] == pytest.approx(math.log1p(1))
  # 'x y z' followed 'x y' once: of a new user's 'x y', the whole share.
  assert f['followed_share'].tolist() == [0, 0, 0, 0]  # after the previous query, nothing


def test_gain_is_the_first_order_change_of_corpus_log_bleu():
  rng = np.random.default_rng(0)
  words = ['a', 'b', 'c']
  text = lambda longest=6: ' '.join(rng.choice(words, rng.integers(1, longest)))
  references = [text(7) for _ in range(2000)]
  chosen = [text() for _ in range(2000)]
  score = metrics.bleu(chosen, references)
  assert score.bp < 1  # the length term is exercised
  totals = bleu_gain.ngram_totals(chosen).sum(0)
  matches = np.array(score.precisions) / 100 * totals
  c, r = score.hyp_len, score.ref_len
  # log BP's derivative in the suggestions' length r / c^2 (where c < r), in units of
  # 1 / (4 T_1) with T_1 = c.
  weight = 4 * r / c if c < r else 0.0
  for _ in range(20):
    i, other = rng.integers(len(chosen)), text()
    changed = [*chosen[:i], other, *chosen[i + 1:]]
    exact = math.log(metrics.bleu(changed, references).bleu) - math.log(score.bleu)
    pair = [chosen[i], other]
    expected = np.array([[hand_matches(q, references[i], n) for n in (1, 2, 3, 4)]
                         for q in pair], np.float64)
    g = bleu_gain.gain(expected, bleu_gain.ngram_totals(pair), matches, totals, weight)
    assert g[1] - g[0] == pytest.approx(exact, rel=0.05, abs=2e-5)


def test_first_choices_takes_each_contexts_best_and_the_first_on_a_tie():
  utility = np.array([0.1, 0.3, 0.3, -1.0, 5.0, 2.0])
  context = np.array([0, 0, 0, 1, 2, 2])
  assert bleu_gain.first_choices(utility, context).tolist() == [1, 3, 4]


def test_fit_net_learns_the_mean_matches(monkeypatch):
  monkeypatch.setitem(bleu_gain.FIT, 'epochs', 30)
  monkeypatch.setitem(bleu_gain.FIT, 'batch', 256)
  rng = np.random.default_rng(0)
  group = rng.integers(0, 2, 4096)
  x = np.stack([np.ones(4096), group], 1).astype(np.float32)
  means = np.array([[1.0, 0.5, 0.2, 0.1], [3.0, 2.0, 1.0, 0.5]])
  y = rng.poisson(means[group]).astype(np.float32)
  net = bleu_gain.fit_net(x, y, seed=0)
  predicted = bleu_gain.predict(net, np.array([[1, 0], [1, 1]], np.float32))
  observed = np.array([y[group == k].mean(0) for k in (0, 1)])
  np.testing.assert_allclose(predicted, observed, atol=0.1)
  # The seed fixes the fit.
  again = bleu_gain.predict(bleu_gain.fit_net(x, y, seed=0), x[:8])
  np.testing.assert_array_equal(again, bleu_gain.predict(net, x[:8]))


def fitted_model(tmp_path) -> bleu_gain.GainModel:
  popularity = bleu_gain.Popularity(make_split(tmp_path, [['x y', 'x y z']], users=[7]))
  x = np.random.default_rng(0).normal(size=(64, len(bleu_gain.FEATURES))).astype(np.float32)
  net = bleu_gain.fit_net(x, np.abs(x[:, :4]), seed=0)
  return bleu_gain.GainModel(net, np.array([9.0, 5, 3, 1]), np.array([30.0, 20, 12, 6]), 1.5,
                             2e-5, popularity, {'previous_query': 1.0})


def test_cache_round_trip_and_invalidation(tmp_path):
  model = fitted_model(tmp_path)
  path = str(tmp_path / 'gain' / 'model.json')
  header = {'suggestions': 'abc', 'seed': 0}
  bleu_gain._write(path, header, model)
  loaded = bleu_gain._read(path, header, model.popularity)
  session, generated = ['x y', 'x y z'], ['x y z w', 'x z']
  candidates = bleu_gain.candidates_of(session, generated)
  np.testing.assert_array_equal(loaded.gains_after(session, generated, candidates),
                                model.gains_after(session, generated, candidates))
  assert loaded.length_weight == 1.5 and loaded.previous_margin == 2e-5
  assert loaded.figures == model.figures
  # Another header (other suggestions, another seed): not this model.
  assert bleu_gain._read(path, {'suggestions': 'abd', 'seed': 0}, model.popularity) is None
  assert bleu_gain._read(str(tmp_path / 'none.json'), header, model.popularity) is None


def test_rerank_puts_the_best_gain_first_and_keeps_the_rankers_order(tmp_path):
  model = fitted_model(tmp_path)
  session = ['cheap flights', 'cheap flights paris']
  beam = [['cheap hotels'], ['cheap flights paris hotel', 'paris hotel', 'cheap flights paris']]
  scores = {'cheap hotels': 0.5, 'cheap flights': 0.2, 'cheap flights paris hotel': 2.0,
            'paris hotel': 2.1, 'cheap flights paris': 1.0}
  rankers = strategies.Rankers(ranker=None, retriever=None, retriever_workdir='', retrieved=0,
                               proposed=0, gain=model)
  rankers.score_lists = lambda sessions_, lists, batch_rows: [
      [np.asarray([scores[q] for q in texts], np.float32) for texts in session_lists]
      for session_lists in lists]
  out = rankers.rerank([session], [[beam]], batch_rows=1)[0]
  for t, ranked in enumerate(out):
    texts = [c['query'] for c in ranked]
    gains = model.gains_after(session[:t + 1], beam[t], texts)
    assert [c['gain'] for c in ranked] == pytest.approx(gains.tolist())
    assert ranked[0]['gain'] == max(gains)
    rest = [c['score'] for c in ranked[1:]]
    assert rest == sorted(rest, reverse=True)
  rankers.gain = None
  plain = rankers.rerank([session], [[beam]], batch_rows=1)[0]
  for ranked, without in zip(out, plain):
    assert {c['query'] for c in ranked} == {c['query'] for c in without}


def test_config_refuses_gain_from_outside_rerank():
  from configs import aol  # pylint: disable=g-import-not-at-top
  from mtn_jax import config_lib  # pylint: disable=g-import-not-at-top
  config = aol.get_config('small')
  config.data.raw_files = 'log.tsv'
  config.suggest.gain_from = 'a,b'
  with pytest.raises(config_lib.ConfigError,
                     match="config.suggest.gain_from is read by 'rerank' only"):
    config_lib.validate(config, 'eval')
  config.suggest.strategy, config.suggest.ranker_workdir = 'rerank', 'ranker'
  config_lib.validate(config, 'eval')
