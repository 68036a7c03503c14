"""Training system: crash-safe resume, SIGTERM, NaN stop, multi-device equivalence, refusals.

Each run is a real subprocess of `python -m mtn_jax.main` on a tiny config.
"""

import functools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import orbax.checkpoint as ocp
import pytest

from mtn_jax import config_lib
from mtn_jax import errors
from mtn_jax import files
from mtn_jax import parallel
from mtn_jax.training import checkpoints
from mtn_jax.training import metric_writer
from tests import cli

# Two short epochs over `cli.TINY`'s sessions of 3 queries, twice its users' (one bucket: each
# bucket is a train step to compile in every run; that a restored iterator and the processes'
# shards follow a shuffled plan of several shapes is tests/test_input_pipeline.py's), a
# checkpoint every 3 steps, a log line every step.
SHORT = ('--config.data.demo_users=300', '--config.train.num_epochs=2',
         '--config.train.checkpoint_every_steps=3',
         '--config.train.log_every_steps=1', '--config.train.keep_checkpoints=2')


def final_params(workdir):
  manager = checkpoints.open_manager(str(workdir), read_only=True)
  step = manager.latest_step()
  params = manager.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore()))['params']
  manager.close()
  return step, params


def assert_trees_equal(a, b):
  import jax  # pylint: disable=g-import-not-at-top
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope='module')
def reference_run(tmp_path_factory):
  """An uninterrupted run: the yardstick for resume and multi-device runs."""
  workdir = tmp_path_factory.mktemp('reference')
  result = cli.run(workdir, *SHORT)
  return workdir, result


def train_losses(workdir):
  return [(r['step'], r['loss']) for r in metric_writer.read_metrics(str(workdir), 'train')]


@pytest.fixture(scope='module')
def reference_rerun(reference_run):
  """The reference run's command run again on its finished workdir (one run for the tests
  of what a second run says and does), and the training losses logged before it."""
  workdir, _ = reference_run
  losses = train_losses(workdir)
  return cli.run(workdir, *SHORT), losses


@pytest.mark.slow
def test_reference_run_learns_and_logs(reference_run, reference_rerun):
  workdir, result = reference_run
  assert 'parameters' in result.stdout and 'MB (fp32)' in result.stdout
  losses = train_losses(workdir)
  assert [s for s, _ in losses] == list(range(1, len(losses) + 1))
  assert losses[-1][1] < losses[0][1]
  # The demo smooths its labels: each progress line shows the cross-entropy beside the
  # objective, the figure the validation loss is comparable with.
  logged = metric_writer.read_metrics(str(workdir), 'train')
  shown = [l for l in result.stdout.splitlines() if re.match(r'step \d+/', l)]
  assert len(shown) == len(logged)
  for line, record in zip(shown, logged):
    assert f'loss {record["loss"]:.4f} (cross-entropy {record["nll"]:.4f}) lr' in line
  valid = metric_writer.read_metrics(str(workdir), 'valid')
  # Learned: a nat or more below guessing uniformly over the vocabulary, after each epoch
  # (the second epoch's need not be the lower: at this size and rate it may overfit).
  words = len(json.loads((workdir / 'data' / 'vocab.json').read_text())['words'])
  assert len(valid) == 2 and all(v['loss'] < math.log(words) - 1 for v in valid)
  config = json.loads((workdir / 'config.json').read_text())
  assert config['config']['model']['d_model'] == 16
  assert list((workdir / 'tensorboard').iterdir())
  # Re-running the finished command says so and does no more steps.
  again, before = reference_rerun
  assert 'Training is already complete' in again.stdout and 'Resuming' not in again.stdout
  assert losses == before
  # Run with fewer steps than it was trained: said so, not "step N of fewer than N".
  fewer = cli.run(workdir, *SHORT, '--config.train.max_steps=2').stdout
  step = losses[-1][0]
  assert (f'is step {step} past the 2 this config trains (an earlier run trained further)'
          in fewer), fewer
  assert f'Training done at step {step:,}, past the 2 this config trains' in fewer, fewer
  assert train_losses(workdir) == before


def committed_steps(workdir) -> list[int]:
  """The steps of the checkpoints written whole (orbax renames a checkpoint's temporary
  folder to its step once it is complete)."""
  folder = checkpoints.checkpoint_dir(str(workdir))
  return sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []


@pytest.mark.slow
def test_sigkill_at_random_step_then_resume_is_bit_exact(reference_run, tmp_path):
  ref_dir, _ = reference_run
  total = len(train_losses(ref_dir))
  # A step drawn after the first checkpoint (every 3 steps); MTN_TEST_SEED replays a draw.
  seed = int(os.environ.get('MTN_TEST_SEED') or random.SystemRandom().randrange(2**32))
  kill_after = random.Random(seed).randint(4, total - 3)
  print(f'MTN_TEST_SEED={seed}: killed at step {kill_after} or the first after it that '
        'follows a committed checkpoint')
  where = f'seed {seed}, step {kill_after}'
  proc = cli.popen(tmp_path, *SHORT)
  killed_at = None
  for line in proc.stdout:
    step = re.match(r'step (\d+)/', line)
    # Checkpoints are written in the background: kill once one is committed, so that the
    # run resumes from it (never from a half-written one).
    if step and int(step.group(1)) >= kill_after and committed_steps(tmp_path):
      proc.send_signal(signal.SIGKILL)
      killed_at = int(step.group(1))
      break
  proc.wait(timeout=120)
  assert proc.returncode == -signal.SIGKILL, f'run ended before it was killed ({where})'
  manager = checkpoints.open_manager(str(tmp_path), read_only=True)
  committed = manager.latest_step()
  manager.close()
  assert committed is not None and committed <= killed_at, (committed, killed_at, where)
  resumed = cli.run(tmp_path, *SHORT)
  assert f'Resuming from checkpoint {tmp_path}/checkpoints/{committed} ' in resumed.stdout, where
  ref_step, ref_params = final_params(ref_dir)
  step, params = final_params(tmp_path)
  assert step == ref_step == total, where
  assert_trees_equal(params, ref_params)
  # The log holds each step's records once, as the uninterrupted run's does: what the killed
  # run wrote after its checkpoint was dropped, and written again by the resumed run.
  logged = lambda workdir: [(r['kind'], r['step']) for r in metric_writer.read_metrics(workdir)]
  assert logged(str(tmp_path)) == logged(str(ref_dir)), where


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_starts_afresh_its_log_once(reference_run,
                                                                               tmp_path):
  """Killed before any checkpoint is committed, the run starts again from nothing: what the
  killed run logged goes (metrics.jsonl, TensorBoard), as after a checkpoint what follows it
  goes; the run is the uninterrupted one."""
  ref_dir, _ = reference_run
  proc = cli.popen(tmp_path, *SHORT)
  for line in proc.stdout:
    if re.match(r'step 1/', line):
      proc.send_signal(signal.SIGKILL)
      break
  proc.wait(timeout=120)
  assert proc.returncode == -signal.SIGKILL and not committed_steps(tmp_path)
  logged_before = len(metric_writer.read_metrics(str(tmp_path)))
  assert logged_before  # what the killed run logged
  again = cli.run(tmp_path, *SHORT)
  assert 'Resuming' not in again.stdout
  assert (f'Note: {tmp_path / "metrics.jsonl"}: {logged_before} records of a run that left no '
          'checkpoint: dropped.') in again.stdout
  # TensorBoard is told to hide the killed run's events from step 1 on.
  starts = [e.step for e in tensorboard_events(tmp_path / 'tensorboard')
            if e.HasField('session_log')]
  assert 1 in starts, starts
  logged = lambda workdir: [(r['kind'], r['step']) for r in metric_writer.read_metrics(workdir)]
  assert logged(str(tmp_path)) == logged(str(ref_dir))
  assert_trees_equal(final_params(tmp_path)[1], final_params(ref_dir)[1])


@pytest.mark.slow
def test_four_devices_match_one(reference_run, tmp_path):
  """Four CPU devices, asked for by `--cpu_devices` alone (no device count in XLA_FLAGS: the
  flag decides), give the same losses as one."""
  ref_dir, _ = reference_run
  result = cli.run(tmp_path, *SHORT, '--config.train.num_epochs=1', '--cpu_devices=4',
                   devices=None)
  assert 'on 4 device(s)' in result.stdout
  four = train_losses(tmp_path)
  one = dict(train_losses(ref_dir))
  assert four
  for step, loss in four:
    assert loss == pytest.approx(one[step], rel=1e-4), step


@pytest.mark.slow
def test_nonfinite_loss_stops_with_step_named_and_checkpoint_intact(tmp_path):
  result = cli.run(tmp_path, '--config.train.schedule=constant',
                   '--config.train.warmup_steps=0', '--config.train.learning_rate=1e30',
                   '--config.train.checkpoint_every_steps=1',
                   '--config.train.log_every_steps=1000', check=False)
  assert result.returncode != 0
  assert 'non-finite training loss' in result.stderr
  message = next(l for l in result.stderr.splitlines() if 'non-finite training loss' in l)
  bad_step = int(message.split(' at step ')[1].split(';')[0])
  manager = checkpoints.open_manager(str(tmp_path), read_only=True)
  assert manager.latest_step() == bad_step
  params = manager.restore(bad_step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore()))['params']
  manager.close()
  import jax  # pylint: disable=g-import-not-at-top
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


@pytest.mark.slow
def test_checkpoint_of_another_model_is_refused(reference_run, tmp_path):
  ref_dir, _ = reference_run
  result = cli.run(ref_dir, *SHORT, '--config.model.ff_dim=64', check=False)
  assert result.returncode != 0
  assert 'holds another model' in result.stderr and 'model.ff_dim' in result.stderr
  # Another seed or batch size: the checkpoint's data order would not be continued.
  for override, key, values in (('--config.seed=1', 'seed', '0, not 1'),
                                ('--config.input.train_queries_per_batch=128',
                                 'input.train_queries_per_batch', '240, not 128')):
    result = cli.run(ref_dir, *SHORT, override, check=False)
    assert result.returncode == 1 and result.stderr.strip().endswith(
        f'was trained with config.{key}={values}: a resumed run continues its batches in '
        f'their order; use {values.split(",")[0]}, or a new workdir'), result.stderr
  # Continued on another device count: each batch holds a multiple of it, so the batches
  # differ (a run complete at this count's total steps is only read).
  result = cli.run(ref_dir, *SHORT, '--config.train.num_epochs=3', '--cpu_devices=2',
                   devices=None, check=False)
  assert result.returncode == 1 and result.stderr.strip().endswith(
      'was trained on 1 device(s), not 2: a resumed run continues its batches in their order, '
      'and each batch holds a multiple of the device count; resume on 1 (--cpu_devices=1 on a '
      'CPU), or use a new workdir'), result.stderr
  # Read (not continued) on another device count, past its total: said that the count may be
  # why.
  result = cli.run(ref_dir, *SHORT, '--config.train.num_epochs=1', '--cpu_devices=2',
                   devices=None)
  assert ('this config trains (an earlier run trained further, or on 1 device(s), where an '
          'epoch has other steps)') in result.stdout, result.stdout


