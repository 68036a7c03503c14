"""The config by family: configs/default.py holds what every run shares, each model family its
own keys (configs/families.py); one switch per idea; old runs' saved configs still load."""

import importlib
import inspect
import re
import types

import ml_collections
import pytest

from configs import default
from configs import families
from mtn_jax import cli as cli_errors
from mtn_jax import config_lib
from mtn_jax import models
from mtn_jax import tasks
from mtn_jax.decoding import mbr
from mtn_jax.decoding import search
from mtn_jax.inference import trained as trained_lib
from mtn_jax.tasks import registry
from tests import cli


def leaf_keys(config, prefix=''):
  for key, value in config.items():
    if hasattr(value, 'items'):
      yield from leaf_keys(value, f'{prefix}{key}.')
    else:
      yield prefix + key


def test_default_holds_few_keys_and_only_what_every_model_reads():
  config = default.get_config()
  keys = list(leaf_keys(config))
  assert len(keys) <= 100, len(keys)
  assert len(config.model) <= 12, sorted(config.model)
  # Every key of config.model is a field of every model's config.
  for name, spec in models.REGISTRY.items():
    assert set(config.model) <= set(spec.config_class.config_keys()), name


@pytest.mark.parametrize('name', sorted(models.REGISTRY))
def test_each_family_adds_the_keys_its_model_reads_and_no_other(name):
  assert set(families.FAMILIES) == set(models.REGISTRY)
  model = default.get_config(name).model
  assert model.name == name
  assert set(model) == set(models.REGISTRY[name].config_class.config_keys())


def test_a_config_switched_to_another_family_keeps_the_shared_values():
  c = default.get_config('mtn')
  c.model.emb_dim, c.model.d_model = 64, 32
  families.use(c, 'hred')
  assert c.model.emb_dim == 64 and 'd_model' not in c.model and c.model.lstm_units == 256


def test_a_config_without_the_models_keys_is_refused_naming_one():
  c = default.get_config('mtn')
  c.data.source = 'demo'
  c.model.name = 'seq2seq'  # what --config.model.name=seq2seq on an MTN config gives
  with pytest.raises(config_lib.ConfigError,
                     match="config.model has no key 'lstm_units', which 'seq2seq' reads"):
    config_lib.validate(c)
  # A model that reads fewer keys than the config holds: the config's other keys would be
  # recorded in the workdir as if they shaped it.
  c = default.get_config('mtn')
  c.data.source = 'demo'
  c.model.name = 'transformer'
  with pytest.raises(config_lib.ConfigError,
                     match="config.model.num_levels is not a key of 'transformer'"):
    config_lib.validate(c)
  c = default.get_config()
  c.data.source = 'demo'
  with pytest.raises(config_lib.ConfigError, match='config.model.name is empty'):
    config_lib.validate(c)


def test_the_learned_ranker_is_refused_for_a_model_that_reads_user_histories():
  # Its candidates are made and learned from without the users' earlier queries: refused
  # before the generator and the fold generators train, not when the ranker's turn comes.
  c = default.get_config('mtn')
  c.data.source = 'demo'
  c.suggest.strategy = 'learned'
  config_lib.validate(c)
  c.model.user_memory, c.data.history_queries = 'attention', 5
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "config.suggest.strategy='learned' ranks candidates of contexts without the users' "
      "earlier queries, which this model reads (config.model.user_memory='attention')")):
    config_lib.validate(c)


@pytest.mark.parametrize('name', list(families.FAMILIES))
def test_every_model_with_every_default_is_a_config_that_trains(name):
  # `--config=configs/default.py:NAME`, on the demo log; IMDNA's task has settings of its own
  # (config.imdna), which its config files hold, and says so before any work.
  c = default.get_config(name)
  c.data.source = 'demo'
  if name == 'imdna':
    with pytest.raises(config_lib.ConfigError, match=re.escape(
        'reads config.imdna: use configs/imdna_movies.py or configs/imdna_aol.py')):
      config_lib.validate(c, 'all')
    return
  config_lib.validate(c, 'all')


def test_the_transformer_schedule_needs_a_d_model():
  c = default.get_config('hred')
  c.data.source = 'demo'
  assert c.train.schedule == 'constant'  # the family's default
  c.train.schedule = 'transformer'
  with pytest.raises(config_lib.ConfigError, match="'hred' has no d_model: use 'constant'"):
    config_lib.validate(c)


