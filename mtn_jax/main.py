"""Command line: flags, config, then one mode.

  python -m mtn_jax.main --config=configs/demo.py --workdir=/tmp/mtn_demo
  python -m mtn_jax.main --config=configs/aol.py:small --config.data.raw_files=LOG \
      --workdir=W --mode=train --config.model.num_heads=8
"""

import ast
import os
import signal
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from mtn_jax import config_lib
from mtn_jax import errors

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Config file (path[:variant]).',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Run folder: data cache, checkpoints, logs, results.')
flags.DEFINE_enum('mode', 'all', config_lib.MODES,
                  'all: preprocess, train, eval, sample suggestions and report.')
flags.DEFINE_bool('distributed', False,
                  'Multi-host: call jax.distributed.initialize() before anything else. Without '
                  'the three flags below it detects the cluster (SLURM, Open MPI, TPU pods).')
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (with --distributed).')
flags.DEFINE_integer('num_processes', None, 'Number of processes (with --distributed).')
flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1 (with --distributed).')
flags.DEFINE_integer('cpu_devices', 0,
                     'JAX devices of a CPU-only host: 0 = one per core (training and evaluation '
                     'run data parallel over the cores), N = N devices. XLA_FLAGS\' '
                     '--xla_force_host_platform_device_count takes precedence.')
flags.register_validator('cpu_devices', lambda count: count >= 0,
                         message='--cpu_devices must be >= 0 (0: one per core)')
flags.mark_flags_as_required(['config', 'workdir'])


USAGE_ERROR = 2  # a wrong flag, config file or config value (1: bad data or checkpoint)


def usage_error(message: str) -> None:
  """Exits with one line naming what is wrong (and where help is), no traceback."""
  print(f'error: {message} (see --help)', file=sys.stderr)
  sys.exit(USAGE_ERROR)


def _one_line(error: BaseException) -> str:
  """An exception's message on one line. ml_collections hands some as the repr of a message
  (a mistyped key: '\\'nmu_heads\\'\\nDid you mean "num_heads" ...'), and an error raised in a
  config file's get_config with its whole traceback: only the exception's own line is kept."""
  text = str(error)
  for _ in range(2):  # a repr in a repr
    if len(text) > 1 and text[0] == text[-1] and text[0] in '\'"':
      try:
        text = ast.literal_eval(text)
      except (ValueError, SyntaxError):
        break
  if 'Traceback (most recent call last)' in text:
    head, _, trace = text.partition('Traceback (most recent call last)')
    last = [line for line in trace.splitlines() if line.strip()][-1]
    text = head.rstrip(': \n') + ': ' + last.strip()
  return ' '.join(text.split())


def _traceback_wanted(argv) -> bool:
  return any(a.startswith(('--verbosity', '-v')) for a in argv[1:])


def parse_flags(argv):
  """absl's flag parsing, with every error (an unknown flag or config key, a wrong type, a
  config file that is missing or fails to load) as one line and exit code 2; --verbosity
  keeps the traceback."""
  try:
    return FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    if _traceback_wanted(argv):
      raise
    usage_error(_one_line(e))


def main(argv):
  if len(argv) > 1:
    usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS['verbosity'].present:
    # Library INFO logs (orbax writes several per checkpoint) would bury the progress lines.
    logging.set_verbosity(logging.WARNING)
  # path[:variant]
  config_file = config_flags.get_config_filename(FLAGS['config']).split(':', 1)[0]
  if not os.path.isfile(config_file):
    usage_error(f'--config: there is no file {config_file} (paths are relative to the current '
                'directory: run from the repository root, or give the whole path)')
  config = FLAGS.config
  workdir, mode = FLAGS.workdir, FLAGS.mode
  try:
    config_lib.validate(config, mode)
  except config_lib.ConfigError as e:
    usage_error(str(e))
  if mode != 'preprocess':  # the one mode that runs without JAX
    from mtn_jax import parallel  # pylint: disable=g-import-not-at-top
    parallel.set_cpu_devices(FLAGS.cpu_devices)
  if FLAGS.distributed:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                               num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
  try:
    stopped_by = run_mode(config, workdir, mode)
  except errors.Error as e:
    # A problem with the input, config or checkpoint: its message is the whole story.
    print(f'error: {e}', file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt:
    # Ctrl-C outside the training loop, or a second one inside it: stop at once.
    print('interrupted', file=sys.stderr)
    sys.exit(EXIT_CODES['SIGINT'])
  sys.exit(EXIT_CODES.get(stopped_by, 0))


# A run stopped by a signal after saving exits as a shell reports a process killed by it, so
# that a scheduler or a script can tell it from a finished one.
EXIT_CODES = {'SIGINT': 128 + signal.SIGINT, 'SIGTERM': 128 + signal.SIGTERM}


def run_mode(config, workdir: str, mode: str) -> str | None:
  """Runs one mode; returns the signal that stopped training early ('SIGINT', 'SIGTERM'),
  or None."""
  # Imports are per mode so that preprocessing does not pay for JAX start-up.
  if mode == 'preprocess':
    from mtn_jax.data import preprocess
    preprocess.prepare(config, workdir, verbose=True)
  elif mode == 'train':
    from mtn_jax import train
    return train.train_and_evaluate(config, workdir)['stopped_by']
  elif mode == 'eval':
    from mtn_jax import evaluate
    evaluate.evaluate(config, workdir)
  elif mode == 'decode':
    from mtn_jax import suggest
    suggest.decode_file(config, workdir)
  elif mode == 'suggest':
    from mtn_jax import suggest
    suggest.interactive(config, workdir)
  elif mode == 'report':
    from mtn_jax import report
    report.write_report(config, workdir)
  else:
    from mtn_jax import main_job
    return main_job.run_all(config, workdir).get('stopped_by')
  return None


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
