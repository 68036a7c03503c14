"""How good a first suggestion 'rerank' could pick: top-1 BLEU of the ranker's choice beside
choices made knowing the logged next query, among the pooled candidates.

  python experiments/rerank_oracle.py --config=configs/aol.py:small --workdir=GENERATOR \
      --config.data.raw_files=LOG --config.data.split_by=user \
      --config.suggest.strategy=rerank --config.suggest.ranker_workdir=RANKER \
      [--config.suggest.retrieved=0] [--config.decode.eval_split=valid]

Prints corpus BLEU (mtn_jax/evaluation/metrics.py) of: the ranker's first choice; repeating the previous query;
and the best candidate by sentence BLEU against the next query (an oracle, an upper bound no
suggester reaches) among all pooled candidates, the session's queries, the beam, and the
two-way choices "previous query or the beam's first" and "previous query or the ranker's
first".
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from ml_collections import config_flags

from mtn_jax import parallel

config_flags.DEFINE_config_file('config', None, 'The generator\'s config (path[:variant]).')
flags.DEFINE_string('workdir', None, 'The trained generator.')
FLAGS = flags.FLAGS


def main(argv):
  del argv
  parallel.set_cpu_devices(0)  # the checkpoints' device layout: one device per core
  import numpy as np
  from mtn_jax.data import preprocess
  from mtn_jax.data import sessions
  from mtn_jax.decoding import mbr
  from mtn_jax.evaluation import evaluate
  from mtn_jax.evaluation import metrics
  from mtn_jax.inference import pipeline

  config = FLAGS.config
  if config.suggest.strategy != 'rerank':
    sys.exit('the study reads the candidates \'rerank\' pools: pass '
             '--config.suggest.strategy=rerank --config.suggest.ranker_workdir=RANKER')
  from mtn_jax import config_lib
  try:
    config_lib.validate(config, 'eval')
  except config_lib.ConfigError as e:
    sys.exit(str(e))
  split = sessions.load_split(preprocess.data_dir(os.path.abspath(FLAGS.workdir)),
                              config.decode.eval_split)
  quiet = lambda *args, **kwargs: None
  suggestions = pipeline.Pipeline.load(config, FLAGS.workdir, log=quiet)
  queries_per_batch = config.decode.batch_sessions * config.data.max_session_queries

  pool = evaluate.ranked_pool(suggestions, split, config, queries_per_batch, quiet)
  split_lists = suggestions.split_lists(
      split, queries_per_batch=queries_per_batch,
      retrieved=None if pool is None else (pool.suggestions, pool.top_scores), log=quiet)
  lists = {'model': [[c['query'] for c in ranked] for ranked in split_lists.ordered],
           **split_lists.sources}
  label = evaluate.strategy_record(suggestions)['label']
  previous, references = split.pair_texts()
  session, position = split.pair_positions()
  contexts = [split.session_texts(i)[:t + 1] for i, t in zip(session.tolist(),
                                                             position.tolist())]
  pooled = lists['model']

  def oracle(candidate_lists):
    return [max(c, key=lambda q: mbr.sentence_bleu(q.split(), r.split())) if c else ''
            for c, r in zip(candidate_lists, references)]

  rows = {
      'the ranker\'s first choice': [c[0] for c in pooled],
      'repeat the previous query': previous,
      'oracle: any pooled candidate': oracle(pooled),
      'oracle: a query of the session': oracle(contexts),
      'oracle: a beam hypothesis': oracle(lists['generate']),
      'oracle: the previous query or the beam\'s first': oracle(
          [[p] + g[:1] for p, g in zip(previous, lists['generate'])]),
      'oracle: the previous query or the ranker\'s first': oracle(
          [[p, c[0]] for p, c in zip(previous, pooled)]),
  }
  print(f'{label}; {config.decode.eval_split}, {len(references)} pairs')
  for name, firsts in rows.items():
    print(f'  {name:<50} BLEU {metrics.bleu(firsts, references).bleu:6.2f}')
  share = np.mean([c[0] == p for c, p in zip(pooled, previous)])
  print(f'  the ranker\'s first choice is the previous query for {100 * share:.1f} % of pairs')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  app.run(main)