def test_movies_are_read_from_the_imdna_configs_section():
  c = default.get_config('mtn')
  c.data.source = 'movies'
  with pytest.raises(config_lib.ConfigError, match='reads config.movies'):
    config_lib.validate(c)


def test_validation_reads_the_modules_choices(monkeypatch):
  from mtn_jax.inference import retrieval  # pylint: disable=g-import-not-at-top
  c = default.get_config('mtn')
  c.data.source = 'demo'
  c.suggest.index = 'usearch'
  config_lib.validate(c)
  monkeypatch.setattr(retrieval, 'INDEX_KINDS', ('exact',))
  with pytest.raises(config_lib.ConfigError, match='config.suggest.index'):
    config_lib.validate(c)


# ---------------------------------------------------------------------------------------------
# One switch per idea


@pytest.mark.parametrize('value, parsed', [
    ('none', ('none', False)), ('beam', ('beam', False)),
    ('beam+session', ('beam+session', False)), ('ranker', ('none', True)),
    ('beam+session,ranker', ('beam+session', True)), ('ranker, beam', ('beam', True)),
])
def test_one_mbr_key_names_the_lists_it_reorders(value, parsed):
  assert mbr.parse(value) == parsed


@pytest.mark.parametrize('value, message', [
    ('mbr', "unknown list 'mbr'"), ('beam,beam+session', "at most one of 'beam'"),
])
def test_a_wrong_mbr_value_is_refused(value, message):
  with pytest.raises(ValueError, match=message):
    mbr.parse(value)
  c = default.get_config('mtn')
  c.data.source, c.decode.mbr = 'demo', value
  with pytest.raises(config_lib.ConfigError, match=re.escape(f'config.decode.mbr={value!r}')):
    config_lib.validate(c)


@pytest.mark.parametrize('key, value, message', [
    ('blend', 'bogus:3', "config.suggest.blend='bogus:3'"),
    ('sources', 'foo:3', "config.suggest.sources='foo:3'"),
    ('ranker_folds', 1, 'config.suggest.ranker_folds must be >= 2'),
    ('session_first', -1, 'config.suggest.session_first must be >= 0'),
])
def test_the_plans_and_the_learned_settings_are_checked_whatever_the_strategy(key, value,
                                                                              message):
  c = default.get_config('mtn')
  c.data.source, c.suggest[key] = 'demo', value
  assert c.suggest.strategy == 'generate'  # a strategy that reads none of them
  with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
    config_lib.validate(c)


@pytest.mark.parametrize('section, key, value', [
    ('serve', 'max_wait_ms', float('nan')), ('serve', 'drain_quiet_seconds', float('nan')),
    ('serve', 'max_wait_ms', -1.0), ('data', 'split_fractions', (0.5, float('nan'), 0.5)),
])
def test_a_nan_or_negative_time_or_share_is_refused(section, key, value):
  # NaN passes a `value < 0` test (every comparison with it is false): each check is written
  # so that it fails instead.
  c = default.get_config('mtn')
  c.data.source, c[section][key] = 'demo', value
  with pytest.raises(config_lib.ConfigError, match=re.escape(f'config.{section}.{key}')):
    config_lib.validate(c, 'serve')


@pytest.mark.parametrize('section, key, value, message', [
    ('decode', 'length_penalty', float('nan'), 'must be a finite number, got nan'),
    ('decode', 'length_penalty', float('inf'), 'must be a finite number, got inf'),
    ('train', 'adam_eps', float('inf'), 'must be a finite number'),
    ('train', 'learning_rate', float('-inf'), 'must be a finite number'),
    ('decode', 'beam_size', 99_999_999_999, 'is out of range (at most 2,147,483,647)'),
    ('decode', 'beam_size', -99_999_999_999, 'is out of range (at most 2,147,483,647)'),
    ('data', 'split_fractions', (float('nan'), 0.5, 0.5), 'must be a finite number'),
    ('data', 'split_fractions', (0.5, 0.2, 0.2), 'summing to 1'),
    ('train', 'adam_b1', 1.0, 'must be in [0, 1)'),
    ('train', 'adam_b2', 1.0, 'must be in [0, 1)'),
])
def test_no_key_takes_a_nan_an_infinity_or_a_count_past_32_bits(section, key, value, message):
  # Unchecked, each ran: NaN or infinite penalties and rates to empty or meaningless lists
  # and a model that learns nothing, a huge count to an overflow deep inside.
  c = default.get_config('mtn')
  c.data.source, c[section][key] = 'demo', value
  with pytest.raises(config_lib.ConfigError, match=re.escape(f'config.{section}.{key}')
                     + '.*' + re.escape(message)):
    config_lib.validate(c, 'train')
  c.seed = c.data.split_seed = c.data.demo_seed = 2**40  # a seed may be larger
  c[section][key] = default.get_config('mtn')[section][key]
  config_lib.validate(c, 'train')
  c.data.max_query_words = config_lib.MAX_COUNT  # the largest count is taken
  config_lib.validate(c, 'preprocess')


