"""Does a wider candidate pool, with features of how the log's next queries follow a session's
words, rank the next query higher for unseen users?

  python experiments/wider_pool.py --workdir=W [--wide=SOURCES] [config flags: the log]

The learned ranker's R@10 sits near its pool's candidate recall (the next query among the
candidates at all): the pool bounds it. This study widens the pool (`--wide`, by default the
100 most popular, 30 co-occurring and 50 template candidates) and adds five features that
the default's do not hold, counted from the same users' log as the other counts: for a
candidate c and a word w, how often c was the next query after a query holding w, and how
often c came later in a session holding w. Per candidate: the largest lift over c's own
frequency, the largest count, and the summed count over the previous query's words; the
largest lift and count over the session's words.

Cross-fitted as experiments/learned_ranker.py (the fold generators, a ranker trained on the
other fold's users), user-facing protocol; per pool: the ranker without and with these
features, alone and as shown (`presentation.presented`); for the wide pool also with the
generator's teacher-forced features only for the default pool's candidates (what a request
would cost about what it costs now). Prints EM@1 / R@10 / MRR@10 (%). The wide pool's
candidates take a few minutes to make (they are kept in <workdir>/ranker/wide/).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position

from mtn_jax.inference import learned
from mtn_jax.inference import learned_training
import learned_ranker  # experiments/learned_ranker.py, beside this script
# pylint: enable=wrong-import-position

ASSOCIATION = ['after_word_lift', 'after_word_max', 'after_word_sum', 'later_word_lift',
               'later_word_max']


class Association:
  """How often each next query followed a query holding a word, and came later in a session
  holding it, in `session_texts`."""

  def __init__(self, session_texts):
    self.after = collections.defaultdict(collections.Counter)
    self.later = collections.defaultdict(collections.Counter)
    self.after_uses, self.later_uses = collections.Counter(), collections.Counter()
    self.issued, self.pairs = collections.Counter(), 0
    for s in session_texts:
      for t in range(1, len(s)):
        for w in set(s[t - 1].split()):
          self.after[w][s[t]] += 1
          self.after_uses[w] += 1
        for w in set(' '.join(s[:t]).split()):
          self.later[w][s[t]] += 1
          self.later_uses[w] += 1
        self.issued[s[t]] += 1
        self.pairs += 1

  def features(self, texts, so_far) -> np.ndarray:
    """float32 [len(texts), 5] (`ASSOCIATION`); no evidence: lift -10, counts 0."""
    previous, session = set(so_far[-1].split()), set(' '.join(so_far).split())
    rows = []
    for c in texts:
      prior = (self.issued.get(c, 0) + 0.5) / (self.pairs + 1)
      row = []
      for table, uses, words in ((self.after, self.after_uses, previous),
                                 (self.later, self.later_uses, session)):
        counts = {w: table[w][c] for w in words if w in table and c in table[w]}
        lift = max((math.log(n / (uses[w] + 1) / prior) for w, n in counts.items()),
                   default=-10.0)
        row += [lift, math.log1p(max(counts.values(), default=0))]
        if table is self.after:
          row.append(math.log1p(sum(counts.values())))
      rows.append(row)
    return np.asarray(rows, np.float32).reshape(len(texts), len(ASSOCIATION))


def with_features(groups: learned_training.Groups, extra: np.ndarray) -> learned_training.Groups:
  """`groups` with the columns `extra` after its features (a new array)."""
  return dataclasses.replace(groups, features=np.concatenate([groups.features, extra], 1))


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--wide', default='generate:10,popular:100,cooccurring:30,templates:50')
  args, config = learned_ranker.study_config('wider_pool', parser)
  default_plan = learned.parse_sources(config.suggest.sources)
  others = learned_ranker.other_folds_sessions(config, args.workdir)
  association = [Association(sessions_of_others) for sessions_of_others in others]
  counts = learned_ranker.fold_counts(others)
  rules = learned_ranker.presentations(config)
  print('| pool (candidate recall) | features | ranker | EM@1 | R@10 | MRR@10 |\n'
        '|---|---|---|---:|---:|---:|')
  for sources, folder in ((config.suggest.sources, learned.ranker_dir(args.workdir)),
                          (args.wide, os.path.join(learned.ranker_dir(args.workdir), 'wide'))):
    config.suggest.sources = sources
    plan = learned.parse_sources(sources)
    groups = learned_training.cached_groups(config, args.workdir, folder)
    names = learned.feature_names([n for n, _ in plan])
    ends = np.cumsum(groups.sizes)
    starts = ends - groups.sizes
    extra = np.zeros((len(groups.labels), len(ASSOCIATION)), np.float32)
    in_default = np.zeros(len(groups.labels), bool)
    for g in np.flatnonzero(groups.sizes).tolist():
      extra[starts[g]:ends[g]] = association[groups.folds[g]].features(groups.texts[g],
                                                                        groups.sessions[g])
      default = {q for n, k in default_plan for q in groups.lists[g].get(n, [])[:k]}
      in_default[starts[g]:ends[g]] = [t in default for t in groups.texts[g]]
    variants = {'the default': (groups, names),
                '+ association': (with_features(groups, extra), names + ASSOCIATION)}
    if sources == args.wide:
      forced = with_features(groups, extra)
      forced.features[np.ix_(~in_default, [names.index('generator_log_prob'),
                                           names.index('generator_token_log_prob')])] = np.nan
      variants['+ association, generator only on the default pool'] = (
          forced, names + ASSOCIATION)
    recall = 100 * np.mean([r in t for r, t in zip(groups.references, groups.texts)])
    for label, (data, data_names) in variants.items():
      scores = learned_ranker.cross_fitted_scores(data, config, data_names)
      for rule, settings in rules.items():
        row = learned_ranker.ranking(
            learned_ranker.presented_lists(data, scores, counts, **settings), data.references,
            data.sessions)
        print(f'| {sources} ({recall:.2f}) | {label} | {rule} | {row["em1"]:.2f} | '
              f'{row["r10"]:.2f} | {row["mrr10"]:.2f} |', flush=True)


if __name__ == '__main__':
  main()
