"""User errors end in one line on stderr naming the cause, no traceback, and exit code 2 for
usage (flags, config files, config values) or 1 for data and checkpoints."""

import subprocess
import sys

import pytest

from tests import cli

pytestmark = pytest.mark.slow


def run(*args, cwd=cli.REPO):
  return subprocess.run([sys.executable, '-m', 'mtn_jax.main', *args], cwd=cwd,
                        env=cli.env(), capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize('args, message', [
    (('--config=configs/demo.py', '--config.model.nmu_heads=4'),
     '--config.model.nmu_heads: config.model has no key \'nmu_heads\'. '
     'Did you mean "num_heads" instead of "nmu_heads"?'),
    (('--config=configs/demo.py', '--config.modle.num_heads=4'),
     '--config.modle.num_heads: config has no key \'modle\'. Did you mean "model"'),
    (('--config=configs/demo.py', '--config.data.zzzz=4'),
     "--config.data.zzzz: config.data has no key 'zzzz'. configs/default.py lists every key."),
    (('--config=configs/nope.py',), '--config: there is no file configs/nope.py'),
    (('--config=configs/nope.py:small',), '--config: there is no file configs/nope.py '),
    (('--config=configs/nope.py', '--config.model.num_heads=4'),
     '--config: there is no file configs/nope.py '),
    (('--config=configs/aol.py:small', '--config.data.raw_files=log.tsv',
      '--config.model.num_heads=3'),
     'config.model.num_heads (3) must divide config.model.d_model (128)'),
    (('--config=configs/demo.py:bogus',),
     "--config=configs/demo.py:bogus: configs/demo.py: unknown variant 'bogus' (it has none"),
    (('--config=configs/demo.py', '--config.model.num_heads=5'),
     'config.model.num_heads (5) must divide config.model.d_model (64)'),
    (('--config=configs/aol.py', '--config.data.raw_files='),
     'config.data.raw_files is empty'),
    (('--config=configs/demo.py', '--config.model.num_heads=four'),
     "--config.model.num_heads=four: invalid literal for int() with base 10: 'four'"),
    (('--config=configs/demo.py', '--config.model.copy=maybe'),
     '--config.model.copy=maybe: Non-boolean argument to boolean flag: maybe'),
    (('--config=configs/demo.py', '--mode=bogus'), '--mode=bogus: value should be one of'),
    (('--config=configs/demo.py', '--nosuchflag'), "Unknown command line flag 'nosuchflag'"),
    (('--config=configs/demo.py', 'stray'), 'unexpected arguments: stray'),
    (('--config=configs/demo.py', '--config.suggest.gain_from=a,b'),
     '--config.suggest.gain_from was removed: the expected-gain model chose the previous '
     'query'),
    (('--config=configs/demo.py', '--config.suggest.previous_query_bias=2.0'),
     '--config.suggest.previous_query_bias was removed: the bias chosen on validation'),
], ids=['mistyped_key', 'mistyped_section', 'unknown_key', 'missing_config',
        'missing_config_with_variant', 'missing_config_with_override', 'bad_value_with_variant',
        'unknown_variant', 'bad_value', 'no_log', 'wrong_type', 'wrong_bool', 'unknown_mode',
        'unknown_flag', 'stray_argument', 'retired_gain_from', 'retired_previous_query_bias'])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, message):
  result = run(*args, f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stderr
  assert 'Traceback' not in result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], lines
  assert lines[0].endswith(' (see --help)'), lines
  assert not (tmp_path / 'data').exists()


@pytest.mark.parametrize('config, known', [
    ('default', 'it has none: use --config=configs/default.py'),
    ('demo', 'it has none: use --config=configs/demo.py'),
    ('aol', 'expected "" or "small"'), ('seq2seq_aol', 'expected "" or "small"'),
    ('hred_aol', 'expected "" or "small"'), ('mnsrf_aol', 'expected "" or "small"'),
    ('transformer_aol', 'expected "small", "enc4dec4" or "enc5dec5"')])
def test_every_config_names_its_variants(tmp_path, config, known):
  result = run(f'--config=configs/{config}.py:bogus', f'--workdir={tmp_path}')
  assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr
  assert result.stderr.startswith(f'error: --config=configs/{config}.py:bogus: configs/'
                                  f'{config}.py'), result.stderr
  assert 'bogus' in result.stderr and known in result.stderr, result.stderr


def test_missing_required_flags(tmp_path):
  result = run()
  assert result.returncode == 2 and result.stderr == (
      'error: missing --config=FILE[:variant] and --workdir=DIR (see --help)\n')
  result = run('--config=configs/demo.py')
  assert result.returncode == 2 and result.stderr == 'error: missing --workdir=DIR (see --help)\n'


def test_workdir_that_is_a_file(tmp_path):
  workdir = tmp_path / 'file'
  workdir.write_text('')
  result = run('--config=configs/demo.py', f'--workdir={workdir}', '--mode=preprocess')
  assert result.returncode == 2 and result.stderr == (
      f'error: --workdir={workdir} is a file, not a folder (see --help)\n')


@pytest.mark.parametrize('args, verbose', [
    (('--config=configs/demo.py:bogus',), ('--verbosity=1',)),
    (('--config=configs/demo.py', '--config.model.nmu_heads=4'), ('-v', '2')),
    (('--config=configs/demo.py', '--config.model.num_heads=5'), ('--verbosity', '1')),
], ids=['variant', 'mistyped_key', 'bad_value'])
def test_verbosity_shows_the_traceback(tmp_path, args, verbose):
  result = run(*args, *verbose, f'--workdir={tmp_path}')
  assert result.returncode == 2 and 'Traceback' in result.stderr, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith('error: '), result.stderr
  quiet = run(*args, '--verbosity=0', f'--workdir={tmp_path}')
  assert quiet.returncode == 2 and 'Traceback' not in quiet.stderr, quiet.stderr
  assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr




def test_data_errors_are_one_line_and_exit_1(tmp_path):
  binary = tmp_path / 'random.bin'
  binary.write_bytes(bytes(range(256)) * 80)
  result = run('--config=configs/demo.py', f'--workdir={tmp_path}', '--mode=decode',
               f'--config.decode.input={binary}')
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip() == (f'error: {binary}: not a text file (it holds NUL bytes): '
                                   'expected one session a line (queries separated by tabs) '
                                   'or an AOL-format log')
  verbose = run('--config=configs/demo.py', f'--workdir={tmp_path}', '--mode=decode',
                f'--config.decode.input={binary}', '--verbosity=1')
  assert verbose.returncode == 1 and 'Traceback' in verbose.stderr
  assert verbose.stderr.strip().splitlines()[-1] == result.stderr.strip()
  # A log too small to split fails at preprocessing, with what would fix it.
  log = tmp_path / 'tiny.tsv'
  log.write_text(''.join(f'{u}\tq{i} w\t2006-03-01 10:0{i}:00\n' for u in range(3)
                         for i in range(3)), encoding='utf-8')
  result = run('--config=configs/aol.py', f'--workdir={tmp_path / "w"}', '--mode=preprocess',
               f'--config.data.raw_files={log}')
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines() == [
      'error: the valid split is empty: 3 sessions were kept and '
      'config.data.split_fractions=(0.95, 0.025, 0.025) gives it none of the sessions; use '
      'more data or a larger config.data.split_fractions[1]']
