"""Checks a config before any work starts, so a bad value fails with its key named.

ml_collections already refuses unknown keys and wrong types on `--config.a.b=v`; this adds
the checks that need more than one value or the project's vocabulary of names. Each model's
own fields are checked by its config class (`ModelConfig.check`, found through
`mtn_jax.models.REGISTRY`); here are the rules of each section and those across sections
(data x model x train x decode x suggest x mode).
"""

from __future__ import annotations

import math
import os

import ml_collections

from mtn_jax import errors
from mtn_jax.data import aol_log

ConfigError = errors.ConfigError  # a config value that cannot work; the message names the key


# The keys naming files or folders, and those naming several, comma-separated: a leading `~`
# is the user's home in each (a shell leaves `--config.decode.input=~/f` as typed).
PATH_KEYS = ('train.hypotheses_from', 'decode.input', 'decode.output', 'suggest.ranker_workdir',
             'suggest.retriever_workdir', 'suggest.imdna_workdir', 'report.output',
             'serve.history_db', 'serve.compile_cache')
PATH_LIST_KEYS = ('data.raw_files', 'report.workdirs')


def expand_home(config: ml_collections.ConfigDict) -> None:
  """Each path of `PATH_KEYS` and `PATH_LIST_KEYS` starting with `~` as its absolute path
  (in place)."""
  for key in PATH_KEYS + PATH_LIST_KEYS:
    section, name = key.split('.')
    value = config[section][name]
    if '~' not in value:
      continue
    if key in PATH_LIST_KEYS:
      config[section][name] = ','.join(os.path.expanduser(item.strip())
                                       for item in value.split(','))
    else:
      config[section][name] = os.path.expanduser(value)


def _positive(config, keys):
  for key in keys:
    section, name = key.split('.')
    errors.check_positive(config[section], f'config.{section}', name)


def _non_negative(config, keys):
  """Refuses the first of `keys` ('seed', 'serve.max_wait_ms') whose value is not >= 0 (below
  0, or NaN): the seeds, the counts whose 0 means none or no limit, the waits."""
  for key in keys:
    *section, name = key.split('.')
    value = (config[section[0]] if section else config)[name]
    if not value >= 0:
      raise ConfigError(f'config.{key} must be >= 0, got {value!r}')


def _choice(config, key, choices):
  section, name = key.split('.')
  errors.check_choice(config[section], f'config.{section}', name, choices)


def validate(config: ml_collections.ConfigDict, mode: str = 'all') -> None:
  """Raises ConfigError naming the first key whose value cannot work in `mode`."""
  _check_numbers(config)
  _check_data(config, mode)
  if mode == 'preprocess':
    return  # preprocessing reads config.data alone, and runs without JAX
  model_class = _check_model(config)
  _check_suggest(config)
  _check_train(config, model_class)
  _check_decode(config, mode)
  _check_serve(config)


# The largest count a config holds: the arrays it sizes are indexed by 32-bit integers. Seeds
# may be larger.
MAX_COUNT = 2**31 - 1


def _check_numbers(config, path: str = 'config') -> None:
  """Refuses a NaN or infinite float anywhere in `config` (no key means anything by one: a
  NaN passes every `<` check, an infinite rate or penalty runs and computes nothing) and a
  count beyond `MAX_COUNT`."""
  for key, value in config.items():
    where = f'{path}.{key}'
    if isinstance(value, ml_collections.ConfigDict):
      _check_numbers(value, where)
      continue
    for item in (value if isinstance(value, (tuple, list)) else (value,)):
      if isinstance(item, float) and not math.isfinite(item):
        raise ConfigError(f'{where} must be a finite number, got {value!r}')
      if (isinstance(item, int) and not isinstance(item, bool) and abs(item) > MAX_COUNT
          and 'seed' not in key):
        raise ConfigError(f'{where}={value!r} is out of range (at most {MAX_COUNT:,})')


