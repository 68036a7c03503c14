"""Bi-, Poly- and Cross-encoders (Humeau et al., ICLR 2020) as rankers of candidate next queries.

Each scores a context (a session's queries 0..t) against candidate next queries, here the
entries of the candidate pool (the training split's distinct queries,
`mtn_jax.data.candidate_pool`). They reuse the project's Transformer layers:

- the context encoder (`context_encoder`): 'flat' is the Transformer baseline's encoder
  (`transformer.FlatSessionEncoder`, every word of `q_0 <sep> ... <sep> q_t`), 'mtn' MTN's
  query and session encoders (`mtn.MTNEncoder`, the tokens of query t carrying the session
  vector); either gives token vectors h_1..h_N for each context;
- the candidate encoder: `FlatSessionEncoder` over the candidate query alone (its own weights,
  the paper's T_2), y_cand = the mean of its token vectors.

Scores (paper Sec. 4.2-4.4):
  Bi-encoder     y_ctx = mean_j h_j;  s = y_ctx . y_cand.
  Poly-encoder   m learned codes c_i: y_ctx^i = sum_j softmax_j(c_i . h_j / sqrt(d)) h_j;
                 y_ctx = sum_i softmax_i(y_cand . y_ctx^i / sqrt(d)) y_ctx^i;
                 s = y_ctx . y_cand.
  Cross-encoder  `q_0 <sep> ... <sep> q_t <sep> cand` through one flat encoder, every word
                 attending to every other; s = w . h_sep, h_sep the output at the `<sep>`
                 before the candidate (the paper's first output [S], which sees the pair).
Choices the paper leaves open, and the ones made here: the reduction red(.) is the mean over
the real tokens (the paper's "average over all outputs", which it finds very close to its
first output; these inputs have no [S] token, and MTN's query projection fixes its n slots);
the two attentions of the Poly-encoder are scaled by 1/sqrt(d) as in Vaswani et al., against the
saturation the paper met (Sec. 5.3) with vectors of norm ~sqrt(d) after LayerNorm; the final
score is the plain dot product, as in the paper. So a Poly-encoder with one code of zeros
attends uniformly and IS the Bi-encoder with the same encoder weights (tests check it).

`scaled_scores` divides the final score by sqrt(d) too (s = y_ctx . y_cand / sqrt(d)), for
encoders trained from scratch: the paper's encoders were pretrained, while here both vectors
are means of freshly initialised LayerNorm outputs, of norm ~sqrt(d) and sharing much of
their direction, so the plain dot products of one context with different candidates start
spread by several units (std 2.8 at the demo's d = 32: the loss starts 3 nats above chance).
The quickest way down for the optimiser is then to make every candidate vector the same,
which reaches chance and leaves almost no gradient; the demo configs stayed there (8 queries
were the first suggestion of all 280 test pairs). Scaled, the scores start within about one
unit and training tells candidates apart within the first epoch. A constant factor changes
no ranking, only the softmax the loss (and anything reading the scores as logits) sees.

Shapes: `queries` int32 [B, S, n] (0 = padding); position t of a session is the context after
query t, which predicts query t+1. d = `d_model`, m = `poly_codes`.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from mtn_jax import errors
from mtn_jax.data.vocab import PAD_ID

from mtn_jax.data.vocab import SEP_ID
from mtn_jax.models import layers
from mtn_jax.models import mtn
from mtn_jax.models import transformer
from mtn_jax.models.base import check_choice
from mtn_jax.models.base import check_positive
from mtn_jax.models.base import session_sources
from mtn_jax.models.dropout import Dropout

CONTEXT_ENCODERS = ('flat', 'mtn')


# The keys the rankers inherit or share that only some of them read: key -> (who reads it,
# why another does not or None, the registered names of the rankers that read it).
UNREAD_KEYS = {
    'copy': ('the generators (MTN, the Transformer)', None, ()),
    'attention_hidden': ("the generators' user memory", None, ()),
    'kernels': ("the generators' output layer", None, ()),
    'context_encoder': ('the Bi- and Poly-encoders', None, ('biencoder', 'polyencoder')),
    'pool_negatives': ('the Bi- and Poly-encoders', None, ('biencoder', 'polyencoder')),
    'lexical_negatives': ('the Bi- and Poly-encoders', 'the Cross-encoder draws its negatives '
                          'with config.model.cross_negatives', ('biencoder', 'polyencoder')),
    'scaled_scores': ('the Bi- and Poly-encoders', "the Cross-encoder's score is a learned "
                      "layer's output, not a dot product", ('biencoder', 'polyencoder')),
    'poly_codes': ('the Poly-encoder', None, ('polyencoder',)),
    'cross_negatives': ('the Cross-encoder', None, ('crossencoder',)),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankerConfig(mtn.MTNConfig):
  """The encoders' fields (MTN's, for `context_encoder='mtn'`) and the rankers' own.

  `decoder_layers` is inherited and unused: a ranker has no decoder. `share_embeddings`
  makes the context and candidate encoders share one word table.
  """

  context_encoder: str = 'flat'  # 'flat' | 'mtn' (Bi- and Poly-encoders)
  poly_codes: int = 16  # m, the Poly-encoder's learned codes
  cross_negatives: int = 15  # the Cross-encoder's negatives sampled from the pool per context
  # Bi- and Poly-encoders: pool entries drawn uniformly per batch, negatives of every context
  # beside the in-batch ones (`ranking_tasks.DualEncoderTask`).
  pool_negatives: int = 0
  # Each context's session queries join its candidates and targets are graded by n-gram
  # overlap with the true next query (`ranking_tasks`).
  session_candidates: bool = False
  # Bi- and Poly-encoders: the pool entries nearest in words to each context (BM25), its
  # hard negatives (`ranking_tasks.lexical_neighbours`).
  lexical_negatives: int = 0
  # Bi- and Poly-encoders: the final score divided by sqrt(d) (module docstring).
  scaled_scores: bool = False

  HAS_USER_MEMORY = False  # the Transformer's field, which a ranker does not read
  INERT_FIELDS = {'tie_embeddings': False}  # no output layer over the vocabulary

  @classmethod
  def check(cls, model) -> None:
    super(mtn.MTNConfig, cls).check(model)  # the Transformer's rules; MTN's only as below
    check_choice(model, 'context_encoder', CONTEXT_ENCODERS)
    if model.context_encoder == 'mtn' and model.name != 'crossencoder':
      mtn.check_session_levels(model, 'for an MTN context encoder')
    check_positive(model, 'poly_codes', 'cross_negatives')
    for key in ('pool_negatives', 'lexical_negatives'):
      if model[key] < 0:
        raise errors.ConfigError(f'config.model.{key} must be >= 0, got {model[key]}')
    # The family's keys (configs/families.py) this ranker does not read: set to anything but
    # their default they would change nothing.
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    for key, (who, why, readers) in UNREAD_KEYS.items():
      if model.name not in readers and model.get(key, defaults[key]) != defaults[key]:
        raise errors.ConfigError(f'config.model.{key} is for {who}; {model.name!r} does not '
                                 f'read it ({why or f"leave it at {defaults[key]!r}"})')

  def unread_fields(self) -> tuple[str, ...]:
    return super().unread_fields() + ('decoder_layers',) + tuple(
        key for key, (_, _, readers) in UNREAD_KEYS.items() if self.name not in readers)

  @classmethod
  def copies(cls, model) -> bool:
    del model
    return False


def layer_label(display_name: str, fields: dict) -> str:
  """"Poly-encoder 16 (flat 2)": the codes, the context encoder and its depth."""
  codes = f' {fields["poly_codes"]}' if display_name == 'Poly-encoder' else ''
  encoder = fields.get('context_encoder', 'flat') if display_name != 'Cross-encoder' else 'flat'
  depth = f'{fields["query_layers"]}'
  if encoder == 'mtn':
    depth += f'Q+{fields["session_layers"]}S'
  return f'{display_name}{codes} ({encoder} {depth})'


def masked_mean(tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """tokens [..., L, d], mask bool [..., L] -> [..., d], the mean of the real tokens (0 for
  none)."""
  weights = mask.astype(tokens.dtype)
  return (jnp.einsum('...ld,...l->...d', tokens, weights)
          / jnp.maximum(weights.sum(-1, keepdims=True), 1))


def _word_tables(cfg: RankerConfig):
  if cfg.share_embeddings:
    table = layers.WordEmbedding(cfg, name='word_embedding')
    return table, table
  return (layers.WordEmbedding(cfg, name='context_embedding'),
          layers.WordEmbedding(cfg, name='candidate_embedding'))


class DualEncoder(nn.Module):
  """The Bi-encoder, or with `poly` the Poly-encoder (see the module docstring).

  Entry points:
    `contexts(queries [B, S, n])` -> [B, S, m, d] (m = 1 for the Bi-encoder);
    `candidates(ids [..., n])` -> y_cand [..., d];
    `score(contexts [..., m, d], candidates [..., C, d])` -> float32 [..., C], a pure function
      of the two (no parameters), so that candidate vectors can be cached;
    `__call__(batch)` -> {'contexts': [B, S, m, d], 'candidates': [B, S, d]}: every position's
      context and every query as a candidate (what the in-batch loss scores).
  """

  config: RankerConfig
  poly: bool = False

  def setup(self):
    cfg = self.config
    context_table, candidate_table = _word_tables(cfg)
    encoder_class = {'flat': transformer.FlatSessionEncoder,
                     'mtn': mtn.MTNEncoder}[cfg.context_encoder]
    self.context_encoder = encoder_class(cfg, context_table)
    self.candidate_encoder = transformer.FlatSessionEncoder(cfg, candidate_table)
    if self.poly:
      self.codes = self.param('codes', nn.initializers.normal(stddev=cfg.d_model**-0.5),
                              (cfg.poly_codes, cfg.d_model), jnp.float32)

  def contexts(self, queries: jax.Array, *, train: bool = False) -> jax.Array:
    """queries int32 [B, S, n] -> context vectors [B, S, m, d]: the mean token (Bi) or the m
    codes' attention readouts (Poly) of each position's context."""
    batch, num_queries, _ = queries.shape
    memory = self.context_encoder(queries, train=train)
    tokens, mask = memory['tokens'], memory['mask']  # [B*S, N, d], [B*S, N]
    if not self.poly:
      vectors = masked_mean(tokens, mask)[:, None]
    else:
      codes = self.codes.astype(tokens.dtype)
      logits = jnp.einsum('md,rnd->rmn', codes, tokens) / jnp.sqrt(
          jnp.asarray(self.config.d_model, tokens.dtype))
      logits = jnp.where(mask[:, None, :], logits.astype(jnp.float32), -jnp.inf)
      # A context of no tokens (a padding row) gets all-zero weights rather than NaN.
      weights = jnp.nan_to_num(jax.nn.softmax(logits, axis=-1))
      vectors = jnp.einsum('rmn,rnd->rmd', weights.astype(tokens.dtype), tokens)
    return vectors.reshape(batch, num_queries, vectors.shape[1], -1)

  def candidates(self, ids: jax.Array, *, train: bool = False) -> jax.Array:
    """ids int32 [..., n] -> y_cand [..., d]."""
    lead, n = ids.shape[:-1], ids.shape[-1]
    memory = self.candidate_encoder(ids.reshape(-1, 1, n), train=train)
    return masked_mean(memory['tokens'], memory['mask']).reshape(lead + (-1,))

  def score(self, contexts: jax.Array, candidates: jax.Array) -> jax.Array:
    """contexts [..., m, d] x candidates [..., C, d] -> float32 scores [..., C]."""
    return dual_scores(contexts, candidates, poly=self.poly, scale=score_scale(self.config))

  def __call__(self, batch, *, train: bool = False) -> dict[str, jax.Array]:
    queries = batch['queries']
    return {'contexts': self.contexts(queries, train=train),
            'candidates': self.candidates(queries, train=train)}


def score_scale(cfg: RankerConfig) -> float:
  """The factor on the final score: 1 (the paper's plain dot product), or 1/sqrt(d) with
  `scaled_scores`."""
  return cfg.d_model**-0.5 if cfg.scaled_scores else 1.0


def dual_scores(contexts: jax.Array, candidates: jax.Array, *, poly: bool,
                scale: float = 1.0) -> jax.Array:
  """The Bi- or Poly-encoder's score of every candidate for every context.

  Args:
    contexts: [..., m, d] (m = 1 for the Bi-encoder).
    candidates: [..., C, d], the same leading axes (or broadcastable to them).
    poly: the Poly-encoder's score (each candidate attends over the m context vectors).
    scale: a factor on the final score (`score_scale`); the Poly-encoder's attention over
      the codes keeps its own 1/sqrt(d) whatever it is.
  Returns:
    float32 [..., C]: scale * y_ctx . y_cand, y_ctx attended by each candidate for the
    Poly-encoder.
  """
  per_code = jnp.einsum('...md,...cd->...cm', contexts, candidates,
                        preferred_element_type=jnp.float32)  # y_cand . y_ctx^i
  if not poly:
    return scale * per_code[..., 0]
  # s = (sum_i w_i y_ctx^i) . y_cand = sum_i w_i (y_ctx^i . y_cand): the weighted context
  # vector is never built, so scoring C candidates costs [C, m] dot products and no [C, d].
  weights = jax.nn.softmax(per_code / jnp.sqrt(float(contexts.shape[-1])), axis=-1)
  return scale * (weights * per_code).sum(-1)


def cross_inputs(sources: jax.Array, candidates: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The Cross-encoder's joint inputs: a context's flat source, `<sep>`, one candidate.

  Args:
    sources: int32 [R, L] contexts as `session_sources` gives them (real tokens first).
    candidates: int32 [R, K, n], K candidates after each context.
  Returns:
    tokens int32 [R*K, L+1+n] (the source, its padding, `<sep>` at column L, the candidate)
    and positions int32 [R*K, L+1+n] numbering the real tokens 0, 1, 2, ... as a compacted
    sequence would: the gap of padding before `<sep>` changes nothing (attention is masked).
  """
  num_candidates, n = candidates.shape[1:]
  sources = jnp.repeat(sources, num_candidates, axis=0)  # [R*K, L]
  flat_candidates = candidates.reshape(-1, n).astype(sources.dtype)
  separator = jnp.full((flat_candidates.shape[0], 1), SEP_ID, sources.dtype)
  tokens = jnp.concatenate([sources, separator, flat_candidates], axis=-1)
  positions = jnp.cumsum(tokens != PAD_ID, axis=-1) - 1
  return tokens, jnp.maximum(positions, 0).astype(jnp.int32)


class CrossEncoder(nn.Module):
  """The Cross-encoder (see the module docstring).

  Entry point: `__call__(batch, candidates int32 [B, S, K, n])` -> float32 scores [B, S, K],
  candidate k scored after queries 0..t of its session (t = its position).
  """

  config: RankerConfig

  def setup(self):
    cfg = self.config
    self.embedding = layers.WordEmbedding(cfg, name='word_embedding')
    self.embedding_dropout = Dropout(cfg.dropout)
    self.positions = layers.PositionEncoding(
        cfg, (cfg.max_session_queries + 1) * (cfg.max_query_words + 1),
        '(config.model.max_session_queries + 1) * (config.data.max_query_words + 1)')
    self.encoder = layers.LayerStack(cfg, cfg.query_layers)
    self.score_layer = nn.Dense(1, dtype=cfg.dtype, param_dtype=jnp.float32, name='score')

  def __call__(self, batch, candidates: jax.Array, *, train: bool = False) -> jax.Array:
    sources, _ = session_sources(batch['queries'])  # [B*S, L]
    return self.score_pairs(sources, candidates.reshape((-1,) + candidates.shape[2:]),
                            train=train).reshape(candidates.shape[:3])

  def score_last(self, queries: jax.Array, candidates: jax.Array) -> jax.Array:
    """queries int32 [B, S, n], candidates int32 [B, K, n] -> float32 [B, K]: the candidates
    after each session's last query alone (no earlier position is encoded)."""
    sources, _ = session_sources(queries)
    last = sources.reshape(queries.shape[0], queries.shape[1], -1)[:, -1]
    return self.score_pairs(last, candidates)

  def score_pairs(self, sources: jax.Array, candidates: jax.Array, *,
                  train: bool = False) -> jax.Array:
    """sources int32 [R, L] (flat contexts), candidates int32 [R, K, n] -> float32 [R, K]."""
    tokens, positions = cross_inputs(sources, candidates)
    mask = tokens != PAD_ID
    x = self.embedding(tokens) + self.positions(positions)
    x = self.embedding_dropout(x, deterministic=not train)
    x = self.encoder(x, layers.padding_mask(mask), train=train)
    pair = x[:, sources.shape[-1]]  # the <sep> before the candidate: [R*K, d]
    return self.score_layer(pair)[..., 0].astype(jnp.float32).reshape(candidates.shape[:2])
