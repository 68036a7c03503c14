"""The role packages' import contracts (.importlinter): dependencies point one way, no cycles."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO


def test_import_contracts_hold():
  lint = os.path.join(os.path.dirname(sys.executable), 'lint-imports')
  result = subprocess.run([lint, '--no-cache'], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert 'Contracts: 2 kept, 0 broken.' in result.stdout


def documented_files() -> list[str]:
  """The files whose words name modules: the docs a reader meets first, and every module,
  config, launcher and experiment (docs/RESULTS.md excepted: it names where retired code
  lived, with the commit; the tests name missing files on purpose)."""
  roots = ['README.md', 'BUILD.md', 'requirements.txt', '.importlinter', 'docs/PERFORMANCE.md']
  for folder in ('mtn_jax', 'configs', 'launch', 'experiments'):
    for base, _, names in os.walk(os.path.join(REPO, folder)):
      roots += [os.path.relpath(os.path.join(base, n), REPO) for n in names
                if n.endswith(('.py', '.sh', '.md'))]
  return roots


def named_in_documented_files(pattern: str):
  """(file, line number, match) of every match of `pattern` in `documented_files`."""
  compiled = re.compile(pattern)
  for name in documented_files():
    with open(os.path.join(REPO, name), encoding='utf-8') as f:
      for number, line in enumerate(f, 1):
        for found in compiled.findall(line):
          yield name, number, found


def test_every_module_path_the_docs_and_comments_name_exists():
  """A file moved or retired leaves no pointer to it behind."""
  missing = {f'{name}:{number}: {path}' for name, number, path in named_in_documented_files(
      r'\b((?:mtn_jax|launch|experiments|configs|tests)/[\w/]+\.(?:py|sh))\b')
             if not os.path.exists(os.path.join(REPO, path))}
  assert not missing, sorted(missing)


def dotted_reference_problem(reference: str) -> str | None:
  """Why `reference` ('mtn_jax.inference.retrieval.candidate_cache') names nothing: None where
  its longest module prefix is a module of the repository and what follows is defined in it
  (a top-level name, then a name in that class's body)."""
  import ast  # pylint: disable=g-import-not-at-top
  parts = reference.split('.')
  for end in range(len(parts), 0, -1):
    base = os.path.join(REPO, *parts[:end])
    path = next((p for p in (base + '.py', os.path.join(base, '__init__.py'))
                 if os.path.isfile(p)), None)
    if path is not None:
      break
  else:
    return 'no such module'
  rest = parts[end:]
  if not rest:
    return None
  if os.path.isdir(base) and os.path.isfile(os.path.join(base, rest[0] + '.py')):
    return 'no such module'  # a module of the package would have been found above
  with open(path, encoding='utf-8') as f:
    body = ast.parse(f.read()).body
  for depth, name in enumerate(rest[:2]):
    defined = {}
    for node in body:
      targets = (node.targets if isinstance(node, ast.Assign) else
                 [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
      for target in targets:
        if isinstance(target, ast.Name):
          defined[target.id] = node
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        defined[node.name] = node
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        defined.update({(a.asname or a.name).split('.')[0]: node for a in node.names})
    if name not in defined:
      return f'{".".join(parts[:end + depth])} defines no {name!r}'
    if not isinstance(defined[name], ast.ClassDef):
      return None
    body = defined[name].body
  return None


def test_every_dotted_module_reference_names_something():
  """`mtn_jax.package.module` and `mtn_jax.module.name` in docstrings, comments and docs
  follow a move as the slash paths do."""
  assert dotted_reference_problem('mtn_jax.inference.retrieval.candidate_cache') is None
  assert dotted_reference_problem('mtn_jax.tasks.base.ScoresPool.score_pool') is None
  assert dotted_reference_problem('mtn_jax.hypotheses') is not None
  assert dotted_reference_problem('mtn_jax.models.base.nothing_here') is not None
  stale = set()
  for name, number, reference in named_in_documented_files(r'\bmtn_jax(?:\.\w+)+'):
    problem = dotted_reference_problem(reference)
    if problem:
      stale.add(f'{name}:{number}: {reference} ({problem})')
  assert not stale, sorted(stale)


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
