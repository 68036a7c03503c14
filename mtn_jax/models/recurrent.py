"""The paper's recurrent baselines: Seq2Seq with attention, HRED (H-LSTM) and M-NSRF.

Every model follows the contract of `mtn_jax.models.base` (B sessions, S queries, n tokens,
N decoder rows, T' decoder steps, V words), with its config `RecurrentConfig`:
  `encode(batch) -> memory` from batch['queries'] int32 [B, S, n], a dict whose leaves all
    lead with B * S: one context per session position t (after queries 0..t), row-major over
    (b, t);
  `decode(memory, decoder_inputs int32 [N, T']) -> logits float32 [N, T', V]`, teacher-forced,
    or with `decode=True` one step at a time from the LSTM state held in the 'cache' collection;
  `__call__(batch) -> logits float32 [B, S-1, T, V]` for the pairs t = 0..S-2;
  `decode_hidden` / `session_outputs`: the decoder's features [N, T', 2u] / [B, S-1, T, 2u]
    (u = `lstm_units`) before `output_logits` maps them to float32 logits [..., V].

Padding (id 0) never enters a recurrent state: every LSTM runs with `seq_lengths`, so a batch
padded with more tokens per query, more queries per session or more sessions gives the same
values for its real pairs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from mtn_jax.data.vocab import PAD_ID
from mtn_jax.models.base import (Batch, ModelConfig, SessionModel, check_positive,
                                 session_sources, word_embeddings)
from mtn_jax.models.dropout import Dropout


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecurrentConfig(ModelConfig):
  """The recurrent baselines' fields beside the ones every model has."""

  lstm_units: int  # units per direction of the bidirectional encoders

  @classmethod
  def check(cls, model) -> None:
    super().check(model)
    check_positive(model, 'lstm_units')

Carry = tuple[jax.Array, jax.Array]  # an LSTM state (c, h), each [rows, units]


def _lstm(units: int, dtype, name: str | None = None) -> nn.RNN:
  # An unbound cell (parent=None) is adopted by the RNN, so its parameters sit under the RNN's
  # name even when the RNN is built inside a compact method.
  cell = nn.OptimizedLSTMCell(units, dtype=dtype, param_dtype=jnp.float32, parent=None)
  return nn.RNN(cell, name=name)


def _check_rank(array: jax.Array, what: str, layout: str) -> None:
  rank = layout.count(',') + 1
  if array.ndim != rank or not jnp.issubdtype(array.dtype, jnp.integer):
    raise ValueError(f'{what} must be integer word ids {layout}, '
                     f'got shape {array.shape} and dtype {array.dtype}')


def _encode_tokens(encoder: nn.Bidirectional, embedded: jax.Array,
                   lengths: jax.Array) -> tuple[jax.Array, Carry]:
  """Runs a bidirectional LSTM over real tokens only.

  Args:
    encoder: forward and backward LSTMs of `units` each.
    embedded: [rows, L, emb_dim] embedded tokens, real ones first.
    lengths: int [rows], real tokens per row.
  Returns:
    outputs: [rows, L, 2 * units], zero at padding positions.
    final: (c, h), each [rows, 2 * units], forward then backward; zero for an empty row
      (flax would otherwise hand back the state after the padding of an empty row).
  """
  ((c_forward, h_forward), (c_backward, h_backward)), outputs = encoder(
      embedded, seq_lengths=lengths, return_carry=True)
  real = lengths[:, None] > 0
  final = tuple(jnp.where(real, jnp.concatenate(pair, axis=-1), 0)
                for pair in ((c_forward, c_backward), (h_forward, h_backward)))
  is_token = jnp.arange(embedded.shape[1]) < lengths[:, None]
  return jnp.where(is_token[..., None], outputs, 0), final


