"""The training benchmark harness: its AOL-shaped data, its arithmetic, a CI-sized run, and the
PyTorch peer's equivalence with the JAX model (only where torch is installed); and a CI-sized
run of the rankers' latency benchmark (launch/bench_rankers.py); the benchmarks' refusals of a
reader's mistakes, and the decoding benchmark for the other model families."""

import contextlib
import importlib.util
import io
import json
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from launch import bench_train
from launch import profile_step
from tests import cli
from tests.conftest import REPO


def test_synthetic_sessions_have_aol_proportions():
  assert sum(p * (k - 1) for k, p in bench_train.SESSION_LENGTH_MIX.items()) == pytest.approx(
      bench_train.AOL_TRAIN_PAIRS / bench_train.AOL_TRAIN_SESSIONS, abs=2e-3)
  split = bench_train.synthetic_split(np.random.default_rng(0), 40_000, 10, 500)
  assert split.num_sessions == 40_000
  assert set(np.unique(split.lengths)) == {3, 4, 5}
  assert split.num_pairs / split.num_sessions == pytest.approx(2.63, abs=0.02)
  words = (split.queries != 0).sum(-1)
  assert words.min() == 1 and words.max() == 10
  assert words.mean() == pytest.approx(2.95, abs=0.03)
  # Words fill each query from the left, and are ordinary ids (no special token but padding).
  assert ((split.queries != 0) == (np.arange(10) < words[:, None])).all()
  real = split.queries[split.queries != 0]
  assert real.min() >= 5 and real.max() < 500


def test_short_queries_renormalise_the_word_mix():
  queries = bench_train.synthetic_queries(np.random.default_rng(0), (1000, 3), 2, 50)
  words = (queries != 0).sum(-1)
  assert set(np.unique(words)) == {1, 2}
  assert (words == 1).mean() == pytest.approx(0.2037 / (0.2037 + 0.2564), abs=0.03)


def test_unknown_session_length_is_refused():
  with pytest.raises(ValueError, match='--session_lengths'):
    bench_train.length_mix([3, 6])
  assert bench_train.length_mix([3, 5]) == pytest.approx({3: 0.55 / 0.73, 5: 0.18 / 0.73})


def test_epoch_mix_weights_steps_by_share_over_batch_size():
  buckets = {3: {'share': 0.5, 'sessions': 10, 'pairs': 20, 'target_tokens': 60, 't': 1.0},
             4: {'share': 0.5, 'sessions': 5, 'pairs': 15, 'target_tokens': 30, 't': 2.0}}
  # Half the sessions in batches of 10 and half in batches of 5: twice as many 4-query steps.
  assert bench_train.step_shares(buckets) == pytest.approx({3: 1 / 3, 4: 2 / 3})
  mixed = bench_train.epoch_mix(buckets, 't')
  assert mixed['step_s'] == pytest.approx(5 / 3)
  assert mixed['pairs_per_s'] == pytest.approx((20 / 3 + 30 / 3) / (5 / 3))
  assert mixed['sessions_per_s'] == pytest.approx((10 / 3 + 10 / 3) / (5 / 3))
  assert mixed['target_tokens_per_s'] == pytest.approx((60 / 3 + 60 / 3) / (5 / 3))


def test_self_times_exclude_nested_operations():
  events = [{'pid': 1, 'tid': 1, 'ts': 0.0, 'dur': 10.0, 'name': 'while.1'},
            {'pid': 1, 'tid': 1, 'ts': 2.0, 'dur': 3.0, 'name': 'fusion.2'},
            {'pid': 1, 'tid': 1, 'ts': 6.0, 'dur': 1.0, 'name': 'fusion.2'},
            {'pid': 1, 'tid': 2, 'ts': 1.0, 'dur': 4.0, 'name': 'dot.3'}]
  assert profile_step.self_times(events) == {'while.1': 6.0, 'fusion.2': 4.0, 'dot.3': 4.0}
  # Kernels overlapping without nesting: each loses only the time the other shares with it.
  overlapping = [{'pid': 1, 'tid': 1, 'ts': 0.0, 'dur': 10.0, 'name': 'fusion.1'},
                 {'pid': 1, 'tid': 1, 'ts': 8.0, 'dur': 6.0, 'name': 'dot.2'},
                 {'pid': 1, 'tid': 1, 'ts': 12.0, 'dur': 1.0, 'name': 'copy.3'}]
  assert profile_step.self_times(overlapping) == {'fusion.1': 8.0, 'dot.2': 5.0, 'copy.3': 1.0}


