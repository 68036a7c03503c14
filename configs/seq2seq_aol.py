"""The Seq2Seq-with-attention baseline on AOL (Luong et al.): the session's queries joined by
`<sep>` -> next query. `--config=configs/seq2seq_aol.py` or `--config=configs/seq2seq_aol.py:small`.

Also home of `recurrent_config`, the paper's setup (Sec. 5.2) that all three recurrent
baselines share: `configs/hred_aol.py` and `configs/mnsrf_aol.py` start from it.

Variants: ''       the paper's size: bidirectional LSTMs of 256 units per direction, 300-d
                   word embeddings learned from scratch;
          'small'  CPU size for the 500-user sample, with the budget (epochs, batch, data
                   config) of `configs/aol.py:small`, so the models compare on equal terms;
                   Adam at 0.003, tuned on the sample's validation split.
"""

import ml_collections

from configs import aol
from configs import default


def recurrent_config(model_name: str, variant: str, config_file: str
                     ) -> ml_collections.ConfigDict:
  """The paper's recurrent-baseline setup for `model_name` ('seq2seq', 'hred', 'mnsrf').

  `config_file` names the calling file in the error for an unknown variant.
  """
  c = default.get_config(model_name)
  c.model.emb_dim = 300
  c.model.lstm_units = 256  # per direction: a 512-d bidirectional state
  c.model.dropout = 0.1
  c.train.label_smoothing = 0.0
  # The paper's M-NSRF rate, Adam at a constant 0.001, serves all three recurrent models (the
  # Transformer warm-up schedule is for the attention models).
  default.constant_rate(c, 0.001)
  # Adam's usual moments (Kingma & Ba); b2 0.98 and eps 1e-9 are Vaswani et al.'s Transformer
  # settings.
  c.train.adam_b2 = 0.999
  c.train.adam_eps = 1e-8
  c.input.train_queries_per_batch = 2048
  c.input.eval_queries_per_batch = 4096
  c.train.loss_chunk_tokens = 2048  # as configs/aol.py
  if variant == 'small':
    aol.apply_small(c)
    # Tuned on the sample's validation split against 0.001: a lower validation perplexity
    # for each of the three recurrent models (docs/notes/2026-11-23-paper-comparison.md,
    # "What was tuned").
    c.train.learning_rate = 0.003
  elif variant:
    raise ValueError(f'{config_file}: unknown variant {variant!r} (expected "" or "small")')
  return c


def get_config(variant: str = '') -> ml_collections.ConfigDict:
  return recurrent_config('seq2seq', variant, 'configs/seq2seq_aol.py')
