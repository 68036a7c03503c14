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


def test_an_absolute_tolerance_for_a_key_and_skipped_paths():
  """What the ranker families' comparisons rely on (golden.assert_unchanged_since_the_move):
  their scores within RANKER_SCORE_ROUNDING, and RETIRED_FIGURES not compared."""
  compare = golden.golden_outputs().compare
  tolerance = {'score': 1e-4}

  def lists(score, bleu=9.0):
    return {'x': {'lists': [[{'query': 'a', 'score': score}]], 'bleu': bleu}}

  # Within 1e-4 of each other, 'score's are the same, whatever rel_tol says; beyond it not.
  assert compare(lists(0.5), lists(0.50009), abs_tol=tolerance) == ([], [])
  assert compare(lists(0.5), lists(0.50009), rel_tol=1e-9, abs_tol=tolerance) == ([], [])
  assert compare(lists(0.5), lists(0.5002), rel_tol=0.5, abs_tol=tolerance)[0] == [
      '/x/lists[0][0]/score: 0.5 != 0.5002']
  # The tolerance is the key's only: another figure as close differs.
  assert compare(lists(0.5, 9.0), lists(0.5, 9.00009), abs_tol=tolerance)[0] == [
      '/x/bleu: 9.0 != 9.00009']
  # Skipped: any path that ends with one of `skip`, and only those.
  before = {'rerank': {'eval': {'ranking': {'recall_at_10': 0.5, 'mrr': 0.25}},
                       'recall_at_10': 0.5}}
  after = {'rerank': {'eval': {'ranking': {'recall_at_10': 0.75, 'mrr': 0.25}},
                      'recall_at_10': 0.75}}
  assert compare(before, after, skip=golden.RETIRED_FIGURES)[0] == [
      '/rerank/recall_at_10: 0.5 != 0.75']
  assert compare(before, after)[0] == ['/rerank/eval/ranking/recall_at_10: 0.5 != 0.75',
                                       '/rerank/recall_at_10: 0.5 != 0.75']