@pytest.mark.slow
@pytest.mark.parametrize('override, message', [
    ('--config.model.num_heads=3', 'num_heads (3) must divide'),
    ('--config.model.name=lstm9', "model.name 'lstm9' is not a model"),
    ('--config.model.d_model=0', 'config.model.d_model must be positive'),
    ('--config.model.nmu_heads=4', 'nmu_heads'),
    ('--config.model.num_heads=four', 'num_heads'),
    ('--config.decode.eval_split=train', "eval_split must be 'test' or 'valid'"),
    ('--config.decode.mbr=ranker', "config.decode.mbr 'ranker' reorders the pooled candidates"),
    ('--config.decode.mbr=bleu', "config.decode.mbr='bleu': unknown list 'bleu'"),
    ('--config.train.loss_chunk_tokens=0', 'config.train.loss_chunk_tokens must be positive'),
    ('--cpu_devices=-1', '--cpu_devices must be >= 0'),
    # The tests' XLA_FLAGS set one device: another count asked for would not be the run's.
    ('--cpu_devices=2', '--cpu_devices=2 contradicts XLA_FLAGS, whose '
     '--xla_force_host_platform_device_count=1 would decide: unset one of them'),
])
def test_config_errors_fail_before_any_work(tmp_path, override, message):
  result = cli.run(tmp_path, override, check=False, timeout=60)
  assert result.returncode == 2, result.stderr  # a usage error
  assert message in result.stderr
  assert not (tmp_path / 'data').exists()


@functools.cache
def _cpu_devices_in_a_fresh_process(cpu_devices: int, xla_flags: str) -> tuple[int, int, str]:
  """(what set_cpu_devices returns, jax.device_count(), XLA_FLAGS after it) in a new
  interpreter."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env.pop('XLA_FLAGS', None)
  if xla_flags:
    env['XLA_FLAGS'] = xla_flags
  code = (f'from mtn_jax import parallel; print(parallel.set_cpu_devices({cpu_devices})); '
          'import os, jax; print(jax.device_count()); print(os.environ.get("XLA_FLAGS", ""))')
  out = subprocess.run([sys.executable, '-c', code], cwd=cli.REPO, env=env, check=True,
                       capture_output=True, text=True).stdout.splitlines()
  return int(out[-3]), int(out[-2]), out[-1]


def test_modes_that_run_batches_whole_get_one_cpu_device_unless_told():
  from mtn_jax import parallel  # pylint: disable=g-import-not-at-top
  assert [parallel.cpu_devices_for(mode, None) for mode in ('all', 'train', 'eval')] == [0] * 3
  assert [parallel.cpu_devices_for(mode, None) for mode in ('decode', 'suggest', 'serve')
          ] == [1] * 3
  assert parallel.cpu_devices_for('serve', 0) == 0 and parallel.cpu_devices_for('train', 3) == 3


def test_cpu_hosts_get_one_device_per_core_unless_told():
  cores = len(os.sched_getaffinity(0))
  assert _cpu_devices_in_a_fresh_process(0, '')[:2] == (cores, cores)
  assert _cpu_devices_in_a_fresh_process(3, '')[:2] == (3, 3)
  # A count set through XLA_FLAGS wins (the tests' own multi-device runs rely on it).
  assert _cpu_devices_in_a_fresh_process(
      0, '--xla_force_host_platform_device_count=1')[:2] == (0, 1)


def test_a_cpu_device_count_asked_for_that_xla_flags_contradicts_is_refused(monkeypatch):
  """With a device count in XLA_FLAGS (which XLA obeys), a `--cpu_devices` that agrees runs,
  one that differs is refused rather than ignored; a count nobody asked for (a mode's
  default) gives way silently."""
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=1')
  assert parallel.set_cpu_devices(1, asked=True) == 0
  assert parallel.set_cpu_devices(2) == 0
  with pytest.raises(errors.Error, match=r'--cpu_devices=2 contradicts XLA_FLAGS, whose '
                     r'--xla_force_host_platform_device_count=1 would decide'):
    parallel.set_cpu_devices(2, asked=True)
  if len(os.sched_getaffinity(0)) > 1:  # one per core is another count than 1
    with pytest.raises(errors.Error, match=r'--cpu_devices=0 \(one per core: \d+\)'):
      parallel.set_cpu_devices(0, asked=True)


def test_one_per_core_asked_for_where_xla_flags_sets_the_core_count_runs(monkeypatch):
  """--cpu_devices=0 (one per core) agrees with an XLA_FLAGS count of the cores."""
  cores = len(os.sched_getaffinity(0))
  monkeypatch.setenv('XLA_FLAGS', f'--xla_force_host_platform_device_count={cores}')
  assert parallel.set_cpu_devices(0, asked=True) == 0
  with pytest.raises(errors.Error, match='contradicts XLA_FLAGS'):
    parallel.set_cpu_devices(cores + 1, asked=True)


def test_cpu_collectives_wait_long_for_a_late_device_unless_told(monkeypatch):
  """XLA aborts a process whose CPU devices meet at a collective more than a minute apart
  (its 40 s terminate timeout), which killed training runs on a busy machine: set_cpu_devices
  raises that timeout, whether or not XLA_FLAGS sets the device count, and keeps a timeout
  that XLA_FLAGS sets."""
  timeout = ('--xla_cpu_collective_call_terminate_timeout_seconds='
             f'{parallel.CPU_COLLECTIVE_TIMEOUT_SECONDS}')
  assert parallel.CPU_COLLECTIVE_TIMEOUT_SECONDS >= 600
  assert _cpu_devices_in_a_fresh_process(0, '')[2] == timeout
  device_count = '--xla_force_host_platform_device_count=1'
  assert _cpu_devices_in_a_fresh_process(0, device_count)[2] == f'{device_count} {timeout}'
  # With the device count in XLA_FLAGS, set_cpu_devices leaves jax's config alone: safe here.
  own = f'{device_count} --xla_cpu_collective_call_terminate_timeout_seconds=7'
  monkeypatch.setenv('XLA_FLAGS', own)
  assert parallel.set_cpu_devices(0) == 0
  assert os.environ['XLA_FLAGS'] == own


# Two CPU devices meet at a psum, the second 5 s late (a callback sleeps on it first).
_LATE_DEVICE = '''
import time
from mtn_jax import parallel
parallel.CPU_COLLECTIVE_TIMEOUT_SECONDS = 1
parallel.set_cpu_devices(2)
import jax
import numpy as np
from jax.sharding import PartitionSpec as P

def late(x, index):
  if int(index) == 1:
    time.sleep(5)
  return x

mesh = jax.make_mesh((2,), ('d',), axis_types=(jax.sharding.AxisType.Auto,))

@jax.jit
@jax.shard_map(mesh=mesh, in_specs=P('d'), out_specs=P())
def total(x):
  x = jax.pure_callback(late, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                        jax.lax.axis_index('d'))
  return jax.lax.psum(x, 'd')

print(np.asarray(total(np.arange(4.0, dtype=np.float32))))
'''


@pytest.mark.slow
def test_the_collective_timeout_set_is_the_one_xla_obeys():
  """The timeout set_cpu_devices writes reaches XLA's CPU collectives: made 1 s (and the stuck
  warning before it 0 s), a device 5 s late aborts the process, where XLA's own timeouts (a
  minute in all) would have waited for it."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS='--xla_cpu_collective_call_warn_stuck_timeout_seconds=0')
  result = subprocess.run([sys.executable, '-c', _LATE_DEVICE], cwd=cli.REPO, env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode != 0, result.stdout
  assert 'Termination timeout' in result.stderr and 'of 1 seconds exceeded' in result.stderr


def test_importing_the_package_starts_no_jax_backend():
  """The device count (--cpu_devices) applies when jax's backend starts: no module of the
  package, nor a library it imports at the top (bm25s runs a jax op when imported), may
  start it first."""
  code = ('import importlib, pkgutil, mtn_jax\n'
          'for module in pkgutil.walk_packages(mtn_jax.__path__, "mtn_jax."):\n'
          '  importlib.import_module(module.name)\n'
          'from jax._src import xla_bridge\n'
          'print(len(module.name) > 0, xla_bridge.backends_are_initialized())')
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', code], cwd=cli.REPO, env=env, check=True,
                       capture_output=True, text=True).stdout.split()
  assert out[-2:] == ['True', 'False']


@pytest.mark.slow
def test_missing_data_is_a_clear_error(tmp_path):
  result = cli.run(tmp_path, '--config.data.source=aol',
                   f'--config.data.raw_files={tmp_path}/nothing-*.tsv', check=False, timeout=60)
  assert result.returncode != 0
  assert 'nothing-*.tsv' in result.stderr
  assert 'Traceback' not in result.stderr


def test_validate_accepts_the_shipped_configs():
  from configs import aol, default, demo, transformer_aol  # pylint: disable=g-import-not-at-top
  for config in (default.get_config('mtn'), demo.get_config(), aol.get_config('small'),
                 transformer_aol.get_config('small,enc5dec5')):
    if config.data.source == 'aol':
      config.data.raw_files = config.data.raw_files or 'log.tsv'
    config_lib.validate(config)


