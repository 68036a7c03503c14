"""MTN and Transformer: whole-session passes equal per-pair runs, causality, padding, KV cache.

Tiny models (d_model 16, 2 heads, vocabulary 50); compiled functions are cached per config so
each shape compiles once for the whole file. Parameters are random draws of the models' shapes:
every property tested holds for any weights, and drawing them costs no compilation.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mtn_jax.data.vocab import BOS_ID

from mtn_jax.data.vocab import EOS_ID

from mtn_jax.data.vocab import PAD_ID

from mtn_jax.data.vocab import SEP_ID
from mtn_jax.models import count_params
from mtn_jax.models import create_model
from mtn_jax.models import decoder_io
from mtn_jax.models import layers
from mtn_jax.models import make_config
from mtn_jax.models import ModelConfig
from mtn_jax.models import REGISTRY
from mtn_jax.models.base import session_sources
from mtn_jax.models.mtn import MTNEncoder
from mtn_jax.models.transformer import FlatSessionEncoder

VOCAB, WORDS, QUERIES, BATCH = 50, 5, 3, 2


BASE = make_config(dict(
    name='mtn', vocab_size=VOCAB, max_query_words=WORDS, emb_dim=16, d_model=16, num_heads=2,
    ff_dim=32, query_layers=2, session_layers=2, num_levels=2, decoder_layers=2, dropout=0.1,
    share_embeddings=False, tie_embeddings=False, pre_norm=False, learned_positions=False,
    scan_layers=True, remat='none', compute_dtype='float32', max_session_queries=8, copy=False))
# The three configs the equivalence tests run; between them they cover both layer layouts,
# both norm placements, both position encodings, shared and separate word tables, tied outputs
# and emb_dim != d_model.
MTN2 = BASE
MTN3 = BASE.replace(num_levels=3, scan_layers=False, pre_norm=True, learned_positions=True,
                    tie_embeddings=True, emb_dim=12, query_layers=1, session_layers=1,
                    decoder_layers=1)
TRANSFORMER = make_config(dataclasses.asdict(BASE), name='transformer', share_embeddings=True,
                          tie_embeddings=True, emb_dim=12)
# With a copy head (`mtn_jax.models.copying`): its attention and gate keep every invariance.
MTN_COPY = MTN3.replace(copy=True)
TRANSFORMER_COPY = TRANSFORMER.replace(copy=True, tie_embeddings=False)
CONFIGS = {'mtn_k2': MTN2, 'mtn_k3': MTN3, 'transformer': TRANSFORMER, 'mtn_copy': MTN_COPY,
           'transformer_copy': TRANSFORMER_COPY}


def make_queries(seed, batch=BATCH, num_queries=QUERIES, words=WORDS):
  """int32 [batch, num_queries, words]: 1..words real words per query, then padding."""
  rng = np.random.default_rng(seed)
  queries = rng.integers(SEP_ID + 1, VOCAB, size=(batch, num_queries, words))
  lengths = rng.integers(1, words + 1, size=(batch, num_queries))
  queries[np.arange(words) >= lengths[..., None]] = PAD_ID
  return jnp.asarray(queries, jnp.int32)


@functools.lru_cache(maxsize=None)
def compiled(cfg: ModelConfig):
  """Jitted forward / encode / cache creation / decode step of the model of `cfg`."""
  model = create_model(cfg)
  decode = functools.partial(model.apply, method='decode', mutable=['cache'], decode=True)
  return dict(
      forward=jax.jit(lambda params, queries: model.apply(
          {'params': params}, {'queries': queries}, train=False)),
      encode=jax.jit(lambda params, queries: model.apply(
          {'params': params}, {'queries': queries}, method='encode')),
      init_cache=jax.jit(lambda params, memory, inputs: decode(
          {'params': params}, memory, inputs)[1]['cache']),
      step=jax.jit(lambda params, cache, memory, token: decode(
          {'params': params, 'cache': cache}, memory, token)),
  )


def random_like(shapes, seed=0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.5, s.shape), s.dtype), shapes)


def param_shapes(cfg: ModelConfig):
  return jax.eval_shape(lambda: create_model(cfg).init(
      jax.random.key(0), {'queries': make_queries(0)}, train=False))['params']


@functools.lru_cache(maxsize=None)
def init_params(cfg: ModelConfig):
  return random_like(param_shapes(cfg))


def pair_logliks(logits, queries):
  """float [B, S-1]: log-likelihood of each pair's next query (`</s>` included)."""
  _, targets, weights = decoder_io(queries)
  log_probs = jax.nn.log_softmax(logits)
  return (jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0] * weights).sum(-1)


@pytest.mark.parametrize('name', CONFIGS)
def test_session_pass_equals_each_prefix_alone(name):
  cfg = CONFIGS[name]
  fns, params = compiled(cfg), init_params(cfg)
  queries = make_queries(1)
  full = pair_logliks(fns['forward'](params, queries), queries)
  assert full.shape == (BATCH, QUERIES - 1)
  for t in range(QUERIES - 1):
    prefix = queries[:, :t + 2]
    alone = pair_logliks(fns['forward'](params, prefix), prefix)[:, -1]
    np.testing.assert_allclose(full[:, t], alone, atol=1e-5, rtol=0)
  assert np.all(np.asarray(full) < 0)


@pytest.mark.parametrize('name', CONFIGS)
def test_later_queries_never_change_earlier_positions(name):
  cfg = CONFIGS[name]
  fns, params = compiled(cfg), init_params(cfg)
  queries = make_queries(2)
  memory = fns['encode'](params, queries)
  logits = fns['forward'](params, queries)
  other = make_queries(3)
  for t in range(QUERIES - 1):
    changed = queries.at[:, t + 1:].set(other[:, t + 1:])
    changed_memory = fns['encode'](params, changed)
    for key in memory:
      rows = memory[key].reshape(BATCH, QUERIES, *memory[key].shape[1:])
      changed_rows = changed_memory[key].reshape(rows.shape)
      np.testing.assert_allclose(rows[:, :t + 1], changed_rows[:, :t + 1], atol=1e-6)
      # The check has teeth: the changed positions' vectors do move (a mask may not: a model
      # whose every position holds one vector has a mask of ones).
      if np.issubdtype(rows.dtype, np.floating):
        assert not np.allclose(rows[:, t + 1:], changed_rows[:, t + 1:], atol=1e-3), key
    changed_logits = fns['forward'](params, changed)
    np.testing.assert_allclose(logits[:, :t], changed_logits[:, :t], atol=1e-6)


