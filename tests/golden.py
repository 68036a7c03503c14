"""What small runs suggested and scored before the role packages, and the comparison with a
run of today (experiments/golden_outputs.py's).

`goldens/before_move.json` is part of `experiments/golden_outputs.py`'s record of commit
45d3956 (the last before the move; 2-core CPU, 2026-11-27): the generator's (`generate`:
eval's figures and lists, and what `--mode=decode` wrote for the same contexts under both
protocols; test_polyencoder_cli trains the same run anyway), and the evaluations of every
other strategy and family of the record: retrieve, rerank with the Poly-encoder, with
IMDNA's proposals and with habits, the Poly-encoder's own, IMDNA's (test_polyencoder_cli)
and ZAM's (test_zam). Kept from the whole record with

  git worktree add /tmp/before 45d3956
  python experiments/golden_outputs.py --repo=/tmp/before --out=/tmp/before.json
  python -c "import json; b = json.load(open('/tmp/before.json')); print(json.dumps(
      {k: (v if k == 'generate' else {'eval': v['eval']}) for k, v in b.items()},
      sort_keys=True, separators=(',', ':')))" > tests/goldens/before_move.json

The record's Poly-encoder was trained before the demo rankers' `scaled_scores` (e369863):
the tests train theirs with `--config.model.scaled_scores=False`, the record's model.
"""

import copy
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
# The rankers' scores: the record's ranker computed them before `scaled_scores` existed, today's
# code with the scaling off, and here without XLA's backend optimisations: at most 3.3e-6
# apart (1.2e-4 of the smallest scores, 0.028), 2026-11-27 (6.6e-6 of a score with the
# optimisations: docs/RESULTS.md); no list's order changes. On an AVX-512 CPU (AMD family 26)
# the same tiny training rounds otherwise: 1.6e-5 apart, every list and figure the same
# (2026-11-27). An absolute tolerance, with room for the CPUs a run may meet.
RANKER_SCORE_ROUNDING = 1e-4
# R@10 and MRR@10 of the 5-long lists of retrieve and rerank: a hit at rank 10 of the
# record's longer ranking counted there; since 7bc102a only what a list shows does.
RETIRED_FIGURES = ('/ranking/recall_at_10', '/ranking/mrr_at_10')
# IMDNA's BM25 baseline ranks the answer words by the summed scores of the documents that hold
# them; words of equal scores (every word of the 'gout' question of sample 12, whose documents
# hold none) were ordered by numpy's argpartition, whose order of ties depends on the CPU
# (79.2 % hits at 100 in the record, 87.5 % with the same code on an AVX-512 CPU). Since
# `data.top_k` ties go to the lower id on any CPU: these values, in place of the record's.
TIES_TO_THE_LOWER_ID = {
    'imdna': {
        ('answers', 'bm25', 'hits_at_100'): 83.33333333333334,
        ('answers', 'bm25', 'recall_at_100'): 77.63888888888889,
        ('samples', 12, 'bm25'): ['in', 'for', 'cheap', 'online', 'free'],
    },
}


# Since 30538ba the user-facing protocol shows no empty suggestion. The record's tiny
# generator wrote '' first after every context, which the user-facing figures scored as its
# top suggestion (no words: BLEU 0, brevity penalty 0); today its first words are scored:
# BLEU still 0, and the top suggestions' length and brevity penalty these values.
_GENERATOR_TOP_SHOWN = {'hyp_len': 24, 'bp': 0.11943296826671962}
EMPTY_NOT_SHOWN = {
    family: {('scores_excluding_session', source, key): value
             for key, value in _GENERATOR_TOP_SHOWN.items()}
    for family, source in (('generate', 'model'), ('retrieve', 'generate'),
                           ('rerank', 'generate'), ('rerank_imdna', 'generate'),
                           ('rerank_habits', 'generate'))}


def _record(family: str) -> dict:
  """The record's evaluation of `family`, with `TIES_TO_THE_LOWER_ID`'s and
  `EMPTY_NOT_SHOWN`'s values."""
  record = copy.deepcopy(before_move()[family]['eval'])
  corrections = {**TIES_TO_THE_LOWER_ID.get(family, {}), **EMPTY_NOT_SHOWN.get(family, {})}
  for path, value in corrections.items():
    *parents, last = path
    functools.reduce(lambda node, key: node[key], parents, record)[last] = value
  return record


def assert_unchanged_since_the_move(family: str, workdir, prefix: str = '',
                                    ranker: bool = False) -> None:
  """Fails, listing each change, where `workdir`'s evaluation (its eval/ directory, as the
  record reads it: the files named `prefix`results.json, ...) differs from the record's
  `family` before the move: changed or lost values; figures added since are not changes. For
  a family that a ranker scores (`ranker`), its scores to RANKER_SCORE_ROUNDING and
  RETIRED_FIGURES left out."""
  module = golden_outputs()
  changed, _ = module.compare({family: {'eval': _record(family)}},
                              {family: {'eval': module.evaluated(workdir, prefix)}},
                              rel_tol=FLOAT_ROUNDING,
                              abs_tol={'score': RANKER_SCORE_ROUNDING} if ranker else None,
                              skip=RETIRED_FIGURES if ranker else ())
  assert not changed, f'{family} changed since the move:\n' + '\n'.join(changed)
