"""Rankers at work: candidate vectors cached per checkpoint, exact top-k over the pool, and
the pool's ranking protocols.

A ranker (`tasks.RankingTask`) suggests entries of the candidate pool (the training split's
distinct queries, `mtn_jax.data.candidates`). Here:

- `candidate_cache`: the pool's per-candidate part (`task.encode_candidates`), computed once
  for a checkpoint and kept in `<workdir>/candidate_cache/` (`vectors.npz` and `meta.json`,
  read without pickle); it is recomputed when the checkpoint step, the pool or the model
  config it was made with differ.
- `rank_split`: every (session prefix -> next query) pair of a split scored against the whole
  pool on the devices; for each pair its top suggestions (exact `jax.lax.top_k`), the rank of
  the logged next query among all C candidates (ties count against it, as in
  `metrics.ranks_from_scores`), and the poly-encoder paper's R@1/20 and R@1/100: the logged
  next query against 19 / 99 negatives drawn uniformly from the rest of the pool, seeded.
  A next query outside the pool cannot be retrieved: it ranks last (rank C + 1) in the
  full-pool figures, and the sampled protocols, which need its score, count only pairs whose
  next query is in the pool (`pairs_in_pool` says how many).
- `retrieve`: the top suggestions of sessions typed or read from a file (decode, suggest).
- `usearch_index`, `search_index`: for a Bi-encoder, whose score is the inner product of a
  context vector and a cached candidate vector, an approximate nearest-neighbour index
  (usearch's HNSW, inner product, float32) of the cached vectors, kept beside them
  (`usearch.index`, usearch's own format, and `usearch.json`, the candidate cache's key) and
  rebuilt when that key changes. `Retriever(index='usearch')` (`config.suggest.index`)
  searches it instead of scoring the whole pool, for pools too large for that;
  `rank_split` (evaluation) stays exact, the reference.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mtn_jax import errors
from mtn_jax import input_pipeline
from mtn_jax import metrics
from mtn_jax import parallel
from mtn_jax.data import candidates
from mtn_jax.data import preprocess
from mtn_jax.data import sessions

SAMPLED_PROTOCOLS = (20, 100)  # R@1/N: the next query among N - 1 sampled negatives
_CACHE_DIR = 'candidate_cache'
INDEX_KINDS = ('exact', 'usearch')  # config.suggest.index
# The usearch index's HNSW graph: neighbours kept per vector, and the candidate lists while
# adding and while searching (longer: closer to exact, slower). A search's list is at least
# 2k long. Above usearch's defaults (16, 64) because inner products are a hard metric for
# the graph: on a random Bi-encoder's 20k vectors (d 128), recall of the top 10 was 0.74 at
# (16, 64), 0.89 at (16, 128), 0.99 at (32, 256); at (32, 256), 0.94 on 100k vectors
# (launch/bench_rankers.py --index=usearch).
USEARCH_CONNECTIVITY = 32
USEARCH_EXPANSION_ADD = 128
USEARCH_EXPANSION_SEARCH = 256
_INDEX_FILE = 'usearch.index'
_INDEX_META = 'usearch.json'


# ---------------------------------------------------------------------------------------------
# The candidate cache


def _cache_key(trained, pool: candidates.CandidatePool) -> dict:
  config = json.dumps(dataclasses.asdict(trained.cfg), sort_keys=True)
  return {'step': int(trained.step), 'pool': pool.fingerprint,
          'model': hashlib.sha256(config.encode()).hexdigest()[:16]}


def _write_json(path: str, value) -> None:
  """`value` as JSON at `path`, written aside and renamed: a reader never sees half a file."""
  with open(path + '.tmp', 'w', encoding='utf-8') as f:
    json.dump(value, f)
  os.replace(path + '.tmp', path)


def candidate_cache(trained, pool: candidates.CandidatePool, workdir: str, log=print):
  """The task's `encode_candidates` of the whole pool for `trained`'s checkpoint: read from
  `<workdir>/candidate_cache/` when it was made for the same checkpoint, pool and model,
  else computed and written there. None for a model with nothing to cache."""
  task = trained.task
  folder = os.path.join(workdir, _CACHE_DIR)
  meta_path = os.path.join(folder, 'meta.json')
  vectors_path = os.path.join(folder, 'vectors.npz')
  key = _cache_key(trained, pool)
  shapes = jax.eval_shape(task.encode_candidates, trained.params,
                          jax.ShapeDtypeStruct(pool.queries.shape, jnp.int32))
  if shapes is None:
    return None
  leaves, treedef = jax.tree.flatten(shapes)
  if os.path.exists(meta_path) and os.path.exists(vectors_path):
    with open(meta_path, encoding='utf-8') as f:
      saved = json.load(f)
    if saved == key:
      with np.load(vectors_path, allow_pickle=False) as stored:
        arrays = [stored[f'leaf_{i}'] for i in range(len(leaves))]
      if all(a.shape == l.shape and a.dtype == l.dtype for a, l in zip(arrays, leaves)):
        return jax.tree.unflatten(treedef, arrays)
  started = time.time()
  cache = jax.device_get(jax.jit(task.encode_candidates)(trained.params,
                                                          jnp.asarray(pool.queries)))
  os.makedirs(folder, exist_ok=True)
  flat = jax.tree.leaves(cache)
  tmp = vectors_path + '.tmp.npz'
  np.savez(tmp, **{f'leaf_{i}': np.asarray(a) for i, a in enumerate(flat)})
  os.replace(tmp, vectors_path)
  _write_json(meta_path, key)
  log(f'Encoded the {len(pool):,} candidates in {time.time() - started:.1f} s '
      f'(cached in {folder}).', flush=True)
  return cache


# ---------------------------------------------------------------------------------------------
# The approximate nearest-neighbour index (Bi-encoder)


def check_index(index: str, trained, workdir: str) -> None:
  """Refuses an `index` (`config.suggest.index`) that `trained`'s ranker cannot use."""
  if index not in INDEX_KINDS:
    raise errors.Error(f"config.suggest.index must be 'exact' or 'usearch', got {index!r}")
  # Only the Bi-encoder's score is the inner product of a context vector and a fixed
  # candidate vector; a Poly-encoder's context attends over its codes per candidate, and a
  # Cross-encoder reads both together, so no index of fixed vectors finds their best.
  if index == 'usearch' and trained.cfg.name != 'biencoder':
    raise errors.Error(f"config.suggest.index='usearch' needs a Bi-encoder (its score is an "
                       f'inner product of fixed vectors): {workdir} holds a '
                       f"{trained.cfg.name!r} model; use config.suggest.index='exact'")