@pytest.mark.parametrize('name', CONFIGS)
def test_padding_rows_change_nothing(name):
  cfg = CONFIGS[name]
  fns, params = compiled(cfg), init_params(cfg)
  queries = make_queries(4)
  # Same batch shape (nothing recompiles): a padding row takes session 1's place and session
  # 0 moves to the last row.
  padded = jnp.stack([jnp.zeros_like(queries[0]), queries[0]])
  logits = fns['forward'](params, queries)
  padded_logits = fns['forward'](params, padded)
  np.testing.assert_allclose(logits[0], padded_logits[1], atol=1e-5)
  # Every vocabulary word scores a finite number, in the padding row too; a copying model's
  # extended ids that no query holds have probability 0 (-inf), and nothing is NaN.
  assert np.isfinite(padded_logits[..., :VOCAB]).all()
  assert not np.isnan(padded_logits).any()


def test_transformer_longer_token_padding_changes_nothing():
  params = init_params(TRANSFORMER)
  queries = make_queries(5)
  wider = jnp.pad(queries, ((0, 0), (0, 0), (0, 3)))
  logits = compiled(TRANSFORMER)['forward'](params, queries)
  wider_logits = compiled(TRANSFORMER.replace(max_query_words=WORDS + 3))['forward'](
      params, wider)
  np.testing.assert_allclose(pair_logliks(logits, queries),
                             pair_logliks(wider_logits, wider), atol=1e-5)
  np.testing.assert_allclose(logits, wider_logits[:, :, :WORDS + 1], atol=1e-5)


def test_mtn_depends_only_on_real_tokens():
  """The padding id's embedding reaches no real token, no session vector and no target."""
  fns, params = compiled(MTN2), init_params(MTN2)
  queries = make_queries(6)
  moved = dict(params)
  for i, table in enumerate(('encoder_embedding', 'decoder_embedding')):
    moved[table] = {'embedding': params[table]['embedding'].at[PAD_ID].set(
        10.0 * jax.random.normal(jax.random.key(i), (16,)))}
  memory, moved_memory = fns['encode'](params, queries), fns['encode'](moved, queries)
  real = np.asarray(memory['mask'])
  np.testing.assert_allclose(np.asarray(memory['tokens'])[real],
                             np.asarray(moved_memory['tokens'])[real], atol=1e-5)
  assert not np.allclose(np.asarray(memory['tokens'])[~real],
                         np.asarray(moved_memory['tokens'])[~real], atol=1e-3)
  np.testing.assert_allclose(pair_logliks(fns['forward'](params, queries), queries),
                             pair_logliks(fns['forward'](moved, queries), queries), atol=1e-5)


def test_mtn_refuses_other_query_widths():
  model = create_model(MTN2)
  with pytest.raises(ValueError, match='max_query_words=5'):
    jax.eval_shape(lambda: model.init(
        jax.random.key(0), {'queries': make_queries(0, words=WORDS + 1)}, train=False))


def decode_stepwise(cfg, params, queries, memory):
  """float32 [B, S-1, T, V']: the decoder fed one token at a time through its KV cache.

  `memory` is the encoding of `queries` (all S positions). The steps see its tokens zeroed:
  cross-attention must read the keys and values the cache made from the real ones.
  """
  fns = compiled(cfg)
  # Keep positions 0..S-2 of every session: the contexts of the teacher-forced pairs.
  memory = jax.tree.map(
      lambda m: m.reshape(BATCH, QUERIES, *m.shape[1:])[:, :-1].reshape(-1, *m.shape[1:]),
      memory)
  inputs = decoder_io(queries)[0].reshape(BATCH * (QUERIES - 1), -1)
  cache = fns['init_cache'](params, memory, jnp.zeros_like(inputs))
  step_memory = {**memory, 'tokens': jnp.zeros_like(memory['tokens'])}
  steps = []
  for i in range(inputs.shape[1]):
    logits, variables = fns['step'](params, cache, step_memory, inputs[:, i:i + 1])
    cache = variables['cache']
    steps.append(logits)
  return jnp.concatenate(steps, axis=1).reshape(BATCH, QUERIES - 1, inputs.shape[1], -1)


@pytest.mark.parametrize('name', CONFIGS)
def test_cached_decoding_equals_teacher_forcing(name):
  cfg = CONFIGS[name]
  params = init_params(cfg)
  queries = make_queries(7)
  teacher_forced = compiled(cfg)['forward'](params, queries)
  memory = compiled(cfg)['encode'](params, queries)
  np.testing.assert_allclose(decode_stepwise(cfg, params, queries, memory), teacher_forced,
                             atol=1e-5)


def test_scan_checkpoint_runs_and_decodes_with_layer_loop():
  """Converted parameters: the loop layout computes what the scan layout does, cache too."""
  params = init_params(MTN2)
  loop_cfg = MTN2.replace(scan_layers=False)
  loop_params = layers.scan_to_loop_params(params)
  expected = param_shapes(loop_cfg)
  assert (jax.tree.map(lambda x: x.shape, loop_params)
          == jax.tree.map(lambda x: x.shape, expected))
  assert jax.tree.all(jax.tree.map(
      np.array_equal, layers.loop_to_scan_params(loop_params), params))
  queries = make_queries(8)
  scan_logits = compiled(MTN2)['forward'](params, queries)
  np.testing.assert_allclose(compiled(loop_cfg)['forward'](loop_params, queries), scan_logits,
                             atol=1e-5)
  memory = compiled(MTN2)['encode'](params, queries)
  np.testing.assert_allclose(decode_stepwise(loop_cfg, loop_params, queries, memory),
                             scan_logits, atol=1e-5)


