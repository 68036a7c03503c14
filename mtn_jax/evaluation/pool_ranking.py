"""The pool's ranking protocols: every pair of a split ranked against the whole pool.

- `rank_split`: every (session prefix -> next query) pair of a split scored against the whole
  pool on the devices; for each pair its top suggestions (exact `jax.lax.top_k`), the rank of
  the logged next query among all C candidates (ties count against it, as in
  `metrics.ranks_from_scores`), and the poly-encoder paper's R@1/20 and R@1/100: the logged
  next query against 19 / 99 negatives drawn uniformly from the rest of the pool, seeded.
  A next query outside the pool cannot be retrieved: it ranks last (rank C + 1) in the
  full-pool figures, and the sampled protocols, which need its score, count only pairs whose
  next query is in the pool (`pairs_in_pool` says how many).
- `rank_sampled`: the sampled protocols alone, for a ranker that cannot score the whole pool.

The candidate vectors are those serving uses (`mtn_jax.inference.retrieval.candidate_cache`).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from mtn_jax import parallel
from mtn_jax import tasks
from mtn_jax.data import candidate_pool
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.inference import inputs
from mtn_jax.inference import retrieval

SAMPLED_PROTOCOLS = (20, 100)  # R@1/N: the next query among N - 1 sampled negatives


# ---------------------------------------------------------------------------------------------
# Ranking a split


@dataclasses.dataclass(frozen=True)
class SplitRanking:
  """Every pair of a split ranked against the pool, in pair order (`SessionSplit.pair_texts`).

  Attributes:
    suggestions: [pairs] the top pool entries' texts, best first.
    top_scores: float32 [pairs, k] their scores.
    pool_ranks: int64 [pairs] the logged next query's rank among all C candidates (1 = best;
      C + 1 where it is not in the pool).
    sampled_ranks: int64 [pairs, len(SAMPLED_PROTOCOLS)] its rank among itself and N - 1
      sampled negatives; 0 where it is not in the pool (no score to compare).
    zero_weight: float32 [pairs] the attention mass on the zero vector (NaN for a model
      without a user memory).
  """

  suggestions: list[list[str]]
  top_scores: np.ndarray
  pool_ranks: np.ndarray
  sampled_ranks: np.ndarray
  zero_weight: np.ndarray

  def figures(self, pairs: np.ndarray | slice = slice(None)) -> dict:
    """MRR and Recall@10 over the whole pool, and R@1/N of the sampled protocols, in
    percent, over the pairs `pairs` selects."""
    ranks = self.pool_ranks[pairs]
    sampled = self.sampled_ranks[pairs]
    in_pool = sampled[:, 0] > 0
    out = {'pairs': int(len(ranks)), 'pairs_in_pool': int(in_pool.sum())}
    if not len(ranks):
      return out
    if ranks.all():  # 0: a ranker that cannot score the whole pool (`rank_sampled`)
      out['mrr'] = 100 * metrics.mean_reciprocal_rank(ranks)
      out['recall_at_10'] = 100 * metrics.recall_at_k(ranks, 10)
    for column, size in enumerate(SAMPLED_PROTOCOLS):
      if in_pool.any():
        out[f'r1_of_{size}'] = 100 * metrics.recall_at_k(sampled[in_pool, column], 1)
    return out


def sampled_negatives(pool_ids: np.ndarray, pool_size: int, count: int,
                      seed: int) -> np.ndarray:
  """int32 [pairs, count]: for each pair, `count` pool entries drawn uniformly (with
  replacement) from every entry but its own next query (`pool_ids`, -1: none), fixed by
  `seed` whatever the model, so that every ranker meets the same negatives."""
  rng = np.random.default_rng(seed)
  drawn = rng.integers(0, max(pool_size - 1, 1), size=(len(pool_ids), count))
  # Skip the true entry: values at or above it move up by one.
  return np.where((pool_ids[:, None] >= 0) & (drawn >= pool_ids[:, None]), drawn + 1,
                  drawn).astype(np.int32)


def _pair_pool_ids(split: sessions.SessionSplit, pool: candidate_pool.CandidatePool, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """The pool ids of `split`'s queries [rows] (-1: not in the pool), each session's first
  pair index [sessions], each pair's next query's pool id [pairs], and the sampled
  protocols' seeded negatives int32 [pairs, max(SAMPLED_PROTOCOLS) - 1]."""
  pool_ids = pool.ids_of(split.texts)
  # The next query of every pair, in pair order: every row but each session's first.
  is_next = np.ones(len(pool_ids), bool)
  is_next[split.starts[:-1]] = False
  next_ids = pool_ids[is_next]
  negatives = sampled_negatives(next_ids, len(pool), max(SAMPLED_PROTOCOLS) - 1, seed)
  return pool_ids, split.first_pairs, next_ids, negatives


