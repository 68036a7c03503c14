"""The suggestion service under load, beside offline decoding of the same checkpoint.

  python launch/bench_serve.py --workdir=/tmp/mtn_demo
  python launch/bench_serve.py --workdir=/tmp/mtn_demo --rates=10,40,160 --seconds=10 \
      --set=serve.max_batch=16 --set=serve.max_wait_ms=10

In: a trained workdir (the service writes its serve/ folder there, as `--mode=serve` does: the
compiled programs, the users' histories) and its config (`--config`, default configs/demo.py,
with `--set section.key=value` overrides given to the service and the offline run alike). Its
test split's sessions, cut at random positions, are the requests (with `--users`, each naming
its user).
1. `--mode=serve` is started in a process of its own on a free loopback port (127.0.0.1 only).
2. For each rate of `--rates` (requests/s), an async client sends requests open-loop for
   `--seconds` (arrivals of a Poisson process: a request is sent on time whatever the earlier
   ones are doing), then waits for the last answers (at most the deadline and a second).
   Per rate: latency p50/p95/p99 of the answered (200) requests, throughput (answers/s),
   answers by status (connection errors by name; 'gave up': no answer within the deadline
   and a second), and from the service's /metrics before and after: its own time per
   request (from reading it to answering), the time per batch run, and the batch sizes.
   Before the next rate the service runs out of what it still holds. With `--faults_rate`,
   that rate is offered twice more: with a reload (SIGHUP) a third of the way in, and with a
   SIGTERM half-way through, after which nothing more is sent (the drain's row: every request
   sent before it answered, none failed).
3. The service is stopped (SIGTERM), and the same checkpoint decodes `--offline_contexts`
   contexts in this process through `Pipeline.suggest` (batches of config.decode.batch_sessions,
   as `--mode=decode` runs them), after one untimed warm-up pass: contexts/s, the median of
   three passes.
With `--half_saturation`, half the most answered per second is offered once more after the
rates: the tail target's load. Out: the table on stdout (`--json`: the figures too), with
the machine, the config and the date. The client and the
service share the machine's cores: on a small machine the client's own CPU time is part of
what limits the rate.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from absl import app
from absl import flags
import aiohttp
from ml_collections import config_flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report
from mtn_jax import cli
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# pylint: enable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_string('workdir', None, 'A trained workdir (required); the service '
                                'keeps its compiled programs and users\' histories in its serve/.')
_CONFIG = flags.DEFINE_string('config', 'configs/demo.py', 'Its config file (path[:variant]).')
_SET = flags.DEFINE_multi_string('set', [], 'A config override section.key=value, for the '
                                 'service and the offline run alike (repeatable).')
_RATES = flags.DEFINE_list('rates', ['5', '10', '20', '40', '80', '160'],
                           'Offered loads to measure, requests per second.')
bench_report.positive_list('rates', float)
_SECONDS = flags.DEFINE_float('seconds', 10.0, 'How long each rate is offered.')
_FAULTS_RATE = flags.DEFINE_float('faults_rate', 0.0, 'After the rates: this rate once more '
                                  'with a reload (SIGHUP) a third of the way in, and once with '
                                  'a SIGTERM drain half-way through (0: neither).')
_OFFLINE = flags.DEFINE_integer('offline_contexts', 1024,
                                'Contexts decoded offline (0: no offline measurement).')
_OFFLINE_BATCHES = flags.DEFINE_list(
    'offline_batches', [], 'Offline batch sizes to measure besides config.decode.batch_sessions '
    '(e.g. the service\'s max_batch: on a CPU a beam search over small batches can be faster, '
    'its rows ending sooner).')
bench_report.positive_list('offline_batches')
_HALF_SATURATION = flags.DEFINE_bool(
    'half_saturation', False, 'After the rates: half the most answered per second at any of '
    'them offered once more, for the tail target (p99 there against the first rate\'s p50, '
    'the lone request\'s when that rate is low).')
_JSON = flags.DEFINE_string('json', '', 'Also write the figures to this JSON file.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the sessions chosen and the arrival times.')
_USERS = flags.DEFINE_bool(
    'users', False, "Each request names its session's user (the service reads and keeps their "
    "earlier sessions in its history store); the offline contexts carry the same users' "
    "earlier queries of the corpus.")
_SWITCH_INTERVAL = flags.DEFINE_float(
    'switch_interval_ms', 0.0, "A study: the service's interpreter hands its lock between "
    'threads every this many ms (sys.setswitchinterval; 0: Python\'s own 5 ms). A worker that '
    'waits for the device gives the lock up, and takes it back only when the thread holding '
    'it yields: with batches and the event loop busy in Python, up to an interval a wait.')
_CPU_DEVICES = flags.DEFINE_integer('cpu_devices', None, 'JAX CPU devices of the service and '
                                    'the offline run (--cpu_devices of the command line; '
                                    'default: as --mode=serve and --mode=decode, one).')
flags.mark_flag_as_required('workdir')


def load_config(path: str, overrides):
  """The config file with `section.key=value` overrides, parsed as the command line parses
  them (ml_collections' config flag: the service gets the same overrides as flags)."""
  argv = ['bench_serve', f'--config={os.path.join(REPO, path)}',
          *(f'--config.{override}' for override in overrides)]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values, sys_argv=argv)
  try:
    values(argv)
  except Exception as e:  # pylint: disable=broad-except
    # As the command line says it (`cli.flag_error_message`), with the flag that gave it.
    raise app.UsageError(cli.flag_error_message(e, argv).replace('--config.', '--set=', 1)
                         ) from None
  return values.config


