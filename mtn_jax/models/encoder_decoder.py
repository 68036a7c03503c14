"""A session encoder, the Transformer decoder and an output layer, composed.

`EncoderDecoder(config, encoder_class)` is MTN with `mtn.MTNEncoder` and the Transformer
baseline with `transformer.FlatSessionEncoder` (`mtn_jax.models.REGISTRY` builds both). It
has the entry points of `mtn_jax.models.base.SessionModel`:
  `encode(batch, *, train)` -> the encoder's memory {'tokens': [B*S, L, d], 'mask': bool
    [B*S, L]}, row b*S + t the context after queries 0..t;
  `decode_hidden(memory, decoder_inputs int32 [N, T'])` -> hidden [N, T', d];
  `output_logits(hidden [..., d])` -> float32 logits [..., V];
  whole-session logits [B, S-1, n+1, V] from `__call__`.

Parts:
- word tables (`config.share_embeddings`): one, 'word_embedding', for encoder and decoder,
  or 'encoder_embedding' and 'decoder_embedding';
- the encoder, built as `encoder_class(config, encoder_table)`: a module of its own (a ranker
  can use it without any decoder) that maps queries int32 [B, S, n] to the memory above and is
  CAUSAL over queries. Here it shares this module's parameter scope, so its parameters sit at
  the top level of the tree, as they did before the encoder was a module of its own, and older
  checkpoints load unchanged;
- `layers.Decoder` over the decoder's table;
- the output layer: 'logits', a dense map to the vocabulary, or with `tie_embeddings` the
  decoder's table (`WordEmbedding.attend`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.models import layers
from mtn_jax.models.base import Batch, SessionModel, word_embeddings


class EncoderDecoder(SessionModel):
  """See the module docstring. `encoder_class(config, embedding)` builds the encoder."""

  encoder_class: type[nn.Module]

  def setup(self):
    cfg = self.config
    self.encoder_table, self.decoder_table = word_embeddings(
        cfg, functools.partial(layers.WordEmbedding, cfg))
    self.context_encoder = self.encoder_class(cfg, self.encoder_table)
    nn.share_scope(self, self.context_encoder)
    self.decoder = layers.Decoder(cfg, self.decoder_table)
    if not cfg.tie_embeddings:
      self.output_projection = nn.Dense(
          cfg.vocab_size, dtype=cfg.dtype, param_dtype=jnp.float32,
          dot_general=functools.partial(jax.lax.dot_general,
                                        preferred_element_type=jnp.float32),
          name='logits')

  def encode(self, batch: Batch, *, train: bool = False) -> dict[str, jax.Array]:
    """batch['queries'] int32 [B, S, n] -> {'tokens': [B*S, L, d], 'mask': bool [B*S, L]}."""
    return self.context_encoder(batch['queries'], train=train)

  def decode_hidden(self, memory: dict[str, jax.Array], decoder_inputs: jax.Array, *,
                    train: bool = False, decode: bool = False) -> jax.Array:
    """memory rows [N, ...], decoder_inputs int32 [N, T'] -> hidden [N, T', d]."""
    return self.decoder(memory['tokens'], memory['mask'], decoder_inputs, train=train,
                        decode=decode)

  def output_modules(self) -> tuple[nn.Module, ...]:
    return (self.decoder_table,) if self.config.tie_embeddings else (self.output_projection,)

  def output_logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [..., d] -> float32 logits [..., V]."""
    if self.config.tie_embeddings:
      return self.decoder_table.attend(hidden)
    return self.output_projection(hidden).astype(jnp.float32)
