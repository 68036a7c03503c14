"""Command line: flags, config, then one mode.

  python -m mtn_jax.main --config=configs/demo.py --workdir=/tmp/mtn_demo
  python -m mtn_jax.main --config=configs/aol.py:small --config.data.raw_files=LOG \
      --workdir=W --mode=train --config.model.num_heads=8
"""

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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not FLAGS['verbosity'].present:
    # Library INFO logs (orbax writes several per checkpoint) would bury the progress lines.
    logging.set_verbosity(logging.WARNING)
  config, workdir, mode = FLAGS.config, FLAGS.workdir, FLAGS.mode
  try:
    config_lib.validate(config, mode)
  except config_lib.ConfigError as e:
    raise app.UsageError(str(e)) from None
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
  app.run(main)