class ServiceProcess:
  """`--mode=serve` on a free loopback port, its output kept."""

  def __init__(self, workdir: str, config: str, overrides):
    # With --switch_interval_ms, the command line's module is run after the interval is set.
    start = ([sys.executable, '-m', 'mtn_jax.main'] if not _SWITCH_INTERVAL.value else
             [sys.executable, '-c', 'import runpy, sys; '
              f'sys.setswitchinterval({_SWITCH_INTERVAL.value / 1000!r}); '
              "runpy.run_module('mtn_jax.main', run_name='__main__', alter_sys=True)"])
    command = [*start, f'--config={config}',
               f'--workdir={workdir}', '--mode=serve',
               *([] if _CPU_DEVICES.value is None else [f'--cpu_devices={_CPU_DEVICES.value}']),
               '--config.serve.host=127.0.0.1', '--config.serve.port=0',
               # Every shape compiled before the first request is sent.
               '--config.serve.warm_up_background=False',
               *(f'--config.{o}' for o in overrides)]
    self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED='1'))
    self.lines, self.url, self.workers = [], None, None
    started = threading.Event()

    def read():
      for line in self.process.stdout:
        self.lines.append(line)
        print('  service: ' + line.rstrip(), flush=True)
        found = re.match(r'Serving on (http://127\.0\.0\.1:\d+) .*; (\d+) worker', line)
        if found:
          self.url, self.workers = found.group(1), int(found.group(2))
          started.set()
      started.set()

    threading.Thread(target=read, daemon=True).start()
    started.wait(900)
    if self.url is None:
      self.process.kill()
      raise SystemExit('the service did not start:\n' + ''.join(self.lines[-20:]))

  def stop(self) -> int:
    self.process.send_signal(signal.SIGTERM)
    return self.process.wait(60)


def resident_mib(pid: int) -> float:
  """The process's resident memory (VmRSS), MiB: flat from rate to rate when the queue
  bound holds under overload."""
  with open(f'/proc/{pid}/status', encoding='ascii') as f:
    return next(int(line.split()[1]) for line in f if line.startswith('VmRSS:')) / 1024


def metric(text: str, name: str) -> float:
  found = re.search(rf'^{re.escape(name)} (\S+)$', text, re.M)
  return float(found.group(1)) if found else 0.0


