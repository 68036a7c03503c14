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
