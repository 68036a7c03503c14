"""launch/bench_library_choices.py on tiny settings: it runs, prints where and how it ran, and
its figures and checks hold together. Run as a subprocess: the dropout item swaps the models'
`Dropout` and JAX's default PRNG while it compiles, which no other test should see."""

import json
import subprocess
import sys

import pytest

from tests import cli
from tests.conftest import REPO

SCRIPT = 'launch/bench_library_choices.py'


def run_script(tmp_path, *args: str, devices: int = 2) -> subprocess.CompletedProcess:
  command = [sys.executable, SCRIPT, '--config=configs/demo.py', *cli.TINY, '--steps=1',
             '--repeats=2', '--pipeline_sessions=3000', '--pipeline_batches=3', '--writes=3',
             f'--json={tmp_path / "report.json"}', *args]
  return subprocess.run(command, cwd=REPO, env=cli.env(devices=devices), capture_output=True,
                        text=True, timeout=600, check=False)


def checked_report(result: subprocess.CompletedProcess, tmp_path, devices: int = 2) -> dict:
  assert result.returncode == 0, result.stderr[-5000:]
  report = json.loads((tmp_path / 'report.json').read_text())
  for line in ('date: ', 'machine: ', 'config: configs/demo.py: mtn',
               f'command: python {SCRIPT} --config=configs/demo.py'):
    assert line in result.stdout
  assert '--repeats=2' in report['command'] and '--writes=3' in report['command']
  assert report['machine']['device_count'] == devices
  return report


def test_prefetch_and_metrics(tmp_path):
  report = checked_report(run_script(tmp_path, '--items=prefetch,metrics'), tmp_path)
  assert 'dropout' not in report
  prefetch = report['prefetch']
  assert set(prefetch['producer']) == {'in the loop', 'hand-written thread',
                                       'grain ThreadPrefetch', 'grain device_put'}
  for figures in prefetch['producer'].values():
    assert figures['exact_resume'] is True
    assert figures['batches_per_s'] > 0
  assert prefetch['producer']['hand-written thread']['batch_s']['verdict'] == 'reference'
  steps = prefetch['with_step']
  assert set(steps) == {'on the devices', *prefetch['producer']}
  assert all(s['step_s']['median'] > 0 and s['wait_s'] >= 0 for s in steps.values())
  assert steps['on the devices']['step_s']['ratio'] == 1

  metrics = report['metrics']
  assert metrics['scalars'] == 12
  # One warm-up write, then 3 writes in each of 2 repeats, all read back from the JSONL.
  assert metrics['read_back_by_read_metrics'] == 1 + 3 * 2
  variants = metrics['variants']
  assert any(f.startswith('tensorboard/events.out.tfevents')
             for f in variants['MetricWriter']['files'])
  assert 'metrics.jsonl' in variants['MetricWriter']['files']
  assert 'metrics.jsonl' not in variants['tensorboardX, flushed']['files']
  assert all(v['write_s']['median'] > 0 for v in variants.values())
  assert 'clu.metric_writers' in metrics['unavailable']


def test_unused_bench_train_flags_are_refused(tmp_path):
  result = run_script(tmp_path, '--items=metrics', '--peer')
  assert result.returncode != 0
  assert 'does not use --peer' in result.stderr


@pytest.mark.slow
def test_dropout_variants_are_swapped_in(tmp_path):
  # One device: four train steps to compile, each the smaller for it.
  report = checked_report(
      run_script(tmp_path, '--items=dropout', '--session_lengths=3', devices=1), tmp_path, 1)
  dropout = report['dropout']
  assert set(dropout) == {'hand-written', 'nn.Dropout, unsafe_rbg', 'nn.Dropout, threefry',
                          'hand-written, unsafe_rbg'}
  assert report['dropout_shapes'] == {'3': [80, 3, 10]}
  for name, variant in dropout.items():
    assert variant['drop_fraction'] == pytest.approx(0.1, abs=0.01), name
    assert variant['step_s']['median'] > 0 and len(variant['step_s_runs']) == 2
    assert variant['key_shape'] == ([4] if 'unsafe_rbg' in name else [2])
    # The library's masks are in the step exactly where nn.Dropout was swapped in.
    assert (variant['bernoulli_calls'] > 0) == name.startswith('nn.Dropout'), name
  assert dropout['hand-written']['rng_bit_generator'] == 0
  assert dropout['nn.Dropout, unsafe_rbg']['rng_bit_generator'] > 0
  assert dropout['hand-written']['step_s']['verdict'] == 'reference'
  assert dropout['hand-written']['class'] == 'mtn_jax.models.dropout.Dropout'
  assert dropout['nn.Dropout, threefry']['class'] == 'flax.linen.stochastic.Dropout'


def test_a_verdict_needs_every_repeat_and_two_at_least():
  from launch import bench_library_choices  # pylint: disable=g-import-not-at-top
  verdict = lambda runs: bench_library_choices.paired(runs, 'lib')['own']['verdict']
  assert verdict({'lib': [1.0, 1.0], 'own': [0.5, 0.9]}) == 'faster'
  assert verdict({'lib': [1.0, 1.0], 'own': [1.5, 1.1]}) == 'slower'
  assert verdict({'lib': [1.0, 1.0], 'own': [0.5, 1.1]}) == 'no measurable difference'
  assert verdict({'lib': [1.0], 'own': [0.5]}) == 'one repeat: no verdict'
