"""experiments/golden_outputs.py's comparison: a changed value or a lost one fails it, a figure
added since does not."""

import importlib.util

from tests.conftest import REPO


def _module():
  spec = importlib.util.spec_from_file_location('golden_outputs',
                                                REPO / 'experiments' / 'golden_outputs.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_changes_and_losses_are_told_apart_from_additions():
  compare = _module().compare
  before = {'generate': {'eval': {'scores': {'bleu': 9.37}, 'lists': [['a', 'b'], ['c']]},
                         'gone': 1}}
  same = {'generate': {'eval': {'scores': {'bleu': 9.37, 'mpc': 1.0},
                                'lists': [['a', 'b'], ['c']]}, 'gone': 1}}
  assert compare(before, same) == ([], ['/generate/eval/scores/mpc'])
  after = {'generate': {'eval': {'scores': {'bleu': 9.38}, 'lists': [['a', 'c'], ['c']]}}}
  changed, added = compare(before, after)
  assert changed == ['/generate/eval/scores/bleu: 9.37 != 9.38',
                     '/generate/eval/lists[0][1]: "b" != "c"', '/generate/gone: only before']
  assert added == []
  # Lists of another length differ as a whole.
  assert compare({'x': [1, 2]}, {'x': [1]})[0] == ['/x: [1, 2] != [1]']
