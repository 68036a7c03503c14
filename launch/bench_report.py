"""What every benchmark states beside its figures, said one way: the date (with its time
zone), the machine, the command that ran, and the JSON file of the figures.

No flags are defined here (a script that imports it defines its own, and may have them checked
here: `positive_list`), and JAX is imported only when the machine's devices are asked for
(preprocessing measures without it).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
from typing import Any, Callable

from absl import app
from absl import flags
from ml_collections import config_flags

from mtn_jax import cli


def now() -> str:
  """The local date and time with its UTC offset, to the second."""
  return datetime.datetime.now().astimezone().isoformat(timespec='seconds')


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine(devices: bool = True) -> dict[str, Any]:
  """The host, its CPU and load, Python, and with `devices` JAX's backend and devices."""
  out = {'host': platform.node(), 'cpu_model': cpu_model(), 'cpu_count': os.cpu_count(),
         'usable_cores': (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
                          else os.cpu_count()),  # macOS has no affinity
         'python': platform.python_version(),
         'load_average_1min': round(os.getloadavg()[0], 2)}
  if devices:
    import jax  # pylint: disable=g-import-not-at-top
    found = jax.devices()
    out.update(platform=jax.default_backend(), device_kind=found[0].device_kind,
               device_count=len(found), jax=jax.__version__)
  return out


def machine_line(m: dict[str, Any]) -> str:
  """`machine()` in one line."""
  line = (f'{m["host"]}, {m["cpu_model"]}, {m["cpu_count"]} CPUs ({m["usable_cores"]} usable), '
          f'load average {m["load_average_1min"]}, Python {m["python"]}')
  if 'jax' in m:
    line += f'; {m["device_count"]} x {m["device_kind"]} ({m["platform"]}), jax {m["jax"]}'
  return line


def print_header(command: str | None = None, devices: bool = True) -> dict[str, Any]:
  """Prints the 'date:', 'machine:' (and 'command:') lines a benchmark starts with; returns
  them as a report's fields."""
  report = {'date': now(), 'machine': machine(devices)}
  print(f'date: {report["date"]}')
  print(f'machine: {machine_line(report["machine"])}')
  if command:
    report['command'] = command
    print(f'command: {command}')
  return report


def run(main: Callable[[list[str]], Any]) -> None:
  """absl's `app.run(main)`, a usage error of `main` said in one line: absl would print the
  script's whole help above it. A problem with the config, a workdir or a file ends it as it
  ends the command line (`cli.run_errors`: one line, exit code 1)."""

  def one_line(argv):
    try:
      with cli.run_errors():
        return main(argv)
    except app.UsageError as e:
      raise SystemExit(f'error: {e}') from None

  app.run(one_line)


def positive_list(name: str, kind: type = int) -> None:
  """Refuses, when the flags are parsed (before any work), a list flag `name` whose values
  are not positive numbers of `kind`: absl then names the flag and the value in one line."""

  def valid(values) -> bool:
    try:
      return all(kind(v) > 0 for v in values)
    except ValueError:
      return False

  what = 'whole numbers' if kind is int else 'numbers'
  flags.register_validator(name, valid, message=f'expected positive {what}, comma-separated')


def config_args(config_flag: str = 'config') -> list[str]:
  """`--config=FILE` and its `--config.key=value` overrides, as given (none without the
  flag)."""
  if config_flag not in flags.FLAGS:
    return []
  name = config_flags.get_config_filename(flags.FLAGS[config_flag])
  overrides = config_flags.get_override_values(flags.FLAGS[config_flag])
  return [f'--config={name}'] + [f'--config.{k}={v}' for k, v in sorted(overrides.items())]


def argv_line(script: str, argv: list[str]) -> str:
  """The command of a script that parses its own arguments: `script` and `argv`, quoted as a
  shell would need them."""
  return shlex.join(['python', script, *argv])


def command_line(script: str, modules: tuple[str, ...], config_flag: str = 'config') -> str:
  """The command that ran: `script`, its config file and overrides as given, then every flag
  of `modules` (the script's, and those it imports flags from) given on the command line."""
  given, config = [], config_args(config_flag)
  for module in dict.fromkeys(modules):
    given += [f for f in flags.FLAGS.get_key_flags_for_module(module)
              if f.present and f.name != config_flag and f not in given]
  return shlex.join(['python', script, *config, *(f.serialize() for f in given)])


def write_json(report: dict[str, Any], path: str | None) -> None:
  """`report` as JSON at `path` (a script's `--json`), where given."""
  if path:
    with open(path, 'w', encoding='utf-8') as f:
      json.dump(report, f, indent=2, sort_keys=True, default=str)
    print(f'wrote {path}')