def two_processes(workdir, *overrides, devices: int, **command) -> list[str]:
  """The command line run as two JAX processes (coordinator on localhost), `devices` CPU
  devices each; their outputs, once both ended well."""
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  procs = [subprocess.Popen(
      cli.command(workdir, *overrides, '--distributed', f'--coordinator_address=localhost:{port}',
                  '--num_processes=2', f'--process_id={i}', **command),
      cwd=cli.REPO, env=cli.env(devices), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True) for i in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  for p, out in zip(procs, outputs):
    assert p.returncode == 0, out[-3000:]
  return outputs


@pytest.mark.slow
def test_two_processes_match_one(reference_run, tmp_path):
  """Two JAX processes (coordinator on localhost), one CPU device each: same losses as one
  process; only process 0 writes logs; the checkpoint is written collectively."""
  ref_dir, _ = reference_run
  outputs = two_processes(tmp_path, *SHORT, '--config.train.num_epochs=1', devices=1)
  assert 'step 1/' in outputs[0] and 'step 1/' not in outputs[1]
  one = dict(train_losses(ref_dir))
  two = train_losses(tmp_path)
  assert two
  for step, loss in two:
    assert loss == pytest.approx(one[step], rel=1e-4), step
  manager = checkpoints.open_manager(str(tmp_path), read_only=True)
  assert manager.latest_step() == len(two)
  manager.close()


@pytest.mark.slow
@pytest.mark.parametrize('config', ['configs/demo.py', 'configs/polyencoder_aol.py:demo'])
def test_two_processes_evaluate_as_one(config, tmp_path):
  """--mode=eval as two JAX processes of two CPU devices each: the same lists and figures as
  one process of two devices (a generator's beam, a ranker's whole pool), written once."""
  trained, one, two = tmp_path / 'trained', tmp_path / 'one', tmp_path / 'two'
  cli.run(trained, '--config.train.max_steps=6', config=config)
  shutil.copytree(trained, one)
  shutil.copytree(trained, two)
  cli.run(one, mode='eval', config=config, devices=2)
  outputs = two_processes(two, mode='eval', config=config, devices=2)
  assert 'Results: ' in outputs[0] and 'Results: ' not in outputs[1]
  assert ((one / 'eval' / 'lists.jsonl').read_bytes()
          == (two / 'eval' / 'lists.jsonl').read_bytes())
  own = ('workdir', 'date', 'devices', 'decode_seconds', 'wall_seconds', 'suggestions_per_s')
  figures = lambda w: {k: v for k, v in json.loads((w / 'eval' / 'results.json').read_text())
                       .items() if k not in own}
  assert figures(one) == figures(two)


@pytest.mark.slow
def test_stop_signals_save_a_checkpoint_exit_non_zero_and_resume_exactly(tmp_path):
  """SIGINT (Ctrl-C) and SIGTERM (a scheduler) both stop after a checkpoint, with one line and
  the shell's exit code for that signal (130, 143), so a script can tell the run did not
  finish. A validation of many small batches: Ctrl-C in it stops within a batch, saving the
  checkpoint; the run that resumes validates that epoch first, is stopped by SIGTERM in a
  training step, and running the command once more ends where an uninterrupted run does
  (the same losses, the same best checkpoint, the same parameters)."""
  long_validation = ('--config.data.split_fractions=(0.5,0.45,0.05)',
                     '--config.input.eval_queries_per_batch=6', '--config.train.num_epochs=2',
                     '--config.train.log_every_steps=1')
  straight = tmp_path / 'straight'
  cli.run(straight, *long_validation)
  stopped = tmp_path / 'stopped'
  steps_per_epoch = None

  def stop_at(step_of, stop: signal.Signals) -> str:
    """A run of `stopped` sent `stop` at the progress line of step `step_of(steps per
    epoch)`; its whole output, once checked for the exit code and the one line."""
    nonlocal steps_per_epoch
    proc = cli.popen(stopped, *long_validation)
    read, at_step = [], None
    for line in proc.stdout:
      read.append(line)
      if steps_per_epoch is None and ' steps per epoch' in line:
        steps_per_epoch = int(line.split(' steps per epoch')[0].rsplit('; ', 1)[1])
      if steps_per_epoch and line.startswith(f'step {step_of(steps_per_epoch)}/'):
        at_step = step_of(steps_per_epoch)
        proc.send_signal(stop)
        break
    output = ''.join(read) + proc.communicate(timeout=120)[0]
    assert at_step is not None and proc.returncode == 128 + stop, output
    assert f'{stop.name}: saved a checkpoint at step' in output and 'Traceback' not in output
    manager = checkpoints.open_manager(str(stopped), read_only=True)
    saved = manager.latest_step()
    manager.close()
    assert saved is not None and saved >= at_step, output
    return output

  # The last step of the first epoch: its validation has begun.
  output = stop_at(lambda spe: spe, signal.SIGINT)
  assert (f'SIGINT: saved a checkpoint at step {steps_per_epoch} (its validation runs first '
          'when it resumes)') in output, output
  assert f'validation at step {steps_per_epoch} ' not in output
  resumed = stop_at(lambda spe: spe + 2, signal.SIGTERM)
  assert 'Resuming from' in resumed
  assert resumed.index(f'validation at step {steps_per_epoch} ') < resumed.index(
      f'step {steps_per_epoch + 1}/')
  cli.run(stopped, *long_validation)
  valid = lambda w: [(r['step'], r['loss']) for r in metric_writer.read_metrics(str(w), 'valid')]
  assert valid(stopped) == valid(straight) and len(valid(straight)) == 2
  assert train_losses(stopped) == train_losses(straight)
  assert_trees_equal(final_params(stopped)[1], final_params(straight)[1])


@pytest.mark.slow
def test_train_says_what_it_preprocessed_and_where_everything_is(reference_run,
                                                                  reference_rerun):
  """--mode=train on a fresh workdir builds the corpus and prints its summary (as
  --mode=preprocess does), and ends with the best checkpoint and the workdir's files.
  The module's reference run is such a run (a run of its own cost 7 s)."""
  workdir, result = reference_run
  out = result.stdout
  assert f'Corpus in {workdir / "data"}' in out and 'vocabulary: ' in out, out
  total = int(re.search(r'Training done at step (\d+) of \1\.', out).group(1))
  assert out.index('Corpus in') < out.index(f'step 1/{total} ')  # before training starts
  closing = out[out.index(f'Training done at step {total} of {total}.'):]
  valid = metric_writer.read_metrics(str(workdir), 'valid')
  best = min(valid, key=lambda record: record['loss'])['step']
  assert f'Best checkpoint: step {best}, validation loss ' in closing, closing
  for name in ('checkpoints/', 'data/', 'metrics.jsonl'):
    assert f'  {name}' in closing, closing
  again, _ = reference_rerun
  assert 'Reusing the corpus in' in again.stdout  # nothing rebuilt, and it says so


def test_a_damaged_checkpoint_is_named_in_one_error_with_what_to_fall_back_on(tmp_path):
  """Truncated parameters or a garbage metadata file: one error naming the checkpoint and
  the one the folder gives without it, not orbax's or tensorstore's traceback."""
  from mtn_jax.data.vocab import SPECIAL_TOKENS, Vocab  # pylint: disable=g-import-not-at-top
  params = {'w': np.arange(4096, dtype=np.float32).reshape(64, 64)}
  manager = checkpoints.open_manager(str(tmp_path), keep=3)
  for step in (1, 2):
    checkpoints.save(manager, step, params=params, train_state={'step': np.int32(step)},
                     data_iter={}, meta={'best_step': step},
                     vocab=Vocab(SPECIAL_TOKENS + ('a',)))
  manager.wait_until_finished()
  step_dir = tmp_path / 'checkpoints' / '2'
  largest = max((p for p in (step_dir / 'params').rglob('*') if p.is_file()),
                key=lambda p: p.stat().st_size)
  with open(largest, 'r+b') as f:
    f.truncate(100)
  abstract = {'w': ocp.utils.to_shape_dtype_struct(params['w'])}
  reader = checkpoints.open_manager(str(tmp_path), read_only=True)
  assert checkpoints.restore(reader, 1, abstract_params=abstract)['params']['w'].sum() == (
      params['w'].sum())
  # The JSON items of the step asked for, not of the latest.
  assert checkpoints.read_meta(reader, 1)['best_step'] == 1
  assert checkpoints.read_json(reader, 2, 'meta')['meta']['best_step'] == 2
  with pytest.raises(checkpoints.DamagedCheckpoint, match=re.escape(
      f'{step_dir}: a damaged or incomplete checkpoint (')) as error:
    checkpoints.restore(reader, 2, abstract_params=abstract)
  assert str(error.value).endswith('; move it out of the folder to use step 1')
  assert '\n' not in str(error.value)
  def damaged_advice(folder, bests, damaged):
    """The advice when checkpoint `damaged` of steps 1, 2, ... (each naming its `bests`
    entry as the best) is cut short."""
    manager = checkpoints.open_manager(str(folder), keep=3)
    for step, best in enumerate(bests, 1):
      checkpoints.save(manager, step, params=params, train_state={'step': np.int32(step)},
                       data_iter={}, meta={'best_step': best},
                       vocab=Vocab(SPECIAL_TOKENS + ('a',)))
    manager.wait_until_finished()
    params_dir = folder / 'checkpoints' / str(damaged) / 'params'
    with open(max((p for p in params_dir.rglob('*') if p.is_file()),
                  key=lambda p: p.stat().st_size), 'r+b') as f:
      f.truncate(100)
    with pytest.raises(checkpoints.DamagedCheckpoint) as error:
      checkpoints.restore(checkpoints.open_manager(str(folder), read_only=True), damaged,
                          abstract_params=abstract)
    return str(error.value)

  # Where the newest of the others names an earlier one as best, both are named: the best
  # is what decoding and serving load, the latest what a resumed run continues from.
  assert damaged_advice(tmp_path / 'other', (1, 1, 3), 3).endswith(
      '; move it out of the folder to use the others (then the best: step 1; the latest: '
      'step 2)')
  # The best one damaged: moving it out would leave no best, so the advice is a copy of it;
  # once gone, loading the best says so rather than a damaged file of a missing folder.
  lost = tmp_path / 'lost'
  assert damaged_advice(lost, (1, 2, 2), 2).endswith(
      '; it is the checkpoint the newest one names as the best, which eval, decode and serve '
      'read: restore it from a copy (a resumed run continues from step 3)')
  shutil.rmtree(lost / 'checkpoints' / '2')
  from mtn_jax.inference import trained  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.Error, match=re.escape(
      f"checkpoint {lost / 'checkpoints'}/2, which step 3 names as the best, is gone")):
    trained._step(checkpoints.open_manager(str(lost), read_only=True), str(lost))  # pylint: disable=protected-access
  meta = (step_dir / 'meta' / 'metadata').read_text()
  (step_dir / 'meta' / 'metadata').write_text('garbage')
  with pytest.raises(checkpoints.DamagedCheckpoint, match='JSONDecodeError'):
    checkpoints.read_meta(reader, 2)
  (step_dir / 'meta' / 'metadata').write_text(meta)
  (step_dir / 'vocab' / 'metadata').write_text('{')  # what loading a model reads with it
  with pytest.raises(checkpoints.DamagedCheckpoint, match='JSONDecodeError'):
    checkpoints.read_json(reader, 2, 'meta', 'vocab')