def test_more_suggestions_than_the_beam_only_where_the_strategy_pools_more():
  c = default.get_config('mtn')
  c.data.source, c.decode.beam_size, c.decode.top_k = 'demo', 10, 20
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "config.decode.top_k (20) cannot exceed config.decode.beam_size (10) with "
      "config.suggest.strategy='generate'")):
    config_lib.validate(c, 'decode')
  for strategy in ('blend', 'learned'):  # the service's k goes as far
    c.suggest.strategy = strategy
    config_lib.validate(c, 'eval')
  # A ranker's own 'generate' list is its pool, not a beam: the beam's size bounds nothing.
  c = default.get_config('polyencoder')
  c.data.source, c.decode.beam_size, c.decode.top_k = 'demo', 10, 20
  config_lib.validate(c, 'eval')


@pytest.mark.parametrize('key, value, message', [
    ('seed', -1, 'config.seed must be >= 0, got -1'),
    ('data.split_seed', -1, 'config.data.split_seed must be >= 0'),
    ('data.demo_seed', -2, 'config.data.demo_seed must be >= 0'),
    ('input.worker_count', -1, 'config.input.worker_count must be >= 0'),
    ('input.prefetch_batches', 0, 'config.input.prefetch_batches must be positive'),
    ('train.max_steps', -1, 'config.train.max_steps must be >= 0'),
    ('train.grad_clip_norm', -1.0, 'config.train.grad_clip_norm must be >= 0'),
    ('train.adam_b1', 2.0, 'config.train.adam_b1 must be in [0, 1)'),
    ('train.adam_eps', 0.0, 'config.train.adam_eps must be positive'),
    ('train.held_out_fold', 3, 'config.train.held_out_fold=3 is read only with '
                               'config.train.user_folds=K'),
    ('decode.max_eval_sessions', -5, 'config.decode.max_eval_sessions must be >= 0'),
    ('data.history_queries', -1, 'config.data.history_queries must be >= 0'),
    ('suggest.ranker_rounds', 0, 'config.suggest.ranker_rounds must be positive'),
    ('suggest.unrelated_first', -1, 'config.suggest.unrelated_first must be >= 0'),
])
def test_a_value_no_run_can_use_is_refused_naming_its_key(key, value, message):
  c = default.get_config('mtn')
  c.data.source = 'demo'
  section, _, name = key.rpartition('.')
  (c[section] if section else c)[name] = value
  with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
    config_lib.validate(c, 'all')


