"""Runs the real command line in a process of its own, on tiny configs, for end-to-end tests
(forked from a process that has imported the libraries already: tests/fork_server.py)."""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import tempfile
import threading

# The repository (tests/conftest.py imports this module: it cannot import conftest back).
REPO = pathlib.Path(__file__).resolve().parents[1]

# A model and a demo log small enough that a run takes seconds on a 2-core CPU. Sessions of
# exactly three queries make one bucket: every bucket is a program to trace (seconds each, the
# persistent cache saves only the compilation); tests of several buckets ask for them. Layer
# stacks of one layer run as a loop: `nn.scan` buys nothing at one layer and costs a run 3 s of
# tracing (two steps: 12.6 s -> 9.7 s, warm cache); test_end_to_end's MTN keeps the scan.
# The model keys are the attention models' (configs/demo.py's MTN); `tiny` gives a config of
# another family the sizes its model has (`MODEL_TINY`).
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
    '--config.train.warmup_steps=10',
    '--config.train.learning_rate=0.3',
    '--config.input.train_queries_per_batch=240',
    '--config.input.eval_queries_per_batch=480',
    '--config.decode.batch_sessions=32',
)
# The tiny sizes of the other families' keys.
MODEL_TINY = ('--config.model.lstm_units=8',)


def tiny(config: str = 'configs/demo.py') -> tuple[str, ...]:
  """`TINY` and `MODEL_TINY` for the config file `config` (path[:variant]): the overrides of
  `config.model` keys its model has, the warm-up where its schedule has one, and every other."""
  import importlib  # pylint: disable=g-import-not-at-top
  path, _, variant = config.partition(':')
  name = path.removeprefix('configs/').removesuffix('.py')
  config = importlib.import_module(f'configs.{name}').get_config(variant)
  has = lambda o: (not o.startswith('--config.model.')
                   or o.removeprefix('--config.model.').split('=')[0] in config.model)
  warms_up = config.train.schedule == 'transformer'
  return tuple(o for o in TINY + MODEL_TINY
               if has(o) and (warms_up or not o.startswith('--config.train.warmup_steps=')))


def command(workdir, *overrides, mode: str = 'train', config: str = 'configs/demo.py',
            with_tiny: bool = True):
  """The command line of a run: `TINY`'s sizes and learning settings, then `overrides`;
  without `with_tiny`, the config's own (for what a config itself learns)."""
  return [sys.executable, '-m', 'mtn_jax.main', f'--config={config}', f'--workdir={workdir}',
          f'--mode={mode}', *(tiny(config) if with_tiny else ()), *overrides]


# The tests' models are tiny, and CI compiles every program afresh (a cold compilation
# cache), so compiling costs the suite more than running: LLVM's optimisation of the code XLA
# generates, and XLA:CPU's MLIR fusion emitters against its older ones, cost more time than
# they save (BUILD.md, "Development workflow", has the figures). The same flags for the test
# process (conftest.py) and the runs it starts; the product keeps XLA's defaults.
# A run at a config's own sizes (`with_tiny=False`: what the config learns) spends its time
# running, where the older emitters' code is the slower: it keeps the newer.
LEARNING_RUN_XLA_FLAGS = '--xla_backend_optimization_level=0'
TEST_XLA_FLAGS = f'{LEARNING_RUN_XLA_FLAGS} --xla_cpu_use_fusion_emitters=false'


def env(devices: int | None = 1, flags: str = TEST_XLA_FLAGS) -> dict[str, str]:
  """The runs' environment; `devices` CPU devices, or None to leave the count to the run;
  XLA's `flags`."""
  e = dict(os.environ, PYTHONUNBUFFERED='1', JAX_PLATFORMS='cpu')
  count = '' if devices is None else f'--xla_force_host_platform_device_count={devices} '
  e['XLA_FLAGS'] = count + flags
  # The CLI runs of one test session compile the same tiny programs again and again: a
  # persistent compilation cache shares them between the subprocesses.
  e.setdefault('JAX_COMPILATION_CACHE_DIR', os.path.join(tempfile.gettempdir(),
                                                         'mtn_jax-test-compilation-cache'))
  e.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')
  return e


def run(workdir, *overrides, mode: str = 'train', config: str = 'configs/demo.py',
        devices: int | None = 1, timeout: float = 300, check: bool = True,
        stdin: str | bytes | None = None, with_tiny: bool = True) -> subprocess.CompletedProcess:
  """Runs the command line to its end (through this test worker's fork server, `_forked`),
  `stdin` its input (a str in UTF-8, or bytes as they are); with `check`, a non-zero exit
  fails the test with the run's output."""
  args = command(workdir, *overrides, mode=mode, config=config, with_tiny=with_tiny)
  flags = TEST_XLA_FLAGS if with_tiny else LEARNING_RUN_XLA_FLAGS
  result = _forked(args, env(devices, flags), timeout, stdin)
  if check and result.returncode != 0:
    raise AssertionError(f'exit {result.returncode}\nstdout:\n{result.stdout[-3000:]}\n'
                         f'stderr:\n{result.stderr[-5000:]}')
  return result


