"""The Bi-, Poly- and Cross-encoders' tasks: how they learn, and how they score candidates.

Both train as the poly-encoder paper does (Sec. 4.2-4.3): a cross-entropy whose logits are the
scores of the true next query and of negatives, for every context of a session (position t
predicts query t+1; a position whose next query is padding is no context).

`DualEncoderTask` (Bi- and Poly-encoder): the negatives are the other real next queries of the
batch, whose candidate vectors are computed anyway, so every context meets B*(S-1) - 1 of
them at no extra encoding cost; larger batches give more. In-batch negatives are drawn by how
often a query is issued, so the many queries issued once (most of the pool) are seldom
anyone's negative, and retrieval over the whole pool can then rank such a rare entry first for
every context; `pool_negatives` adds that many entries drawn uniformly from the pool (once
per batch, shared by its contexts, a fixed key in evaluation) as negatives of every context.
A negative with the same token ids as the context's true next query (the same query issued
in another session, a frequent event in search logs: "google", "yahoo.com") is masked out
rather than counted as a negative, since the model cannot and should not rank a text below
itself; nor is it a second positive, which would make the loss depend on how often a query
repeats within a batch. With data-parallel groups (`groups`) the negatives of a context are
those of its group, so no candidate vector crosses devices.

`CrossEncoderTask`: the pair must be encoded jointly, so in-batch candidates bring no saving;
each context meets `cross_negatives` entries drawn uniformly from the candidate pool with the
step's key (a fixed key in evaluation, so validation figures compare across checkpoints),
those equal to the true next query masked as above.

Graded targets (`session_candidates`, every ranker): each context's own session queries so
far join its candidates, and the target is spread over the candidates by how much of the true
next query each gets right (`overlap_gain`; 1 for the true query itself). A suggester is
judged by its first suggestion's n-gram overlap with the next query (top-1 BLEU), and the
previous query, which a reformulation mostly repeats, is never the logged next query: trained
on the exact next query alone, a ranker never scores the session's queries (or, in-batch,
ranks them as negatives: they are the next queries of earlier positions) and, reranking,
cannot tell when one of them is the safer suggestion. Graded, it learns the expected overlap
of each candidate, the session's queries among them. In-batch, the next query of an earlier
position of the same session is scored in the session columns only, not twice.

Lexical negatives (`lexical_negatives`, Bi- and Poly-encoders): in-batch and uniform pool
negatives are easy, other sessions' queries on other topics, while what a reranker must
order are the generator's hypotheses, built from the session's own words. Each context also
meets the K pool entries that share the most words with its session so far (BM25 over the
pool's texts, `lexical_neighbours`; the session's own queries left out, since the pool holds
the training sessions' queries), the hard negatives of dense retrieval (Karpukhin et al.,
2020). With graded targets they take the share their overlap with the next query earns.

Generated candidates (`config.train.hypotheses_from`, every ranker): what a
reranker orders is a generator's beam, and no logged query is wrong the way a hypothesis
is. Each context also meets the suggestions of a generator that never saw its user
(`mtn_jax.data.hypothesis_files`: cross-fitted over folds of the training users), each text
once, not the true next query and, with graded targets, not a query of the session so far
(scored in the session columns); graded, each takes the share its overlap with the next
query earns.

Validation figures (`RankingTask.summarize`): the cross-entropy per context among the same
candidates, and how often the true next query scores first ('accuracy'); 'tokens' and
'pairs' count the contexts.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from mtn_jax.data import bm25
from mtn_jax.data import candidate_pool
from mtn_jax.data import hypothesis_files
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.models import polyencoder
from mtn_jax.models.base import ModelConfig
from mtn_jax.tasks import base

# Rows encoded at a time when the pool's candidate vectors are made, and the largest
# [contexts, candidates, codes] block of Poly-encoder scores held at once when scoring it.
ENCODE_CHUNK = 1024
SCORE_BLOCK = 1 << 24


def softmax_losses(logits: jax.Array, valid: jax.Array,
                   targets: jax.Array | None = None) -> dict[str, jax.Array]:
  """The loss sums of contexts that score their candidates, the true one in column 0.

  Args:
    logits: float32 [..., K], -inf for candidates masked out.
    valid: bool [...], the real contexts.
    targets: float32 [..., K], each context's target distribution over its candidates (0 at
      masked ones); None: all on column 0.
  Returns:
    'loss' (the cross-entropy against `targets`, summed), 'nll' (the true next query's
    negative log-likelihood, summed; = 'loss' without `targets`), 'correct' (contexts whose
    true next query scores first; a tie counts as correct), 'tokens' = 'pairs' (contexts).
  """
  log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  nll = -log_probs[..., 0]
  # 0 * -inf at a masked candidate would be nan: a zero target reads nothing there.
  loss = nll if targets is None else -jnp.where(targets > 0, targets * log_probs, 0.0).sum(-1)
  correct = logits[..., 0] >= logits.max(-1)
  weight = valid.astype(jnp.float32)
  total = lambda x: jnp.where(valid, x, 0.0).sum()
  return {'loss': total(loss), 'nll': total(nll), 'correct': (correct * weight).sum(),
          'tokens': weight.sum(), 'pairs': weight.sum()}


def _clipped_matches(grams: jax.Array, matchable: jax.Array, ref_grams: jax.Array,
                     ref_matchable: jax.Array) -> jax.Array:
  """The n-grams of a query found in a reference, each counted at most as often as there.

  Args:
    grams: int32 [..., k, g], a query's n-grams (g words each); matchable: bool [..., k].
    ref_grams, ref_matchable: the reference's, [..., k', g] and [..., k'] (broadcast).
  Returns:
    int32 [...]: the clipped matches (BLEU's modified n-gram counts).
  """
  def equal(a, b):  # [..., k, k'] an n-gram of a equals one of b
    return (a[..., :, None, :] == b[..., None, :, :]).all(-1)

  k = grams.shape[-2]
  # The i-th gram matches while fewer copies of it came before than the reference holds.
  before = (equal(grams, grams) & matchable[..., None, :]
            & jnp.tril(jnp.ones((k, k), bool), -1)).sum(-1)
  in_reference = (equal(grams, ref_grams) & ref_matchable[..., None, :]).sum(-1)
  return (matchable & (before < in_reference)).sum(-1)


def overlap_gain(candidates: jax.Array, references: jax.Array) -> jax.Array:
  """How much of a reference query a candidate gets right: the F1 of their unigrams and
  bigrams pooled, matches clipped as in BLEU.

  gain = 2 (m1 + m2) / (c1 + c2 + r1 + r2), m the clipped matches and c, r the candidate's and
  the reference's n-gram counts: 1 for the same query, 0 when no word is shared. A candidate
  longer than the reference loses precision, a shorter one recall (BLEU's brevity penalty).
  `<unk>` matches nothing: two unknown words need not be one word.

  Args:
    candidates: int32 [..., n] token ids, padding last; references: int32 [..., n]
      (broadcast to the candidates' leading axes).
  Returns:
    float32 [...] in [0, 1] (0 when both are padding).
  """
  def grams(ids):
    real = ids != PAD_ID
    known = real & (ids != UNK_ID)
    bigrams = jnp.stack([ids[..., :-1], ids[..., 1:]], axis=-1)
    return (ids[..., None], known, real.sum(-1), bigrams, known[..., :-1] & known[..., 1:],
            (real[..., :-1] & real[..., 1:]).sum(-1))

  c_uni, c_known, c1, c_bi, c_bi_known, c2 = grams(candidates)
  r_uni, r_known, r1, r_bi, r_bi_known, r2 = grams(references)
  matches = (_clipped_matches(c_uni, c_known, r_uni, r_known)
             + _clipped_matches(c_bi, c_bi_known, r_bi, r_bi_known))
  total = c1 + c2 + r1 + r2
  return jnp.where(total > 0, 2.0 * matches / jnp.maximum(total, 1), 0.0).astype(jnp.float32)


def session_so_far(queries: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The session's queries as candidates of its contexts (`session_candidates`).

  Args:
    queries: int32 [B, S, n]; context t reads queries 0..t and its true next query is t+1.
  Returns:
    ids int32 [B, P, P, n] (P = S-1; [b, t, s] is query s of session b) and keep bool
    [B, P, P]: s <= t, a real query, and not the true next query itself (a return to an
    earlier query, whose positive column holds it already).
  """
  num_sessions, num_positions = queries.shape[0], queries.shape[1] - 1
  so_far = queries[:, :-1]  # [B, P, n]
  keep = (jnp.tril(jnp.ones((num_positions, num_positions), bool))
          & (so_far != PAD_ID).any(-1)[:, None, :]
          & ~same_query(so_far[:, None], queries[:, 1:, None]))
  ids = jnp.broadcast_to(so_far[:, None], (num_sessions, num_positions) + so_far.shape[1:])
  return ids, keep


def graded_targets(logits: jax.Array, candidate_ids: jax.Array,
                   references: jax.Array) -> jax.Array:
  """Each context's target distribution: its candidates' overlap gains, normalised.

  Args:
    logits: float32 [..., K], the true next query in column 0, -inf at masked candidates.
    candidate_ids: int32 [..., K, n]; references: int32 [..., n], the true next queries.
  Returns:
    float32 [..., K]: 0 at masked candidates; the true query's gain is 1 even when `<unk>`
    keeps it from matching itself.
  """
  gains = overlap_gain(candidate_ids, references[..., None, :])
  gains = jnp.where(jnp.isfinite(logits), gains, 0.0).at[..., 0].set(1.0)
  return gains / gains.sum(-1, keepdims=True)


def same_query(a: jax.Array, b: jax.Array) -> jax.Array:
  """bool: token ids a [..., n] and b [..., n] (broadcast) are the same query."""
  return (a == b).all(-1)


def generated_candidates(hypotheses_from: str, data_dir: str, split, vocab,
                         max_words: int) -> np.ndarray:
  """int32 [num_queries, H, n]: the suggestions after each query of `split` of the
  generators `hypotheses_from` names (`mtn_jax.data.hypothesis_files`), as token ids."""
  found = hypothesis_files.generators(hypotheses_from, data_dir)
  return hypothesis_files.encode(hypothesis_files.split_suggestions(found, split), vocab, max_words)


def keep_generated(generated: jax.Array, next_queries: jax.Array,
                   so_far: jax.Array | None = None,
                   keep_so_far: jax.Array | None = None) -> jax.Array:
  """Which generated candidates a context scores: each text once, not padding, not its true
  next query (column 0 holds it) and not a query of the session so far where those are
  candidates too (`session_so_far`'s ids and keep).

  Args:
    generated: int32 [B, P, H, n]; next_queries: int32 [B, P, n];
    so_far: int32 [B, P, P, n] and keep_so_far: bool [B, P, P], or None.
  Returns:
    bool [B, P, H].
  """
  count = generated.shape[2]
  earlier = jnp.tril(jnp.ones((count, count), bool), -1)
  keep = ((generated != PAD_ID).any(-1) & ~same_query(generated, next_queries[:, :, None])
          & ~(same_query(generated[:, :, :, None], generated[:, :, None]) & earlier).any(-1))
  if so_far is not None:
    keep &= ~(same_query(generated[:, :, :, None], so_far[:, :, None])
              & keep_so_far[:, :, None]).any(-1)
  return keep


def lexical_index(data_dir: str) -> tuple[candidate_pool.CandidatePool, bm25.Bm25Index]:
  """The corpus folder's candidate pool and the BM25 index of its texts (`mtn_jax.data.bm25`,
  kept in `<data_dir>/pool_bm25`, rebuilt when the pool changes)."""
  pool = candidate_pool.load_pool(data_dir)
  return pool, bm25.open_index(os.path.join(data_dir, 'pool_bm25'), pool.texts)


def lexical_neighbours(pool: candidate_pool.CandidatePool, index: bm25.Bm25Index, split,
                       k: int) -> np.ndarray:
  """The pool entries closest in words to each context of `split` (`lexical_negatives`).

  BM25 of the session so far against the pool (`lexical_index`; each split's result cached
  beside the index); the session's own queries are left out (a training session's queries
  are all in the pool).

  Args:
    pool, index: `lexical_index` of the corpus folder.
    split: a `sessions.SessionSplit`.
    k: entries per context.
  Returns:
    int32 [num_queries, k]: row r, for the context that ends at query row r, the pool
    indices best first, -1 where fewer than k entries share a word with it.
  """
  in_pool = pool.ids_of(split.texts)  # [num_queries]
  contexts, session_rows = [], []
  for i in range(split.num_sessions):
    texts = split.session_texts(i)
    contexts += [' '.join(texts[:t + 1]) for t in range(len(texts))]
    session_rows += [slice(split.starts[i], split.starts[i + 1])] * len(texts)
  ids, _ = bm25.cached_top_k(
      index, split.name, contexts, k,
      exclude=lambda i, found: np.isin(found, in_pool[session_rows[i]]),
      exclusion='the session\'s own queries')
  return ids.astype(np.int32)


@dataclasses.dataclass(frozen=True, eq=False)
class DualEncoderTask(base.RankingTask):
  """The Bi-encoder (`poly_codes` unused) or the Poly-encoder: see the module docstring.

  Attributes:
    pool_queries: int32 [C, n] the candidate pool's token ids, where `pool_negatives` and
      `lexical_negatives` come from (None without them).
    data_dir: the corpus folder, where the lexical neighbours are found and whose sessions
      the generators of `hypotheses_from` must have read (None without either).
    hypotheses_from: `config.train.hypotheses_from`, the cross-fitted generators whose
      suggestions join each context's candidates ('' for none).
  """

  pool_queries: np.ndarray | None = None
  data_dir: str | None = None
  hypotheses_from: str = ''

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> DualEncoderTask:
    hypotheses_from = train.get('hypotheses_from', '')
    if not (cfg.pool_negatives or cfg.lexical_negatives or hypotheses_from):
      return cls(cfg)  # the negatives are the batch's own next queries
    if data_dir is None:
      raise ValueError('pool_negatives, lexical_negatives and hypotheses_from need the '
                       'corpus folder')
    pool = (candidate_pool.load_pool(data_dir).queries
            if cfg.pool_negatives or cfg.lexical_negatives else None)
    return cls(cfg, pool_queries=pool, data_dir=data_dir, hypotheses_from=hypotheses_from)

  LOSS_KEYS = ('lexical', 'hypotheses')

  @property
  def input_keys(self) -> tuple[str, ...]:
    return (('queries',) + (('lexical',) if self.cfg.lexical_negatives else ())
            + (('hypotheses',) if self.hypotheses_from else ()))

  def training_inputs(self, split, vocab) -> base.SplitInputs:
    """'lexical' int32 [num_queries, K]: with `lexical_negatives`, each context's
    `lexical_neighbours`; 'hypotheses' int32 [num_queries, H, n]: with `hypotheses_from`,
    the generators' suggestions after each query (`mtn_jax.inference.hypothesis_decoding`)."""
    inputs = self.context_inputs(split, vocab)
    if self.cfg.lexical_negatives:
      inputs.per_query['lexical'] = lexical_neighbours(*self._lexical_index, split,
                                                       self.cfg.lexical_negatives)
    if self.hypotheses_from:
      inputs.per_query['hypotheses'] = generated_candidates(
          self.hypotheses_from, self.data_dir, split, vocab, self.cfg.max_query_words)
    return inputs

  @classmethod
  def vector_index(cls, cfg: ModelConfig) -> bool:
    """The Bi-encoder's score is an inner product of fixed vectors; a Poly-encoder's context
    attends over its codes per candidate (`cfg` is a model config or its config section)."""
    return cfg.name == 'biencoder'

  @functools.cached_property
  def _lexical_index(self):
    # Opened once for the training and the validation split: it hashes every pool text.
    return lexical_index(self.data_dir)

  @property
  def poly(self) -> bool:
    return self.model.poly

  def scores(self, contexts: jax.Array, candidates: jax.Array) -> jax.Array:
    """contexts [..., m, d] x candidates [..., C, d] -> float32 [..., C]: the model's
    `polyencoder.dual_scores`, scaled as its config says."""
    return polyencoder.dual_scores(contexts, candidates, poly=self.poly,
                                   scale=polyencoder.score_scale(self.cfg))

  def contexts(self, params, queries: jax.Array) -> jax.Array:
    """queries int32 [B, S, n] -> the contexts of positions 0..S-2 [B, S-1, m, d]."""
    return self.model.apply({'params': params}, queries[:, :-1], method='contexts')

  def loss_sums(self, params, batch: Mapping[str, jax.Array], *, train: bool, rngs=None,
                groups: int = 1) -> dict[str, jax.Array]:
    """In-batch negatives within each of `groups` data-parallel groups, and with
    `session_candidates` the session's queries and graded targets (module docstring)."""
    queries = batch['queries']
    num_sessions, num_positions = queries.shape[0], queries.shape[1] - 1
    if num_sessions % groups:
      raise ValueError(f'a batch of {num_sessions} sessions does not split into {groups} '
                       'data-parallel groups')
    graded = self.cfg.session_candidates
    next_queries = queries[:, 1:]  # [B, P, n]
    drawn = None
    if self.cfg.pool_negatives:
      # Its own stream, folded from the step's key: the dropout masks stay those of a run
      # without pool negatives. Evaluation draws with a fixed key.
      key = jax.random.fold_in(rngs['dropout'], 1) if train else jax.random.PRNGKey(0)
      pool = jnp.asarray(self.pool_queries)
      drawn = pool[jax.random.randint(key, (self.cfg.pool_negatives,), 0, pool.shape[0])]

    lexical = None
    if self.cfg.lexical_negatives:
      found = batch['lexical'][:, :-1]  # [B, P, K] pool indices, -1 for none
      lexical = jnp.asarray(self.pool_queries)[jnp.maximum(found, 0)]  # [B, P, K, n]
      keep_lexical = (found >= 0) & ~same_query(lexical, next_queries[:, :, None])

    generated = None
    if self.hypotheses_from:
      generated = batch['hypotheses'][:, :-1]  # [B, P, H, n], padding rows for none

    def encode(module):
      # Position t's context reads queries 0..t, so the last query is no context; the first
      # is no one's next query, but with graded targets a candidate of every later context.
      return (module.contexts(queries[:, :-1], train=train),
              module.candidates(queries if graded else next_queries, train=train),
              *(None if extra is None else module.candidates(extra, train=train)
                for extra in (drawn, lexical, generated)))

    contexts, encoded, drawn_vectors, lexical_vectors, generated_vectors = self.model.apply(
        {'params': params}, rngs=rngs if train else None, method=encode)
    session_contexts = contexts  # [B, P, m, d]
    contexts = contexts.reshape((groups, -1) + contexts.shape[2:])  # [G, N, m, d]
    targets = encoded[:, 1:] if graded else encoded  # [B, P, d]
    targets = targets.reshape(groups, -1, targets.shape[-1])  # [G, N, d]
    ids = next_queries.reshape(groups, -1, next_queries.shape[-1])  # [G, N, n]
    real = (ids != PAD_ID).any(-1)  # [G, N]
    # logits[g, i, j]: context i against the next query of context j, both of group g.
    logits = self.scores(contexts, targets[:, None])
    count = ids.shape[1]
    negative = real[:, None, :] & ~jnp.eye(count, dtype=bool) & ~same_query(
        ids[:, :, None], ids[:, None, :])
    if graded:
      # The next query of an earlier position of the same session is a query of the session
      # so far: it is scored once, in the session columns.
      session = jnp.repeat(jnp.arange(num_sessions), num_positions).reshape(groups, -1)
      position = jnp.tile(jnp.arange(num_positions), num_sessions).reshape(groups, -1)
      negative &= ~((session[:, :, None] == session[:, None, :])
                    & (position[:, None, :] < position[:, :, None]))
    # Each context's candidates in blocks of columns: (scores, kept, token ids), [G, N, K]
    # and [G, N, K, n]; the true next query is column 0.
    blocks = [(jnp.diagonal(logits, axis1=1, axis2=2)[..., None],
               jnp.ones_like(real)[..., None], ids[:, :, None]),
              (logits, negative, jnp.broadcast_to(ids[:, None], logits.shape + ids.shape[-1:]))]
    by_context = lambda *block: tuple(x.reshape((groups, count) + x.shape[2:]) for x in block)
    if drawn is not None:
      from_pool = self.scores(contexts, drawn_vectors[None, None])  # [G, N, K]
      blocks.append((from_pool, ~same_query(ids[:, :, None], drawn[None, None]),
                     jnp.broadcast_to(drawn, from_pool.shape + drawn.shape[-1:])))
    if lexical is not None:
      blocks.append(by_context(
          self.scores(session_contexts, lexical_vectors),
          keep_lexical, lexical))
    if graded:
      # Context (b, t) against queries 0..t of session b.
      so_far, keep = session_so_far(queries)  # [B, P, P, n], [B, P, P]
      blocks.append(by_context(
          self.scores(session_contexts, encoded[:, None, :-1]),
          keep, so_far))
    if generated is not None:
      blocks.append(by_context(
          self.scores(session_contexts, generated_vectors),
          keep_generated(generated, next_queries, *((so_far, keep) if graded else ())),
          generated))
    logits = jnp.concatenate([jnp.where(kept, scores, -jnp.inf) for scores, kept, _ in blocks],
                             axis=-1)
    if not graded:
      return softmax_losses(logits, real)
    candidates = jnp.concatenate([block[2] for block in blocks], axis=-2)
    return softmax_losses(logits, real, graded_targets(logits, candidates, ids))

  def encode_candidates(self, params, candidates: jax.Array) -> jax.Array:
    """candidates int32 [C, n] -> y_cand float32 [C, d], `ENCODE_CHUNK` rows at a time."""
    encode = lambda ids: self.model.apply({'params': params}, ids, method='candidates')
    return jax.lax.map(encode, candidates, batch_size=ENCODE_CHUNK).astype(jnp.float32)

  def score_pool(self, params, batch: Mapping[str, jax.Array], cache: jax.Array) -> jax.Array:
    """float32 [B, S-1, C]: every cached candidate (y_cand [C, d]) after each position.

    The Poly-encoder's scores pass through a [B, S-1, C, m] block; candidates are taken in
    chunks that keep it under `SCORE_BLOCK` elements.
    """
    contexts = self.contexts(params, batch['queries'])  # [B, P, m, d]
    cache = cache.astype(contexts.dtype)
    if not self.poly:
      return self.scores(contexts, cache)
    num_contexts = math.prod(contexts.shape[:2])
    num_candidates = cache.shape[0]
    chunk = max(1, min(num_candidates, SCORE_BLOCK // (num_contexts * contexts.shape[2])))
    blocks = -(-num_candidates // chunk)
    padded = jnp.pad(cache, ((0, blocks * chunk - num_candidates), (0, 0)))
    scores = jax.lax.map(lambda block: self.scores(contexts, block),
                         padded.reshape(blocks, chunk, -1))  # [blocks, B, P, chunk]
    scores = jnp.moveaxis(scores, 0, 2).reshape(contexts.shape[:2] + (-1,))
    return scores[..., :num_candidates]

  def score_candidates(self, params, batch: Mapping[str, jax.Array],
                       candidates: jax.Array) -> jax.Array:
    """candidates int32 [B, S-1, K, n] -> float32 [B, S-1, K]."""
    contexts = self.contexts(params, batch['queries'])
    vectors = self.model.apply({'params': params}, candidates, method='candidates')
    return self.scores(contexts, vectors)


@dataclasses.dataclass(frozen=True, eq=False)
class CrossEncoderTask(base.RankingTask):
  """The Cross-encoder: see the module docstring.

  Attributes:
    pool_queries: int32 [C, n] the candidate pool's token ids, where negatives come from.
    data_dir, hypotheses_from: as `DualEncoderTask`'s.
  """

  pool_queries: np.ndarray | None = None
  data_dir: str | None = None
  hypotheses_from: str = ''

  # Nothing of a candidate can be computed without its context: no cache, no pool scoring
  # (no `score_pool`: it reranks the candidates of another ranker, or given ones).

  @classmethod
  def from_config(cls, cfg: ModelConfig, train: ml_collections.ConfigDict,
                  data_dir: str | None = None) -> CrossEncoderTask:
    if data_dir is None:
      raise ValueError('the Cross-encoder needs the corpus folder (its negatives come from '
                       'the candidate pool)')
    return cls(cfg, pool_queries=candidate_pool.load_pool(data_dir).queries,
               data_dir=data_dir, hypotheses_from=train.get('hypotheses_from', ''))

  LOSS_KEYS = ('hypotheses',)

  @property
  def input_keys(self) -> tuple[str, ...]:
    return ('queries',) + (('hypotheses',) if self.hypotheses_from else ())

  def training_inputs(self, split, vocab) -> base.SplitInputs:
    """'hypotheses' int32 [num_queries, H, n]: with `hypotheses_from`, the generators'
    suggestions after each query (`mtn_jax.inference.hypothesis_decoding`)."""
    inputs = self.context_inputs(split, vocab)
    if self.hypotheses_from:
      inputs.per_query['hypotheses'] = generated_candidates(
          self.hypotheses_from, self.data_dir, split, vocab, self.cfg.max_query_words)
    return inputs

  def init_params(self, rng: jax.Array):
    batch = self.example_batch()
    return self.model.init({'params': rng}, batch, batch['queries'][:, :, None],
                           train=False)['params']

  def loss_sums(self, params, batch: Mapping[str, jax.Array], *, train: bool, rngs=None,
                groups: int = 1) -> dict[str, jax.Array]:
    """The true next query against `cross_negatives` pool entries, per context, and with
    `session_candidates` against the session so far, graded (module docstring)."""
    del groups  # each context's loss is its own
    queries = batch['queries']
    next_queries = queries[:, 1:]  # [B, P, n]
    # Evaluation draws with a fixed key: the same negatives for every checkpoint.
    key = rngs['dropout'] if train else jax.random.PRNGKey(0)
    sample_key, dropout_key = jax.random.split(key)
    pool = jnp.asarray(self.pool_queries)
    drawn = jax.random.randint(sample_key, next_queries.shape[:2] + (self.cfg.cross_negatives,),
                               0, pool.shape[0])
    negatives = pool[drawn]  # [B, P, K, n]
    keep = ~same_query(negatives, next_queries[:, :, None])
    candidates = [next_queries[:, :, None], negatives]
    so_far = keep_so_far = None
    if self.cfg.session_candidates:
      so_far, keep_so_far = session_so_far(queries)
      candidates.append(so_far)
      keep = jnp.concatenate([keep, keep_so_far], axis=-1)
    if self.hypotheses_from:
      generated = batch['hypotheses'][:, :-1]  # [B, P, H, n]
      candidates.append(generated)
      keep = jnp.concatenate(
          [keep, keep_generated(generated, next_queries, so_far, keep_so_far)], axis=-1)
    candidates = jnp.concatenate(candidates, axis=2)  # [B, P, K', n]
    logits = self.model.apply({'params': params}, {'queries': queries[:, :-1]}, candidates,
                              train=train, rngs={'dropout': dropout_key} if train else None)
    logits = logits.at[..., 1:].set(jnp.where(keep, logits[..., 1:], -jnp.inf))
    real = (next_queries != PAD_ID).any(-1)
    if not self.cfg.session_candidates:
      return softmax_losses(logits, real)
    return softmax_losses(logits, real, graded_targets(logits, candidates, next_queries))

  def score_candidates(self, params, batch: Mapping[str, jax.Array],
                       candidates: jax.Array) -> jax.Array:
    """candidates int32 [B, S-1, K, n] -> float32 [B, S-1, K]."""
    return self.model.apply({'params': params}, {'queries': batch['queries'][:, :-1]},
                            candidates)
