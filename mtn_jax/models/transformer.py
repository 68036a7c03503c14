"""The Transformer baseline: previous queries joined by `<sep>` -> next query.

The Transformer = `encoder_decoder.EncoderDecoder` with `FlatSessionEncoder`; its config is
`layers.TransformerConfig`.

`FlatSessionEncoder`: `queries` int32 [B, S, n] word ids, 0-padded -> memory {'tokens':
[B*S, L, d], 'mask': bool [B*S, L]}, row b*S + t = the context of position t. The source for
session position t is `q_0 <sep> q_1 <sep> ... q_t`, compacted (real tokens only, numbered 0,
1, 2, ...), exactly the sequence a pair made on its own would give. All S sources of a session
are built at once (`mtn_jax.models.base.session_sources`: [B*S, L], L = S*(n+1) - 1) and
folded into the batch.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.data.vocab import SEP_ID
from mtn_jax.models import layers
from mtn_jax.models.base import session_sources
from mtn_jax.models.dropout import Dropout


def layer_label(display_name: str, fields: dict) -> str:
  """The paper's Fig.-3 label, e.g. "Transformer (4Q enc, 4 dec)"."""
  return f'{display_name} ({fields["query_layers"]}Q enc, {fields["decoder_layers"]} dec)'


class FlatSessionEncoder(nn.Module):
  """A Transformer encoder (`query_layers` layers) over each position's flat source.

  Source positions are numbered over the compacted source (words and `<sep>`s alike), so a
  learned table needs `max_session_queries * (max_query_words + 1)` rows.
  """

  config: layers.TransformerConfig
  embedding: layers.WordEmbedding

  def setup(self):
    cfg = self.config
    self.embedding_dropout = Dropout(cfg.dropout)
    self.source_positions = layers.PositionEncoding(
        cfg, cfg.max_session_queries * (cfg.max_query_words + 1),
        'config.model.max_session_queries * (config.data.max_query_words + 1)')
    self.encoder = layers.LayerStack(cfg, cfg.query_layers)

  def __call__(self, queries: jax.Array, *, train: bool = False) -> dict[str, jax.Array]:
    """queries int32 [B, S, n] -> {'tokens': [B*S, L, d], 'mask': bool [B*S, L]}."""
    sources, lengths = session_sources(queries)
    mask = jnp.arange(sources.shape[-1]) < lengths[:, None]
    x = self.embedding(sources) + self.source_positions(jnp.arange(sources.shape[-1]))
    x = self.embedding_dropout(x, deterministic=not train)
    x = self.encoder(x, layers.padding_mask(mask), train=train)
    return {'tokens': x, 'mask': mask}

  def copy_source(self, memory: dict[str, jax.Array], source_ids: jax.Array
                  ) -> dict[str, jax.Array]:
    """What a copy head may copy after query t: the encoded words of its flat source (the
    `<sep>`s left out). source_ids: int32 [B, S, n] the queries' extended ids. Returns
    'copy_tokens' [B*S, L, d], 'copy_mask' bool [B*S, L], 'copy_ids' int32 [B*S, L]."""
    ids, _ = session_sources(source_ids)
    mask = memory['mask'] & (ids != SEP_ID)
    return {'copy_tokens': memory['tokens'], 'copy_mask': mask,
            'copy_ids': jnp.where(mask, ids, -1).astype(jnp.int32)}
