"""Does the model gain on the most-popular list as the training log grows? A learning curve
for users never seen in training, under the user-facing protocol.

  python experiments/learning_curve.py --workdirs=W100,W200,WALL \
      --figure=docs/learning_curve_unseen_users.png

In: workdirs of `configs/aol.py:small` with `config.data.split_by='user'`, each trained on
some of the training users (`config.data.train_users`; the validation and test users are the
same in all) by `--mode=train` (the generator, its fold generators and the learned ranker),
each evaluated on test with each strategy (`--mode=eval --config.suggest.strategy=S`):
'learned' (eval/learned_results.json), 'blend' (eval/blend_results.json) and 'generate'
(eval/results.json: MTN alone, and beside it the most popular next queries, MPC).
Out: a table (stdout) of R@10 and MRR@10 (user-facing, %) per number of training users, and
the figure (matplotlib, PNG).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.training import checkpoints
# pylint: enable=g-import-not-at-top,wrong-import-position

# (label, results file, suggester key in its 'scores_excluding_session')
CURVES = (('learned ranker (the default)', 'learned_results.json', 'model'),
          ('MTN + copy alone', 'results.json', 'model'),
          ('MPC (most popular next queries)', 'results.json', 'most_popular'),
          ('blend (config.suggest.blend)', 'blend_results.json', 'model'))


def training_users(workdir: str) -> int:
  split = sessions.load_split(preprocess.data_dir(os.path.abspath(workdir)), 'train')
  return len(np.unique(split.users))


# The strategy each results file is read for: a workdir without a learned ranker evaluates
# 'learned' by the blend (its results say so), which is no point of the learned curve.
STRATEGIES = {'learned_results.json': 'learned', 'blend_results.json': 'blend',
              'results.json': 'generate'}


def ranking(workdir: str, results: str, key: str) -> dict:
  """The user-facing ranking figures of `key` in `workdir`'s eval/`results`; exits naming
  the file where it is missing, another strategy's, or of part of the split."""
  path = os.path.join(workdir, 'eval', results)
  strategy = STRATEGIES[results]
  again = (f'python -m mtn_jax.main ... --workdir={workdir} --mode=eval '
           f'--config.suggest.strategy={strategy}')
  if not os.path.exists(path):
    # An eval of part of the split (config.decode.max_eval_sessions) names its file so.
    prefix = results[:-len('results.json')]
    partial = sorted(n for n in os.listdir(os.path.dirname(path))
                     if n.startswith(prefix + 'first') and n.endswith('_results.json')
                     ) if os.path.isdir(os.path.dirname(path)) else []
    held = (f' ({", ".join(partial)}: part of the split, config.decode.max_eval_sessions)'
            if partial else '')
    sys.exit(f'{path}: missing{held}; make it with {again}')
  with open(path, encoding='utf-8') as f:
    record = json.load(f)
  used = record.get('strategy', {}).get('strategy', 'generate')
  if used != strategy:
    sys.exit(f'{path}: the {used!r} strategy\'s lists, not {strategy!r}\'s (a workdir without '
             'a learned ranker is evaluated by the blend): train its ranker (--mode=train)')
  best = checkpoints.named_best_step(workdir)
  if best is not None and record.get('step') != best:
    sys.exit(f'{path}: written for step {record.get("step")}; the best checkpoint is now step '
             f'{best}: evaluate it again, {again}')
  if record.get('sessions', 0) < record.get('sessions_total', 0):
    sys.exit(f'{path}: {record["sessions"]:,} of the split\'s {record["sessions_total"]:,} '
             f'sessions (config.decode.max_eval_sessions): evaluate the whole split, {again}')
  return record['scores_excluding_session'][key]['ranking']


def main() -> None:
  parser = argparse.ArgumentParser(description=' '.join(__doc__.split('\n\n')[0].split()))
  parser.add_argument('--workdirs', required=True, help='comma-separated, fewest users first')
  parser.add_argument('--figure', required=True, help='the PNG to write')
  args = parser.parse_args()
  workdirs = [w for w in args.workdirs.split(',') if w]
  if not workdirs:
    parser.error('--workdirs names no workdir')
  for workdir in workdirs:
    if not os.path.isdir(preprocess.data_dir(os.path.abspath(workdir))):
      parser.error(f'--workdirs: {workdir} holds no corpus (data/): a trained workdir')
  folder = os.path.dirname(os.path.abspath(args.figure))
  if not os.path.isdir(folder):
    parser.error(f'--figure: no folder {folder}')
  users = [training_users(w) for w in workdirs]
  figures = {label: [ranking(w, results, key) for w in workdirs]
             for label, results, key in CURVES}
  print('| training users | ' + ' | '.join(f'{label} R@10 / MRR@10' for label, _, _ in CURVES)
        + ' |')
  print('|---:|' + '---:|' * len(CURVES))
  for i, n in enumerate(users):
    print(f'| {n} | ' + ' | '.join(
        f'{figures[label][i]["recall_at_10"]:.2f} / {figures[label][i]["mrr_at_10"]:.2f}'
        for label, _, _ in CURVES) + ' |')
  pairs = ranking(workdirs[0], 'results.json', 'model')['pairs']
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
  for ax, metric, title in zip(axes, ('recall_at_10', 'mrr_at_10'), ('R@10 (%)', 'MRR@10 (%)')):
    for label, _, _ in CURVES:
      ax.plot(users, [f[metric] for f in figures[label]], marker='o', label=label)
    ax.set_xlabel('training users')
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f'Unseen users, user-facing protocol (test split, {pairs} pairs)', fontsize=10)
  fig.tight_layout()
  fig.savefig(args.figure, dpi=120)
  print(f'wrote {args.figure}')


if __name__ == '__main__':
  main()