def test_op_names_map_to_parts_of_the_model():
  part = profile_step.part_of
  assert part('jit(train_step)/jvp(MTN)/MTN.encode/query_encoder/while/body/x/dot_general') == (
      'query encoder forward')
  assert part('jit(train_step)/transpose(jvp(MTN))/MTN.output_logits/logits/dot_general') == (
      'output layer + loss backward')
  assert part('jit(train_step)/jvp(MTN)/MTN.decode_hidden/decoder/Dropout_0/jit(_bernoulli)'
              ) == 'dropout masks forward'
  assert part('jit(train_step)/jvp(MTN.session_hidden)/MTN.encode/embedding_dropout/'
              'concatenate') == 'dropout masks forward'
  assert part('jit(train_step)/jit(_threefry_fold_in)/train_step/while') == (
      'dropout masks forward')
  assert part('jit(train_step)/jvp()/output_layer_loss/while/body/vmap(jvp())/reduce_sum') == (
      'output layer + loss forward')
  assert part('jit(train_step)/transpose(jvp())/output_layer_loss/mul') == (
      'output layer + loss backward')
  assert part('jit(train_step)/jvp()/cumsum') == 'other forward'
  assert part('jit(train_step)/mul') == 'optimizer update + metrics'
  assert part('') == 'no op_name (XLA copies, buffer init)'


HAVE_TORCH = importlib.util.find_spec('torch') is not None


@pytest.fixture(scope='module')
def smoke_run(tmp_path_factory):
  """One CI-sized run of the harness through its flags, with the PyTorch peer and the
  equivalence check where torch is installed: (report, stdout, JSON file)."""
  json_path = tmp_path_factory.mktemp('bench') / 'bench.json'
  argv = ['bench_train', f'--config={REPO / "configs" / "demo.py"}', *cli.TINY,
          '--config.model.emb_dim=24',  # the emb_dim -> d_model projections take part too
          '--steps=2', '--repeats=1', '--session_lengths=3', '--pipeline_sessions=3000',
          '--pipeline_batches=3', f'--json={json_path}']
  if HAVE_TORCH:
    argv += ['--peer', '--check_equivalence', '--peer_threads=1']
  # config_flags reads its --config.key=value overrides from sys.argv.
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(sys, 'argv', argv)
    flags.FLAGS.unparse_flags()
    try:
      flags.FLAGS(argv)
      stdout = io.StringIO()
      with contextlib.redirect_stdout(stdout):
        report = bench_train.run()
    finally:
      flags.FLAGS.unparse_flags()
      flags.FLAGS.mark_as_parsed()
  return report, stdout.getvalue(), json_path


def test_smoke_run_reports_positive_figures(smoke_run):
  report, out, json_path = smoke_run
  assert json.loads(json_path.read_text()) == json.loads(json.dumps(report))
  train = report['train']
  assert train['model']['vocab_size'] > 5  # the real vocabulary of the tiny demo corpus
  bucket = train['buckets']['3']
  assert bucket['shape'] == [80, 3, 10]  # 240 query slots in sessions of 3 queries
  assert bucket['pairs'] == 160
  for figure in ('step_s', 'cpu_step_s', 'sessions_per_s', 'pairs_per_s',
                 'target_tokens_per_s', 'flops_per_s'):
    assert bucket['jax'][figure] > 0
  # 1,760 target slots, about 36 % real: the loss head's chunks of 256 skip over half.
  assert 0 < bucket['executed_flops'] < 0.9 * bucket['padded_flops']
  mixed = train['epoch_mix']['jax']
  assert mixed['pairs_per_s'] == pytest.approx(160 / bucket['jax_step_s'])
  assert mixed['flops_per_step'] > 0 and mixed['mfu'] is None  # no known peak for a CPU
  assert train['memory']['bytes'] > 0
  assert train['epoch']['minutes'] == pytest.approx(
      bench_train.AOL_TRAIN_PAIRS / mixed['pairs_per_s'] / 60)
  pipeline = train['input_pipeline']
  assert pipeline['batch_median_s'] > 0 and pipeline['batch_over_step'] > 0
  for line in ('date:', 'machine:', 'model: mtn', 'epoch: 4,285,507 pairs', 'input pipeline:'):
    assert line in out
  assert '--session_lengths=3' in report['command']


# requirements.txt leaves torch out, so CI never runs this test: it is for a machine with
# torch installed (BUILD.md's benchmarks).
@pytest.mark.skipif(not HAVE_TORCH, reason='torch is not installed (requirements.txt leaves '
                    'it out): the PyTorch peer\'s equivalence with the JAX model is not '
                    'checked; CI never runs this test')
def test_torch_peer_matches_jax_and_is_timed(smoke_run):
  train = smoke_run[0]['train']
  equivalence = train['equivalence']
  assert equivalence['max_relative_difference'] < 1e-4
  # One Adam step lowers the loss on its own batch, on both sides alike.
  assert equivalence['jax_loss_after_step'] < equivalence['jax_loss_before_step']
  assert equivalence['torch_loss_after_step'] < equivalence['torch_loss_before_step']
  assert train['buckets']['3']['torch_eager']['pairs_per_s'] > 0
  assert train['epoch_mix']['jax_over_torch_eager'] > 0
  assert train['epoch_mix']['jax_over_torch_eager_per_cpu_second'] > 0
  assert train['peer'] == {**train['peer'], 'modes': ['torch_eager'], 'threads': 1}


# ---------------------------------------------------------------------------------------------
# launch/bench_rankers.py (its own process: its absl flags share names with bench_train's)


