"""Shared test set-up: absl flags parsed (grain workers read them), the real AOL sample."""

import os
import pathlib

import pytest
from absl import flags

from tests import cli

REPO = cli.REPO
AOL_SAMPLE = pathlib.Path(os.environ.get(
    'MTN_AOL_SAMPLE', REPO.parent / 'shared' / 'data' / 'aol-sample' / 'aol-500users.tsv.gz'))

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()

# Read when JAX starts its CPU backend, so set before any test runs: every program a test
# compiles gets it (cli.TEST_XLA_FLAGS), no per-test compiler options needed.
os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {cli.TEST_XLA_FLAGS}".strip()
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

# The tests compile the same tiny programs run after run: the persistent compilation cache
# that the command-line runs already share (tests/cli.py) serves the in-process ones too.
jax.config.update('jax_compilation_cache_dir', cli.env()['JAX_COMPILATION_CACHE_DIR'])
jax.config.update('jax_persistent_cache_min_compile_time_secs',
                  float(cli.env()['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS']))


# The test files that take longest (one worker's time, logged per test on a 2-core CPU),
# longest first; the others (a few seconds each) follow. Each file runs on one worker
# (`--dist loadfile`), and a worker takes the next file when it is done with its own: a long
# file left to the end runs alone while the other core idles (test_polyencoder.py did so
# until it was listed here). pytest.ini turns off xdist's own order (by the number of tests
# in a file).
LONGEST_FIRST = (
    'test_polyencoder_cli.py',
    'test_learned_cli.py',
    'test_train.py',
    'test_end_to_end.py',
    'test_polyencoder.py',
    'test_zam.py',
    'test_baselines_cli.py',
    'test_ranker_demos_cli.py',
    'test_serving.py',
    'test_models.py',
    'test_hypotheses.py',
    'test_imdna.py',
    'test_bench_library_choices.py',
    'test_decode.py',
    'test_losses.py',
    'test_recurrent.py',
    'test_kernels.py',
    'test_old_workdirs.py',
    'test_cli_errors.py',
    'test_copy.py',
    'test_bench_smoke.py',
    'test_ann.py',
    'test_sentencepiece.py',
    'test_demo_log.py',
    'test_dropout.py',
)


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


@pytest.fixture
def aol_sample() -> pathlib.Path:
  """The real 500-user AOL slice that lives beside the project; skips when absent."""
  if not AOL_SAMPLE.exists():
    pytest.skip(f'real AOL sample not found at {AOL_SAMPLE}')
  return AOL_SAMPLE
