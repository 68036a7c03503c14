"""Iterative multi-document neural attention (Greco, Suglia, Basile, Rossiello, Semeraro 2016).

A question is answered with several answers at once by reading the K documents a retrieval
engine returns for it (`mtn_jax.data.bm25`). Shapes: B questions, Lq question tokens, K
documents of Ld tokens each, V words, A candidate answers, h = `state_dim`, T =
`inference_steps`.

1. Encoding: word embeddings, then a bidirectional GRU (flax `nn.GRUCell` in `nn.RNN`, run
   with `seq_lengths`, so padding never enters a state) over the question -> q~ [B, Lq, 2h],
   and another over each document; the K documents' token encodings are stacked into one
   sequence d~ [B, K*Ld, 2h] (the slides' "unique representation for the whole set of
   documents").
2. Inference (Sordoni et al.'s iterative alternating attention), T steps from a learned
   state s_0 [h], by `nn.scan` with the same parameters at every step:
     query attentive read     a_i = softmax_i(q~_i . (A_q s + a_q)),  q_t = sum_i a_i q~_i
     document attentive read  b_j = softmax_j(d~_j . (A_d [s, q_t] + a_d)), d_t = sum_j b_j d~_j
       (one softmax over the tokens of all K documents)
     gating search results    r = [s, q_t, d_t, q_t * d_t], g_q = sigmoid(MLP_q(r)),
                              g_d = sigmoid(MLP_d(r)), s <- GRU(s, [g_q * q_t, g_d * d_t])
3. Prediction: the last step's document attention, accumulated per word over the documents,
     score(w) = (1 / pi(w)) sum_i phi(i, w)
   (phi(i, w): the attention on w's occurrences in document i; pi(w): w's occurrences in
   the K documents; 0 for a word they do not hold) gives z [B, V], and a 2-layer network
   y = W_ho relu(W_ih z' + b_ih) + b_ho, z' = N z (N: the documents' tokens; see
   `IMDNA.read`), scores every candidate answer (logits [B, A]; the slides' sigmoid is in
   the loss, `optax.sigmoid_binary_cross_entropy`).

`IMDNA.read(batch)` returns every intermediate (each step's attention over the question and
over the documents, the word scores z, the logits) for inspection; `__call__` the logits.

`SupervisedEmbeddings` (`reader='embeddings'`) is Dodge et al.'s supervised embedding
baseline on the same data: the question's bag of words embedded, dotted with an embedding
per candidate answer; it reads no document.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax.data.vocab import PAD_ID
from mtn_jax.models.base import ModelConfig
from mtn_jax.models.base import check_choice
from mtn_jax.models.base import check_positive
from mtn_jax.models.dropout import Dropout

READERS = ('attention', 'embeddings')


@dataclasses.dataclass(frozen=True, kw_only=True)
class IMDNAConfig(ModelConfig):
  """The model's fields beside the ones every model has. `num_items` (A, the candidate
  answers) and `vocab_size` come from the data; `max_query_words` is the question length."""

  num_items: int
  state_dim: int = 128  # h: GRU units per direction, and the inference state
  inference_steps: int = 3  # T
  hidden_units: int = 4096  # u: the prediction network's hidden layer
  reader: str = 'attention'  # 'attention' (the model) | 'embeddings' (the baseline)

  # One word table for documents and questions, float32 throughout (the reader's GRUs).
  INERT_FIELDS = {'share_embeddings': False, 'tie_embeddings': False,
                  'compute_dtype': 'float32'}

  @classmethod
  def check(cls, model) -> None:
    super().check(model)
    check_positive(model, 'state_dim', 'inference_steps', 'hidden_units')
    check_choice(model, 'reader', READERS)


def word_scores(attention: jax.Array, tokens: jax.Array, vocab_size: int) -> jax.Array:
  """score(w) = sum of the attention on w's occurrences / the number of its occurrences.

  Args:
    attention: float32 [B, N], one weight per document token (N = K*Ld), 0 on padding.
    tokens: int32 [B, N] word ids, PAD_ID on padding.
    vocab_size: V.
  Returns:
    float32 [B, V]; 0 for a word the documents do not hold (and for padding).
  """
  real = tokens != PAD_ID

  def one(weights, ids, mask):
    total = jax.ops.segment_sum(jnp.where(mask, weights, 0.0), ids, num_segments=vocab_size)
    count = jax.ops.segment_sum(mask.astype(weights.dtype), ids, num_segments=vocab_size)
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)

  return jax.vmap(one)(attention, tokens, real)


def _masked_softmax(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Softmax over the last axis among `mask`; all zeros where a row has nothing to attend."""
  logits = jnp.where(mask, logits, -jnp.inf)
  peak = jnp.max(logits, axis=-1, keepdims=True)
  weights = jnp.where(mask, jnp.exp(logits - jnp.where(jnp.isfinite(peak), peak, 0.0)), 0.0)
  return weights / jnp.maximum(weights.sum(-1, keepdims=True), 1e-30)


