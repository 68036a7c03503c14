"""User errors end in one line on stderr naming the cause, no traceback, and exit code 2 for
usage (flags, config files, config values) or 1 for data and checkpoints."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from configs import default
from configs import demo
from mtn_jax import config_lib
from mtn_jax import modes as mtn_modes
from mtn_jax import errors
from mtn_jax import models
from tests import cli


def run(*args, cwd=cli.REPO):
  """A run of the command line (the tests that make one are marked slow)."""
  return subprocess.run([sys.executable, '-m', 'mtn_jax.main', *args], cwd=cwd,
                        env=cli.env(), capture_output=True, text=True, timeout=120)


@pytest.mark.slow
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
     "--config=configs/demo.py:bogus: configs/demo.py: unknown variant 'bogus' (expected \"\" "
     'or "transformer")'),
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
    (('--config=configs/demo.py', '--config.decode.rerank=mbr'),
     "--config.decode.rerank was replaced by config.decode.mbr ('mbr' is now 'beam'"),
    (('--config=configs/demo.py', '--config.serve.user_facing=False'),
     '--config.serve.user_facing was replaced by config.decode.exclude_session_queries'),
    (('--config=configs/demo.py', '--config.model.lstm_units=8'),
     "--config.model.lstm_units: config.model has no key 'lstm_units': only seq2seq, hred, "
     "mnsrf read it"),
    (('--config=configs/demo.py', '--mode=decode'),
     'config.decode.input is empty: pass --config.decode.input=FILE'),
    (('--config=configs/demo.py', '--config.data.raw_files=log.tsv'),
     "config.data.raw_files is read only when config.data.source is 'aol', but it is 'demo'"),
    (('--config=tests/__init__.py',),
     '--config=tests/__init__.py: the file defines no get_config(variant) returning the config'),
    (('--config=configs/demo.py', '--config.train.optimizer=sgd'),
     '--config.train.optimizer was removed: it chose nothing: training uses Adam'),
    (('--config=configs/demo.py', '--mode=decode', '--distributed'),
     '--distributed: --mode=decode runs in one process (training and evaluation run on '
     'several: --mode=all, train, eval)'),
], ids=['mistyped_key', 'mistyped_section', 'unknown_key', 'missing_config',
        'missing_config_with_variant', 'missing_config_with_override', 'bad_value_with_variant',
        'unknown_variant', 'bad_value', 'no_log', 'wrong_type', 'wrong_bool', 'unknown_mode',
        'unknown_flag', 'stray_argument', 'retired_gain_from', 'retired_previous_query_bias',
        'replaced_rerank', 'replaced_user_facing', 'key_of_another_family', 'no_decode_input',
        'log_with_the_demo_source', 'no_get_config', 'retired_optimizer',
        'distributed_decode'])
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, message):
  result = run(*args, f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stderr
  assert 'Traceback' not in result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], lines
  assert lines[0].endswith(' (see --help)'), lines
  assert not (tmp_path / 'data').exists()


@pytest.mark.slow
@pytest.mark.parametrize('config, known', [
    ('default', 'a model: mtn, transformer,'),
    ('demo', 'expected "" or "transformer"'),
    ('aol', 'expected "" or "small"'), ('seq2seq_aol', 'expected "" or "small"'),
    ('hred_aol', 'expected "" or "small"'), ('mnsrf_aol', 'expected "" or "small"'),
    ('transformer_aol', 'expected "small", "enc4dec4" or "enc5dec5"')])
def test_every_config_names_its_variants(tmp_path, config, known):
  result = run(f'--config=configs/{config}.py:bogus', f'--workdir={tmp_path}')
  assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr
  assert result.stderr.startswith(f'error: --config=configs/{config}.py:bogus: configs/'
                                  f'{config}.py'), result.stderr
  assert 'bogus' in result.stderr and known in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize('source, message', [
    ('def get_config(:\n', ': SyntaxError: invalid syntax'),
    ('def get_config(variant=""):\n  return undefined\n',
     ": NameError: name 'undefined' is not defined"),
    ('def get_config(variant=""):\n  return 5\n',
     ': its get_config returned 5, not an ml_collections.ConfigDict'),
    # A key the file sets that no run reads (ml_collections checks the overrides alone).
    ('from configs import demo\ndef get_config(variant=""):\n  c = demo.get_config()\n'
     '  c.decode.beamsize = 10\n  return c\n',
     ': config.decode.beamsize: config.decode has no key \'beamsize\' (did you mean '
     '"beam_size"?): configs/default.py lists every key'),
    ('from configs import demo\ndef get_config(variant=""):\n  c = demo.get_config()\n'
     '  c.decode.rerank = "mbr"\n  return c\n',
     ': config.decode.rerank was replaced by config.decode.mbr'),
    ('from configs import demo\ndef get_config(variant=""):\n  c = demo.get_config()\n'
     '  c.decode.beam_size = "10"\n  return c\n',
     ": config.decode.beam_size is of type int, and the file sets it to '10' (type str)"),
])
def test_a_config_file_it_cannot_use_is_named(tmp_path, source, message):
  config = tmp_path / 'mine.py'
  config.write_text(source, encoding='utf-8')
  result = run(f'--config={config}', f'--workdir={tmp_path / "run"}')
  assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr
  [line] = result.stderr.strip().splitlines()
  assert line.startswith(f'error: --config={config}{message}'), line


@pytest.mark.slow
@pytest.mark.parametrize('flag', ['--help', '-h'])
def test_help_lists_modes_flags_config_keys_and_decode_formats(flag):
  result = run(flag)  # no --config or --workdir needed
  assert result.returncode == 0 and result.stderr == '', result.stderr
  out = result.stdout
  assert out.startswith('Next-query suggestion') and '\nusage: python -m mtn_jax.main ' in out
  modes = ('all', 'preprocess', 'train', 'eval', 'decode', 'suggest', 'serve', 'report')
  assert tuple(mtn_modes.MODES) == modes  # a mode added to --mode is added here, and to --help
  listed = out.split('modes (--mode):\n', 1)[1].split('\n\n', 1)[0]
  assert re.findall(r'^  (\w+) ', listed, re.M) == list(modes), listed
  for flag_name in ('--config', '--workdir', '--mode', '--cpu_devices', '--[no]distributed'):
    assert f'\n  {flag_name}' in out, flag_name
  # Every section of configs/default.py with its keys, and how a key is overridden.
  assert '--config.model.num_heads=8' in out
  for section, key in (('data', 'raw_files'), ('decode', 'input'), ('suggest', 'strategy'),
                       ('report', 'workdirs')):
    assert re.search(rf'^  config\.{section}: (.*\n)*?.*\b{key}\b', out, re.M), (section, key)
  # config.model's keys of every model, then each family's own, with its models.
  assert re.search(r'^  config\.model \(every model\): .*\bemb_dim\b', out, re.M)
  for family, models_, key in (('mtn', 'mtn', 'num_levels'), ('recurrent', 'seq2seq, hred',
                               'lstm_units'), ('imdna', 'imdna', 'state_dim')):
    assert re.search(rf'^    {family} \({models_}.*\): (.*\n)*?.*\b{key}\b', out, re.M), family
  # Both decode input formats.
  assert '--config.decode.input=FILE' in out and 'AnonID' in out and 'gzip' in out
  assert 'queries separated by tabs' in out and 'YYYY-MM-DD HH:MM:SS' in out
  assert '  ' not in out.splitlines()[2].strip()  # no stray spaces in the usage line


@pytest.mark.slow
def test_helpfull_is_the_help_and_every_flag_and_exits_0():
  # absl's own --helpfull exits 1, which this command line's exit codes read as bad data.
  result = run('--helpfull')
  assert result.returncode == 0 and result.stderr == '', result.stderr
  out = result.stdout
  assert out.startswith('Next-query suggestion') and '\nmodes (--mode):\n' in out
  full = out.split("\nEvery flag, absl's own included:\n", 1)[1]
  assert '--config:' in full and '--workdir:' in full and '--verbosity:' in full


@pytest.mark.slow
def test_missing_required_flags(tmp_path):
  result = run()
  assert result.returncode == 2 and result.stderr == (
      'error: missing --config=FILE[:variant] and --workdir=DIR (see --help)\n')
  result = run('--config=configs/demo.py')
  assert result.returncode == 2 and result.stderr == 'error: missing --workdir=DIR (see --help)\n'
  # An empty one is missing too, not the current folder (which preprocessing would fill).
  result = subprocess.run(
      [sys.executable, '-m', 'mtn_jax.main', f'--config={cli.REPO}/configs/demo.py',
       '--workdir=', '--mode=preprocess'], cwd=tmp_path,
      env={**cli.env(), 'PYTHONPATH': str(cli.REPO)}, capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stderr == 'error: missing --workdir=DIR (see --help)\n'
  assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_leading_tilde_is_the_home_folder(tmp_path):
  """`--workdir=~/w` (which a shell leaves as typed) is the home folder's `w`, not a folder
  named `~` in the current one."""
  home, cwd = tmp_path / 'home', tmp_path / 'cwd'
  home.mkdir()
  cwd.mkdir()
  result = subprocess.run(
      [sys.executable, '-m', 'mtn_jax.main', f'--config={cli.REPO}/configs/demo.py',
       '--workdir=~/w', '--mode=preprocess'], cwd=cwd,
      env={**cli.env(), 'PYTHONPATH': str(cli.REPO), 'HOME': str(home)}, capture_output=True,
      text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  assert (home / 'w' / 'data').is_dir() and not list(cwd.iterdir())


def test_config_paths_expand_a_leading_tilde(monkeypatch):
  monkeypatch.setenv('HOME', '/home/someone')
  c = default.get_config('mtn')
  c.data.raw_files = '~/a.tsv, /logs/b.tsv,~/c/*.gz'
  c.decode.input, c.suggest.ranker_workdir = '~/sessions.txt', 'runs/~x'
  c.report.workdirs = '~/w1,~/w2'
  c.serve.history_db, c.serve.compile_cache = '~/h.sqlite', '~/cache'
  config_lib.expand_home(c)
  assert (c.serve.history_db, c.serve.compile_cache) == ('/home/someone/h.sqlite',
                                                         '/home/someone/cache')
  assert c.data.raw_files == '/home/someone/a.tsv,/logs/b.tsv,/home/someone/c/*.gz'
  assert c.decode.input == '/home/someone/sessions.txt'
  assert c.suggest.ranker_workdir == 'runs/~x'  # `~` only at a path's start
  assert c.report.workdirs == '/home/someone/w1,/home/someone/w2'
  # Every key named is a key of the config (a renamed key would fail here, not at a user's).
  for key in config_lib.PATH_KEYS + config_lib.PATH_LIST_KEYS:
    section, name = key.split('.')
    assert isinstance(c[section][name], str), key


@pytest.mark.slow
def test_workdir_that_is_a_file(tmp_path):
  workdir = tmp_path / 'file'
  workdir.write_text('')
  result = run('--config=configs/demo.py', f'--workdir={workdir}', '--mode=preprocess')
  assert result.returncode == 2 and result.stderr == (
      f'error: --workdir={workdir} is a file, not a folder (see --help)\n')


@pytest.mark.slow
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


@pytest.mark.slow
def test_data_errors_are_one_line_and_exit_1(tmp_path):
  binary = tmp_path / 'random.bin'
  binary.write_bytes(bytes(range(256)) * 80)
  result = run('--config=configs/demo.py', f'--workdir={tmp_path}', '--mode=decode',
               f'--config.decode.input={binary}')
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip() == (f'error: {binary}: not a text file (1,920 of its first '
                                   '20,480 bytes are control bytes such as NUL): expected one '
                                   'session a line (queries separated by tabs) or an '
                                   'AOL-format log')
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
  # So does a movie world too small for its recommendation questions.
  result = run('--config=configs/imdna_movies.py:test', f'--workdir={tmp_path / "m"}',
               '--mode=preprocess', '--config.movies.num_movies=12')
  assert result.returncode == 1 and result.stderr.strip().splitlines() == [
      'error: config.movies.num_movies (12) gives no genre the 4 movies a recommendation '
      'question names: ask for more movies']


@pytest.mark.slow
def test_a_log_of_another_time_form_is_one_line_naming_the_form(tmp_path):
  """A log with the header and ISO times is refused naming the reason, its count, the first
  such line and the time's form, where it was called no AOL query log."""
  log = tmp_path / 'iso.tsv'
  log.write_text('AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n'
                 '4945\trosa parks\t2006-03-01T15:58:56\t\t\n'
                 '4945\tselma\t2006-03-01T16:01:02\t\t\n', encoding='utf-8')
  result = run('--config=configs/aol.py', f'--workdir={tmp_path / "w"}', '--mode=preprocess',
               f'--config.data.raw_files={log}')
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  assert result.stderr.strip().splitlines() == [
      f'error: {log}: none of its 3 lines reads as a query (bad_time 2, header 1): QueryTime '
      "is not a valid YYYY-MM-DD HH:MM:SS, first at line 2: "
      "'4945\\trosa parks\\t2006-03-01T15:58:56\\t\\t'"]


