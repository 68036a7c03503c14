"""The Multiresolution Transformer Network (paper Sec. 4, Fig. 1, Prop. 4).

MTN = `encoder_decoder.EncoderDecoder` with `MTNEncoder`, its config `MTNConfig`.

`MTNEncoder`: `queries` int32 [B, S, n] word ids of B sessions of S queries, 0-padded (n =
`max_query_words`) -> memory {'tokens': [B*S, n, d], 'mask': bool [B*S, n]}, row b*S + t =
the encoded tokens of query t (which carry the session context of queries 0..t) and their
real-token mask, the context for suggesting query t+1. The session encoder is causal, so one
pass gives every position's context. It is a module of its own, usable without a decoder.

n is part of the model, not of the batch: the query projection has one weight per token slot,
so every batch must be padded to exactly `max_query_words` tokens per query.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax import errors
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.models import layers
from mtn_jax.models.base import check_positive
from mtn_jax.models.dropout import Dropout


@dataclasses.dataclass(frozen=True, kw_only=True)
class MTNConfig(layers.TransformerConfig):
  """MTN's fields beside the Transformer's: K levels, each with its masked session encoder."""

  session_layers: int  # layers of each masked session encoder
  num_levels: int  # K: a K-level MTN stacks K-1 masked session encoders

  @classmethod
  def check(cls, model) -> None:
    super().check(model)
    check_session_levels(model, 'for MTN')


def check_session_levels(model, what: str) -> None:
  """Refuses session levels an MTN (`what`: 'for MTN', or an encoder built as one) cannot
  have: no layers, or fewer than two levels (the query encoder is the first)."""
  check_positive(model, 'session_layers')
  if model.num_levels < 2:
    raise errors.ConfigError(f'config.model.num_levels must be >= 2 {what}, '
                             f'got {model.num_levels}')


def layer_label(display_name: str, fields: dict) -> str:
  """The paper's Fig.-3 label, e.g. "MTN (3Q+2S, 3)": query-encoder layers, then each
  session level's layers, then decoder layers."""
  levels = [f'{fields["query_layers"]}Q'] + [f'{fields["session_layers"]}S'] * (
      fields['num_levels'] - 1)
  return f'{display_name} ({"+".join(levels)}, {fields["decoder_layers"]})'


class SessionLevel(nn.Module):
  """One level above the query encoder: tokens [B, S, n, d], mask [B, S, n] -> [B, S, n, d].

  Query projection (w_proj in R^n over the zero-padded token rows) -> + query-position
  encodings -> masked session encoder (query t sees queries 0..t) -> each token of query t
  gets its session vector added, then LayerNorm.
  """

  config: MTNConfig

  @nn.compact
  def __call__(self, tokens: jax.Array, token_mask: jax.Array, *, train: bool) -> jax.Array:
    cfg = self.config
    num_queries, num_tokens = tokens.shape[1], tokens.shape[2]
    # Std 1/sqrt(n) keeps the projected vector at the token vectors' scale, like a fan-in init.
    w_proj = self.param('query_projection', nn.initializers.normal(stddev=num_tokens**-0.5),
                        (num_tokens,), jnp.float32)
    zero_padded = jnp.where(token_mask[..., None], tokens, 0)
    query_vectors = jnp.einsum('bsnd,n->bsd', zero_padded, w_proj.astype(cfg.dtype))
    query_vectors += layers.PositionEncoding(
        cfg, cfg.max_session_queries, 'config.model.max_session_queries',
        name='query_positions')(jnp.arange(num_queries))
    dropout = Dropout(cfg.dropout, deterministic=not train)
    session = layers.LayerStack(cfg, cfg.session_layers, name='session_encoder')(
        dropout(query_vectors), layers.causal_mask(num_queries), train=train)
    # Dropout on the added branch, as on every sublayer output before its Add & Norm.
    return layers.layer_norm(cfg, 'add_norm')(tokens + dropout(session)[:, :, None, :])


