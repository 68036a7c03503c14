"""The docs stay short enough to read, their relative links resolve, and the sections, files
and modules the docs, docstrings and comments name exist."""

import os
import re
import subprocess

from tests.conftest import REPO

_LINK = re.compile(r'\]\(([^)\s]+)\)')
# A section named in a comment, docstring or doc: `docs/PERFORMANCE.md, "Serving"` or
# `BUILD.md ("Development workflow")`, the heading's words (or their start) in quotes.
_SECTION = re.compile(r'((?:docs/[\w./-]+|README|BUILD)\.md)[,:]?\s*\(?"([^"]+)"')


def _docs():
  names = ['README.md', 'BUILD.md', 'experiments/README.md']
  for folder in ('docs', 'docs/notes'):
    names += [os.path.join(folder, n) for n in sorted(os.listdir(os.path.join(REPO, folder)))
              if n.endswith('.md')]
  return [n for n in names if os.path.exists(os.path.join(REPO, n))]


def _read(name):
  with open(os.path.join(REPO, name), encoding='utf-8') as f:
    return f.read()


def _anchor(heading):
  """GitHub's anchor of a Markdown heading."""
  text = heading.strip().lower()
  text = re.sub(r'[^\w\- ]', '', text)
  return text.replace(' ', '-')


def test_readme_and_the_current_docs_stay_short():
  readme = _read('README.md')
  assert len(readme.splitlines()) <= 150 and len(readme) <= 10_000, (
      len(readme.splitlines()), len(readme))
  for name in ('docs/RESULTS.md', 'docs/PERFORMANCE.md'):
    assert len(_read(name).splitlines()) <= 300, name


def test_notes_are_named_by_date_and_subject():
  for name in os.listdir(os.path.join(REPO, 'docs', 'notes')):
    assert re.fullmatch(r'\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md', name), name


def test_every_relative_link_resolves():
  broken = []
  for name in _docs():
    text = _read(name)
    for target in _LINK.findall(text):
      if re.match(r'[a-z]+:', target):
        continue
      path, _, anchor = target.partition('#')
      file = os.path.normpath(os.path.join(REPO, os.path.dirname(name), path)) if path else (
          os.path.join(REPO, name))
      if not os.path.exists(file):
        broken.append(f'{name}: {target}')
        continue
      if anchor and file.endswith('.md'):
        with open(file, encoding='utf-8') as f:
          anchors = {_anchor(line.lstrip('#')) for line in f if line.startswith('#')}
        if anchor not in anchors:
          broken.append(f'{name}: {target} (no such heading)')
  assert not broken, broken


def test_every_section_the_code_and_docs_name_exists():
  tracked = subprocess.run(['git', 'ls-files'], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
  missing = []
  for name in tracked:
    if not name.endswith(('.py', '.sh', '.md')):
      continue
    # A reference may run over a line end, inside a comment.
    text = re.sub(r'\n\s*(#\s*)?', ' ', _read(name))
    for doc, section in _SECTION.findall(text):
      if not os.path.exists(os.path.join(REPO, doc)):
        missing.append(f'{name}: {doc} (no such file)')
        continue
      headings = [line.lstrip('#').strip() for line in _read(doc).splitlines()
                  if line.startswith('#')]
      if not any(h.startswith(section) for h in headings):
        missing.append(f'{name}: {doc}, "{section}"')
  assert not missing, missing


def test_usage_names_every_source_of_the_learned_ranker():
  """USAGE lists the sources a plan of `config.suggest.sources` may name: a source added to
  the code is added there too."""
  from mtn_jax.inference import learned  # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'docs', 'USAGE.md'), encoding='utf-8') as f:
    usage = f.read()
  start = usage.index('The sources\n  (`mtn_jax/inference/sources.py`)')
  listed = usage[start:usage.index('; a new one is', start)]
  assert set(re.findall(r'`(\w+)`', listed)) == set(learned.RANKER_SOURCES)


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