def usearch_index(vectors: np.ndarray, key: dict, folder: str, log=print):
  """The usearch index (inner product, float32) of `vectors` float32 [C, d] less their
  mean, entry i under key i: read from `<folder>/usearch.index` when `<folder>/usearch.json`
  holds `key` (the candidate cache's `_cache_key`, so a new checkpoint or pool rebuilds it)
  and the same graph settings, else built and written there."""
  from usearch.index import Index  # pylint: disable=g-import-not-at-top
  path = os.path.join(folder, _INDEX_FILE)
  meta_path = os.path.join(folder, _INDEX_META)
  count, ndim = vectors.shape
  expected = {**key, 'count': int(count), 'ndim': int(ndim), 'centred': True,
              'connectivity': USEARCH_CONNECTIVITY, 'expansion_add': USEARCH_EXPANSION_ADD}
  if os.path.exists(meta_path) and os.path.exists(path):
    with open(meta_path, encoding='utf-8') as f:
      saved = json.load(f)
    if saved == expected:
      try:
        index = Index.restore(path)
      except (RuntimeError, ValueError):  # a damaged file (usearch's errors): rebuilt below
        index = None
      if index is not None and len(index) == count and index.ndim == ndim:
        return index
  started = time.time()
  index = Index(ndim=ndim, metric='ip', dtype='f32', connectivity=USEARCH_CONNECTIVITY,
                expansion_add=USEARCH_EXPANSION_ADD, expansion_search=USEARCH_EXPANSION_SEARCH)
  # Less their mean, every score of a context moves by the same -y_ctx . mean, so its
  # ranking is the same; a direction all the vectors share (common in trained embeddings)
  # otherwise leaves the inner-product graph poorly connected (measured: 0.94 of the top 10
  # of 500 N(1, 1) vectors in 16 dimensions found, 1.0 centred).
  # One thread: a graph built on several comes out a little different each time (the
  # insertion order races), and with it the suggestions; one build per checkpoint is cheap.
  index.add(np.arange(count), np.ascontiguousarray(vectors - vectors.mean(0), np.float32),
            threads=1)
  os.makedirs(folder, exist_ok=True)
  # The old key goes first: a run stopped between the two replacements leaves no key that
  # vouches for the wrong index.
  if os.path.exists(meta_path):
    os.remove(meta_path)
  index.save(path + '.tmp')
  os.replace(path + '.tmp', path)
  _write_json(meta_path, expected)
  log(f'Indexed the {count:,} candidate vectors with usearch in '
      f'{time.time() - started:.1f} s (saved in {path}).', flush=True)
  return index