# ---------------------------------------------------------------------------------------------
# Config checks: each model family checks its own fields, config_lib the rules across sections


def model_config(name, **model):
  """`name`'s config (the default's, with its family's keys) and `model`'s values, a key of
  another family added as the command line cannot."""
  c = default.get_config(name)
  c.data.raw_files, c.data.history_queries = 'log.tsv', 20
  if 'd_model' not in c.model:
    c.train.schedule = 'constant'  # the Transformer's schedule scales by d_model
  for key, value in model.items():
    c.model[key] = value
  return c


@pytest.mark.parametrize('name, model, message', [
    ('mtn', dict(num_levels=1), 'config.model.num_levels must be >= 2 for MTN, got 1'),
    ('mtn', dict(num_heads=3), 'config.model.num_heads (3) must divide config.model.d_model'),
    ('transformer', dict(remat='some'), "config.model.remat must be 'none', 'full' or 'dots'"),
    ('transformer', dict(user_memory='both'),
     "config.model.user_memory must be 'none', 'attention' or 'zero_attention', got 'both'"),
    ('hred', dict(lstm_units=0), 'config.model.lstm_units must be positive, got 0'),
    ('seq2seq', dict(user_memory='attention'),
     "config.model.user_memory is an option of MTN and the Transformer; 'seq2seq' has none"),
    ('zam', dict(user_model='xem'), "config.model.user_model must be 'qem', 'hem', 'aem' or"),
    ('zam', dict(word_negatives=0), 'config.model.word_negatives must be positive, got 0'),
    ('polyencoder', dict(context_encoder='mtn', num_levels=1),
     'config.model.num_levels must be >= 2 for an MTN context encoder, got 1'),
    ('crossencoder', dict(lexical_negatives=2),
     'config.model.lexical_negatives is for the Bi- and Poly-encoders'),
    # A negative count of hard negatives is refused, not read as none.
    ('biencoder', dict(lexical_negatives=-1),
     'config.model.lexical_negatives must be >= 0, got -1'),
    ('crossencoder', dict(scaled_scores=True),
     'config.model.scaled_scores is for the Bi- and Poly-encoders'),
    ('biencoder', dict(user_memory='attention'), "'biencoder' has none (set it to 'none')"),
    ('imdna', dict(reader='docs'), "config.model.reader must be 'attention' or 'embeddings'"),
    ('imdna', dict(dropout=1.0), 'config.model.dropout must be in [0, 1), got 1.0'),
])
def test_each_model_checks_its_own_fields(name, model, message):
  config = model_config(name, **model)
  with pytest.raises(errors.ConfigError) as raised:
    models.REGISTRY[name].config_class.check(config.model)
  assert message in str(raised.value)
  with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
    config_lib.validate(config)