def _check_data(config, mode: str) -> None:
  d = config.data
  _choice(config, 'data.source', ('aol', 'demo', 'movies'))
  if d.source == 'movies' and 'movies' not in config:
    raise ConfigError("config.data.source='movies' reads config.movies, which this config "
                      'has none of: use configs/imdna_movies.py')
  if d.source != 'aol' and d.raw_files:
    raise ConfigError('config.data.raw_files is read only when config.data.source is '
                      f"'aol', but it is {d.source!r}: leave raw_files empty, or use a config "
                      'for a log (configs/aol.py)')
  names_no_file = not d.raw_files.replace(',', ' ').strip()  # '' or ' , '
  if d.source == 'aol' and names_no_file and mode in ('all', 'preprocess', 'train'):
    raise ConfigError('config.data.raw_files is empty: pass --config.data.raw_files='
                      'PATH_OR_GLOB (AOL-format log files), or use configs/demo.py')
  _choice(config, 'data.long_query', aol_log.LONG_QUERY_POLICIES)
  _non_negative(config, ['data.split_seed', 'data.demo_seed'])
  _positive(config, ['data.session_gap_minutes', 'data.max_query_words',
                     'data.min_session_queries', 'data.max_session_queries',
                     'data.min_word_count', 'data.demo_users'])
  if d.min_session_queries < 2:
    raise ConfigError('config.data.min_session_queries must be at least 2: a session '
                      'needs a previous query and a next one')
  if d.max_session_queries < d.min_session_queries:
    raise ConfigError(f'config.data.max_session_queries ({d.max_session_queries}) is below '
                      f'config.data.min_session_queries ({d.min_session_queries})')
  _choice(config, 'data.tokenizer', ('word', 'sentencepiece'))
  if d.tokenizer == 'sentencepiece':
    _positive(config, ['data.vocab_size', 'data.max_query_tokens'])
    if d.vocab_size < 300:
      raise ConfigError('config.data.vocab_size must be at least 300 with sentencepiece '
                        '(its 256 byte pieces and the special tokens come first)')
  _non_negative(config, ['data.history_queries'])
  _choice(config, 'data.split_by', ('session', 'user', 'time'))
  if d.train_users < 0 or (d.train_users and d.split_by != 'user'):
    raise ConfigError(f'config.data.train_users={d.train_users}: a number of training users '
                      ">= 0, with config.data.split_by='user' only (0: all of them)")
  fractions = tuple(d.split_fractions)
  if len(fractions) != 3 or not all(f >= 0 for f in fractions) or not abs(
      sum(fractions) - 1) <= 1e-6:  # (written so that a NaN fails too)
    raise ConfigError('config.data.split_fractions must be three non-negative numbers '
                      f'(train, valid, test) summing to 1, got {fractions}')
  if not fractions[0] > 0:
    raise ConfigError('config.data.split_fractions[0] (train) must be positive: the train '
                      f'split is what the models learn from, got {fractions}')


def _check_model(config):
  """The model's own rules (its config class's `check`), then those it shares with the data;
  returns the config class."""
  # The registry imports the models, and with them JAX.
  from mtn_jax import models  # pylint: disable=g-import-not-at-top
  m, d = config.model, config.data
  if not m.name:
    raise ConfigError('config.model.name is empty: start from a model\'s config file '
                      '(configs/demo.py, configs/aol.py, ...) or name one, '
                      '--config=configs/default.py:mtn')
  if m.name not in models.REGISTRY:
    raise ConfigError(f'config.model.name {m.name!r} is not a model; known: '
                      + ', '.join(models.REGISTRY))
  model_class = models.REGISTRY[m.name].config_class
  missing = [k for k in model_class.config_keys() if k not in m]
  if missing:
    raise ConfigError(f'config.model has no key {missing[0]!r}, which {m.name!r} reads: a '
                      'config of another model family (start from a config file of '
                      f'{m.name!r}, or --config=configs/default.py:{m.name}), or a field '
                      "its family's keys in configs/families.py lack")
  model_class.check(m)  # first: it names some other models' keys more precisely
  # A key left from another model's config (`--config.model.name` changed on the command
  # line) would be recorded in the workdir's config as if it shaped the model.
  unread = [k for k in m if k not in model_class.config_keys()]
  if unread:
    raise ConfigError(f'config.model.{unread[0]} is not a key of {m.name!r}, which does not '
                      f'read it: start from a config file of {m.name!r} (or '
                      f'--config=configs/default.py:{m.name}) rather than changing '
                      'config.model.name')
  if model_class.reads_user_history(m) and d.history_queries == 0:
    raise ConfigError('config.data.history_queries is 0, but the model reads each user\'s '
                      'earlier queries: set it to the number to keep (e.g. 20)')
  if m.max_session_queries < d.max_session_queries:
    raise ConfigError(f'config.model.max_session_queries ({m.max_session_queries}) must be '
                      f'>= config.data.max_session_queries ({d.max_session_queries})')
  # A task with settings of its own (IMDNA's config.imdna) checks them itself.
  from mtn_jax import tasks  # pylint: disable=g-import-not-at-top
  check_task = getattr(tasks.task_class(m), 'check_config', None)
  if check_task is not None:
    try:
      check_task(config)
    except errors.Error as e:
      raise ConfigError(str(e)) from None
  return model_class