def search_index(index, vectors: np.ndarray, queries: np.ndarray, k: int,
                 expansion: int = USEARCH_EXPANSION_SEARCH) -> tuple[np.ndarray, np.ndarray]:
  """The `k` best entries of `index` (`usearch_index` of `vectors` float32 [C, d]) for each
  of `queries` float32 [N, d], by inner product, the graph searched with a candidate list of
  max(`expansion`, 2k).

  Returns:
    ids int64 [N, k] and scores float32 [N, k], best first; -1 and -inf past the entries
    the search found (at most C). The scores are recomputed from `vectors` (the index's own
    distance, 1 - score, rounds large scores), so they are the exact path's.
  """
  from usearch.index import BatchMatches  # pylint: disable=g-import-not-at-top
  queries = np.ascontiguousarray(queries, np.float32)
  index.expansion_search = max(expansion, 2 * k)
  matches = index.search(queries, k)
  if isinstance(matches, BatchMatches):
    keys, counts = np.asarray(matches.keys), np.asarray(matches.counts)
  else:  # one query: one row of matches, as long as the search found
    keys, counts = np.asarray(matches.keys)[None], np.array([len(matches.keys)])
  found = np.arange(k) < counts[:, None]  # [N, k]
  keys = np.pad(keys, ((0, 0), (0, k - keys.shape[1])))
  ids = np.where(found, keys.astype(np.int64), -1)
  scores = np.einsum('nd,nkd->nk', queries, vectors[np.maximum(ids, 0)].astype(np.float32))
  scores = np.where(found, scores, -np.inf).astype(np.float32)
  order = np.argsort(-scores, axis=1, kind='stable')  # best first by the exact scores
  return np.take_along_axis(ids, order, 1), np.take_along_axis(scores, order, 1)


# ---------------------------------------------------------------------------------------------
# Ranking a split


@dataclasses.dataclass(frozen=True)
class SplitRanking:
  """Every pair of a split ranked against the pool, in pair order (`evaluate.pair_texts`).

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


def _pair_pool_ids(split: sessions.SessionSplit, pool: candidates.CandidatePool, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """The pool ids of `split`'s queries [rows] (-1: not in the pool), each session's first
  pair index [sessions], each pair's next query's pool id [pairs], and the sampled
  protocols' seeded negatives int32 [pairs, max(SAMPLED_PROTOCOLS) - 1]."""
  pool_ids = pool.ids_of(split.texts)
  pairs_per_session = split.lengths - 1
  first_pair = np.cumsum(pairs_per_session) - pairs_per_session
  # The next query of every pair, in pair order: every row but each session's first.
  is_next = np.ones(len(pool_ids), bool)
  is_next[split.starts[:-1]] = False
  next_ids = pool_ids[is_next]
  negatives = sampled_negatives(next_ids, len(pool), max(SAMPLED_PROTOCOLS) - 1, seed)
  return pool_ids, first_pair, next_ids, negatives


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
  attention = getattr(task, 'attention', None)
  zero_weight = (attention(params, batch)['zero_weight'] if attention is not None
                 else jnp.full(targets.shape, jnp.nan))
  return top_ids, top_scores, pool_ranks, sampled, zero_weight


