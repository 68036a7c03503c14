"""The kernel choice of `config.model.kernels` computes the function XLA's kernels do.

The loss head's bfloat16 gradient products against float32 ones, in the product alone and in
a model's gradients; and the `kernels` key checked: an unknown choice (among them those
measured slower on a GPU and removed) refused by name, bfloat16 compute required.
"""

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
  # Both gradient products take bfloat16 operands (the point: float32 ones are the slow kind).
  products = [eqn for eqn in jax.make_jaxpr(pullback)(cotangent).jaxpr.eqns
              if eqn.primitive.name == 'dot_general']
  assert len(products) == 2
  assert all(v.aval.dtype == jnp.bfloat16 for eqn in products for v in eqn.invars)
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
  # Jitted: op by op, each of the model's hundreds of operations is a program to compile.
  params = jax.jit(lambda k: model.init(k, {'queries': queries}, train=False))(
      jax.random.key(1))['params']
  scores = lambda c, p: create_model(c).apply({'params': p}, {'queries': queries}, train=False)
  shape = jax.eval_shape(lambda p: scores(cfg, p), params).shape
  weights = jax.random.normal(jax.random.key(2), shape, jnp.float32)
  loss = lambda c: jax.jit(jax.value_and_grad(lambda p: (scores(c, p) * weights).sum()))(params)
  (value, grads), (value_low, grads_low) = loss(cfg), loss(cfg.replace(kernels='bf16_head_grads'))
  assert value_low == value
  assert jax.tree.map(lambda g: g.dtype, grads_low) == jax.tree.map(lambda g: g.dtype, grads)
  flat = lambda tree: np.concatenate([np.ravel(g) for g in jax.tree.leaves(tree)])
  assert relative_error(flat(grads_low), flat(grads)) < 2e-2
  # The output layer's own gradient; others (the attention keys' biases, whose exact
  # gradient is 0) may be rounding noise in either.
  head = 'decoder_embedding' if tied else 'logits'
  assert relative_error(flat(grads_low[head]), flat(grads[head])) < 2e-2
  # ... and rounded: the kernel choice took effect (ignored, the gradients would be the same).
  assert not np.array_equal(flat(grads_low[head]), flat(grads[head]))


@pytest.mark.parametrize('kernels,dtype,message', [
    ('bf16_head_grads', 'bfloat16', None),
    (' bf16_head_grads, ', 'bfloat16', None),
    ('', 'float32', None),
    ('flash', 'bfloat16', "config.model.kernels: unknown 'flash'"),
    # Measured slower than XLA's kernels on a GPU and removed: refused like any unknown one.
    ('bf16_head_grads, fused_norm', 'bfloat16',
     r"config.model.kernels: unknown 'fused_norm' \(comma-separated, of bf16_head_grads; "
     r"'' for none\)"),
    ('cudnn_attention', 'bfloat16', "config.model.kernels: unknown 'cudnn_attention'"),
    ('bf16_head_grads', 'float32', "config.model.kernels='bf16_head_grads' needs "
     "config.model.compute_dtype='bfloat16', got 'float32'"),
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