def _check_suggest(config) -> None:
  # Imported here: the inference modules import JAX, which preprocessing runs without.
  from mtn_jax.decoding import mbr  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import retrieval  # pylint: disable=g-import-not-at-top
  s, m, name = config.suggest, config.model, config.model.name
  _choice(config, 'suggest.strategy', pipeline.STRATEGIES)
  try:
    _, ranker_mbr = mbr.parse(config.decode.mbr)
  except ValueError as e:
    raise ConfigError(f'config.decode.mbr={config.decode.mbr!r}: {e}') from None
  if ranker_mbr and s.strategy != 'rerank':
    raise ConfigError("config.decode.mbr 'ranker' reorders the pooled candidates of 'rerank', "
                      f'but config.suggest.strategy is {s.strategy!r}')
  # The plans and the learned ranker's settings are checked whatever the strategy: a wrong
  # value is a mistake before any work, not when another strategy first reads it.
  from mtn_jax.inference import learned  # pylint: disable=g-import-not-at-top
  for key, parse in (('blend', pipeline.parse_blend), ('sources', learned.parse_sources)):
    try:
      parse(s[key])
    except ValueError as e:
      raise ConfigError(f'config.suggest.{key}={s[key]!r}: {e}') from None
  _positive(config, ['suggest.ranker_folds', 'suggest.ranker_rounds', 'suggest.past_queries'])
  if s.ranker_folds < 2:
    raise ConfigError(f'config.suggest.ranker_folds must be >= 2 (cross-fitting), got '
                      f'{s.ranker_folds}')
  _non_negative(config, ['suggest.session_first', 'suggest.unrelated_first'])
  if s.strategy not in ('generate', 'blend', 'learned') and not s.ranker_workdir:
    runs = 'Bi- or Poly-encoder' if s.strategy == 'retrieve' else 'Bi-, Poly- or Cross-encoder'
    raise ConfigError(f'config.suggest.strategy={s.strategy!r} needs a trained ranker: pass '
                      f'--config.suggest.ranker_workdir=DIR (a {runs} run)')
  if s.strategy == 'rerank':
    _non_negative(config, ['suggest.retrieved', 'suggest.popular', 'suggest.cooccurring'])
    if s.imdna_workdir:
      _positive(config, ['suggest.imdna_proposed'])
    if not 0 <= s.habit_rate <= 1:
      raise ConfigError(f'config.suggest.habit_rate must be in [0, 1], got {s.habit_rate}')
    _non_negative(config, ['suggest.habit_min_past'])
  else:
    for key in ('imdna_workdir', 'habit_rate', 'popular', 'cooccurring'):
      if s[key]:
        raise ConfigError(f'config.suggest.{key} is read by \'rerank\' only, but '
                          f'config.suggest.strategy is {s.strategy!r}')
  if s.strategy not in ('retrieve', 'rerank'):
    for key in ('ranker_workdir', 'retriever_workdir'):
      if s[key]:
        raise ConfigError(f'config.suggest.{key} is read by \'retrieve\' and \'rerank\' only, '
                          f'but config.suggest.strategy is {s.strategy!r}')
  _choice(config, 'suggest.index', retrieval.INDEX_KINDS)
  # The ranker of 'generate' is the workdir's own model; another workdir's is checked when it
  # is loaded (`retrieval.check_index`).
  # What the model can do is asked of its task's capabilities (`mtn_jax.tasks.base`).
  from mtn_jax import tasks  # pylint: disable=g-import-not-at-top
  task_class = tasks.task_class(m)
  if s.strategy in ('learned', 'blend', 'rerank') and not issubclass(task_class, tasks.Suggests):
    raise ConfigError(f'config.suggest.strategy={s.strategy!r} orders a generative model\'s '
                      f'suggestions among other candidates, and {name!r} writes none (a '
                      "ranker orders its pool with 'generate', or reranks a generator's beam "
                      "as config.suggest.ranker_workdir of the generator's run)")
  if s.strategy == 'learned':
    from mtn_jax import models  # pylint: disable=g-import-not-at-top
    if models.REGISTRY[name].config_class.reads_user_history(m):
      raise ConfigError(f"config.suggest.strategy='learned' ranks candidates of contexts "
                        "without the users' earlier queries, which this model reads "
                        f'(config.model.user_memory={m.get("user_memory")!r}): suggest by '
                        "'generate', 'blend' or 'rerank'")
  if (s.index == 'usearch' and s.strategy == 'generate'
      and issubclass(task_class, (tasks.ScoresPool, tasks.ScoresCandidates))
      and not (issubclass(task_class, tasks.ScoresPool) and task_class.vector_index(m))):
    raise ConfigError(f"config.suggest.index='usearch' needs a Bi-encoder (its score is an "
                      f"inner product of fixed vectors), not {name!r}: use 'exact'")


