"""The zero attention model family on AOL, split by time so that a user's history is the past.

  --config=configs/zam_aol.py[:zam|:aem|:hem|:qem]  --config.data.raw_files=LOG
  --config=configs/zam_aol.py:demo                  ZAM on the embedded demo log, in a minute
  --config=configs/zam_aol.py:mtn_zam               MTN with a zero-attention user memory
                                                    (:mtn_aem the same with plain attention,
                                                    :mtn for the same MTN without memory)

Every variant reads the same corpus (the time split, each session with its user's 20 most
recent earlier queries), so their figures compare; docs/RESULTS.md has them.
"""

from configs import aol
from configs import default

_FAMILY = ('zam', 'aem', 'hem', 'qem')
_MTN = {'mtn': 'none', 'mtn_aem': 'attention', 'mtn_zam': 'zero_attention'}


def get_config(variant: str = ''):
  variant = variant or 'zam'
  if variant not in _FAMILY + tuple(_MTN) + ('demo',):
    raise ValueError(f'configs/zam_aol.py: unknown variant {variant!r} (expected one of '
                     + ', '.join(_FAMILY + tuple(_MTN) + ('demo',)) + ')')
  c = default.get_config('mtn' if variant in _MTN else 'zam')
  c.data.split_by = 'time'
  c.data.history_queries = 20
  if variant in _MTN:
    aol.apply_small(c)
    c.model.user_memory = _MTN[variant]
    return c
  c.model.user_model = 'zam' if variant == 'demo' else variant
  c.model.emb_dim = 64
  c.model.attention_hidden = 8
  c.model.item_negatives = 10
  c.model.word_negatives = 5
  default.constant_rate(c, 5e-3)
  c.train.num_epochs = 20
  c.train.log_every_steps = 20
  c.train.checkpoint_every_steps = 200
  c.input.train_queries_per_batch = 512
  c.input.eval_queries_per_batch = 1024
  c.decode.top_k = 10
  c.decode.beam_size = 10  # read by generative models only
  if variant == 'demo':
    c.data.source = 'demo'
    c.data.demo_users = 600
    c.data.min_word_count = 2
    c.train.num_epochs = 4
  return c
