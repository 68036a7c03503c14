"""The Transformer baseline: previous queries joined by `<sep>` -> next query.

In: `queries` int32 [B, S, n] word ids, 0-padded. The source for session position t is
`q_0 <sep> q_1 <sep> ... q_t`, compacted (real tokens only, numbered 0, 1, 2, ...), exactly the
sequence a pair made on its own would give. All S sources of a session are built at once
(`mtn_jax.models.base.session_sources`: [B*S, L], L = S*(n+1) - 1) and folded into the batch:
  `encode`: -> memory {'tokens': [B*S, L, d], 'mask': bool [B*S, L]}, row b*S + t = context
    of position t;
  `decode`: (memory, decoder inputs int32 [N, T']) -> float32 logits [N, T', V];
  `__call__`: -> float32 logits [B, S-1, n+1, V] for the pairs (queries 0..t -> query t+1);
  `decode_hidden` / `session_hidden`: the decoder's states [N, T', d] / [B, S-1, n+1, d]
    before `output_logits` maps them to float32 logits [..., V].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mtn_jax.models import layers
from mtn_jax.models.base import session_sources


class Transformer(layers.SessionEncoderDecoder):
  """Encoder (`query_layers` layers) + decoder (`decoder_layers`); word tables as MTN's.

  Source positions are numbered over the compacted source (words and `<sep>`s alike), so a
  learned table needs `max_session_queries * (max_query_words + 1)` rows.
  """

  def setup(self):
    super().setup()
    cfg = self.config
    self.source_positions = layers.PositionEncoding(
        cfg, cfg.max_session_queries * (cfg.max_query_words + 1),
        'config.model.max_session_queries * (config.data.max_query_words + 1)')
    self.encoder = layers.LayerStack(cfg, cfg.query_layers)

  def encode(self, queries: jax.Array, *, train: bool = False) -> dict[str, jax.Array]:
    """queries int32 [B, S, n] -> {'tokens': [B*S, L, d], 'mask': bool [B*S, L]}."""
    sources, lengths = session_sources(queries)
    mask = jnp.arange(sources.shape[-1]) < lengths[:, None]
    x = self.encoder_embedding(sources) + self.source_positions(jnp.arange(sources.shape[-1]))
    x = self.embedding_dropout(x, deterministic=not train)
    x = self.encoder(x, layers.padding_mask(mask), train=train)
    return {'tokens': x, 'mask': mask}