def _run_decoder_lstm(module: nn.Module, lstm: nn.RNN, inputs: jax.Array, decode: bool,
                      initial_carry) -> jax.Array:
  """Runs the decoder LSTM teacher-forced, or continues it from the 'cache' collection.

  Args:
    module: the decoder module that owns the cache variable.
    lstm: its LSTM.
    inputs: [N, T', features] decoder inputs.
    decode: False: run from `initial_carry()`. True: the first call (no cache yet) stores
      `initial_carry()` in the cache and returns the teacher-forced outputs without advancing
      it; later calls continue from the cached state and store the state after `inputs`.
    initial_carry: () -> (c, h), each [N, units], the state before the first token.
  Returns:
    [N, T', units] LSTM outputs.
  """
  if not decode:
    return lstm(inputs, initial_carry=initial_carry())
  has_state = module.has_variable('cache', 'carry')
  carry = module.variable('cache', 'carry', initial_carry)
  if not has_state:
    return lstm(inputs, initial_carry=carry.value)
  carry.value, outputs = lstm(inputs, initial_carry=carry.value, return_carry=True)
  return outputs


class _RecurrentModel(SessionModel):
  """What the three baselines share: word tables, dropout, output layer, `decode_hidden`.

  A subclass's setup adds `self.decoder`, a module mapping (memory, embedded decoder inputs
  [N, T', emb_dim], decode) to features [N, T', 2 * lstm_units], and defines `encode`,
  embedding its words with `_embed_source`.

  Word tables (`share_embeddings`): one, 'word_embedding', for source and target words (the
  same vocabulary), or 'encoder_embedding' and 'decoder_embedding'. The output layer is a
  dense map to the vocabulary, or with `tie_embeddings` a map to `emb_dim` followed by the
  transposed decoder table.
  """

  def setup(self):
    c = self.config
    self.encoder_embedding, self.decoder_embedding = word_embeddings(
        c, lambda name: nn.Embed(c.vocab_size, c.emb_dim, dtype=c.dtype,
                                 param_dtype=jnp.float32, name=name))
    self.dropout = Dropout(c.dropout)
    if c.tie_embeddings:
      self.output_to_embedding = nn.Dense(c.emb_dim, dtype=c.dtype)
    else:
      self.output_projection = nn.Dense(c.vocab_size, dtype=c.dtype)

  def _embed_source(self, ids: jax.Array, train: bool) -> jax.Array:
    return self.dropout(self.encoder_embedding(ids), deterministic=not train)

  def decode_hidden(self, memory: dict, decoder_inputs: jax.Array, *, train: bool = False,
                    decode: bool = False) -> jax.Array:
    """Memory of N rows, int32 [N, T'] decoder inputs -> features [N, T', 2 * lstm_units].

    With `decode=True` the call that creates the 'cache' collection stores the decoder's
    initial state and computes teacher-forced; later calls continue from the cache.
    """
    _check_rank(decoder_inputs, 'decoder_inputs', '[rows, steps]')
    embedded = self.dropout(self.decoder_embedding(decoder_inputs), deterministic=not train)
    return self.dropout(self.decoder(memory, embedded, decode), deterministic=not train)

  def output_modules(self) -> tuple[nn.Module, ...]:
    if self.config.tie_embeddings:
      return (self.output_to_embedding, self.decoder_embedding)
    return (self.output_projection,)

  def output_logits(self, hidden: jax.Array) -> jax.Array:
    """[..., 2 * lstm_units] decoder features -> float32 [..., V] logits."""
    if self.config.tie_embeddings:
      return self.decoder_embedding.attend(self.output_to_embedding(hidden)).astype(
          jnp.float32)
    return self.output_projection(hidden).astype(jnp.float32)


