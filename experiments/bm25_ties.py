"""IMDNA's BM25-alone figures on the generated movie tasks, with tied candidates ordered by
the lower id (`mtn_jax/data/top_k.py`, the code's) and by numpy's argpartition (the code before
ce241da, whose order of ties depends on the CPU); and, free of any tie order, the Recs hits
among the movies the retrieved documents hold. docs/RESULTS.md, "Iterative multi-document
neural attention".

  python experiments/bm25_ties.py [--workdir=/tmp/bm25_ties]
"""

from __future__ import annotations

import os
import sys

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from configs import imdna_movies
from mtn_jax.data import imdna_library
from mtn_jax.data import top_k
from mtn_jax.evaluation import answer_hits
# pylint: enable=wrong-import-position

_WORKDIR = flags.DEFINE_string('workdir', '/tmp/bm25_ties', 'where the tasks\' data are built')


def argpartition_order(scores: np.ndarray, k: int) -> np.ndarray:
  """The ranking before ce241da: the k best by argpartition, then sorted (ties by id)."""
  k = min(k, scores.shape[1])
  top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  order = np.lexsort((top, -np.take_along_axis(scores, top, 1)), axis=1)
  return np.take_along_axis(top, order, 1)


def main(argv):
  del argv
  depth = max(answer_hits.HITS_AT)
  for variant, figure in (('qa', 'hits_at_1'), ('recs', 'hits_at_100')):
    config = imdna_movies.get_config(variant)
    library = imdna_library.load_library(config, os.path.join(_WORKDIR.value, variant))
    for split in ('valid', 'test'):
      questions = library.splits[split]
      scores = answer_hits.bm25_answer_scores(library, questions,
                                                   exclude_question_words=True)
      ranked = top_k.best_first_rows(scores, depth)
      lower_id = answer_hits.hits_at(ranked, questions.answers)[figure]
      numpy = answer_hits.hits_at(argpartition_order(scores, depth),
                                       questions.answers)[figure]
      # The same figure counting a hit only where a retrieved document held the answer (its
      # score above 0): no tie order in it.
      k = int(figure.rsplit('_', 1)[1])
      top = ranked[:, :k]
      held = np.take_along_axis(scores, top, 1) > 0
      answers = questions.answers[:, None, :]
      found = ((top[:, :, None] == answers) & (answers >= 0) & held[:, :, None]).any((1, 2))
      print(f'{variant} {split} {figure}: ties to the lower id {lower_id:.1f}, numpy\'s '
            f'argpartition on this CPU {numpy:.1f}, only answers a document held '
            f'{100 * found.mean():.1f} ({(scores > 0).sum(1).mean():.1f} of '
            f'{scores.shape[1]:,} candidates held per question)')


if __name__ == '__main__':
  app.run(main)
