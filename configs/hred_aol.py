"""The H-LSTM (HRED, Sordoni et al. 2015) baseline on AOL: query encoder, session LSTM,
decoder. `--config=configs/hred_aol.py` or `--config=configs/hred_aol.py:small`.

The paper's recurrent setup and the 'small' variant: `configs/seq2seq_aol.py`.
"""

import ml_collections

from configs import seq2seq_aol


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  return seq2seq_aol.recurrent_config('hred', variant, 'configs/hred_aol.py')