RERANK = {'suggest.strategy': 'rerank', 'suggest.ranker_workdir': 'ranker'}  # its keys' rules
# Each rule's edge: the first value refused (with its message), and beside it the last value
# accepted. Values from `default.get_config('mtn')`: sessions of 3 to 5 queries (the model
# reads 16), 256 training queries a batch, a beam of 5.
EDGES = [
    ({'data.min_session_queries': 1}, {'data.min_session_queries': 2},
     'config.data.min_session_queries must be at least 2'),
    ({'data.min_session_queries': 6}, {'data.min_session_queries': 5},
     'config.data.max_session_queries (5) is below config.data.min_session_queries (6)'),
    ({'data.tokenizer': 'sentencepiece', 'data.vocab_size': 299},
     {'data.tokenizer': 'sentencepiece', 'data.vocab_size': 300, 'decode.max_len': 25},
     'config.data.vocab_size must be at least 300 with sentencepiece'),
    ({'data.max_query_tokens': 0, 'data.tokenizer': 'sentencepiece', 'data.vocab_size': 300},
     {'data.max_query_tokens': 1, 'data.tokenizer': 'sentencepiece', 'data.vocab_size': 300},
     'config.data.max_query_tokens must be positive'),
    ({'data.train_users': 5}, {'data.train_users': 5, 'data.split_by': 'user'},
     "config.data.train_users=5: a number of training users >= 0, with "
     "config.data.split_by='user' only"),
    ({'model.max_session_queries': 4}, {'model.max_session_queries': 5},
     'config.model.max_session_queries (4) must be >= config.data.max_session_queries (5)'),
    ({'input.train_queries_per_batch': 4}, {'input.train_queries_per_batch': 5},
     'config.input.train_queries_per_batch (4) must hold at least one session of '
     'config.data.max_session_queries (5) queries'),
    ({'train.label_smoothing': 1.0}, {'train.label_smoothing': 0.0},
     'config.train.label_smoothing must be in [0, 1), got 1.0'),
    ({'train.warmup_steps': 0}, {'train.warmup_steps': 1},
     'config.train.warmup_steps must be positive with the transformer schedule'),
    ({'train.schedule': 'constant', 'train.warmup_steps': 10},
     {'train.schedule': 'constant', 'train.warmup_steps': 0},
     'config.train.warmup_steps=10: the constant schedule has no warm-up and reads none '
     '(set it to 0)'),
    ({'decode.top_k': 6}, {'decode.top_k': 5},
     'config.decode.top_k (6) cannot exceed config.decode.beam_size (5)'),
    ({'serve.port': 65536}, {'serve.port': 65535}, 'config.serve.port must be in 0..65535'),
    ({'serve.host': ''}, {'serve.host': '::1'}, 'config.serve.host is empty'),
    ({'serve.deadline_ms': 0.0}, {'serve.deadline_ms': 1.0},
     'config.serve.deadline_ms must be positive'),
    ({'serve.max_body_bytes': 0}, {'serve.max_body_bytes': 17},
     'config.serve.max_body_bytes must be positive'),
    ({'serve.max_body_bytes': 16}, {'serve.max_body_bytes': 17},
     'config.serve.max_body_bytes (16) would refuse every request: the shortest, '
     '{"session":["a"]}, is 17 bytes'),
    ({'serve.history_per_user': 0}, {'serve.history_per_user': 1},
     'config.serve.history_per_user must be positive'),
    ({'suggest.past_queries': 0}, {'suggest.past_queries': 1},
     'config.suggest.past_queries must be positive'),
    ({'data.train_users': -1, 'data.split_by': 'user'},
     {'data.train_users': 0, 'data.split_by': 'user'},
     'config.data.train_users=-1: a number of training users >= 0'),
    ({'suggest.popular': -1, **RERANK}, {'suggest.popular': 0, **RERANK},
     'config.suggest.popular must be >= 0'),
    ({'suggest.imdna_proposed': 0, 'suggest.imdna_workdir': 'imdna', **RERANK},
     {'suggest.imdna_proposed': 1, 'suggest.imdna_workdir': 'imdna', **RERANK},
     'config.suggest.imdna_proposed must be positive'),
]


@pytest.mark.parametrize('refused, accepted, message', EDGES,
                         ids=[next(iter(r)) for r, _, _ in EDGES])
def test_each_rule_refuses_the_first_value_past_its_edge_and_takes_the_last_within(
    refused, accepted, message):
  """An off-by-one in a rule either refuses a config that works (the edge value a user was
  told is allowed) or lets through one that fails later, mid-run: both edges, by the key."""
  for values, ok in ((refused, False), (accepted, True)):
    c = default.get_config('mtn')
    c.data.source = 'demo'
    for key, value in values.items():
      section, name = key.split('.')
      c[section][name] = value
    if ok:
      config_lib.validate(c, 'all')
    else:
      with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
        config_lib.validate(c, 'all')


@pytest.mark.parametrize('raw_files', ['', ' , '])
def test_raw_files_that_name_no_file_are_refused_where_the_log_is_read(raw_files):
  """An AOL config whose raw_files names no file (empty, or commas and spaces alone) is
  refused by the modes that read the log (preprocessing, and training, which prepares the
  data first); the others read a workdir's prepared data."""
  c = default.get_config('mtn')
  c.data.raw_files = raw_files
  assert c.data.source == 'aol'
  for mode in ('all', 'preprocess', 'train'):
    with pytest.raises(config_lib.ConfigError, match='config.data.raw_files is empty'):
      config_lib.validate(c, mode)
  config_lib.validate(c, 'eval')


