"""The role packages' import contracts (.importlinter): dependencies point one way, no cycles."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_import_contracts_hold():
  lint = os.path.join(os.path.dirname(sys.executable), 'lint-imports')
  result = subprocess.run([lint, '--no-cache'], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
  assert 'Contracts: 2 kept, 0 broken.' in result.stdout


def test_every_module_path_the_docs_and_comments_name_exists():
  """A file moved or retired leaves no pointer to it behind (docs/RESULTS.md excepted: it names
  where retired code lived, with the commit; the tests name missing files on purpose)."""
  import re  # pylint: disable=g-import-not-at-top
  pattern = re.compile(r'\b((?:mtn_jax|launch|experiments|configs|tests)/[\w/]+\.(?:py|sh))\b')
  roots = ['README.md', 'BUILD.md', 'requirements.txt', '.importlinter', 'docs/PERFORMANCE.md']
  for folder in ('mtn_jax', 'configs', 'launch', 'experiments'):
    for base, _, names in os.walk(os.path.join(REPO, folder)):
      roots += [os.path.relpath(os.path.join(base, n), REPO) for n in names
                if n.endswith(('.py', '.sh', '.md'))]
  missing = set()
  for name in roots:
    with open(os.path.join(REPO, name), encoding='utf-8') as f:
      for number, line in enumerate(f, 1):
        for path in pattern.findall(line):
          if not os.path.exists(os.path.join(REPO, path)):
            missing.add(f'{name}:{number}: {path}')
  assert not missing, sorted(missing)
