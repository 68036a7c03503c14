"""The main job: MTN on the embedded, generated demo log. Trains in minutes on a CPU.

python -m mtn_jax.main --config=configs/demo.py --workdir=/tmp/mtn_demo

`configs/demo.py:transformer` is the paper's Transformer baseline at the same sizes.
"""

from configs import default


def get_config(variant: str = ''):
  if variant not in ('', 'transformer'):
    raise ValueError(f'configs/demo.py: unknown variant {variant!r} (expected "" or '
                     '"transformer")')
  name = variant or 'mtn'
  c = default.get_config(name)
  c.data.source = 'demo'
  c.data.demo_users = 1500
  c.data.min_word_count = 2
  c.model.emb_dim = 64
  c.model.d_model = 64
  c.model.num_heads = 4
  c.model.ff_dim = 128
  c.model.query_layers = 2
  if name == 'mtn':
    c.model.session_layers = 1
  c.model.decoder_layers = 2
  # The 2-layer stacks' loops unrolled: the same parameters, masks and function, faster on a
  # 2-core CPU (docs/PERFORMANCE.md, "Training on a 2-core CPU"); results move only by float
  # rounding.
  c.model.scan_unroll = 2
  c.train.num_epochs = 8
  c.train.warmup_steps = 100
  c.train.learning_rate = 0.4  # peak 5.0e-3 at step 100, the end of warm-up, at d_model 64
  c.train.label_smoothing = 0.05
  c.train.log_every_steps = 20
  c.train.checkpoint_every_steps = 100
  c.input.train_queries_per_batch = 256
  c.input.eval_queries_per_batch = 1024
  c.decode.batch_sessions = 128
  c.decode.max_eval_sessions = 0
  return c