def test_a_habit_rate_of_one_is_a_rate_and_above_one_is_refused():
  c = default.get_config('mtn')
  c.data.source, c.suggest.strategy, c.suggest.ranker_workdir = 'demo', 'rerank', '/runs/poly'
  c.suggest.habit_rate = 1.0
  config_lib.validate(c, 'eval')
  c.suggest.habit_rate = 1.01
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      'config.suggest.habit_rate must be in [0, 1], got 1.01')):
    config_lib.validate(c, 'eval')


@pytest.mark.parametrize('strategy', ['generate', 'blend', 'learned'])
def test_a_ranker_workdir_is_refused_where_no_strategy_reads_it(strategy):
  c = default.get_config('mtn')
  c.data.source, c.suggest.strategy, c.suggest.ranker_workdir = 'demo', strategy, '/runs/poly'
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "config.suggest.ranker_workdir is read by 'retrieve' and 'rerank' only, but "
      f"config.suggest.strategy is {strategy!r}")):
    config_lib.validate(c)


@pytest.mark.parametrize('strategy, runs', [('retrieve', 'a Bi- or Poly-encoder run'),
                                             ('rerank', 'a Bi-, Poly- or Cross-encoder run')])
def test_a_strategy_of_a_ranker_without_one_names_the_runs_it_takes(strategy, runs):
  c = default.get_config('mtn')
  c.data.source, c.suggest.strategy = 'demo', strategy
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      f"config.suggest.strategy={strategy!r} needs a trained ranker: pass "
      f"--config.suggest.ranker_workdir=DIR ({runs})")):
    config_lib.validate(c)


@pytest.mark.parametrize('name, key, value, reader', [
    ('crossencoder', 'pool_negatives', 5, 'the Bi- and Poly-encoders'),
    ('crossencoder', 'context_encoder', 'mtn', 'the Bi- and Poly-encoders'),
    ('crossencoder', 'poly_codes', 64, 'the Poly-encoder'),
    ('crossencoder', 'lexical_negatives', 5, 'the Bi- and Poly-encoders'),
    ('biencoder', 'poly_codes', 64, 'the Poly-encoder'),
    ('polyencoder', 'cross_negatives', 99, 'the Cross-encoder'),
    ('polyencoder', 'copy', True, 'the generators'),
    ('biencoder', 'attention_hidden', 99, "the generators' user memory"),
])
def test_a_rankers_key_it_does_not_read_is_refused(name, key, value, reader):
  """The rankers share one family's keys (configs/families.py): set for a ranker that does
  not read it, a key would change nothing."""
  c = default.get_config(name)
  c.data.source, c.model[key] = 'demo', value
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      f"config.model.{key} is for {reader}")):
    config_lib.validate(c)
  c.model[key] = default.get_config(name).model[key]
  config_lib.validate(c)


def config_of(name):
  """Model `name`'s config that validates: its config file's for IMDNA (whose task settings
  come with it), on a log named only; every default on the demo log for the others."""
  if name == 'imdna':
    from configs import imdna_aol  # pylint: disable=g-import-not-at-top
    c = imdna_aol.get_config()
    c.data.raw_files = 'log.tsv'
    return c
  c = default.get_config(name)
  c.data.source = 'demo'
  return c


@pytest.mark.parametrize('name, key, value', [
    ('zam', 'dropout', 0.1), ('zam', 'compute_dtype', 'bfloat16'),
    ('zam', 'share_embeddings', True), ('imdna', 'tie_embeddings', True),
    ('imdna', 'compute_dtype', 'bfloat16'), ('crossencoder', 'tie_embeddings', True),
])
def test_a_key_every_model_holds_is_refused_where_the_model_does_not_read_it(name, key, value):
  """Every model's config holds dropout, the word tables' sharing and the compute dtype
  (configs/default.py); a model that reads one not (ZAM has no dropout, no ranker an output
  layer) refuses it set to anything but the value that says so, which its config holds."""
  c = config_of(name)
  config_lib.validate(c)
  inert = c.model[key]
  c.model[key] = value
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      f"config.model.{key}={value!r}: {name!r} does not read it (leave it at {inert!r})")):
    config_lib.validate(c)


@pytest.mark.parametrize('name, strategy', [('polyencoder', 'learned'), ('zam', 'blend'),
                                            ('crossencoder', 'rerank')])