class BiGRUEncoder(nn.Module):
  """Token ids [R, L] -> encodings float32 [R, L, 2h] (forward and backward GRU states,
  concatenated) of the real tokens; padded positions hold values no reader may use."""

  units: int

  @nn.compact
  def __call__(self, embedded: jax.Array, lengths: jax.Array) -> jax.Array:
    cell = lambda: nn.GRUCell(self.units, parent=None)  # adopted by its RNN
    return nn.Bidirectional(nn.RNN(cell()), nn.RNN(cell()))(embedded, seq_lengths=lengths)


class _Gate(nn.Module):
  """sigmoid(W2 relu(W1 r)): a 2-layer gate, one value per feature of its output."""

  features: int

  @nn.compact
  def __call__(self, r: jax.Array) -> jax.Array:
    hidden = nn.relu(nn.Dense(self.features, name='hidden')(r))
    return nn.sigmoid(nn.Dense(self.features, name='out')(hidden))


class InferenceStep(nn.Module):
  """One inference step: (state s [B, h], encodings) -> (new state, (query attention
  [B, Lq], document attention [B, N]))."""

  state_dim: int

  @nn.compact
  def __call__(self, state, encodings):
    question, question_mask, documents, documents_mask = encodings
    query_key = nn.Dense(question.shape[-1], name='query_read')(state)
    query_attention = _masked_softmax(jnp.einsum('bld,bd->bl', question, query_key),
                                      question_mask)
    query = jnp.einsum('bl,bld->bd', query_attention, question)
    document_key = nn.Dense(documents.shape[-1], name='document_read')(
        jnp.concatenate([state, query], -1))
    document_attention = _masked_softmax(jnp.einsum('bnd,bd->bn', documents, document_key),
                                         documents_mask)
    document = jnp.einsum('bn,bnd->bd', document_attention, documents)
    r = jnp.concatenate([state, query, document, query * document], -1)
    gated = jnp.concatenate([_Gate(query.shape[-1], name='query_gate')(r) * query,
                             _Gate(document.shape[-1], name='document_gate')(r) * document],
                            -1)
    state, _ = nn.GRUCell(self.state_dim, name='search_state')(state, gated)
    return state, (query_attention, document_attention)


