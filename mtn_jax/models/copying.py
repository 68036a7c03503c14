"""Copying words of the session into a suggestion: a pointer-generator head (See et al. 2017).

Query suggestion on AOL is mostly reformulation: the next query reuses words of the session,
many of them too rare for the vocabulary (Dehghani et al., CIKM 2017, add a copy gate to an
HRED for this). At each decoder step a learned gate g mixes the vocabulary distribution with
an attention over the session's source tokens:

  P(w) = g P_vocab(w) + (1 - g) sum_{i: source_i = w} a_i,

so a word of the session outside the vocabulary can be written out too. Such words carry
per-session *extended ids* V + k (k-th distinct out-of-vocabulary word of the session, by first
appearance; `mtn_jax.data.extended`), which a batch holds as `oov` int32 [B, S, n] (0: a
vocabulary word or padding, k + 1: the k-th such word).

- `extended_queries(batch, vocab_size)`: the batch's queries in extended ids.
- `CopyHead`: (decoder hidden [N, T, d], memory with 'copy_tokens' [N, L, d], 'copy_mask'
  [N, L]) -> (gate logits [N, T], attention scores [N, T, L]); the copy keys are projected
  once per decode and kept in the 'cache' collection.
- `mixture_log_probs`: (vocabulary logits [N, T, V], gate logits, scores, copy ids [N, L])
  -> log P over the extended vocabulary [N, T, V + extra], for the search.
The attention here is computed on its own (one head), because `jax.nn.dot_product_attention`,
which the decoder layers use, returns no weights.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.models.base import Batch

# Scores of source positions the copy attention ignores: finite, so that a row with none (a
# padding row) stays finite, and far enough below any real score to weigh nothing.
MASKED_SCORE = -1e9


def oov_numbers(batch: Batch) -> jax.Array:
  """batch['oov'] int32 [B, S, n]; a batch without it has no word outside the vocabulary
  (an `<unk>` of its queries can then be copied as `<unk>` only)."""
  return batch['oov'] if 'oov' in batch else jnp.zeros_like(batch['queries'])


def extended_queries(batch: Batch, vocab_size: int) -> jax.Array:
  """int32 [B, S, n]: `queries` with each out-of-vocabulary word as its extended id."""
  oov = oov_numbers(batch)
  return jnp.where(oov > 0, vocab_size + oov - 1, batch['queries'])


def copyable_words(batch: Batch) -> jax.Array:
  """int32 [B, S]: how many of the session's out-of-vocabulary words queries 0..t hold.

  Numbered by first appearance, so it is the largest number seen so far: id V + k can be
  copied after query t iff k < this.
  """
  return jax.lax.cummax(oov_numbers(batch).max(-1), axis=1)


class CopyHead(nn.Module):
  """The copy gate and attention (see the module docstring).

  Attributes:
    features: the size of the attention's query and key projections.
    dtype: the compute dtype.
  """

  features: int
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, hidden: jax.Array, memory: dict, *, decode: bool = False
               ) -> tuple[jax.Array, jax.Array]:
    """hidden [N, T, d] -> (gate logits float32 [N, T], scores float32 [N, T, L])."""
    dense = lambda features, name: nn.Dense(features, dtype=self.dtype,
                                            param_dtype=jnp.float32, name=name)
    query = dense(self.features, 'query')(hidden)
    project_keys = lambda: dense(self.features, 'key')(memory['copy_tokens'])
    if decode:
      # Projected once, when the cache is made: the memory is the same at every step.
      keys = self.variable('cache', 'copy_keys', project_keys).value
    else:
      keys = project_keys()
    scores = jnp.einsum('ntd,nld->ntl', query, keys,
                        preferred_element_type=jnp.float32) / jnp.sqrt(self.features)
    scores = jnp.where(memory['copy_mask'][:, None, :], scores, MASKED_SCORE)
    attention = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
    context = jnp.einsum('ntl,nld->ntd', attention, memory['copy_tokens'].astype(self.dtype))
    gate = dense(1, 'gate')(jnp.concatenate([hidden.astype(self.dtype), context], axis=-1))
    return gate[..., 0].astype(jnp.float32), scores


def mixture_log_probs(logits: jax.Array, gate_logits: jax.Array, scores: jax.Array,
                      copy_ids: jax.Array, extended_size: int) -> jax.Array:
  """log P(w) of the copy mixture over the extended vocabulary.

  Args:
    logits: float32 [N, T, V] vocabulary logits.
    gate_logits: float32 [N, T].
    scores: float32 [N, T, L] copy attention scores (`MASKED_SCORE` where ignored).
    copy_ids: int [N, L] extended ids of the source positions (-1 where ignored).
    extended_size: V + the extended slots; ids of absent words get log P = -inf.
  Returns:
    float32 [N, T, extended_size].
  """
  vocab_size = logits.shape[-1]
  log_vocab = jax.nn.log_softmax(logits, axis=-1) + jax.nn.log_sigmoid(gate_logits)[..., None]
  log_vocab = jnp.pad(log_vocab, ((0, 0), (0, 0), (0, extended_size - vocab_size)),
                      constant_values=-jnp.inf)
  # Only the source's words get copy mass: update those L columns instead of adding a whole
  # [N, T, V'] copy distribution (a third of the decoding step's time on a CPU). A word at
  # several positions gets the sum of their attention, at each of them alike.
  log_attention = jax.nn.log_softmax(scores, axis=-1) + jax.nn.log_sigmoid(-gate_logits)[
      ..., None]  # [N, T, L]
  real = copy_ids >= 0
  same = (copy_ids[:, :, None] == copy_ids[:, None, :]) & real[:, None, :]  # [N, L, L]
  log_copied = jax.nn.logsumexp(jnp.where(same[:, None], log_attention[:, :, None, :],
                                          -jnp.inf), axis=-1)  # [N, T, L]
  ids = jnp.where(real, copy_ids, extended_size)  # ignored: dropped by the scatter
  rows = jnp.arange(ids.shape[0])[:, None, None]
  steps = jnp.arange(log_attention.shape[1])[None, :, None]
  at_source = jnp.take_along_axis(
      log_vocab, jnp.broadcast_to(jnp.minimum(ids, extended_size - 1)[:, None, :],
                                  log_copied.shape), axis=-1)
  return log_vocab.at[rows, steps, ids[:, None, :]].set(
      jnp.logaddexp(at_source, log_copied), mode='drop')
