"""What every model shares: its frozen config, the pair layout of a session, size counting.

A session batch is `queries` int32 `[batch, S, n]` (0 = padding). Pair t (t = 0..S-2) predicts
query t+1 after queries 0..t. The decoder reads `<s>` + next query and predicts next query +
`</s>`, so its length is T = n + 1.

- `decoder_io`: queries [B, S, n] -> decoder inputs, targets, weights [B, S-1, T].
- `session_sources`: queries [B, S, n] -> `q_0 <sep> ... <sep> q_t` sources [B*S, L] and their
  lengths [B*S], L = S*(n+1) - 1: the flat source of the Transformer and Seq2Seq baselines.
- `SessionModel`: the entry points every model has, given its `encode`, `decode_hidden`,
  `output_logits` and `output_layer_names` (N decoder rows, T' steps, H hidden features,
  V words):
    `encode(queries int32 [B, S, n], *, train=False)` -> memory, leaves leading with B*S;
    `decode_hidden(memory, decoder_inputs int32 [N, T'], *, train=False, decode=False)`
      -> hidden [N, T', H], what the output layer reads (dropout included);
    `output_logits(hidden [..., H])` -> float32 logits [..., V];
    `decode(memory, decoder_inputs [N, T'], *, train=False, decode=False)` -> [N, T', V];
    `session_hidden(queries [B, S, n], *, train)` -> hidden [B, S-1, T, H] of every pair;
    `__call__(queries [B, S, n], *, train)` -> float32 logits [B, S-1, T, V].
  Splitting hidden states from the output layer lets the loss project them to the vocabulary
  a chunk of real target tokens at a time (`mtn_jax.losses.session_losses`); it reads the
  output layer's parameters from the subtrees `output_layer_names()` names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax.data.vocab import BOS_ID, EOS_ID, PAD_ID, SEP_ID


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
  share_embeddings: bool  # one word table for encoder and decoder (False: one each)
  tie_embeddings: bool  # the output layer reuses the decoder's word table
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


def session_sources(queries: jax.Array) -> tuple[jax.Array, jax.Array]:
  """For each session position t, queries 0..t joined by `<sep>` into one flat source.

  Args:
    queries: int32 [B, S, n] word ids, 0-padded.
  Returns:
    sources: int [B * S, L], L = S * (n + 1) - 1, the dtype of `queries`: row b * S + t holds
      `q_0 <sep> q_1 ... <sep> q_t` of session b from column 0 with no padding gaps, then
      padding. An empty query (a padding row) adds neither words nor a `<sep>`, so its source
      equals that of the last real query before it.
    lengths: int32 [B * S], real tokens of each source.
  """
  batch, num_queries, num_tokens = queries.shape
  query_lengths = (queries != PAD_ID).sum(-1)  # [B, S]
  # Each query gets a trailing <sep> slot, real when the query is not empty.
  with_sep = jnp.concatenate(
      [queries, jnp.full((batch, num_queries, 1), SEP_ID, queries.dtype)], axis=-1)
  real = jnp.concatenate([queries != PAD_ID, (query_lengths > 0)[..., None]], axis=-1)
  flat_tokens = with_sep.reshape(batch, num_queries * (num_tokens + 1))
  flat_real = real.reshape(batch, num_queries * (num_tokens + 1))
  # A stable sort on "is padding" moves the real tokens to the front, in session order. The
  # last query's <sep> ends no source, so the compacted length drops that slot.
  order = jnp.argsort(~flat_real, axis=-1, stable=True)
  session_tokens = jnp.take_along_axis(flat_tokens, order, axis=-1)[:, :-1]  # [B, L]
  # Source t ends where the <sep> after its last non-empty query would start.
  ends = jnp.cumsum(query_lengths + (query_lengths > 0), axis=-1) - 1  # [B, S]
  lengths = jnp.maximum(ends, 0).astype(jnp.int32)
  is_source = jnp.arange(session_tokens.shape[-1]) < lengths[..., None]  # [B, S, L]
  sources = jnp.where(is_source, session_tokens[:, None], PAD_ID)
  return sources.reshape(batch * num_queries, -1), lengths.reshape(batch * num_queries)


def word_embeddings(config: ModelConfig, make_table: Callable[..., nn.Module]
                    ) -> tuple[nn.Module, nn.Module]:
  """(encoder's, decoder's) word tables, made by `make_table(name=...)` inside a `setup`.

  With `config.share_embeddings` both are one module, 'word_embedding'; otherwise the encoder
  and decoder each learn their own, 'encoder_embedding' and 'decoder_embedding', as in the
  paper's (standard Transformer) setup with separate source and target embeddings.
  """
  if config.share_embeddings:
    table = make_table(name='word_embedding')
    return table, table
  return make_table(name='encoder_embedding'), make_table(name=decoder_table_name(config))


def decoder_table_name(config: ModelConfig) -> str:
  """The parameter subtree of the decoder's word table (see `word_embeddings`)."""
  return 'word_embedding' if config.share_embeddings else 'decoder_embedding'