def test_rankers_benchmark_smoke_run(tmp_path):
  """The Table 5 harness on a tiny model and pools: a Poly-encoder (the Bi-encoder's path,
  and more) and the Cross-encoder timed, the latter's larger pool extrapolated, the table and
  the JSON written."""
  json_path = tmp_path / 'rankers.json'
  command = [sys.executable, str(REPO / 'launch' / 'bench_rankers.py'),
             '--rankers=poly16,cross', '--pools=20,60', '--sizes=32x1', '--vocab_size=50',
             '--repeats=2', '--warmup=1', '--cross_measure=20', '--cross_chunk=10', f'--json={json_path}']
  result = subprocess.run(command, cwd=REPO, env=cli.env(), capture_output=True, text=True,
                          timeout=120, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(json_path.read_text())
  rows = {(r['ranker'], r['pool']): r for r in report['rows']}
  assert set(rows) == {(r, c) for r in ('poly16', 'cross') for c in (20, 60)}
  for (ranker, pool), row in rows.items():
    assert (row['d_model'], row['layers']) == (32, 1)
    assert row['median_ms'] > 0 and row['mean_ms'] > 0
    assert row['extrapolated'] == (ranker == 'cross' and pool == 60)
    if not row['extrapolated']:
      assert len(row['times_ms']) == 2
  assert rows['cross', 60]['median_ms'] == pytest.approx(3 * rows['cross', 20]['median_ms'])
  assert report['machine']['device_count'] == 1 and report['machine']['cpu_model']
  out = result.stdout
  assert '| Poly-encoder 16 | 32 x 1 |' in out and '(extrap.)' in out
  assert '| 122 | 678 |' in out  # the paper's Poly-16 figures beside
  for line in ('date:', 'command: python launch/bench_rankers.py', 'machine:'):
    assert line in out


def launch_script(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, f'launch/{script}', *args], cwd=REPO,
                        capture_output=True, text=True, env=cli.env(), timeout=300, check=False)


@pytest.mark.parametrize('script, args, said', [
    # A list flag's value is checked when the flags are parsed, before any work.
    ('bench_rankers.py', ['--pools=1k'], 'flag --pools=[\'1k\']: expected positive whole'),
    ('bench_serve.py', ['--workdir=.', '--rates=five'], 'flag --rates=[\'five\']: expected '
     'positive numbers'),
    ('bench_decode.py', ['--config=configs/demo.py', '--beams=0'], 'flag --beams=[\'0\']'),
    # A usage error in one line, not below the script's whole help.
    ('bench_rankers.py', ['--rankers=foo'], "error: --rankers: unknown ['foo']"),
    ('bench_train.py', ['--config=configs/seq2seq_aol.py:small'],
     "error: the train step measured is MTN's; configs/seq2seq_aol.py:small is a 'seq2seq'"),
    ('bench_pipeline.py', ['--workdir=.', '--strategies=lerned'],
     "error: --strategies: config.suggest.strategy must be 'generate', 'retrieve', 'rerank', "
     "'blend' or 'learned', got 'lerned'"),
    ('bench_pipeline.py', ['--workdir=no/such/dir'], 'error: --workdir=no/such/dir: no such'),
    ('bench_serve_start.py', ['--workdir=no/such/dir'], 'error: --workdir=no/such/dir: no such'),
    # An override as the command line says it, with the flag that gave it.
    ('bench_serve.py', ['--workdir=.', '--set=suggest.stratgy=blend'],
     "error: --set=suggest.stratgy: config.suggest has no key 'stratgy'. Did you mean "
     '"strategy"'),
])
def test_a_benchmarks_mistakes_are_refused_in_a_line_before_any_work(script, args, said):
  result = launch_script(script, *args)
  assert result.returncode != 0
  assert said in result.stderr
  assert 'Traceback' not in result.stderr and 'USAGE' not in result.stdout + result.stderr
  assert len(result.stdout.splitlines()) == 0


@pytest.mark.skipif(importlib.util.find_spec('torch') is not None, reason='torch is installed')
def test_the_peer_without_torch_is_refused_before_compiling():
  result = launch_script('bench_train.py', '--config=configs/demo.py', '--peer')
  assert result.returncode != 0 and result.stdout == ''
  assert result.stderr.strip().endswith('--peer and --check_equivalence run the PyTorch peer: '
                                        'install torch (pip install torch; BUILD.md)')


@pytest.mark.parametrize('config, label', [('configs/transformer_aol.py:small', 'Transformer ('),
                                           ('configs/seq2seq_aol.py:small', 'Seq2Seq Attn.')])
def test_decode_benchmark_runs_for_other_families(config, label):
  result = launch_script('bench_decode.py', f'--config={config}', '--vocab_size=60',
                         '--beams=1', '--batch_sessions=1', '--repeats=1', '--session_queries=2')
  assert result.returncode == 0, result.stderr[-2000:]
  model = next(l for l in result.stdout.splitlines() if l.startswith('model: '))
  assert model.startswith(f'model: {label}') and 'random initialisation' in model
  assert result.stdout.splitlines()[-1].split()[:3] == ['1', '1', '2']
