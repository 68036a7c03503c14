"""What the command line says when it cannot start or a run fails, and its `--help`.

absl and ml_collections word their errors for their own developers: a repr of a key, a
traceback of the config file, "Flag --x must have a value other than None". Here each becomes
one line on stderr naming the flag, key, file or value at fault, with the exit code that tells
usage (2) from data (1); `--verbosity=1` or more adds the traceback. `-h` and `--help` print
the modes, the flags, the config's keys and the decode input formats, and exit 0.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib.util
import os
import re
import signal
import sys
import textwrap
import threading
import traceback

from absl import flags
from absl import logging as absl_logging
import ml_collections
from ml_collections import config_flags

from mtn_jax import config_lib
from mtn_jax import errors
from mtn_jax import files
from mtn_jax import modes

USAGE_ERROR = 2  # a wrong flag, config file or config value
DATA_ERROR = 1  # bad data, input file or checkpoint
# A run stopped by a signal after saving exits as a shell reports a process killed by it, so
# that a scheduler or a script can tell it from a finished one.
EXIT_CODES = {'SIGINT': 128 + signal.SIGINT, 'SIGTERM': 128 + signal.SIGTERM}


def _verbosity(argv) -> int:
  """The --verbosity (-v) asked for on the command line, read from argv itself: flag parsing
  may have failed before reaching it. Default -1 (absl's WARNING)."""
  level = -1
  args = list(argv[1:])
  for i, arg in enumerate(args):
    name, has_value, value = arg.lstrip('-').partition('=')
    if not arg.startswith('-') or name not in ('v', 'verbosity'):
      continue
    if not has_value:
      value = args[i + 1] if i + 1 < len(args) else ''
    try:
      level = int(value)
    except ValueError:
      pass
  return level


def _fail(message: str, code: int, argv=None) -> None:
  """Exits with `code` and one line on stderr; --verbosity=1 or more first prints the
  traceback of the exception being handled, if any."""
  if _verbosity(sys.argv if argv is None else argv) >= 1:
    if sys.exc_info()[0] is not None:
      traceback.print_exc()
  else:
    # What a failed read leaves behind (orbax's unfinished reads of a damaged checkpoint) is
    # reported at exit as "Exception ignored in ...", hundreds of lines after the one that
    # says what failed: the run has said why.
    sys.unraisablehook = lambda unraisable: None
  print(f'error: {message}', file=sys.stderr)
  sys.exit(code)


def usage_error(message: str, argv=None) -> None:
  """Exits with code 2 and one line naming what is wrong (and where help is)."""
  _fail(f'{message} (see --help)', USAGE_ERROR, argv)


def _unrepr(text: str) -> str:
  """`text` itself where it is the repr of a string or of a tuple: ml_collections hands a
  mistyped key's message as one ('\\'nmu_heads\\'\\nDid you mean "num_heads" ...'), absl a
  wrong boolean as the other ("('Non-boolean argument to boolean flag', 'maybe')")."""
  for _ in range(2):  # a repr in a repr
    if len(text) < 2 or not ((text[0] == text[-1] and text[0] in '\'"')
                             or (text[0], text[-1]) == ('(', ')')):
      break
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      break
    if isinstance(value, tuple):
      return ': '.join(map(str, value))
    text = str(value)
  return text


def _one_line(error: BaseException) -> str:
  """An exception's message on one line. An error raised in a config file's get_config comes
  with its whole traceback: only the exception's own line is kept."""
  text = str(error)
  flag = re.match(r'flag --\S*?: ', text)  # absl's prefix, naming the flag and its value
  prefix = flag.group(0) if flag else ''
  text = prefix + _unrepr(text[len(prefix):])
  if 'Traceback (most recent call last)' in text:
    head, _, trace = text.partition('Traceback (most recent call last)')
    last = [line for line in trace.splitlines() if line.strip()][-1]
    text = head.rstrip(': \n') + ': ' + last.strip()
  return ' '.join(text.split())


def _config_argument(argv) -> str | None:
  """The --config value (path[:variant]) as written on the command line, or None."""
  args = list(argv[1:])
  for i, arg in enumerate(args):
    match = re.fullmatch(r'--?config(=(.*))?', arg, re.DOTALL)
    if match:
      return match.group(2) if match.group(1) else (args[i + 1] if i + 1 < len(args) else None)
  return None


def _missing_config_file(config_argument: str | None) -> str | None:
  """The message for a --config whose file does not exist, else None."""
  if not config_argument:
    return None
  path = config_argument.split(':', 1)[0]  # path[:variant]
  if os.path.isfile(path):
    return None
  return (f'--config: there is no file {path} (paths are relative to the current directory: '
          'run from the repository root, or give the whole path)')


# Config keys that once existed, and why they went: an override of one fails with this line.
RETIRED_KEYS = {
    'suggest.gain_from': 'the expected-gain model chose the previous query for nearly every '
                         'context (docs/notes/2026-11-25-candidate-rankers.md, "Retired")',
    'suggest.previous_query_bias': 'the bias chosen on validation did not carry over to the '
                                   'test split (docs/notes/2026-11-25-candidate-rankers.md, '
                                   '"Retired")',
    'train.optimizer': 'it chose nothing: training uses Adam (optax.adam) with '
                       'config.train.adam_b1, adam_b2 and adam_eps',
}
# Config keys another key replaced (one switch per idea): an override of one fails naming it.
REPLACED_KEYS = {
    'decode.rerank': "config.decode.mbr ('mbr' is now 'beam', 'mbr+session' 'beam+session')",
    'suggest.mbr': "config.decode.mbr (True is now 'ranker', beside the beam's: "
                   "'beam+session,ranker')",
    'serve.user_facing': 'config.decode.exclude_session_queries (unset, the service is '
                         'user-facing; False: the paper\'s protocol)',
}

_CONFIG_FILE_ERROR = re.compile(
    r'^flag (--config=\S*): Error whilst parsing config file: (\w+): (.*)$')
_REQUIRED = re.compile(r'Flag --(\w+) must have a value other than None')
# ml_collections' words for a value of another type set in a config file (read backwards).
_WRONG_TYPE = re.compile(r"^Could not override field '(\w+)' \(reference\)\. (.*) is of original "
                         r"type <class '(\w+)'> and cannot be casted to type <class '(\w+)'>$")
_EXAMPLE_VALUES = {'config': 'FILE[:variant]', 'workdir': 'DIR'}


def flag_error_message(error: BaseException, argv) -> str:
  """One line naming the flag, key, file or value that made flag parsing fail."""
  missing = _missing_config_file(_config_argument(argv))
  if missing:  # overrides of a config that could not be read fail first with a worse message
    return missing
  text = _one_line(error)
  required = _REQUIRED.findall(text)
  if required:
    return 'missing ' + ' and '.join(f'--{name}={_EXAMPLE_VALUES.get(name, "VALUE")}'
                                     for name in required)
  match = _CONFIG_FILE_ERROR.match(text)
  if match:  # get_config raised: the file's own message, which names the file
    flag, kind, message = match.groups()
    wrong_type = _WRONG_TYPE.match(message) if kind == 'TypeError' else None
    if wrong_type:
      key, value, given, held = wrong_type.groups()
      return (f'{flag}: {_key_path(key)} is of type {held}, and the file sets it to {value!r} '
              f'(type {given})')
    return f'{flag}: {message}' if kind == 'ValueError' else f'{flag}: {kind}: {message}'
  if isinstance(error, (SyntaxError, NameError)):  # the file itself is no Python that runs
    return f'--config={_config_argument(argv)}: {type(error).__name__}: {text}'
  if isinstance(error, AttributeError) and "has no attribute 'get_config'" in text:
    return (f'--config={_config_argument(argv)}: the file defines no get_config(variant) '
            'returning the config (configs/default.py shows one)')
  if isinstance(error, (KeyError, AttributeError)):
    # A config key that does not exist: ml_collections names the key alone ('nmu_heads',
    # perhaps with a 'Did you mean' line); the override on the command line says where.
    key, _, hint = text.partition(' ')
    key = key.strip('\'"')
    for arg in argv[1:]:
      name = arg.lstrip('-').split('=', 1)[0]
      if retired := _retired(name.removeprefix('config.')):
        return f'--{name} {retired}'
      parts = name.split('.')
      if parts[0] == 'config' and key in parts[1:]:
        parent = '.'.join(parts[:parts.index(key, 1)])
        readers = _models_reading(key) if parent == 'config.model' else None
        if readers:
          return (f'--{name}: config.model has no key {key!r}: only {readers} read it, '
                  'not this config\'s model (configs/families.py)')
        return (f'--{name}: {parent} has no key {key!r}. '
                + (hint or 'configs/default.py lists every key.'))
  return text.removeprefix('flag ')


def parse_flags(argv):
  """absl's flag parsing, with every error (an unknown flag or config key, a wrong type, a
  config file that is missing or fails to load, a missing required flag) as one line and
  exit code 2; --verbosity=1 or more adds the traceback. -h or --help prints `help_text`
  and exits 0; --helpfull adds every flag, absl's own too (absl alone would exit 1)."""
  asked = _asks_for_help(argv)
  if asked:
    print(help_text())
    if asked == 'full':
      print('\nEvery flag, absl\'s own included:\n' + flags.FLAGS.get_help())
    sys.exit(0)
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    usage_error(flag_error_message(e, argv), argv)


def checked_config(config_flag, mode: str):
  """The config of --config once it exists and `config_lib.validate` accepts it for `mode`;
  otherwise a usage error naming the file or key."""
  # Without overrides a missing config file passes parsing (ml_collections defers the error).
  missing = _missing_config_file(config_flags.get_config_filename(config_flag))
  if missing:
    usage_error(missing)
  config = config_flag.value
  if not isinstance(config, ml_collections.ConfigDict):
    usage_error(f'--config={config_flags.get_config_filename(config_flag)}: its get_config '
                f'returned {config!r}, not an ml_collections.ConfigDict')
  unknown = unknown_key(config)
  if unknown:
    usage_error(f'--config={config_flags.get_config_filename(config_flag)}: {unknown}')
  config_lib.expand_home(config)
  try:
    config_lib.validate(config, mode)
  except config_lib.ConfigError as e:
    usage_error(str(e))
  except OSError as e:  # a config file that exists but could not be read
    usage_error(f'--config: {_one_line(e)}')
  return config


def unknown_key(config: ml_collections.ConfigDict) -> str | None:
  """What to say of a key that a config file sets and no run reads (a typo: `c.decode.beamsize
  = 10`, the default beam kept), else None. The command line's overrides are checked against
  the file's keys by ml_collections, but the file's own assignments add any key they name.
  The keys are configs/default.py's and the IMDNA task's sections (configs/imdna_movies.py);
  config.model's are `config_lib`'s to check (it knows each family's). None where this
  package lies in no checkout of the repository."""
  default, imdna = _configs_module('default'), _configs_module('imdna_movies')
  if default is None or imdna is None:
    return None
  known = default.get_config()
  task = imdna.get_config()
  for section in ('imdna', 'movies'):
    known[section] = task[section]
  return _first_unknown(config, known, 'config')


def _retired(key: str) -> str | None:
  """Why `key` ('decode.rerank') is no longer a key, where it was one, else None."""
  if key in RETIRED_KEYS:
    return f'was removed: {RETIRED_KEYS[key]}'
  if key in REPLACED_KEYS:
    return f'was replaced by {REPLACED_KEYS[key]}'
  return None


def _first_unknown(config, known, where: str) -> str | None:
  for key, value in config.items():
    if where == 'config' and key == 'model':
      continue
    if key not in known:
      # An old config file's retired key is told as the command line tells it.
      if retired := _retired(f'{where}.{key}'.removeprefix('config.')):
        return f'{where}.{key} {retired}'
      close = difflib.get_close_matches(key, list(known.keys()), n=1)
      return (f'{where}.{key}: {where} has no key {key!r}'
              + (f' (did you mean "{close[0]}"?)' if close else '')
              + ': configs/default.py lists every key')
    if isinstance(value, ml_collections.ConfigDict) and isinstance(known[key],
                                                                   ml_collections.ConfigDict):
      unknown = _first_unknown(value, known[key], f'{where}.{key}')
      if unknown:
        return unknown
  return None


def check_workdir(workdir: str) -> None:
  """A usage error where --workdir cannot hold a run (a file, or no folder can be made)."""
  problem = _workdir_problem(workdir)
  if problem:
    usage_error(problem)


def _workdir_problem(workdir: str) -> str | None:
  """Why --workdir cannot hold a run (empty, a file, or no folder can be made there), else
  None."""
  if not workdir:  # '' would be the current folder, which the run would fill
    return 'missing --workdir=DIR'
  if os.path.exists(workdir):
    return None if os.path.isdir(workdir) else f'--workdir={workdir} is a file, not a folder'
  problem = files.cannot_create(workdir)
  return problem and f'--workdir={workdir}: {problem}'


def quiet_library_logs() -> None:
  """Library INFO logs off (orbax writes several per checkpoint read: they would bury a
  program's own lines) unless --verbosity asks for them."""
  if not flags.FLAGS['verbosity'].present:
    absl_logging.set_verbosity(absl_logging.WARNING)


def not_orbax_thread_failures(record) -> bool:
  """A logging filter: False for the failure logs (with a traceback) of orbax's background
  threads, which the save that waits for them raises again (`checkpoints._writing`)."""
  return not (record.exc_info and f'{os.sep}orbax{os.sep}' in record.pathname)


OUT_OF_MEMORY = ('a smaller batch (config.decode.batch_sessions, '
                 'config.input.train_queries_per_batch) or shorter outputs '
                 '(config.decode.max_len) need less')


class Terminated(KeyboardInterrupt):
  """SIGTERM outside the training loop (which saves a checkpoint first): the run stops as at
  Ctrl-C, what it writes left as an exception leaves it (an atomic file's temporary removed, a
  decode's whole chunks kept), rather than killed where it stands."""


def _terminate(signum, frame) -> None:
  del signum, frame
  raise Terminated


@contextlib.contextmanager
def run_errors():
  """Around a mode: a problem with the input, config or checkpoint (`errors.Error`), or a
  file the system refuses (missing, a folder, no permission, a full disk: `OSError`, whose
  message names it), ends the run with its message on one line and exit code 1; Ctrl-C or
  SIGTERM outside the training loop, or a second Ctrl-C inside it, stops at once (130, 143;
  the training loop and the service take both signals over while they run)."""
  main_thread = threading.current_thread() is threading.main_thread()  # signals' only home
  previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
  try:
    yield
  except (errors.Error, OSError) as e:
    _fail(str(e), DATA_ERROR)
  except MemoryError:
    _fail(f'out of host memory: {OUT_OF_MEMORY}', DATA_ERROR)
  except Exception as e:  # pylint: disable=broad-except
    # XLA's allocation failure (jax's XlaRuntimeError, told by name: importing jax here
    # would slow every --help).
    if type(e).__name__.endswith('RuntimeError') and 'RESOURCE_EXHAUSTED' in str(e):
      _fail(f'out of device memory ({(str(e).splitlines() or [""])[0][:200]}): '
            f'{OUT_OF_MEMORY}', DATA_ERROR)
    raise
  except KeyboardInterrupt as e:
    terminated = isinstance(e, Terminated)
    print('terminated' if terminated else 'interrupted', file=sys.stderr)
    sys.exit(EXIT_CODES['SIGTERM' if terminated else 'SIGINT'])
  finally:
    if main_thread:  # (None: a handler not set from Python, the default's)
      signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


# ------------------------------------------------------------------------------------------
# --help

_HELP_FLAGS = ('-h', '--h', '-help', '--help', '-helpshort', '--helpshort', '-?', '--?')

_DECODE_INPUT = """\
--mode=decode reads --config.decode.input=FILE, plain or gzip, in one of two formats told
apart by its first 100 non-empty lines (a log's header first, else the format at least half
of them have):
  sessions file  one session a line, its queries separated by tabs; suggestions after the
                 last query of each line.
  raw log        an AOL-format log: an `AnonID` header line (AnonID, Query, QueryTime,
                 ItemRank, ClickURL), or lines of 3 or 5 tab-separated fields with a
                 YYYY-MM-DD HH:MM:SS time in the third (a line of another form is skipped
                 and counted; a log of no such line is refused);
                 sessions are cut as preprocessing cuts them
                 (config.data.session_gap_minutes) and suggestions are made after every
                 query, with the next query as the reference.
It writes one JSON line per suggestion point to config.decode.output (default
<workdir>/decode/<the input's file name>.suggestions.jsonl), the config.decode.top_k best first."""

_EXIT_CODES = """\
0 finished; 1 bad data, input file or checkpoint; 2 usage error (flag, config file or
value); 130 and 143 stopped by SIGINT or SIGTERM: in training after saving a checkpoint (the
same command resumes), elsewhere at once, but the service, which drains its requests and
exits 0."""


def _asks_for_help(argv) -> str | None:
  """'full' (--helpfull), 'short' (-h, --help, ...) or None."""
  for arg in argv[1:]:
    if arg == '--':  # what follows is arguments, not flags
      return None
    if arg in _HELP_FLAGS:
      return 'short'
    if arg in ('-helpfull', '--helpfull'):
      return 'full'
  return None


def help_text() -> str:
  """What -h and --help print: usage, modes, flags, config keys, decode input formats."""
  sections = [
      'Next-query suggestion from search session logs (mtn_jax).',
      'usage: python -m mtn_jax.main --config=FILE[:variant] --workdir=DIR [--mode=MODE]\n'
      '                              [--config.SECTION.KEY=VALUE ...]\n\n'
      '  python -m mtn_jax.main --config=configs/demo.py --workdir=/tmp/mtn_demo\n'
      '  python -m mtn_jax.main --config=configs/aol.py:small --config.data.raw_files=LOG '
      '--workdir=runs/mtn --mode=train',
      'modes (--mode):\n' + modes.HELP,
      'flags:\n' + _flags_help(),
      'config keys:\n' + _config_keys(),
      'decode input:\n' + _DECODE_INPUT,
      'exit codes:\n' + _EXIT_CODES,
  ]
  return '\n\n'.join(sections)


def _flags_help() -> str:
  """The flags the command line defines (absl's own aside), in their order."""
  lines = []
  for module, module_flags in flags.FLAGS.flags_by_module_dict().items():
    if module.startswith('absl'):
      continue
    for flag in module_flags:
      name = f'--[no]{flag.name}' if flag.boolean else f'--{flag.name}'
      default = '' if flag.default is None else f' (default: {flag.default_as_str})'
      lines += [f'  {name}{default}',
                textwrap.fill(flag.help, width=92, initial_indent=' ' * 6,
                              subsequent_indent=' ' * 6)]
  lines += ['  --verbosity=1 (-v 1)', '      An error also prints its traceback.',
            '  --helpfull', "      absl's own flags too."]
  return '\n'.join(lines)


def _configs_module(name: str):
  """configs/<name>.py of the checkout this package lies in, or None where there is none."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if not os.path.isfile(os.path.join(root, 'configs', f'{name}.py')):
    return None
  if root not in sys.path:
    sys.path.insert(0, root)  # the config files import each other as `configs.<name>`
  try:
    return importlib.import_module(f'configs.{name}')
  except ImportError:  # another package named configs comes first
    return None


def _key_path(key: str) -> str:
  """`config.<section>.<key>` where one section of configs/default.py has `key`, else the key."""
  default = _configs_module('default')
  config = default.get_config() if default is not None else {}
  sections = [name for name, value in config.items() if hasattr(value, 'items') and key in value]
  return f'config.{sections[0]}.{key}' if len(sections) == 1 else key


def _models_reading(key: str) -> str | None:
  """The models whose family has `config.model.<key>` ('seq2seq, hred, mnsrf'), or None."""
  families = _configs_module('families')
  if families is None:
    return None
  return ', '.join(name for name in families.FAMILIES if key in families.keys(name)) or None


def _config_keys() -> str:
  """Every section of configs/default.py's config and its keys, then each model family's
  keys under config.model (configs/families.py), read from the files themselves."""
  intro = ('Every key of the config file can be overridden on the command line, e.g.\n'
           '--config.model.num_heads=8 --config.decode.beam_size=10 (a config file is\n'
           'configs/default.py with a model\'s keys and changes; default.py and\n'
           'configs/families.py give each key its meaning):')
  default, families = _configs_module('default'), _configs_module('families')
  if default is None or families is None:  # not beside a checkout of the repository
    return intro
  config = default.get_config()
  lines = [intro]
  top = [key for key, value in config.items() if not hasattr(value, 'items')]
  if top:
    lines.append(f'  config.{", config.".join(top)}')
  for section, value in config.items():
    if hasattr(value, 'items'):
      label = 'model (every model)' if section == 'model' else section
      lines.append(textwrap.fill(', '.join(value.keys()), width=92,
                                 initial_indent=f'  config.{label}: ',
                                 subsequent_indent=' ' * 6))
  lines.append('  config.model, each family\'s own (--config=configs/default.py:MODEL gives '
               'them):')
  for family, (models, keys) in families.families().items():
    lines.append(textwrap.fill(', '.join(keys), width=92,
                               initial_indent=f'    {family} ({", ".join(models)}): ',
                               subsequent_indent=' ' * 8))
  imdna = _configs_module('imdna_movies')
  if imdna is not None:
    config = imdna.get_config('qa')
    for section, where in (('imdna', 'the IMDNA task, configs/imdna_movies.py and imdna_aol.py'),
                           ('movies', 'the movie knowledge base, configs/imdna_movies.py')):
      lines.append(textwrap.fill(', '.join(config[section].keys()), width=92,
                                 initial_indent=f'  config.{section} ({where}): ',
                                 subsequent_indent=' ' * 6))
  return '\n'.join(lines)