def test_a_strategy_over_a_generators_beam_is_refused_for_a_ranker(name, strategy):
  """Before any work: the pipeline would refuse it only after training."""
  c = default.get_config(name)
  c.data.source, c.suggest.strategy = 'demo', strategy
  if strategy == 'rerank':
    c.suggest.ranker_workdir = '/runs/poly'
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      f"config.suggest.strategy={strategy!r} orders a generative model's suggestions")):
    config_lib.validate(c)


@pytest.mark.parametrize('name, key, value, message', [
    ('polyencoder', 'entropy_weight', 0.1, "config.train.entropy_weight regularises a "
                                           "generator's output"),
    ('imdna', 'user_folds', 2, "'imdna' trains on data of its own"),
    ('crossencoder', 'label_smoothing', 0.05, "config.train.label_smoothing smooths a "
                                              "generator's targets"),
    ('zam', 'label_smoothing', 0.1, "'zam' scores candidates and reads none"),
    ('imdna', 'label_smoothing', 0.05, "'imdna' scores candidates and reads none"),
    ('zam', 'user_folds', 2, "config.model.user_model='hem' learns a vector per training user"),
])
def test_a_training_key_the_task_does_not_read_is_refused(name, key, value, message):
  """Set for a task that does not read it (and left at its default, which for such a task
  is the value that changes nothing), a training key is refused."""
  c = config_of(name)
  c.data.split_by, c.train[key] = 'user', value
  if name == 'zam':
    c.model.user_model = 'hem'
  with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
    config_lib.validate(c)
  c.train[key] = 0
  config_lib.validate(c)


def test_the_generators_are_the_models_that_suggest_word_by_word():
  """configs/families.py's list (which sets the others' label smoothing to 0) is the
  tasks'."""
  from mtn_jax import models, tasks  # pylint: disable=g-import-not-at-top
  assert set(families.GENERATORS) == {
      n for n in models.REGISTRY
      if issubclass(tasks.task_class(default.get_config(n).model), tasks.Suggests)}


def test_the_rankers_mbr_is_for_rerank_only():
  c = default.get_config('mtn')
  c.data.source, c.decode.mbr = 'demo', 'ranker'
  with pytest.raises(config_lib.ConfigError, match="'ranker' reorders the pooled candidates"):
    config_lib.validate(c)


def parse_error(override: str) -> str:
  """The one line the command line prints for an override of a key the config lacks, from
  the KeyError ml_collections raises for it (tests/test_cli_errors.py runs the real one)."""
  key = override.split('=')[0].rsplit('.', 1)[1]
  argv = ['main', '--config=configs/demo.py', override]
  return cli_errors.flag_error_message(KeyError(repr(key)), argv)


@pytest.mark.parametrize('override, replacement', [
    ('--config.decode.rerank=mbr+session', "config.decode.mbr ('mbr' is now 'beam'"),
    ('--config.suggest.mbr=True', "config.decode.mbr (True is now 'ranker'"),
    ('--config.serve.user_facing=False', 'config.decode.exclude_session_queries'),
])
def test_a_retired_switch_names_the_key_that_replaced_it(override, replacement):
  name = override.split('=')[0]
  assert parse_error(override) == f'{name} was replaced by {cli_errors.REPLACED_KEYS[name[9:]]}'
  assert replacement in cli_errors.REPLACED_KEYS[name[9:]]


def test_a_key_of_another_family_names_the_models_that_read_it():
  assert parse_error('--config.model.lstm_units=8') == (
      "--config.model.lstm_units: config.model has no key 'lstm_units': only seq2seq, hred, "
      "mnsrf read it, not this config's model (configs/families.py)")
  assert parse_error('--config.model.nmu_heads=4') == (
      "--config.model.nmu_heads: config.model has no key 'nmu_heads'. configs/default.py "
      'lists every key.')


def test_the_service_reads_the_decode_protocol(monkeypatch):
  """--mode=serve is user-facing unless config.decode.exclude_session_queries says not."""
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  from mtn_jax.serving import engine  # pylint: disable=g-import-not-at-top
  cfg = types.SimpleNamespace(max_session_queries=4, max_query_words=5)
  fake = types.SimpleNamespace(trained=types.SimpleNamespace(cfg=cfg, vocab=None, query_words=5))
  monkeypatch.setattr(engine, '_listen', lambda: None)
  monkeypatch.setattr(engine.Engine, 'warm_up', lambda self, *args, **kwargs: None)
  monkeypatch.setattr(pipeline.Pipeline, 'load', lambda config, workdir, log: fake)
  config = default.get_config('mtn')
  assert config.decode.exclude_session_queries is None
  assert engine.Engine.load(config, '/nowhere').exclude_session_queries
  config.decode.exclude_session_queries = False
  assert not engine.Engine.load(config, '/nowhere').exclude_session_queries


