"""experiments/golden_outputs.py's comparison: a changed value or a lost one fails it, a figure
added since does not."""

from tests import golden


def test_changes_and_losses_are_told_apart_from_additions():
  compare = golden.golden_outputs().compare
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
  # Floats within a relative tolerance are the same; other values never are.
  assert compare({'x': [1.0, 'a']}, {'x': [1.0 + 1e-7, 'a']}, rel_tol=1e-6) == ([], [])
  assert compare({'x': [1.0]}, {'x': [1.0 + 1e-5]}, rel_tol=1e-6)[0] == [
      '/x[0]: 1.0 != 1.00001']
  assert compare({'x': 1.0}, {'x': 1.0 + 1e-7})[0] == ['/x: 1.0 != 1.0000001']
