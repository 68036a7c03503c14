"""experiments/personal_table.py: the figures by user history, from whole or limited evals."""

from __future__ import annotations

import json
import os

import pytest

from experiments import personal_table


def scores(mrr: float) -> dict:
  return {'ranking': {'mrr_at_10': mrr, 'recall_at_10': 2 * mrr, 'exact_match': mrr / 2},
          'bleu': 1.0}


def write_results(out_dir, variant: str, name: str, mrr: float) -> None:
  figures = {'pairs': 3, 'scores': {'model': scores(mrr), 'repeat_previous': scores(0.0),
                                    'most_frequent_next': scores(0.5)}}
  record = {'model': variant, 'by_history': {group: figures
                                             for group, _ in personal_table.GROUPS}}
  os.makedirs(out_dir / variant / 'eval', exist_ok=True)
  (out_dir / variant / 'eval' / name).write_text(json.dumps(record), encoding='utf-8')


def test_reads_an_eval_of_the_first_sessions_and_says_so(tmp_path, capsys):
  write_results(tmp_path, 'qem', 'valid_first20_results.json', 4.0)
  write_results(tmp_path, 'zam', 'valid_first20_results.json', 6.0)
  personal_table.main(str(tmp_path), ['qem', 'zam'])
  out = capsys.readouterr().out
  assert 'Validation split, the first 20 sessions, users without history (3 pairs)' in out
  assert '| qem (qem) | 4.0 | 8.0 | 2.0 | 1.00 |' in out
  assert '| zam (zam) | 6.0 | 12.0 | 3.0 | 1.00 |' in out
  assert 'Test split' not in out


def test_the_whole_split_is_read_before_a_limited_eval(tmp_path, capsys):
  write_results(tmp_path, 'qem', 'results.json', 4.0)
  write_results(tmp_path, 'qem', 'first20_results.json', 9.0)
  personal_table.main(str(tmp_path), ['qem'])
  out = capsys.readouterr().out
  assert 'Test split, users without history (3 pairs)' in out
  assert '| qem (qem) | 4.0 |' in out and '9.0' not in out


def test_variants_evaluated_on_other_sessions_are_refused(tmp_path):
  write_results(tmp_path, 'qem', 'valid_results.json', 4.0)
  write_results(tmp_path, 'zam', 'valid_first20_results.json', 6.0)
  with pytest.raises(SystemExit, match=r'qem: all sessions; zam: the first 20 sessions'):
    personal_table.main(str(tmp_path), ['qem', 'zam'])


def test_two_limited_evals_of_one_variant_are_refused(tmp_path):
  write_results(tmp_path, 'qem', 'valid_first20_results.json', 4.0)
  write_results(tmp_path, 'qem', 'valid_first50_results.json', 4.0)
  with pytest.raises(SystemExit, match='valid_first20_results.json, valid_first50_results.json'):
    personal_table.main(str(tmp_path), ['qem'])
