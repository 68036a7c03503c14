"""Exact values of the training losses on hand cases; the chunked loss equals the plain one."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mtn_jax.losses import chunked_token_losses, session_losses, token_losses
from mtn_jax.models import ModelConfig, create_model


def test_plain_cross_entropy():
  logits = jnp.array([[math.log(3.0), 0.0, -1e9, -1e9]])  # p = (3/4, 1/4, 0, 0)
  loss, nll = token_losses(logits, jnp.array([1]))
  np.testing.assert_allclose(nll, [math.log(4.0)], rtol=1e-6)
  np.testing.assert_allclose(loss, nll)


def test_label_smoothing_mixes_in_the_uniform_distribution():
  logits = jnp.zeros((1, 4))  # uniform: -log p = log 4 for every word
  loss, nll = token_losses(logits, jnp.array([2]), label_smoothing=0.1)
  np.testing.assert_allclose(loss, [math.log(4.0)], rtol=1e-6)
  logits = jnp.array([[math.log(3.0), 0.0, 0.0, 0.0]])  # p = (1/2, 1/6, 1/6, 1/6)
  loss, nll = token_losses(logits, jnp.array([0]), label_smoothing=0.2)
  expected = 0.8 * math.log(2.0) + 0.2 * (math.log(2.0) + 3 * math.log(6.0)) / 4
  np.testing.assert_allclose(loss, [expected], rtol=1e-6)
  np.testing.assert_allclose(nll, [math.log(2.0)], rtol=1e-6)


def test_entropy_regulariser_rewards_spread():
  logits = jnp.array([[math.log(3.0), 0.0, -1e9, -1e9]])  # p = (3/4, 1/4)
  entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  loss, nll = token_losses(logits, jnp.array([0]), entropy_weight=0.1)
  np.testing.assert_allclose(loss, [math.log(4 / 3) - 0.1 * entropy], rtol=1e-5)
  np.testing.assert_allclose(nll, [math.log(4 / 3)], rtol=1e-5)


def test_chunked_token_losses_equal_token_losses_for_every_chunking():
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(2, 3, 5, 4)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(4, 11)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 11, size=(2, 3, 5)), jnp.int32)
  logits = hidden @ kernel
  loss, nll = token_losses(logits, targets, label_smoothing=0.1, entropy_weight=0.1)
  correct = (logits.argmax(-1) == targets).astype(jnp.float32)
  assert 0 < correct.sum() < correct.size
  # 30 tokens: one per chunk, uneven chunks (7 -> 5 chunks of 6), exact, one chunk, oversize.
  for chunk_tokens in (1, 7, 10, 30, 64):
    chunked = chunked_token_losses(lambda h: h @ kernel, hidden, targets,
                                   chunk_tokens=chunk_tokens, label_smoothing=0.1,
                                   entropy_weight=0.1)
    for got, want in zip(chunked, (loss, nll, correct)):
      assert got.shape == targets.shape
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match='chunk_tokens must be at least 1'):
    chunked_token_losses(lambda h: h @ kernel, hidden, targets, chunk_tokens=0)


# Tiny models: XLA's compile time dominates, and its backend optimisations buy nothing.
jit = functools.partial(jax.jit, compiler_options={'xla_backend_optimization_level': 0})

TINY = ModelConfig(
    name='mtn', vocab_size=37, max_query_words=4, emb_dim=12, d_model=16, num_heads=2,
    ff_dim=16, query_layers=1, session_layers=1, num_levels=2, decoder_layers=1, dropout=0.1,
    share_embeddings=False, tie_embeddings=True, pre_norm=False, learned_positions=False,
    scan_layers=True, remat='none', compute_dtype='float32', lstm_units=4,
    max_session_queries=8)

# [batch=2, queries=3, tokens=4]; the second session ends in a padding row.
SESSIONS = jnp.array([[[5, 6, 0, 0], [7, 8, 9, 0], [10, 0, 0, 0]],
                      [[11, 12, 13, 14], [15, 0, 0, 0], [0, 0, 0, 0]]], jnp.int32)


def random_params(model):
  """A random draw of the model's parameter shapes: no initialiser to compile."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), SESSIONS, train=False))
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.5, s.shape), s.dtype),
                      shapes['params'])


@pytest.mark.parametrize('cfg', [TINY, TINY.replace(name='hred', tie_embeddings=False)],
                         ids=['mtn_tied', 'hred_untied'])
def test_chunked_session_losses_equal_plain_values_and_gradients(cfg):
  """Same dropout masks, same sums, same gradients: chunking changes only the memory used."""
  model = create_model(cfg)

  @jit
  def plain_and_chunked(params):
    def sums_and_grads(chunk_tokens):
      def mean_loss(params):
        sums = session_losses(model, params, SESSIONS, train=True,
                              rngs={'dropout': jax.random.key(1)}, label_smoothing=0.1,
                              entropy_weight=0.1, chunk_tokens=chunk_tokens)
        return sums['loss'] / sums['tokens'], sums
      return jax.grad(mean_loss, has_aux=True)(params)
    # 2 sessions x 2 pairs x 5 positions = 20 tokens: 7 per chunk gives 3 uneven chunks.
    return sums_and_grads(0), sums_and_grads(7)

  (plain_grads, plain), (chunked_grads, chunked) = plain_and_chunked(
      random_params(model))
  # Targets: [7 8 9 </s>], [10 </s>], [15 </s>], and a padding pair.
  assert float(plain['tokens']) == 8 and float(plain['pairs']) == 3
  for key in plain:
    np.testing.assert_allclose(chunked[key], plain[key], rtol=1e-5, atol=1e-5)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
               chunked_grads, plain_grads)
  assert float(optax.tree.norm(plain_grads)) > 0


def test_chunked_session_losses_in_bfloat16_match_plain():
  model = create_model(TINY.replace(compute_dtype='bfloat16'))
  plain, chunked = jit(lambda params: [session_losses(
      model, params, SESSIONS, train=False, label_smoothing=0.1, chunk_tokens=chunk_tokens)
      for chunk_tokens in (0, 6)])(random_params(model))
  assert all(x.dtype == jnp.float32 for x in chunked.values())
  for key in plain:
    np.testing.assert_allclose(chunked[key], plain[key], rtol=1e-3)