@pytest.mark.parametrize('name, model, key', [
    ('mtn', dict(lstm_units=0), 'lstm_units'), ('hred', dict(num_heads=3, num_levels=1),
                                                'num_heads'),
    ('zam', dict(context_encoder='deep'), 'context_encoder'),
])
def test_a_field_the_model_does_not_read_is_refused_as_such_not_by_its_rule(name, model, key):
  # Another family's rule would name a value that shapes nothing: the key itself is wrong.
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      f'config.model.{key} is not a key of {name!r}, which does not read it')):
    config_lib.validate(model_config(name, **model))
  # A key of the model's own family that this model does not read is not held to the rule of
  # the models that do (the Cross-encoder's session levels: MTN's >= 2).
  config_lib.validate(model_config('crossencoder', num_levels=1))


@pytest.mark.parametrize('name, model, message', [
    ('zam', dict(user_model='hem'), 'config.data.history_queries is 0'),
    ('mtn', dict(user_memory='attention'), 'config.data.history_queries is 0'),
    ('transformer', dict(copy=True), 'config.train.entropy_weight is not defined'),
])
def test_rules_across_sections_ask_the_model_family(name, model, message):
  config = model_config(name, **model)
  config.train.entropy_weight = 0.1
  config.data.history_queries = 0
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(config)
  config.train.entropy_weight = 0.0
  config.data.history_queries = 20
  config_lib.validate(config)