def test_a_failed_read_is_named_by_the_first_line_of_the_first_error_of_its_chain():
  """The error a user sees names what went wrong first (a JSON error under orbax's 'restore
  failed', raised while handling it or from it), in one line."""
  first = checkpoints._first_cause  # pylint: disable=protected-access
  for chained in (False, True):
    try:
      try:
        raise ValueError('Expecting value: line 1 column 1\n  more detail')
      except ValueError as cause:
        if chained:
          raise RuntimeError('restore failed') from cause
        raise RuntimeError('restore failed')  # pylint: disable=raise-missing-from
    except RuntimeError as e:
      assert first(e) == 'ValueError: Expecting value: line 1 column 1'


def test_a_checkpoint_whose_values_changed_on_disk_is_refused_by_their_digest(tmp_path):
  """A bit flipped in a data file after the save: orbax reads it back as other values, without
  complaint; the values' digest saved with the checkpoint names the item, in one error with
  the checkpoint the folder gives without it. A checkpoint without the digest (older code) reads as before."""
  import jax  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import SPECIAL_TOKENS, Vocab  # pylint: disable=g-import-not-at-top
  params = {'w': np.arange(4096, dtype=np.float32).reshape(64, 64)}
  train_state = {'step': np.zeros((), np.int32), 'mu': np.linspace(0, 1, 4096, dtype=np.float32)}
  manager = checkpoints.open_manager(str(tmp_path), keep=3)
  for step in (1, 2, 3):
    checkpoints.save(manager, step, params=params, train_state=train_state, data_iter={},
                     meta={'best_step': step}, vocab=Vocab(SPECIAL_TOKENS + ('a',)))
  manager.wait_until_finished()

  def flip_a_bit(item_dir):
    largest = max((p for p in item_dir.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0x10
    largest.write_bytes(bytes(data))

  abstract = {'w': ocp.utils.to_shape_dtype_struct(params['w'])}
  abstract_train = jax.tree.map(ocp.utils.to_shape_dtype_struct, train_state)
  reader = checkpoints.open_manager(str(tmp_path), read_only=True)
  flip_a_bit(tmp_path / 'checkpoints' / '2' / 'params')
  flip_a_bit(tmp_path / 'checkpoints' / '3' / 'train')
  # Without step 2 the folder's best and latest is 3; without 3, 2.
  for step, item, read_train, then in ((2, 'params', False, 3), (3, 'train', True, 2)):
    with pytest.raises(checkpoints.DamagedCheckpoint) as error:
      checkpoints.restore(reader, step, abstract_params=abstract,
                          abstract_train_state=abstract_train if read_train else None)
    assert str(error.value) == (
        f'{tmp_path}/checkpoints/{step}: a damaged or incomplete checkpoint (the values read '
        f'from {item}/ are not those saved: its files changed after it was written); move it '
        f'out of the folder to use step {then}')
  # Offline decoding reads only the params: the damaged train state of step 3 is not read.
  np.testing.assert_array_equal(
      checkpoints.restore(reader, 3, abstract_params=abstract)['params']['w'], params['w'])
  meta_file = tmp_path / 'checkpoints' / '2' / 'meta' / 'metadata'
  meta = json.loads(meta_file.read_text())
  del meta[checkpoints.DIGESTS]
  meta_file.write_text(json.dumps(meta))
  changed = checkpoints.restore(reader, 2, abstract_params=abstract)['params']['w']
  assert (changed != params['w']).any()  # what orbax alone reads: other values, no error
  # A checkpoint of the digest's first version is checked as that version wrote it: read
  # where its values are those saved (a changed one: step 3 above), refused where not.
  for step in (1, 3):
    meta_file = tmp_path / 'checkpoints' / str(step) / 'meta' / 'metadata'
    meta = json.loads(meta_file.read_text())
    meta[checkpoints.DIGESTS] = {
        'params': checkpoints._first_values_digest(params),  # pylint: disable=protected-access
        'train': checkpoints._first_values_digest(train_state)}  # pylint: disable=protected-access
    meta_file.write_text(json.dumps(meta))
  restored = checkpoints.restore(reader, 1, abstract_params=abstract,
                                 abstract_train_state=abstract_train)
  np.testing.assert_array_equal(restored['params']['w'], params['w'])
  with pytest.raises(checkpoints.DamagedCheckpoint, match='the values read from train/'):
    checkpoints.restore(reader, 3, abstract_params=abstract, abstract_train_state=abstract_train)


def test_values_digest_reads_every_value_dtype_and_shape():
  import jax  # pylint: disable=g-import-not-at-top
  tree = {'a': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': np.int32(7)}
  digest = checkpoints.values_digest(tree)
  assert checkpoints.values_digest(jax.device_put(tree)) == digest
  assert checkpoints.values_digest(jax.random.key_data(jax.random.key(0))) == (
      checkpoints.values_digest(jax.random.key(0)))
  for other in ({**tree, 'b': np.int32(8)}, {**tree, 'b': np.int64(7)},
                {**tree, 'a': tree['a'].reshape(3, 2)},
                {**tree, 'a': np.nextafter(tree['a'], np.float32(9))}):
    assert checkpoints.values_digest(other) != digest
  # A flipped bit of any width, 64-bit host values included (JAX would narrow them).
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  for value in (np.float32(0.25), ml_dtypes.bfloat16(0.25), ml_dtypes.float8_e4m3fn(0.25),
                np.float64(0.25), np.int64(2**33), np.bool_(True)):
    flipped = np.array([value])
    flipped.view(np.uint8)[0] ^= 1
    assert checkpoints.values_digest(flipped) != checkpoints.values_digest(np.array([value])), (
        flipped.dtype)
  assert checkpoints.values_digest(ml_dtypes.bfloat16(1)) != checkpoints.values_digest(
      np.float16(1))
  assert checkpoints.values_digest(np.int64(2**33)) != checkpoints.values_digest(np.int64(0))
  assert checkpoints.values_digest(0.1) != checkpoints.values_digest(0.1 + 1e-12)
  # The accelerator's program sums what the host does (here run on the CPU).
  leaves = [np.arange(-7, 301, dtype=np.float32).reshape(7, -1) * 1e9, np.int32(-3),
            ml_dtypes.bfloat16(-2.5) * np.ones(5, ml_dtypes.bfloat16), np.array([True, False]),
            np.array([-1, 7], np.int8), jax.random.key_data(jax.random.key(3))]
  on_device = np.asarray(checkpoints._device_word_sums(  # pylint: disable=protected-access
      [jax.device_put(x) for x in leaves])).reshape(-1, 2)
  on_host = [checkpoints._word_sums(checkpoints._host_words(x), np)  # pylint: disable=protected-access
             for x in leaves]
  np.testing.assert_array_equal(on_device, np.array(on_host, np.uint32))


def test_the_best_checkpoint_outlives_a_resume_and_goes_once_another_is_best(tmp_path):
  """The last `keep` checkpoints and the best one are kept, the best as the newest complete
  checkpoint's meta names it: a run resumed in another process (a new manager) keeps the best
  of the run before it (orbax's own BestN, keyed on metrics this process saved, deleted it at
  the first save), and lets it go once its own checkpoints name another."""
  from mtn_jax.data.vocab import SPECIAL_TOKENS, Vocab  # pylint: disable=g-import-not-at-top
  vocab = Vocab(SPECIAL_TOKENS + ('a',))
  params, train_state = {'w': np.ones(3, np.float32)}, {'step': np.zeros((), np.int32)}
  folder = tmp_path / 'checkpoints'

  def run(steps_and_best):
    manager = checkpoints.open_manager(str(tmp_path), keep=1)
    for step, best in steps_and_best:
      checkpoints.save(manager, step, params=params, train_state=train_state, data_iter={},
                       meta={'best_step': best}, vocab=vocab)
    manager.close()
    return sorted(int(p.name) for p in folder.iterdir())

  assert run([(1, 1), (2, 1), (3, 1)]) == [1, 3]
  assert run([(4, 1)]) == [1, 4]  # resumed: step 1 is still the best
  reader = checkpoints.open_manager(str(tmp_path), read_only=True)
  assert checkpoints.best_step(reader) == 1
  # Step 5 is best: step 1 stays until a complete checkpoint names 5, then goes.
  assert run([(5, 5), (6, 5)]) == [5, 6]


def test_a_metrics_line_cut_short_is_dropped_and_another_bad_one_named(tmp_path, capsys):
  """A run stopped while writing metrics.jsonl leaves its last line without its end: the next
  run (a resume, or a start) drops it and says so, its own records on lines of their own; a
  line that is no record elsewhere is named, not a JSON traceback."""
  path = tmp_path / 'metrics.jsonl'
  records = [{'kind': 'train', 'step': s, 'time': 0.0, 'loss': 1.0} for s in (1, 2, 3)]
  whole = ''.join(json.dumps(r) + '\n' for r in records)
  for resumed_at in (None, 2):
    path.write_text(whole + '{"kind": "train", "st', encoding='utf-8')
    writer = metric_writer.MetricWriter(str(tmp_path), enabled=True, resumed_at=resumed_at)
    writer.write(4, 'train', {'loss': 0.5})
    writer.close()
    assert 'its last line was cut short' in capsys.readouterr().out
    steps = [r['step'] for r in metric_writer.read_metrics(str(tmp_path))]
    assert steps == ([1, 2, 3, 4] if resumed_at is None else [1, 2, 4])
  path.write_text(whole + '{"kind": "train", "st', encoding='utf-8')
  assert [r['step'] for r in metric_writer.read_metrics(str(tmp_path))] == [1, 2, 3]
  # A whole last record without its newline: kept, and the next record on a line of its own.
  path.write_text(whole.rstrip('\n'), encoding='utf-8')
  writer = metric_writer.MetricWriter(str(tmp_path), enabled=True)
  writer.write(4, 'train', {'loss': 0.5})
  writer.close()
  assert [r['step'] for r in metric_writer.read_metrics(str(tmp_path))] == [1, 2, 3, 4]
  path.write_text(whole.replace('"step": 2', '"step": 2x'), encoding='utf-8')
  for read in (lambda: metric_writer.read_metrics(str(tmp_path)),
               lambda: metric_writer.MetricWriter(str(tmp_path), enabled=True, resumed_at=3)):
    with pytest.raises(errors.Error,
                       match=re.escape(f'{path}:2: not a metrics record (')):
      read()


def test_blank_metrics_lines_are_skipped_and_a_whole_line_that_is_no_record_is_named(tmp_path):
  """Only a last line without its newline is a write cut short: a whole last line (newline
  included) that is no record of a step is named like any other; blank lines are no records
  and no error."""
  path = tmp_path / 'metrics.jsonl'
  lines = [json.dumps({'kind': 'train', 'step': s, 'time': 0.0, 'loss': 1.0}) + '\n'
           for s in (1, 2, 3)]
  path.write_text(lines[0] + '\n' + lines[1] + '  \n' + lines[2], encoding='utf-8')
  assert [r['step'] for r in metric_writer.read_metrics(str(tmp_path))] == [1, 2, 3]
  for bad in ('{"kind": "train", "st\n', '{"kind": "train", "time": 0.0}\n', '[1, 2]\n',
              '{"kind": "train", "step": "3"}\n'):
    path.write_text(''.join(lines) + bad, encoding='utf-8')
    with pytest.raises(errors.Error, match=re.escape(f'{path}:4: not a metrics record (')):
      metric_writer.read_metrics(str(tmp_path))


def test_a_resumed_run_redoes_the_checkpoints_validation_only_when_told(tmp_path):
  """Resumed from step 2: the records after it go, and with `redo_validation` (the checkpoint
  was saved without its validation, which the resumed run does again) step 2's validation
  too, never its training record."""
  path = tmp_path / 'metrics.jsonl'
  logged = [(s, kind) for s in (1, 2, 3) for kind in ('train', 'valid')]
  whole = ''.join(json.dumps({'kind': kind, 'step': s, 'time': 0.0, 'loss': 1.0}) + '\n'
                  for s, kind in logged)
  for redo, kept in ((False, logged[:4]), (True, logged[:3])):
    path.write_text(whole, encoding='utf-8')
    metric_writer.MetricWriter(str(tmp_path), enabled=True, resumed_at=2,
                               redo_validation=redo).close()
    assert [(r['step'], r['kind']) for r in metric_writer.read_metrics(str(tmp_path))] == kept


def tensorboard_events(folder) -> list:
  """The events of the TensorBoard files in `folder`: TFRecords of `Event` protos (the
  record's length, its CRC, the record, its CRC)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  events = []
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), 'rb') as f:
      data = f.read()
    at = 0
    while at < len(data):
      length = int.from_bytes(data[at:at + 8], 'little')
      events.append(event_pb2.Event.FromString(data[at + 12:at + 12 + length]))
      at += 16 + length
  return events


def test_tensorboard_hides_what_a_stopped_run_logged_after_its_checkpoint(tmp_path):
  """Resumed from the checkpoint of step 2, the run tells TensorBoard to purge the events of
  step 3 on, which it logs again (those of step 2 stay, as in the JSONL); each scalar is
  tagged with its kind."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  (tmp_path / 'metrics.jsonl').write_text(''.join(
      json.dumps({'kind': 'train', 'step': s, 'time': 0.0, 'loss': 1.0}) + '\n'
      for s in (1, 2, 3)), encoding='utf-8')
  writer = metric_writer.MetricWriter(str(tmp_path), enabled=True, resumed_at=2)
  writer.write(3, 'valid', {'loss': 0.5})
  writer.close()
  events = tensorboard_events(tmp_path / 'tensorboard')
  [start] = [e for e in events if e.HasField('session_log')]
  assert (start.session_log.status, start.step) == (event_pb2.SessionLog.START, 3)
  assert [(e.step, v.tag, v.simple_value) for e in events for v in e.summary.value] == [
      (3, 'valid/loss', 0.5)]


def test_a_stopped_runs_steps_after_its_last_log_line_are_logged_by_the_resumed_run():
  """The metrics of the steps after the last log line go with the checkpoint
  (`_TrainMonitor.window`, in its meta as JSON); the resumed run's next log line covers them
  with its own, the figures of an uninterrupted run's line."""
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top

  class Writer:
    def __init__(self):
      self.records = []

    def write(self, step, kind, scalars):
      self.records.append((step, kind, scalars))

  def monitor(writer, window=()):
    return train._TrainMonitor(  # pylint: disable=protected-access
        writer=writer, log=lambda *a, **k: None, schedule=lambda step: 0.1 * step,
        steps_per_epoch=10, total_steps=20, last_good_checkpoint=lambda: '', window=window)

  rng = np.random.default_rng(0)
  sums = [{'loss': np.float32(rng.uniform(1, 9)), 'nll': np.float32(rng.uniform(1, 9)),
           'tokens': np.float32(rng.integers(5, 50)), 'pairs': np.float32(3),
           'grad_norm': np.float32(rng.uniform())} for _ in range(4)]
  straight = Writer()
  whole = monitor(straight)
  for step, m in enumerate(sums):
    whole.add(step, m, 2, 0.0)
  whole.write(4)
  stopped = monitor(Writer())
  for step, m in enumerate(sums[:3]):
    stopped.add(step, m, 2, 0.0)
  saved = json.loads(json.dumps(stopped.window()))  # as a checkpoint's meta keeps it
  resumed_writer = Writer()
  resumed = monitor(resumed_writer, window=saved)
  resumed.add(3, sums[3], 2, 0.0)
  resumed.write(4)
  [(step, kind, figures)] = resumed_writer.records
  [(_, _, expected)] = straight.records
  assert (step, kind) == (4, 'train')
  for key in ('epoch', 'loss', 'nll', 'learning_rate', 'grad_norm'):
    assert figures[key] == expected[key], key
  # The pace is the resumed run's own: one step (and its pairs) in its time, not four.
  assert figures['pairs_per_s'] / figures['steps_per_s'] == pytest.approx(3)
  assert figures['tokens_per_s'] / figures['steps_per_s'] == pytest.approx(float(sums[3]['tokens']))


def test_the_transformer_schedule_warms_up_linearly_then_decays_as_one_over_sqrt_step():
  """lr(s) = factor * d^-0.5 * min(s^-0.5, s * warmup^-1.5), s = step + 1 (Vaswani et al.,
  Sec. 5.3): linear to its peak at s = warmup, then 1/sqrt(s); 'constant' is the rate."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  settings = ml_collections.ConfigDict({'schedule': 'transformer', 'learning_rate': 2.0,
                                        'warmup_steps': 4})
  schedule = train.learning_rate_schedule(settings, d_model=16)  # factor * d^-0.5 = 0.5
  rates = [float(schedule(step)) for step in (0, 1, 3, 15, 63)]
  np.testing.assert_allclose(rates, [0.5 / 8, 0.5 * 2 / 8, 0.5 / 2, 0.5 / 4, 0.5 / 8],
                             rtol=1e-6)
  settings.schedule = 'constant'
  assert [float(train.learning_rate_schedule(settings, None)(step)) for step in (0, 99)] == [
      2.0, 2.0]


def test_gradients_are_clipped_to_their_global_norm_before_adam():
  """`grad_clip_norm` rescales the gradients (all leaves together) to at most that norm, and
  Adam (b1, b2, eps as configured) reads the clipped ones: two steps written out in numpy,
  with a first gradient of norm 50 clipped to 5 and a second of norm 1 left alone."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  settings = ml_collections.ConfigDict({
      'schedule': 'constant', 'learning_rate': 0.1, 'adam_b1': 0.8, 'adam_b2': 0.9,
      'adam_eps': 1e-3, 'grad_clip_norm': 5.0})
  grads = [{'a': np.array([30.0], np.float32), 'b': np.array([40.0], np.float32)},
           {'a': np.array([0.6], np.float32), 'b': np.array([-0.8], np.float32)}]

  def by_hand(clip):
    m = v = np.zeros(2)
    updates = []
    for t, g in enumerate(grads, start=1):
      g = np.concatenate([g['a'], g['b']]).astype(np.float64)
      if clip:
        g = g * min(1.0, clip / np.linalg.norm(g))
      m, v = 0.8 * m + 0.2 * g, 0.9 * v + 0.1 * g * g
      updates.append(-0.1 * (m / (1 - 0.8**t)) / (np.sqrt(v / (1 - 0.9**t)) + 1e-3))
    return updates

  for clip in (5.0, 0.0):  # 0: no clipping
    settings.grad_clip_norm = clip
    optimizer = train.make_optimizer(settings, None)
    params = {'a': np.zeros(1, np.float32), 'b': np.zeros(1, np.float32)}
    state = optimizer.init(params)
    for g, want in zip(grads, by_hand(clip)):
      updates, state = optimizer.update(g, state, params)
      np.testing.assert_allclose(np.concatenate([updates['a'], updates['b']]), want,
                                 rtol=1e-5)


