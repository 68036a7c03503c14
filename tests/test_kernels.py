"""The GPU kernel choices of `config.model.kernels` compute the function XLA's kernels do.

What a CPU can run: the loss head's bfloat16 gradient products against float32 ones, the
even-length padding of the cuDNN attention path through XLA's attention, the Pallas layer
norm in interpret mode against nn.LayerNorm; and the GPU-only choices refused on a CPU.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from mtn_jax import errors
from mtn_jax.models import create_model
from mtn_jax.models import layers
from mtn_jax.models import make_config

from tests.test_models import BASE
from tests.test_models import make_queries

BF16 = BASE.replace(compute_dtype='bfloat16')


def relative_error(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


@pytest.mark.parametrize('contract_rhs', [0, 1])
def test_bf16_head_grads_keep_the_logits_and_round_only_the_gradient_products(contract_rhs):
  keys = jax.random.split(jax.random.key(0), 3)
  lhs = jax.random.normal(keys[0], (2, 7, 24), jnp.float32).astype(jnp.bfloat16)
  rhs_shape = (24, 40) if contract_rhs == 0 else (40, 24)
  rhs = jax.random.normal(keys[1], rhs_shape, jnp.float32).astype(jnp.bfloat16)
  cotangent = jax.random.normal(keys[2], (2, 7, 40), jnp.float32)
  plain = layers._logits_dot(lhs, rhs, contract_rhs)  # pylint: disable=protected-access
  low, pullback = jax.vjp(
      lambda a, b: layers._logits_dot_low_precision_grads(a, b, contract_rhs), lhs, rhs)  # pylint: disable=protected-access
  assert low.dtype == jnp.float32
  np.testing.assert_array_equal(low, plain)  # the forward pass is untouched
  d_lhs, d_rhs = pullback(cotangent)
  assert d_lhs.dtype == d_rhs.dtype == jnp.bfloat16
  # The reference: float32 products of the same (bfloat16) operands.
  _, reference = jax.vjp(
      lambda a, b: layers._logits_dot(a, b, contract_rhs),  # pylint: disable=protected-access
      lhs.astype(jnp.float32), rhs.astype(jnp.float32))
  want_lhs, want_rhs = reference(cotangent)
  # Rounding the gradient and the results to bfloat16 (8 bits of mantissa) costs about 2**-8.
  assert relative_error(d_lhs, want_lhs) < 1e-2
  assert relative_error(d_rhs, want_rhs) < 1e-2


@pytest.mark.parametrize('tied', [False, True])
def test_a_model_with_bf16_head_grads_scores_alike_and_learns_from_close_gradients(tied):
  cfg = BF16.replace(tie_embeddings=tied, emb_dim=12 if tied else 16)
  queries = make_queries(3)
  model = create_model(cfg)
  params = model.init(jax.random.key(1), {'queries': queries}, train=False)['params']
  scores = lambda c, p: create_model(c).apply({'params': p}, {'queries': queries}, train=False)
  weights = jax.random.normal(jax.random.key(2), scores(cfg, params).shape, jnp.float32)
  loss = lambda c: jax.value_and_grad(lambda p: (scores(c, p) * weights).sum())(params)
  (value, grads), (value_low, grads_low) = loss(cfg), loss(cfg.replace(kernels='bf16_head_grads'))
  assert value_low == value
  assert jax.tree.map(lambda g: g.dtype, grads_low) == jax.tree.map(lambda g: g.dtype, grads)
  flat = lambda tree: np.concatenate([np.ravel(g) for g in jax.tree.leaves(tree)])
  assert relative_error(flat(grads_low), flat(grads)) < 2e-2
  # The output layer's own gradient; others (the attention keys' biases, whose exact
  # gradient is 0) may be rounding noise in either.
  head = 'decoder_embedding' if tied else 'logits'
  assert relative_error(flat(grads_low[head]), flat(grads[head])) < 2e-2


def attention_inputs(seed, length, keys):
  rng = jax.random.split(jax.random.key(seed), 3)
  query = jax.random.normal(rng[0], (2, length, 2, 8), jnp.float32)
  key = jax.random.normal(rng[1], (2, keys, 2, 8), jnp.float32)
  value = jax.random.normal(rng[2], (2, keys, 2, 8), jnp.float32)
  return query, key, value


@pytest.mark.parametrize('length,keys,mask', [
    (5, 7, 'full'),  # [B, 1, T, L], every row with a key to attend to
    (5, 5, 'causal'),  # [1, 1, T, T]
    (4, 7, 'padding'),  # [B, 1, 1, L]
    (6, 8, 'padding'),  # even already: nothing padded
])
def test_even_length_attention_is_the_attention_of_the_unpadded_sequences(length, keys, mask,
                                                                         monkeypatch):
  query, key, value = attention_inputs(length + keys, length, keys)
  attention = jax.nn.dot_product_attention
  shapes = []

  def record_shapes(q, k, v, *, mask, implementation):
    shapes.append((q.shape[1], k.shape[1], mask.shape[2:]))
    return attention(q, k, v, mask=mask, implementation=implementation)
  rng = np.random.default_rng(length * keys)
  if mask == 'full':
    allowed = rng.random((2, 1, length, keys)) < 0.5
    allowed[..., 0] = True
  elif mask == 'causal':
    allowed = np.asarray(layers.causal_mask(length))
  else:
    allowed = np.arange(keys) < np.array([keys - 2, 3])[:, None]
    allowed = np.asarray(layers.padding_mask(jnp.asarray(allowed)))
  allowed = jnp.asarray(allowed)

  def attend(q, k, v, padded):
    if padded:
      return layers.even_length_attention(q, k, v, allowed, implementation='xla')
    return attention(q, k, v, mask=allowed, implementation='xla')

  cotangent = jax.random.normal(jax.random.key(9), query.shape, jnp.float32)
  results = []
  for padded in (False, True):
    out, pullback = jax.vjp(lambda q, k, v, p=padded: attend(q, k, v, p), query, key, value)
    results.append((out, *pullback(cotangent)))
  for got, want in zip(results[1], results[0]):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # What cuDNN takes: even lengths, and the mask as a bias of exactly those lengths.
  monkeypatch.setattr(jax.nn, 'dot_product_attention', record_shapes)
  layers.even_length_attention(query, key, value, allowed, implementation='xla')
  [(rows, columns, mask_shape)] = shapes
  assert rows % 2 == 0 and columns % 2 == 0 and mask_shape == (rows, columns)


def test_the_pallas_layer_norm_is_nn_layer_norm():
  x = jax.random.normal(jax.random.key(4), (2, 3, 16), jnp.float32) * 3 + 1
  scale = jax.random.normal(jax.random.key(5), (16,), jnp.float32)
  bias = jax.random.normal(jax.random.key(6), (16,), jnp.float32)
  cotangent = jax.random.normal(jax.random.key(7), x.shape, jnp.float32)
  flax_norm = nn.LayerNorm(epsilon=layers.LAYER_NORM_EPSILON)
  reference = lambda x, s, b: flax_norm.apply({'params': {'scale': s, 'bias': b}}, x)
  fused = lambda x, s, b: layers.fused_layer_norm(x, s, b, interpret=True)
  results = []
  for norm in (reference, fused):
    out, pullback = jax.vjp(norm, x, scale, bias)
    results.append((out, *pullback(cotangent)))
  for got, want in zip(results[1], results[0]):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() == 'gpu', reason='a GPU runs them')
@pytest.mark.parametrize('kernels,cfg', [('fused_norm', BASE), ('cudnn_attention', BF16)])
def test_gpu_only_kernels_are_refused_on_another_backend(kernels, cfg):
  model = create_model(cfg.replace(kernels=kernels))
  with pytest.raises(errors.ConfigError, match=rf"kernels='{kernels}' runs on an NVIDIA GPU "
                     "only; this run's JAX backend is 'cpu'"):
    model.init(jax.random.key(0), {'queries': make_queries(0)}, train=False)


@pytest.mark.parametrize('kernels,dtype,message', [
    ('bf16_head_grads, fused_norm', 'bfloat16', None),
    ('', 'float32', None),
    ('flash', 'bfloat16', "config.model.kernels: unknown 'flash'"),
    ('cudnn_attention', 'float32', "kernels='cudnn_attention' needs "
     "config.model.compute_dtype='bfloat16'"),
])
def test_the_kernels_key_is_checked(kernels, dtype, message):
  config = default.get_config('mtn')
  config.model.kernels, config.model.compute_dtype = kernels, dtype
  check = lambda: make_config(config.model, vocab_size=50, max_query_words=5).check(
      config.model)
  if message is None:
    check()
  else:
    with pytest.raises(errors.ConfigError, match=message):
      check()