# ---------------------------------------------------------------------------------------------
# Configs saved before the families


# What a run of the union config saved (config.json's 'config', a checkpoint's meta): every
# family's keys under model, and the retired switches.
OLD_MODEL = dict(
    name='mtn', emb_dim=16, d_model=16, num_heads=2, ff_dim=32, query_layers=1,
    session_layers=1, num_levels=2, decoder_layers=1, dropout=0.1, share_embeddings=False,
    tie_embeddings=False, pre_norm=False, learned_positions=False, scan_layers=False,
    scan_unroll=1, remat='none', compute_dtype='float32', copy=False, lstm_units=8,
    state_dim=128, inference_steps=3, hidden_units=4096, reader='attention',
    user_memory='none', user_model='zam', attention_hidden=8, query_from='last',
    item_negatives=10, word_negatives=5, max_session_queries=16, context_encoder='flat',
    poly_codes=16, cross_negatives=15, pool_negatives=0, session_candidates=False,
    lexical_negatives=0, scaled_scores=False)
OLD_DECODE = dict(beam_size=10, length_penalty=1.2, max_len=11, top_k=10, emit_unk=False,
                  block_repeats=True, rerank='mbr+session', exclude_session_queries=None,
                  batch_sessions=128, input='', output='', max_eval_sessions=0,
                  eval_split='test')


def test_an_old_saved_decode_section_searches_as_it_did():
  settings = search.SearchSettings.from_config(ml_collections.ConfigDict(OLD_DECODE))
  assert settings.mbr == 'beam+session' and settings.beam_size == 10
  assert mbr.from_decode(ml_collections.ConfigDict(OLD_DECODE)) == ('beam+session', False)
  new = default.get_config('mtn').decode
  new.update(beam_size=10, top_k=10, length_penalty=1.2, block_repeats=True,
             mbr='beam+session')
  assert search.SearchSettings.from_config(new) == settings


@pytest.mark.parametrize('name', ['mtn', 'polyencoder', 'hred'])
def test_an_old_checkpoints_model_config_maps_to_the_same_model(name):
  sizes = dict(vocab_size=50, max_query_words=5)
  saved = models.make_config({**OLD_MODEL, 'name': name}, **sizes)
  meta = {'model': {**dict(vars(saved))}}
  # Read back with today's config of its family, and with another family's (a ranker loaded
  # by a recurrent generator's run): the checkpoint's own model either way.
  # The runtime fields (`RUNTIME_FIELDS`) are the current config's where it has them.
  for current in (default.get_config(name).model, default.get_config('hred').model):
    runtime = {k: current[k] for k in saved.RUNTIME_FIELDS if k in current}
    assert trained_lib.saved_model_config(meta, current) == saved.replace(**runtime)
  # Today's config of the family with the same values makes the same model.
  model = default.get_config(name).model
  model.update({k: v for k, v in OLD_MODEL.items() if k in model and k != 'name'})
  assert models.make_config(model, **sizes) == saved


# ---------------------------------------------------------------------------------------------
# Config files

# Every variant of every config file that takes one; a file whose get_config() takes a
# variant must be listed here, so a new variant is not left untested by accident.
VARIANTS = {
    'aol': ('', 'small'),
    'transformer_aol': ('', 'small', 'enc5dec5', 'small,enc5dec5'),
    'seq2seq_aol': ('', 'small'),
    'hred_aol': ('', 'small'),
    'mnsrf_aol': ('', 'small'),
    'default': ('mtn', 'transformer', 'biencoder', 'polyencoder', 'crossencoder'),
    'demo': ('', 'transformer'),
    'imdna_movies': ('', 'qa', 'recs', 'test', 'qa+embeddings', 'recs+embeddings'),
    'imdna_aol': ('', 'embeddings'),
    'polyencoder_aol': ('', 'small', 'poly64', 'poly360', 'bi', 'cross', 'demo', 'demo_bi',
                        'demo_cross'),
    'zam_aol': ('', 'zam', 'aem', 'hem', 'qem', 'demo', 'mtn', 'mtn_aem', 'mtn_zam'),
}
# The configs that `experiments/compare.sh` runs against each other.
COMPARED = ('aol:small', 'transformer_aol:small', 'transformer_aol:small,enc5dec5',
            'seq2seq_aol:small', 'hred_aol:small', 'mnsrf_aol:small')


