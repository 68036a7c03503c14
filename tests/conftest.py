"""Shared test set-up: absl flags parsed (grain workers read them), the real AOL sample."""

import os
import pathlib

import pytest
from absl import flags

REPO = pathlib.Path(__file__).resolve().parents[1]
AOL_SAMPLE = pathlib.Path(os.environ.get(
    'MTN_AOL_SAMPLE', REPO.parent / 'shared' / 'data' / 'aol-sample' / 'aol-500users.tsv.gz'))

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()


@pytest.fixture
def aol_sample() -> pathlib.Path:
  """The real 500-user AOL slice that lives beside the project; skips when absent."""
  if not AOL_SAMPLE.exists():
    pytest.skip(f'real AOL sample not found at {AOL_SAMPLE}')
  return AOL_SAMPLE
