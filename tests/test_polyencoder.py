"""Bi-, Poly- and Cross-encoders: the scores against their definitions, the Poly-encoder's
reduction to the Bi-encoder, the in-batch and sampled losses computed by hand, the pool
scoring against explicit candidates, the candidate cache and the graded losses. Training
through the real command line is in test_polyencoder_cli.py."""

from __future__ import annotations

import collections
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtn_jax import tasks
from mtn_jax.data import candidate_pool
from mtn_jax.data import sessions as session_data
from mtn_jax.data.vocab import SEP_ID
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.inference import retrieval
from mtn_jax.models import layers
from mtn_jax.models import polyencoder
from mtn_jax.models.base import session_sources
from mtn_jax.tasks import rankers
from mtn_jax.training import checkpoints

from tests.test_models import random_like

N = 4  # tokens per query


def ranker_config(name, **changes):
  fields = dict(name=name, vocab_size=30, max_query_words=N, max_session_queries=6, emb_dim=8,
                dropout=0.0, share_embeddings=False, tie_embeddings=False,
                compute_dtype='float32', d_model=8, num_heads=2, ff_dim=16, query_layers=1,
                decoder_layers=1, pre_norm=False, learned_positions=False, scan_layers=True,
                remat='none', session_layers=1, num_levels=2, poly_codes=3)
  return polyencoder.RankerConfig(**{**fields, **changes})


def sessions(seed=0, batch=4, length=3):
  """int32 [batch, length, N] with padding words, a padding query and a repeated query."""
  rng = np.random.default_rng(seed)
  queries = rng.integers(SEP_ID + 1, 30, size=(batch, length, N)).astype(np.int32)
  queries[..., -1] = 0
  queries[1, -1] = 0  # a padding query: position 1 of session 1 is no context
  queries[2, 1] = queries[0, 1]  # the same next query after two contexts
  return queries


def compiled(fn, *args):
  """`fn(*args)` as one compiled program. Run eagerly, a Flax model dispatches each of its
  operations alone and compiles each the first time it meets its shapes: on a 2-core CPU that
  made this file take 215 s instead of 142 (compilation cache empty)."""
  return jax.jit(fn)(*args)


def apply(model, params, *args, method):
  """`model.apply` with `params` as one compiled program."""
  return compiled(lambda p, *a: model.apply({'params': p}, *a, method=method), params, *args)


def init(task):
  """A random draw of the task's parameter shapes, for the tests of definitions (any
  parameters will do): no initialiser to compile, a model's takes seconds."""
  return random_like(jax.eval_shape(task.init_params, jax.random.PRNGKey(0)))


def initialised(task):
  """The task's own initial parameters, for the graded losses' tests, whose margins are
  sized for them."""
  return compiled(task.init_params, jax.random.PRNGKey(0))


def dual_task(name, context_encoder='flat', **changes):
  task = rankers.DualEncoderTask(ranker_config(name, context_encoder=context_encoder,
                                                     **changes))
  return task, init(task)


