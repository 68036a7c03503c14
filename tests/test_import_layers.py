"""The package's structure: its role packages' import contracts (.importlinter: dependencies
point one way, no cycles, the service never reads evaluation), and no caller above the tasks
asking which model it holds."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_import_contracts_hold():
  lint = os.path.join(os.path.dirname(sys.executable), 'lint-imports')
  result = subprocess.run([lint, '--no-cache'], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert 'Contracts: 3 kept, 0 broken.' in result.stdout


# Where callers must ask a task what it can do (its capabilities, `mtn_jax.tasks.base`) and
# never which model it holds.
ABOVE_TASKS = ('mtn_jax/inference', 'mtn_jax/serving', 'mtn_jax/evaluation',
               'mtn_jax/config_lib.py')


def concrete_task_classes() -> set[str]:
  """The names of the classes the tasks package defines that are not capabilities
  (`typing.Protocol`s)."""
  import inspect  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  from mtn_jax import tasks  # pylint: disable=g-import-not-at-top
  names = set()
  for info in pkgutil.iter_modules(tasks.__path__):
    module = importlib.import_module(f'mtn_jax.tasks.{info.name}')
    names |= {name for name, value in vars(module).items()
              if inspect.isclass(value) and value.__module__ == module.__name__
              and not getattr(value, '_is_protocol', False)}
  return names


# Config keys whose values share a word with the model families' names without naming one:
# config.train.schedule 'transformer' (the Transformer paper's learning-rate schedule) and a
# ranker's config.model.context_encoder 'mtn'.
NOT_FAMILIES = ('schedule', 'context_encoder')


def family_questions(source: str, families: set[str], classes: set[str]) -> list[str]:
  """'line N: what' for every comparison with a model family's name and every isinstance
  or issubclass of a concrete task class in `source`."""
  import ast  # pylint: disable=g-import-not-at-top

  def other_setting(node):
    key = (node.attr if isinstance(node, ast.Attribute) else
           node.slice.value if isinstance(node, ast.Subscript)
           and isinstance(node.slice, ast.Constant) else None)
    return key in NOT_FAMILIES

  def strings(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
      return set().union(*(strings(e) for e in node.elts)) if node.elts else set()
    return set()

  def names(node):
    if isinstance(node, ast.Name):
      return {node.id}
    if isinstance(node, ast.Attribute):
      return {node.attr}
    if isinstance(node, ast.Tuple):
      return set().union(*(names(e) for e in node.elts)) if node.elts else set()
    return set()

  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare):
      sides = [node.left, *node.comparators]
      named = set().union(*(strings(side) for side in sides))
      if named & families and not any(other_setting(side) for side in sides):
        found.append(f'line {node.lineno}: compares with {sorted(named & families)}')
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ('isinstance', 'issubclass') and len(node.args) == 2):
      tested = names(node.args[1]) & classes
      if tested:
        found.append(f'line {node.lineno}: {node.func.id} of {sorted(tested)}')
    elif isinstance(node, ast.MatchValue) and strings(node.value) & families:
      found.append(f'line {node.lineno}: matches {sorted(strings(node.value) & families)}')
  return found


def test_no_caller_above_the_tasks_asks_which_model_it_holds():
  from mtn_jax import models  # pylint: disable=g-import-not-at-top
  families, classes = set(models.REGISTRY), concrete_task_classes()
  assert {'biencoder', 'mtn'} <= families and {'RankingTask', 'ZeroAttentionTask'} <= classes
  # The scan finds what it looks for.
  planted = ("if cfg.name != 'biencoder': pass\n"
             "ok = name in ('polyencoder', 'crossencoder')\n"
             "ranker = isinstance(task, tasks.RankingTask)\n"
             "zam = isinstance(task, (tasks.ScoresPool, zero_attention.ZeroAttentionTask))\n"
             "capable = isinstance(task, tasks.ScoresPool) and strategy == 'generate'\n"
             "warmup = config.train.schedule == 'transformer'\n")
  assert [line.split(':')[0] for line in family_questions(planted, families, classes)] == [
      'line 1', 'line 2', 'line 3', 'line 4']
  asked = []
  for root in ABOVE_TASKS:
    paths = ([os.path.join(REPO, root)] if root.endswith('.py') else
             [os.path.join(base, n) for base, _, files in os.walk(os.path.join(REPO, root))
              for n in files if n.endswith('.py')])
    for path in paths:
      with open(path, encoding='utf-8') as f:
        asked += [f'{os.path.relpath(path, REPO)} {where}'
                  for where in family_questions(f.read(), families, classes)]
  assert not asked, asked
