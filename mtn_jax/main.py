"""Command line: flags, config, then one mode.

  python -m mtn_jax.main --config=configs/demo.py --workdir=/tmp/mtn_demo
  python -m mtn_jax.main --config=configs/aol.py:small --config.data.raw_files=LOG
      --workdir=W --mode=train --config.model.num_heads=8

`-h` or `--help` lists the modes, the flags, the config's keys and the decode input formats;
errors are one line and an exit code (`mtn_jax.cli`). The modes themselves: `mtn_jax.modes`.
"""

import logging as stdlib_logging
import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from mtn_jax import cli
from mtn_jax import errors
from mtn_jax import modes

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file('config', None, 'Config file, path[:variant] (required).',
                                lock_config=True)
flags.DEFINE_string('workdir', None, 'Run folder (required): data, checkpoints, logs, results.')
flags.DEFINE_enum('mode', 'all', list(modes.MODES),
                  'all: preprocess, train, eval, sample suggestions and report.')
flags.DEFINE_bool('distributed', False,
                  'Multi-host training and evaluation (--mode=all, train, eval): call '
                  'jax.distributed.initialize() before anything else. Without '
                  'the three flags below it detects the cluster (SLURM, Open MPI, TPU pods).')
flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (with --distributed).')
flags.DEFINE_integer('num_processes', None, 'Number of processes (with --distributed).')
flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1 (with --distributed).')
flags.DEFINE_integer('cpu_devices', None,
                     'JAX devices of a CPU-only host: 0 = one per core, N = N devices. Default: '
                     'one per core for training and evaluation (data parallel over the cores), '
                     'one for decode, suggest and serve (parallel.cpu_devices_for says why). '
                     'Where XLA_FLAGS\' --xla_force_host_platform_device_count sets a count, it '
                     'decides (another --cpu_devices is refused).')
flags.register_validator('cpu_devices', lambda count: count is None or count >= 0,
                         message='--cpu_devices must be >= 0 (0: one per core)')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    cli.usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if FLAGS.distributed and FLAGS.mode not in modes.MULTI_PROCESS_MODES:
    cli.usage_error(f'--distributed: --mode={FLAGS.mode} runs in one process (training and '
                    f'evaluation run on several: --mode={", ".join(modes.MULTI_PROCESS_MODES)})')
  cli.quiet_library_logs()
  if not FLAGS['verbosity'].present:
    # Orbax's background threads log each failure of a checkpoint write with a traceback (a
    # full disk: one per file being written), then the save that waits for them raises it,
    # named in one line (`checkpoints._writing`): their copies would bury that line.
    stdlib_logging.getLogger('absl').addFilter(cli.not_orbax_thread_failures)
  # Ctrl-C while the config's checks import the libraries (seconds) stops in one line too.
  with cli.run_errors():
    config = cli.checked_config(FLAGS['config'], FLAGS.mode)
    workdir = os.path.expanduser(FLAGS.workdir)  # a shell leaves `--workdir=~/w` as typed
    cli.check_workdir(workdir)
    if FLAGS.mode != 'preprocess':  # the one mode that runs without JAX
      from mtn_jax import parallel  # pylint: disable=g-import-not-at-top
      try:
        parallel.set_cpu_devices(parallel.cpu_devices_for(FLAGS.mode, FLAGS.cpu_devices),
                                 asked=FLAGS.cpu_devices is not None)
      except errors.ConfigError as e:  # a flag that contradicts the environment
        cli.usage_error(str(e))
    if FLAGS.distributed:
      import jax  # pylint: disable=g-import-not-at-top
      jax.distributed.initialize(coordinator_address=FLAGS.coordinator_address,
                                 num_processes=FLAGS.num_processes,
                                 process_id=FLAGS.process_id)
    stopped_by = modes.MODES[FLAGS.mode](config, workdir)
  sys.exit(cli.EXIT_CODES.get(stopped_by, 0))


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
