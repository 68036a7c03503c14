"""The zero attention family and the user memory: the attention against the paper's equations
computed by hand, what a model without history or an unseen user gets, the exact validation
loss, the pool protocols' bookkeeping, and the family and a personalised MTN through the real
command line (train, resume bit for bit, eval by user history, decode, suggest)."""

from __future__ import annotations

import dataclasses
import functools
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mtn_jax.data import candidate_pool
from mtn_jax.data import sessions
from mtn_jax.evaluation import pool_ranking
from mtn_jax.models import user_memory
from mtn_jax.models import zam
from mtn_jax.tasks import base
from mtn_jax.tasks import zero_attention
from tests import cli
from tests import golden
from tests.lists import assert_raw_log_decode_writes_what_eval_scored
from tests.lists import read_jsonl


def memory_params(dim=4, hidden=3, seed=0):
  rng = np.random.default_rng(seed)
  return {'w_f': rng.normal(size=(dim, hidden, dim)).astype(np.float32),
          'b_f': rng.normal(size=(dim, hidden)).astype(np.float32),
          'w_h': rng.normal(size=(hidden,)).astype(np.float32)}


def attention_by_hand(params, q, items):
  """f(q, i) = i . tanh(W_f q + b_f) . W_h (eq. 10), in numpy, one context."""
  projected = np.tanh(np.einsum('abc,c->ab', params['w_f'], q) + params['b_f'])
  return np.array([item @ projected @ params['w_h'] for item in items])


