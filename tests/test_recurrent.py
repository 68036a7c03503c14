"""The recurrent baselines keep the model contract: one pass over a session equals each pair run
alone, no pair sees later queries, padding changes nothing, cached decoding equals teacher
forcing, and training lowers the loss."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mtn_jax.data.vocab import SEP_ID
from mtn_jax.models import recurrent
from mtn_jax.models.base import decoder_io
from mtn_jax.models.base import session_sources

from tests.test_models import random_like


VOCAB_SIZE = 23
MODELS = {'seq2seq': recurrent.Seq2SeqAttention, 'hred': recurrent.HRED,
          'mnsrf': recurrent.MNSRF}

# [batch=2, queries=4, tokens=4]: queries of 1 to 4 words; the second session has 3 queries
# and a padding row.
SESSIONS = np.array([
    [[5, 6, 0, 0], [7, 0, 0, 0], [8, 9, 10, 0], [11, 12, 0, 0]],
    [[13, 14, 15, 16], [17, 0, 0, 0], [18, 19, 0, 0], [0, 0, 0, 0]],
], np.int32)


def tiny_config(name: str, tie_embeddings: bool = False,
                share_embeddings: bool = False) -> recurrent.RecurrentConfig:
  return recurrent.RecurrentConfig(
      name=name, vocab_size=VOCAB_SIZE, max_query_words=SESSIONS.shape[-1], emb_dim=8,
      dropout=0.1, share_embeddings=share_embeddings, tie_embeddings=tie_embeddings,
      compute_dtype='float32', lstm_units=6, max_session_queries=8)


class Harness:
  """A tiny model with its parameters and jit-compiled per-pair log-likelihoods."""

  def __init__(self, name: str, tie_embeddings: bool = False,
               share_embeddings: bool = False):
    self.model = MODELS[name](tiny_config(name, tie_embeddings, share_embeddings))
    # A random draw of the parameter shapes (any parameters will do): no initialiser to compile.
    self.params = random_like(jax.eval_shape(
        lambda: self.model.init(jax.random.key(0), {'queries': SESSIONS}, train=False))['params'])
    self.pair_log_likelihoods = jax.jit(self._pair_log_likelihoods)

  def _pair_log_likelihoods(self, queries):
    """int32 [B, S, n] -> float32 [B, S-1]: log p(query t+1 | queries 0..t) per pair."""
    logits = self.model.apply({'params': self.params}, {'queries': queries}, train=False)
    _, targets, weights = decoder_io(queries)
    log_probs = jax.nn.log_softmax(logits)
    token_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return (token_log_probs * weights).sum(-1)


@functools.lru_cache(maxsize=None)
def harness_of(name: str) -> Harness:
  """One harness per model for the whole file (its parameters are never changed in place)."""
  return Harness(name)


@pytest.fixture(scope='module', params=list(MODELS))
def harness(request) -> Harness:
  return harness_of(request.param)


def test_full_session_pass_equals_each_prefix_alone(harness):
  full = harness.pair_log_likelihoods(SESSIONS)
  assert np.all(np.asarray(full)[SESSIONS[:, 1:].any(-1)] < 0)
  for t in range(SESSIONS.shape[1] - 1):
    # The session cut after query t + 1, in a batch of its own shape: pair t is its last.
    alone = harness.pair_log_likelihoods(SESSIONS[:, :t + 2])
    np.testing.assert_allclose(alone[:, t], full[:, t], atol=1e-5, rtol=0)


def test_later_queries_never_change_earlier_pairs(harness):
  full = np.asarray(harness.pair_log_likelihoods(SESSIONS))
  for t in range(SESSIONS.shape[1] - 2):
    changed = SESSIONS.copy()
    later = changed[:, t + 2:]
    later[later > 0] = 22  # same lengths, different words
    moved = np.asarray(harness.pair_log_likelihoods(changed))
    np.testing.assert_allclose(moved[:, :t + 1], full[:, :t + 1], atol=1e-5, rtol=0)
    # The changed query is the target of pair t + 1, so that pair must see it.
    assert np.all(np.abs(moved[0, t + 1:] - full[0, t + 1:]) > 1e-3)


def test_padding_rows_sessions_and_tokens_change_nothing(harness):
  full = harness.pair_log_likelihoods(SESSIONS)
  more_rows = np.zeros((3, 6, 4), np.int32)  # two padding rows, one padding session
  more_rows[:2, :4] = SESSIONS
  padded = harness.pair_log_likelihoods(more_rows)
  np.testing.assert_allclose(padded[:2, :3], full, atol=1e-5, rtol=0)
  np.testing.assert_array_equal(padded[:, 3:], 0)
  np.testing.assert_array_equal(padded[2], 0)
  more_tokens = np.pad(SESSIONS, ((0, 0), (0, 0), (0, 3)))
  np.testing.assert_allclose(harness.pair_log_likelihoods(more_tokens), full, atol=1e-5,
                             rtol=0)


def test_padding_queries_and_sessions_keep_the_training_loss_finite(harness):
  """The fused loss projects padding slots that share a chunk with real targets (all of a
  group at the default chunk_tokens), so a padding query's state must be finite: M-NSRF's
  max-pool over no token is 0, not -inf, or every batch with a short session trains on NaN."""
  from mtn_jax.tasks.losses import session_losses  # pylint: disable=g-import-not-at-top
  more_rows = np.zeros((3, 6, 4), np.int32)  # two padding rows, one padding session
  more_rows[:2, :4] = SESSIONS
  loss = lambda params: session_losses(harness.model, params, {'queries': more_rows},
                                       train=False, chunk_tokens=256)['loss']
  value, grads = jax.jit(jax.value_and_grad(loss))(harness.params)
  assert np.isfinite(float(value)) and float(value) > 0
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


@pytest.mark.parametrize('name', ['hred', 'mnsrf'])
def test_query_summaries_feed_the_session_lstm(name):
  """s_t = LSTM over the query summaries (Sordoni et al.): HRED's summary is the final hidden
  states h of the two directions, forward then backward (not the cells); M-NSRF's the
  element-wise max of the encoder's outputs over the query's real tokens (Ahmad et al.)."""
  harness = harness_of(name)
  tokens = SESSIONS.reshape(8, 4)
  lengths = (tokens != 0).sum(-1)

  def query_encoder(module, tokens, lengths):
    (forward, backward), outputs = module.query_encoder(
        module.encoder_embedding(tokens), seq_lengths=lengths, return_carry=True)
    return forward[1], backward[1], outputs

  apply = lambda method, *args: jax.jit(lambda *a: harness.model.apply(
      {'params': harness.params}, *a, method=method))(*args)
  h_forward, h_backward, outputs = map(np.asarray, apply(query_encoder, tokens, lengths))
  if name == 'hred':
    summaries = np.concatenate([h_forward, h_backward], -1)
  else:
    summaries = np.stack([outputs[r, :n].max(0) if n else np.zeros(12, np.float32)
                          for r, n in enumerate(lengths)])
  expected = apply(lambda m, x: m.session_encoder(x), summaries.reshape(2, 4, 12))
  states = apply('encode', {'queries': SESSIONS})['session_state']
  real = SESSIONS.any(-1).reshape(-1)  # a padding row's state is no context
  np.testing.assert_allclose(np.asarray(states)[real], np.asarray(expected).reshape(8, 12)[real],
                             rtol=1e-5, atol=1e-6)


def test_seq2seq_decoder_starts_from_the_encoders_final_state():
  """Seq2Seq's decoder LSTM starts from the source encoder's final (c, h), forward and
  backward concatenated (the class docstring), not from zeros: attention alone would still
  read the source, so only the first steps tell."""
  harness = harness_of('seq2seq')
  decoder_inputs = jnp.ones((8, 2), jnp.int32)

  def first_steps(params, zero_state):
    memory = harness.model.apply({'params': params}, {'queries': SESSIONS}, method='encode')
    if zero_state:
      memory = {**memory, 'final_state': jax.tree.map(jnp.zeros_like, memory['final_state'])}
    return harness.model.apply({'params': params}, memory, decoder_inputs, method='decode')

  run = jax.jit(first_steps, static_argnums=1)
  assert np.abs(np.asarray(run(harness.params, False) - run(harness.params, True))).max() > 1e-3


def test_seq2seq_memory_is_the_encoders_states_forward_then_backward():
  """Seq2Seq's memory (the class docstring): `source_states` the bidirectional outputs over
  the real source tokens and exactly zero at padding, `final_state` the final (c, h) of the
  forward then the backward LSTM; `_encode_tokens` gives an empty row a zero state, not the
  state flax reaches over its padding."""
  harness = harness_of('seq2seq')
  sources, lengths = session_sources(jnp.asarray(SESSIONS))

  def source_encoder(module, sources, lengths):
    carries, outputs = module.source_encoder(
        module.encoder_embedding(sources), seq_lengths=lengths, return_carry=True)
    return carries, outputs, module.encode({'queries': SESSIONS})

  apply = lambda method, *args: jax.jit(lambda *a: harness.model.apply(
      {'params': harness.params}, *a, method=method))(*args)
  ((c_forward, h_forward), (c_backward, h_backward)), outputs, memory = apply(
      source_encoder, sources, lengths)
  np.testing.assert_array_equal(memory['source_lengths'], lengths)
  np.testing.assert_allclose(memory['final_state'][0], np.concatenate([c_forward, c_backward],
                                                                      -1), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(memory['final_state'][1], np.concatenate([h_forward, h_backward],
                                                                      -1), rtol=1e-6, atol=1e-6)
  is_token = np.arange(sources.shape[1]) < np.asarray(lengths)[:, None]
  states = np.asarray(memory['source_states'])
  np.testing.assert_allclose(states[is_token], np.asarray(outputs)[is_token], rtol=1e-6,
                             atol=1e-6)
  assert (~is_token).any() and not states[~is_token].any()
  # An empty row (a padding query) beside real ones: zero final state and outputs.
  tokens = jnp.asarray(SESSIONS.reshape(8, 4))
  query_lengths = (tokens != 0).sum(-1)
  assert not query_lengths[-1]
  encode_tokens = recurrent._encode_tokens  # pylint: disable=protected-access
  outputs, final = apply(lambda m, t, n: encode_tokens(
      m.source_encoder, m.encoder_embedding(t), n), tokens, query_lengths)
  assert not np.asarray(final[0][-1]).any() and not np.asarray(final[1][-1]).any()
  assert np.asarray(final[1][:-1]).any(-1).all() and not np.asarray(outputs[-1]).any()


def test_hred_decoder_reads_the_session_state_at_every_step():
  """HRED's decoder reads s_t beside each input word as well as starting from tanh(W s_t):
  with W and its bias at zero (a start that knows nothing of s_t), another session state
  still changes what it predicts."""
  harness = harness_of('hred')
  params = jax.tree.map(lambda x: x, harness.params)
  params['decoder']['initial_state'] = jax.tree.map(jnp.zeros_like,
                                                    params['decoder']['initial_state'])
  decoder_inputs = jnp.ones((8, 2), jnp.int32)

  def decode(scale):
    memory = harness.model.apply({'params': params}, {'queries': SESSIONS}, method='encode')
    memory = {'session_state': scale * memory['session_state']}
    return harness.model.apply({'params': params}, memory, decoder_inputs, method='decode')

  run = jax.jit(decode)
  assert np.abs(np.asarray(run(1.0) - run(-1.0))).max() > 1e-3


def test_cached_decoding_equals_teacher_forcing(harness):
  model, params = harness.model, harness.params
  rows = SESSIONS.shape[0] * SESSIONS.shape[1]
  # Any token sequence will do, padding included: decoding must follow the inputs it is fed.
  decoder_inputs = jax.random.randint(jax.random.key(1), (rows, 5), 0, VOCAB_SIZE)

  @jax.jit
  def teacher_forced_and_stepwise(queries, decoder_inputs):
    memory = model.apply({'params': params}, {'queries': queries}, method='encode')
    teacher_forced = model.apply({'params': params}, memory, decoder_inputs, method='decode')
    _, state = model.apply({'params': params}, memory, decoder_inputs, decode=True,
                           mutable=['cache'], method='decode')
    steps = []
    for i in range(decoder_inputs.shape[1]):
      logits, state = model.apply({'params': params, **state}, memory,
                                  decoder_inputs[:, i:i + 1], decode=True,
                                  mutable=['cache'], method='decode')
      steps.append(logits)
    return teacher_forced, jnp.concatenate(steps, axis=1)

  teacher_forced, stepwise = teacher_forced_and_stepwise(SESSIONS, decoder_inputs)
  assert teacher_forced.shape == (rows, 5, VOCAB_SIZE)
  np.testing.assert_allclose(stepwise, teacher_forced, atol=1e-5, rtol=0)


def test_adam_steps_lower_the_masked_cross_entropy(harness):
  model = harness.model
  _, targets, weights = decoder_io(jnp.asarray(SESSIONS))

  def loss_fn(params, dropout_key):
    logits = model.apply({'params': params}, {'queries': SESSIONS}, train=True,
                         rngs={'dropout': dropout_key})
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return (losses * weights).sum() / weights.sum()

  optimizer = optax.adam(0.02)

  @jax.jit
  def train(params):
    def step(carry, key):
      params, opt_state = carry
      loss, grads = jax.value_and_grad(loss_fn)(params, key)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state), loss

    keys = jax.random.split(jax.random.key(2), 30)
    _, losses = jax.lax.scan(step, (params, optimizer.init(params)), keys)
    return losses

  losses = train(harness.params)
  assert losses[0] > math.log(VOCAB_SIZE) * 0.8  # an untrained model is near uniform
  assert losses[-3:].max() < 0.5 * losses[0]


@pytest.mark.parametrize('share_embeddings', [False, True])
def test_tied_embeddings_reuse_the_decoder_table(share_embeddings):
  harness = Harness('hred', tie_embeddings=True, share_embeddings=share_embeddings)
  assert 'output_projection' not in harness.params
  table = 'word_embedding' if share_embeddings else 'decoder_embedding'
  assert ('encoder_embedding' in harness.params) != share_embeddings
  # Sessions that repeat their first query read the words 5, 6, 13..16 and <s>, never 7.
  # Every logit is a word's decoder-table row dotted with the decoder's output vector, so
  # moving word 7's row moves word 7's logits and no other.
  repeated = SESSIONS[:, :1].repeat(2, axis=1)
  params = {**harness.params, table: {
      'embedding': harness.params[table]['embedding'].at[7].add(1.0)}}
  apply = jax.jit(lambda params: harness.model.apply(
      {'params': params}, {'queries': repeated}, train=False))
  moved, base = apply(params), apply(harness.params)
  changed = np.abs(np.asarray(moved - base)).max(axis=(0, 1, 2)) > 1e-6
  np.testing.assert_array_equal(np.flatnonzero(changed), [7])


@pytest.mark.parametrize('name', list(MODELS))
def test_separate_word_tables_add_exactly_one_table(name):
  def num_params(cfg):
    shapes = jax.eval_shape(lambda: MODELS[name](cfg).init(jax.random.key(0), {'queries': SESSIONS},
                                                           train=False))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))

  shared = num_params(tiny_config(name, share_embeddings=True))
  assert num_params(tiny_config(name)) - shared == VOCAB_SIZE * 8
  # Tying replaces the 2u -> V output layer by a 2u -> emb_dim map, u = lstm_units = 6.
  tied = num_params(tiny_config(name, tie_embeddings=True, share_embeddings=True))
  assert shared - tied == (12 + 1) * VOCAB_SIZE - (12 + 1) * 8


def test_session_sources_join_queries_with_sep():
  sources, lengths = session_sources(jnp.asarray(SESSIONS))
  s = SEP_ID
  expected = [
      [5, 6], [5, 6, s, 7], [5, 6, s, 7, s, 8, 9, 10], [5, 6, s, 7, s, 8, 9, 10, s, 11, 12],
      [13, 14, 15, 16], [13, 14, 15, 16, s, 17], [13, 14, 15, 16, s, 17, s, 18, 19],
      [13, 14, 15, 16, s, 17, s, 18, 19],  # a padding row adds nothing
  ]
  assert sources.shape == (8, 4 * 5 - 1)
  np.testing.assert_array_equal(lengths, [len(e) for e in expected])
  for row, want in zip(np.asarray(sources), expected):
    np.testing.assert_array_equal(row, want + [0] * (len(row) - len(want)))


@pytest.mark.parametrize('name', list(MODELS))
def test_queries_of_the_wrong_rank_are_refused(name):
  model = MODELS[name](tiny_config(name))
  with pytest.raises(ValueError, match=r'queries must be integer word ids \[batch, queries'):
    model.init(jax.random.key(0), {'queries': jnp.asarray(SESSIONS[0])}, train=False)
