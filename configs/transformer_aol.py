"""The Transformer baseline on AOL: previous queries joined by `<sep>` -> next query.

Variants (`--config=configs/transformer_aol.py:VARIANT`), comma-separable:
  ''        the paper's Table-2 Transformer: 8 layers in all (4 encoder + 4 decoder)
  'enc4dec4' 4 + 4 layers, as '' (the Fig.-3 ablation's first point)
  'enc5dec5' the Fig.-3 ablation with 5 + 5 layers
  'small'   CPU size for the 500-user sample (combine: 'small,enc5dec5')
"""

from configs import aol
from configs import default


def get_config(variant: str = ''):
  c = default.get_config('transformer')
  c.model.emb_dim = 300
  c.model.query_layers = 4  # encoder depth
  c.model.decoder_layers = 4
  c.train.label_smoothing = 0.0  # "little to no smoothing" for the Transformer
  c.input.train_queries_per_batch = 2048
  c.input.eval_queries_per_batch = 4096
  c.train.loss_chunk_tokens = 2048  # as configs/aol.py
  for v in filter(None, variant.split(',')):
    if v == 'small':
      aol.apply_small(c)
    elif v in ('enc4dec4', 'enc5dec5'):
      c.model.query_layers = c.model.decoder_layers = int(v[3])
    else:
      raise ValueError(f'configs/transformer_aol.py: unknown variant {v!r} (expected "small", '
                       '"enc4dec4" or "enc5dec5", or comma-separated ones: "small,enc5dec5")')
  return c
