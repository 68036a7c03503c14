"""What every model shares: its frozen config, the pair layout of a session, size counting.

A session batch is `queries` int32 `[batch, S, n]` (0 = padding). Pair t (t = 0..S-2) predicts
query t+1 after queries 0..t. The decoder reads `<s>` + next query and predicts next query +
`</s>`, so its length is T = n + 1.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax.data.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Static model hyper-parameters (hashable, so modules can hold it)."""

  name: str
  vocab_size: int
  max_query_words: int  # n: tokens per query; MTN's query projection has n weights
  emb_dim: int
  d_model: int
  num_heads: int
  ff_dim: int
  query_layers: int
  session_layers: int
  num_levels: int
  decoder_layers: int
  dropout: float
  tie_embeddings: bool
  pre_norm: bool
  learned_positions: bool
  scan_layers: bool
  remat: str
  compute_dtype: str
  lstm_units: int
  max_session_queries: int

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int,
                  max_query_words: int) -> ModelConfig:
    fields = {f.name for f in dataclasses.fields(cls)} - {'vocab_size', 'max_query_words'}
    return cls(vocab_size=vocab_size, max_query_words=max_query_words,
               **{k: model[k] for k in fields})

  def replace(self, **changes) -> ModelConfig:
    return dataclasses.replace(self, **changes)

  @property
  def target_len(self) -> int:
    """T: decoder positions, the next query's words plus `</s>`."""
    return self.max_query_words + 1

  @property
  def dtype(self):
    return jnp.bfloat16 if self.compute_dtype == 'bfloat16' else jnp.float32


def decoder_io(queries: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Teacher-forcing inputs for every pair of a session batch.

  Args:
    queries: int32 [B, S, n] word ids, 0-padded.
  Returns:
    decoder_inputs: int32 [B, S-1, n+1], `<s>` + query t+1.
    targets: int32 [B, S-1, n+1], query t+1 + `</s>`, 0-padded.
    weights: float32 [B, S-1, n+1], 1 on real target tokens (`</s>` included); a pair whose
      next query is all padding (a padding row) weighs 0 everywhere.
  """
  nxt = queries[:, 1:]
  b, p, n = nxt.shape
  lengths = (nxt != PAD_ID).sum(-1)  # [B, S-1]
  padded = jnp.concatenate([nxt, jnp.zeros((b, p, 1), nxt.dtype)], axis=-1)
  positions = jnp.arange(n + 1)
  targets = jnp.where(positions == lengths[..., None], EOS_ID, padded)
  targets = jnp.where(lengths[..., None] > 0, targets, PAD_ID)
  decoder_inputs = jnp.concatenate([jnp.full((b, p, 1), BOS_ID, nxt.dtype), nxt], axis=-1)
  weights = (targets != PAD_ID).astype(jnp.float32)
  return decoder_inputs, targets, weights


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def size_mb(params) -> float:
  """Model size as the paper's Table 2 gives it: fp32 bytes, in MB (2**20 bytes)."""
  return count_params(params) * 4 / 2**20
