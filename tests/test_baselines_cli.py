"""The recurrent baselines (Seq2Seq with attention, HRED, M-NSRF) through the real command
line, from their own config files, on a tiny model and demo log: training lowers the loss, a
re-run resumes from the checkpoint, `--mode=eval` restores it, and `--mode=decode` suggests
the same queries as the evaluation did. Also: every shipped config file and variant loads and
passes `config_lib.validate`, and the comparison's small configs share one data config and
budget.

One trained workdir per model is shared by the module's tests.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pathlib
import re
import subprocess

import pytest

from configs import families
from mtn_jax import config_lib
from mtn_jax import tasks
from mtn_jax.tasks import registry
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

# Every variant of every config file that takes one; a file whose get_config() takes a
# variant must be listed here, so a new variant is not left untested by accident.
VARIANTS = {
    'aol': ('', 'small'),
    'transformer_aol': ('', 'small', 'enc5dec5', 'small,enc5dec5'),
    'seq2seq_aol': ('', 'small'),
    'hred_aol': ('', 'small'),
    'mnsrf_aol': ('', 'small'),
    'default': ('mtn', 'transformer', 'biencoder', 'polyencoder', 'crossencoder'),
    'demo': ('', 'transformer'),
    'imdna_movies': ('', 'qa', 'recs', 'test', 'qa+embeddings', 'recs+embeddings'),
    'imdna_aol': ('', 'embeddings'),
    'polyencoder_aol': ('', 'small', 'poly64', 'poly360', 'bi', 'cross', 'demo', 'demo_bi',
                        'demo_cross'),
    'zam_aol': ('', 'zam', 'aem', 'hem', 'qem', 'demo', 'mtn', 'mtn_aem', 'mtn_zam'),
}
# The configs that `experiments/compare.sh` runs against each other.
COMPARED = ('aol:small', 'transformer_aol:small', 'transformer_aol:small,enc5dec5',
            'seq2seq_aol:small', 'hred_aol:small', 'mnsrf_aol:small')


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


# ---------------------------------------------------------------------------------------------
# Config files


def load_config(name: str, variant: str = ''):
  """What `--config=configs/NAME.py[:VARIANT]` loads (ml_collections passes the variant)."""
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(variant) if variant else module.get_config()
  # Validation asks for a log only of configs that read one; any path will do here.
  if config.data.source == 'aol':
    config.data.raw_files = config.data.raw_files or 'log.tsv'
  return config


def config_files() -> list[str]:
  """The config files (configs/families.py holds the families' keys, no config)."""
  return sorted(p.stem for p in (cli.REPO / 'configs').glob('*.py')
                if p.stem not in ('__init__', 'families'))


def flat_keys(config, prefix: str = '') -> set[str]:
  keys = set()
  for key, value in config.items():
    if hasattr(value, 'items'):
      keys |= flat_keys(value, f'{prefix}{key}.')
    else:
      keys.add(prefix + key)
  return keys


@pytest.mark.parametrize('name', config_files())
def test_every_config_and_variant_loads_and_validates(name):
  takes_variant = bool(inspect.signature(
      importlib.import_module(f'configs.{name}').get_config).parameters)
  if takes_variant:
    assert name in VARIANTS, f'configs/{name}.py takes variants: list them in VARIANTS'
  shared = flat_keys(load_config('default'))
  for variant in VARIANTS.get(name, ('',)):
    config = load_config(name, variant)
    config_lib.validate(config)
    # Every config starts from default.py with its model's family (configs/families.py): a
    # key has one name and one meaning everywhere, and config.model holds the keys its model
    # reads, no other family's. IMDNA's task adds config.imdna (and the movie knowledge base
    # config.movies).
    family = {f'model.{k}' for k in families.keys(config.model.name)}
    task = {k for k in flat_keys(config) if k.split('.')[0] in ('imdna', 'movies')}
    assert not task or config.model.name == 'imdna', f'configs/{name}.py:{variant}'
    assert flat_keys(config) == shared | family | task, f'configs/{name}.py:{variant}'
  if takes_variant:
    with pytest.raises(ValueError, match=rf'configs/{name}\.py: unknown variant'):
      load_config(name, 'no-such-variant')


def test_compared_configs_share_data_and_budget():
  configs = {spec: load_config(*spec.split(':')) for spec in COMPARED}
  reference = configs['aol:small']
  for spec, config in configs.items():
    # Same data config and seeds: every workdir builds the same corpus and split.
    assert config.data.to_dict() == reference.data.to_dict(), spec
    assert config.seed == reference.seed, spec
    for key in ('num_epochs', 'max_steps'):
      assert config.train[key] == reference.train[key], (spec, key)
    assert config.input.to_dict() == reference.input.to_dict(), spec
    assert config.decode.to_dict() == reference.decode.to_dict(), spec
  # Every generative model is compared (the rankers are evaluated on their own terms).
  generative = [name for name, task in registry.TASKS.items()
                if task is tasks.GenerationTask]
  assert sorted({c.model.name for c in configs.values()}) == sorted(generative)


@pytest.mark.parametrize('name', [f'{b}_aol' for b in BASELINES])
def test_recurrent_configs_follow_the_paper(name):
  config = load_config(name)
  assert (config.model.lstm_units, config.model.emb_dim, config.model.dropout) == (256, 300, 0.1)
  assert (config.train.schedule, config.train.learning_rate) == ('constant', 0.001)
  assert config.train.label_smoothing == 0
  assert config.train.entropy_weight == (0.1 if name == 'mnsrf_aol' else 0.0)
  small = load_config(name, 'small')
  assert (small.train.schedule, small.train.learning_rate) == ('constant', 0.003)
  assert small.train.entropy_weight == config.train.entropy_weight