class _AttentionDecoder(nn.Module):
  """Luong et al.'s decoder: an LSTM, global attention with the general score, then
  the attentional hidden state tanh(W_c [context; h])."""

  config: RecurrentConfig

  @nn.compact
  def __call__(self, memory: dict, embedded: jax.Array, decode: bool) -> jax.Array:
    """Embedded inputs [N, T', emb_dim] -> attentional hidden states [N, T', 2 * units]."""
    c = self.config
    units = 2 * c.lstm_units
    hidden = _run_decoder_lstm(self, _lstm(units, c.dtype, name='lstm'), embedded, decode,
                               lambda: memory['final_state'])
    states = memory['source_states']  # [N, L, units]
    # General score h_t^T W_a h_s, with W_a applied on the decoder side, which is cheaper
    # per step than projecting every source state.
    query = nn.Dense(units, use_bias=False, dtype=c.dtype, name='attention_score')(hidden)
    scores = jnp.einsum('ntd,nld->ntl', query, states).astype(jnp.float32)
    is_source = jnp.arange(states.shape[1]) < memory['source_lengths'][:, None]
    scores = jnp.where(is_source[:, None], scores, jnp.finfo(jnp.float32).min)
    attention = jax.nn.softmax(scores, axis=-1).astype(states.dtype)
    context = jnp.einsum('ntl,nld->ntd', attention, states)
    return jnp.tanh(nn.Dense(units, use_bias=False, dtype=c.dtype, name='attentional_hidden')(
        jnp.concatenate([context, hidden], axis=-1)))


class Seq2SeqAttention(_RecurrentModel):
  """Seq2Seq with global attention (Luong et al. 2015) over the session's queries.

  The source for position t is queries 0..t joined by `<sep>` (`base.session_sources`);
  a one-layer bidirectional LSTM (`lstm_units` per direction) encodes it, and a one-layer LSTM
  of 2 * `lstm_units` decodes the next query, attending over all source states.

  Choices the papers leave open, and ours: one layer per LSTM (Luong et al. stack four for
  translation; the MTN paper gives no depth); no input feeding (Luong et al.'s optional
  feeding of the previous attentional state into the next LSTM input), so attention runs over
  all target steps at once; the decoder starts from the encoder's final (c, h), forward and
  backward concatenated, which matches its size without a bridge layer.

  memory: `source_states` [B*S, L, 2u] (zero at padding), `source_lengths` int32 [B*S],
  `final_state` ([B*S, 2u], [B*S, 2u]) with L = S * (n + 1) - 1 and u = `lstm_units`.
  """

  def setup(self):
    super().setup()
    c = self.config
    self.source_encoder = nn.Bidirectional(_lstm(c.lstm_units, c.dtype),
                                           _lstm(c.lstm_units, c.dtype))
    self.decoder = _AttentionDecoder(c)

  def encode(self, batch: Batch, *, train: bool = False) -> dict:
    """batch['queries'] int32 [B, S, n] -> memory for every position (see the class
    docstring)."""
    queries = batch['queries']
    _check_rank(queries, 'queries', '[batch, queries, tokens]')
    sources, lengths = session_sources(queries)
    states, final = _encode_tokens(self.source_encoder, self._embed_source(sources, train),
                                   lengths)
    return {'source_states': states, 'source_lengths': lengths, 'final_state': final}


class _SessionConditionedDecoder(nn.Module):
  """An LSTM that starts from tanh(W s_t) and reads [word embedding; s_t] at every step."""

  config: RecurrentConfig

  @nn.compact
  def __call__(self, memory: dict, embedded: jax.Array, decode: bool) -> jax.Array:
    """Session states [N, D], embedded [N, T', emb_dim] -> LSTM outputs [N, T', 2 * units]."""
    session_state = memory['session_state']
    c = self.config
    units = 2 * c.lstm_units

    def initial_carry() -> Carry:
      state = nn.Dense(2 * units, dtype=c.dtype, name='initial_state')(session_state)
      cell, hidden = jnp.split(jnp.tanh(state), 2, axis=-1)
      return cell, hidden

    rows, steps, _ = embedded.shape
    repeated_state = jnp.broadcast_to(session_state[:, None].astype(embedded.dtype),
                                      (rows, steps, session_state.shape[-1]))
    inputs = jnp.concatenate([embedded, repeated_state], axis=-1)
    return _run_decoder_lstm(self, _lstm(units, c.dtype, name='lstm'), inputs, decode,
                             initial_carry)