IMPORT_TIME_PREFIXES = ('PYTHON', 'JAX_', 'XLA_', 'TF_', 'TPU_', 'OMP_', 'OPENBLAS_', 'MKL_',
                        'LD_')


class _ForkServer:
  """tests/fork_server.py, started at this worker's first run: it forks each run from a
  process that has imported the libraries already (about 3 s saved per run)."""

  def __init__(self, server_env: dict[str, str]):
    self.env = server_env
    to_server, self._requests = os.pipe()
    self._replies, from_server = os.pipe()
    self._process = subprocess.Popen(
        [sys.executable, str(REPO / 'tests' / 'fork_server.py'), str(to_server),
         str(from_server)], cwd=REPO, env=server_env, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        pass_fds=(to_server, from_server))
    os.close(to_server)
    os.close(from_server)
    self._send = os.fdopen(self._requests, 'w')
    self._lock = threading.Lock()  # one run at a time: the server answers them in turn

  def serves(self, run_env: dict[str, str]) -> bool:
    """Whether a run in `run_env` starts as it would in a fresh process: the interpreter,
    JAX and the numeric libraries read these variables once, at start-up or import (XLA's
    flags excepted: read when the run starts JAX's backend, after the fork)."""
    read_at_import = lambda e: {k: v for k, v in e.items()
                                if k.startswith(IMPORT_TIME_PREFIXES) and k != 'XLA_FLAGS'}
    return read_at_import(run_env) == read_at_import(self.env)

  def run(self, args, run_env, timeout: float, stdin: bytes) -> subprocess.CompletedProcess:
    with self._lock, tempfile.TemporaryDirectory(prefix='mtn_jax-run-') as streams:
      paths = {name: os.path.join(streams, name) for name in ('stdin', 'stdout', 'stderr')}
      pathlib.Path(paths['stdin']).write_bytes(stdin)
      self._send.write(json.dumps({'arguments': args[3:], 'env': run_env, 'cwd': str(REPO),
                                   **paths}) + '\n')
      self._send.flush()
      pid = self._reply()['pid']
      if not select.select([self._replies], [], [], timeout)[0]:
        os.killpg(pid, signal.SIGKILL)
        self._reply()
        raise subprocess.TimeoutExpired(args, timeout)
      returncode = self._reply()['status']
      read = lambda name: pathlib.Path(paths[name]).read_bytes()
      return _as_text(subprocess.CompletedProcess(args, returncode, read('stdout'),
                                                  read('stderr')))

  def alive(self) -> bool:
    return self._process.poll() is None

  def _reply(self) -> dict:
    # Byte by byte, unbuffered: a buffered reader could hold the next reply where `select`
    # does not see it.
    line = b''
    while not line.endswith(b'\n'):
      byte = os.read(self._replies, 1)
      if not byte:
        raise RuntimeError('the fork server stopped (tests/fork_server.py)')
      line += byte
    return json.loads(line)


_server: _ForkServer | None = None


def _as_text(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
  """`result` with its output read as UTF-8 (a byte that is not: U+FFFD)."""
  result.stdout, result.stderr = (result.stdout.decode('utf-8', errors='replace'),
                                  result.stderr.decode('utf-8', errors='replace'))
  return result


def _forked(args, run_env, timeout: float, stdin: str | bytes | None
            ) -> subprocess.CompletedProcess:
  """`args` run to their end, through the fork server where it can run them; in a fresh
  process where it cannot, and everywhere with MTN_JAX_TEST_FORK=0."""
  global _server
  stdin = stdin.encode('utf-8') if isinstance(stdin, str) else stdin or b''
  if os.environ.get('MTN_JAX_TEST_FORK', '1') != '0':
    if _server is None or not _server.alive():
      _server = _ForkServer(env())
    if args[1:3] == ['-m', 'mtn_jax.main'] and _server.serves(run_env):
      return _server.run(args, run_env, timeout, stdin)
  return _as_text(subprocess.run(args, cwd=REPO, env=run_env, capture_output=True,
                                 timeout=timeout, input=stdin))


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
  """configs/<name>.py (`name` may name a variant: 'demo:transformer') with `TINY` (unless
  `with_tiny` is False) and `overrides` applied, as the command line applies
  `--config.section.key=value`, for in-process runs."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  module, _, variant = name.partition(':')
  c = importlib.import_module(f'configs.{module}').get_config(variant)
  for override in (*(tiny(f'configs/{module}.py:{variant}') if with_tiny else ()), *overrides):
    key, value = override.removeprefix('--config.').split('=', 1)
    *sections, field = key.split('.')
    node = c
    for section in sections:
      node = node[section]
    kind = node.get_type(field)  # a placeholder's (None) type too
    if kind is bool:
      new = value.lower() in ('true', '1')
    elif kind is str:
      new = value
    else:
      new = kind(ast.literal_eval(value))
    node[field] = new
  return c
