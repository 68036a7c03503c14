"""How long `--mode=serve` takes to listen: a first start, with or without the programs
prepared when training ended, and a restart.

  python launch/bench_serve_start.py --workdir=/tmp/aol_small --config=configs/aol.py:small \
      --set=data.raw_files=/path/to/aol-500users.tsv.gz --set=data.split_by=user

In: a trained workdir and its config (`--config`, `--set section.key=value` overrides given to
every run). The workdir is copied without its `serve/` folder (no compiled programs kept), so
the first start is cold (`--keep_cache`: with it), and the copy is deleted at the end.
1. With `--prepare`: `--mode=train` on the copy with config.serve.prepare_after_train=True (its
   training is done, so the run only compiles the service's programs, as at the end of a
   training run).
2. `--mode=serve` is started and timed from the process's start to its `Serving on` line (and,
   with config.serve.warm_up_background, to its line saying every shape is compiled), then
   stopped (SIGTERM); then started and timed again (the restart), `--restarts` times.
Out: one line per start, as docs/PERFORMANCE.md's table has it: the load average before and
after, seconds to listen and the process's CPU seconds by then, the same to every batch shape
compiled (a background warm-up), and the programs read back from the cache of those compiled
(the service's own lines); with the machine and the date. Compilations on a CPU depend on
what else runs: note the load.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from launch import bench_report  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKDIR = flags.DEFINE_string('workdir', None, 'A trained workdir (required; not changed).')
_CONFIG = flags.DEFINE_string('config', 'configs/demo.py', 'Its config file (path[:variant]).')
_SET = flags.DEFINE_multi_string('set', [], 'A config override section.key=value, given to '
                                 'every run (repeatable).')
_PREPARE = flags.DEFINE_bool('prepare', False, 'Prepare the programs as training\'s end does '
                             'before the first start.')
_RESTARTS = flags.DEFINE_integer('restarts', 1, 'Starts after the first.')
_KEEP_CACHE = flags.DEFINE_bool('keep_cache', False, 'Copy the workdir\'s serve/ folder too '
                                '(its compiled programs): every start is a restart.')
flags.mark_flag_as_required('workdir')

_WARMED = re.compile(r'compiled in ([\d.]+) s.*\((\d+) programs, (\d+) read')
_ALL = re.compile(r'^All \d+ batch shapes compiled, ([\d.]+) s .*\((\d+) programs, (\d+) read')


def _env() -> dict[str, str]:
  # The workdir's own cache (config.serve.compile_cache), not one set for the process.
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return env


def _command(workdir: str, mode: str, *extra: str) -> list[str]:
  return [sys.executable, '-m', 'mtn_jax.main', f'--config={_CONFIG.value}',
          f'--workdir={workdir}', f'--mode={mode}', *(f'--config.{o}' for o in _SET.value),
          *extra]


def _load() -> str:
  return ' '.join(f'{x:.1f}' for x in os.getloadavg())


def _cpu_seconds(pid: int) -> float:
  """The process's CPU time so far (user and system): less moved by other jobs than wall
  time on a shared machine."""
  with open(f'/proc/{pid}/stat', encoding='ascii') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return round((int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'), 1)


def start_once(workdir: str, given: str) -> dict:
  """Starts the service on `workdir` (the copy of the workdir `given`), waits for it to
  listen, stops it: what the start took."""
  started = time.perf_counter()
  process = subprocess.Popen(_command(workdir, 'serve', '--config.serve.port=0'), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_env())
  out = {'load before': _load()}
  lines = []
  for line in process.stdout:
    lines.append(line)
    warmed = _WARMED.search(line)
    if warmed:
      out.update(warm_up_s=float(warmed.group(1)), programs=int(warmed.group(2)),
                 read_back=int(warmed.group(3)), background='background' in line)
    if line.startswith('Serving on '):
      out['listening_s'] = time.perf_counter() - started
      out['cpu_s'] = _cpu_seconds(process.pid)
      if not out.get('background'):
        break
    every = _ALL.match(line)
    if every:
      out.update(all_shapes_s=time.perf_counter() - started, all_warm_up_s=float(every.group(1)),
                 all_programs=int(every.group(2)), all_read_back=int(every.group(3)),
                 all_cpu_s=_cpu_seconds(process.pid))
      break
  process.send_signal(signal.SIGTERM)
  process.communicate(timeout=60)
  if 'listening_s' not in out:
    # Its messages name the copy; the reader knows the workdir given.
    raise SystemExit('the service did not start:\n'
                     + ''.join(lines[-20:]).replace(workdir, given))
  out['load after'] = _load()
  return out


def start_line(out: dict) -> str:
  """One start as PERFORMANCE.md's table has it: the load, seconds to listen (CPU seconds),
  to every batch shape compiled (with config.serve.warm_up_background), programs read back."""
  line = (f'load {out["load before"]} -> {out["load after"]}; listening {out["listening_s"]:.1f} s '
          f'({out["cpu_s"]:.1f} CPU s)')
  if 'all_shapes_s' in out:
    line += (f'; every batch shape compiled {out["all_shapes_s"]:.1f} s '
             f'({out["all_cpu_s"]:.1f} CPU s); programs read back {out["all_read_back"]} of '
             f'{out["all_programs"]}')
  elif 'programs' in out:
    line += f'; programs read back {out["read_back"]} of {out["programs"]}'
  return line


def main(argv):
  del argv
  if not os.path.isdir(_WORKDIR.value):
    raise app.UsageError(f'--workdir={_WORKDIR.value}: no such folder')
  bench_report.print_header(bench_report.argv_line('launch/bench_serve_start.py', sys.argv[1:]),
                            devices=False)
  with tempfile.TemporaryDirectory(prefix='bench_serve_start-') as folder:
    workdir = os.path.join(folder, 'workdir')
    shutil.copytree(_WORKDIR.value, workdir,
                    ignore=None if _KEEP_CACHE.value else shutil.ignore_patterns('serve'))
    if _PREPARE.value:
      load, started = _load(), time.perf_counter()
      run = subprocess.run(_command(workdir, 'train', '--config.serve.prepare_after_train=True'),
                           cwd=REPO, env=_env(), check=True, stdout=subprocess.PIPE, text=True)
      warmed = [line for line in run.stdout.splitlines() if _WARMED.search(line)]
      print(f'prepared (--mode=train of the trained workdir): '
            f'{time.perf_counter() - started:.1f} s; load {load} -> {_load()}; '
            f'{warmed[-1] if warmed else "(no warm-up line)"}', flush=True)
    for i in range(1 + _RESTARTS.value):
      # Whether a start compiled or read its programs back: its `read_back` says.
      name = f'start {i + 1}' + (', after the preparation' if _PREPARE.value and not i else '')
      print(f'{name}: {start_line(start_once(workdir, _WORKDIR.value))}', flush=True)


if __name__ == '__main__':
  bench_report.run(main)