def load_config(name: str, variant: str = ''):
  """What `--config=configs/NAME.py[:VARIANT]` loads (ml_collections passes the variant)."""
  module = importlib.import_module(f'configs.{name}')
  config = module.get_config(variant) if variant else module.get_config()
  # Validation asks for a log only of configs that read one; any path will do here.
  if config.data.source == 'aol':
    config.data.raw_files = config.data.raw_files or 'log.tsv'
  return config


def config_files() -> list[str]:
  """The config files (configs/families.py holds the families' keys, no config)."""
  return sorted(p.stem for p in (cli.REPO / 'configs').glob('*.py')
                if p.stem not in ('__init__', 'families'))


def flat_keys(config, prefix: str = '') -> set[str]:
  keys = set()
  for key, value in config.items():
    if hasattr(value, 'items'):
      keys |= flat_keys(value, f'{prefix}{key}.')
    else:
      keys.add(prefix + key)
  return keys


@pytest.mark.parametrize('name', config_files())
def test_every_config_and_variant_loads_and_validates(name):
  takes_variant = bool(inspect.signature(
      importlib.import_module(f'configs.{name}').get_config).parameters)
  if takes_variant:
    assert name in VARIANTS, f'configs/{name}.py takes variants: list them in VARIANTS'
  shared = flat_keys(load_config('default'))
  for variant in VARIANTS.get(name, ('',)):
    config = load_config(name, variant)
    config_lib.validate(config)
    # Every config starts from default.py with its model's family (configs/families.py): a
    # key has one name and one meaning everywhere, and config.model holds the keys its model
    # reads, no other family's. IMDNA's task adds config.imdna (and the movie knowledge base
    # config.movies).
    family = {f'model.{k}' for k in families.keys(config.model.name)}
    task = {k for k in flat_keys(config) if k.split('.')[0] in ('imdna', 'movies')}
    assert not task or config.model.name == 'imdna', f'configs/{name}.py:{variant}'
    assert flat_keys(config) == shared | family | task, f'configs/{name}.py:{variant}'
  if takes_variant:
    with pytest.raises(ValueError, match=rf'configs/{name}\.py: unknown variant'):
      load_config(name, 'no-such-variant')


def test_compared_configs_share_data_and_budget():
  configs = {spec: load_config(*spec.split(':')) for spec in COMPARED}
  reference = configs['aol:small']
  for spec, config in configs.items():
    # Same data config and seeds: every workdir builds the same corpus and split.
    assert config.data.to_dict() == reference.data.to_dict(), spec
    assert config.seed == reference.seed, spec
    for key in ('num_epochs', 'max_steps'):
      assert config.train[key] == reference.train[key], (spec, key)
    assert config.input.to_dict() == reference.input.to_dict(), spec
    assert config.decode.to_dict() == reference.decode.to_dict(), spec
  # Every generative model is compared (the rankers are evaluated on their own terms).
  generative = [name for name, task in registry.TASKS.items()
                if task is tasks.GenerationTask]
  compared = {c.model.name for c in configs.values()}
  missing = sorted(set(generative) - compared)
  assert not missing, (f'{missing}: every generative model is in the paper comparison: add '
                       'configs/NAME_aol.py with a :small variant to COMPARED and to '
                       'experiments/compare.sh')
  assert compared <= set(generative), sorted(compared - set(generative))  # rankers: their own


@pytest.mark.parametrize('name', ['seq2seq_aol', 'hred_aol', 'mnsrf_aol'])
def test_recurrent_configs_follow_the_paper(name):
  config = load_config(name)
  assert (config.model.lstm_units, config.model.emb_dim, config.model.dropout) == (256, 300, 0.1)
  assert (config.train.schedule, config.train.learning_rate) == ('constant', 0.001)
  assert config.train.label_smoothing == 0
  assert config.train.entropy_weight == (0.1 if name == 'mnsrf_aol' else 0.0)
  small = load_config(name, 'small')
  assert (small.train.schedule, small.train.learning_rate) == ('constant', 0.003)
  assert small.train.entropy_weight == config.train.entropy_weight