@pytest.mark.parametrize('context_encoder', ['flat', 'mtn'])
def test_bi_encoder_score_is_the_dot_product_of_mean_token_vectors(context_encoder):
  task, params = dual_task('biencoder', context_encoder)
  queries = sessions()
  memory = apply(task.model, params, queries[:, :-1], method=lambda m, q: m.context_encoder(q))
  mask = np.asarray(memory['mask'])[..., None]
  context = (np.asarray(memory['tokens']) * mask).sum(1) / np.maximum(mask.sum(1), 1)
  context = context.reshape(4, 2, -1)
  pool = queries.reshape(-1, N)
  cand = apply(task.model, params, pool[:, None], method=lambda m, ids: m.candidate_encoder(ids))
  cmask = np.asarray(cand['mask'])[..., None]
  vectors = (np.asarray(cand['tokens']) * cmask).sum(1) / np.maximum(cmask.sum(1), 1)
  expected = np.einsum('bpd,cd->bpc', context, vectors)
  cache = compiled(task.encode_candidates, params, jnp.asarray(pool))
  np.testing.assert_allclose(cache, vectors, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(compiled(task.score_pool, params, {'queries': queries}, cache),
                             expected, rtol=1e-5, atol=1e-5)


def test_poly_encoder_with_one_zero_code_is_the_bi_encoder():
  # A code of zeros attends uniformly over the context's tokens (its mean), and one code
  # leaves the candidate nothing to choose between: the Bi-encoder's score, exactly.
  bi, bi_params = dual_task('biencoder')
  poly, poly_params = dual_task('polyencoder', poly_codes=1)
  assert set(poly_params) == set(bi_params) | {'codes'}
  params = {**bi_params, 'codes': jnp.zeros_like(poly_params['codes'])}
  queries = sessions()
  pool = jnp.asarray(queries.reshape(-1, N))
  score_pool = lambda task, p: task.score_pool(p, {'queries': queries},
                                               task.encode_candidates(p, pool))
  np.testing.assert_allclose(compiled(lambda p: score_pool(poly, p), params),
                             compiled(lambda p: score_pool(bi, p), bi_params),
                             rtol=1e-6, atol=1e-6)


def test_poly_score_is_the_candidate_weighted_readout_of_the_codes():
  rng = np.random.default_rng(3)
  contexts = rng.normal(size=(2, 5, 8)).astype(np.float32)  # [B, m, d]
  cands = rng.normal(size=(2, 7, 8)).astype(np.float32)  # [B, C, d]
  scores = np.asarray(polyencoder.dual_scores(contexts, cands, poly=True))
  for b in range(2):
    for c in range(7):
      logits = contexts[b] @ cands[b, c] / np.sqrt(8)
      w = np.exp(logits - logits.max())
      w /= w.sum()
      np.testing.assert_allclose(scores[b, c], (w @ contexts[b]) @ cands[b, c], rtol=1e-5)


def test_poly_codes_attend_over_the_real_tokens_scaled_by_sqrt_d():
  """y_ctx^i = sum_j softmax_j(c_i . h_j / sqrt(d)) h_j over the context's real tokens (the
  module docstring's choice against the saturation the paper met): the codes' attention
  written out in numpy. Codes of norm ~3 sqrt(d) make it peaked, so an unscaled or an
  unmasked softmax is far off."""
  task, params = dual_task('polyencoder')
  d = task.cfg.d_model
  codes = 3.0 * np.random.default_rng(4).normal(size=(3, d)).astype(np.float32)
  params = {**params, 'codes': jnp.asarray(codes)}
  queries = sessions()
  memory = apply(task.model, params, queries[:, :-1], method=lambda m, q: m.context_encoder(q))
  tokens, mask = np.asarray(memory['tokens']), np.asarray(memory['mask'])  # [B*P, N, d]
  assert (~mask).any() and mask.any(-1).all()  # padding words to leave out, no empty row
  expected = np.zeros((len(tokens), 3, d), np.float32)
  for r in range(len(tokens)):
    real = tokens[r][mask[r]]  # [n_r, d]
    logits = codes @ real.T / np.sqrt(d)  # [m, n_r]
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected[r] = (weights / weights.sum(-1, keepdims=True)) @ real
  np.testing.assert_allclose(compiled(task.contexts, params, queries),
                             expected.reshape(4, 2, 3, d), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('name', ['biencoder', 'polyencoder'])
def test_pool_scores_equal_explicit_candidate_scores_in_any_chunking(name, monkeypatch):
  task, params = dual_task(name, 'mtn')
  queries = sessions()
  pool = jnp.asarray(sessions(seed=5, batch=7).reshape(-1, N))  # 21 candidates
  explicit = compiled(task.score_candidates, params, {'queries': queries},
                      jnp.broadcast_to(pool, (4, 2) + pool.shape))
  # Blocks of 2 candidates (11 of them, the last padded) for the Poly-encoder's scores.
  monkeypatch.setattr(rankers, 'SCORE_BLOCK', 2 * 8 * 3)
  monkeypatch.setattr(rankers, 'ENCODE_CHUNK', 4)
  np.testing.assert_allclose(
      compiled(lambda p: task.score_pool(p, {'queries': queries},
                                         task.encode_candidates(p, pool)), params),
      explicit, rtol=1e-5, atol=1e-5)


def in_batch_loss_by_hand(contexts, targets, ids, poly, drawn=(), drawn_vectors=(),
                          scale=1.0):
  """The in-batch cross-entropy of every real context, written out pair by pair; `drawn`
  pool entries (with their vectors) are negatives of every context they are not the true
  next query of; every score is multiplied by `scale`."""
  score = lambda i, vector: scale * float(polyencoder.dual_scores(contexts[i], vector[None],
                                                                  poly=poly)[0])
  total, correct, count = 0.0, 0, 0
  for i in range(len(ids)):
    if not ids[i].any():
      continue
    count += 1
    logits = [score(i, targets[i])]
    for j in range(len(ids)):
      if j != i and ids[j].any() and not (ids[j] == ids[i]).all():
        logits.append(score(i, targets[j]))
    for entry, vector in zip(drawn, drawn_vectors):
      if not (entry == ids[i]).all():
        logits.append(score(i, vector))
    logits = np.array(logits)
    total += np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[0]
    correct += logits[0] >= logits.max()
  return total, correct, count


@pytest.mark.parametrize('name', ['biencoder', 'polyencoder'])
@pytest.mark.parametrize('groups', [1, 2])
def test_in_batch_loss_equals_a_hand_computation(name, groups):
  task, params = dual_task(name)
  queries = sessions()
  sums = compiled(lambda p: task.loss_sums(p, {'queries': queries}, train=False,
                                           groups=groups), params)
  contexts = np.asarray(compiled(task.contexts, params, queries))  # [B, P, m, d]
  targets = np.asarray(apply(task.model, params, queries[:, 1:], method='candidates'))
  total = correct = count = 0
  # Each group's negatives are its own sessions' next queries.
  for g in range(groups):
    rows = slice(g * 4 // groups, (g + 1) * 4 // groups)
    t, c, n = in_batch_loss_by_hand(contexts[rows].reshape(-1, *contexts.shape[2:]),
                                    targets[rows].reshape(-1, targets.shape[-1]),
                                    queries[rows, 1:].reshape(-1, N), task.poly)
    total, correct, count = total + t, correct + c, count + n
  assert count == 7 and float(sums['tokens']) == float(sums['pairs']) == count
  np.testing.assert_allclose(float(sums['loss']), total, rtol=1e-5)
  assert float(sums['correct']) == correct


@pytest.mark.parametrize('name', ['biencoder', 'polyencoder'])
def test_scaled_scores_divide_every_score_by_sqrt_d_and_the_loss_reads_them(name):
  """`scaled_scores`: the same parameters give every candidate 1/sqrt(d) of its plain score,
  in the pool and given by its words (so no ranking moves), and the loss is the softmax
  cross-entropy of the scaled scores."""
  plain, params = dual_task(name)
  scaled = rankers.DualEncoderTask(ranker_config(name, scaled_scores=True))
  assert jax.tree.map(jnp.shape, init(scaled)) == jax.tree.map(jnp.shape, params)
  queries = sessions()
  pool = jnp.asarray(sessions(seed=5, batch=7).reshape(-1, N))
  d = plain.cfg.d_model
  for method in ('score_pool', 'score_candidates'):
    if method == 'score_pool':
      scores = lambda task: compiled(lambda p: task.score_pool(
          p, {'queries': queries}, task.encode_candidates(p, pool)), params)
    else:
      scores = lambda task: compiled(task.score_candidates, params, {'queries': queries},
                                     jnp.broadcast_to(pool, (4, 2) + pool.shape))
    np.testing.assert_allclose(scores(scaled), np.asarray(scores(plain)) / np.sqrt(d),
                               rtol=1e-5, atol=1e-6)
  sums = {task: compiled(lambda p, task=task: task.loss_sums(p, {'queries': queries},
                                                             train=False), params)
          for task in (plain, scaled)}
  contexts = np.asarray(compiled(scaled.contexts, params, queries))
  targets = np.asarray(apply(scaled.model, params, queries[:, 1:], method='candidates'))
  total, _, count = in_batch_loss_by_hand(
      contexts.reshape(-1, *contexts.shape[2:]), targets.reshape(-1, targets.shape[-1]),
      queries[:, 1:].reshape(-1, N), scaled.poly, scale=d**-0.5)
  assert count == 7
  np.testing.assert_allclose(float(sums[scaled]['loss']), total, rtol=1e-5)
  assert abs(float(sums[plain]['loss']) - total) > 1e-3


@pytest.mark.parametrize('name', ['biencoder', 'polyencoder'])
def test_pool_negatives_join_every_contexts_negatives_except_its_true_query(name):
  queries = sessions()
  # The pool: the true next query of context 0 (masked for it), and other queries.
  pool = np.concatenate([queries[0, 1:2], sessions(seed=5).reshape(-1, N)[:7]])
  task = rankers.DualEncoderTask(
      ranker_config(name, context_encoder='flat', pool_negatives=6), pool_queries=pool)
  params = init(task)
  sums = compiled(lambda p: task.loss_sums(p, {'queries': queries}, train=False), params)
  # Evaluation draws with the fixed key 0, uniformly over the pool.
  drawn = pool[np.asarray(jax.random.randint(jax.random.PRNGKey(0), (6,), 0, len(pool)))]
  contexts = np.asarray(compiled(task.contexts, params, queries))
  vectors = lambda ids: np.asarray(apply(task.model, params, ids, method='candidates'))
  total, correct, count = in_batch_loss_by_hand(
      contexts.reshape(-1, *contexts.shape[2:]), vectors(queries[:, 1:]).reshape(-1, 8),
      queries[:, 1:].reshape(-1, N), task.poly, drawn, vectors(drawn))
  assert count == 7
  np.testing.assert_allclose(float(sums['loss']), total, rtol=1e-5)
  assert float(sums['correct']) == correct
  # Without pool negatives the loss is the in-batch one alone, and lower.
  plain_task = rankers.DualEncoderTask(ranker_config(name, context_encoder='flat'))
  plain = compiled(lambda p: plain_task.loss_sums(p, {'queries': queries}, train=False), params)
  assert float(plain['loss']) < float(sums['loss'])
  if name == 'polyencoder':
    return  # the training path below is the same code for both
  # Training draws from the step's key, in a stream of its own (folded with 1) that leaves
  # the dropout masks as they are without pool negatives; dropout is 0 here, so the loss is
  # the hand computation's with those draws. Finite and differentiable.
  key = jax.random.PRNGKey(3)
  loss, grads = compiled(jax.value_and_grad(lambda p: task.loss_sums(
      p, {'queries': queries}, train=True, rngs={'dropout': key})['loss']), params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  drawn = pool[np.asarray(jax.random.randint(jax.random.fold_in(key, 1), (6,), 0, len(pool)))]
  total, _, _ = in_batch_loss_by_hand(
      contexts.reshape(-1, *contexts.shape[2:]), vectors(queries[:, 1:]).reshape(-1, 8),
      queries[:, 1:].reshape(-1, N), task.poly, drawn, vectors(drawn))
  np.testing.assert_allclose(float(loss), total, rtol=1e-5)


def test_cross_encoder_scores_the_joint_sequence_and_its_loss_masks_the_true_query():
  cfg = ranker_config('crossencoder', cross_negatives=6)
  queries = sessions()
  pool = np.concatenate([queries[0, 1:2], sessions(seed=9).reshape(-1, N)[:5]])
  task = rankers.CrossEncoderTask(cfg, pool_queries=pool)
  params = init(task)
  # The joint input of a context and a candidate: the session's words, <sep>, the candidate,
  # numbered as one compacted sequence.
  sources, _ = session_sources(jnp.asarray(queries[:1, :2]))  # [2, L]
  # Candidates q_1 and q_2 after each of the two positions: [2, 2, n].
  tokens, positions = polyencoder.cross_inputs(
      sources, jnp.broadcast_to(jnp.asarray(queries[0, 1:3]), (2, 2, N)))
  row = np.asarray(tokens)[0]  # position 0, candidate 0: q_0, <sep>, q_1
  real = row[row != 0]
  q0, q1 = queries[0, 0][queries[0, 0] > 0], queries[0, 1][queries[0, 1] > 0]
  np.testing.assert_array_equal(real, np.concatenate([q0, [SEP_ID], q1]))
  separator = sources.shape[-1]
  assert row[separator] == SEP_ID and positions[0, separator] == len(q0)
  np.testing.assert_array_equal(positions[0][row != 0], np.arange(len(real)))
  # Scoring after the last query alone equals that position of the whole session's scores.
  session = jnp.asarray(queries[:, :2])
  cands = jnp.asarray(queries[:, 1:3])  # [B, 2, n]
  whole = compiled(task.score_candidates, params, {'queries': queries[:, :3]},
                   jnp.broadcast_to(cands[:, None], (4, 2, 2, N)))
  np.testing.assert_allclose(apply(task.model, params, session, cands, method='score_last'),
                             whole[:, 1], rtol=1e-5, atol=1e-5)
  # The loss: the true next query against the drawn entries, those equal to it masked.
  key = jax.random.PRNGKey(7)
  sums = compiled(lambda p: task.loss_sums(p, {'queries': queries}, train=True,
                                           rngs={'dropout': key}), params)
  sample_key, _ = jax.random.split(key)
  drawn = np.asarray(jax.random.randint(sample_key, (4, 2, 6), 0, len(pool)))
  scores = np.asarray(compiled(task.score_candidates, params, {'queries': queries},
                               jnp.concatenate([queries[:, 1:, None], pool[drawn]], axis=2)))
  total = 0.0
  for b in range(4):
    for p in range(2):
      if not queries[b, p + 1].any():
        continue
      keep = [0] + [1 + k for k in range(6)
                    if not (pool[drawn[b, p, k]] == queries[b, p + 1]).all()]
      logits = scores[b, p, keep]
      total += np.log(np.exp(logits - logits.max()).sum()) + logits.max() - logits[0]
  assert (pool[drawn] == queries[:, 1:, None]).all(-1).any()  # the masking is exercised
  np.testing.assert_allclose(float(sums['loss']), total, rtol=1e-5)


def test_cross_encoder_score_is_a_linear_map_of_the_sep_output():
  """s = w . h_sep + b (module docstring): the joint encoder's output at the `<sep>` before
  the candidate (column L of `cross_inputs`), the position that reads the pair, not the
  first word of the context."""
  task = rankers.CrossEncoderTask(ranker_config('crossencoder'), pool_queries=sessions()[0])
  params = init(task)
  sources, _ = session_sources(jnp.asarray(sessions()[:, :2]))  # [8, L]
  cands = jnp.asarray(sessions(seed=3, batch=8))  # [8, 3, n]: 3 candidates per context

  def outputs(module, sources, cands):
    tokens, positions = polyencoder.cross_inputs(sources, cands)
    x = module.embedding(tokens) + module.positions(positions)
    return module.encoder(x, layers.padding_mask(tokens != 0), train=False)

  hidden = np.asarray(apply(task.model, params, sources, cands, method=outputs))
  score = params['score']
  expected = (hidden[:, sources.shape[-1]] @ np.asarray(score['kernel'])[:, 0]
              + float(score['bias'][0])).reshape(8, 3)
  np.testing.assert_allclose(apply(task.model, params, sources, cands, method='score_pairs'),
                             expected, rtol=1e-5, atol=1e-5)


def test_cross_encoder_scores_ignore_padding_in_the_context_and_the_candidate():
  """Padding (id 0) is masked out of the joint sequence's attention: more of it after the
  context (a longer session batch's L) or after the candidate's words changes no score,
  so a context scores the same in any batch it is served in."""
  task = rankers.CrossEncoderTask(ranker_config('crossencoder'), pool_queries=sessions()[0])
  params = init(task)
  sources, _ = session_sources(jnp.asarray(sessions()[:, :2]))  # [8, L]
  cands = jnp.asarray(sessions(seed=3, batch=8))  # [8, 3, n]: 3 candidates per context
  score = lambda s, c: apply(task.model, params, s, c, method='score_pairs')
  plain = np.asarray(score(sources, cands))
  padded = score(jnp.pad(sources, ((0, 0), (0, 6))), jnp.pad(cands, ((0, 0), (0, 0), (0, 2))))
  np.testing.assert_allclose(padded, plain, rtol=1e-5, atol=1e-5)


def test_candidate_cache_round_trip_and_invalidation(tmp_path):
  task, params = dual_task('polyencoder')
  texts = ['a b', 'c', 'd e f']
  pool = candidate_pool.CandidatePool(queries=sessions()[0].copy(),
                                  counts=np.array([3, 2, 1]), texts=texts)
  trained = types.SimpleNamespace(task=task, params=params, cfg=task.cfg, step=5)
  lines = []
  log = lambda *args, **kwargs: lines.append(args[0])
  first = retrieval.candidate_cache(trained, pool, str(tmp_path), log=log)
  assert len(lines) == 1  # computed and written
  again = retrieval.candidate_cache(trained, pool, str(tmp_path), log=log)
  assert len(lines) == 1  # read back, not recomputed
  np.testing.assert_array_equal(again, first)
  assert again.dtype == np.float32 and again.shape == (3, 8)
  # Another checkpoint, another pool: recomputed each time.
  later = types.SimpleNamespace(task=task, params=jax.tree.map(lambda x: x + 1, params),
                                cfg=task.cfg, step=6)
  changed = retrieval.candidate_cache(later, pool, str(tmp_path), log=log)
  assert len(lines) == 2 and not np.allclose(changed, first)
  other_pool = candidate_pool.CandidatePool(queries=sessions(seed=1)[0].copy(),
                                        counts=np.array([3, 2, 1]), texts=texts)
  retrieval.candidate_cache(later, other_pool, str(tmp_path), log=log)
  assert len(lines) == 3
  # Nothing of it is a pickle: the vectors load with pickling refused.
  with np.load(tmp_path / 'candidate_cache' / 'vectors.npz', allow_pickle=False) as stored:
    assert stored['leaf_0'].shape == (3, 8)
  # Vectors of another shape under the right key (a file replaced by hand) are computed
  # again, not handed on.
  np.savez(tmp_path / 'candidate_cache' / 'vectors.npz', leaf_0=np.zeros((2, 8), np.float32))
  recomputed = retrieval.candidate_cache(later, other_pool, str(tmp_path), log=log)
  assert len(lines) == 4 and recomputed.shape == (3, 8) and np.abs(recomputed).sum() > 0


def test_a_rankers_checkpoint_is_not_compared_on_keys_its_model_does_not_read():
  """A Bi-encoder trained when its config carried other codes (the demo's 4) still loads
  under the family's default; a Poly-encoder's codes are its own and still compared."""
  bi = ranker_config('biencoder')
  saved = {**checkpoints.architecture(bi), 'poly_codes': 4, 'cross_negatives': 9,
           'decoder_layers': 7}
  assert checkpoints.architecture_differences(saved, bi) == {}
  poly = ranker_config('polyencoder')
  saved = {**checkpoints.architecture(poly), 'poly_codes': poly.poly_codes + 1}
  assert set(checkpoints.architecture_differences(saved, poly)) == {'poly_codes'}


def test_a_checkpoint_of_another_model_is_named_by_its_model_not_fields_it_never_had():
  """A Bi-encoder's checkpoint read for a Poly-encoder: the models are named, not a field the
  checkpoint lacks at the Poly-encoder's default as if the checkpoint had held it."""
  bi, poly = ranker_config('biencoder'), ranker_config('polyencoder')
  with pytest.raises(checkpoints.CheckpointMismatch, match=re.escape(
      "step 5 holds another model (a 'biencoder', not the config's 'polyencoder'): use the "
      'config it was trained with, or a new workdir')):
    checkpoints.check_model(checkpoints.architecture(bi), poly, 'step 5')


def test_cross_encoder_cannot_rank_the_whole_pool():
  task = rankers.CrossEncoderTask(ranker_config('crossencoder'),
                                        pool_queries=sessions()[0])
  assert not isinstance(task, tasks.ScoresPool) and isinstance(task, tasks.ScoresCandidates)


@pytest.mark.parametrize('candidate, reference, gain', [
    ([5, 6, 7, 8], [5, 6, 7, 8], 1.0),  # the same query
    ([5, 6, 7, 0], [5, 6, 8, 0], 0.6),  # 2 words + 1 bigram of 3 + 2 and 3 + 2 n-grams
    ([5, 5, 5, 0], [5, 6, 0, 0], 0.25),  # clipped: the reference holds one 5 and no (5, 5)
    ([6, 5, 0, 0], [5, 6, 0, 0], 2 * 2 / 6),  # the words, not the bigram
    ([UNK_ID, 5, 0, 0], [UNK_ID, 5, 0, 0], 2 * 1 / 6),  # <unk> matches nothing
    ([5, 0, 0, 0], [5, 6, 7, 0], 2 * 1 / 6),  # short: recall lost
    ([9, 10, 0, 0], [5, 6, 0, 0], 0.0),
    ([0, 0, 0, 0], [0, 0, 0, 0], 0.0),
])
def test_overlap_gain_exact_values(candidate, reference, gain):
  value = rankers.overlap_gain(jnp.asarray(candidate), jnp.asarray(reference))
  np.testing.assert_allclose(float(value), gain, rtol=1e-6)
  # Symmetric: the F1 of pooled unigrams and bigrams.
  np.testing.assert_allclose(
      float(rankers.overlap_gain(jnp.asarray(reference), jnp.asarray(candidate))), gain,
      rtol=1e-6)


def overlap_by_hand(candidate, reference):
  """`overlap_gain` written with Counters."""
  def grams(ids):
    words = [int(w) for w in ids if w != 0]
    return [(words, 1), (list(zip(words, words[1:])), 2)]

  matches = total = 0
  for (c, _), (r, _) in zip(grams(candidate), grams(reference)):
    known = lambda g: UNK_ID not in (g if isinstance(g, tuple) else (g,))
    rc = collections.Counter(g for g in r if known(g))
    matches += sum(min(n, rc[g]) for g, n in collections.Counter(
        g for g in c if known(g)).items())
    total += len(c) + len(r)
  return 2 * matches / total if total else 0.0


# Which candidates join is the task's, the same for both dual encoders: the Bi-encoder meets
# every case, the Poly-encoder (whose scores differ, not its candidates) the two widest.
@pytest.mark.parametrize('name, extra, groups', [
    ('biencoder', 'none', 1), ('biencoder', 'lexical', 1), ('biencoder', 'lexical', 2),
    ('biencoder', 'generated', 2), ('polyencoder', 'lexical', 2),
    ('polyencoder', 'generated', 2)])
def test_graded_session_candidates_loss_equals_a_hand_computation(name, extra, groups):
  lexical, generated = extra == 'lexical', extra == 'generated'
  queries = sessions(length=4)
  queries[0, 3] = queries[0, 1]  # a return to an earlier query: its positive, once
  queries[3, 2, :2] = queries[3, 1, :2]  # a reformulation sharing two words
  queries[2, 2, 0] = UNK_ID
  # Lexical negatives: 3 pool entries per context, -1 for none; one is the true next query.
  pool = np.concatenate([queries[1, 1:2], sessions(seed=5).reshape(-1, N)[:6]])
  found = np.random.default_rng(1).integers(-1, len(pool), size=(4, 4, 3)).astype(np.int32)
  found[1, 0, 0] = 0
  # A generator's 3 suggestions after each query: pool entries (several share words with the
  # next queries), one the true next query, one a query of the session so far, one twice,
  # a padding slot.
  hypotheses = pool[np.maximum(found, 0)].copy()  # [B, S, 3, n]
  hypotheses[1, 0, 0] = queries[1, 1]
  hypotheses[3, 2, 1] = queries[3, 0]
  hypotheses[0, 1, 2] = hypotheses[0, 1, 1]
  hypotheses[2, 0, 1] = 0
  hypotheses[3, 0, 2] = queries[3, 2]  # a later query of the session: not yet seen, scored
  task = rankers.DualEncoderTask(
      ranker_config(name, session_candidates=True, lexical_negatives=3 if lexical else 0),
      pool_queries=pool, hypotheses_from='folds' if generated else '')
  params = initialised(task)
  batch = {'queries': queries, **({'lexical': found} if lexical else {}),
           **({'hypotheses': hypotheses} if generated else {})}
  def loss(p):
    sums = task.loss_sums(p, batch, train=False, groups=groups)
    return sums['loss'], sums

  # The sums and their gradients in one program (dropout is 0: training differs only in
  # the random draws, which this loss has none of).
  (_, sums), grads = compiled(jax.value_and_grad(loss, has_aux=True), params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  contexts = np.asarray(compiled(task.contexts, params, queries))  # [B, P, m, d]
  # Every candidate vector in one call (each row is encoded alone): the session's queries,
  # the pool's entries, the generator's suggestions.
  rows = np.concatenate([queries.reshape(-1, N), pool, hypotheses.reshape(-1, N)])
  every = np.asarray(apply(task.model, params, rows, method='candidates'))
  vectors = every[:queries[..., 0].size].reshape(queries.shape[:-1] + (-1,))
  pool_vectors = every[queries[..., 0].size:][:len(pool)]
  hypothesis_vectors = every[queries[..., 0].size + len(pool):].reshape(
      hypotheses.shape[:-1] + (-1,))
  # Every (context, candidate vector) score written out in numpy, as the paper defines it.
  def score(b, t, vector):
    per_code = contexts[b, t] @ vector  # [m]
    if not task.poly:
      return float(per_code[0])
    weights = np.exp(per_code / np.sqrt(contexts.shape[-1]))
    return float((weights / weights.sum()) @ per_code)
  rows = [(b, t) for b in range(4) for t in range(3)]
  total = nll_total = correct = count = 0.0
  skipped_hypotheses = 0
  for b, t in rows:
    target = queries[b, t + 1]
    if not target.any():
      continue
    count += 1
    logits, gains = [score(b, t, vectors[b, t + 1])], [1.0]
    for b2, t2 in rows:  # in-batch: its group's, not itself, not the same query, not a
      other = queries[b2, t2 + 1]  # query of the session so far
      if (b2 * groups // 4 == b * groups // 4 and (b2, t2) != (b, t) and other.any()
          and not (other == target).all() and not (b2 == b and t2 < t)):
        logits.append(score(b, t, vectors[b2, t2 + 1]))
        gains.append(overlap_by_hand(other, target))
    so_far = []
    for s in range(t + 1):  # the session so far
      if queries[b, s].any() and not (queries[b, s] == target).all():
        so_far.append(queries[b, s])
        logits.append(score(b, t, vectors[b, s]))
        gains.append(overlap_by_hand(queries[b, s], target))
    for k in found[b, t] if lexical else ():  # the context's lexical neighbours
      if k >= 0 and not (pool[k] == target).all():
        logits.append(score(b, t, pool_vectors[k]))
        gains.append(overlap_by_hand(pool[k], target))
    for j in range(3) if generated else ():  # the generator's suggestions, each text once
      h = hypotheses[b, t, j]
      if (h.any() and not (h == target).all() and not any((h == q).all() for q in so_far)
          and not any((h == hypotheses[b, t, i]).all() for i in range(j))):
        logits.append(score(b, t, hypothesis_vectors[b, t, j]))
        gains.append(overlap_by_hand(h, target))
      else:
        skipped_hypotheses += 1
    logits, gains = np.array(logits), np.array(gains)
    log_probs = logits - (np.log(np.exp(logits - logits.max()).sum()) + logits.max())
    total -= (gains / gains.sum() * log_probs).sum()
    nll_total -= log_probs[0]
    correct += logits[0] >= logits.max()
  assert count == 11 and float(sums['tokens']) == count
  if generated:  # at least the four planted above are not scored; most are
    assert 4 <= skipped_hypotheses < 33 - 4, skipped_hypotheses
  np.testing.assert_allclose(float(sums['loss']), total, rtol=1e-5)
  np.testing.assert_allclose(float(sums['nll']), nll_total, rtol=1e-5)
  assert float(sums['correct']) == correct
  # The reformulation and other overlapping candidates take shares of the target.
  assert abs(float(sums['loss']) - float(sums['nll'])) > 0.1


@pytest.mark.parametrize('generated', [False, True])
def test_cross_encoder_graded_loss_scores_the_session_so_far(generated):
  cfg = ranker_config('crossencoder', cross_negatives=3, session_candidates=True)
  queries = sessions(length=4)
  queries[0, 3] = queries[0, 1]  # a return to an earlier query: its positive, once
  queries[3, 2, :2] = queries[3, 1, :2]  # a reformulation sharing two words
  pool = np.concatenate([queries[0, 1:2], sessions(seed=9).reshape(-1, N)[:5]])
  # A generator's 3 suggestions after each query: one the true next query, one a query of
  # the session so far, one twice, a padding slot, the rest pool entries.
  hypotheses = pool[np.random.default_rng(2).integers(0, len(pool), size=(4, 4, 3))]
  hypotheses[1, 0, 0] = queries[1, 1]
  hypotheses[3, 2, 1] = queries[3, 0]
  hypotheses[0, 1, 2] = hypotheses[0, 1, 1]
  hypotheses[2, 0, 1] = 0
  task = rankers.CrossEncoderTask(cfg, pool_queries=pool,
                                        hypotheses_from='folds' if generated else '')
  batch = {'queries': queries, **({'hypotheses': hypotheses} if generated else {})}
  params = initialised(task)
  key = jax.random.PRNGKey(7)
  sums = compiled(lambda p: task.loss_sums(p, batch, train=False), params)
  drawn = np.asarray(jax.random.randint(jax.random.split(jax.random.PRNGKey(0))[0],
                                        (4, 3, 3), 0, len(pool)))
  # Every context against its true next query, its 3 drawn entries, queries 0..2 of its
  # session and its 3 suggestions, in one call; the hand computation keeps the ones the
  # loss may read.
  every = np.concatenate([queries[:, 1:, None], pool[drawn],
                          np.broadcast_to(queries[:, None, :3], (4, 3, 3, N)),
                          hypotheses[:, :3]], axis=2)
  scores = np.asarray(compiled(task.score_candidates, params, {'queries': queries},
                               jnp.asarray(every)))
  total = nll_total = 0.0
  for b in range(4):
    for t in range(3):
      target = queries[b, t + 1]
      if not target.any():
        continue
      kept = [0] + [1 + k for k in range(3) if not (pool[drawn[b, t, k]] == target).all()]
      so_far = [s for s in range(t + 1)
                if queries[b, s].any() and not (queries[b, s] == target).all()]
      kept += [4 + s for s in so_far]
      for j in range(3) if generated else ():
        h = hypotheses[b, t, j]
        if (h.any() and not (h == target).all()
            and not any((h == queries[b, s]).all() for s in so_far)
            and not any((h == hypotheses[b, t, i]).all() for i in range(j))):
          kept.append(7 + j)
      logits = scores[b, t, kept]
      gains = np.array([1.0] + [overlap_by_hand(every[b, t, k], target) for k in kept[1:]])
      log_probs = logits - (np.log(np.exp(logits - logits.max()).sum()) + logits.max())
      total -= (gains / gains.sum() * log_probs).sum()
      nll_total -= log_probs[0]
  np.testing.assert_allclose(float(sums['loss']), total, rtol=1e-4)
  np.testing.assert_allclose(float(sums['nll']), nll_total, rtol=1e-4)
  assert abs(float(sums['loss']) - float(sums['nll'])) > 0.1
  grads = compiled(jax.grad(lambda p: task.loss_sums(p, batch, train=True,
                                                     rngs={'dropout': key})['loss']), params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_lexical_neighbours_share_words_and_leave_out_the_session(tmp_path):
  texts = ['cheap flights paris', 'paris hotels', 'cheap hotels rome', 'weather', 'rome']
  pool = candidate_pool.CandidatePool(queries=np.zeros((5, N), np.int32),
                                  counts=np.ones(5, np.int64), texts=texts)
  candidate_pool.save_pool(str(tmp_path), pool)
  # One session: 'paris hotels' then 'cheap flights paris' (both in the pool), then 'snow'.
  (tmp_path / 'split.txt').write_text('paris hotels\ncheap flights paris\nsnow\n')
  split = session_data.SessionSplit('valid', np.zeros((3, N), np.int32), np.array([0, 3]),
                                text_path=str(tmp_path / 'split.txt'))
  index = rankers.lexical_index(str(tmp_path))
  found = rankers.lexical_neighbours(*index, split, 3)
  assert found.shape == (3, 3) and found.dtype == np.int32
  # After 'paris hotels': 'cheap hotels rome' shares a word; the session's own queries (1, 0)
  # are left out even though they share more; nothing else shares a word.
  np.testing.assert_array_equal(found[0], [2, -1, -1])
  np.testing.assert_array_equal(found[1], [2, -1, -1])
  # With 'snow', still no more: an entry that shares no word is no neighbour.
  np.testing.assert_array_equal(found[2], [2, -1, -1])
  # The cached result is read back for the same contexts.
  np.testing.assert_array_equal(
      rankers.lexical_neighbours(*rankers.lexical_index(str(tmp_path)), split, 3),
      found)
  assert (tmp_path / 'pool_bm25' / 'valid.top_k.npz').exists()
