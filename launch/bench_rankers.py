"""Ranker latency: milliseconds to score a pool of candidates for ONE context, as in Table 5 of
the poly-encoder paper (Humeau et al., ICLR 2020), for the Bi-, Poly- and Cross-encoders.

  python launch/bench_rankers.py
  python launch/bench_rankers.py --sizes=128x2,256x4 --pools=1000,10000,100000
  python launch/bench_rankers.py --rankers=cross --cross_direct --json=/tmp/rankers.json
  python launch/bench_rankers.py --rankers=bi --index=usearch --pools=10000,100000,1000000

In: a ranker config (default `configs/polyencoder_aol.py:small`: d_model 128, 2 layers) and
flags. No data and no training: weights are randomly initialised (the cost of scoring does
not depend on them) for a vocabulary of `--vocab_size` words, and sessions and candidates are
synthetic AOL-shaped queries (`synthetic_batches.synthetic_queries`: 1..max_query_words words
in the real sample's mix); each context is a session of `--session_queries` queries.

What is timed, per ranker, model size and pool size C, as a server would answer one context:
- Bi- and Poly-encoders: the candidate vectors of the pool (`task.encode_candidates`) are
  computed beforehand and are on the device; a call encodes the one context (its flat
  source, `q_0 <sep> ... <sep> q_t`, alone: one row) and scores the C cached candidates with
  the task's own `score_pool`, then takes the top `--top_k`.
- Cross-encoder: nothing can be precomputed but the candidates' token ids; a call encodes the
  context jointly with each of the C candidates (`model.apply(method='score_last')`, in
  chunks of `--cross_chunk` candidates under `jax.lax.map`) and takes the top `--top_k`. Pools
  above `--cross_measure` candidates are extrapolated linearly from its time (marked
  "extrap."), unless `--cross_direct`.
- With `--index=usearch`, also the Bi-encoder through the approximate nearest-neighbour index
  of `config.suggest.index='usearch'` (`retrieval.usearch_index`, built beforehand from the
  cached vectors, its build time reported): a call encodes the one context (jit-compiled)
  and searches the index on the host (`retrieval.search_index`, the top `--top_k` rescored
  exactly), as `retrieval.Retriever` does; its recall@k against the exact call's top k, over
  64 more synthetic contexts, is reported beside ("Bi-encoder (usearch)").
Each is one jit-compiled function; `--warmup` calls (compilation included) are not timed,
then `--repeats` calls, each ended by `block_until_ready`, of which the median and the mean
are printed in milliseconds. A single JAX device runs it (`--cpu_devices=1`, all cores
working on each operation), as one context's latency wants, not the trainer's one device
per core.

Out: a markdown table on stdout with the paper's figures beside (an 80-core Xeon CPU running
BERT-base-sized models, 12 layers of d = 768: not this model's size), the machine, the config
and the date; with `--json=PATH` the same as JSON. Times depend on the machine's load, which
is printed (the 1-minute load average) and should be low.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report
from launch import synthetic_batches
from mtn_jax import cli
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax.inference import retrieval
from mtn_jax.models.base import session_sources
from mtn_jax.tasks import rankers
# pylint: enable=g-import-not-at-top,wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The rankers of the table: --rankers name -> (display name, model name, poly codes).
RANKERS = {'bi': ('Bi-encoder', 'biencoder', 1), 'poly16': ('Poly-encoder 16', 'polyencoder', 16),
           'poly64': ('Poly-encoder 64', 'polyencoder', 64),
           'poly360': ('Poly-encoder 360', 'polyencoder', 360),
           'cross': ('Cross-encoder', 'crossencoder', 16)}
# Humeau et al. 2020, Table 5: ms per context on an 80-core Xeon CPU, for 1k and 100k
# candidates (BERT-base-sized encoders).
PAPER_MS = {'bi': {1000: 115, 100_000: 160}, 'poly16': {1000: 122, 100_000: 678},
            'poly64': {1000: 126, 100_000: 692}, 'poly360': {1000: 160, 100_000: 837},
            'cross': {1000: 21_700, 100_000: 2_200_000}}
AOL_VOCAB_SIZE = 76_604

_CONFIG = config_flags.DEFINE_config_file(
    'config', os.path.join(REPO, 'configs', 'polyencoder_aol.py') + ':small',
    'A ranker config (path[:variant]); its model and data sizes are used.', lock_config=True)
_RANKERS = flags.DEFINE_list('rankers', list(RANKERS), f'Rankers to time, of {list(RANKERS)}.')
_POOLS = flags.DEFINE_list('pools', ['1000', '100000'], 'Pool sizes C (candidates).')
bench_report.positive_list('pools')
_SIZES = flags.DEFINE_list(
    'sizes', [], 'Model sizes D x L (d_model x layers of each encoder), e.g. 128x2,256x4; '
    'emb_dim = D, and ff_dim and the heads scale with D as in the config (fixed head size). '
    'Empty: the config\'s size.')
_VOCAB_SIZE = flags.DEFINE_integer(
    'vocab_size', AOL_VOCAB_SIZE, 'Vocabulary of the random models (76,604: AOL in the MTN '
    'paper; the 500-user sample has ~2,705 words). It changes no scoring cost but the '
    'embedding lookups.')
_SESSION_QUERIES = flags.DEFINE_integer('session_queries', 3,
                                        'Queries in the context (a session so far).')
_TOP_K = flags.DEFINE_integer('top_k', 10, 'Best candidates kept per call (0: scores only).')
_REPEATS = flags.DEFINE_integer('repeats', 20, 'Timed calls per measurement.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed calls first (the first compiles).')
_CROSS_CHUNK = flags.DEFINE_integer('cross_chunk', 1000,
                                    'Candidates the Cross-encoder encodes at a time.')
_CROSS_MEASURE = flags.DEFINE_integer(
    'cross_measure', 1000, 'Largest pool the Cross-encoder is timed on; larger pools are '
    'extrapolated linearly from it (its time x C / cross_measure).')
_CROSS_DIRECT = flags.DEFINE_bool('cross_direct', False,
                                  'Time the Cross-encoder on every pool, none extrapolated.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the weights, sessions and candidates.')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', 1, 'JAX devices of a CPU-only host (1: one device for all cores, as one '
    'context\'s latency wants; 0: one per core, as the trainer).')
_JSON = flags.DEFINE_string('json', '', 'Also write the figures to this JSON file.')
_INDEX = flags.DEFINE_enum(
    'index', 'exact', retrieval.INDEX_KINDS, "'usearch': also time the Bi-encoder's query on "
    "the usearch index (config.suggest.index='usearch') beside its exact scoring.")


# ---------------------------------------------------------------------------------------------
# Machine


# ---------------------------------------------------------------------------------------------
# Models and the timed functions


def parse_size(text: str) -> tuple[int, int]:
  try:
    d_model, num_layers = (int(x) for x in text.lower().split('x'))
  except ValueError:
    raise app.UsageError(f'--sizes: expected D x L such as 128x2, got {text!r}') from None
  return d_model, num_layers


def ranker_fields(config, ranker: str, size: tuple[int, int] | None) -> dict[str, Any]:
  """`config.model`'s fields for `ranker` at `size` (d_model, layers), or the config's size."""
  fields = config.model.to_dict()
  _, fields['name'], fields['poly_codes'] = RANKERS[ranker]
  fields['dropout'] = 0.0
  if size is not None:
    d_model, num_layers = size
    scale = d_model / fields['d_model']
    head_size = fields['d_model'] // fields['num_heads']
    if d_model % head_size:
      raise app.UsageError(f'--sizes: d_model {d_model} is no multiple of the config\'s head '
                           f'size {head_size}')
    fields.update(d_model=d_model, emb_dim=d_model, num_heads=d_model // head_size,
                  ff_dim=max(1, round(fields['ff_dim'] * scale)), query_layers=num_layers,
                  session_layers=num_layers)
  return fields


def make_ranker(config, ranker: str, size, vocab_size: int, seed: int, pool: np.ndarray):
  """(task, params) of a randomly initialised ranker."""
  cfg = models.make_config(ranker_fields(config, ranker, size), vocab_size=vocab_size,
                           max_query_words=config.data.max_query_words)
  if ranker != 'cross' and cfg.context_encoder != 'flat':
    # `flat_context` encodes the one context as one row, which MTN's per-query encoder
    # cannot read.
    raise app.UsageError(f'bench_rankers times the flat context encoder, not '
                         f'config.model.context_encoder={cfg.context_encoder!r}')
  if ranker == 'cross':
    task = rankers.CrossEncoderTask(cfg, pool_queries=pool[:16])
  else:
    task = rankers.DualEncoderTask(cfg)
  return task, jax.jit(task.init_params)(jax.random.PRNGKey(seed))


def flat_context(session: np.ndarray) -> np.ndarray:
  """int32 [2, L]: a session [S, n] as one query holding its flat source (q_0 <sep> ... q_t,
  L = S (n + 1) - 1 tokens), then an empty query. Position 0 of this two-query session is the
  context after the session's last query, and the only context the dual encoders encode
  (`session_sources` gives the same tokens at the same positions; `check_flat_context`)."""
  sources, _ = session_sources(jnp.asarray(session[None]))
  return np.stack([np.asarray(sources[-1]), np.zeros(sources.shape[-1], np.int32)]).astype(
      np.int32)


def dual_function(task, top_k: int):
  def one_context(params, context, cache):
    scores = task.score_pool(params, {'queries': context[None]}, cache)[0, 0]  # [C]
    return jax.lax.top_k(scores, top_k) if top_k else scores
  return jax.jit(one_context)


def cross_function(task, top_k: int, chunk: int, pool_size: int):
  def one_context(params, session, candidates):
    # candidates int32 [C, n], C a multiple of `chunk`; rows from `pool_size` on are padding,
    # scored (a whole chunk runs) but never returned.
    score = lambda block: task.model.apply({'params': params}, session[None], block[None],
                                           method='score_last')[0]
    scores = jax.lax.map(score, candidates.reshape(-1, chunk, candidates.shape[-1]))
    scores = jnp.where(jnp.arange(candidates.shape[0]) < pool_size, scores.reshape(-1),
                       -jnp.inf)
    return jax.lax.top_k(scores, top_k) if top_k else scores
  return jax.jit(one_context)


def check_flat_context(task, params, session: np.ndarray, cache) -> float:
  """The largest difference between the one-row context's scores and those of the same
  context as the task scores it inside the whole session (position S-1)."""
  padded = np.concatenate([session, np.zeros_like(session[:1])])[None]

  @jax.jit
  def difference(params, padded, one_row, cache):
    whole = task.score_pool(params, {'queries': padded}, cache)[0, -1]
    alone = task.score_pool(params, {'queries': one_row[None]}, cache)[0, 0]
    return jnp.abs(whole - alone).max()

  # At full float32 precision: a GPU's default (TF32 matrix products) moves scores by ~1e-2,
  # which is not the difference this check looks for.
  with jax.default_matmul_precision('highest'):
    return float(difference(params, padded, flat_context(session), cache))


def usearch_function(task, index, vectors: np.ndarray, top_k: int):
  """One context through the usearch index, as `retrieval.Retriever` does: the context
  vector on the device, then the index's top `top_k` on the host."""
  encode = jax.jit(lambda params, context: task.contexts(params, context[None])[0, 0, 0]
                   .astype(jnp.float32))
  def one_context(params, context):
    vector = np.asarray(encode(params, context))[None]  # [1, d]
    return retrieval.search_index(index, vectors, vector, top_k)
  return one_context


