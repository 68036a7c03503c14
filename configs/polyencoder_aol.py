"""Bi-, Poly- and Cross-encoders (Humeau et al., ICLR 2020) ranking AOL's logged queries.

  --config=configs/polyencoder_aol.py[:small]  --config.data.raw_files=LOG   Poly-encoder 16
  --config=configs/polyencoder_aol.py:poly64 | :poly360                      more codes
  --config=configs/polyencoder_aol.py:bi                                     Bi-encoder
  --config=configs/polyencoder_aol.py:cross                                  Cross-encoder
  --config=configs/polyencoder_aol.py:demo | :demo_bi | :demo_cross          the demo log

Trained for reranking (docs/notes/2026-11-25-candidate-rankers.md, "Rankers trained for reranking"):
  --config.model.session_candidates=True   the session's queries as candidates, targets graded
                                           by n-gram overlap with the next query
  --config.model.lexical_negatives=K       K BM25-nearest pool entries as hard negatives
  --config.train.hypotheses_from=G0,G1     the suggestions of generators trained without
                                           each fold of the users (configs/aol.py:small with
                                           --config.train.user_folds=2
                                           --config.train.held_out_fold=0, then 1)

Every AOL variant has the size of `configs/aol.py:small` (d_model 128, 4 heads, feed-forward
256; 2 context-encoder layers, 2 candidate-encoder layers) and reads the same corpus as the
generative models (`config.data` is the default's: session split, 5-query sessions), so the
figures compare with theirs (docs/RESULTS.md). Candidates are the training split's distinct
queries (`mtn_jax.data.candidate_pool`).

The demo variants are smaller, to train in a minute or two on a CPU: the generated demo log
of 600 users (words seen twice), d_model 32, 2 heads, feed-forward 64, the same 2 + 2
layers, 4 Poly-encoder codes, 3 epochs (the Cross-encoder: 60 steps); the Bi- and
Poly-encoders score with `config.model.scaled_scores` (y_ctx . y_cand / sqrt(d)), without
which these encoders, trained from scratch, collapsed to one candidate vector and learned
nothing (docs/notes/2026-11-26-demo-rankers.md).
"""

from configs import default

_VARIANTS = {'': ('polyencoder', 16), 'small': ('polyencoder', 16),
             'poly64': ('polyencoder', 64), 'poly360': ('polyencoder', 360),
             'bi': ('biencoder', 16), 'cross': ('crossencoder', 16),
             'demo': ('polyencoder', 16), 'demo_bi': ('biencoder', 16),
             'demo_cross': ('crossencoder', 16)}


def get_config(variant: str = ''):
  if variant not in _VARIANTS:
    raise ValueError(f'configs/polyencoder_aol.py: unknown variant {variant!r} (expected one '
                     'of ' + ', '.join(repr(v) for v in _VARIANTS) + ')')
  name, poly_codes = _VARIANTS[variant]
  c = default.get_config(name)
  c.model.poly_codes = poly_codes
  c.model.emb_dim = 128
  c.model.d_model = 128
  c.model.num_heads = 4
  c.model.ff_dim = 256
  c.model.query_layers = 2
  c.model.session_layers = 1
  # 'flat' over 'mtn': on the sample's validation split the flat context (every word of the
  # session so far) ranks better (docs/notes/2026-11-25-candidate-rankers.md, "Rankers
  # trained for reranking").
  c.model.context_encoder = 'flat'
  c.model.cross_negatives = 15
  c.train.num_epochs = 10
  c.train.warmup_steps = 200
  c.train.learning_rate = 0.25  # peak 1.6e-3 at d_model 128, as configs/aol.py:small
  c.train.log_every_steps = 20
  c.train.checkpoint_every_steps = 200
  # ~400 contexts per batch: each meets ~400 in-batch negatives (the paper's 511 was best).
  c.input.train_queries_per_batch = 512
  c.input.eval_queries_per_batch = 512
  c.decode.top_k = 10
  c.decode.beam_size = 10  # read by generative models only
  c.decode.batch_sessions = 64
  if c.model.name == 'crossencoder':
    # Every (context, candidate) pair is encoded jointly: 16 pairs per context.
    c.input.train_queries_per_batch = 128
    c.input.eval_queries_per_batch = 128
    c.train.num_epochs = 3
    c.decode.batch_sessions = 16
  if variant.startswith('demo'):
    c.data.source = 'demo'
    c.data.demo_users = 600
    c.data.min_word_count = 2
    c.model.emb_dim = c.model.d_model = 32
    c.model.num_heads = 2
    c.model.ff_dim = 64
    if c.model.name == 'polyencoder':
      c.model.poly_codes = 4
    c.train.num_epochs = 3
    c.train.warmup_steps = 50
    c.train.learning_rate = 0.5  # peak 1.25e-2 at step 50, at d_model 32
    # With the paper's plain dot product the scores of these fresh encoders start spread by
    # several units, and the optimiser's way down was to give every candidate the same
    # vector: chance loss, and the same few suggestions for every session. Lower rates only
    # made the collapse and the way out of it slower (docs/notes/2026-11-26-demo-rankers.md).
    # The Cross-encoder's score is a learned layer's output, which needs no scaling.
    c.model.scaled_scores = c.model.name != 'crossencoder'
    if c.model.name == 'crossencoder':
      # 16 (context, candidate) pairs encoded jointly per context make 3 epochs too long for
      # a demo; 60 steps (half an epoch) already rank the next query well above chance
      # (docs/notes/2026-11-26-demo-rankers.md).
      c.train.max_steps = 60
  return c
