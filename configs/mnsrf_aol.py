"""The M-NSRF baseline on AOL (Ahmad et al. 2018, query suggestion only): HRED with max-pooled
query summaries and an entropy regulariser in the loss. `--config=configs/mnsrf_aol.py` or
`--config=configs/mnsrf_aol.py:small`.

The paper's recurrent setup and the 'small' variant: `configs/seq2seq_aol.py`.
"""

import ml_collections

from configs import seq2seq_aol


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  c = seq2seq_aol.recurrent_config('mnsrf', variant, 'configs/mnsrf_aol.py')
  c.train.entropy_weight = 0.1  # the paper's best, with Adam at 0.001 (Sec. 5.2)
  return c