def time_calls(call, inputs: list, warmup: int, repeats: int) -> list[float]:
  """Seconds of each of `repeats` calls (inputs taken in turn), after `warmup` calls."""
  for i in range(warmup):
    jax.block_until_ready(call(inputs[i % len(inputs)]))
  times = []
  for i in range(repeats):
    args = inputs[i % len(inputs)]
    start = time.perf_counter()
    jax.block_until_ready(call(args))
    times.append(time.perf_counter() - start)
  return times


def summary(times: list[float]) -> dict[str, Any]:
  ms = [1000 * t for t in times]
  return {'median_ms': statistics.median(ms), 'mean_ms': statistics.fmean(ms),
          'min_ms': min(ms), 'times_ms': [round(t, 4) for t in ms]}


def measure(config, *, rankers: list[str], pools: list[int], sizes: list, vocab_size: int,
            session_queries: int, top_k: int, repeats: int, warmup: int, cross_chunk: int,
            cross_measure: int, cross_direct: bool, seed: int, index: str = 'exact',
            log=print) -> list[dict]:
  """One row per (size, ranker, pool): see the module docstring."""
  rng = np.random.default_rng(seed)
  n = config.data.max_query_words
  largest = max(pools)
  pool = synthetic_batches.synthetic_queries(rng, (largest,), n, vocab_size)
  sessions = [synthetic_batches.synthetic_queries(rng, (session_queries,), n, vocab_size)
              for _ in range(4)]
  rows = []
  for size in sizes:
    for ranker in rankers:
      task, params = make_ranker(config, ranker, size, vocab_size, seed, pool)
      cfg = task.cfg
      base = {'ranker': ranker, 'label': RANKERS[ranker][0], 'd_model': cfg.d_model,
              'layers': cfg.query_layers, 'ff_dim': cfg.ff_dim, 'num_heads': cfg.num_heads,
              'parameters': models.count_params(params)}
      if ranker != 'cross':
        started = time.perf_counter()
        cache = jax.block_until_ready(
            jax.jit(task.encode_candidates)(params, jnp.asarray(pool)))
        encode_s = time.perf_counter() - started
        check = check_flat_context(task, params, sessions[0], cache[:min(largest, 4096)])
        if check > 1e-4:
          raise AssertionError(f'{ranker}: the one-row context scores differ by {check}')
        contexts = [jnp.asarray(flat_context(s)) for s in sessions]
        # Recall wants more contexts than timing; their own seed leaves the timed ones as
        # they are without the flag.
        more = np.random.default_rng(seed + 1)
        recall_contexts = [jnp.asarray(flat_context(synthetic_batches.synthetic_queries(
            more, (session_queries,), n, vocab_size))) for _ in range(64 * (index != 'exact'))]
        for size_c in pools:
          c_cache = cache[:size_c]
          k = min(top_k, size_c)
          call = dual_function(task, k)
          times = time_calls(lambda context, c_cache=c_cache, call=call: call(
              params, context, c_cache), contexts, warmup, repeats)
          row = {**base, 'pool': size_c, 'extrapolated': False, **summary(times),
                 'encode_pool_s': encode_s * size_c / largest}
          rows.append(row)
          log(row_line(row), flush=True)
          if index == 'usearch' and ranker == 'bi' and k:
            row = usearch_row(task, params, base, c_cache, contexts, recall_contexts, call, k,
                              warmup, repeats)
            rows.append(row)
            log(row_line(row), flush=True)
      else:
        measured = {}
        direct = sorted(c for c in pools if cross_direct or c <= cross_measure)
        if not direct:
          direct = [min(cross_measure, largest)]
        for size_c in direct:
          chunk = min(cross_chunk, size_c)
          padded = -(-size_c // chunk) * chunk
          ids = np.zeros((padded, n), np.int32)
          ids[:size_c] = pool[:size_c]
          ids = jnp.asarray(ids)
          call = cross_function(task, min(top_k, size_c), chunk, size_c)
          ctx = [jnp.asarray(s) for s in sessions]
          times = time_calls(lambda s, ids=ids, call=call: call(params, s, ids), ctx, warmup,
                             repeats)
          measured[size_c] = row = {**base, 'pool': size_c, 'extrapolated': False,
                                    'scored_with_padding': padded, **summary(times)}
          if size_c in pools:
            rows.append(row)
            log(row_line(row), flush=True)
        reference = max(measured)
        for size_c in pools:
          if size_c in measured:
            continue
          source = measured[reference]
          factor = size_c / reference
          row = {**base, 'pool': size_c, 'extrapolated': True, 'extrapolated_from': reference,
                 'median_ms': source['median_ms'] * factor, 'mean_ms': source['mean_ms'] * factor,
                 'min_ms': source['min_ms'] * factor}
          rows.append(row)
          log(row_line(row), flush=True)
  return rows


def usearch_row(task, params, base: dict, cache, contexts: list, recall_contexts: list,
                exact_call, k: int, warmup: int, repeats: int) -> dict:
  """The Bi-encoder's row through the usearch index of `cache` [C, d] (module docstring)."""
  vectors = np.asarray(cache, np.float32)
  with tempfile.TemporaryDirectory() as folder:
    started = time.perf_counter()
    index = retrieval.usearch_index(vectors, {'bench': len(vectors)}, folder,
                                  log=lambda *a, **kw: None)
    build_s = time.perf_counter() - started
  call = usearch_function(task, index, vectors, k)
  times = time_calls(lambda context: call(params, context), contexts, warmup, repeats)
  found = [set(call(params, c)[0][0].tolist()) for c in recall_contexts]
  exact = [set(np.asarray(exact_call(params, c, cache)[1]).tolist()) for c in recall_contexts]
  recall = statistics.fmean(len(f & e) / k for f, e in zip(found, exact))
  return {**base, 'ranker': 'bi_usearch', 'label': 'Bi-encoder (usearch)',
          'pool': len(vectors), 'extrapolated': False, **summary(times),
          'index_build_s': build_s, 'recall_at_k': recall,
          'expansion_search': retrieval.USEARCH_EXPANSION_SEARCH}


def row_line(row: dict) -> str:
  mark = ' (extrapolated)' if row['extrapolated'] else ''
  if 'recall_at_k' in row:
    mark += (f', recall@k {row["recall_at_k"]:.3f} of the exact top k, index built in '
             f'{row["index_build_s"]:.1f} s')
  return (f'  {row["label"]} d{row["d_model"]}x{row["layers"]}, {row["pool"]:,} candidates: '
          f'median {row["median_ms"]:.3f} ms, mean {row["mean_ms"]:.3f} ms{mark}')


def format_ms(ms: float) -> str:
  if ms >= 10_000:
    return f'{ms / 1000:,.1f}k' if ms < 1e6 else f'{ms / 1e6:,.2f}M'
  return f'{ms:,.3g}' if ms < 100 else f'{ms:,.0f}'


def markdown_table(rows: list[dict], pools: list[int]) -> str:
  """One line per (size, ranker): median (mean) ms per pool, then the paper's figures."""
  paper_pools = (1000, 100_000)
  head = (['Ranker', 'd_model x layers']
          + [f'{c:,} cand. ms median (mean)' for c in pools]
          + [f'paper {c // 1000}k ms' for c in paper_pools])
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  keys = list(dict.fromkeys((r['d_model'], r['layers'], r['ranker'], r['label'])
                            for r in rows))
  for d_model, num_layers, ranker, label in keys:
    cells = [label, f'{d_model} x {num_layers}']
    for c in pools:
      [row] = [r for r in rows if (r['d_model'], r['layers'], r['ranker'], r['pool'])
               == (d_model, num_layers, ranker, c)]
      if row['extrapolated']:
        cells.append(f'{format_ms(row["median_ms"])} (extrap.)')
      else:
        cells.append(f'{format_ms(row["median_ms"])} ({format_ms(row["mean_ms"])})')
    cells += [format_ms(PAPER_MS[ranker][c]) if ranker in PAPER_MS else '-'
              for c in paper_pools]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def run() -> dict[str, Any]:
  config = _CONFIG.value
  unknown = [r for r in _RANKERS.value if r not in RANKERS]
  if unknown:
    raise app.UsageError(f'--rankers: unknown {unknown} (expected some of {list(RANKERS)})')
  pools = sorted({int(c) for c in _POOLS.value})
  if not pools:
    raise app.UsageError('--pools: expected at least one pool size')
  sizes = [parse_size(s) for s in _SIZES.value] or [None]
  report: dict[str, Any] = bench_report.print_header(bench_report.command_line(
      'launch/bench_rankers.py', (__name__, '__main__')))
  report.update(config=json.loads(config.to_json_best_effort()), paper_ms={
      r: {str(c): ms for c, ms in v.items()} for r, v in PAPER_MS.items()})
  print(f'setup: random weights, vocabulary {_VOCAB_SIZE.value:,}; one context of '
        f'{_SESSION_QUERIES.value} synthetic AOL-shaped queries of <= '
        f'{config.data.max_query_words} words; top {_TOP_K.value} kept; median and mean of '
        f'{_REPEATS.value} timed calls after {_WARMUP.value} untimed', flush=True)
  rows = measure(config, rankers=_RANKERS.value, pools=pools, sizes=sizes,
                 vocab_size=_VOCAB_SIZE.value, session_queries=_SESSION_QUERIES.value,
                 top_k=_TOP_K.value, repeats=_REPEATS.value, warmup=_WARMUP.value,
                 cross_chunk=_CROSS_CHUNK.value, cross_measure=_CROSS_MEASURE.value,
                 cross_direct=_CROSS_DIRECT.value, seed=_SEED.value, index=_INDEX.value)
  report['rows'] = rows
  report['machine']['load_average_1min_after'] = round(os.getloadavg()[0], 2)
  print()
  print(markdown_table(rows, pools))
  print()
  print('ms per context (median, with the mean in brackets), candidate vectors precomputed '
        'for the Bi-/Poly-encoders; the paper\'s: BERT-base-sized models (12 layers, d 768) on '
        'an 80-core Xeon CPU. "extrap.": linear in the pool from the largest pool timed.')
  bench_report.write_json(report, _JSON.value)
  return report


def main(argv):
  cli.quiet_library_logs()  # JAX's INFO lines (no TPU found, ...) above the figures
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  parallel.set_cpu_devices(_CPU_DEVICES.value)
  run()


if __name__ == '__main__':
  bench_report.run(main)
