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
  decoder's table (`WordEmbedding.attend`);
- with `config.copy`, a copy head ('copy_head', `copying.CopyHead`) over the source tokens the
  encoder offers (`copy_source`: for MTN every token of queries 0..t, for the Transformer its
  flat source), which turns the output into a mixture over the extended vocabulary;
- with `config.user_memory`, the user's earlier queries (batch['history'] [B, M, n]) as a
  memory: each history query is phi of its words (tanh of a dense map of their mean
  embedding, as the zero attention model's eq. 5), the context's own vector (the mean of its
  encoded tokens) attends over them (`user_memory.UserMemory`: AEM's softmax, or ZAM's with a
  zero vector), and the result u joins the memory as one more slot the decoder attends to.
  A slot rather than an addition to every token: the decoder can then weigh it per word, and
  ZAM's u of nearly 0 leaves the tokens exactly as a model without memory has them.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.data.vocab import UNK_ID
from mtn_jax.models import copying
from mtn_jax.models import layers
from mtn_jax.models import user_memory
from mtn_jax.models.base import Batch
from mtn_jax.models.base import SessionModel
from mtn_jax.models.base import word_embeddings


class EncoderDecoder(SessionModel):
  """See the module docstring. `encoder_class(config, embedding)` builds the encoder."""

  encoder_class: type[nn.Module]
  packs_sequences = True  # the decoder masks each sequence that shares a row to its own tokens

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
          dot_general=layers.head_dot_general(cfg), name='logits')
    if cfg.copy:
      self.copy_head = copying.CopyHead(cfg.d_model, cfg.dtype)
    if cfg.user_memory != 'none':
      self.history_projection = nn.Dense(cfg.d_model, dtype=cfg.dtype, param_dtype=jnp.float32,
                                         name='history_projection')
      self.user_memory = user_memory.UserMemory(
          cfg.attention_hidden, zero_attention=cfg.user_memory == 'zero_attention',
          dtype=cfg.dtype)

  def encode(self, batch: Batch, *, train: bool = False) -> dict[str, jax.Array]:
    """batch['queries'] int32 [B, S, n] -> {'tokens': [B*S, L, d], 'mask': bool [B*S, L]},
    and with `copy` the source to copy from: 'copy_tokens' [B*S, L', d], 'copy_mask' bool
    [B*S, L'] and 'copy_ids' int32 [B*S, L'] (extended ids, -1 where masked), from
    batch['oov']."""
    memory = self.context_encoder(batch['queries'], train=train)
    if self.config.copy:
      source = copying.extended_queries(batch, self.config.vocab_size)
      memory.update(self.context_encoder.copy_source(memory, source))
    if self.config.user_memory != 'none':
      memory.update(self.remember_user(memory, batch['history'],
                                       num_queries=batch['queries'].shape[1]))
    return memory

  def remember_user(self, memory: dict[str, jax.Array], history: jax.Array, *,
                    num_queries: int) -> dict[str, jax.Array]:
    """The memory with the user slot appended (see the module docstring).

    Args:
      memory: 'tokens' [B*S, L, d], 'mask' bool [B*S, L].
      history: int32 [B, M, n] the user's earlier queries, zero rows where there are none.
    Returns:
      'tokens' [B*S, L+1, d], 'mask' [B*S, L+1], and the attention's 'user_weights'
      [B*S, M] and 'zero_weight' [B*S].
    """
    word_mask = history != 0
    words = jnp.where(word_mask[..., None], self.encoder_table(history), 0)
    mean = words.sum(-2) / jnp.maximum(word_mask.sum(-1, keepdims=True), 1).astype(words.dtype)
    items = jnp.tanh(self.history_projection(mean))  # [B, M, d]
    token_mask = memory['mask']
    context = (jnp.where(token_mask[..., None], memory['tokens'], 0).sum(1)
               / jnp.maximum(token_mask.sum(-1, keepdims=True), 1).astype(words.dtype))
    rows = lambda x: jnp.repeat(x, num_queries, axis=0)  # session b -> rows b*S .. b*S+S-1
    u, weights, zero_weight = self.user_memory(context, rows(items),
                                               rows(word_mask.any(-1)))
    return {'tokens': jnp.concatenate([memory['tokens'], u[:, None].astype(
                memory['tokens'].dtype)], axis=1),
            'mask': jnp.concatenate([token_mask, jnp.ones_like(token_mask[:, :1])], axis=1),
            'user_weights': weights, 'zero_weight': zero_weight}

  def output_scores(self, hidden: jax.Array, memory, *, decode: bool = False) -> jax.Array:
    logits = self.output_logits(hidden)
    if not self.config.copy:
      return logits
    gate, scores = self.copy_head(hidden, memory, decode=decode)
    return copying.mixture_log_probs(logits, gate, scores, memory['copy_ids'],
                                     self.config.extended_vocab_size)

  def copy_inputs(self, hidden: jax.Array, memory) -> dict[str, jax.Array]:
    if not self.config.copy:
      return {}
    gate, scores = self.copy_head(hidden, memory)
    return {'gate': gate, 'copy_scores': scores, 'copy_ids': memory['copy_ids']}

  def decode_hidden(self, memory: dict[str, jax.Array], decoder_inputs: jax.Array, *,
                    train: bool = False, decode: bool = False,
                    parents: jax.Array | None = None) -> jax.Array:
    """memory rows [N, ...], decoder_inputs int32 [N, T'] -> hidden [N, T', d]; `parents`
    int32 [N, T'] as for `SessionModel.decode`.

    A copied word outside the vocabulary (an extended id, fed back by the search) is read as
    `<unk>`: the decoder's word table has no row for it.
    """
    if self.config.copy:
      decoder_inputs = jnp.where(decoder_inputs < self.config.vocab_size, decoder_inputs,
                                 UNK_ID)
    return self.decoder(memory['tokens'], memory['mask'], decoder_inputs, train=train,
                        decode=decode, parents=parents)

  def output_modules(self) -> tuple[nn.Module, ...]:
    return (self.decoder_table,) if self.config.tie_embeddings else (self.output_projection,)

  def output_logits(self, hidden: jax.Array) -> jax.Array:
    """hidden [..., d] -> float32 logits [..., V]."""
    if self.config.tie_embeddings:
      return self.decoder_table.attend(hidden)
    return self.output_projection(hidden).astype(jnp.float32)