def test_a_log_line_shows_the_learning_rate_of_the_last_step_it_covers():
  """A line written at step s covers the steps up to s - 1: its rate is schedule(s - 1), the
  rate the last of them trained with."""
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  written = []
  writer = type('Writer', (), {'write': lambda self, *record: written.append(record)})()
  monitor = train._TrainMonitor(  # pylint: disable=protected-access
      writer=writer, log=lambda *a, **k: None, schedule=lambda step: 0.1 * (step + 1),
      steps_per_epoch=10, total_steps=20, last_good_checkpoint=lambda: '')
  for step in range(4):
    monitor.add(step, {'loss': np.float32(1), 'nll': np.float32(1), 'tokens': np.float32(1),
                       'pairs': np.float32(1), 'grad_norm': np.float32(1)}, 1, 0.0)
  monitor.write(4)
  [(step, kind, figures)] = written
  assert (step, kind) == (4, 'train') and figures['learning_rate'] == pytest.approx(0.4)


@pytest.mark.parametrize('loss, grad_norm', [(np.nan, 1.0), (2.0, np.nan), (2.0, np.inf)])
def test_a_step_with_a_non_finite_loss_or_gradient_stops_before_anything_is_saved(loss,
                                                                                  grad_norm):
  """A finite loss with a NaN gradient makes NaN parameters: the check before every save
  (`_TrainMonitor.window`) refuses either, naming the step and the last good checkpoint."""
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  fine = {'loss': np.float32(1), 'grad_norm': np.float32(1)}
  bad = {'loss': np.float32(loss), 'grad_norm': np.float32(grad_norm)}
  # The bad step last, then (every step since the last log line is checked, not the last one
  # alone) first.
  for steps, bad_step in (((fine, bad), 7), ((bad, fine), 6)):
    monitor = train._TrainMonitor(  # pylint: disable=protected-access
        writer=None, log=lambda *a, **k: None, schedule=lambda step: 0.1,
        steps_per_epoch=10, total_steps=20, last_good_checkpoint=lambda: 'Last good: step 6.')
    for step, sums in zip((6, 7), steps):
      monitor.add(step, sums, 1, 0.0)
    with pytest.raises(train.NonFiniteLoss, match=rf'at step {bad_step}; stopped without '
                       r'saving\. Last good: step 6\.$'):
      monitor.window()


