"""The recurrent baselines (Seq2Seq with attention, HRED, M-NSRF) through the real command
line, from their own config files, on a tiny model and demo log: training lowers the loss, a
re-run resumes from the checkpoint, `--mode=eval` restores it, and `--mode=decode` suggests
the same queries as the evaluation did. (The config files themselves: tests/test_configs.py.)

One trained workdir per model is shared by the module's tests.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess

import pytest

from mtn_jax.training import metric_writer
from tests import cli

pytestmark = pytest.mark.slow

BASELINES = ('seq2seq', 'hred', 'mnsrf')
FIRST_STEPS, TOTAL_STEPS = 4, 8
# Sessions of exactly 3 queries: one bucket, so each step function compiles once. A rate
# above the configs' 0.001 makes the loss fall clearly within a few steps of a tiny model.
# Batches of 10 sessions: an epoch is longer than the input pipeline reads ahead.
RUN = ('--config.data.source=demo', '--config.data.max_session_queries=3',
       '--config.input.train_queries_per_batch=30',
       '--config.train.learning_rate=0.01', '--config.train.log_every_steps=1',
       '--config.decode.max_eval_sessions=8', '--config.decode.beam_size=3',
       '--config.decode.top_k=3')
BLEU_LINE = r'BLEU = \d+\.\d\d, \d+\.\d/\d+\.\d/\d+\.\d/\d+\.\d'

@dataclasses.dataclass(frozen=True)
class BaselineRun:
  model: str
  workdir: pathlib.Path
  first: subprocess.CompletedProcess
  resumed: subprocess.CompletedProcess
  evaluated: subprocess.CompletedProcess


def run_baseline(model: str, workdir: pathlib.Path, *overrides: str,
                 mode: str) -> subprocess.CompletedProcess:
  """One mode of the command line on `configs/{model}_aol.py:small`, made tiny."""
  return cli.run(workdir, *RUN, *overrides, mode=mode, config=f'configs/{model}_aol.py:small')


@pytest.fixture(scope='module', params=BASELINES)
def baseline(request, tmp_path_factory) -> BaselineRun:
  """Trains FIRST_STEPS steps, re-runs the command to TOTAL_STEPS, evaluates."""
  model = request.param
  workdir = tmp_path_factory.mktemp(model)
  return BaselineRun(
      model, workdir,
      first=run_baseline(model, workdir, f'--config.train.max_steps={FIRST_STEPS}', mode='train'),
      resumed=run_baseline(model, workdir, f'--config.train.max_steps={TOTAL_STEPS}',
                           mode='train'),
      evaluated=run_baseline(model, workdir, mode='eval'))


def test_training_lowers_the_loss_and_resumes_where_it_stopped(baseline):
  assert f'Model {baseline.model}:' in baseline.first.stdout
  assert 'Resuming from' not in baseline.first.stdout
  assert (f'Resuming from checkpoint {baseline.workdir / "checkpoints"}/{FIRST_STEPS}'
          in baseline.resumed.stdout)
  # The one setting changed for the resumed run is named.
  assert ('Note: resuming with settings changed since its checkpoint: '
          f'config.train.max_steps={TOTAL_STEPS} (was {FIRST_STEPS}); config.json records this '
          "run's.") in baseline.resumed.stdout
  train = metric_writer.read_metrics(str(baseline.workdir), 'train')
  # The resumed run goes on from the saved step: no step is lost or run twice.
  assert [r['step'] for r in train] == list(range(1, TOTAL_STEPS + 1))
  assert train[-1]['loss'] < train[0]['loss']
  valid = metric_writer.read_metrics(str(baseline.workdir), 'valid')
  # Validation is on the same sessions every time, so the two losses compare exactly.
  assert [r['step'] for r in valid] == [FIRST_STEPS, TOTAL_STEPS]  # both within epoch 1
  assert valid[1]['loss'] < valid[0]['loss']


def test_eval_restores_the_best_checkpoint(baseline):
  results = json.loads((baseline.workdir / 'eval' / 'first8_results.json').read_text())
  valid = metric_writer.read_metrics(str(baseline.workdir), 'valid')
  best = min(valid, key=lambda r: r['loss'])['step']
  assert results['model'] == baseline.model and results['step'] == best
  # The restored parameters are the trained ones in number (the count train printed).
  printed = re.search(r'Model \w+: ([\d,]+) parameters', baseline.first.stdout).group(1)
  assert f'{results["num_params"]:,}' == printed
  stats = json.loads((baseline.workdir / 'data' / 'stats.json').read_text())
  assert results['pairs'] == min(8, stats['test']['sessions']) * 2  # sessions of 3 queries
  for key in ('model', 'repeat_previous', 'most_frequent_next'):
    assert re.fullmatch(BLEU_LINE, results['scores'][key]['line'])
    assert results['scores'][key]['line'] in baseline.evaluated.stdout


def test_decode_gives_the_evaluated_top_k(baseline, tmp_path):
  # Evaluation searches every position of a session in one pass; decoding each prefix from
  # a file must give the same ranked suggestions with the same scores.
  samples = [json.loads(line) for line in
             (baseline.workdir / 'eval' / 'first8_samples.jsonl').read_text().splitlines()]
  assert samples
  sessions_file = tmp_path / 'prefixes.tsv'
  sessions_file.write_text(''.join('\t'.join(s['context']) + '\n' for s in samples),
                           encoding='utf-8')
  output = tmp_path / 'suggestions.jsonl'
  run_baseline(baseline.model, baseline.workdir, f'--config.decode.input={sessions_file}',
               f'--config.decode.output={output}', mode='decode')
  records = [json.loads(line) for line in output.read_text().splitlines()]
  assert [r['context'] for r in records] == [s['context'] for s in samples]
  vocabulary = set(json.loads((baseline.workdir / 'data' / 'vocab.json').read_text())['words'])
  for record, sample in zip(records, samples):
    suggestions = record['suggestions']
    assert len({s['query'] for s in suggestions}) == len(suggestions) == 3
    assert [s['query'] for s in suggestions] == [s['query'] for s in sample['suggestions']]
    assert [s['score'] for s in suggestions] == pytest.approx(
        [s['score'] for s in sample['suggestions']], abs=1e-4)
    # Generated suggestions are vocabulary words; the small configs' MBR also offers the
    # session's own queries as candidates, which may hold any word.
    assert all(set(s['query'].split()) <= vocabulary or s['query'] in record['context']
               for s in suggestions)