def _check_train(config, model_class) -> None:
  t, m, d = config.train, config.model, config.data
  _positive(config, ['train.num_epochs', 'train.learning_rate', 'train.log_every_steps',
                     'train.checkpoint_every_steps', 'train.keep_checkpoints',
                     'input.train_queries_per_batch', 'input.eval_queries_per_batch',
                     'train.loss_chunk_tokens', 'train.adam_eps', 'input.prefetch_batches'])
  _non_negative(config, ['seed', 'input.worker_count', 'train.max_steps',
                         'train.grad_clip_norm', 'train.user_folds'])
  for key in ('adam_b1', 'adam_b2'):
    if not 0 <= t[key] < 1:
      raise ConfigError(f'config.train.{key} must be in [0, 1) (a moving average\'s decay), '
                        f'got {t[key]!r}')
  if t.held_out_fold and not t.user_folds:
    raise ConfigError(f'config.train.held_out_fold={t.held_out_fold} is read only with '
                      'config.train.user_folds=K (the folds of the training users)')
  _choice(config, 'train.schedule', ('transformer', 'constant'))
  if t.schedule == 'transformer':
    if 'd_model' not in m:
      raise ConfigError("config.train.schedule='transformer' scales the rate by "
                        f"config.model.d_model ** -0.5, and {m.name!r} has no d_model: use "
                        "'constant'")
    _positive(config, ['model.d_model'])  # the schedule's scale is d_model ** -0.5
    if t.warmup_steps <= 0:
      raise ConfigError('config.train.warmup_steps must be positive with the transformer '
                        'schedule')
  elif t.warmup_steps:
    raise ConfigError(f'config.train.warmup_steps={t.warmup_steps}: the constant schedule '
                      'has no warm-up and reads none (set it to 0)')
  if model_class.copies(m) and t.entropy_weight:
    raise ConfigError('config.train.entropy_weight is not defined for a copy mixture: set it '
                      'to 0 or config.model.copy to False')
  if t.user_folds:
    if t.user_folds < 2 or not 0 <= t.held_out_fold < t.user_folds:
      raise ConfigError(f'config.train.user_folds={t.user_folds}, held_out_fold='
                        f'{t.held_out_fold}: the folds must be at least 2 and the held-out '
                        'fold one of them (0 <= held_out_fold < user_folds)')
    if d.split_by != 'user':
      raise ConfigError('config.train.user_folds holds users out of training, which is what '
                        "the validation and test users are only with config.data.split_by="
                        f"'user' (got {d.split_by!r})")
  from mtn_jax import tasks  # pylint: disable=g-import-not-at-top
  task_class = tasks.task_class(m)
  # The training keys only some tasks read: set for another, they would change nothing.
  if t.label_smoothing and not issubclass(task_class, tasks.Suggests):
    raise ConfigError('config.train.label_smoothing smooths a generator\'s targets over the '
                      f'vocabulary; {m.name!r} scores candidates and reads none (set it to 0)')
  if t.entropy_weight and not issubclass(task_class, tasks.Suggests):
    raise ConfigError('config.train.entropy_weight regularises a generator\'s output '
                      f'distribution over the vocabulary; {m.name!r} has none (set it to 0)')
  if t.user_folds and issubclass(task_class, tasks.BringsOwnData):
    raise ConfigError('config.train.user_folds holds users of the session corpus out of '
                      f'training; {m.name!r} trains on data of its own (set it to 0)')
  if t.hypotheses_from and not issubclass(task_class, tasks.ScoresCandidates):
    raise ConfigError('config.train.hypotheses_from gives the rankers that score given '
                      'candidates (Bi-, Poly- and Cross-encoders) generated ones to learn '
                      f'from; {m.name!r} reads none')
  if not 0 <= t.label_smoothing < 1:
    raise ConfigError(f'config.train.label_smoothing must be in [0, 1), '
                      f'got {t.label_smoothing}')
  if config.input.train_queries_per_batch < d.max_session_queries:
    raise ConfigError('config.input.train_queries_per_batch '
                      f'({config.input.train_queries_per_batch}) must hold at least one '
                      'session of config.data.max_session_queries '
                      f'({d.max_session_queries}) queries')