def test_a_non_finite_validation_loss_is_never_the_best():
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  meta = {'valid': [], 'best_step': None, 'best_valid_loss': None}
  record = train._record_validation  # pylint: disable=protected-access
  best_so_far = train._best_so_far  # pylint: disable=protected-access
  assert not record(meta, 100, {'loss': math.inf}) and not record(meta, 100, {'loss': math.nan})
  assert meta['best_step'] is None and meta['best_valid_loss'] is None
  # The log lines that name the best say there is none (formatting None failed the run).
  assert best_so_far(meta) == 'no finite validation loss yet'
  assert record(meta, 200, {'loss': 3.0}) and not record(meta, 300, {'loss': math.inf})
  assert record(meta, 400, {'loss': 2.5}) and not record(meta, 500, {'loss': 2.9})
  assert not record(meta, 600, {'loss': 2.5})  # a tie keeps the earlier checkpoint
  assert (meta['best_step'], meta['best_valid_loss']) == (400, 2.5)
  assert best_so_far(meta) == 'best validation loss 2.5000 at step 400'
  assert [v['step'] for v in meta['valid']] == [100, 100, 200, 300, 400, 500, 600]


def test_a_second_run_training_in_a_workdir_is_refused_naming_the_first(tmp_path):
  """Two runs training in one workdir would each write its checkpoints and every record of
  metrics.jsonl: the second is refused (the lock is the system's, so a killed run holds
  nothing; a file descriptor of its own conflicts as another process's would)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  with train.training_alone(str(tmp_path)):
    with train.training_alone(str(tmp_path)):  # this process holds it: taken again
      pass
    # Another process's lock (here a second open file, which conflicts alike).
    with open(tmp_path / files.WORKDIR_LOCK, encoding='utf-8') as other:
      with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
  with open(tmp_path / files.WORKDIR_LOCK, 'r+', encoding='utf-8') as other:
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    other.truncate()
    other.write('4242 training')
    other.flush()
    with pytest.raises(train.WorkdirBusy, match=re.escape(
        f'{tmp_path}: another run is training in it (process 4242); wait for it to end, or '
        'use another workdir')):
      with train.training_alone(str(tmp_path)):
        pass
  with train.training_alone(str(tmp_path)):  # released: the next run trains
    pass


def test_a_resumed_runs_changed_learning_settings_are_named():
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  saved = {'train': {'learning_rate': 0.3, 'max_steps': 20, 'gone': 1},
           'model': {'dropout': 0.1}, 'decode': {'beam_size': 5},
           'input': {'prefetch_batches': 2}}
  current = {'train': {'learning_rate': 0.9, 'max_steps': 20, 'new': 2},
             'model': {'dropout': 0.5}, 'decode': {'beam_size': 10},
             'input': {'prefetch_batches': 4}}
  # Decoding settings are no training setting; a key one run lacks is no change.
  assert train.changed_settings(saved, current) == [
      'config.train.learning_rate=0.9 (was 0.3)', 'config.model.dropout=0.5 (was 0.1)',
      'config.input.prefetch_batches=4 (was 2)']
  assert train.changed_settings(saved, saved) == []


def test_a_checkpoint_of_another_vocabulary_is_refused_naming_both():
  """Ids mean words only under the vocabulary they were trained with: a checkpoint of the same
  model and size but another word list would train and suggest silently wrong words."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax import models  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import SPECIAL_TOKENS  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  vocab = Vocab(SPECIAL_TOKENS + ('cheap', 'flights'))
  other = Vocab(SPECIAL_TOKENS + ('cheap', 'hotels'))
  cfg = models.make_config(default.get_config('mtn').model, vocab_size=len(vocab),
                           max_query_words=5)
  meta = {'vocab_fingerprint': vocab.fingerprint, 'vocab_size': len(vocab),
          'model': checkpoints.architecture(cfg)}
  checkpoints.check_compatible(meta, cfg, vocab, 'the checkpoint')  # its own: accepted
  with pytest.raises(checkpoints.CheckpointMismatch) as refused:
    checkpoints.check_compatible(meta, cfg, other, 'the checkpoint')
  assert str(refused.value) == (
      f'the checkpoint was trained with another vocabulary (fingerprint {vocab.fingerprint}, '
      f'7 words; this data has {other.fingerprint}, 7 words): use the workdir it was trained '
      'in, or a new workdir')


def test_a_checkpoint_whose_vocabulary_is_not_the_one_its_meta_names_is_not_loaded(tmp_path):
  """A checkpoint's vocabulary item and its meta's fingerprint disagree (one of them replaced):
  loading it to decode is refused, as its ids would be read as other words."""
  from configs import demo  # pylint: disable=g-import-not-at-top
  from mtn_jax import inference  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import SPECIAL_TOKENS  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  vocab, other = Vocab(SPECIAL_TOKENS + ('cheap',)), Vocab(SPECIAL_TOKENS + ('hotels',))
  manager = checkpoints.open_manager(str(tmp_path), keep=1)
  checkpoints.save(manager, 1, params={'w': np.ones(3, np.float32)},
                   train_state={'step': np.zeros((), np.int32)}, data_iter={},
                   meta={'best_step': 1, 'vocab_fingerprint': other.fingerprint}, vocab=vocab)
  manager.close()
  with pytest.raises(checkpoints.CheckpointMismatch,
                     match=r'checkpoints/1: its vocabulary does not match its meta$'):
    inference.load_trained(demo.get_config(), str(tmp_path))


def test_each_training_step_draws_its_own_dropout_key():
  """Step s's dropout key is the run's key folded with s (`TrainState.dropout_rng`): each step
  drops other units, and a resumed run's step s drops the same ones as the run it resumes.
  One key for every step would apply one mask throughout, which is no dropout. A stub task
  whose loss reads only the key it is given (a model would take seconds to trace)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top

  class KeyEcho:
    @staticmethod
    def loss_sums(params, batch, *, train, rngs, groups):
      del batch, train, groups
      keep = jax.random.bernoulli(rngs['dropout'], 0.5, params.shape)
      return {'loss': (params * keep).sum(), 'tokens': jnp.float32(1), 'key': rngs['dropout'],
              'keep': keep}

    @staticmethod
    def training_loss(sums):
      return sums['loss'] / sums['tokens']

  optimizer = optax.sgd(0.0)
  params = jnp.ones(64)
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                           opt_state=optimizer.init(params), dropout_rng=jax.random.PRNGKey(7))
  step = jax.jit(functools.partial(train.train_step, task=KeyEcho(), optimizer=optimizer,
                                   data_groups=1))
  masks = []
  for s in range(3):
    state, sums = step(state, {})
    assert int(state.step) == s + 1
    np.testing.assert_array_equal(sums['key'], jax.random.fold_in(jax.random.PRNGKey(7), s))
    masks.append(tuple(np.asarray(sums['keep'])))
  assert len(set(masks)) == 3  # another mask of the 64 units each step


def test_the_digests_first_version_is_computed_as_it_was_written():
  """Checkpoints saved by the digest's first version (62484e9 to b52f81e) still read: the
  digest it wrote for this tree, by its own code (run at 6ec04c1)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  tree = {'f32': np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
          'i32': np.array([-3, 5, 2**31 - 1], np.int32),
          'bf16': jnp.asarray([1.5, -2.25], jnp.bfloat16), 'i8': np.array([-1, 7], np.int8),
          'b': np.array([True, False, True]), 'key': jax.random.key(3), 'scalar': np.int32(4),
          'i64': np.array([2**40 + 5, -7], np.int64)}
  assert checkpoints._first_values_digest(tree) == (  # pylint: disable=protected-access
      '2fcdf3632d43e30d9b3871a6cd7653c4337df3af103df2166c7ab54641a21e7b')


def test_a_save_the_file_system_refuses_is_one_error_naming_the_folder(tmp_path, monkeypatch):
  """A full disk, whether met by the save or by the background write it started: one error
  naming the checkpoints' folder, the first cause and the last complete checkpoint."""
  from mtn_jax.data.vocab import SPECIAL_TOKENS, Vocab  # pylint: disable=g-import-not-at-top
  manager = checkpoints.open_manager(str(tmp_path))

  def full(*args, **kwargs):
    del args, kwargs
    try:
      raise OSError(28, 'No space left on device')
    except OSError as e:
      raise ValueError('RESOURCE_EXHAUSTED: error writing local file') from e
  monkeypatch.setattr(manager, 'save', full)
  with pytest.raises(checkpoints.SaveFailed, match=re.escape(
      f'{tmp_path}/checkpoints: saving the checkpoint of step 3 failed (OSError: [Errno 28] '
      'No space left on device); no checkpoint is complete')):
    checkpoints.save(manager, 3, params={'w': np.zeros(2)}, train_state={}, data_iter={},
                     meta={}, vocab=Vocab(SPECIAL_TOKENS))
  monkeypatch.setattr(manager, 'wait_until_finished', full)
  with pytest.raises(checkpoints.SaveFailed, match='saving a checkpoint failed .*No space'):
    checkpoints.finish(manager)
  # The write of the checkpoint before it failed in the background: named as that one's.
  with pytest.raises(checkpoints.SaveFailed, match=re.escape(
      'saving the checkpoint before step 4 failed (OSError: [Errno 28] No space left')):
    checkpoints.save(manager, 4, params={'w': np.zeros(2)}, train_state={}, data_iter={},
                     meta={}, vocab=Vocab(SPECIAL_TOKENS))


