"""The figures of experiments/compare_personal.sh by user history, as Markdown tables.

  python experiments/personal_table.py OUT_DIR VARIANT [VARIANT ...]

For each split (valid, then test) and each group of pairs (users with at least 5 earlier
queries; users with none): per variant, MRR@10, Recall@10 and exact match at 1 of its top-10
suggestions (every model, the trivial suggesters beside them), and for the rankers MRR and
R@1/20 over the whole pool and the mean attention mass on the zero vector. An evaluation of
the first N sessions alone (`--config.decode.max_eval_sessions=N` passed to compare_personal.sh)
is read where the whole split's is missing, and its tables say so; every variant's figures of a
split must come from the same sessions.
"""

import json
import os
import re
import sys

GROUPS = (('with_history', 'users with >= 5 earlier queries'),
          ('short_history', 'users with 1-4 earlier queries'),
          ('without_history', 'users without history'))


def _row(name, scores, pool=None, zero=None):
  ranking = scores['ranking']
  cells = [name, f'{ranking["mrr_at_10"]:.1f}', f'{ranking["recall_at_10"]:.1f}',
           f'{ranking["exact_match"]:.1f}', f'{scores["bleu"]:.2f}']
  cells += [f'{pool["mrr"]:.1f}', f'{pool.get("r1_of_20", float("nan")):.1f}'] if pool else [
      '', '']
  cells.append('' if zero is None else f'{zero["all"]:.3f} ({zero.get("next_query_shares_a_word", float("nan")):.3f} / {zero.get("next_query_shares_no_word", float("nan")):.3f})')
  return '| ' + ' | '.join(cells) + ' |'


def results_file(eval_dir: str, prefix: str) -> tuple[str, str] | None:
  """(path, sessions) of the results of `eval_dir` for the split whose files start with
  `prefix` ('valid_' or ''): the whole split's, else the one evaluation of its first N sessions
  (`evaluate.results_prefix` names it `<prefix>first<N>_results.json`); None if there is
  neither. Exits naming the files where several first-N evaluations would be equally valid."""
  whole = os.path.join(eval_dir, f'{prefix}results.json')
  if os.path.exists(whole):
    return whole, 'all sessions'
  pattern = re.compile(re.escape(prefix) + r'first(\d+)_results\.json')
  limited = sorted(n for n in (os.listdir(eval_dir) if os.path.isdir(eval_dir) else ())
                   if pattern.fullmatch(n))
  if len(limited) > 1:
    sys.exit(f'{eval_dir}: {", ".join(limited)} are evaluations of different numbers of '
             'sessions: remove all but one, or evaluate the whole split')
  if not limited:
    return None
  return (os.path.join(eval_dir, limited[0]),
          f'the first {pattern.fullmatch(limited[0]).group(1)} sessions')


def main(out_dir, variants):
  found = False
  for split, prefix in (('validation', 'valid_'), ('test', '')):
    results, sessions = {}, {}
    for variant in variants:
      held = results_file(os.path.join(out_dir, variant, 'eval'), prefix)
      if held:
        with open(held[0], encoding='utf-8') as f:
          results[variant] = json.load(f)
        sessions[variant] = held[1]
    if not results:
      continue
    if len(set(sessions.values())) > 1:
      sys.exit(f'{split} split: the variants were evaluated on different sessions ('
               + '; '.join(f'{v}: {s}' for v, s in sessions.items())
               + '): evaluate them with the same config.decode.max_eval_sessions')
    found = True
    scope = next(iter(sessions.values()))
    scope = '' if scope == 'all sessions' else f', {scope}'
    for group, title in GROUPS:
      first = next(iter(results.values()))['by_history'][group]
      if not first['pairs']:
        print(f'\n{split.capitalize()} split{scope}, {title}: no pairs.')
        continue
      print(f'\n{split.capitalize()} split{scope}, {title} ({first["pairs"]} pairs):\n')
      print('| suggester | MRR@10 | R@10 | EM@1 | BLEU | pool MRR | R@1/20 | zero-vector weight '
            '(shares a word / none) |')
      print('|---|---:|---:|---:|---:|---:|---:|---|')
      for variant, r in results.items():
        figures = r['by_history'][group]
        print(_row(f'{variant} ({r.get("label", r["model"])})', figures['scores']['model'],
                   figures.get('pool'), figures.get('zero_weight')))
      for key, label in (('repeat_previous', 'Repeat previous query'),
                         ('most_frequent_next', 'Most frequent next query')):
        print(_row(label, first['scores'][key]))


  if not found:
    sys.exit(f'no {out_dir}/VARIANT/eval/valid_results.json or results.json (nor an '
             'evaluation of the first N sessions) for the variants '
             f'{", ".join(variants)}: run experiments/compare_personal.sh first')


if __name__ == '__main__':
  if len(sys.argv) < 3 or sys.argv[1].startswith('-'):
    sys.exit(f'usage: python {sys.argv[0]} OUT_DIR VARIANT [VARIANT ...]')
  main(sys.argv[1], sys.argv[2:])