def _check_decode(config, mode: str) -> None:
  dc = config.decode
  _positive(config, ['decode.beam_size', 'decode.max_len', 'decode.top_k',
                     'decode.batch_sessions'])
  _choice(config, 'decode.eval_split', ('test', 'valid'))
  _non_negative(config, ['decode.max_eval_sessions'])
  # The model's own beam is all a generative model's 'generate' lists hold; the other
  # strategies pool more candidates than the beam.
  from mtn_jax import tasks  # pylint: disable=g-import-not-at-top
  if (dc.top_k > dc.beam_size and config.suggest.strategy == 'generate'
      and issubclass(tasks.task_class(config.model), tasks.Suggests)):
    raise ConfigError(f'config.decode.top_k ({dc.top_k}) cannot exceed '
                      f'config.decode.beam_size ({dc.beam_size}) with '
                      "config.suggest.strategy='generate'")
  if (config.data.tokenizer == 'sentencepiece'
      and issubclass(tasks.task_class(config.model), tasks.Suggests)):
    from mtn_jax.data import preprocess  # pylint: disable=g-import-not-at-top
    if problem := preprocess.subword_search_problem(dc, config.data.max_query_tokens):
      raise ConfigError(problem)
  if mode == 'decode' and not dc.input:
    raise ConfigError('config.decode.input is empty: pass --config.decode.input=FILE (one '
                      'session a line, queries separated by tabs, or an AOL log)')


def _check_serve(config) -> None:
  v = config.serve
  _non_negative(config, ['serve.workers'])
  _positive(config, ['serve.max_batch', 'serve.queue_bound',
                     'serve.deadline_ms', 'serve.drain_seconds', 'serve.max_body_bytes',
                     'serve.history_per_user'])
  smallest = '{"session":["a"]}'  # the shortest request the service answers
  if v.max_body_bytes < len(smallest):
    raise ConfigError(f'config.serve.max_body_bytes ({v.max_body_bytes}) would refuse every '
                      f'request: the shortest, {smallest}, is {len(smallest)} bytes')
  if not 0 <= v.port <= 65535:
    raise ConfigError(f'config.serve.port must be in 0..65535 (0: any free port), got {v.port}')
  _non_negative(config, ['serve.max_wait_ms', 'serve.drain_quiet_seconds',
                         'serve.warm_up_threads'])
  if not v.host:
    raise ConfigError("config.serve.host is empty: give an address (e.g. '127.0.0.1')")
