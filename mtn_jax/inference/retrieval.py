"""Rankers at work in serving: candidate vectors cached per checkpoint, and the best pool
entries for sessions typed or read from a file.

A ranker (`tasks.RankingTask`) suggests entries of the candidate pool (the training split's
distinct queries, `mtn_jax.data.candidate_pool`). Here:

- `candidate_cache`: the pool's per-candidate part (`task.encode_candidates`), computed once
  for a checkpoint and kept in `<workdir>/candidate_cache/` (`vectors.npz` and `meta.json`,
  read without pickle); it is recomputed when the checkpoint step, the pool or the model
  config it was made with differ.
- `retrieve`: the top suggestions of sessions typed or read from a file (decode, suggest).
- `usearch_index`, `search_index`: for a Bi-encoder, whose score is the inner product of a
  context vector and a cached candidate vector, an approximate nearest-neighbour index
  (usearch's HNSW, inner product, float32) of the cached vectors, kept beside them
  (`usearch.index`, usearch's own format, and `usearch.json`, the candidate cache's key) and
  rebuilt when that key changes. `Retriever(index='usearch')` (`config.suggest.index`)
  searches it instead of scoring the whole pool, for pools too large for that;
  evaluation's ranking of a split (`mtn_jax.evaluation.pool_ranking`) stays exact, the
  reference.
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
from mtn_jax import files
from mtn_jax.data import candidate_pool
from mtn_jax.data import preprocess
from mtn_jax.models import polyencoder

_CACHE_DIR = 'candidate_cache'
INDEX_KINDS = ('exact', 'usearch')  # config.suggest.index
# The usearch index's HNSW graph: neighbours kept per vector, and the candidate lists while
# adding and while searching (longer: closer to exact, slower). A search's list is at least
# 2k long. Above usearch's defaults (16, 64) because inner products are a hard metric for
# the graph: the defaults miss much of a Bi-encoder's true top 10 (`launch/bench_rankers.py
# --index=usearch`; docs/notes/2026-11-27-figures-from-code-comments.md).
USEARCH_CONNECTIVITY = 32
USEARCH_EXPANSION_ADD = 128
USEARCH_EXPANSION_SEARCH = 256
_INDEX_FILE = 'usearch.index'
_INDEX_META = 'usearch.json'


# ---------------------------------------------------------------------------------------------
# The candidate cache


def _cache_key(trained, pool: candidate_pool.CandidatePool) -> dict:
  config = json.dumps(dataclasses.asdict(trained.cfg), sort_keys=True)
  return {'step': int(trained.step), 'pool': pool.fingerprint,
          'model': hashlib.sha256(config.encode()).hexdigest()[:16]}


def _write_json(path: str, value) -> None:
  files.write_text(path, json.dumps(value))


def candidate_cache(trained, pool: candidate_pool.CandidatePool, workdir: str, log=print):
  """The task's `encode_candidates` of the whole pool for `trained`'s checkpoint: read from
  `<workdir>/candidate_cache/` when it was made for the same checkpoint, pool and model,
  else computed and written there."""
  task = trained.task
  folder = os.path.join(workdir, _CACHE_DIR)
  meta_path = os.path.join(folder, 'meta.json')
  vectors_path = os.path.join(folder, 'vectors.npz')
  key = _cache_key(trained, pool)
  shapes = jax.eval_shape(task.encode_candidates, trained.params,
                          jax.ShapeDtypeStruct(pool.queries.shape, jnp.int32))
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
  with files.atomic_open(vectors_path, 'wb') as f:
    np.savez(f, **{f'leaf_{i}': np.asarray(a) for i, a in enumerate(flat)})
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
  # The index holds fixed candidate vectors: it finds the best of a model whose score is the
  # inner product of one context vector and such a vector (a Bi-encoder's), and no other's.
  if index == 'usearch' and not trained.task.vector_index(trained.cfg):
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
  # otherwise leaves the inner-product graph poorly connected (it then misses some of the top
  # 10, which centred vectors do not).
  # One thread: a graph built on several comes out a little different each time (the
  # insertion order races), and with it the suggestions; one build per checkpoint is cheap.
  index.add(np.arange(count), np.ascontiguousarray(vectors - vectors.mean(0), np.float32),
            threads=1)
  os.makedirs(folder, exist_ok=True)
  # The old key goes first: a run stopped between the two replacements leaves no key that
  # vouches for the wrong index.
  if os.path.exists(meta_path):
    os.remove(meta_path)
  with files.atomic_path(path) as temporary:
    index.save(temporary)
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
  (batch as `retrieve`'s); its score of a candidate is the inner product with y_cand. With
  `scaled_scores` the vector carries the score's 1/sqrt(d), so that the inner product is the
  score still."""
  contexts = task.contexts(params, _pad_one_query(batch)['queries'])  # [B, S, 1, d]
  return contexts[..., 0, :].astype(jnp.float32) * polyencoder.score_scale(task.cfg)


class Retriever:
  """A trained ranker with its pool and cached candidate vectors, for decode and suggest."""

  def __init__(self, trained, workdir: str, log=print, index: str = 'exact'):
    """`index`: 'exact' scores the whole pool; 'usearch' (a Bi-encoder only) searches the
    usearch index of the cached vectors (`usearch_index`), built once per cache key."""
    check_index(index, trained, workdir)
    self.trained = trained
    self.workdir = os.path.abspath(workdir)
    self.pool = candidate_pool.load_pool(preprocess.data_dir(workdir))
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
    inputs = {key: batch[key] for key in task.context_keys}
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
