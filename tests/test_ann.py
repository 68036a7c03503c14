"""The usearch index of a Bi-encoder's candidate vectors (`config.suggest.index='usearch'`):
its top-k against the exact top-k, its round trip through the candidate-cache folder and
its rebuild when the cache key changes, the Retriever's suggestions through it against the
exact ones, and the refusals (a Poly-encoder, a bad config value)."""

from __future__ import annotations

import types

import jax
import numpy as np
import pytest

from configs import demo
from configs import families
from mtn_jax import config_lib
from mtn_jax import errors
from mtn_jax.data import candidate_pool
from mtn_jax.data.vocab import SEP_ID
from mtn_jax.inference import retrieval
from tests.test_polyencoder import dual_task
from tests.test_polyencoder import N
from tests.test_polyencoder import sessions

KEY = {'step': 5, 'pool': 'abc', 'model': 'def'}


def random_vectors(count, dim, seed):
  return np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)


def exact_top_k(vectors, queries, k):
  scores = queries @ vectors.T
  ids = np.argsort(-scores, axis=1, kind='stable')[:, :k]
  return ids, np.take_along_axis(scores, ids, 1)


def recording_log():
  lines = []
  return lines, lambda *args, **kwargs: lines.append(args[0])


def test_usearch_top_k_equals_the_exact_top_k(tmp_path):
  vectors = random_vectors(2000, 32, seed=0)
  queries = random_vectors(300, 32, seed=1)
  index = retrieval.usearch_index(vectors, KEY, str(tmp_path), log=lambda *a, **k: None)
  expected_ids, expected_scores = exact_top_k(vectors, queries, 10)
  recall = lambda ids: np.mean([len(set(a) & set(b)) / 10 for a, b in zip(
      ids.tolist(), expected_ids.tolist())])
  # HNSW over inner products is approximate whatever the search list (measured: 0.995 to
  # 0.998 of this top-10 at 64 to 512): a tiny shortfall is allowed.
  for expansion in (retrieval.USEARCH_EXPANSION_SEARCH, 512):
    ids, scores = retrieval.search_index(index, vectors, queries, 10, expansion=expansion)
    assert recall(ids) >= 0.99, (expansion, recall(ids))
    assert index.expansion_search == expansion
  assert ids.shape == scores.shape == (300, 10) and ids.dtype == np.int64
  # Where the index found the exact top 10, it gives them in the exact order, with the exact
  # scores (rescored from the vectors, whatever order the graph walk found them in).
  found_all = np.array([set(a) == set(b) for a, b in zip(ids.tolist(),
                                                         expected_ids.tolist())])
  assert found_all.mean() >= 0.9, found_all.mean()
  np.testing.assert_array_equal(ids[found_all], expected_ids[found_all])
  np.testing.assert_allclose(scores[found_all], expected_scores[found_all], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(scores, np.einsum('nd,nkd->nk', queries, vectors[ids]),
                             rtol=1e-5, atol=1e-5)
  assert (np.diff(scores, axis=1) <= 0).all()
  # One query alone (usearch answers it in another shape), and k past the pool.
  one_ids, _ = retrieval.search_index(index, vectors, queries[:1], 10, expansion=512)
  np.testing.assert_array_equal(one_ids, ids[:1])
  small = vectors[:5]
  small_index = retrieval.usearch_index(small, KEY, str(tmp_path / 'small'),
                                      log=lambda *a, **k: None)
  all_ids, all_scores = retrieval.search_index(small_index, small, queries[:3], 7)
  assert (all_ids[:, 5:] == -1).all() and np.isneginf(all_scores[:, 5:]).all()
  assert sorted(all_ids[0, :5].tolist()) == list(range(5))
  # One query past the pool: the entries it did not find are -1 and -inf too, not pool
  # entries padded in.
  one_ids, one_scores = retrieval.search_index(small_index, small, queries[:1], 7)
  np.testing.assert_array_equal(one_ids, all_ids[:1])
  np.testing.assert_array_equal(one_scores, all_scores[:1])
  # A k past half the search list widens the list to 2k (the docstring's max(expansion, 2k)).
  retrieval.search_index(index, vectors, queries[:2], 300)
  assert index.expansion_search == 600


def test_the_graph_is_built_and_searched_wider_than_usearchs_defaults(tmp_path):
  # Inner products are a hard metric for the graph: at usearch's own defaults it misses much
  # of a Bi-encoder's true top 10, so the index is built denser and searched wider.
  from usearch.index import Index  # pylint: disable=g-import-not-at-top
  defaults = Index(ndim=4, metric='ip', dtype='f32')
  index = retrieval.usearch_index(random_vectors(50, 4, seed=0), KEY, str(tmp_path),
                                  log=lambda *a, **k: None)
  assert index.connectivity > defaults.connectivity
  retrieval.search_index(index, random_vectors(50, 4, seed=0), random_vectors(2, 4, seed=1), 5)
  assert index.expansion_search > defaults.expansion_search


def test_a_direction_all_candidates_share_costs_no_recall(tmp_path):
  # Trained vectors often share a direction; the index is built on them less their mean,
  # which moves every score of a query alike (plain inner products miss much of the top 10
  # here: a shift of 1 was too small to tell them apart).
  vectors = random_vectors(500, 16, seed=5) + 3
  queries = random_vectors(50, 16, seed=6)
  index = retrieval.usearch_index(vectors, KEY, str(tmp_path), log=lambda *a, **k: None)
  ids, scores = retrieval.search_index(index, vectors, queries, 10)
  expected_ids, expected_scores = exact_top_k(vectors, queries, 10)
  assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(),
                                                             expected_ids.tolist())]) >= 0.99
  same = (ids == expected_ids).all(1)
  assert same.mean() >= 0.9
  np.testing.assert_allclose(scores[same], expected_scores[same], rtol=1e-5, atol=1e-5)


