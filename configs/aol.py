"""MTN on AOL (paper Sec. 5.2): `--config=configs/aol.py` or `--config=configs/aol.py:small`.

Pass the log with `--config.data.raw_files=PATH_OR_GLOB` (the AOL collection's
user-ct-test-collection-*.txt(.gz) files, or any log in that format).

`small` is sized for a CPU and the 500-user sample: d_model 128, and the sample's training words
seen often enough as its vocabulary. Its strategy is the learned ranker: `--mode=train` trains the generator, then
`config.suggest.ranker_folds` generators each without one fold of the training users, then the
ranker. docs/RESULTS.md's figures for users never seen add `--config.data.split_by=user`.
"""

from configs import default


def get_config(variant: str = ''):
  c = default.get_config('mtn')
  c.model.emb_dim = 300  # the paper learns 300-d word embeddings, projected to d_model
  c.train.label_smoothing = 0.05  # best after 2 epochs in the paper (0.01 for 5)
  c.train.warmup_steps = 4000
  c.input.train_queries_per_batch = 2048
  c.input.eval_queries_per_batch = 4096
  # Cross-entropy over the vocabulary in chunks of 2048 target slots: large matmuls for a GPU,
  # one chunk's logits alive at a time instead of the batch's.
  c.train.loss_chunk_tokens = 2048
  # Layer stacks as Python loops on a GPU: a faster step than nn.scan's, with no stacking of
  # activations for the backward pass and less memory, for a longer compilation
  # (docs/PERFORMANCE.md, "The step against the hardware's limit"). Checkpoints of either
  # layout load in the other.
  c.model.scan_layers = False
  # The service's programs compiled when training ends: its first start reads them back
  # rather than compiling a program per batch size and session length (docs/PERFORMANCE.md,
  # "Serving").
  c.serve.prepare_after_train = True
  if variant == 'small':
    apply_small(c)
    # Suggestions for users never seen in training: every source pooled and ordered by the
    # learned ranker (config.suggest.sources), which --mode=train trains with the generator
    # and one generator without each fold of the training users. It ranks the next query
    # above the quota blend and the most popular list on the training users, cross-fitted
    # (docs/RESULTS.md, "A learned ranker"). A workdir without a ranker falls back to the
    # blend below; --config.suggest.strategy=generate gives the model's own beam.
    c.suggest.strategy = 'learned'
    c.suggest.blend = 'popular:3,cooccurring:5,generate:10'
  elif variant:
    raise ValueError(f'configs/aol.py: unknown variant {variant!r} (expected "" or "small")')
  return c


def apply_small(c):
  """CPU-size model and schedule for the 500-user AOL sample."""
  c.model.emb_dim = 128
  if 'd_model' in c.model:  # the attention models
    c.model.scan_layers = True  # on a CPU the layouts are within the noise; scan compiles faster
    c.model.d_model = 128
    c.model.num_heads = 4
    c.model.ff_dim = 256
    # The best validated MTN setup on the sample (docs/RESULTS.md, "Against the trivial
    # suggesters: copying"): copying from the session.
    c.model.copy = True
  if 'lstm_units' in c.model:  # the recurrent baselines
    c.model.lstm_units = 64
  c.train.num_epochs = 10
  if c.train.schedule == 'transformer':
    c.train.warmup_steps = 200
  # Chosen against 0.5 on the 500-user sample's validation split: a lower perplexity for every
  # attention model, and the 5+5 Transformer no longer diverges
  # (docs/notes/2026-11-23-paper-comparison.md, "What was tuned").
  c.train.learning_rate = 0.25
  c.train.log_every_steps = 20
  c.train.checkpoint_every_steps = 200
  c.input.train_queries_per_batch = 256
  c.input.eval_queries_per_batch = 1024
  c.train.loss_chunk_tokens = 256  # the CPU's best chunk (docs/PERFORMANCE.md)
  c.decode.batch_sessions = 128
  # Shared by every compared model. Chosen on the sample's validation split against 0.6 (a
  # higher mean BLEU of the six models) and, for MTN with copying, against 2.0 and 3.0
  # (docs/notes/2026-11-23-paper-comparison.md, "What was tuned"; "What was tried" in
  # docs/notes/2026-11-24-copying-and-the-trivial-suggesters.md).
  c.decode.length_penalty = 1.2
  # The best validated MTN setup's decoding, shared by the compared models: no word twice in a
  # suggestion, the beam reordered by minimum Bayes risk with the session's queries among the
  # candidates (each raised validation BLEU and Recall@10), and 10 suggestions for Recall@10.
  c.decode.block_repeats = True
  c.decode.mbr = 'beam+session'
  c.decode.beam_size = 10
  c.decode.top_k = 10
