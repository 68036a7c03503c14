"""How short a tail can any service with the batcher's policy have, on this machine's CPU?

The service's latency target is a p99 at half the saturation rate of at most 2.5x a lone
request's p50 (docs/PERFORMANCE.md, "Serving"). This study separates what the queue costs
from what the HTTP path and the shared cores cost:
1. It measures, in this process, the time of one batch of each padded size through the
   service's own `Engine.run` (sessions of the test split cut at random positions, as
   `launch/bench_serve.py` sends them; the median of `--repeats` calls): f(n).
2. It simulates the batcher's policy with those times and nothing else: Poisson arrivals, one
   worker (or `--workers`), a batch starts as soon as a worker is free and takes up to
   `max_batch` waiting requests (`max_wait_ms` 0, the default), and lasts f(its padded size).
   The model's own saturation is max_batch / f(max_batch); arrivals at half of it.
3. It prints the simulated p50 and p99 and their ratio to a lone request (f(1)), then the same
   with a fixed time `--overhead_ms` added to every request (the HTTP path, parsing and
   answering, which does not queue behind batches if it has a core of its own).

With a batch time nearly proportional to its size (a CPU: no idle width to fill), the queue
alone puts the p99 at about five lone requests at half saturation, whatever the service does
around it: only a fixed cost in every request's path, which lifts the lone p50 as much as the
tail, brings the ratio down. docs/notes/2026-11-26-serving.md quotes its output (and
docs/PERFORMANCE.md, "Serving", its conclusion).

  python experiments/serving_queue.py --workdir=/tmp/mtn_demo --overhead_ms=2.8
  python experiments/serving_queue.py --workdir=/tmp/aol_small --config=configs/aol.py:small \
      --overhead_ms=3.4
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'launch'))
import bench_serve  # pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_requests  # pylint: disable=g-import-not-at-top,wrong-import-position

_REPEATS = flags.DEFINE_integer('repeats', 25, 'Timed calls per batch size (the median).')
_WORKERS = flags.DEFINE_integer('workers', 1, 'Batches run at once in the simulation.')
_OVERHEAD = flags.DEFINE_float('overhead_ms', 0.0, 'A fixed time added to every request: '
                               'the service\'s lone request p50 minus its batch of one.')
_REQUESTS = flags.DEFINE_integer('requests', 200_000, 'Simulated requests.')


def batch_times(engine, sessions, repeats: int) -> dict[int, float]:
  """f(n): seconds of one `Engine.run` of n requests, for each padded batch size n."""
  times = {}
  for n in engine.sizes:
    engine.run([engine.check(s, None, None) for s in sessions[:n]])  # untimed
    calls = []
    for i in range(repeats):
      start = i * n % (len(sessions) - n)
      batch = [engine.check(s, None, None) for s in sessions[start:start + n]]
      started = time.perf_counter()
      engine.run(batch)
      calls.append(time.perf_counter() - started)
    times[n] = statistics.median(calls)
  return times


def simulate(times: dict[int, float], rate: float, workers: int, count: int,
             seed: int) -> np.ndarray:
  """Each request's seconds from arrival to its batch's end, under the batcher's policy."""
  sizes = sorted(times)
  most = sizes[-1]
  padded = {n: next(s for s in sizes if s >= n) for n in range(1, most + 1)}
  arrivals = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, count))
  free = [0.0] * workers
  latencies = np.empty(count)
  first = 0
  while first < count:
    worker = min(range(workers), key=free.__getitem__)
    start = max(free[worker], arrivals[first])
    # Everything that has arrived by the start, up to max_batch, joins the batch.
    last = min(int(np.searchsorted(arrivals, start, side='right')), first + most, count)
    last = max(last, first + 1)
    end = start + times[padded[last - first]]
    latencies[first:last] = end - arrivals[first:last]
    free[worker] = end
    first = last
  return latencies


def main(argv):
  del argv
  # The benchmark's flags (--workdir, --config, --set, --seed) are this study's too.
  flag = flags.FLAGS
  config = bench_serve.load_config(flag.config, flag.set)
  from mtn_jax import parallel  # pylint: disable=g-import-not-at-top
  parallel.set_cpu_devices(1)  # as --mode=serve
  from mtn_jax.serving import engine as engine_lib  # pylint: disable=g-import-not-at-top
  workdir = os.path.abspath(flag.workdir)
  engine = engine_lib.Engine.load(config, workdir, log=lambda *a, **k: None)
  sessions = bench_requests.request_sessions(workdir, 512, engine.max_session_queries,
                                             flag.seed)
  times = batch_times(engine, sessions, _REPEATS.value)
  most = max(times)
  saturation = _WORKERS.value * most / times[most]
  rate = saturation / 2
  print(f'{workdir} ({flag.config}), {os.cpu_count()} cores, '
        f'{time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}')
  print('batch times: ' + ', '.join(f'{n}: {1000 * t:.2f} ms ({1000 * t / n:.2f} a request)'
                                    for n, t in times.items()))
  print(f'model saturation {saturation:.0f}/s ({_WORKERS.value} worker(s)); arrivals at half '
        f'of it, {rate:.0f}/s, {_REQUESTS.value} requests')
  latencies = 1000 * simulate(times, rate, _WORKERS.value, _REQUESTS.value, flag.seed)
  lone = 1000 * times[1]
  for overhead in sorted({0.0, _OVERHEAD.value}):
    p50, p99 = (float(np.percentile(latencies, q)) + overhead for q in (50, 99))
    print(f'overhead {overhead:g} ms: lone {lone + overhead:.2f} ms, p50 {p50:.2f} ms, '
          f'p99 {p99:.2f} ms = {p99 / (lone + overhead):.2f}x the lone request')


if __name__ == '__main__':
  app.run(main)