def test_validation_of_modes_that_read_an_input_or_other_runs():
  config = demo.get_config()
  config_lib.validate(config, 'report')  # no config.report.workdirs: the --workdir's report
  with pytest.raises(config_lib.ConfigError, match='config.decode.input is empty'):
    config_lib.validate(config, 'decode')
  config.decode.input = 'sessions.tsv'
  config_lib.validate(config, 'decode')
  config.data.raw_files = 'log.tsv'
  with pytest.raises(config_lib.ConfigError, match='config.data.raw_files is read only when '
                     "config.data.source is 'aol', but it is 'demo'"):
    config_lib.validate(config, 'preprocess')


def test_a_failure_is_its_one_line_not_what_the_failed_work_leaves_behind():
  # A damaged checkpoint's unfinished reads (orbax's) report themselves while the process
  # exits ("Exception ignored in ..."), hundreds of lines after the one that says what
  # failed: here one object of that kind, left behind by the failed work.
  program = textwrap.dedent("""
      from mtn_jax import cli
      class Reader:
        def __del__(self):
          raise RuntimeError('a read left unfinished')
      left_behind = Reader()
      cli._fail('what failed', 1)
      """)
  result = subprocess.run([sys.executable, '-c', program], cwd=cli.REPO, env=cli.env(),
                          capture_output=True, text=True, timeout=120)
  assert (result.returncode, result.stderr) == (1, 'error: what failed\n')


