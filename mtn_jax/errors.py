"""The project's user-facing failures: the command line prints their message, no traceback."""

from collections.abc import Mapping, Sequence


class Error(Exception):
  """Something the user can fix (bad input, config or checkpoint); the message says what."""


class ConfigError(Error, ValueError):
  """A config value that cannot work; the message names the key (`config.model.num_heads`).

  Raised by `mtn_jax.config_lib.validate` and by the model configs' own checks
  (`ModelConfig.check`); the command line reports it as a usage error."""


def check_positive(section: Mapping, where: str, *keys: str) -> None:
  """Refuses the first of `keys` of `section` (the config section `where`, e.g.
  'config.model') whose value is not above 0."""
  for key in keys:
    if not section[key] > 0:
      raise ConfigError(f'{where}.{key} must be positive, got {section[key]!r}')


def check_choice(section: Mapping, where: str, key: str, choices: Sequence[str]) -> None:
  """Refuses `section[key]` unless it is one of `choices`: "config.data.split_by must be
  'session', 'user' or 'time', got 'users'"."""
  if section[key] not in choices:
    quoted = [repr(c) for c in choices]
    either = ', '.join(quoted[:-1]) + ' or ' + quoted[-1] if len(quoted) > 1 else quoted[0]
    raise ConfigError(f'{where}.{key} must be {either}, got {section[key]!r}')