def test_orbax_threads_failure_logs_are_left_to_the_one_line_error():
  """Orbax's background threads log a traceback per file a failed checkpoint write held (a
  full disk: hundreds of lines); the save that waits for them names the failure in one line,
  so the command line drops those copies (not its other logs) unless --verbosity asks."""
  import logging  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from mtn_jax import cli  # pylint: disable=g-import-not-at-top
  try:
    raise ValueError('RESOURCE_EXHAUSTED')
  except ValueError:
    failure = sys.exc_info()
  record = lambda path, exc_info: logging.LogRecord('absl', logging.ERROR, path, 1, 'x', (),
                                                    exc_info)
  orbax = '/venv/site-packages/orbax/checkpoint/_src/futures/future.py'
  assert not cli.not_orbax_thread_failures(record(orbax, failure))
  assert cli.not_orbax_thread_failures(record(orbax, None))
  assert cli.not_orbax_thread_failures(record('/work/mtn_jax/training/train.py', failure))


# ---------------------------------------------------------------------------------------------
# The main job's stages (`mtn_jax.main_job`), each one stood in for


def stand_in_stages(monkeypatch, stopped_in=None):
  """The main job's stages replaced by a record of the ones run (returned), the training in
  the workdir named `stopped_in` stopped by SIGTERM, and an evaluation that scores no
  suggestions of the model's own (as a Cross-encoder's: no report)."""
  from mtn_jax import main_job  # pylint: disable=g-import-not-at-top
  done = []

  def train_and_evaluate(config, workdir):
    del config
    done.append(os.path.basename(workdir))
    return {'interrupted': done[-1] == stopped_in, 'stopped_by': 'SIGTERM', 'step': 6,
            'total_steps': 6, 'best_step': None}

  def stage(name, returns=None):
    return lambda *args, **kwargs: done.append(name) or returns

  monkeypatch.setattr(main_job.train_loop, 'prepare_corpus', stage('corpus'))
  monkeypatch.setattr(main_job.train_loop, 'train_and_evaluate', train_and_evaluate)
  monkeypatch.setattr(main_job.hypothesis_decoding, 'prepare', stage('hypotheses'))
  monkeypatch.setattr(main_job.prepare, 'after_training', stage('prepare'))
  monkeypatch.setattr(main_job.inference, 'load_trained', stage('load'))
  monkeypatch.setattr(main_job.learned.LearnedRanker, 'is_current', stage('is_current', False))
  monkeypatch.setattr(main_job.learned_training, 'fit', stage('ranker'))
  monkeypatch.setattr(main_job.evaluation, 'evaluate', stage('eval', {'scores': {}, 'step': 6}))
  return done


def test_a_stopped_training_ends_the_main_job_before_any_later_stage(tmp_path, monkeypatch):
  """A signal that stops the generator's training, or a fold generator's (the learned
  ranker's candidates), ends `--mode=all` there, saying so: no later fold, no ranker, no
  compiled service, no evaluation."""
  from mtn_jax import main_job  # pylint: disable=g-import-not-at-top
  config = cli.config('--config.suggest.strategy=learned')
  whole = ['corpus', 'hypotheses', 'run', 'fold0', 'fold1', 'load', 'is_current', 'ranker',
           'prepare', 'eval']
  for stopped_in, run in (('run', 3), ('fold0', 4), (None, len(whole))):
    done = stand_in_stages(monkeypatch, stopped_in)
    results = main_job.run_all(config, str(tmp_path / 'run'))
    assert done == whole[:run], stopped_in
    assert (results == {'stopped_by': 'SIGTERM'}) == (stopped_in is not None)


def test_the_main_jobs_summaries(tmp_path, monkeypatch, capsys):
  """The samples shown are the first SAMPLES_SHOWN, an empty prediction named; the closing
  summary lists the workdir's files but its lock; the results named are the evaluated
  split's; a model that brings its own measures gets no report."""
  from mtn_jax import main_job  # pylint: disable=g-import-not-at-top
  main_job.print_samples([{'context': [f'q{i}', 'x'], 'predicted': f'p{i}' if i else '',
                           'actual': f'a{i}'} for i in range(main_job.SAMPLES_SHOWN + 2)])
  shown = capsys.readouterr().out.splitlines()
  assert shown[1:3] == ['  q0, x', '      -> (empty) | a0']
  assert len(shown) == 1 + 2 * main_job.SAMPLES_SHOWN
  stand_in_stages(monkeypatch)
  workdir = tmp_path / 'run'
  (workdir / 'data').mkdir(parents=True)
  main_job.run_all(cli.config('--config.decode.eval_split=valid'), str(workdir))
  out = capsys.readouterr().out
  assert 'Training done at step 6 of 6.' in out and f'  data/{" " * 12}the corpus' in out
  assert files.WORKDIR_LOCK not in out
  assert f'Results:     {workdir / "eval" / "valid_results.json"}' in out
  # A model with measures of its own (IMDNA's) ends the job at its evaluation: no report.
  imdna = cli.config()
  imdna.model.name = 'imdna'
  stand_in_stages(monkeypatch)
  assert main_job.run_all(imdna, str(tmp_path / 'imdna')) == {'scores': {}, 'step': 6}
  assert 'Results:' not in capsys.readouterr().out


def test_the_time_left_is_rounded_up():
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  assert [train._duration(s) for s in (0, 0.2, 59.5, 3661)] == [  # pylint: disable=protected-access
      '0:00:00', '0:00:01', '0:01:00', '1:01:01']


def test_a_checkpoint_is_due_every_n_steps_counted_from_the_first():
  """`config.train.checkpoint_every_steps=3`: after steps 3, 6, 9, ... (the step count once
  the step has run), not one step early or late."""
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  due = train._checkpoint_due  # pylint: disable=protected-access
  assert [step for step in range(1, 11) if due(step, 3)] == [3, 6, 9]
  assert [step for step in range(1, 4) if due(step, 1)] == [1, 2, 3]


def test_the_first_stop_signal_names_the_stop_a_second_ctrl_c_aborts_and_handlers_return():
  """SIGINT then SIGTERM stops as SIGINT (its exit code, 130); a SIGINT while a stop is being
  honoured raises KeyboardInterrupt at once; leaving the block puts back the handlers it
  found, so that after training (a fold generator's, before the main model's) Ctrl-C and
  SIGTERM are handled as before it."""
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  handle = lambda stop, signum: stop._handle(signum, None)  # pylint: disable=protected-access
  stop = train._StopRequests()  # pylint: disable=protected-access
  assert not stop.requested and stop.signal_name is None
  handle(stop, signal.SIGTERM)
  assert stop.requested and stop.signal_name == 'SIGTERM'
  handle(stop, signal.SIGTERM)  # a scheduler's second SIGTERM: still the one stop
  assert stop.signal_name == 'SIGTERM'
  with pytest.raises(KeyboardInterrupt):
    handle(stop, signal.SIGINT)
  stop = train._StopRequests()  # pylint: disable=protected-access
  handle(stop, signal.SIGINT)
  handle(stop, signal.SIGTERM)
  assert stop.signal_name == 'SIGINT'
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  with train._StopRequests() as stop:  # pylint: disable=protected-access
    installed = {s: signal.getsignal(s) for s in before}
    if threading.current_thread() is threading.main_thread():  # else none are installed
      assert installed == dict.fromkeys(before, stop._handle)  # pylint: disable=protected-access
  assert {s: signal.getsignal(s) for s in before} == before


def test_resuming_is_refused_for_another_fold_or_device_count_not_for_a_setting_it_predates():
  """A fold generator resumed, or called complete, with another held-out fold would have seen
  the users it is to score; another seed or batch size would continue other batches. A
  checkpoint saved before a key (or the device count) was recorded is not refused for it."""
  import jax  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  check = train._check_data_order  # pylint: disable=protected-access
  order = ('seed', 'input.train_queries_per_batch')
  config = ml_collections.ConfigDict({'seed': 0, 'input': {'train_queries_per_batch': 240},
                                      'train': {'user_folds': 2, 'held_out_fold': 1}})
  saved = json.loads(config.to_json())
  check(saved, config, 'step 5', order)
  check({'seed': 0}, config, 'step 5', order)  # older: the others not recorded
  for key, value in (('held_out_fold', 0), ('user_folds', 3)):
    other = json.loads(config.to_json())
    other['train'][key] = value
    with pytest.raises(checkpoints.CheckpointMismatch, match=re.escape(
        f'step 5 was trained with config.train.{key}={value!r}, not '
        f'{config.train[key]!r}: it was trained without other users; use {value!r}, or a new '
        'workdir')):
      check(other, config, 'step 5', order)
  with pytest.raises(checkpoints.CheckpointMismatch, match=re.escape(
      'config.seed=1, not 0: a resumed run continues its batches in their order')):
    check({**saved, 'seed': 1}, config, 'step 5', order)
  check_devices = train._check_device_count  # pylint: disable=protected-access
  check_devices(jax.device_count(), 'step 5')
  check_devices(None, 'step 5')  # saved before the count was recorded
  with pytest.raises(checkpoints.CheckpointMismatch, match='trained on 9 device'):
    check_devices(9, 'step 5')


