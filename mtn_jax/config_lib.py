"""Checks a config before any work starts, so a bad value fails with its key named.

ml_collections already refuses unknown keys and wrong types on `--config.a.b=v`; this adds
the checks that need more than one value or the project's vocabulary of names.
"""

from __future__ import annotations

import ml_collections

from mtn_jax import errors

MODES = ('all', 'preprocess', 'train', 'eval', 'decode', 'suggest', 'report')


class ConfigError(errors.Error, ValueError):
  """A config value that cannot work; the message names the key."""


def _positive(config, keys):
  for key in keys:
    section, name = key.split('.')
    value = config[section][name]
    if not value > 0:
      raise ConfigError(f'config.{key} must be positive, got {value!r}')


def validate(config: ml_collections.ConfigDict, mode: str = 'all') -> None:
  """Raises ConfigError naming the first key whose value cannot work in `mode`."""
  d, m, t, i = config.data, config.model, config.train, config.input
  if d.source not in ('aol', 'demo', 'movies'):
    raise ConfigError(f"config.data.source must be 'aol', 'demo' or 'movies', "
                      f'got {d.source!r}')
  if d.source == 'aol' and not d.raw_files and mode in ('all', 'preprocess', 'train'):
    raise ConfigError('config.data.raw_files is empty: pass --config.data.raw_files='
                      'PATH_OR_GLOB (AOL-format log files), or use configs/demo.py')
  if d.long_query not in ('drop_session', 'split_session', 'truncate'):
    raise ConfigError("config.data.long_query must be 'drop_session', 'split_session' or "
                      f"'truncate', got {d.long_query!r}")
  _positive(config, ['data.session_gap_minutes', 'data.max_query_words',
                     'data.min_session_queries', 'data.max_session_queries',
                     'data.min_word_count', 'data.demo_users'])
  if d.min_session_queries < 2:
    raise ConfigError('config.data.min_session_queries must be at least 2: a session '
                      'needs a previous query and a next one')
  if d.max_session_queries < d.min_session_queries:
    raise ConfigError(f'config.data.max_session_queries ({d.max_session_queries}) is below '
                      f'config.data.min_session_queries ({d.min_session_queries})')
  if d.tokenizer not in ('word', 'sentencepiece'):
    raise ConfigError("config.data.tokenizer must be 'word' or 'sentencepiece', "
                      f'got {d.tokenizer!r}')
  if d.tokenizer == 'sentencepiece':
    _positive(config, ['data.vocab_size', 'data.max_query_tokens'])
    if d.vocab_size < 300:
      raise ConfigError('config.data.vocab_size must be at least 300 with sentencepiece '
                        '(its 256 byte pieces and the special tokens come first)')
  if d.history_queries < 0:
    raise ConfigError(f'config.data.history_queries must be >= 0, got {d.history_queries}')
  if d.split_by not in ('session', 'user', 'time'):
    raise ConfigError("config.data.split_by must be 'session', 'user' or 'time', "
                      f'got {d.split_by!r}')
  fractions = tuple(d.split_fractions)
  if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
    raise ConfigError('config.data.split_fractions must be three non-negative numbers '
                      f'(train, valid, test) summing to 1, got {fractions}')
  if not fractions[0] > 0:
    raise ConfigError('config.data.split_fractions[0] (train) must be positive: the train '
                      f'split is what the models learn from, got {fractions}')

  if mode == 'preprocess':
    return  # preprocessing reads config.data alone, and runs without JAX
  # The registry imports the models, and with them JAX.
  from mtn_jax import models  # pylint: disable=g-import-not-at-top
  if m.name not in models.REGISTRY:
    raise ConfigError(f'config.model.name {m.name!r} is not a model; known: '
                      + ', '.join(models.REGISTRY))
  _positive(config, ['model.emb_dim', 'model.d_model', 'model.num_heads', 'model.ff_dim',
                     'model.query_layers', 'model.decoder_layers', 'model.lstm_units',
                     'model.max_session_queries'])
  if m.d_model % m.num_heads:
    raise ConfigError(f'config.model.num_heads ({m.num_heads}) must divide '
                      f'config.model.d_model ({m.d_model})')
  if m.name == 'mtn':
    _positive(config, ['model.session_layers'])
    if m.num_levels < 2:
      raise ConfigError(f'config.model.num_levels must be >= 2 for MTN, got {m.num_levels}')
  if m.user_memory not in ('none', 'attention', 'zero_attention'):
    raise ConfigError("config.model.user_memory must be 'none', 'attention' or "
                      f"'zero_attention', got {m.user_memory!r}")
  if m.user_memory != 'none' and m.name not in ('mtn', 'transformer'):
    raise ConfigError(f'config.model.user_memory is an option of MTN and the Transformer; '
                      f"{m.name!r} has none (set it to 'none')")
  if m.name == 'zam':
    if m.user_model not in ('qem', 'hem', 'aem', 'zam'):
      raise ConfigError("config.model.user_model must be 'qem', 'hem', 'aem' or 'zam', "
                        f'got {m.user_model!r}')
    if m.query_from not in ('last', 'session'):
      raise ConfigError(f"config.model.query_from must be 'last' or 'session', "
                        f'got {m.query_from!r}')
    _positive(config, ['model.attention_hidden', 'model.item_negatives',
                       'model.word_negatives'])
  if m.name in ('biencoder', 'polyencoder', 'crossencoder'):
    if m.context_encoder not in ('flat', 'mtn'):
      raise ConfigError("config.model.context_encoder must be 'flat' or 'mtn', "
                        f'got {m.context_encoder!r}')
    if m.context_encoder == 'mtn' and m.name != 'crossencoder':
      _positive(config, ['model.session_layers'])
      if m.num_levels < 2:
        raise ConfigError(f'config.model.num_levels must be >= 2 for an MTN context '
                          f'encoder, got {m.num_levels}')
    _positive(config, ['model.poly_codes', 'model.cross_negatives'])
    if m.pool_negatives < 0:
      raise ConfigError(f'config.model.pool_negatives must be >= 0, got {m.pool_negatives}')
    if m.lexical_negatives < 0:
      raise ConfigError('config.model.lexical_negatives must be >= 0, got '
                        f'{m.lexical_negatives}')
    if m.lexical_negatives and m.name == 'crossencoder':
      raise ConfigError('config.model.lexical_negatives is for the Bi- and Poly-encoders (the '
                        'Cross-encoder draws its negatives with config.model.cross_negatives)')
  s = config.suggest
  if s.strategy not in ('generate', 'retrieve', 'rerank'):
    raise ConfigError("config.suggest.strategy must be 'generate', 'retrieve' or 'rerank', "
                      f'got {s.strategy!r}')
  if s.strategy != 'generate' and not s.ranker_workdir:
    raise ConfigError(f'config.suggest.strategy={s.strategy!r} needs a trained ranker: pass '
                      '--config.suggest.ranker_workdir=DIR (a Bi-, Poly- or Cross-encoder run)')
  if s.strategy == 'rerank':
    if s.retrieved < 0:
      raise ConfigError(f'config.suggest.retrieved must be >= 0, got {s.retrieved}')
    if s.imdna_workdir:
      _positive(config, ['suggest.imdna_proposed'])
    if not 0 <= s.habit_rate <= 1:
      raise ConfigError(f'config.suggest.habit_rate must be in [0, 1], got {s.habit_rate}')
    if s.habit_min_past < 0:
      raise ConfigError(f'config.suggest.habit_min_past must be >= 0, got {s.habit_min_past}')
  else:
    for key, value in (('imdna_workdir', s.imdna_workdir), ('mbr', s.mbr),
                       ('habit_rate', s.habit_rate)):
      if value:
        raise ConfigError(f'config.suggest.{key} is read by \'rerank\' only, but '
                          f'config.suggest.strategy is {s.strategy!r}')
  if s.index not in ('exact', 'usearch'):
    raise ConfigError(f"config.suggest.index must be 'exact' or 'usearch', got {s.index!r}")
  # The ranker of 'generate' is the workdir's own model; another workdir's is checked when it
  # is loaded (`ranking.check_index`).
  if s.index == 'usearch' and s.strategy == 'generate' and m.name in ('polyencoder',
                                                                      'crossencoder'):
    raise ConfigError(f"config.suggest.index='usearch' needs a Bi-encoder (its score is an "
                      f"inner product of fixed vectors), not {m.name!r}: use 'exact'")
  if ((m.name == 'zam' and m.user_model != 'qem') or m.user_memory != 'none') and (
      d.history_queries == 0):
    raise ConfigError('config.data.history_queries is 0, but the model reads each user\'s '
                      'earlier queries: set it to the number to keep (e.g. 20)')
  if m.copy and m.name in ('mtn', 'transformer') and t.entropy_weight:
    raise ConfigError('config.train.entropy_weight is not defined for a copy mixture: set it '
                      'to 0 or config.model.copy to False')
  if not 0 <= m.dropout < 1:
    raise ConfigError(f'config.model.dropout must be in [0, 1), got {m.dropout}')
  if m.remat not in ('none', 'full', 'dots'):
    raise ConfigError(f"config.model.remat must be 'none', 'full' or 'dots', got {m.remat!r}")
  if m.compute_dtype not in ('float32', 'bfloat16'):
    raise ConfigError("config.model.compute_dtype must be 'float32' or 'bfloat16', "
                      f'got {m.compute_dtype!r}')
  if m.max_session_queries < d.max_session_queries:
    raise ConfigError(f'config.model.max_session_queries ({m.max_session_queries}) must be '
                      f'>= config.data.max_session_queries ({d.max_session_queries})')

  _positive(config, ['train.num_epochs', 'train.learning_rate', 'train.log_every_steps',
                     'train.checkpoint_every_steps', 'train.keep_checkpoints',
                     'input.train_queries_per_batch', 'input.eval_queries_per_batch',
                     'decode.beam_size', 'decode.max_len', 'decode.top_k',
                     'decode.batch_sessions', 'train.loss_chunk_tokens'])
  if t.schedule not in ('transformer', 'constant'):
    raise ConfigError("config.train.schedule must be 'transformer' or 'constant', "
                      f'got {t.schedule!r}')
  if t.schedule == 'transformer' and t.warmup_steps <= 0:
    raise ConfigError('config.train.warmup_steps must be positive with the transformer '
                      'schedule')
  if t.user_folds:
    if t.user_folds < 2 or not 0 <= t.held_out_fold < t.user_folds:
      raise ConfigError(f'config.train.user_folds={t.user_folds}, held_out_fold='
                        f'{t.held_out_fold}: the folds must be at least 2 and the held-out '
                        'fold one of them (0 <= held_out_fold < user_folds)')
    if d.split_by != 'user':
      raise ConfigError('config.train.user_folds holds users out of training, which is what '
                        "the validation and test users are only with config.data.split_by="
                        f"'user' (got {d.split_by!r})")
  if t.hypotheses_from and m.name not in ('biencoder', 'polyencoder', 'crossencoder'):
    raise ConfigError('config.train.hypotheses_from gives the Bi-, Poly- and Cross-encoders '
                      f'generated candidates to learn from; {m.name!r} reads none')
  if not 0 <= t.label_smoothing < 1:
    raise ConfigError(f'config.train.label_smoothing must be in [0, 1), '
                      f'got {t.label_smoothing}')
  if i.train_queries_per_batch < d.max_session_queries:
    raise ConfigError(f'config.input.train_queries_per_batch ({i.train_queries_per_batch}) '
                      'must hold at least one session of config.data.max_session_queries '
                      f'({d.max_session_queries}) queries')
  if config.decode.eval_split not in ('test', 'valid'):
    raise ConfigError("config.decode.eval_split must be 'test' or 'valid', "
                      f'got {config.decode.eval_split!r}')
  if config.decode.rerank not in ('none', 'mbr', 'mbr+session'):
    raise ConfigError("config.decode.rerank must be 'none', 'mbr' or 'mbr+session', "
                      f'got {config.decode.rerank!r}')
  if config.decode.top_k > config.decode.beam_size:
    raise ConfigError(f'config.decode.top_k ({config.decode.top_k}) cannot exceed '
                      f'config.decode.beam_size ({config.decode.beam_size})')
  if mode == 'report' and not config.report.workdirs:
    raise ConfigError('config.report.workdirs is empty: pass --config.report.workdirs=A,B')