def test_remat_keeps_values_and_gradients():
  """Rematerialisation trades memory for compute only: same loss and gradients, dropout too."""
  x = jnp.asarray(np.random.default_rng(9).normal(size=(3, 4, 16)), jnp.float32)
  mask = layers.padding_mask(jnp.arange(4) < jnp.array([[4], [2], [1]]))
  stack = layers.LayerStack(BASE, 2)
  params = random_like(jax.eval_shape(
      lambda: stack.init(jax.random.key(0), x, mask, train=False))['params'])

  def loss_and_grads(remat):
    stack = layers.LayerStack(BASE.replace(remat=remat), 2)

    def loss(params):
      y = stack.apply({'params': params}, x, mask, train=True,
                      rngs={'dropout': jax.random.key(1)})
      return jnp.sum(y * y)
    # What is rematerialised, and by which policy (the same values whether or not it is).
    program = str(jax.make_jaxpr(jax.grad(loss))(params))
    policies = set(re.findall(r'policy=(\w+)', program)) if 'remat' in program else None
    return jax.jit(jax.value_and_grad(loss))(params), policies

  (base_loss, base_grads), policies = loss_and_grads('none')
  assert policies is None
  for remat, policy in (('full', 'None'), ('dots', 'DotsSaveable')):
    (loss, grads), policies = loss_and_grads(remat)
    assert policies == {policy}, (remat, policies)
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6)
    jax.tree.map(functools.partial(np.testing.assert_allclose, atol=1e-5), grads, base_grads)


def test_unrolled_scan_draws_the_same_parameters_and_dropout_masks():
  """`scan_unroll` changes how the compiled loop runs, not what it computes: the same initial
  parameters, and with dropout on the same outputs and gradients, up to float rounding
  (another draw of parameters or dropout masks would move them by far more). Rounding only:
  XLA may compile the initialisers' arithmetic inside an unrolled loop body to code that
  rounds otherwise (it does with its older CPU emitters, tests/cli.py's TEST_XLA_FLAGS)."""
  rng = np.random.default_rng(4)
  x, weights = (jnp.asarray(rng.normal(size=(3, 4, 16)), jnp.float32) for _ in range(2))
  mask = layers.padding_mask(jnp.arange(4) < jnp.array([[4], [2], [1]]))

  def init_and_train(unroll, dropout_seed=1):
    stack = layers.LayerStack(BASE.replace(scan_unroll=unroll), 3)
    params = jax.jit(lambda: stack.init(jax.random.key(0), x, mask, train=False)['params'])()
    # The loop over layers is unrolled as asked (the values below are the same either way).
    program = str(jax.make_jaxpr(lambda p: stack.apply({'params': p}, x, mask, train=False))(
        params))
    assert re.findall(r'unroll=(\d+)', program) == [str(unroll)], program

    def loss(params):
      y = stack.apply({'params': params}, x, mask, train=True,
                      rngs={'dropout': jax.random.key(dropout_seed)})
      return jnp.sum(y * weights)  # not y * y: a post-norm stack's output has a fixed norm
    return params, jax.jit(jax.value_and_grad(loss))(params)

  params, (base_loss, base_grads) = init_and_train(1)
  for unroll in (2, 3):
    unrolled_params, (loss, grads) = init_and_train(unroll)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7),
                 unrolled_params, params)
    # The loss sums 192 terms of order 1 (to about 0.1), the gradients' entries are of order
    # 0.01: the parameters' rounding moves either by up to 1e-5, another mask by far more.
    np.testing.assert_allclose(loss, base_loss, rtol=1e-6, atol=1e-5)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5), grads,
                 base_grads)
  _, (other_masks_loss, _) = init_and_train(1, dropout_seed=2)
  assert abs(other_masks_loss - base_loss) > 1e-3 * abs(base_loss)


def test_bfloat16_compute_returns_float32_logits_close_to_float32():
  cfg = MTN2.replace(compute_dtype='bfloat16')
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(param_shapes(cfg)))
  params = init_params(MTN2)
  queries = make_queries(10)
  low = compiled(cfg)['forward'](params, queries)
  assert low.dtype == jnp.float32
  full = compiled(MTN2)['forward'](params, queries)
  np.testing.assert_allclose(jax.nn.log_softmax(low), jax.nn.log_softmax(full), atol=0.1)
  assert not np.array_equal(low, full)


def test_decoder_io_exact_values():
  queries = jnp.array([[[5, 6, 0], [7, 0, 0], [8, 9, 10]],
                       [[5, 0, 0], [0, 0, 0], [0, 0, 0]]], jnp.int32)
  inputs, targets, weights = decoder_io(queries)
  np.testing.assert_array_equal(inputs, [[[BOS_ID, 7, 0, 0], [BOS_ID, 8, 9, 10]],
                                         [[BOS_ID, 0, 0, 0], [BOS_ID, 0, 0, 0]]])
  np.testing.assert_array_equal(targets, [[[7, EOS_ID, 0, 0], [8, 9, 10, EOS_ID]],
                                          [[0, 0, 0, 0], [0, 0, 0, 0]]])
  np.testing.assert_array_equal(weights, [[[1, 1, 0, 0], [1, 1, 1, 1]],
                                          [[0, 0, 0, 0], [0, 0, 0, 0]]])


