"""The service's programs compiled when training ends (`config.serve.prepare_after_train`).

A first start of `--mode=serve` compiles a program per batch size and session length (and per
strategy's models); with the persistent compilation cache (`config.serve.compile_cache`) a
later start reads them back. `after_training` makes that first start a later one: in a
process of its own, with the service's CPU device count and the same config, it loads the
workdir's best checkpoint and warms it up exactly as `--mode=serve` does (`Engine.load`,
through `Pipeline.ordered` whatever the strategy), so the programs kept are those the service
looks up. A process of its own because training runs with one CPU device per core: programs
compiled for that backend are not the ones the service's single device runs.

The programs depend on the model's shapes and the decoding settings, not on the checkpoint's
values: a later checkpoint of the same run (a reload, a resumed training) finds them too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import ml_collections


def after_training(config: ml_collections.ConfigDict, workdir: str, log=print) -> bool:
  """With `config.serve.prepare_after_train`, the service of `workdir` warmed up in a
  process of its own (see the module docstring); returns whether its programs were
  prepared. A failure is reported and leaves training's outcome alone: the service then
  compiles at its first start."""
  if not config.serve.prepare_after_train:
    return False
  if not config.serve.compile_cache and not os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    log('Note: config.serve.prepare_after_train needs a compilation cache '
        '(config.serve.compile_cache): nothing prepared.')
    return False
  log('Compiling the service\'s programs (config.serve.prepare_after_train=True) ...')
  started = time.time()
  with tempfile.TemporaryDirectory(prefix='mtn_jax-prepare-') as folder:
    path = os.path.join(folder, 'config.json')  # JSON, as a workdir keeps its config
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(config.to_dict(), f)
    sys.stdout.flush()
    # SIGTERM would end this process at once and leave the compiling one running: it ends
    # this one by an exit that `subprocess.run` meets, which stops the other first.
    stopped = signal.signal(signal.SIGTERM, _exit_terminated)
    try:
      result = subprocess.run([sys.executable, '-m', 'mtn_jax.serving.prepare', path,
                               os.path.abspath(workdir)], check=False)
    finally:
      signal.signal(signal.SIGTERM, stopped)
  if result.returncode != 0:
    log(f'Note: the service\'s programs were not prepared (exit {result.returncode}, above): '
        '--mode=serve compiles them at its first start.')
    return False
  log(f'The service\'s programs prepared in {time.time() - started:.1f} s: --mode=serve with '
      'this config reads them back.')
  return True


def _exit_terminated(signum, frame) -> None:
  del frame
  print('SIGTERM: the service\'s programs were not prepared', file=sys.stderr, flush=True)
  sys.exit(128 + signum)


def _main(argv: list[str]) -> None:
  """In the process `after_training` starts: argv = [config JSON, workdir]."""
  # pylint: disable=g-import-not-at-top
  from mtn_jax import parallel
  parallel.set_cpu_devices(parallel.cpu_devices_for('serve', None))  # before JAX starts
  from mtn_jax.inference import trained
  from mtn_jax.serving import engine as engine_lib
  from mtn_jax.serving import service
  # pylint: enable=g-import-not-at-top
  config_path, workdir = argv
  with open(config_path, encoding='utf-8') as f:
    config = ml_collections.ConfigDict(json.load(f))
  settings = service.ServeSettings.from_config(config)
  trained.keep_compiled_programs(workdir, settings.compile_cache, _say)
  started = time.time()
  engine = engine_lib.Engine.load(config, workdir, log=_say)
  _say(service.describe(engine, time.time() - started))


def _say(text: str) -> None:
  print(text, flush=True)


if __name__ == '__main__':
  _main(sys.argv[1:])