def test_usearch_index_round_trip_and_rebuild_on_a_new_key(tmp_path):
  vectors = random_vectors(500, 16, seed=2)
  queries = random_vectors(20, 16, seed=3)
  lines, log = recording_log()
  first = retrieval.usearch_index(vectors, KEY, str(tmp_path), log=log)
  assert len(lines) == 1  # built and written
  assert sorted(p.name for p in tmp_path.iterdir()) == ['usearch.index', 'usearch.json']
  assert not (tmp_path / 'usearch.index').read_bytes().startswith(b'\x80')  # no pickle
  again = retrieval.usearch_index(vectors, KEY, str(tmp_path), log=log)
  assert len(lines) == 1  # read back, not rebuilt
  for a, b in zip(retrieval.search_index(first, vectors, queries, 10),
                  retrieval.search_index(again, vectors, queries, 10)):
    np.testing.assert_array_equal(a, b)
  # A new checkpoint (the candidate cache's key): rebuilt from the new vectors.
  moved = random_vectors(500, 16, seed=4)
  rebuilt = retrieval.usearch_index(moved, {**KEY, 'step': 6}, str(tmp_path), log=log)
  assert len(lines) == 2
  # It is the index of the new vectors (the old one finds 2% of their top 10; usearch
  # builds on several threads, so its recall varies a little from build to build).
  ids, _ = retrieval.search_index(rebuilt, moved, queries, 10)
  expected = exact_top_k(moved, queries, 10)[0]
  assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids.tolist(),
                                                             expected.tolist())]) >= 0.9
  retrieval.usearch_index(moved, {**KEY, 'step': 6}, str(tmp_path), log=log)
  assert len(lines) == 2
  # Vectors of another shape under the same key (a pool that changed) rebuild too.
  retrieval.usearch_index(moved[:400], {**KEY, 'step': 6}, str(tmp_path), log=log)
  assert len(lines) == 3
  # A damaged file under the right key is rebuilt, not trusted.
  (tmp_path / 'usearch.index').write_bytes(b'damaged')
  retrieval.usearch_index(moved[:400], {**KEY, 'step': 6}, str(tmp_path), log=log)
  assert len(lines) == 4
  assert sorted(p.name for p in tmp_path.iterdir()) == ['usearch.index', 'usearch.json']


def bi_encoder_pool(count, seed=0):
  """A pool of `count` distinct token rows with texts 'q0', 'q1', ..."""
  rng = np.random.default_rng(seed)
  rows = np.unique(rng.integers(SEP_ID + 1, 30, size=(3 * count, N)), axis=0)[:count]
  rows = rows[rng.permutation(len(rows))].astype(np.int32)
  return candidate_pool.CandidatePool(queries=rows, counts=np.ones(len(rows), np.int64),
                                  texts=[f'q{i}' for i in range(len(rows))])


@pytest.mark.parametrize('context_encoder,scaled', [('flat', False), ('mtn', False),
                                                    ('flat', True)])
def test_bi_encoder_pool_scores_are_inner_products_of_its_context_vectors(context_encoder,
                                                                          scaled):
  # What the index relies on: score_pool after every query = bi_contexts . y_cand (with
  # scaled_scores too: the context vector carries the 1/sqrt(d)).
  task, params = dual_task('biencoder', context_encoder, scaled_scores=scaled)
  queries = sessions()
  cache = task.encode_candidates(params, queries.reshape(-1, N))
  vectors = np.asarray(retrieval.bi_contexts(params, {'queries': queries}, task=task))
  padded = np.concatenate([queries, np.zeros_like(queries[:, :1])], axis=1)
  np.testing.assert_allclose(np.einsum('bsd,cd->bsc', vectors, np.asarray(cache)),
                             task.score_pool(params, {'queries': padded}, cache),
                             rtol=1e-5, atol=1e-5)


