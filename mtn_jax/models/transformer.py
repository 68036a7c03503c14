"""The Transformer baseline: previous queries joined by `<sep>` -> next query.

In: `queries` int32 [B, S, n] word ids, 0-padded. The source for session position t is
`q_0 <sep> q_1 <sep> ... q_t`, compacted (real tokens only, numbered 0, 1, 2, ...), exactly the
sequence a pair made on its own would give. All S sources of a session are built at once from
one compacted sequence and a per-position length, and folded into the batch:
  `session_sources`: -> sources int32 [B*S, L], mask bool [B*S, L], L = S*(n+1) - 1;
  `encode`: -> memory {'tokens': [B*S, L, d], 'mask': bool [B*S, L]}, row b*S + t = context
    of position t;
  `decode`: (memory, decoder inputs int32 [N, T']) -> float32 logits [N, T', V];
  `__call__`: -> float32 logits [B, S-1, n+1, V] for the pairs (queries 0..t -> query t+1).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.data.vocab import PAD_ID, SEP_ID
from mtn_jax.models import layers


def session_sources(queries: jax.Array) -> tuple[jax.Array, jax.Array]:
  """queries int32 [B, S, n] -> (sources int32 [B*S, L], mask bool [B*S, L]), L = S*(n+1) - 1.

  Row b*S + t holds `q_0 <sep> ... <sep> q_t` of session b from column 0, then padding.
  An empty query (a padding row) contributes neither words nor a `<sep>`.
  """
  batch, num_queries, _ = queries.shape
  lengths = (queries != PAD_ID).sum(-1)  # [B, S]
  # Each query gets a trailing <sep> slot, real when the query is not empty; the last
  # query's <sep> ends no source, so the compacted length drops that slot.
  with_sep = jnp.concatenate(
      [queries, jnp.full((batch, num_queries, 1), SEP_ID, queries.dtype)], axis=-1)
  real = jnp.concatenate([queries != PAD_ID, (lengths > 0)[..., None]], axis=-1)
  flat_tokens = with_sep.reshape(batch, -1)
  flat_real = real.reshape(batch, -1)
  # A stable sort on "is padding" moves the real tokens to the front, in order.
  order = jnp.argsort(~flat_real, axis=-1, stable=True)
  compact = jnp.take_along_axis(flat_tokens, order, axis=-1)[:, :-1]  # [B, L]
  # Source t holds the words and <sep>s of queries 0..t, less the <sep> that would follow
  # the last non-empty one of them.
  ends = (jnp.cumsum(lengths + (lengths > 0), axis=-1)
          - (jnp.cumsum(lengths, axis=-1) > 0))  # [B, S]
  mask = jnp.arange(compact.shape[-1]) < ends[..., None]  # [B, S, L]
  sources = jnp.where(mask, compact[:, None, :], PAD_ID)
  length = compact.shape[-1]
  return sources.reshape(batch * num_queries, length), mask.reshape(batch * num_queries, length)


class Transformer(layers.SessionEncoderDecoder):
  """Encoder (`query_layers` layers) + decoder (`decoder_layers`), one shared word embedding.

  Source positions are numbered over the compacted source (words and `<sep>`s alike), so a
  learned table needs `max_session_queries * (max_query_words + 1)` rows.
  """

  def setup(self):
    cfg = self.config
    self.word_embedding = layers.WordEmbedding(cfg)
    self.source_positions = layers.PositionEncoding(
        cfg, cfg.max_session_queries * (cfg.max_query_words + 1),
        'config.model.max_session_queries * (config.data.max_query_words + 1)')
    self.encoder = layers.LayerStack(cfg, cfg.query_layers)
    self.decoder = layers.Decoder(cfg, self.word_embedding)
    self.embedding_dropout = nn.Dropout(cfg.dropout)

  def encode(self, queries: jax.Array, *, train: bool = False) -> dict[str, jax.Array]:
    """queries int32 [B, S, n] -> {'tokens': [B*S, L, d], 'mask': bool [B*S, L]}."""
    sources, mask = session_sources(queries)
    x = self.word_embedding(sources) + self.source_positions(jnp.arange(sources.shape[-1]))
    x = self.embedding_dropout(x, deterministic=not train)
    x = self.encoder(x, layers.padding_mask(mask), train=train)
    return {'tokens': x, 'mask': mask}