def test_sigterm_outside_training_stops_in_one_line_with_its_code_and_cleans_up(tmp_path):
  """Outside the training loop (preprocessing, the ranker's fit, decoding) SIGTERM stops as
  Ctrl-C does: one line, the shell's code for it (143), and what was being written left as an
  exception leaves it (an atomic file's temporary removed), not killed where it stands; the
  handler before it is back once the mode has run."""
  program = textwrap.dedent(f"""
      import os, signal, time
      from mtn_jax import cli, files
      before = signal.getsignal(signal.SIGTERM)
      with cli.run_errors():
        pass
      assert signal.getsignal(signal.SIGTERM) is before
      with cli.run_errors():
        with files.atomic_path({str(tmp_path / 'model.txt')!r}):
          os.kill(os.getpid(), signal.SIGTERM)
          time.sleep(30)
      """)
  result = subprocess.run([sys.executable, '-c', program], cwd=cli.REPO, env=cli.env(),
                          capture_output=True, text=True, timeout=120)
  assert (result.returncode, result.stderr) == (143, 'terminated\n')
  assert os.listdir(tmp_path) == []


def test_running_out_of_memory_is_one_line_naming_what_to_lower():
  program = textwrap.dedent("""
      from mtn_jax import cli
      class XlaRuntimeError(RuntimeError):  # what jax raises, told apart by its name
        pass
      with cli.run_errors():
        raise XlaRuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 9 bytes.\\nmore')
      """)
  result = subprocess.run([sys.executable, '-c', program], cwd=cli.REPO, env=cli.env(),
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 1, result.stderr
  assert result.stderr == ('error: out of device memory (RESOURCE_EXHAUSTED: Out of memory '
                           'allocating 9 bytes.): a smaller batch (config.decode.batch_sessions, '
                           'config.input.train_queries_per_batch) or shorter outputs '
                           '(config.decode.max_len) need less\n')


def test_a_runtime_error_that_is_not_about_memory_keeps_its_own_traceback():
  """Only XLA's allocation failure (RESOURCE_EXHAUSTED) is told as running out of memory;
  another error of the runtime passes as it is."""
  from mtn_jax import cli as command_line  # pylint: disable=g-import-not-at-top

  class XlaRuntimeError(RuntimeError):  # what jax raises, told apart by its name
    pass

  with pytest.raises(XlaRuntimeError, match='^INTERNAL: a failed compilation$'):
    with command_line.run_errors():
      raise XlaRuntimeError('INTERNAL: a failed compilation')


def test_help_is_asked_for_only_before_a_double_dash():
  from mtn_jax import cli as command_line  # pylint: disable=g-import-not-at-top
  asks = command_line._asks_for_help  # pylint: disable=protected-access
  assert asks(['main', '--config=c.py', '-h']) == 'short'
  assert asks(['main', '--helpfull']) == 'full'
  assert asks(['main', '--config=c.py', '--', '--help']) is None  # an argument, not a flag


def test_a_message_handed_as_a_repr_or_a_repr_of_one_is_read_back_to_its_text():
  """ml_collections hands a mistyped key's message as the repr of a string, which a KeyError
  quotes once more: either way the line is the message's own text."""
  from mtn_jax import cli as command_line  # pylint: disable=g-import-not-at-top
  message = "'nmu_heads'\nDid you mean \"num_heads\" instead of \"nmu_heads\"?"
  expected = "'nmu_heads' Did you mean \"num_heads\" instead of \"nmu_heads\"?"
  for handed in (message, repr(message)):
    assert command_line._one_line(KeyError(handed)) == expected  # pylint: disable=protected-access


def test_run_errors_works_outside_the_main_thread():
  """Signals have their home in the main thread alone: a mode run in another thread (a
  notebook's, a server's worker) neither sets nor restores a SIGTERM handler."""
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top
  from mtn_jax import cli as command_line  # pylint: disable=g-import-not-at-top
  before, failed = signal.getsignal(signal.SIGTERM), []

  def work():
    try:
      with command_line.run_errors():
        pass
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)

  thread = threading.Thread(target=work)
  thread.start()
  thread.join()
  assert not failed and signal.getsignal(signal.SIGTERM) is before