def batch_histogram(text: str) -> dict[str, float]:
  return {le: float(v) for le, v in
          re.findall(r'^mtn_serve_batch_size_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}


async def offer(url: str, bodies, rate: float, seconds: float, deadline_s: float,
                rng: np.random.Generator, signal_at: float | None = None,
                send_signal=None, stop_sending: bool = False) -> dict:
  """Requests (`bodies`, in turn) at `rate`/s (Poisson arrivals) for `seconds`; what came
  back. With `signal_at`, `send_signal()` is called that many seconds in (SIGHUP: a reload
  under load; SIGTERM: a drain, after which no request is sent with `stop_sending`, as a load
  balancer that saw /readyz turn unready would)."""
  latencies, statuses = [], {}
  # aiohttp, not httpx: on a 2-core machine the client shares the cores with the service,
  # and httpx's client saturated its core at ~160 requests/s while the service used a fifth
  # of the other (2026-11-27); aiohttp's C parser costs a fraction of that per request.
  connector = aiohttp.TCPConnector(limit=2000, limit_per_host=2000)
  timeout = aiohttp.ClientTimeout(total=deadline_s + 5)
  async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:

    async def get(path: str) -> str:
      async with client.get(f'{url}{path}') as response:
        return await response.text()

    before = await get('/metrics')

    async def one(body):
      sent = time.perf_counter()
      try:
        async with client.post(f'{url}/v1/suggest', json=body) as response:
          await response.read()
          key = str(response.status)
          if response.status == 200:
            latencies.append(time.perf_counter() - sent)
      except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        key = type(e).__name__
      statuses[key] = statuses.get(key, 0) + 1

    tasks = []
    start = time.perf_counter()
    at = 0.0
    while True:
      at += rng.exponential(1 / rate)
      if at >= seconds:
        break
      if signal_at is not None and at >= signal_at:
        send_signal()
        signal_at = None
        if stop_sending:
          break
      delay = start + at - time.perf_counter()
      if delay > 0:
        await asyncio.sleep(delay)
      tasks.append(asyncio.create_task(one(bodies[len(tasks) % len(bodies)])))
    sent_for = time.perf_counter() - start
    _, pending = await asyncio.wait(tasks, timeout=deadline_s + 1)
    for task in pending:  # the client gives up: not answered within the deadline and a second
      task.cancel()
    if pending:
      statuses['gave up'] = len(pending)
    elapsed = time.perf_counter() - start
    if stop_sending:  # drained: the service is gone, its figures with it
      after = before
    else:
      # What the service still holds (requests it read before the client gave up) runs out
      # before the next rate.
      while metric(await get('/metrics'), 'mtn_serve_queue_depth') > 0:
        await asyncio.sleep(0.2)
      await asyncio.sleep(1.0)
      after = await get('/metrics')
  batches = metric(after, 'mtn_serve_batch_size_count') - metric(before, 'mtn_serve_batch_size_count')
  requests = metric(after, 'mtn_serve_batch_size_sum') - metric(before, 'mtn_serve_batch_size_sum')
  hist_before, hist_after = batch_histogram(before), batch_histogram(after)
  spread, below = {}, 0.0
  for le in hist_after:
    count = hist_after[le] - hist_before.get(le, 0.0)
    if le != '+Inf' and count - below > 0:
      spread[int(float(le))] = int(count - below)
    below = count
  delta = lambda name: metric(after, name) - metric(before, name)
  answered = lambda part: delta(f'mtn_serve_suggest_seconds_{part}{{status="200"}}')
  server_ms = 1000 * answered('sum') / max(answered('count'), 1)  # the 200s, as the client's
  batch_ms = 1000 * delta('mtn_serve_batch_seconds_sum') / max(
      delta('mtn_serve_batch_seconds_count'), 1)
  q = (lambda p: 1000 * float(np.percentile(latencies, p))) if latencies else (lambda p: 0.0)
  return {'rate': f'{rate:g}', 'sent': len(tasks), 'sent_for': sent_for, 'elapsed': elapsed,
          'ok': len(latencies), 'p50': q(50), 'p95': q(95), 'p99': q(99),
          'throughput': len(latencies) / sent_for, 'statuses': statuses,
          'mean_batch': requests / batches if batches else 0.0, 'batches': spread,
          'server_ms': server_ms, 'batch_ms': batch_ms}


def offline(config, workdir: str, sessions, batches: list[int], histories=None) -> list[dict]:
  """Offline decoding of `sessions`' last positions in batches of each of `batches`
  (`histories`: each session's user's earlier queries)."""
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference.inputs import Context  # pylint: disable=g-import-not-at-top
  suggestions = pipeline.Pipeline.load(config, workdir, log=lambda *a, **k: None)
  contexts = [Context(tuple(s), len(s) - 1, {}, history=tuple(h))
              for s, h in zip(sessions, histories or [()] * len(sessions))]
  rows = []
  for batch in batches:
    suggestions.suggest(contexts, positions='last', batch_rows=batch)  # compiles every shape
    times = []
    for _ in range(3):
      started = time.perf_counter()
      suggestions.suggest(contexts, positions='last', batch_rows=batch)
      times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    rows.append({'contexts': len(contexts), 'seconds': seconds,
                 'rate': len(contexts) / seconds, 'batch': batch})
  return rows


def main(argv):
  del argv
  cli.quiet_library_logs()
  workdir = os.path.abspath(_WORKDIR.value)
  if not os.path.isdir(workdir):
    raise app.UsageError(f'--workdir={_WORKDIR.value}: no such folder')
  config = load_config(_CONFIG.value, _SET.value)
  from mtn_jax import parallel  # pylint: disable=g-import-not-at-top
  parallel.set_cpu_devices(parallel.cpu_devices_for('decode', _CPU_DEVICES.value))
  rng = np.random.default_rng(_SEED.value)
  header = bench_report.print_header(
      bench_report.argv_line('launch/bench_serve.py', sys.argv[1:]), devices=False)
  print(f'bench_serve: {workdir} ({_CONFIG.value} {" ".join(_SET.value)}), load average '
        f'{" ".join(f"{x:.1f}" for x in os.getloadavg())}', flush=True)
  service = ServiceProcess(workdir, _CONFIG.value, _SET.value)
  with urllib.request.urlopen(f'{service.url}/v1/info') as response:
    max_queries = json.load(response)['max_session_queries']
  from launch import bench_requests  # pylint: disable=g-import-not-at-top
  count = max(_OFFLINE.value, 512)
  sessions = bench_requests.request_sessions(workdir, count, max_queries, _SEED.value)
  bodies = [{'session': session} for session in sessions]
  histories = None
  if _USERS.value:
    users = bench_requests.request_users(workdir, count, _SEED.value)
    bodies = [{**body, 'user': user} for body, user in zip(bodies, users)]
    histories = bench_requests.request_histories(workdir, count, _SEED.value)
  rows = []
  try:
    for rate in (float(r) for r in _RATES.value):
      rows.append(asyncio.run(offer(service.url, bodies, rate, _SECONDS.value,
                                    config.serve.deadline_ms / 1000, rng)))
      r = rows[-1]
      r['rss'] = resident_mib(service.process.pid)
      print(f'  {rate:g}/s: {r["ok"]}/{r["sent"]} answered, p50 {r["p50"]:.1f} ms', flush=True)
    if _HALF_SATURATION.value and rows:
      saturation = max(r['throughput'] for r in rows)
      rows.append(asyncio.run(offer(service.url, bodies, saturation / 2, _SECONDS.value,
                                    config.serve.deadline_ms / 1000, rng)))
      rows[-1].update(rss=resident_mib(service.process.pid),
                      rate=f'{saturation / 2:.4g}, half saturation')
      tail = {'lone_p50_ms': rows[0]['p50'], 'saturation_per_s': saturation,
              'half_saturation_p99_ms': rows[-1]['p99']}
      tail['p99_over_lone_p50'] = tail['half_saturation_p99_ms'] / max(rows[0]['p50'], 1e-9)
      print(f'  half saturation ({saturation / 2:.4g}/s): p99 {rows[-1]["p99"]:.1f} ms = '
            f'{tail["p99_over_lone_p50"]:.2f}x the p50 at {rows[0]["rate"]}/s', flush=True)
    if _FAULTS_RATE.value:
      # A reload (SIGHUP) a third of the way in, then a drain (SIGTERM) half-way through:
      # under load neither may fail a request (a 503 after the drain began is a refusal).
      rate, deadline = _FAULTS_RATE.value, config.serve.deadline_ms / 1000
      for name, sig, at, stop in (('reload', signal.SIGHUP, _SECONDS.value / 3, False),
                                  ('drain', signal.SIGTERM, _SECONDS.value / 2, True)):
        rows.append(asyncio.run(offer(
            service.url, bodies, rate, _SECONDS.value, deadline, rng, signal_at=at,
            send_signal=lambda sig=sig: service.process.send_signal(sig), stop_sending=stop)))
        rows[-1]['rate'] = f'{rate:g}, {name} at {at:.3g} s'
        print(f'  {name} under {rate:g}/s: {rows[-1]["statuses"]}', flush=True)
  finally:
    code = service.stop() if service.process.poll() is None else service.process.wait(60)
  print(f'The service exited {code} after SIGTERM.')
  s = config.serve
  print(f'\nService: max_batch {s.max_batch}, workers {service.workers}, max_wait_ms '
        f'{s.max_wait_ms:g}, queue_bound {s.queue_bound}, deadline_ms {s.deadline_ms:g}; '
        f'{_SECONDS.value:g} s per rate, Poisson arrivals, sessions of the test split cut at '
        'random positions' + (', each naming its user.' if _USERS.value else '.'))
  print('| offered/s | sent | answered/s | p50 ms | p95 ms | p99 ms | by status | '
        'in the app, mean ms | batch run, mean ms | mean batch | batches by size | service RSS MiB |')
  print('|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|')
  for r in rows:
    statuses = ', '.join(f'{k}: {v}' for k, v in sorted(r['statuses'].items()))
    spread = ', '.join(f'{k}: {v}' for k, v in sorted(r['batches'].items()))
    # After a drain the service's own figures went with it.
    rss = f'{r["rss"]:.0f}' if 'rss' in r else '-'
    own = (f'{r["server_ms"]:.1f} | {r["batch_ms"]:.1f} | {r["mean_batch"]:.2f} | {spread}'
           if r['mean_batch'] else '- | - | - | -')
    print(f'| {r["rate"]} | {r["sent"]} | {r["throughput"]:.1f} | {r["p50"]:.1f} | '
          f'{r["p95"]:.1f} | {r["p99"]:.1f} | {statuses} | {own} | {rss} |')
  offline_rows = []
  if _OFFLINE.value:
    batches = [config.decode.batch_sessions, *(int(b) for b in _OFFLINE_BATCHES.value)]
    offline_rows = offline(config, workdir, sessions[:_OFFLINE.value], batches,
                           histories and histories[:_OFFLINE.value])
    for o in offline_rows:
      how = ('as --mode=decode' if o['batch'] == config.decode.batch_sessions else
             f'--config.decode.batch_sessions={o["batch"]}')
      print(f'Offline (Pipeline.suggest, batches of {o["batch"]}, {how}; median of 3 passes): '
            f'{o["contexts"]} contexts in {o["seconds"]:.2f} s = {o["rate"]:.1f} contexts/s.')
  print(f'Load average after: {" ".join(f"{x:.1f}" for x in os.getloadavg())}')
  if _JSON.value:
    saturation = max((r['throughput'] for r in rows), default=0.0)
    report = {**header, 'workdir': workdir, 'config': _CONFIG.value, 'set': _SET.value,
              'cores': os.cpu_count(),
              'serve': {**config.serve.to_dict(), 'workers': service.workers},
              'seconds_per_rate': _SECONDS.value, 'rows': rows, 'offline': offline_rows,
              'saturation_per_s': saturation}
    if offline_rows:
      report['saturation_over_offline'] = {
          str(o['batch']): saturation / o['rate'] for o in offline_rows}
    if _HALF_SATURATION.value and rows:
      report['tail'] = tail
    with open(_JSON.value, 'w', encoding='utf-8') as f:
      json.dump(report, f, indent=2, sort_keys=True)
    print(f'wrote {_JSON.value}')


if __name__ == '__main__':
  bench_report.run(main)