def test_validation_sums_every_batch_and_a_stop_request_abandons_it():
  """The validation figures are the task's summary of the eval step's sums over all batches
  (not the last batch's); a stop request asked before each batch abandons the pass."""
  import jax  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top

  class Summing:
    input_keys = ('x',)

    @staticmethod
    def summarize(totals):
      return {'loss': float(totals['x']) / float(totals['rows']), 'rows': float(totals['rows'])}

  rows = 2 * jax.device_count()
  batches = [{'x': np.full(rows, value, np.float32), 'other': np.zeros(rows)}
             for value in (1.0, 2.0, 6.0)]
  eval_fn = lambda params, batch: {'x': batch['x'].sum() * params,
                                   'rows': jax.numpy.float32(batch['x'].shape[0])}
  valid = train.evaluate_loss(1.0, batches, task=Summing(), mesh=parallel.make_mesh(),
                              eval_fn=eval_fn)
  assert valid == {'loss': 3.0, 'rows': 3.0 * rows}
  asked = []
  assert train.evaluate_loss(1.0, batches, task=Summing(), mesh=parallel.make_mesh(),
                             eval_fn=eval_fn,
                             should_stop=lambda: asked.append(1) or len(asked) > 2) is None
  assert len(asked) == 3


def test_a_log_lines_figures_and_pace_leave_out_compiling_and_saving(monkeypatch):
  """A log line's figures over the steps since the last one: the loss and cross-entropy per
  token, the mean gradient norm, the epoch of its step, and the pace (sessions, pairs,
  tokens and steps per second, and the time left at that pace) over the window's time less
  the seconds spent compiling and saving; `restart_pace` starts the next window afresh."""
  import types  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  now = [100.0]
  monkeypatch.setattr(train, 'time', types.SimpleNamespace(time=lambda: now[0]))
  written, logged = [], []
  writer = type('Writer', (), {'write': lambda self, *record: written.append(record)})()
  monitor = train._TrainMonitor(  # pylint: disable=protected-access
      writer=writer, log=lambda line, **_: logged.append(line), schedule=lambda step: 0.5,
      steps_per_epoch=8, total_steps=20, last_good_checkpoint=lambda: '')
  for step, (loss, nll, tokens, grad_norm) in enumerate(
      ((6.0, 5.0, 3.0, 1.0), (2.0, 1.0, 1.0, 3.0), (4.0, 4.0, 4.0, 2.0), (8.0, 8.0, 8.0, 6.0))):
    monitor.add(step, {'loss': np.float32(loss), 'nll': np.float32(nll),
                       'tokens': np.float32(tokens), 'pairs': np.float32(2),
                       'grad_norm': np.float32(grad_norm)}, 3, 1.5 if step == 0 else 0.0)
  monitor.pause(0.5)
  now[0] = 110.0  # 10 s: 1.5 compiling, 0.5 saving, 8 training
  monitor.write(4)
  [(step, kind, figures)] = written
  assert (step, kind) == (4, 'train')
  assert figures == {'epoch': 0.5, 'loss': 20 / 16, 'nll': 18 / 16, 'learning_rate': 0.5,
                     'grad_norm': 3.0, 'sessions_per_s': 12 / 8, 'pairs_per_s': 8 / 8,
                     'tokens_per_s': 16 / 8, 'steps_per_s': 4 / 8, 'eta_s': 2.0 * 16,
                     'compile_s': 1.5}
  assert logged == ['step 4/20 epoch 0.50 loss 1.2500 (cross-entropy 1.1250) lr 5.00e-01 '
                    '2 sessions/s 2 tokens/s, 0:00:32 left']
  now[0] = 150.0  # a validation and its checkpoint: no training time
  monitor.restart_pace()
  monitor.add(4, {'loss': np.float32(1), 'nll': np.float32(1), 'tokens': np.float32(1),
                  'pairs': np.float32(1), 'grad_norm': np.float32(1)}, 1, 0.0)
  now[0] = 152.0
  monitor.write(5)
  assert written[-1][2]['steps_per_s'] == 0.5 and written[-1][2]['eta_s'] == 2.0 * 15


def test_an_unreadable_newest_record_keeps_every_checkpoint_until_a_save_can_read_one(tmp_path):
  """What is kept is decided from the newest complete checkpoint's meta (`best_step`): where
  that file cannot be read, nothing is deleted (the best may be any of them) until a later
  save decides on a readable record."""
  import types  # pylint: disable=g-import-not-at-top
  folder = tmp_path / 'checkpoints'
  for step, meta in ((1, {'best_step': 1}), (2, {'best_step': 1}), (3, {'best_step': 1})):
    (folder / str(step) / 'meta').mkdir(parents=True)
    (folder / str(step) / 'meta' / 'metadata').write_text(json.dumps(meta))
  policy = checkpoints._LatestAndBest(str(folder), keep=1)  # pylint: disable=protected-access
  infos = [types.SimpleNamespace(step=step) for step in (1, 2, 3)]
  assert policy.should_preserve(infos, context=None) == [True, False, True]
  (folder / '3' / 'meta' / 'metadata').write_text('{"best_step": 1')  # cut short
  assert policy.should_preserve(infos, context=None) == [True, True, True]


def test_the_best_step_without_a_named_best_is_the_newest_complete_checkpoint(tmp_path):
  """`named_best_step` (what eval, decode and the report read): the step the newest complete
  checkpoint names; where it names none (no finite validation loss yet), that newest one;
  orbax's temporary folder of a checkpoint being written is none."""
  folder = tmp_path / 'checkpoints'
  assert checkpoints.named_best_step(str(tmp_path)) is None
  for step, best in ((3, 3), (5, None)):
    (folder / str(step) / 'meta').mkdir(parents=True)
    (folder / str(step) / 'meta' / 'metadata').write_text(json.dumps({'best_step': best}))
  (folder / '7.orbax-checkpoint-tmp-1234').mkdir()
  assert checkpoints.named_best_step(str(tmp_path)) == 5
  (folder / '5' / 'meta' / 'metadata').write_text(json.dumps({'best_step': 3}))
  assert checkpoints.named_best_step(str(tmp_path)) == 3


def test_a_checkpoint_is_compared_on_what_fixes_its_parameters_at_their_defaults():
  """Runtime fields (dropout, dtype, layer layout) may change on resume; a field a checkpoint
  predates counts at its default; the layer layout is read from the whole config where it
  is recorded."""
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax import models  # pylint: disable=g-import-not-at-top
  cfg = models.make_config(default.get_config('mtn').model, vocab_size=7, max_query_words=5)
  saved = checkpoints.architecture(cfg)
  assert 'dropout' not in saved and 'scan_layers' not in saved
  checkpoints.check_model(saved, cfg.replace(dropout=cfg.dropout + 0.25,
                                             scan_layers=not cfg.scan_layers), 'step 5')
  older = {k: v for k, v in saved.items() if k not in ('copy', 'user_memory')}
  assert checkpoints.architecture_differences(older, cfg) == {}
  checkpoints.check_model(older, cfg, 'step 5')
  assert checkpoints.architecture_differences(older, cfg.replace(copy=True)) == {
      'copy': (False, True)}
  with pytest.raises(checkpoints.CheckpointMismatch, match=re.escape(
      'step 5 holds another model (model.copy: checkpoint False vs config True)')):
    checkpoints.check_model(older, cfg.replace(copy=True), 'step 5')
  layout = not cfg.scan_layers
  assert checkpoints.saved_scan_layers(
      {'model': saved, 'model_config': {'scan_layers': layout}}) is layout
  assert checkpoints.saved_scan_layers({'model': {**saved, 'scan_layers': layout}}) is layout


def test_training_without_validation_sessions_is_refused(tmp_path):
  """config.data.split_fractions[1]=0 leaves the valid split empty, which preprocessing
  allows (no such split was asked for); training refuses, since it picks its best
  checkpoint by the validation loss."""
  from configs import demo  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  config = demo.get_config()
  config.data.demo_users, config.data.split_fractions = 60, (0.9, 0.0, 0.1)
  with pytest.raises(errors.Error, match=re.escape(
      'the valid split is empty: model selection needs validation sessions')):
    train.training_data(config, str(tmp_path))


def test_a_checkpoint_of_the_other_layer_layout_resumes_converted_to_this_runs(tmp_path):
  """`scan_layers` is a runtime field: a run resumed with the other layout restores the
  checkpoint in its saved layout, then trains its parameters and optimizer state converted
  to its own, with the data iterator's position as saved."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from configs import default  # pylint: disable=g-import-not-at-top
  from mtn_jax import tasks  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import SPECIAL_TOKENS, Vocab  # pylint: disable=g-import-not-at-top
  from mtn_jax.models import layers  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import train  # pylint: disable=g-import-not-at-top
  from tests.test_models import MTN2, random_like  # pylint: disable=g-import-not-at-top
  assert MTN2.scan_layers
  scanned = tasks.make_task(MTN2, default.get_config().train)
  in_a_loop = tasks.make_task(MTN2.replace(scan_layers=False), default.get_config().train)
  optimizer, mesh = optax.adam(1e-3), parallel.make_mesh()
  params = random_like(train.abstract_state(scanned, optimizer, mesh).params)
  opt_state = jax.tree.map(lambda x: x + 1, optimizer.init(params))  # its moments non-zero
  state = train.TrainState(step=np.int32(3), params=params, opt_state=opt_state,
                           dropout_rng=jax.random.PRNGKey(1))
  manager = checkpoints.open_manager(str(tmp_path))
  checkpoints.save(manager, 3, params=params, train_state=state.optimizer_part(),
                   data_iter={'position': 7}, meta={'best_step': None},
                   vocab=Vocab(SPECIAL_TOKENS))
  manager.wait_until_finished()
  restored, data_iter = train._restore(  # pylint: disable=protected-access
      manager, 3, task=in_a_loop, optimizer=optimizer, mesh=mesh,
      saved_meta={'model': {}, 'model_config': {'scan_layers': True}})
  assert data_iter == {'position': 7} and int(restored.step) == 3
  assert_trees_equal(restored.params, layers.convert_layer_layout(params, scan_layers=False))
  assert_trees_equal(restored.opt_state,
                     layers.convert_layer_layout(opt_state, scan_layers=False))


def test_a_fresh_run_over_an_empty_metrics_file_says_nothing_was_dropped(tmp_path, capsys):
  """A run killed before it logged anything leaves an empty metrics.jsonl: the next run drops
  nothing, and says nothing of it."""
  (tmp_path / 'metrics.jsonl').write_text('', encoding='utf-8')
  metric_writer.MetricWriter(str(tmp_path), enabled=True, resumed_at=0).close()
  assert 'Note' not in capsys.readouterr().out