@pytest.mark.parametrize('zero_attention', [False, True])
def test_user_memory_is_eq_9_and_eq_11(zero_attention):
  params = memory_params()
  rng = np.random.default_rng(1)
  q = rng.normal(size=(2, 4)).astype(np.float32)
  items = rng.normal(size=(2, 3, 4)).astype(np.float32)
  mask = np.array([[True, True, False], [True, True, True]])
  u, weights, zero_weight = user_memory.UserMemory(3, zero_attention).apply(
      {'params': params}, q, items, mask)
  for n in range(2):
    f = attention_by_hand(params, q[n], items[n][mask[n]])
    # AEM: a softmax over the history (eq. 9); ZAM: the zero vector adds exp(f(q, 0)) = 1 to
    # the denominator (eq. 11).
    denominator = np.exp(f).sum() + (1.0 if zero_attention else 0.0)
    expected = np.exp(f) / denominator
    np.testing.assert_allclose(weights[n][mask[n]], expected, rtol=1e-5)
    assert not np.asarray(weights[n])[~mask[n]].any()
    np.testing.assert_allclose(u[n], expected @ items[n][mask[n]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(zero_weight[n], 1 / denominator if zero_attention else 0.0,
                               rtol=1e-5)


def test_zero_attention_closes_when_the_history_is_unrelated_and_aem_cannot():
  # f(q, i) << 0 for every item (an unrelated history): ZAM puts nearly all its weight on the
  # zero vector and u vanishes; AEM must still spread weight 1 over the history.
  params = {'w_f': np.zeros((2, 1, 2), np.float32), 'b_f': np.ones((2, 1), np.float32),
            'w_h': np.ones((1,), np.float32)}  # tanh(b_f) . W_h = 0.76 per unit of i
  q = np.ones((1, 2), np.float32)
  items = np.full((1, 3, 2), -5.0, np.float32)  # f = -7.6 for each
  mask = np.ones((1, 3), bool)
  u, weights, zero_weight = user_memory.UserMemory(1, True).apply(
      {'params': params}, q, items, mask)
  assert float(zero_weight[0]) > 0.998 and float(np.abs(u).max()) < 0.01
  _, aem_weights, _ = user_memory.UserMemory(1, False).apply({'params': params}, q, items, mask)
  np.testing.assert_allclose(aem_weights.sum(), 1.0, rtol=1e-6)
  # Without any history both give u = 0, and the weights are all zero (no NaN).
  for with_zero_vector in (False, True):
    u, weights, _ = user_memory.UserMemory(1, with_zero_vector).apply(
        {'params': params}, q, items, np.zeros((1, 3), bool))
    assert not np.asarray(u).any() and not np.asarray(weights).any()


@pytest.mark.parametrize('user_model', ['aem', 'zam'])
def test_an_informative_history_is_learned_and_beats_no_user(user_model, tmp_path):
  """Each of 8 users always goes on to their own interest, an item their history holds beside
  an unrelated one, after the same first query: QEM (no user) cannot do better than chance,
  the history's attention can, and more than halves the loss."""
  users = np.arange(8)
  item_words = 4 + users[:, None] + np.array([[0, 8]])  # item i: words 4+i and 12+i
  queries = np.zeros((8, 2, 3), np.int32)
  queries[:, 0] = [19, 3, 0]  # the same first query for everyone: it tells nothing
  queries[:, 1, :2] = item_words
  batch = {'queries': jnp.asarray(queries),
           'targets': jnp.asarray(np.stack([np.full(8, -1), users], 1), jnp.int32),
           'history_items': jnp.asarray(np.stack([users, (users + 3) % 8], 1), jnp.int32)}

  def trained_loss(model_name):
    model, _, _ = family_model(model_name)
    cfg = dataclasses.replace(model.config, num_items=8, max_session_queries=2)
    model = zam.ZeroAttentionModel(cfg)
    task = zero_attention.ZeroAttentionTask(cfg, data_dir=str(tmp_path),
                                             word_noise=np.zeros(20, np.float32),
                                             train_users=users)
    params = model.init(jax.random.PRNGKey(0), batch)['params']
    optimizer = optax.adam(0.05)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, key):
      grads = jax.grad(lambda p: task.loss_sums(p, batch, train=True,
                                                rngs={'dropout': key})['loss'])(params)
      updates, state = optimizer.update(grads, state)
      return optax.apply_updates(params, updates), state

    for i in range(150):
      params, state = step(params, state, jax.random.PRNGKey(i))
    sums = task.loss_sums(params, batch, train=False)
    return float(sums['nll'] / sums['tokens'])

  qem, personal = trained_loss('qem'), trained_loss(user_model)
  assert qem > 0.8 * np.log(8)  # no better than near chance among the 8 items
  assert personal < 0.5 * qem


def family_model(user_model, query_from='last'):
  cfg = zam.ZAMConfig(name='zam', vocab_size=20, max_query_words=3, max_session_queries=4,
                      emb_dim=8, dropout=0.0, share_embeddings=False, tie_embeddings=False,
                      compute_dtype='float32', user_model=user_model, attention_hidden=3,
                      query_from=query_from, item_negatives=2, word_negatives=2,
                      num_items=7, num_users=4)
  model = zam.ZeroAttentionModel(cfg)
  batch = {'queries': jnp.array([[[5, 6, 0], [7, 0, 0], [8, 9, 10]],
                                 [[11, 0, 0], [5, 0, 0], [0, 0, 0]]], jnp.int32),
           'history_items': jnp.array([[2, 3], [-1, -1]], jnp.int32),
           'user': jnp.array([2, 0], jnp.int32)}
  params = model.init(jax.random.PRNGKey(0), batch)['params']
  return model, params, batch


@pytest.mark.parametrize('user_model', zam.USER_MODELS)
def test_each_family_member_scores_i_dot_q_plus_u(user_model):
  model, params, batch = family_model(user_model)
  out = model.apply({'params': params}, batch)
  words = np.asarray(params['word_vectors'])
  # q = tanh(W_phi mean(words) + b_phi) (eq. 5) of the latest query.
  dense = params['query_projection']
  mean = words[[8, 9, 10]].mean(0)
  np.testing.assert_allclose(out['q'][0, 2], np.tanh(mean @ dense['kernel'] + dense['bias']),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out['context'], out['q'] + out['u'], rtol=1e-6)
  if user_model == 'qem':
    assert not np.asarray(out['u']).any()
  if user_model == 'hem':  # a learned vector per training user, 0 for an unseen one (index 0)
    np.testing.assert_allclose(out['u'][0, 1], params['user_vectors'][2])
    assert not np.asarray(out['u'][1]).any()
  if user_model in ('aem', 'zam'):  # the session without history gets u = 0
    assert not np.asarray(out['u'][1]).any()
    assert np.asarray(out['u'][0]).any()



def test_hem_gives_every_training_user_their_own_vector():
  """HEM's u is the learned vector of the context's user for every training user, index 1
  included: index 0 alone is the user unseen in training, who gets u = 0."""
  model, params, batch = family_model('hem')
  out = model.apply({'params': params}, {**batch, 'user': jnp.array([1, 3], jnp.int32)})
  for b, user in enumerate((1, 3)):
    np.testing.assert_allclose(out['u'][b], np.broadcast_to(params['user_vectors'][user],
                                                            (3, 8)))

@pytest.mark.parametrize('user_model', zam.USER_MODELS)
def test_each_family_members_training_objective_reads_the_history(user_model, tmp_path):
  """The sampled objective with a real history (M = 4 earlier queries of n words, not the
  batch's size): finite, and for HEM the user's vector learns from its history's words."""
  model, params, batch = family_model(user_model)
  task = zero_attention.ZeroAttentionTask(model.config, data_dir=str(tmp_path),
                                           word_noise=np.zeros(20, np.float32),
                                           train_users=np.arange(3))
  history = jnp.array([[[5, 6, 0], [7, 0, 0], [0, 0, 0], [12, 13, 14]],
                       [[0, 0, 0]] * 4], jnp.int32)  # [B=2, M=4, n=3]
  inputs = {**batch, 'history': history, 'targets': jnp.array([[0, 4, 6], [1, 2, -1]])}
  loss = lambda p, h: task.loss_sums(p, {**inputs, 'history': h}, train=True,
                                     rngs={'dropout': jax.random.PRNGKey(3)})['loss']
  grads = jax.grad(loss)(params, history)
  assert np.isfinite(float(loss(params, history)))
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  if user_model == 'hem':
    # User 2 (session 0) has a history: its vector gets a gradient from the history's words
    # alone when the sessions' own terms are the same; the unseen user 0 gets none.
    assert np.abs(grads['user_vectors'][2]).sum() > 0
    assert not np.abs(np.asarray(grads['user_vectors'])[[1, 3]]).any()
    assert float(loss(params, history)) != float(loss(params, jnp.zeros_like(history)))


@pytest.mark.parametrize('user_model', zam.USER_MODELS)
def test_only_zam_reports_a_weight_on_the_zero_vector(user_model, tmp_path):
  """Evaluation reports the mean weight on the zero vector (`evaluate.history_groups`) where
  it is finite: ZAM's memory has one; AEM attends without it, QEM and HEM to nothing."""
  model, params, batch = family_model(user_model)
  task = zero_attention.ZeroAttentionTask(model.config, data_dir=str(tmp_path),
                                           word_noise=np.zeros(20, np.float32),
                                           train_users=np.arange(3))
  out = task.attention(params, batch)
  assert out['zero_weight'].shape == (2, 2)
  # What a context offers to suggest from: the training targets are the loss's alone.
  assert 'targets' in task.input_keys and 'targets' not in task.context_keys
  assert set(task.context_keys) == set(task.input_keys) - {'targets'}
  if user_model == 'zam':
    weights = np.asarray(out['zero_weight'])
    assert np.all((weights > 0) & (weights <= 1)) and weights[1].min() > 0.999  # no history
  else:
    assert np.isnan(np.asarray(out['zero_weight'])).all()


def test_session_query_is_phi_of_the_mean_of_every_word_so_far():
  """`query_from='session'`: q_t = tanh(W_phi mean(words of queries 0..t) + b_phi), the mean
  over the session's words so far (not their sum over the latest query's count)."""
  model, params, batch = family_model('qem', query_from='session')
  out = model.apply({'params': params}, batch)
  words = np.asarray(params['word_vectors'])
  dense = params['query_projection']
  phi = lambda ids: np.tanh(words[ids].mean(0) @ dense['kernel'] + dense['bias'])
  for t, ids in enumerate(([5, 6], [5, 6, 7], [5, 6, 7, 8, 9, 10])):
    np.testing.assert_allclose(out['q'][0, t], phi(ids), rtol=1e-5, atol=1e-6)
  # A padding query adds no word: the context after it is the one before it.
  np.testing.assert_allclose(out['q'][1, 2], phi([11, 5]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('user_model', ['aem', 'zam'])
def test_the_pools_first_entry_is_a_history_item_and_only_minus_one_is_none(user_model):
  """Pool index 0 is the most frequent training query, the likeliest history item of all:
  it is attended like any other (-1 alone marks no item). One item: AEM gives it weight 1
  (u = i_0), ZAM e^f / (1 + e^f) (eq. 11)."""
  model, params, batch = family_model(user_model)
  batch = {**batch, 'history_items': jnp.array([[0, -1], [-1, -1]], jnp.int32)}
  out = model.apply({'params': params}, batch)
  weights = np.asarray(out['weights'][0, :, 0])
  assert (weights > 0).all() and not np.asarray(out['weights'][0, :, 1]).any()
  if user_model == 'aem':
    np.testing.assert_allclose(weights, 1.0, rtol=1e-6)
  else:
    np.testing.assert_allclose(weights + np.asarray(out['zero_weight'][0]), 1.0, rtol=1e-6)
  np.testing.assert_allclose(out['u'][0], weights[:, None] * params['item_vectors'][0],
                             rtol=1e-5, atol=1e-7)


def log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def test_training_objective_is_eq_14_with_the_pool_and_the_users_words_by_hand(tmp_path):
  """HEM's sampled objective written out in numpy (notes eq. 13-14 and eq. 8): per context
  whose next query is a pool entry (index 0 included), the item term over k negatives drawn
  uniformly from the whole pool and the next query's word term over its real words; and once
  per session of a known user with a history, the user's word term. 'nll' is the item term
  alone. The draws are the step key's split in three (items, words, user)."""
  model, params, batch = family_model('hem')
  cfg = model.config
  word_noise = np.log(np.arange(20, dtype=np.float32) % 5 + 1.0).astype(np.float32)
  word_noise[0] = -np.inf
  task = zero_attention.ZeroAttentionTask(cfg, data_dir=str(tmp_path), word_noise=word_noise,
                                           train_users=np.arange(3))
  # [B, M=2, n]; session 1's user is unseen (index 0): no vector, its history not read.
  history = jnp.array([[[5, 6, 0], [7, 0, 0]], [[12, 13, 0], [9, 0, 0]]], jnp.int32)
  # Session 0 goes on to pool entries 0 and 6; session 1 to one outside the pool, then a
  # padding query.
  targets = jnp.array([[3, 0, 6], [1, -1, 2]], jnp.int32)
  inputs = {**batch, 'history': history, 'targets': targets}
  key = jax.random.PRNGKey(5)
  sums = task.loss_sums(params, inputs, train=True, rngs={'dropout': key})
  item_key, word_key, user_key = jax.random.split(key, 3)
  k = cfg.item_negatives
  negatives = np.asarray(jax.random.randint(item_key, (2, 2, k), 0, cfg.num_items))
  noise = np.asarray(zero_attention.draw_words(word_key, word_noise, (2, 2, 3, 2)))
  user_noise = np.asarray(zero_attention.draw_words(user_key, word_noise, (2, 2, 3, 2)))
  out = model.apply({'params': params}, batch)
  context = np.asarray(out['context'])
  items, words = np.asarray(params['item_vectors']), np.asarray(params['word_vectors'])
  queries, targets = np.asarray(batch['queries']), np.asarray(targets)

  def word_term(ids, noise_ids, vector):
    return -sum(log_sigmoid(words[w] @ vector)
                + sum(log_sigmoid(-words[v] @ vector) for v in noise_ids[j])
                for j, w in enumerate(ids) if w != 0)

  item_total = total = 0.0
  for b, t in ((0, 0), (0, 1)):  # the contexts whose next query is a pool entry
    target = targets[b, t + 1]
    term = -(log_sigmoid(items[target] @ context[b, t])
             + sum(log_sigmoid(-items[i] @ context[b, t]) for i in negatives[b, t]))
    item_total += term
    total += term + word_term(queries[b, t + 1], noise[b, t], items[target])
  user_vector = np.asarray(params['user_vectors'])[2]
  total += sum(word_term(np.asarray(history)[0, m], user_noise[0, m], user_vector)
               for m in range(2))
  assert float(sums['tokens']) == 2
  np.testing.assert_allclose(float(sums['nll']), item_total, rtol=1e-5)
  np.testing.assert_allclose(float(sums['loss']), total, rtol=1e-5)
  # Without a context whose next query is a pool entry a session has no loss, the user's
  # word term included.
  outside = task.loss_sums(params, {**inputs, 'targets': jnp.full_like(targets, -1)},
                           train=True, rngs={'dropout': key})
  assert float(outside['tokens']) == 0 and float(outside['loss']) == 0
  # Nor is the unseen user's history read when its session has a context with a loss.
  pooled = {**inputs, 'targets': inputs['targets'].at[1, 1].set(4)}
  unseen = [float(task.loss_sums(params, {**pooled, 'history': h}, train=True,
                                 rngs={'dropout': key})['loss'])
            for h in (history, history.at[1].set(0))]
  assert unseen[0] == unseen[1]


def test_validation_counts_a_context_correct_when_its_target_scores_highest(tmp_path):
  """'accuracy' counts the contexts whose next query's pool entry scores first (the argmax
  equal to the target, not merely at or above its index), pool entry 0 included: it is the
  most frequent query, a target like any other."""
  model, params, batch = family_model('qem')
  task = zero_attention.ZeroAttentionTask(model.config, data_dir=str(tmp_path),
                                           word_noise=np.zeros(20, np.float32),
                                           train_users=np.arange(3))
  out = model.apply({'params': params}, batch)
  logits = np.einsum('bta,ca->btc', out['context'][:, :-1], params['item_vectors'])
  best = logits.argmax(-1)  # [B, 2]
  assert best[0, 0] > 0  # so pool entry 0 is a wrong target after session 0's first query
  # Session 0: entry 0 (wrong) after position 0, its best entry after position 1; session 1:
  # its best after position 0, then a padding query (no context).
  targets = jnp.array([[5, 0, best[0, 1]], [1, best[1, 0], 3]], jnp.int32)
  sums = task.loss_sums(params, {**batch, 'targets': targets}, train=False)
  assert float(sums['tokens']) == 3 and float(sums['correct']) == 2


def test_session_query_is_causal():
  model, params, batch = family_model('zam', query_from='session')
  changed = dict(batch, queries=batch['queries'].at[0, 2].set(jnp.array([12, 13, 0])))
  a = model.apply({'params': params}, batch)['context']
  b = model.apply({'params': params}, changed)['context']
  np.testing.assert_array_equal(a[0, :2], b[0, :2])  # positions before the change
  assert not np.allclose(a[0, 2], b[0, 2])


def test_validation_loss_is_the_exact_pool_cross_entropy(tmp_path):
  model, params, batch = family_model('aem')
  pool = candidate_pool.CandidatePool(queries=np.zeros((7, 3), np.int32),
                                  counts=np.ones(7, np.int64), texts=[str(i) for i in range(7)])
  task = zero_attention.ZeroAttentionTask(model.config, data_dir=str(tmp_path),
                                           word_noise=np.zeros(20, np.float32),
                                           train_users=np.arange(3))
  task.__dict__['pool'] = pool
  targets = jnp.array([[0, 4, 6], [1, -1, 0]], jnp.int32)  # the second's next is not pooled
  sums = task.loss_sums(params, {**batch, 'targets': targets}, train=False)
  out = model.apply({'params': params}, batch)
  logits = np.einsum('bta,ca->btc', out['context'][:, :-1], params['item_vectors'])
  expected = [jax.nn.logsumexp(logits[0, 0]) - logits[0, 0, 4],
              jax.nn.logsumexp(logits[0, 1]) - logits[0, 1, 6]]
  # Session 2: position 0 predicts a query outside the pool (no loss); position 1 predicts
  # a padding query (no pair).
  assert float(sums['tokens']) == 2
  np.testing.assert_allclose(sums['nll'], sum(expected), rtol=1e-5)
  # Retrieval scores the pool with the same contexts: position t's predicts query t + 1.
  np.testing.assert_allclose(task.score_pool(params, batch, task.encode_candidates(
      params, jnp.asarray(pool.queries))), logits, rtol=1e-5, atol=1e-6)
  assert float(sums['correct']) == sum(
      int(np.argmax(logits[0, t]) == c) for t, c in ((0, 4), (1, 6)))
  # Training: the sampled objective is finite and differentiable.
  grads = jax.grad(lambda p: task.loss_sums(
      p, {**batch, 'targets': targets}, train=True,
      rngs={'dropout': jax.random.PRNGKey(1)})['loss'])(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_word_noise_is_the_unigram_to_the_three_quarters():
  pool = candidate_pool.CandidatePool(queries=np.array([[5, 6], [5, 0]], np.int32),
                                  counts=np.array([3, 1], np.int64), texts=['a b', 'a'])
  logits = zero_attention.word_noise_logits(pool, 8)
  # word 5: 3 + 1 = 4 times, word 6: 3 times; padding and unseen words never drawn.
  np.testing.assert_allclose(logits[[5, 6]], 0.75 * np.log([4.0, 3.0]), rtol=1e-6)
  assert np.isneginf(logits[[0, 1, 7]]).all()


def test_drawn_noise_words_follow_the_noise_distribution_and_never_its_zeros():
  with np.errstate(divide='ignore'):  # log(0) = -inf: the words never drawn
    logits = np.log(np.array([0.0, 0.0, 1.0, 4.0, 0.0, 3.0, 0.0], np.float32))
  drawn = np.asarray(zero_attention.draw_words(jax.random.PRNGKey(0), logits, (200_000,)))
  frequencies = np.bincount(drawn, minlength=len(logits)) / len(drawn)
  # Words 2, 3, 5 with probabilities 1/8, 4/8, 3/8; padding and unseen words never.
  np.testing.assert_allclose(frequencies, [0, 0, 1 / 8, 4 / 8, 0, 3 / 8, 0], atol=4e-3)
  assert frequencies[[0, 1, 4, 6]].sum() == 0


def test_a_uniform_draw_of_exactly_zero_is_a_word_with_mass(monkeypatch):
  """The uniform draw can return 0.0 exactly: it picks the first word the noise can draw,
  not padding or another word of probability 0 in front of it."""
  with np.errstate(divide='ignore'):
    logits = np.log(np.array([0.0, 0.0, 1.0, 4.0, 0.0, 3.0, 0.0], np.float32))
  monkeypatch.setattr(jax.random, 'uniform', lambda rng, shape: jnp.zeros(shape))
  drawn = zero_attention.draw_words(jax.random.PRNGKey(0), logits, (3,))
  assert np.asarray(drawn).tolist() == [2, 2, 2]


def test_user_index_maps_training_users_and_unseen_ones_to_zero():
  assert zero_attention.user_index(np.array([30, 10, 20, 10]),
                                    np.array([20, 99, 10, 5])).tolist() == [2, 0, 1, 0]


def test_sampled_negatives_never_hold_the_next_query_and_are_seeded():
  pool_ids = np.array([0, 5, 9, -1])
  drawn = pool_ranking.sampled_negatives(pool_ids, 10, 99, seed=3)
  assert drawn.shape == (4, 99) and drawn.min() >= 0 and drawn.max() < 10
  for row, target in zip(drawn, pool_ids):
    assert target not in row.tolist() or target < 0
  np.testing.assert_array_equal(drawn, pool_ranking.sampled_negatives(pool_ids, 10, 99, seed=3))


def test_pool_figures_count_a_next_query_outside_the_pool_as_a_miss():
  ranked = pool_ranking.SplitRanking(suggestions=[[]] * 3, top_scores=np.zeros((3, 1)),
                                pool_ranks=np.array([1, 20, 101]),
                                sampled_ranks=np.array([[1, 1], [3, 12], [0, 0]]),
                                zero_weight=np.full(3, np.nan))
  figures = ranked.figures()
  assert figures['pairs'] == 3 and figures['pairs_in_pool'] == 2
  np.testing.assert_allclose(figures['mrr'], 100 * (1 + 1 / 20 + 1 / 101) / 3)
  np.testing.assert_allclose(figures['recall_at_10'], 100 / 3)
  assert figures['r1_of_20'] == 50.0 and figures['r1_of_100'] == 50.0
  # Each protocol reads its own column.
  figures = dataclasses.replace(ranked, sampled_ranks=np.array([[1, 1], [1, 12], [0, 0]])
                                ).figures()
  assert figures['r1_of_20'] == 100.0 and figures['r1_of_100'] == 50.0


def test_sampled_negatives_reach_every_other_pool_entry():
  """Drawn uniformly from the whole pool but the pair's own next query: with enough draws
  every other entry, the last one included, is met."""
  drawn = pool_ranking.sampled_negatives(np.array([0, 3, 1]), 4, 200, seed=0)
  assert [sorted(set(row.tolist())) for row in drawn] == [[1, 2, 3], [0, 1, 2], [0, 2, 3]]


class _GivenScores:
  """A ranker whose scores of the whole pool are the batch's 'scores' [B, P, C]."""

  def score_pool(self, params, batch, cache):
    del params, cache
    return batch['scores']


def test_a_tie_with_the_next_query_counts_against_it():
  """The pool rank and the sampled ranks of the logged next query count every candidate
  scored as high as it: a ranker that gives every candidate one score ranks it last, not
  first (a collapsed model would otherwise score a perfect MRR). A next query outside the
  pool ranks C + 1 and has no sampled rank."""
  scores = jnp.array([[[0.5, 0.5, 0.5, 0.2]], [[0.1, 0.9, 0.3, 0.2]]], jnp.float32)
  batch = {'scores': scores, 'pool_ids': jnp.array([[7, 1], [7, -1]], jnp.int32)}
  negatives = jnp.zeros((2, 1, 99), jnp.int32)  # entry 0 every time: a tie for the first
  top_ids, top_scores, pool_ranks, sampled, zero_weight = jax.device_get(
      pool_ranking._rank_batch(  # pylint: disable=protected-access
          {}, batch, None, negatives, task=_GivenScores(), k=2))
  assert pool_ranks.tolist() == [[3], [5]]
  assert sampled.tolist() == [[[20, 100]], [[0, 0]]]
  assert top_ids[1].tolist() == [[1, 2]]
  np.testing.assert_allclose(top_scores[1], [[0.9, 0.3]])
  assert np.isnan(zero_weight).all()


@dataclasses.dataclass(frozen=True)
class _FirstWordConfig:
  name: str = 'first_word'


class _FirstWordScores:
  """A ranker without parameters that scores a candidate, after any context, by half its
  first word id rounded down (so pairs of entries tie), the whole pool and given candidates
  alike."""

  cfg = _FirstWordConfig()

  @classmethod
  def vector_index(cls, cfg):
    del cfg
    return False

  def context_inputs(self, split, vocab):
    del split, vocab
    return base.SplitInputs()

  def encode_candidates(self, params, candidate_queries):
    del params
    return (candidate_queries[:, 0] // 2).astype(jnp.float32)

  def score_pool(self, params, batch, cache):
    del params
    return jnp.broadcast_to(cache, batch['queries'][:, 1:, 0].shape + cache.shape)

  def score_candidates(self, params, batch, candidate_queries):
    del params, batch
    return (candidate_queries[..., 0] // 2).astype(jnp.float32)


@pytest.mark.parametrize('sampled_only', [False, True])
def test_each_pair_is_ranked_against_its_own_next_query_and_seeded_negatives(sampled_only,
                                                                             tmp_path):
  """Through `rank_split` and `rank_sampled`, a batch of one session at a time: the next
  query of pair (session, t) is query t + 1 of the session, its negatives are the seeded
  draws of that pair, entry 0 of the pool is a next query like any other, a tie counts
  against it, and a next query outside the pool ranks C + 1 with no sampled rank."""
  texts = ['a', 'b', 'c', 'd', 'e', 'f']  # word ids 5..10, scored 2, 3, 3, 4, 4, 5
  pool = candidate_pool.CandidatePool(queries=np.array([[5 + i, 0] for i in range(6)], np.int32),
                                  counts=np.ones(6, np.int64), texts=texts)
  (tmp_path / 'data').mkdir()
  candidate_pool.save_pool(str(tmp_path / 'data'), pool)
  lines = ('c', 'a', 'zz', 'e', 'd', 'b', 'f')  # 'zz' (word 15) is not in the pool
  split = sessions.SessionSplit(
      'test', np.array([[texts.index(t) + 5 if t in texts else 15, 0] for t in lines],
                       np.int32), np.array([0, 3, 5, 7]), text_lines=lines)
  trained = types.SimpleNamespace(task=_FirstWordScores(), params={}, vocab=None,
                                  cfg=_FirstWordConfig(), step=1)
  rank = pool_ranking.rank_sampled if sampled_only else functools.partial(
      pool_ranking.rank_split, k=2)
  ranking = rank(trained, split, str(tmp_path), seed=4, queries_per_batch=2)
  next_ids = np.array([0, -1, 3, 5])  # a, zz, d, f
  scores = np.array([2, 3, 3, 4, 4, 5])
  negatives = pool_ranking.sampled_negatives(next_ids, 6, 99, seed=4)
  expected = [[1 + int((scores[negatives[p, :size - 1]] >= scores[i]).sum()) if i >= 0
               else 0 for size in pool_ranking.SAMPLED_PROTOCOLS]
              for p, i in enumerate(next_ids)]
  assert ranking.sampled_ranks.tolist() == expected
  assert expected[0] == [20, 100]  # 'a' scores lowest: last among its negatives
  if sampled_only:
    assert not ranking.pool_ranks.any()
  else:
    assert ranking.pool_ranks.tolist() == [6, 7, 3, 1]  # 'd' ties with 'e'
    assert ranking.suggestions == [['f', 'd']] * 4
  assert ranking.figures()['pairs_in_pool'] == 3


# ---------------------------------------------------------------------------------------------
# Through the command line

FAMILY = ('--config.data.demo_users=150', '--config.data.max_session_queries=4',
          '--config.model.emb_dim=16', '--config.train.log_every_steps=1',
          '--config.input.train_queries_per_batch=240', '--config.decode.max_eval_sessions=16')
FIRST_STEPS, TOTAL_STEPS = 3, 6


@pytest.fixture(scope='module')
def zam_run(tmp_path_factory):
  """ZAM on the demo log: 3 steps, resumed to 6, evaluated; and the same 6 steps in one go."""
  workdir = tmp_path_factory.mktemp('zam')
  run = lambda *args, **kwargs: cli.run(workdir, *FAMILY, *args,
                                        config='configs/zam_aol.py:demo', **kwargs)
  run(f'--config.train.max_steps={FIRST_STEPS}')
  resumed = run(f'--config.train.max_steps={TOTAL_STEPS}')
  evaluated = run(mode='eval')
  straight = tmp_path_factory.mktemp('zam-straight')
  cli.run(straight, *FAMILY, f'--config.train.max_steps={TOTAL_STEPS}',
          config='configs/zam_aol.py:demo')
  return workdir, straight, resumed, evaluated


@pytest.mark.slow
def test_zam_evaluates_as_the_code_before_the_move_did(tmp_path):
  """ZAM trained as the record's run (its sizes, not the suite's: 6 steps) scores and lists
  what the code before the role packages did, figure for figure (tests/golden.py)."""
  record = golden.golden_outputs()
  for mode in ('train', 'eval'):
    cli.run(tmp_path, *record.ZAM, mode=mode, config='configs/zam_aol.py:demo', with_tiny=False)
  golden.assert_unchanged_since_the_move('zam', tmp_path)


@pytest.mark.slow
def test_zam_resumes_bit_for_bit(zam_run):
  workdir, straight, resumed, _ = zam_run
  assert 'Resuming from' in resumed.stdout
  from mtn_jax.training import metric_writer  # pylint: disable=g-import-not-at-top
  a = metric_writer.read_metrics(str(workdir), 'train')
  b = metric_writer.read_metrics(str(straight), 'train')
  assert [r['loss'] for r in a] == [r['loss'] for r in b]
  assert ([r['loss'] for r in metric_writer.read_metrics(str(workdir), 'valid')][-1]
          == [r['loss'] for r in metric_writer.read_metrics(str(straight), 'valid')][-1])


@pytest.mark.slow
def test_zam_eval_reports_the_pool_and_the_history_groups(zam_run, tmp_path):
  workdir, _, _, evaluated = zam_run
  results = json.loads((workdir / 'eval' / 'first16_results.json').read_text())
  assert results['label'] == 'ZAM'
  pool = results['pool']
  assert pool['pairs'] == results['pairs'] and 0 < pool['pairs_in_pool'] <= pool['pairs']
  assert {'mrr', 'recall_at_10', 'r1_of_20', 'r1_of_100'} <= set(pool)
  groups = results['by_history']
  assert set(groups) == {'with_history', 'short_history', 'without_history'}
  assert sum(g['pairs'] for g in groups.values()) == results['pairs']
  assert 0 <= groups['with_history']['zero_weight']['all'] <= 1
  assert 'Over the whole pool: MRR' in evaluated.stdout
  # Eval's lists, under both protocols, are what decode writes for a log of those users'
  # sessions: the same queries in the same order, the same scores. The log holds each user's
  # earlier sessions (from every split), so decode attends over the history eval read.
  lists = workdir / 'eval' / 'first16_lists.jsonl'
  pairs = read_jsonl(lists)
  assert len(pairs) == results['pairs'] and groups['with_history']['pairs'] > 0
  pool_texts = set(candidate_pool.load_pool(str(workdir / 'data')).texts)
  for pair in pairs:  # pool entries, as many as asked for
    for key in ('suggestions', 'suggestions_excluding_session'):
      assert len(pair[key]) == 10 and {s['query'] for s in pair[key]} <= pool_texts
  assert_raw_log_decode_writes_what_eval_scored(workdir, lists, tmp_path, *FAMILY,
                                                config='configs/zam_aol.py:demo')
  # The candidate vectors were cached by eval and reused by decode.
  assert (workdir / 'candidate_cache' / 'meta.json').exists()


@pytest.mark.slow
def test_personalised_mtn_trains_and_evaluates_by_history(tmp_path):
  run = cli.run(tmp_path, '--config.model.name=mtn',
                '--config.model.user_memory=zero_attention', '--config.data.history_queries=8',
                '--config.data.split_by=time', '--config.train.max_steps=4',
                '--config.decode.max_eval_sessions=16', '--config.decode.top_k=3', mode='all')
  results = json.loads((tmp_path / 'eval' / 'first16_results.json').read_text())
  assert results['model_config']['user_memory'] == 'zero_attention'
  assert set(results['by_history']) == {'with_history', 'short_history', 'without_history'}
  assert 'with history' in run.stdout


@pytest.mark.parametrize('user_model', zam.USER_MODELS)
def test_only_hem_knows_its_users_by_id(user_model, tmp_path):
  """A request's `user` reaches a retriever of the family as the training user's id only
  for HEM (its user vectors); AEM and ZAM read the user's earlier queries (the service's
  history of them, or `past`), and QEM no user: an id given to them would change nothing."""
  from mtn_jax.serving import engine as engine_lib  # pylint: disable=g-import-not-at-top
  cfg = family_model(user_model)[0].config
  task = zero_attention.ZeroAttentionTask(cfg, data_dir=str(tmp_path),
                                           word_noise=np.zeros(20, np.float32))
  engine = types.SimpleNamespace(pipeline=types.SimpleNamespace(
      retriever=types.SimpleNamespace(trained=types.SimpleNamespace(task=task))))
  assert engine_lib.Engine.knows_users.fget(engine) is (user_model == 'hem')
  assert task.reads_users is (user_model != 'qem')