class SessionModel(nn.Module):
  """The session-level entry points, shared by every model (see the module docstring).

  A subclass defines `encode`, CAUSAL over queries (row b*S + t of its memory depends on
  queries 0..t of session b only), `decode_hidden`, `output_logits` and
  `output_layer_names`.
  """

  config: ModelConfig

  def output_layer_names(self) -> tuple[str, ...]:
    """The top-level parameter subtrees `output_logits` reads, and no others.

    The training loss differentiates the output layer inside its own loop over chunks of
    tokens (`mtn_jax.losses.output_layer_losses`) and hands it these subtrees only.
    """
    raise NotImplementedError

  def decode(self, memory, decoder_inputs: jax.Array, *, train: bool = False,
             decode: bool = False) -> jax.Array:
    """Memory of N rows, decoder_inputs int32 [N, T'] -> float32 logits [N, T', V].

    With `decode`, the call that creates the 'cache' collection (inputs [N, max_len])
    computes as without it; later calls take one step [N, 1] each and continue from it.
    """
    return self.output_logits(self.decode_hidden(memory, decoder_inputs, train=train,
                                                 decode=decode))

  def session_hidden(self, queries: jax.Array, *, train: bool) -> jax.Array:
    """queries int32 [B, S, n] -> hidden [B, S-1, n+1, H] of the pairs t = 0..S-2."""
    if queries.ndim != 3 or not jnp.issubdtype(queries.dtype, jnp.integer):
      raise ValueError(f'queries must be integer word ids [batch, queries, tokens], '
                       f'got shape {queries.shape} and dtype {queries.dtype}')
    batch, num_queries, _ = queries.shape
    if num_queries < 2:
      raise ValueError(f'a session batch needs at least 2 queries per session to form a '
                       f'(previous queries -> next query) pair, got {num_queries}')
    # Position t's context reads queries 0..t only, so the last query, which no pair reads as
    # context, is left out of the encoder rather than encoded and discarded.
    memory = self.encode(queries[:, :-1], train=train)
    decoder_inputs, _, _ = decoder_io(queries)
    hidden = self.decode_hidden(memory, decoder_inputs.reshape(batch * (num_queries - 1), -1),
                                train=train)
    return hidden.reshape(batch, num_queries - 1, *hidden.shape[1:])

  def __call__(self, queries: jax.Array, *, train: bool) -> jax.Array:
    """queries int32 [B, S, n] -> float32 logits [B, S-1, n+1, V] for pairs 0..S-2."""
    return self.output_logits(self.session_hidden(queries, train=train))


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


def size_mb(params) -> float:
  """Model size as the paper's Table 2 gives it: fp32 bytes, in MB (2**20 bytes)."""
  return count_params(params) * 4 / 2**20