@functools.partial(jax.jit, static_argnames=('task', 'k'))
def _rank_batch(params, batch, cache, negatives, *, task, k: int):
  """One batch: top-k ids and scores [B, P, k], full-pool ranks [B, P], sampled ranks
  [B, P, len(SAMPLED_PROTOCOLS)] and zero-vector weights [B, P] (P = S-1)."""
  scores = task.score_pool(params, batch, cache)  # [B, P, C]
  top_scores, top_ids = jax.lax.top_k(scores, k)
  targets = batch['pool_ids'][:, 1:]
  in_pool = targets >= 0
  target_score = jnp.take_along_axis(scores, jnp.maximum(targets, 0)[..., None], axis=-1)
  pool_ranks = jnp.where(in_pool, (scores >= target_score).sum(-1), scores.shape[-1] + 1)
  negative_scores = jnp.take_along_axis(scores, negatives, axis=-1)  # [B, P, N]
  sampled = jnp.stack([1 + (negative_scores[..., :size - 1] >= target_score).sum(-1)
                       for size in SAMPLED_PROTOCOLS], axis=-1)
  sampled = jnp.where(in_pool[..., None], sampled, 0)
  zero_weight = (task.attention(params, batch)['zero_weight']
                 if isinstance(task, tasks.AttendsToMemory) else jnp.full(targets.shape, jnp.nan))
  return top_ids, top_scores, pool_ranks, sampled, zero_weight


def rank_split(trained, split: sessions.SessionSplit, workdir: str, *, k: int, seed: int,
               queries_per_batch: int, log=print) -> SplitRanking:
  """Ranks the whole pool after every prefix of `split` (see the module docstring); `k`
  suggestions are kept per pair. The negatives of the sampled protocols are fixed by
  `seed`."""
  task = trained.task
  if not isinstance(task, tasks.ScoresPool):
    raise ValueError(f'{trained.cfg.name} cannot score the whole pool (a cross-encoder '
                     'reranks the candidates of another ranker)')
  pool = candidate_pool.load_pool(preprocess.data_dir(workdir))
  cache = retrieval.candidate_cache(trained, pool, workdir, log=log)
  pool_ids, first_pair, _, negatives = _pair_pool_ids(split, pool, seed)
  k = min(k, len(pool))
  num_pairs = split.num_pairs
  top_ids = np.zeros((num_pairs, k), np.int64)
  top_scores = np.zeros((num_pairs, k), np.float32)
  pool_ranks = np.zeros(num_pairs, np.int64)
  sampled = np.zeros((num_pairs, len(SAMPLED_PROTOCOLS)), np.int64)
  zero_weight = np.full(num_pairs, np.nan, np.float32)
  # Every process ranks the whole split on its own devices (as `sources.Generate` decodes
  # it): a batch split over every host's devices could not be fetched back whole.
  mesh = parallel.local_mesh()
  params = parallel.replicated_locally(trained.params, mesh)
  done, started = 0, time.time()
  for batch in inputs.split_batches(task, trained.vocab, split,
                                    queries_per_batch=queries_per_batch,
                                    multiple_of=jax.local_device_count(),
                                    per_query={'pool_ids': pool_ids}):
    session_ids = batch.pop('session_ids')  # the rest: the model's inputs and 'pool_ids'
    real = session_ids >= 0
    positions = batch['queries'].shape[1] - 1
    pair_index = first_pair[np.maximum(session_ids, 0)][:, None] + np.arange(positions)
    batch_negatives = negatives[np.where(real[:, None], pair_index, 0)]
    out = jax.device_get(_rank_batch(
        params, parallel.shard_batch(batch, mesh), cache,
        parallel.shard_batch({'n': batch_negatives}, mesh)['n'], task=task, k=k))
    for array, target in zip(out, (top_ids, top_scores, pool_ranks, sampled, zero_weight)):
      target[pair_index[real]] = array[real]
    done += int(real.sum())
  log(f'  ranked {len(pool):,} candidates for {num_pairs:,} pairs of {done:,} sessions in '
      f'{time.time() - started:.1f} s', flush=True)
  return SplitRanking(suggestions=[[pool.texts[i] for i in row] for row in top_ids.tolist()],
                      top_scores=top_scores, pool_ranks=pool_ranks, sampled_ranks=sampled,
                      zero_weight=zero_weight)