class IMDNA(nn.Module):
  """See the module docstring. Batch: 'question' int32 [B, Lq], 'documents' int32
  [B, K, Ld] (0-padded; a missing document is all padding)."""

  config: IMDNAConfig

  def setup(self):
    cfg = self.config
    self.embed = nn.Embed(cfg.vocab_size, cfg.emb_dim)
    self.dropout = Dropout(cfg.dropout)
    self.question_encoder = BiGRUEncoder(cfg.state_dim)
    self.document_encoder = BiGRUEncoder(cfg.state_dim)
    self.initial_state = self.param('initial_state', nn.initializers.zeros, (cfg.state_dim,))
    self.steps = nn.scan(InferenceStep, variable_broadcast='params',
                         split_rngs={'params': False, 'dropout': True}, in_axes=nn.broadcast,
                         length=cfg.inference_steps)(
                             cfg.state_dim)
    self.hidden = nn.Dense(cfg.hidden_units)
    # Each answer starts at probability about 1/A, as most candidates are wrong for any
    # question: the loss then starts near its floor instead of spending its first steps
    # pushing A sigmoids from 1/2 down.
    self.answers = nn.Dense(cfg.num_items,
                            bias_init=nn.initializers.constant(-math.log(cfg.num_items)))

  def _encode(self, encoder, tokens, train):
    lengths = (tokens != PAD_ID).sum(-1)
    embedded = self.dropout(self.embed(tokens), deterministic=not train)
    return encoder(embedded, lengths)

  def read(self, batch, *, train: bool = False) -> dict[str, jax.Array]:
    """Every intermediate of the forward pass:
      'query_attention' float32 [B, T, Lq], 'document_attention' float32 [B, T, K, Ld]
      (each step's weights; a step's document weights sum to 1 over all K documents),
      'word_scores' float32 [B, V] (z), 'logits' float32 [B, A]."""
    question, documents = batch['question'], batch['documents']
    b, k, ld = documents.shape
    flat_documents = documents.reshape(b, k * ld)
    encodings = (self._encode(self.question_encoder, question, train), question != PAD_ID,
                 self._encode(self.document_encoder, documents.reshape(b * k, ld),
                              train).reshape(b, k * ld, -1),
                 flat_documents != PAD_ID)
    state = jnp.broadcast_to(self.initial_state, (b, self.config.state_dim))
    _, (query_attention, document_attention) = self.steps(state, encodings)
    z = word_scores(document_attention[-1], flat_documents, self.config.vocab_size)
    # The network reads z times N, the number of document tokens: uniform attention gives
    # every word of the documents 1, a word the attention favours more. The slides' z (one
    # softmax over all N tokens) is about 1/N, an input that moved the network by lr * z per
    # Adam step: it barely trained on movie QA. z / max_w z, tried next, trains QA but leaves
    # the network a single word once the attention peaks: on Recs the attention settled on a
    # relation name every document holds, and every question got the same answers
    # (docs/notes/2026-11-25-imdna.md, "What did not work").
    scaled = z * (flat_documents != PAD_ID).sum(-1, keepdims=True)
    hidden = self.dropout(nn.relu(self.hidden(scaled)), deterministic=not train)
    return {'query_attention': query_attention.transpose(1, 0, 2),
            'document_attention': document_attention.transpose(1, 0, 2).reshape(b, -1, k, ld),
            'word_scores': z, 'logits': self.answers(hidden)}

  def __call__(self, batch, *, train: bool = False) -> jax.Array:
    """float32 logits [B, A]."""
    return self.read(batch, train=train)['logits']


class SupervisedEmbeddings(nn.Module):
  """score(q, a) = mean of q's word embeddings . the embedding of a (Dodge et al.'s
  supervised embeddings); logits float32 [B, A] from 'question' int32 [B, Lq]."""

  config: IMDNAConfig

  @nn.compact
  def __call__(self, batch, *, train: bool = False) -> jax.Array:
    cfg = self.config
    question = batch['question']
    real = (question != PAD_ID)[..., None]
    words = Dropout(cfg.dropout)(nn.Embed(cfg.vocab_size, cfg.emb_dim)(question),
                                 deterministic=not train)
    bag = (words * real).sum(1) / jnp.maximum(real.sum(1), 1)
    answers = self.param('answer_embeddings', nn.initializers.normal(0.1),
                         (cfg.num_items, cfg.emb_dim))
    bias = self.param('answer_bias', nn.initializers.constant(-math.log(cfg.num_items)),
                      (cfg.num_items,))
    return bag @ answers.T + bias


def create(config: IMDNAConfig) -> nn.Module:
  """The module `config.reader` names."""
  if config.reader not in READERS:
    raise ValueError(f"config.model.reader must be one of {READERS}, got {config.reader!r}")
  return (IMDNA if config.reader == 'attention' else SupervisedEmbeddings)(config=config)
