"""Does the first suggestion's gain model (`mtn_jax.bleu_gain`) beat repeating the previous
query for users it never saw? Measured on the training split's folds of users, thousands of
contexts each, where the validation split has a few hundred.

  python launch/gain_folds.py --workdir=RUN --gain_from=G0,G1 [--seed=0]

RUN: any run on the corpus (its data/ is read); G0,G1: the generators cross-fitted over the
training users (`config.train.user_folds`), whose suggestions (cached in their workdirs) are
each fold's candidates. For every ordered pair of folds, the gain network is fitted on one
fold's contexts (the expansion point its previous-query totals) and the other's are
suggested for, for every length weight and previous-query margin the fit chooses among.
Prints corpus BLEU (METRICS.md) of repeating the previous query and of the gain's choice,
and how often that choice is the previous query.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from mtn_jax import parallel

flags.DEFINE_string('workdir', None, 'A run on the corpus (its data/ is read).')
flags.DEFINE_string('gain_from', None, 'The cross-fitted generators, comma-separated.')
flags.DEFINE_integer('seed', 0, 'Seeds the networks\' fits.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  parallel.set_cpu_devices(0)  # the checkpoints' device layout: one device per core
  import numpy as np
  from mtn_jax import bleu_gain, hypotheses
  from mtn_jax.data import preprocess, sessions

  data_dir = preprocess.data_dir(os.path.abspath(FLAGS.workdir))
  train = sessions.load_split(data_dir, 'train')
  found = hypotheses.generators(FLAGS.gain_from, data_dir)
  suggestions = hypotheses.split_suggestions(found, train)
  popularity = bleu_gain.Popularity(train)
  fold_of_session = sessions.session_folds(train, found[0].folds,
                                           found[0].config.data.split_seed)
  folds = []
  for k in range(found[0].folds):
    ids = np.flatnonzero(fold_of_session == k)
    rows = sessions.session_rows(train, ids).tolist()
    contexts, generated, references, users = bleu_gain.training_contexts(
        sessions.select_sessions(train, ids), [suggestions[r] for r in rows])
    folds.append(bleu_gain.examples(contexts, generated, references, users, popularity))
  for a, fitted in enumerate(folds):
    _, rows = bleu_gain.previous_query(fitted)
    matches, ngrams = fitted.matches[rows].sum(0), fitted.ngrams[rows].sum(0)
    net = bleu_gain.fit_net(fitted.features, fitted.matches, FLAGS.seed)
    for b, held_out in enumerate(folds):
      if b == a:
        continue
      expected = bleu_gain.predict(net, held_out.features)
      previous, repeat = bleu_gain.previous_query(held_out)
      print(f'fitted on fold {a} ({int(fitted.context[-1]) + 1:,} contexts), suggesting for '
            f'fold {b} ({int(held_out.context[-1]) + 1:,} contexts): repeating the previous '
            f'query BLEU {bleu_gain.corpus_bleu(held_out, repeat):.2f}')
      print('  length weight / margin: BLEU (previous query first)')
      for w in bleu_gain.LENGTH_WEIGHTS:
        gains = bleu_gain.gain(expected, held_out.ngrams, matches, ngrams, w)
        cells = []
        for margin in bleu_gain.PREVIOUS_MARGINS:
          chosen = bleu_gain.first_choices(gains + margin * previous, held_out.context)
          cells.append(f'{margin:g}: {bleu_gain.corpus_bleu(held_out, chosen):.2f} '
                       f'({100 * previous[chosen].mean():.0f} %)')
        print(f'  {w:g}  ' + '  '.join(cells), flush=True)


if __name__ == '__main__':
  flags.mark_flags_as_required(['workdir', 'gain_from'])
  app.run(main)
