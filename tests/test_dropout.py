"""The models' dropout: JAX's Threefry bit for bit, the configured rate, an unbiased scale,
reproducible masks from a key, and no effect when deterministic."""

import jax
import jax.extend.random as jax_random
import jax.numpy as jnp
import numpy as np
import pytest

from mtn_jax.models.dropout import Dropout

from mtn_jax.models.dropout import random_uint16

from mtn_jax.models.dropout import threefry_2x32


def test_threefry_is_jax_threefry_bit_for_bit():
  counters = jnp.arange(2 * 1000, dtype=jnp.uint32) * np.uint32(2654435761)
  for key in ([0, 0], [123, 456], [0xFFFFFFFF, 0x9E3779B9]):
    key = jnp.asarray(key, jnp.uint32)
    want = jax_random.threefry_2x32(key, counters)
    got = jnp.concatenate(threefry_2x32((key[0], key[1]), counters[:1000], counters[1000:]))
    np.testing.assert_array_equal(got, want)


def test_draws_are_uniform_16_bit_and_depend_on_key_and_position():
  key = jax.random.key(0)
  draws = np.asarray(jax.jit(random_uint16, static_argnums=1)(key, (64, 11, 63)))
  assert draws.shape == (64, 11, 63) and draws.max() < 2**16
  # 44,352 draws in 16 bins of 4,096 values: each bin within 5 standard deviations.
  counts = np.bincount(draws.ravel() >> 12, minlength=16)
  expected = draws.size / 16
  assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected)), counts
  assert len(np.unique(draws)) > 0.45 * draws.size  # no repeated blocks or rows
  np.testing.assert_array_equal(random_uint16(key, (64, 11, 63)), draws)
  assert np.mean(np.asarray(random_uint16(jax.random.key(1), (64, 11, 63))) == draws) < 0.01
  assert random_uint16(key, ()).shape == ()


@pytest.mark.parametrize('rate', [0.1, 0.3])
def test_drop_rate_and_expectation(rate):
  x = jnp.full((200, 50, 64), 2.0, jnp.float32)
  y = np.asarray(Dropout(rate).apply({}, x, deterministic=False,
                                     rngs={'dropout': jax.random.key(3)}))
  dropped = np.mean(y == 0)
  # 640,000 elements: the standard deviation of the fraction is below 6e-4.
  assert abs(dropped - rate) < 3e-3
  kept = y[y != 0]
  threshold = round(rate * 2**16)
  np.testing.assert_allclose(kept, 2.0 * 2**16 / (2**16 - threshold), rtol=1e-6)
  assert abs(y.mean() - 2.0) < 0.02


def test_deterministic_zero_rate_dtype_and_reproducibility():
  x = jnp.arange(1.0, 97.0, dtype=jnp.bfloat16).reshape(2, 3, 16)
  apply = lambda rate, key, det: Dropout(rate).apply({}, x, deterministic=det,
                                                     rngs={'dropout': jax.random.key(key)})
  assert apply(0.5, 0, True) is x
  assert apply(0.0, 0, False) is x
  y = apply(0.5, 0, False)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_array_equal(y, apply(0.5, 0, False))
  assert not np.array_equal(np.asarray(y), np.asarray(apply(0.5, 1, False)))
  np.testing.assert_array_equal(apply(1.0, 0, False), jnp.zeros_like(x))


def test_raw_typed_and_other_keys():
  """A raw uint32 [2] key and the typed Threefry key with the same data give the same draws;
  a key of another implementation works too."""
  typed = random_uint16(jax.random.key(7), (5, 9))
  np.testing.assert_array_equal(random_uint16(jax.random.PRNGKey(7), (5, 9)), typed)
  other = random_uint16(jax.random.key(7, impl='rbg'), (5, 9))
  assert other.shape == (5, 9) and not np.array_equal(np.asarray(other), np.asarray(typed))


def test_an_element_is_dropped_exactly_where_its_draw_falls_below_the_threshold(monkeypatch):
  """The drop probability is the rate rounded to a multiple of 2**-16, exactly: an element goes
  iff its 16-bit draw is below round(rate * 2**16), and a draw equal to it keeps the element.
  The rate is set to one of the module's own draws, so that the boundary is met."""
  from mtn_jax.models import dropout  # pylint: disable=g-import-not-at-top
  draws = []

  def recorded(key, shape):
    draws.append(np.asarray(random_uint16(key, shape)))
    return jnp.asarray(draws[-1])

  monkeypatch.setattr(dropout, 'random_uint16', recorded)
  x = jnp.full((8, 64), 3.0, jnp.float32)
  apply = lambda rate: np.asarray(Dropout(rate).apply({}, x, deterministic=False,
                                                      rngs={'dropout': jax.random.key(5)}))
  apply(0.5)
  threshold = int(draws[0][0, 0])
  assert 0 < threshold < 2**16
  y = apply(threshold / 2**16)
  np.testing.assert_array_equal(draws[1], draws[0])  # the same key: the same draws
  np.testing.assert_array_equal(y == 0, draws[0] < threshold)
  assert y[0, 0] != 0
  np.testing.assert_allclose(y[y != 0], 3.0 * 2**16 / (2**16 - threshold), rtol=1e-6)
