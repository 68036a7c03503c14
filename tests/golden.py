"""What small runs suggested and scored before the role packages, and the comparison with a
run of today (experiments/golden_outputs.py's).

`goldens/before_move.json` is part of `experiments/golden_outputs.py`'s record of commit
45d3956 (the last before the move; 2-core CPU, 2026-11-27): the generator's (`generate`:
eval's figures and lists, and what `--mode=decode` wrote for the same contexts under both
protocols; test_polyencoder_cli trains the same run anyway) and ZAM's (eval; test_zam trains
it at the record's sizes). Kept from the whole record with

  git worktree add /tmp/before 45d3956
  python experiments/golden_outputs.py --repo=/tmp/before --out=/tmp/before.json
  python -c "import json; b = json.load(open('/tmp/before.json')); print(json.dumps(
      {'generate': b['generate'], 'zam': {'eval': b['zam']['eval']}}, sort_keys=True,
      separators=(',', ':')))" > tests/goldens/before_move.json

The other strategies of the record (retrieve, rerank with a ranker, with IMDNA, with habits)
need a ranker trained as before the demo rankers' `scaled_scores` (e369863): the script
compares them (docs/RESULTS.md), the suite does not.
"""

import functools
import importlib.util
import json

from tests.conftest import REPO

BEFORE_MOVE = REPO / 'tests' / 'goldens' / 'before_move.json'


@functools.cache
def golden_outputs():
  """experiments/golden_outputs.py as a module (a script, not part of the package)."""
  spec = importlib.util.spec_from_file_location('golden_outputs',
                                                REPO / 'experiments' / 'golden_outputs.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@functools.cache
def before_move() -> dict:
  """The record (read once; not to be changed by its readers)."""
  return json.loads(BEFORE_MOVE.read_text())


# The record's runs compiled with XLA's backend optimisations, the suite's without them
# (tests/cli.py): the same computation, rounded differently in the seventh digit (at most
# 2.7e-7 of a score, 2026-11-27). Lists, counts and texts are compared exactly.
FLOAT_ROUNDING = 1e-6


def changes_since_the_move(family: str, workdir) -> list[str]:
  """Where `workdir`'s evaluation (its eval/ directory, as the record reads it) differs from
  the record's `family` before the move: changed or lost values; figures added since are not
  changes."""
  module = golden_outputs()
  changed, _ = module.compare({family: {'eval': before_move()[family]['eval']}},
                              {family: {'eval': module.evaluated(workdir)}},
                              rel_tol=FLOAT_ROUNDING)
  return changed