@functools.partial(jax.jit, static_argnames=('task',))
def _rank_sampled_batch(params, batch, candidates, *, task):
  """The rank of column 0 (the logged next query) among its candidates [B, P, N, n], for
  the first `size` columns of each sampled protocol: int [B, P, len(SAMPLED_PROTOCOLS)]."""
  scores = task.score_candidates(params, batch, candidates)  # [B, P, N]
  return jnp.stack([1 + (scores[..., 1:size] >= scores[..., :1]).sum(-1)
                    for size in SAMPLED_PROTOCOLS], axis=-1)


def rank_sampled(trained, split: sessions.SessionSplit, workdir: str, *, seed: int,
                 queries_per_batch: int, log=print) -> SplitRanking:
  """The sampled protocols alone (R@1/20, R@1/100), for a ranker that scores given
  candidates but not the whole pool (a Cross-encoder): the logged next query and the same
  seeded negatives as `rank_split` draws, scored by `task.score_candidates`. The full-pool
  figures are left out (`pool_ranks` 0) and there are no suggestions."""
  task = trained.task
  pool = candidate_pool.load_pool(preprocess.data_dir(workdir))
  _, first_pair, next_ids, negatives = _pair_pool_ids(split, pool, seed)
  sampled = np.zeros((split.num_pairs, len(SAMPLED_PROTOCOLS)), np.int64)
  started = time.time()
  for batch in inputs.split_batches(task, trained.vocab, split,
                                    queries_per_batch=queries_per_batch):
    session_ids = batch.pop('session_ids')  # the rest: the model's inputs
    real = session_ids >= 0
    queries = batch['queries']
    positions = queries.shape[1] - 1
    pair_index = first_pair[np.maximum(session_ids, 0)][:, None] + np.arange(positions)
    drawn = pool.queries[negatives[np.where(real[:, None], pair_index, 0)]]  # [B, P, N-1, n]
    column = np.concatenate([queries[:, 1:, None], drawn], axis=2)
    ranks = np.asarray(_rank_sampled_batch(trained.params, batch, column, task=task))
    # Only pairs whose next query is in the pool have a rank (as in `rank_split`).
    in_pool = next_ids[np.where(real[:, None], pair_index, 0)] >= 0
    sampled[pair_index[real]] = np.where(in_pool[..., None], ranks, 0)[real]
  log(f'  scored the next query against {max(SAMPLED_PROTOCOLS) - 1} sampled negatives for '
      f'{split.num_pairs:,} pairs in {time.time() - started:.1f} s', flush=True)
  return SplitRanking(suggestions=[[] for _ in range(split.num_pairs)],
                      top_scores=np.zeros((split.num_pairs, 0), np.float32),
                      pool_ranks=np.zeros(split.num_pairs, np.int64), sampled_ranks=sampled,
                      zero_weight=np.full(split.num_pairs, np.nan, np.float32))