def test_session_sources_exact_values():
  queries = jnp.array([[[5, 6, 0], [7, 0, 0], [8, 9, 10]],
                       [[5, 0, 0], [0, 0, 0], [0, 0, 0]]], jnp.int32)
  sources, lengths = session_sources(queries)
  s = SEP_ID
  np.testing.assert_array_equal(sources, [
      [5, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0],
      [5, 6, s, 7, 0, 0, 0, 0, 0, 0, 0],
      [5, 6, s, 7, s, 8, 9, 10, 0, 0, 0],
      [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
      [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
      [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(lengths, (sources != PAD_ID).sum(-1))


def test_word_table_options_change_exactly_their_parameters():
  queries = make_queries(0)

  def num_params(cfg):
    return count_params(jax.eval_shape(lambda: create_model(cfg).init(
        jax.random.key(0), {'queries': queries}, train=False))['params'])

  for name in ('mtn', 'transformer'):
    separate = make_config(dataclasses.asdict(BASE), name=name)
    shared = separate.replace(share_embeddings=True)
    # A second table: vocabulary x emb_dim, plus its own projection when emb_dim != d_model.
    assert num_params(separate) - num_params(shared) == VOCAB * BASE.emb_dim
    assert (num_params(separate.replace(emb_dim=12)) - num_params(shared.replace(emb_dim=12))
            == VOCAB * 12 + 12 * BASE.d_model)
    # Tying drops the d_model x V output layer and its bias.
    assert num_params(separate) - num_params(separate.replace(tie_embeddings=True)) == (
        BASE.d_model * VOCAB + VOCAB)
    # emb_dim != d_model adds the emb_dim x d_model projection and shrinks the table.
    assert num_params(shared.replace(emb_dim=12)) - num_params(shared) == (
        12 * BASE.d_model - 4 * VOCAB)


@pytest.mark.parametrize('name', ['mtn_k3', 'transformer'])
def test_tied_output_layer_is_the_decoder_table(name):
  """Moving word 7's decoder-table row moves word 7's logits and no other.

  Both tied configs: MTN with separate tables, the Transformer with one. The sessions read
  word 7 in no query and no decoder input, so the row reaches the logits only through the
  tied output layer.
  """
  cfg = CONFIGS[name]
  share_embeddings = cfg.share_embeddings
  params = init_params(cfg)
  queries = make_queries(11)
  queries = jnp.where(queries == 7, 8, queries)
  table = 'word_embedding' if share_embeddings else 'decoder_embedding'
  assert ('encoder_embedding' in params) != share_embeddings
  moved = {**params, table: {**params[table],
                             'embedding': params[table]['embedding'].at[7].add(1.0)}}
  forward = compiled(cfg)['forward']
  changed = np.abs(np.asarray(forward(moved, queries) - forward(params, queries))).max(
      axis=(0, 1, 2)) > 1e-6
  np.testing.assert_array_equal(np.flatnonzero(changed), [7])


def test_registry_and_position_limits():
  with pytest.raises(ValueError, match="'lstm' is not a registered model"):
    create_model(BASE.replace(name='lstm'))
  assert create_model(BASE).encoder_class is MTNEncoder
  assert create_model(TRANSFORMER).encoder_class is FlatSessionEncoder
  assert {'mtn', 'transformer'} <= set(REGISTRY)
  cfg = MTN3.replace(max_session_queries=QUERIES - 1)
  with pytest.raises(ValueError, match='config.model.max_session_queries'):
    jax.eval_shape(lambda: create_model(cfg).init(jax.random.key(0), {'queries': make_queries(0)},
                                                  method='encode'))
  memory = {'tokens': jnp.zeros((2, WORDS, 16)), 'mask': jnp.ones((2, WORDS), bool)}
  too_long = jnp.zeros((2, MTN3.target_len + 1), jnp.int32)
  with pytest.raises(ValueError, match='config.data.max_query_words'):
    jax.eval_shape(lambda: create_model(MTN3).apply(
        {'params': init_params(MTN3)}, memory, too_long, decode=True, mutable=['cache'],
        method='decode'))


def test_sinusoid_matches_vaswani():
  encodings = layers.sinusoid(jnp.arange(3), 4)
  expected = [[np.sin(p), np.sin(p / 100), np.cos(p), np.cos(p / 100)] for p in range(3)]
  np.testing.assert_allclose(encodings, expected, atol=1e-6)


def test_parameter_shapes_are_traced_once_per_task_class_and_model_config(monkeypatch):
  """Loading a checkpoint restores into the parameters' shapes; tracing the model's init for
  them was most of a service's reload. They are a function of the model's config: traced
  once per (task class, config), each caller given a tree of its own."""
  from mtn_jax.tasks import base  # pylint: disable=g-import-not-at-top
  traced = []
  real = jax.eval_shape
  def counted(f, *args):
    if getattr(f, '__name__', '') == 'init_params':  # (flax calls it too, inside an init)
      traced.append(f)
    return real(f, *args)
  monkeypatch.setattr(jax, 'eval_shape', counted)
  cfg = MTN3.replace(ff_dim=24)  # a config no other test has traced in this process
  first = base.GenerationTask(cfg).abstract_params()
  again = base.GenerationTask(make_config(dataclasses.asdict(cfg))).abstract_params()
  assert len(traced) == 1
  assert again is not first and jax.tree.structure(again) == jax.tree.structure(first)
  assert jax.tree.leaves(again) == jax.tree.leaves(first)
  wider = base.GenerationTask(cfg.replace(ff_dim=40)).abstract_params()
  assert len(traced) == 2
  assert jax.tree.leaves(wider) != jax.tree.leaves(first)
  expected = jax.eval_shape(base.GenerationTask(cfg).init_params, jax.random.PRNGKey(0))
  assert jax.tree.leaves(first) == jax.tree.leaves(expected)


def test_tree_positions_and_mask_by_hand():
  """Two sequences sharing the prefix `<s> a` (positions 0, 1) after which one reads b
  (position 2) and the other c (position 3), a third sequence of its own (4, 5) and padding
  (6): each position sees itself and its ancestors only, at its depth."""
  parents = jnp.array([[-1, 0, 1, 1, -1, 4, -1]])
  positions, mask = layers.tree_positions_and_mask(parents)
  np.testing.assert_array_equal(positions, [[0, 1, 2, 2, 0, 1, 0]])
  sees = {i: set(np.flatnonzero(row).tolist()) for i, row in enumerate(np.asarray(mask[0, 0]))}
  assert sees == {0: {0}, 1: {0, 1}, 2: {0, 1, 2}, 3: {0, 1, 3}, 4: {4}, 5: {4, 5}, 6: {6}}
  # Side by side (no prefix shared), each sequence is causal within itself; a chain as long
  # as the row is seen whole (the squaring reaches every ancestor).
  chain = jnp.arange(-1, 15)[None]
  positions, mask = layers.tree_positions_and_mask(chain)
  np.testing.assert_array_equal(positions[0], np.arange(16))
  np.testing.assert_array_equal(mask[0, 0], np.tril(np.ones((16, 16), bool)))


@pytest.mark.parametrize('name', CONFIGS)
def test_earlier_queries_reach_every_later_position(name):
  """The converse of causality: a change to query 0 alone moves the encoding of every later
  query and every pair's likelihood; the session context is what MTN adds to a query
  encoder (without it each query would be encoded alone)."""
  cfg = CONFIGS[name]
  fns, params = compiled(cfg), init_params(cfg)
  queries = make_queries(2)
  changed = queries.at[:, 0].set(make_queries(3)[:, 0])
  memory, changed_memory = fns['encode'](params, queries), fns['encode'](params, changed)
  rows = memory['tokens'].reshape(BATCH, QUERIES, *memory['tokens'].shape[1:])
  changed_rows = changed_memory['tokens'].reshape(rows.shape)
  for t in range(1, QUERIES):
    assert not np.allclose(rows[:, t], changed_rows[:, t], atol=1e-3), t
  moved = np.abs(np.asarray(pair_logliks(fns['forward'](params, queries), queries)
                            - pair_logliks(fns['forward'](params, changed), changed)))
  assert (moved > 1e-4).all(), moved


@pytest.mark.parametrize('name', ['mtn_k2', 'mtn_k3', 'transformer'])
def test_the_order_of_earlier_queries_is_read(name):
  """Swapping queries 0 and 1 of a 4-query session moves the likelihood of query 3 after
  query 2: the session encoder reads query positions (attention alone is blind to the order
  of the queries it attends to, and query 2 itself is the same)."""
  cfg = CONFIGS[name]
  fns, params = compiled(cfg), init_params(cfg)
  queries = make_queries(2, num_queries=4)
  swapped = queries.at[:, 0].set(queries[:, 1]).at[:, 1].set(queries[:, 0])
  last_pair = lambda q: pair_logliks(fns['forward'](params, q), q)[:, 2]
  assert (np.abs(np.asarray(last_pair(queries) - last_pair(swapped))) > 1e-4).all()


@pytest.mark.parametrize('name', ['mtn_k2', 'mtn_k3'])
def test_each_of_the_k_minus_1_session_levels_reaches_the_memory(name):
  """A K-level MTN stacks K-1 session levels (the query encoder is the first level), each
  one's output on the way to the memory: moving one level's Add & Norm bias moves it."""
  cfg = CONFIGS[name]
  fns, params = compiled(cfg), init_params(cfg)
  levels = sorted(k for k in params if k.startswith('session_levels_'))
  assert levels == [f'session_levels_{i}' for i in range(cfg.num_levels - 1)]
  queries = make_queries(2)
  memory = fns['encode'](params, queries)['tokens']
  for level in levels:
    norm = params[level]['add_norm']
    # Not a constant shift, which a LayerNorm above it would take out.
    shift = np.random.default_rng(0).normal(size=norm['bias'].shape)
    moved = {**params, level: {**params[level], 'add_norm': {**norm,
                                                             'bias': norm['bias'] + shift}}}
    assert not np.allclose(fns['encode'](moved, queries)['tokens'], memory, atol=1e-3), level


def np_layer_norm(x, p):
  x = np.asarray(x, np.float64)
  centred = x - x.mean(-1, keepdims=True)
  return (centred / np.sqrt((centred**2).mean(-1, keepdims=True) + layers.LAYER_NORM_EPSILON)
          * p['scale'] + p['bias'])


def np_attention(x, memory, mask, p):
  """Vaswani et al.'s multi-head attention: x [B, T, d], memory [B, L, d], mask [B, T, L]."""
  project = lambda h, name: np.einsum('bld,dhk->blhk', h, p[name]['kernel']) + p[name]['bias']
  query, key, value = project(x, 'query'), project(memory, 'key'), project(memory, 'value')
  scores = np.einsum('bthk,blhk->bhtl', query, key) / np.sqrt(query.shape[-1])
  scores = np.where(mask[:, None], scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum('bhtl,blhk->bthk', weights, value)
  return np.einsum('bthk,hkd->btd', heads, p['out']['kernel']) + p['out']['bias']


def np_decoder_layer(x, memory, self_mask, memory_mask, p, pre_norm):
  """A Transformer decoder layer by its definition: post-norm LayerNorm(x + f(x)) for each
  sublayer f (the paper's), pre-norm x + f(LayerNorm(x))."""
  feed_forward = lambda h: (np.maximum(h @ p['ff_hidden']['kernel'] + p['ff_hidden']['bias'], 0)
                            @ p['ff_output']['kernel'] + p['ff_output']['bias'])
  sublayers = (('self_attention', lambda h: np_attention(h, h, self_mask, p['self_attention'])),
               ('cross_attention', lambda h: np_attention(h, memory, memory_mask,
                                                          p['cross_attention'])),
               ('feed_forward', feed_forward))
  for name, sublayer in sublayers:
    norm = p[f'{name}_norm']
    x = x + sublayer(np_layer_norm(x, norm)) if pre_norm else np_layer_norm(x + sublayer(x), norm)
  return x


@pytest.mark.parametrize('pre_norm', [False, True])
def test_layer_stack_computes_the_transformer_layers_by_their_definition(pre_norm):
  """Two decoder layers (self-attention under a causal mask, cross-attention under a padding
  mask, feed-forward), each by the definition above in float64, and with pre-norm the
  stack's final LayerNorm; random parameters, LayerNorms included."""
  cfg = MTN2.replace(pre_norm=pre_norm, scan_layers=False, dropout=0.0)
  stack = layers.LayerStack(cfg, 2, cross_attention=True)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 4, 16)).astype(np.float32)
  memory = rng.normal(size=(2, 3, 16)).astype(np.float32)
  memory_valid = np.array([[True, True, True], [True, False, False]])
  self_mask, memory_mask = layers.causal_mask(4), layers.padding_mask(jnp.asarray(memory_valid))
  shapes = jax.eval_shape(lambda: stack.init(jax.random.key(0), x, self_mask, memory,
                                             memory_mask, train=False))['params']
  params = jax.tree.map(np.asarray, random_like(shapes, seed=1))
  out = stack.apply({'params': params}, x, self_mask, memory, memory_mask, train=False)
  expected = x
  for i in range(2):
    expected = np_decoder_layer(expected, memory, np.tril(np.ones((4, 4), bool))[None],
                                np.broadcast_to(memory_valid[:, None], (2, 4, 3)),
                                params[f'layers_{i}'], pre_norm)
  if pre_norm:
    expected = np_layer_norm(expected, params['final_norm'])
  else:
    assert 'final_norm' not in params
  np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)


def test_tied_output_layer_scales_the_table_product_by_one_over_root_d_model():
  """Logits of the tied output layer: (y P^T) E^T / sqrt(d_model), P the emb_dim -> d_model
  projection and E the unit-variance table, so that the logits start at unit variance."""
  cfg = MTN3  # emb_dim 12 != d_model 16: the projection is used in both directions
  table = layers.WordEmbedding(cfg)
  y = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
  params = jax.tree.map(np.asarray, random_like(jax.eval_shape(
      lambda: table.init(jax.random.key(0), jnp.zeros((3,), jnp.int32)))['params'], seed=2))
  logits = table.apply({'params': params}, y, method='attend')
  expected = (y @ params['projection'].T) @ params['embedding'].T / np.sqrt(16)
  np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=1e-5)


def test_a_personalised_mtn_reads_its_users_history_and_no_other_users():
  """With a user memory (`user_memory='attention'`, AEM's attention over the user's earlier
  queries), a session's likelihoods move with its own user's history and with no other
  session's."""
  cfg = MTN2.replace(user_memory='attention')
  model = create_model(cfg)
  queries = make_queries(1)
  history = jnp.asarray(np.random.default_rng(0).integers(SEP_ID + 1, VOCAB, (BATCH, 2, WORDS)),
                        jnp.int32).at[1].set(0)  # session 1's user has no history
  forward = jax.jit(lambda params, h: model.apply(
      {'params': params}, {'queries': queries, 'history': h}, train=False))
  params = random_like(jax.eval_shape(lambda: model.init(
      jax.random.key(0), {'queries': queries, 'history': history}, train=False))['params'])
  logits = forward(params, history)
  other = forward(params, history.at[0].set(history[0, ::-1] % (VOCAB - 10) + 10))
  assert not np.allclose(logits[0], other[0], atol=1e-4)
  np.testing.assert_allclose(logits[1], other[1], atol=1e-6)


def test_a_model_that_reads_users_refuses_a_split_without_their_earlier_queries():
  """A user memory given no earlier queries (none kept, or `config.data.history_queries` 0)
  is an error naming the setting, not a memory of nothing."""
  import types  # pylint: disable=g-import-not-at-top
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  from mtn_jax.tasks import base  # pylint: disable=g-import-not-at-top
  task = base.GenerationTask(MTN2.replace(user_memory='attention'))
  for history in (None, np.zeros((BATCH, 0, WORDS), np.int32)):
    with pytest.raises(errors.Error, match=re.escape(
        'set config.data.history_queries > 0 (the valid split has none)')):
      task.context_inputs(types.SimpleNamespace(name='valid', history=history), vocab=None)


def apply_stack(cfg, stack_params, num_layers, x, mask):
  """float64 output of a LayerStack of `num_layers` layers (no cross-attention, inference)."""
  return np.asarray(layers.LayerStack(cfg, num_layers).apply(
      {'params': stack_params}, jnp.asarray(x, jnp.float32), mask, train=False), np.float64)


def test_mtn_encoder_computes_the_session_level_by_its_definition():
  """MTN's memory (K = 2) by the paper's Sec. 4 around its layer stacks (which the test above
  checks by their definition): each query's words embedded with their token positions 0..n-1
  and encoded alone under their padding mask; query t's vector w_proj . (its zero-padded
  token rows) plus query position t; the masked session encoder over the query vectors; query
  t's own session vector added to each of its tokens, then LayerNorm."""
  cfg = MTN2
  params = jax.tree.map(np.asarray, init_params(cfg))
  queries = make_queries(12)
  memory = compiled(cfg)['encode'](params, queries)
  tokens = np.asarray(queries).reshape(BATCH * QUERIES, WORDS)
  real = tokens != PAD_ID
  x = (params['encoder_embedding']['embedding'][tokens]
       + np.asarray(layers.sinusoid(jnp.arange(WORDS), cfg.d_model)))
  encoded = apply_stack(cfg, params['query_encoder'], cfg.query_layers, x,
                        layers.padding_mask(jnp.asarray(real)))
  encoded = encoded.reshape(BATCH, QUERIES, WORDS, cfg.d_model)
  level = params['session_levels_0']
  vectors = (np.einsum('bsnd,n->bsd', np.where(real.reshape(BATCH, QUERIES, WORDS, 1), encoded, 0),
                       level['query_projection'])
             + np.asarray(layers.sinusoid(jnp.arange(QUERIES), cfg.d_model)))
  session = apply_stack(cfg, level['session_encoder'], cfg.session_layers, vectors,
                        layers.causal_mask(QUERIES))
  expected = np_layer_norm(encoded + session[:, :, None], level['add_norm'])
  np.testing.assert_allclose(memory['tokens'], expected.reshape(BATCH * QUERIES, WORDS, -1),
                             atol=2e-5, rtol=1e-5)
  np.testing.assert_array_equal(memory['mask'], real)


def test_flat_session_encoder_is_a_transformer_encoder_over_each_compacted_source():
  """The Transformer's memory row b*S + t: `q_0 <sep> ... q_t` embedded with source positions
  0, 1, 2, ... and encoded under the mask of its real tokens; a copying Transformer copies
  exactly the words of that source, never a `<sep>`."""
  cfg = TRANSFORMER
  params = jax.tree.map(np.asarray, init_params(cfg))
  queries = make_queries(12)
  memory = compiled(cfg)['encode'](params, queries)
  sources, lengths = map(np.asarray, session_sources(queries))
  real = np.arange(sources.shape[-1]) < lengths[:, None]
  x = (np.asarray(layers.WordEmbedding(cfg).apply({'params': params['word_embedding']},
                                                  jnp.asarray(sources)))
       + np.asarray(layers.sinusoid(jnp.arange(sources.shape[-1]), cfg.d_model)))
  expected = apply_stack(cfg, params['encoder'], cfg.query_layers, x,
                         layers.padding_mask(jnp.asarray(real)))
  np.testing.assert_allclose(memory['tokens'], expected, atol=2e-5, rtol=1e-5)
  np.testing.assert_array_equal(memory['mask'], real)
  copy_memory = compiled(TRANSFORMER_COPY)['encode'](init_params(TRANSFORMER_COPY), queries)
  words = real & (sources != SEP_ID)
  assert (real & (sources == SEP_ID)).any()  # the sources hold <sep>s to leave out
  np.testing.assert_array_equal(copy_memory['copy_mask'], words)
  np.testing.assert_array_equal(copy_memory['copy_ids'], np.where(words, sources, -1))


@pytest.mark.parametrize('pre_norm', [False, True])
def test_dropout_acts_on_sublayer_outputs_embeddings_and_query_vectors_only(pre_norm):
  """With every dropout dropping everything (rate 1, in training), only what no dropout
  touches is left: each Add & Norm's residual path. A post-norm layer stack then maps x to
  LayerNorm(x) once per sublayer, a pre-norm one to its final LayerNorm(x); the embeddings
  (MTN's words, the decoder's inputs) and the query vectors entering the session encoder are
  dropped, so the query encoder's output, the session encoder's and the decoder's states are
  one vector at every position, whatever the queries, and the session vector joins no token:
  the memory is the level's LayerNorm of the query encoder's output."""
  cfg = MTN2.replace(pre_norm=pre_norm, scan_layers=False, dropout=1.0)
  rng = np.random.default_rng(0)
  x, memory = rng.normal(size=(2, 4, 16)), rng.normal(size=(2, 3, 16))
  for cross_attention in (True, False):
    stack = layers.LayerStack(cfg, 2, cross_attention=cross_attention)
    args = ((x, layers.causal_mask(4), memory, layers.padding_mask(jnp.ones((2, 3), bool)))
            if cross_attention else (x, layers.causal_mask(4)))
    params = jax.tree.map(np.asarray, random_like(jax.eval_shape(lambda: stack.init(
        jax.random.key(0), *args, train=False))['params'], seed=1))
    out = stack.apply({'params': params}, *args, train=True,
                      rngs={'dropout': jax.random.key(2)})
    expected = x
    if pre_norm:
      expected = np_layer_norm(x, params['final_norm'])
    else:
      names = ('self_attention', 'cross_attention', 'feed_forward')[::1 if cross_attention else 2]
      for i in range(2):
        for name in names:
          expected = np_layer_norm(expected, params[f'layers_{i}'][f'{name}_norm'])
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)

  model = create_model(cfg)
  model_params = random_like(jax.eval_shape(lambda: model.init(
      jax.random.key(0), {'queries': make_queries(0)}, train=False))['params'])
  stacks = lambda module, method: isinstance(module, layers.LayerStack)
  memory, state = model.apply({'params': model_params}, {'queries': make_queries(13)},
                              train=True, method='encode', rngs={'dropout': jax.random.key(3)},
                              capture_intermediates=stacks, mutable=['intermediates'])
  [encoded] = state['intermediates']['query_encoder']['__call__']
  np.testing.assert_allclose(memory['tokens'], np_layer_norm(
      encoded, model_params['session_levels_0']['add_norm']), atol=2e-5, rtol=1e-5)
  [session] = state['intermediates']['session_levels_0']['session_encoder']['__call__']
  inputs = make_queries(14).reshape(BATCH * QUERIES, WORDS)  # a row of words per memory row
  hidden = model.apply({'params': model_params}, memory, inputs, train=True,
                       method='decode_hidden', rngs={'dropout': jax.random.key(4)})
  for states in (encoded, session, hidden):
    flat = np.asarray(states).reshape(-1, states.shape[-1])
    np.testing.assert_allclose(flat, np.broadcast_to(flat[:1], flat.shape), atol=1e-5)


def test_scanned_layers_draw_their_own_initial_parameters():
  """Under `scan_layers` each layer of a stack starts from its own draw of parameters (a
  stack of copies of one layer would train as one)."""
  x = jnp.zeros((1, 3, 16))
  params = jax.jit(lambda: layers.LayerStack(BASE, 2).init(
      jax.random.key(0), x, layers.causal_mask(3), train=False))()['params']
  kernels = {jax.tree_util.keystr(path): x for path, x in
             jax.tree_util.tree_leaves_with_path(params['layers']) if 'kernel' in str(path)}
  assert len(kernels) == 6  # drawn at random (biases and LayerNorms start at constants)
  for path, kernel in kernels.items():
    assert not np.allclose(kernel[0], kernel[1]), path


def test_layer_layouts_keep_the_order_of_a_dozen_layers():
  """`loop_to_scan_params` stacks layers_0, layers_1, ..., layers_11 in their numeric order
  (not their names' order, which puts layers_10 before layers_2), and back."""
  loop = {'stack': {f'layers_{i}': {'w': np.full((2,), i)} for i in range(12)}, 'other': 1}
  scan = layers.loop_to_scan_params(loop)
  np.testing.assert_array_equal(scan['stack']['layers']['w'][:, 0], np.arange(12))
  back = layers.scan_to_loop_params(scan)
  assert back['other'] == 1 and sorted(back['stack']) == sorted(loop['stack'])
  for i in range(12):
    np.testing.assert_array_equal(back['stack'][f'layers_{i}']['w'], [i, i])


def test_the_user_slot_attends_over_phi_of_each_earlier_query_of_the_sessions_user():
  """The personalised memory by its definition (`encoder_decoder`'s docstring): history query
  i is tanh(W mean(its words' encoder embeddings) + b), its padding left out, and a query of
  no words is no item; the context's vector q is the mean of its real encoded tokens; each
  row gets one more slot, always attended, holding `UserMemory`(q, its own session's items)."""
  from mtn_jax.models import user_memory  # pylint: disable=g-import-not-at-top
  cfg = MTN2.replace(user_memory='attention')
  model = create_model(cfg)
  queries = make_queries(1)
  history = np.random.default_rng(5).integers(SEP_ID + 1, VOCAB, (BATCH, 3, WORDS))
  history[0, 0, 2:] = PAD_ID  # a query of two words
  history[0, 2] = PAD_ID  # no query
  history[1, 0, 1:] = PAD_ID  # session 1's user: one query of one word
  history[1, 1:] = PAD_ID
  batch = {'queries': queries, 'history': jnp.asarray(history, jnp.int32)}
  params = random_like(jax.eval_shape(lambda: model.init(
      jax.random.key(0), batch, train=False))['params'])
  memory = jax.jit(lambda p: model.apply({'params': p}, batch, method='encode'))(params)
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  words = history != PAD_ID
  embedded = np.where(words[..., None], p['encoder_embedding']['embedding'][history], 0)
  mean = embedded.sum(-2) / np.maximum(words.sum(-1, keepdims=True), 1)
  items = np.tanh(mean @ p['history_projection']['kernel'] + p['history_projection']['bias'])
  tokens, mask = np.asarray(memory['tokens'], np.float64), np.asarray(memory['mask'])
  assert tokens.shape[1] == WORDS + 1 and mask[:, -1].all()
  real = mask[:, :-1]
  q = (tokens[:, :-1] * real[..., None]).sum(1) / real.sum(-1, keepdims=True)
  u, weights, _ = user_memory.UserMemory(cfg.attention_hidden, zero_attention=False).apply(
      {'params': params['user_memory']}, jnp.asarray(q, jnp.float32),
      jnp.asarray(np.repeat(items, QUERIES, axis=0), jnp.float32),
      np.repeat(words.any(-1), QUERIES, axis=0))
  np.testing.assert_allclose(tokens[:, -1], u, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(memory['user_weights'], weights, atol=1e-6)
  # The empty query weighs nothing, the two-word one something.
  weights = np.asarray(memory['user_weights']).reshape(BATCH, QUERIES, 3)
  assert not weights[0, :, 2].any() and (weights[0, :, 0] > 0).all()


def test_each_scanned_layer_draws_its_own_dropout_mask():
  """Under `scan_layers`, layer k's dropout masks are its own draw, not layer 0's again. Two
  pre-norm layers whose self-attention outputs a vector of ones (their other sublayers 0),
  dropout 1/2 (kept values doubled): the stack's input to its final LayerNorm, from x = 0, is
  2 (m_0 + m_1) per element, which takes the three values 0, 2 and 4 along a row only if the
  layers' masks m_0 and m_1 differ; the LayerNorm keeps how many distinct values a row has."""
  cfg = BASE.replace(pre_norm=True, dropout=0.5)
  stack = layers.LayerStack(cfg, 2)
  x = jnp.zeros((2, 4, 16))
  params = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: stack.init(
      jax.random.key(0), x, layers.causal_mask(4), train=False))['params'])
  params['layers']['self_attention']['out']['bias'] = jnp.ones((2, 16))
  params['final_norm']['scale'] = jnp.ones((16,))
  out = jax.jit(lambda p: stack.apply({'params': p}, x, layers.causal_mask(4), train=True,
                                      rngs={'dropout': jax.random.key(1)}))(params)
  distinct = [len(np.unique(np.round(row, 4))) for row in np.asarray(out).reshape(-1, 16)]
  assert max(distinct) == 3, distinct


def test_decoding_refuses_steps_of_several_positions_and_packed_rows():
  """After the cache is made, each decoding step feeds one position per row (the cache
  advances by one); packed sequences are read whole, never decoded step by step."""
  cfg = MTN2
  params = init_params(cfg)
  queries = make_queries(7)
  memory = jax.tree.map(lambda m: m[:BATCH], compiled(cfg)['encode'](params, queries))
  inputs = jnp.zeros((BATCH, cfg.target_len), jnp.int32)
  cache = compiled(cfg)['init_cache'](params, memory, inputs)
  model = create_model(cfg)
  with pytest.raises(ValueError, match='a decoding step takes one position per row'):
    jax.eval_shape(lambda: model.apply({'params': params, 'cache': cache}, memory, inputs[:, :2],
                                       decode=True, mutable=['cache'], method='decode'))
  with pytest.raises(ValueError, match=r'packed sequences \(parents\) are read whole'):
    jax.eval_shape(lambda: model.apply({'params': params}, memory, inputs, decode=True,
                                       parents=jnp.full(inputs.shape, -1), mutable=['cache'],
                                       method='decode'))
