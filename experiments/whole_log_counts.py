"""Would well-formedness read better from every query of the training users?

  python experiments/whole_log_counts.py --workdir=W --labels=L --judgments=J1.json,J2.json \
      [config flags: the log, --config.data.raw_files]

`presentation.well_formed` reads the word pairs of the training split's next queries: those
of the sessions that preprocessing keeps (3 to 5 queries). The raw log holds the training
users' other queries too (sessions of any length). This study counts every query of the
workdir's training users, shows each rated context of `experiments/candidate_labels.py` (L)
with `presentation.presented` under either counts (what a pool was ranked stays), and
scores both top 5s with the judges' labels (an unjudged candidate counts as neither: a lower
bound on both shares). It also counts the contexts whose previous query some logged query
holds whole, with more words ("ebay" -> "ebay motors"), under either counts.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from absl import flags
from ml_collections import config_flags

from mtn_jax.data import aol_log
from mtn_jax.data import preprocess
from mtn_jax.inference import popular
from mtn_jax.inference import presentation
import candidate_labels  # experiments/candidate_labels.py, beside this script
# pylint: enable=wrong-import-position

SHOWN = 5


def whole_log_counts(counts: popular.LogCounts, raw_files: str, users: set[int]
                     ) -> popular.LogCounts:
  """`counts` with its queries and word pairs counted over every query of `users` in the
  raw log (cleaned as preprocessing cleans them); popularity and the pairs stay."""
  records = aol_log.read_logs(aol_log.expand_paths(raw_files)).records
  rows = np.flatnonzero(np.isin(records.user, np.fromiter(users, np.int64)))
  issued = collections.Counter(' '.join(t.split()) for t in records.texts(rows))
  out = copy.copy(counts)
  out.issued = issued
  out.bigrams, out.bigram_starts = collections.Counter(), collections.Counter()
  for text, n in issued.items():
    for pair in popular.word_bigrams(text):
      out.bigrams[pair] += n
      out.bigram_starts[pair[0]] += n
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--labels', required=True, help="candidate_labels.py's --out folder")
  parser.add_argument('--judgments', required=True, help='comma-separated JSON files')
  args, rest = parser.parse_known_args()
  config_flags.DEFINE_config_file('config', 'configs/aol.py:small')
  flags.FLAGS([sys.argv[0], *rest])
  config = flags.FLAGS.config
  record, labels = candidate_labels.read_labels(args.labels, args.judgments)
  data_dir = preprocess.data_dir(os.path.abspath(args.workdir))
  users = set(np.load(os.path.join(data_dir, 'train.users.npy')).tolist())
  sessions_only = popular.LogCounts.of_workdir(args.workdir)
  whole = whole_log_counts(sessions_only, config.data.raw_files, users)
  print(f'{len(users)} training users: {sum(whole.issued.values()):,} queries in the raw log, '
        f'{sessions_only.pairs:,} next queries in their kept sessions')
  print('| counts | judge | useful % | garbled % | lists with >= 2 useful % | unjudged % | '
        'previous queries held whole by a longer logged one |\n|---|---|---:|---:|---:|---:|---:|')
  for name, counts in (('the kept sessions\' next queries', sessions_only),
                       ('every query of the training users', whole)):
    held = sum(any(set(c[-1].split()) < set(q.split()) for q in counts.issued)
               for c in record['contexts'])
    for j in range(len(args.judgments.split(','))):
      useful = garbled = two = unjudged = 0
      for so_far, entry, at in zip(record['contexts'], record['candidates'], labels):
        ranked = [{'query': c['query'], 'sources': c['sources']} for c in entry['pool']]
        shown = presentation.presented(ranked, so_far, counts, session_first=SHOWN,
                                       unrelated_first=config.suggest.unrelated_first,
                                       attested_only=config.suggest.attested_only)[:SHOWN]
        got = [at[c['query']][j] if c['query'] in at else '?' for c in shown]
        useful += got.count('U')
        garbled += got.count('G')
        unjudged += got.count('?')
        two += got.count('U') >= 2
      total = SHOWN * len(record['contexts'])
      print(f'| {name} | {j + 1} | {100 * useful / total:.1f} | {100 * garbled / total:.1f} | '
            f'{100 * two / len(record["contexts"]):.1f} | {100 * unjudged / total:.1f} | '
            f'{held} of {len(record["contexts"])} |')


if __name__ == '__main__':
  main()
