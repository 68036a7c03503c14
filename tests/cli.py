"""Runs the real command line in a subprocess, on tiny configs, for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from tests.conftest import REPO  # re-exported for tests

# A model and a demo log small enough that a run takes seconds on a 2-core CPU. Sessions of
# exactly three queries make one bucket: every bucket is a program to trace (seconds each, the
# persistent cache saves only the compilation); tests of several buckets ask for them. Layer
# stacks of one layer run as a loop: `nn.scan` buys nothing at one layer and costs a run 3 s of
# tracing (two steps: 12.6 s -> 9.7 s, warm cache); test_end_to_end's MTN keeps the scan.
TINY = (
    '--config.data.demo_users=150',
    '--config.data.max_session_queries=3',
    '--config.data.min_word_count=2',
    '--config.model.emb_dim=16',
    '--config.model.d_model=16',
    '--config.model.num_heads=2',
    '--config.model.ff_dim=32',
    '--config.model.query_layers=1',
    '--config.model.session_layers=1',
    '--config.model.decoder_layers=1',
    '--config.model.scan_layers=False',
    '--config.model.lstm_units=8',
    '--config.train.warmup_steps=10',
    '--config.train.learning_rate=0.3',
    '--config.input.train_queries_per_batch=240',
    '--config.input.eval_queries_per_batch=480',
    '--config.decode.batch_sessions=32',
)


def command(workdir, *overrides, mode: str = 'train', config: str = 'configs/demo.py',
            with_tiny: bool = True):
  """The command line of a run: `TINY`'s sizes and learning settings, then `overrides`;
  without `with_tiny`, the config's own (for what a config itself learns)."""
  return [sys.executable, '-m', 'mtn_jax.main', f'--config={config}', f'--workdir={workdir}',
          f'--mode={mode}', *(TINY if with_tiny else ()), *overrides]


# The tests' models are tiny: LLVM's optimisation of the code XLA generates for them costs
# more time than it saves (a cold compile of the tiny MTN's train step: 10 s at the default
# level, 6 s at 0). The same flag for the test process (conftest.py) and the runs it starts.
TEST_XLA_FLAGS = '--xla_backend_optimization_level=0'


def env(devices: int | None = 1) -> dict[str, str]:
  """The runs' environment; `devices` CPU devices, or None to leave the count to the run."""
  e = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu')
  count = '' if devices is None else f'--xla_force_host_platform_device_count={devices} '
  e['XLA_FLAGS'] = count + TEST_XLA_FLAGS
  # The CLI runs of one test session compile the same tiny programs again and again: a
  # persistent compilation cache shares them between the subprocesses.
  e.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(),
                                                         'mtn_jax-test-compilation-cache'))
  e.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')
  return e


def run(workdir, *overrides, mode: str = 'train', config: str = 'configs/demo.py',
        devices: int | None = 1, timeout: float = 300, check: bool = True,
        stdin: str | None = None, with_tiny: bool = True) -> subprocess.CompletedProcess:
  result = subprocess.run(command(workdir, *overrides, mode=mode, config=config,
                                  with_tiny=with_tiny),
                          cwd=REPO, env=env(devices), capture_output=True, text=True,
                          timeout=timeout, input=stdin)
  if check and result.returncode != 0:
    raise AssertionError(f'exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n'
                         f'stderr:\n{result.stderr[-5000:]}')
  return result


def popen(workdir, *overrides, mode: str = 'train', devices: int = 1) -> subprocess.Popen:
  return subprocess.Popen(command(workdir, *overrides, mode=mode), cwd=REPO, env=env(devices),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def write_log(path, sessions_by_user) -> None:
  """An AOL-format log at `path` of `sessions_by_user` ([(user, [[query, ...], ...]), ...],
  each user's sessions oldest first): an hour between a user's sessions (any gap of 30
  minutes starts a new one), a minute between the queries of a session."""
  import datetime  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.synthetic import demo_log  # pylint: disable=g-import-not-at-top
  start, rows = datetime.datetime(2006, 3, 1), [demo_log.HEADER + '\n']
  for user, user_sessions in sessions_by_user:
    for k, queries in enumerate(user_sessions):
      for t, query in enumerate(queries):
        when = start + datetime.timedelta(hours=k, minutes=t)
        rows.append(f'{user}\t{query}\t{when:%Y-%m-%d %H:%M:%S}\t\t\n')
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(rows)


def config(*overrides, name: str = 'demo', with_tiny: bool = True):
  """configs/<name>.py with `TINY` (unless `with_tiny` is False) and `overrides` applied, as
  the command line applies `--config.section.key=value`, for in-process runs."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  c = importlib.import_module(f'configs.{name}').get_config()
  for override in (*(TINY if with_tiny else ()), *overrides):
    key, value = override.removeprefix('--config.').split('=', 1)
    *sections, field = key.split('.')
    node = c
    for section in sections:
      node = node[section]
    old = node[field]
    if isinstance(old, bool):
      new = value.lower() in ('true', '1')
    elif isinstance(old, str):
      new = value
    else:
      new = type(old)(ast.literal_eval(value))
    node[field] = new
  return c