class MTNEncoder(nn.Module):
  """MTN's encoder: a query encoder and K-1 session levels (no shared weights).

  K = `num_levels` (2 in the paper). Choices the paper leaves open, and the ones made here:
  w_proj has no bias and starts at N(0, 1/n); dropout (rate `dropout`) acts on the
  embeddings, the query vectors entering the session encoder, every sublayer output and the
  session vector before its Add & Norm; with `pre_norm`, each layer stack ends in a LayerNorm
  and the level's Add & Norm stays as it is. The word table is given (`embedding`), so that
  the decoder or a ranker's candidate encoder may share it.
  """

  config: MTNConfig
  embedding: layers.WordEmbedding

  def setup(self):
    cfg = self.config
    self.embedding_dropout = Dropout(cfg.dropout)
    self.token_positions = layers.PositionEncoding(cfg, cfg.max_query_words,
                                                   'config.data.max_query_words')
    self.query_encoder = layers.LayerStack(cfg, cfg.query_layers)
    self.session_levels = [SessionLevel(cfg) for _ in range(cfg.num_levels - 1)]

  def __call__(self, queries: jax.Array, *, train: bool = False) -> dict[str, jax.Array]:
    """queries int32 [B, S, n] -> {'tokens': [B*S, n, d], 'mask': bool [B*S, n]}."""
    cfg = self.config
    batch, num_queries, num_tokens = queries.shape
    if num_tokens != cfg.max_query_words:
      raise ValueError(f'MTN takes queries of exactly max_query_words={cfg.max_query_words} '
                       f'tokens (its query projection has one weight per token slot), got '
                       f'{num_tokens}')
    tokens = queries.reshape(batch * num_queries, num_tokens)
    token_mask = tokens != PAD_ID
    x = self.embedding(tokens) + self.token_positions(jnp.arange(num_tokens))
    x = self.embedding_dropout(x, deterministic=not train)
    # One set of query-encoder weights for every query: sessions fold into the batch.
    x = self.query_encoder(x, layers.padding_mask(token_mask), train=train)
    x = x.reshape(batch, num_queries, num_tokens, cfg.d_model)
    session_token_mask = token_mask.reshape(batch, num_queries, num_tokens)
    for level in self.session_levels:
      x = level(x, session_token_mask, train=train)
    return {'tokens': x.reshape(batch * num_queries, num_tokens, cfg.d_model),
            'mask': token_mask}

  def copy_source(self, memory: dict[str, jax.Array], source_ids: jax.Array
                  ) -> dict[str, jax.Array]:
    """What a copy head may copy after query t: every token of queries 0..t.

    The decoder's cross-attention reads query t's tokens alone (the paper's MTN), but a
    suggestion reuses words of the earlier queries too; each of their tokens already carries
    the session context up to its own query, and none of a later one, so copying from them
    keeps row b*S + t causal.

    Args:
      memory: this encoder's output, 'tokens' [B*S, n, d] and 'mask' [B*S, n].
      source_ids: int32 [B, S, n] the queries' extended ids.
    Returns:
      'copy_tokens' [B*S, S*n, d], 'copy_mask' bool [B*S, S*n], 'copy_ids' int32 [B*S, S*n]
      (-1 where masked).
    """
    batch, num_queries, num_tokens = source_ids.shape
    width = num_queries * num_tokens
    tokens = memory['tokens'].reshape(batch, 1, width, -1)  # broadcast over rows t below
    query_of_slot = jnp.arange(width) // num_tokens
    seen = query_of_slot[None, :] <= jnp.arange(num_queries)[:, None]  # [S, S*n]
    mask = memory['mask'].reshape(batch, 1, width) & seen[None]  # [B, S, S*n]
    ids = jnp.where(mask, source_ids.reshape(batch, 1, width), -1)
    rows = batch * num_queries
    # Zeros where masked: a row's memory then holds nothing of later queries at all.
    tokens = jnp.where(mask[..., None], tokens, 0)
    return {'copy_tokens': tokens.reshape(rows, width, -1),
            'copy_mask': mask.reshape(rows, width),
            'copy_ids': ids.reshape(rows, width).astype(jnp.int32)}
