"""The default decoding one split's users' whole log, as a check on users outside the sample
would run it: with each user's past (an AOL-format log) and without (the same contexts as
session lines), against the training log's most popular next queries (MPC).

  python experiments/decode_split_users.py --workdir=W --out=DIR [--split=test] \
      --config=configs/aol.py:small --config.data.raw_files=LOG --config.data.split_by=user

In: a trained workdir (its learned ranker for `aol.py:small`'s default) and its raw log (by
default the one its corpus was built from). Every line of the split's users in
`config.data.raw_files` (the header kept) is written to DIR/users.tsv and decoded under the
user-facing protocol (`--mode=decode`: suggestions after every query, each user's earlier
sessions in the file their past); every point with a next query is written again as a session
line (DIR/contexts.txt) and decoded without users. Out: a Markdown table on stdout of EM@1, R@10
and MRR@10 (%) over the points whose next query is not a query of the session, with the machine
and the date; the decodes in DIR.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import flags
from ml_collections import config_flags

from launch import bench_report
from mtn_jax.data import aol_log
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.inference import popular
from mtn_jax.inference import suggest
# pylint: enable=wrong-import-position

SHOWN = 10


def write_users_log(raw_files: str, users: set[int], path: str) -> int:
  """The lines of `users` in the logs of `raw_files` (one header first) to `path`; returns
  how many."""
  kept = 0
  with open(path, 'w', encoding='utf-8') as out:
    out.write('AnonID\tQuery\tQueryTime\tItemRank\tClickURL\n')
    for name in aol_log.expand_paths(raw_files):
      opener = gzip.open if name.endswith('.gz') else open
      with opener(name, 'rt', encoding='utf-8', errors='replace') as f:
        for line in f:
          user = line.split('\t', 1)[0]
          if user.isdigit() and int(user) in users:
            out.write(line if line.endswith('\n') else line + '\n')
            kept += 1
  return kept


def decoded(config, workdir: str, source: str, output: str) -> list[dict]:
  variant = config.copy_and_resolve_references()
  variant.decode.input, variant.decode.output = source, output
  variant.decode.exclude_session_queries = True
  suggest.decode_file(variant, workdir)
  with open(output, encoding='utf-8') as f:
    return [json.loads(line) for line in f]


def scores(lists, references, contexts) -> tuple[int, float, float, float]:
  """(points, EM@1, R@10, MRR@10 %) over the points whose next query the session lacks (the
  user-facing protocol never suggests it), as evaluation scores them."""
  kept = [i for i, (reference, context) in enumerate(zip(references, contexts))
          if reference not in context]
  score = metrics.suggestion_ranking([lists[i][:SHOWN] for i in kept],
                                     [references[i] for i in kept], [contexts[i] for i in kept])
  return len(kept), score.exact_match, score.recall_at_10, score.mrr_at_10


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--split', default='test', choices=sessions.SPLITS)
  args, rest = parser.parse_known_args()
  config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
  flags.FLAGS([sys.argv[0], *rest])
  config = flags.FLAGS.config
  workdir = os.path.abspath(args.workdir)
  try:
    split = sessions.load_split(preprocess.data_dir(workdir), args.split)
  except FileNotFoundError as e:
    sys.exit(str(e))
  # The log the corpus was built from, where the command line names none.
  raw_files = config.data.raw_files or (preprocess.corpus_settings(workdir) or {}).get(
      'raw_files', '')
  if not raw_files:
    sys.exit(f'{args.workdir}: its corpus records no log: pass --config.data.raw_files=LOG')
  os.makedirs(args.out, exist_ok=True)
  users = set(split.users.tolist())
  lines = write_users_log(raw_files, users, os.path.join(args.out, 'users.tsv'))
  with_past = [r for r in decoded(config, workdir, os.path.join(args.out, 'users.tsv'),
                                  os.path.join(args.out, 'with_past.jsonl'))
               if r['reference'] is not None]
  with open(os.path.join(args.out, 'contexts.txt'), 'w', encoding='utf-8') as f:
    f.writelines('\t'.join(r['context']) + '\n' for r in with_past)
  without = decoded(config, workdir, os.path.join(args.out, 'contexts.txt'),
                    os.path.join(args.out, 'no_past.jsonl'))
  contexts = [r['context'] for r in with_past]
  if [r['context'] for r in without] != contexts:
    sys.exit('the session lines were not read back as the log\'s contexts')
  references = [r['reference'] for r in with_past]
  counts = popular.LogCounts.of_workdir(workdir)
  rows = {
      'the default, the user\'s past from the log': [[s['query'] for s in r['suggestions']]
                                                      for r in with_past],
      'the default, session lines (no past)': [[s['query'] for s in r['suggestions']]
                                               for r in without],
      'MPC (the training log\'s most popular next queries)': [
          [q for q in counts.most_popular(SHOWN + len(c)) if q not in c][:SHOWN]
          for c in contexts]}
  print(f'# {bench_report.now()}; {bench_report.machine_line(bench_report.machine(False))}')
  print(f'{args.workdir}, the {args.split} split\'s {len(users)} users: {lines:,} log lines, '
        f'{len(contexts):,} points with a next query.\n')
  print('| suggester | points | EM@1 | R@10 | MRR@10 |\n|---|---:|---:|---:|---:|')
  for name, lists in rows.items():
    points, first, found, reciprocal = scores(lists, references, contexts)
    print(f'| {name} | {points:,} | {first:.2f} | {found:.2f} | {reciprocal:.2f} |')


if __name__ == '__main__':
  main()