class HRED(_RecurrentModel):
  """Hierarchical recurrent encoder-decoder, H-LSTM in the paper (Sordoni et al. 2015).

  A bidirectional LSTM (`lstm_units` per direction, shared by every query: S is folded into the
  batch) encodes each query; its summary feeds a unidirectional session LSTM of 2 *
  `lstm_units`, so the session state s_t depends on queries 0..t only. The decoder LSTM (2 *
  `lstm_units`) starts from tanh(W s_t) and reads s_t beside each input word.

  Choices the papers leave open, and ours: LSTMs where Sordoni et al. use GRUs, bidirectional
  at the query level as the MTN paper states; the query summary is the final hidden states h of
  both directions (not the cells); the decoder's initial c and h both come from one tanh(W s_t);
  the output layer reads the decoder state only (Sordoni et al.'s output layer also adds the
  previous word's embedding); one layer per LSTM.

  memory: `session_state` [B*S, 2u], u = `lstm_units`.
  """

  def setup(self):
    super().setup()
    c = self.config
    self.query_encoder = nn.Bidirectional(_lstm(c.lstm_units, c.dtype),
                                          _lstm(c.lstm_units, c.dtype))
    self.session_encoder = _lstm(2 * c.lstm_units, c.dtype)
    self.decoder = _SessionConditionedDecoder(c)

  def _summarize_queries(self, outputs: jax.Array, final: Carry,
                         lengths: jax.Array) -> jax.Array:
    """One vector per query from the query encoder.

    Args:
      outputs: [rows, n, 2u] encoder outputs, zero at padding.
      final: (c, h) final states, each [rows, 2u], zero for an empty query.
      lengths: int [rows], real tokens per query.
    Returns:
      [rows, 2u], zero for an empty query.
    """
    del outputs, lengths  # HRED summarises a query by its final states alone
    return final[1]

  def encode(self, batch: Batch, *, train: bool = False) -> dict:
    """batch['queries'] int32 [B, S, n] -> memory for every position (see the class
    docstring)."""
    queries = batch['queries']
    _check_rank(queries, 'queries', '[batch, queries, tokens]')
    b, s, n = queries.shape
    tokens = queries.reshape(b * s, n)
    lengths = (tokens != PAD_ID).sum(-1)
    outputs, final = _encode_tokens(self.query_encoder, self._embed_source(tokens, train),
                                    lengths)
    summaries = self._summarize_queries(outputs, final, lengths).reshape(b, s, -1)
    session_states = self.session_encoder(summaries)  # [B, S, 2u], causal over queries
    return {'session_state': session_states.reshape(b * s, -1)}


class MNSRF(HRED):
  """M-NSRF's query-suggestion part (Ahmad et al. 2018), without its document ranker.

  As HRED, except that a query's summary is the element-wise max of the bidirectional LSTM
  outputs over its real tokens. Its entropy regulariser belongs to the loss
  (`mtn_jax.tasks.losses.token_losses`, weight `config.train.entropy_weight`, 0.1 in the paper).

  Choices the papers leave open, and ours: as for HRED. Ahmad et al.'s decoder also reads the
  current query's representation; here it reaches the decoder through s_t only, so that
  M-NSRF differs from HRED in pooling and regulariser alone, as the MTN paper describes it.
  """

  def _summarize_queries(self, outputs: jax.Array, final: Carry,
                         lengths: jax.Array) -> jax.Array:
    del final  # M-NSRF max-pools the outputs instead
    is_token = jnp.arange(outputs.shape[1]) < lengths[:, None]
    pooled = jnp.where(is_token[..., None], outputs, -jnp.inf).max(axis=1)
    return jnp.where(lengths[:, None] > 0, pooled, 0)
