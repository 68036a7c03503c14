"""The docs stay short enough to read, their relative links resolve, and the sections the
code names exist."""

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