def test_retriever_suggests_through_the_index_what_exact_scoring_does(tmp_path, monkeypatch):
  task, params = dual_task('biencoder')
  pool = bi_encoder_pool(400)
  monkeypatch.setattr(retrieval.candidate_pool, 'load_pool', lambda data_dir: pool)
  trained = types.SimpleNamespace(task=task, params=params, cfg=task.cfg, step=5)
  lines, log = recording_log()
  exact = retrieval.Retriever(trained, str(tmp_path), log=log)
  assert exact.index is None and len(lines) == 1  # the candidate cache alone
  approximate = retrieval.Retriever(trained, str(tmp_path), log=log, index='usearch')
  assert len(lines) == 2 and (tmp_path / 'candidate_cache' / 'usearch.index').exists()
  batch = {'queries': sessions()}
  texts = [['x', 'y', 'z'], ['x', 'y'], ['x', 'y', 'z']]  # row 3 is padding
  want = exact.suggestions(batch, 8, texts, exclude_session_queries=False)
  got = approximate.suggestions(batch, 8, texts, exclude_session_queries=False)
  for want_row, got_row in zip(want, got):
    for want_at, got_at in zip(want_row, got_row):
      assert [s['query'] for s in got_at] == [s['query'] for s in want_at]
      np.testing.assert_allclose([s['score'] for s in got_at],
                                 [s['score'] for s in want_at], rtol=1e-5, atol=1e-5)
  # Entries the search did not find (-1, -inf: fewer than asked for) are never suggested.
  search_index = retrieval.search_index

  def found_two(*args, **kwargs):
    ids, scores = search_index(*args, **kwargs)
    ids[:, 2:], scores[:, 2:] = -1, -np.inf
    return ids, scores

  monkeypatch.setattr(retrieval, 'search_index', found_two)
  got = approximate.suggestions(batch, 8, texts, exclude_session_queries=False)
  assert [[[s['query'] for s in at] for at in row] for row in got] == [
      [[s['query'] for s in at[:2]] for at in row] for row in want]
  monkeypatch.setattr(retrieval, 'search_index', search_index)
  # The same checkpoint again reads the index; a new checkpoint rebuilds it.
  retrieval.Retriever(trained, str(tmp_path), log=log, index='usearch')
  assert len(lines) == 2
  later = types.SimpleNamespace(task=task, params=jax.tree.map(lambda x: x + 1, params),
                                cfg=task.cfg, step=6)
  retrieval.Retriever(later, str(tmp_path), log=log, index='usearch')
  assert len(lines) == 4  # the candidate cache and the index, both anew


def test_retriever_leaves_out_the_session_so_far_and_still_gives_k(tmp_path, monkeypatch):
  """With `exclude_session_queries`, each position's list is the ranking with the session's
  queries up to that position dropped, still `k` long: the ranker is asked for as many more
  entries as the longest session holds."""
  task, params = dual_task('biencoder')
  pool = bi_encoder_pool(400)
  monkeypatch.setattr(retrieval.candidate_pool, 'load_pool', lambda data_dir: pool)
  trained = types.SimpleNamespace(task=task, params=params, cfg=task.cfg, step=5)
  retriever = retrieval.Retriever(trained, str(tmp_path), log=lambda *a, **k: None)
  batch = {'queries': sessions()}
  k, lengths = 4, (3, 2, 3)  # row 3 is padding
  whole = retriever.suggestions(batch, k + 3, [['x'] * n for n in lengths],
                                exclude_session_queries=False)
  # Each session has typed the best entry at each of its positions: the lists must skip it.
  typed = [[at[0]['query'] for at in row] for row in whole]
  kept = retriever.suggestions(batch, k, typed, exclude_session_queries=True)
  for row, session in enumerate(typed):
    assert [len(at) for at in kept[row]] == [k] * len(session)
    for t, at in enumerate(kept[row]):
      assert at == [s for s in whole[row][t] if s['query'] not in session[:t + 1]][:k]


def test_usearch_is_refused_for_a_poly_encoder(tmp_path):
  task, params = dual_task('polyencoder')
  trained = types.SimpleNamespace(task=task, params=params, cfg=task.cfg, step=5)
  with pytest.raises(errors.Error, match=r"index='usearch'.*'polyencoder'") as caught:
    retrieval.Retriever(trained, str(tmp_path), index='usearch')
  assert '\n' not in str(caught.value)
  with pytest.raises(errors.Error, match='config.suggest.index'):
    retrieval.check_index('faiss', trained, str(tmp_path))


def test_config_validation_of_the_index():
  config = demo.get_config()
  config.decode.input = 'sessions.tsv'
  config_lib.validate(config, 'decode')  # 'exact' by default
  config.suggest.index = 'hnsw'
  with pytest.raises(config_lib.ConfigError, match=r"config\.suggest\.index.*'hnsw'"):
    config_lib.validate(config, 'decode')
  config.suggest.index = 'usearch'
  config = families.use(config, 'polyencoder')
  config.train.label_smoothing = 0.0  # a ranker's loss reads none
  with pytest.raises(config_lib.ConfigError, match=r"config\.suggest\.index.*'polyencoder'"):
    config_lib.validate(config, 'decode')
  config.model.name = 'biencoder'
  config_lib.validate(config, 'decode')