def rank_split(trained, split: sessions.SessionSplit, workdir: str, *, k: int, seed: int,
               queries_per_batch: int, log=print) -> SplitRanking:
  """Ranks the whole pool after every prefix of `split` (see the module docstring); `k`
  suggestions are kept per pair. The negatives of the sampled protocols are fixed by
  `seed`."""
  task = trained.task
  if getattr(task, 'score_pool', None) is None:
    raise ValueError(f'{trained.cfg.name} cannot score the whole pool (a cross-encoder '
                     'reranks the candidates of another ranker)')
  pool = candidates.load_pool(preprocess.data_dir(workdir))
  cache = candidate_cache(trained, pool, workdir, log=log)
  pool_ids, first_pair, _, negatives = _pair_pool_ids(split, pool, seed)
  k = min(k, len(pool))
  num_pairs = split.num_pairs
  top_ids = np.zeros((num_pairs, k), np.int64)
  top_scores = np.zeros((num_pairs, k), np.float32)
  pool_ranks = np.zeros(num_pairs, np.int64)
  sampled = np.zeros((num_pairs, len(SAMPLED_PROTOCOLS)), np.int64)
  zero_weight = np.full(num_pairs, np.nan, np.float32)
  mesh = parallel.make_mesh()
  params = jax.device_put(trained.params, parallel.replicated(mesh))
  keys = tuple(dict.fromkeys(task.input_keys + ('pool_ids',)))
  done, started = 0, time.time()
  for batch in input_pipeline.make_eval_iterator(
      split, queries_per_batch=queries_per_batch, multiple_of=jax.device_count(),
      per_query={**task.per_query_inputs(split, trained.vocab), 'pool_ids': pool_ids},
      per_session=task.per_session_inputs(split)):
    session_ids = batch['session_ids']
    real = session_ids >= 0
    positions = batch['queries'].shape[1] - 1
    pair_index = first_pair[np.maximum(session_ids, 0)][:, None] + np.arange(positions)
    batch_negatives = negatives[np.where(real[:, None], pair_index, 0)]
    out = jax.device_get(_rank_batch(
        params, parallel.shard_batch({key: batch[key] for key in keys}, mesh), cache,
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
  pool = candidates.load_pool(preprocess.data_dir(workdir))
  _, first_pair, next_ids, negatives = _pair_pool_ids(split, pool, seed)
  sampled = np.zeros((split.num_pairs, len(SAMPLED_PROTOCOLS)), np.int64)
  started = time.time()
  for batch in input_pipeline.make_eval_iterator(split, queries_per_batch=queries_per_batch):
    session_ids = batch['session_ids']
    real = session_ids >= 0
    queries = batch['queries']
    positions = queries.shape[1] - 1
    pair_index = first_pair[np.maximum(session_ids, 0)][:, None] + np.arange(positions)
    drawn = pool.queries[negatives[np.where(real[:, None], pair_index, 0)]]  # [B, P, N-1, n]
    column = np.concatenate([queries[:, 1:, None], drawn], axis=2)
    ranks = np.asarray(_rank_sampled_batch(trained.params, {'queries': queries}, column,
                                           task=task))
    # Only pairs whose next query is in the pool have a rank (as in `rank_split`).
    in_pool = next_ids[np.where(real[:, None], pair_index, 0)] >= 0
    sampled[pair_index[real]] = np.where(in_pool[..., None], ranks, 0)[real]
  log(f'  scored the next query against {max(SAMPLED_PROTOCOLS) - 1} sampled negatives for '
      f'{split.num_pairs:,} pairs in {time.time() - started:.1f} s', flush=True)
  return SplitRanking(suggestions=[[] for _ in range(split.num_pairs)],
                      top_scores=np.zeros((split.num_pairs, 0), np.float32),
                      pool_ranks=np.zeros(split.num_pairs, np.int64), sampled_ranks=sampled,
                      zero_weight=np.full(split.num_pairs, np.nan, np.float32))


# ---------------------------------------------------------------------------------------------
# Suggestions for given sessions


@functools.partial(jax.jit, static_argnames=('task', 'k'))
def retrieve(params, batch, cache, *, task, k: int) -> tuple[jax.Array, jax.Array]:
  """The `k` best pool entries after EVERY query of each session, the last one included.

  Args:
    batch: the task's input keys; 'queries' int32 [B, S, n].
  Returns:
    ids int32 [B, S, k] and scores float32 [B, S, k], best first.
  """
  scores = task.score_pool(params, _pad_one_query(batch), cache)  # [B, S, C]
  top_scores, top_ids = jax.lax.top_k(scores, k)
  return top_ids, top_scores


def _pad_one_query(batch: dict) -> dict:
  # One padding query at the end: the rankers score the context after query t as the
  # prediction of query t+1, and are causal, so it changes no earlier position.
  padded = dict(batch)
  for key in ('queries', 'targets', 'pool_ids'):
    if key in padded:
      value = padded[key]
      padded[key] = jnp.concatenate([value, jnp.zeros_like(value[:, :1])], axis=1)
  return padded


@functools.partial(jax.jit, static_argnames=('task',))
def bi_contexts(params, batch, *, task) -> jax.Array:
  """A Bi-encoder's context vector after EVERY query of each session: float32 [B, S, d]
  (batch as `retrieve`'s); its score of a candidate is the inner product with y_cand."""
  contexts = task.contexts(params, _pad_one_query(batch)['queries'])  # [B, S, 1, d]
  return contexts[..., 0, :].astype(jnp.float32)


class Retriever:
  """A trained ranker with its pool and cached candidate vectors, for decode and suggest."""

  def __init__(self, trained, workdir: str, log=print, index: str = 'exact'):
    """`index`: 'exact' scores the whole pool; 'usearch' (a Bi-encoder only) searches the
    usearch index of the cached vectors (`usearch_index`), built once per cache key."""
    check_index(index, trained, workdir)
    self.trained = trained
    self.pool = candidates.load_pool(preprocess.data_dir(workdir))
    self.cache = candidate_cache(trained, self.pool, workdir, log=log)
    self.index = None
    if index == 'usearch':
      self.cache = np.asarray(self.cache, np.float32)  # [C, d], host side for the rescoring
      self.index = usearch_index(self.cache, _cache_key(trained, self.pool),
                                 os.path.join(workdir, _CACHE_DIR), log=log)

  def suggestions(self, batch: dict, k: int, sessions_queries: Sequence[Sequence[str]], *,
                  exclude_session_queries: bool) -> list[list[list[dict]]]:
    """[row][position] the `k` best entries ({'query', 'score'}) after each query of each
    row's session (`sessions_queries[row]`: its texts; rows past them are padding); with
    `exclude_session_queries`, never one the session holds up to that position."""
    task = self.trained.task
    extra = max(len(q) for q in sessions_queries) if exclude_session_queries else 0
    # The model's inputs; the training targets are not among what a session offers.
    inputs = {key: batch[key] for key in task.input_keys if key in batch}
    wanted = min(k + extra, len(self.pool))
    if self.index is None:
      ids, scores = jax.device_get(retrieve(self.trained.params, inputs, self.cache, task=task,
                                            k=wanted))
    else:
      contexts = np.asarray(bi_contexts(self.trained.params, inputs, task=task))  # [B, S, d]
      ids, scores = search_index(self.index, self.cache,
                                 contexts.reshape(-1, contexts.shape[-1]), wanted)
      ids = ids.reshape(contexts.shape[:2] + (wanted,))
      scores = scores.reshape(ids.shape)
    out = []
    for row, queries in enumerate(sessions_queries):
      per_position = []
      for t in range(len(queries)):
        seen = set(queries[:t + 1]) if exclude_session_queries else set()
        ranked = [{'query': self.pool.texts[i], 'score': float(s)}
                  for i, s in zip(ids[row, t].tolist(), scores[row, t].tolist())
                  if i >= 0 and self.pool.texts[i] not in seen]  # -1: the index found fewer
        per_position.append(ranked[:k])
      out.append(per_position)
    return out

  def history_items(self, history: Sequence[str]) -> np.ndarray:
    """int32 [len(history)]: the pool entries of a user's earlier queries, -1 outside it."""
    return self.pool.ids_of(list(history))
