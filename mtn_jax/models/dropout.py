"""Dropout whose random bits cost a quarter of `flax.linen.Dropout`'s, for every model.

`Dropout(rate)`: x [..., d] -> x [..., d] with each element zeroed independently and the
kept ones scaled so that the expectation is x; the 'dropout' rng collection and the
`deterministic` switch work as for `nn.Dropout`.

Hand-written because the drop decisions are the costliest part of dropout, and the library
path spends far more on them than they need: `jax.random.bernoulli` draws 32 bits per element
from a whole Threefry-2x32 block (64 bits; the two words are XOR-ed in the partitionable mode
JAX uses by default), and on CPUs JAX lowers Threefry as a rolled loop that streams every
intermediate through memory five times. Here the same hash (`threefry_2x32`, bit for bit
JAX's, Salmon et al. 2011) is written out unrolled, which XLA fuses into one elementwise
kernel on any backend, and each block feeds four elements with 16 bits each. The drop
probability is then `rate` rounded to a multiple of 2**-16 (0.1 -> 0.1000061) and the scale is
the exact inverse of the keep probability. The demo config's training step is faster with
these masks than with `nn.Dropout`'s (docs/PERFORMANCE.md, "Hand-written code against the
library way").

Counters are the element's position in a [..., ceil(d / 4)] grid built from iotas along each
axis, so a mask over a batch-sharded array is computed shard by shard, like the
partitionable library version.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)
_DRAWS = 2**16  # a 16-bit draw per element


def threefry_2x32(key: tuple[jax.Array, jax.Array], x1: jax.Array, x2: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds: key words k1, k2 uint32 [], counters uint32 [...] -> two
  uint32 words [...], equal to `jax.extend.random.threefry_2x32`'s, elementwise."""
  k1, k2 = key
  keys = (k1, k2, k1 ^ k2 ^ _KEY_PARITY)
  x1, x2 = x1 + k1, x2 + k2
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = x1 ^ ((x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r)))
    x1 = x1 + keys[(i + 1) % 3]
    x2 = x2 + keys[(i + 2) % 3] + np.uint32(i + 1)
  return x1, x2


def _key_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Two uint32 key words: a Threefry key's own (raw uint32 [2] or typed), else drawn."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    data = jax.random.key_data(key)
    if data.shape != (2,):  # another implementation's key: derive two words from it
      data = jax.random.bits(key, (2,), jnp.uint32)
  else:
    data = key
  return data[0], data[1]


def random_uint16(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Independent uniform 16-bit draws, uint32 [*shape] in [0, 2**16), from a PRNG key."""
  if not shape:
    return random_uint16(key, (1,))[0]
  *lead, last = shape
  blocks = -(-last // 4)
  grid = (*lead, blocks)
  # The block's row-major position from per-axis iotas (shardable along any axis).
  counter = jnp.zeros(grid, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(grid))):
    counter = counter + jax.lax.broadcasted_iota(jnp.uint32, grid, axis) * np.uint32(stride)
    stride *= grid[axis]
  if stride > 2**32:
    raise ValueError(f'random_uint16: {shape} needs more than 2**32 counters')
  y1, y2 = threefry_2x32(_key_words(key), counter, jnp.zeros_like(counter))
  low16 = np.uint32(0xFFFF)
  draws = jnp.concatenate([y1 & low16, y1 >> 16, y2 & low16, y2 >> 16], axis=-1)
  return draws[..., :last]


class Dropout(nn.Module):
  """Inverted dropout: x [...] -> [...], each element zeroed with probability `rate` (rounded
  to a multiple of 2**-16) and the others scaled by 1 / (1 - that probability)."""

  rate: float
  deterministic: bool | None = None

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool | None = None) -> jax.Array:
    deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    threshold = round(self.rate * _DRAWS)  # drop where the draw falls below
    if deterministic or threshold == 0:
      return x
    if threshold >= _DRAWS:
      return jnp.zeros_like(x)
    keep = random_uint16(self.make_rng('dropout'), x.shape) >= np.uint32(threshold)
    return jnp.where(keep, x * (_DRAWS / (_DRAWS - threshold)), 0).astype(x.dtype)
