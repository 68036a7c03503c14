"""Exact values of the training losses on hand cases; the fused, chunked loss head equals the
definition in values and gradients, and never projects a chunk of padding."""

import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from mtn_jax.models import create_model
from mtn_jax.models import decoder_io
from mtn_jax.models import make_config
from mtn_jax.tasks import GenerationTask
from mtn_jax.tasks.losses import output_layer_losses, session_losses, token_losses


def test_plain_cross_entropy():
  logits = jnp.array([[math.log(3.0), 0.0, -1e9, -1e9]])  # p = (3/4, 1/4, 0, 0)
  loss, nll = token_losses(logits, jnp.array([1]))
  np.testing.assert_allclose(nll, [math.log(4.0)], rtol=1e-6)
  np.testing.assert_allclose(loss, nll)


def test_label_smoothing_mixes_in_the_uniform_distribution():
  logits = jnp.zeros((1, 4))  # uniform: -log p = log 4 for every word
  loss, nll = token_losses(logits, jnp.array([2]), label_smoothing=0.1)
  np.testing.assert_allclose(loss, [math.log(4.0)], rtol=1e-6)
  logits = jnp.array([[math.log(3.0), 0.0, 0.0, 0.0]])  # p = (1/2, 1/6, 1/6, 1/6)
  loss, nll = token_losses(logits, jnp.array([0]), label_smoothing=0.2)
  expected = 0.8 * math.log(2.0) + 0.2 * (math.log(2.0) + 3 * math.log(6.0)) / 4
  np.testing.assert_allclose(loss, [expected], rtol=1e-6)
  np.testing.assert_allclose(nll, [math.log(2.0)], rtol=1e-6)


def test_entropy_regulariser_rewards_spread():
  logits = jnp.array([[math.log(3.0), 0.0, -1e9, -1e9]])  # p = (3/4, 1/4)
  entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  loss, nll = token_losses(logits, jnp.array([0]), entropy_weight=0.1)
  np.testing.assert_allclose(loss, [math.log(4 / 3) - 0.1 * entropy], rtol=1e-5)
  np.testing.assert_allclose(nll, [math.log(4 / 3)], rtol=1e-5)


def _weighted_reference(kernel, hidden, targets, weights):
  """The definition: token_losses over the whole logits tensor, weighted and summed."""
  logits = hidden @ kernel
  loss, nll = token_losses(logits, targets, label_smoothing=0.1, entropy_weight=0.1)
  correct = (logits.argmax(-1) == targets).astype(jnp.float32)
  return (loss * weights).sum(), ((nll * weights).sum(), (correct * weights).sum())


def _fused(kernel, hidden, targets, weights, chunk_tokens):
  sums = output_layer_losses(lambda k, h: h @ k, kernel, hidden, targets, weights,
                             chunk_tokens=chunk_tokens, label_smoothing=0.1,
                             entropy_weight=0.1)
  return sums['loss'], (sums['nll'], sums['correct'])


def test_output_layer_losses_equal_the_definition_for_every_chunking():
  """Values and gradients (kernel and hidden states) of the fused loss equal those of
  token_losses on the full logits, whatever the chunking and wherever the padding lies."""
  rng = np.random.default_rng(0)
  groups, tokens, features, vocab = 2, 15, 4, 11
  hidden = jnp.asarray(rng.normal(size=(groups, tokens, features)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(features, vocab)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, vocab, size=(groups, tokens)), jnp.int32)
  # Padding scattered through group 0 (9 real tokens), group 1 real only at its end (4).
  weights = np.zeros((groups, tokens), np.float32)
  weights[0, [0, 2, 3, 5, 8, 9, 11, 12, 14]] = 1.0
  weights[1, -4:] = [1.0, 0.5, 2.0, 1.0]  # weights other than 1 scale their tokens
  weights = jnp.asarray(weights)
  reference = jax.value_and_grad(_weighted_reference, argnums=(0, 1), has_aux=True)
  (want_loss, want_metrics), want_grads = reference(kernel, hidden, targets, weights)
  assert 0 < float(want_metrics[1]) < float(weights.sum())  # some right, some wrong
  # One token per chunk, uneven chunks, exactly the real count, a whole group, oversize.
  for chunk_tokens in (1, 4, 9, 15, 64):
    fused = jax.jit(jax.value_and_grad(_fused, argnums=(0, 1), has_aux=True),
                    static_argnums=4)
    (loss, metrics), grads = fused(kernel, hidden, targets, weights, chunk_tokens)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(metrics, want_metrics, rtol=1e-5)
    for got, want in zip(grads, want_grads):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Without differentiation (evaluation) the same sums come from the loop without gradients.
    np.testing.assert_allclose(jax.jit(_fused, static_argnums=4)(
        kernel, hidden, targets, weights, chunk_tokens)[0], want_loss, rtol=1e-5)


def test_chunks_of_padding_are_never_projected():
  """Padding states are NaN: a chunk holding only padding would make the sums NaN if it were
  projected. 8 real tokens per group in chunks of 4 leave two chunks of padding each."""
  rng = np.random.default_rng(1)
  hidden = rng.normal(size=(2, 16, 4)).astype(np.float32)
  weights = np.zeros((2, 16), np.float32)
  weights[0, rng.choice(16, 8, replace=False)] = 1.0
  weights[1, :8] = 1.0
  hidden[weights == 0] = np.nan
  kernel = jnp.asarray(rng.normal(size=(4, 7)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 7, size=(2, 16)), jnp.int32)
  fused = jax.jit(jax.value_and_grad(_fused, argnums=(0, 1), has_aux=True), static_argnums=4)
  (loss, metrics), (d_kernel, d_hidden) = fused(kernel, jnp.asarray(hidden), targets,
                                                jnp.asarray(weights), 4)
  assert np.isfinite(float(loss)) and np.all(np.isfinite(metrics))
  assert np.all(np.isfinite(d_kernel)) and np.all(np.isfinite(d_hidden))
  assert np.all(np.asarray(d_hidden)[weights == 0] == 0)
  # The same padding inside a chunk that holds a real token is projected (and poisons it).
  (loss, _), _ = fused(kernel, jnp.asarray(hidden), targets, jnp.asarray(weights), 3)
  assert np.isnan(float(loss))


def test_output_layer_losses_refuse_bad_shapes_and_chunks():
  hidden, targets, weights = jnp.zeros((1, 6, 4)), jnp.zeros((1, 6), jnp.int32), jnp.ones((1, 6))
  with pytest.raises(ValueError, match='chunk_tokens must be at least 1'):
    output_layer_losses(lambda k, h: h @ k, jnp.zeros((4, 3)), hidden, targets, weights,
                        chunk_tokens=0)
  with pytest.raises(ValueError, match=r'expected hidden \[G, M, H\]'):
    output_layer_losses(lambda k, h: h @ k, jnp.zeros((4, 3)), hidden[0], targets, weights,
                        chunk_tokens=2)
  # M-NSRF's entropy term has no definition over a copy mixture: refused, not dropped.
  with pytest.raises(ValueError, match='entropy regulariser is not defined for a copy mixture'):
    output_layer_losses(lambda k, h: h @ k, jnp.zeros((4, 3)), hidden, targets, weights,
                        chunk_tokens=2, entropy_weight=0.1, copy={})


TINY_FIELDS = dict(
    name='mtn', vocab_size=37, max_query_words=4, emb_dim=12, d_model=16, num_heads=2,
    ff_dim=16, query_layers=1, session_layers=1, num_levels=2, decoder_layers=1, dropout=0.1,
    share_embeddings=False, tie_embeddings=True, pre_norm=False, learned_positions=False,
    scan_layers=False, remat='none', compute_dtype='float32', lstm_units=4,
    max_session_queries=8, copy=False)
TINY = make_config(TINY_FIELDS)

# [batch=2, queries=3, tokens=4]; the second session ends in a padding row.
SESSIONS = jnp.array([[[5, 6, 0, 0], [7, 8, 9, 0], [10, 0, 0, 0]],
                      [[11, 12, 13, 14], [15, 0, 0, 0], [0, 0, 0, 0]]], jnp.int32)


def random_params(model):
  """A random draw of the model's parameter shapes: no initialiser to compile."""
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), {'queries': SESSIONS},
                                                      train=False))
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.5, s.shape), s.dtype),
                      shapes['params'])


def plain_session_sums(model, params, queries, *, train, rngs=None, label_smoothing=0.0,
                       entropy_weight=0.0):
  """The definition `session_losses` must equal: token_losses on the model's whole logits."""
  logits = model.apply({'params': params}, {'queries': queries}, train=train, rngs=rngs)
  _, targets, weights = decoder_io(queries)
  loss, nll = token_losses(logits, targets, label_smoothing, entropy_weight)
  correct = (logits.argmax(-1) == targets).astype(jnp.float32)
  return {'loss': (loss * weights).sum(), 'nll': (nll * weights).sum(),
          'correct': (correct * weights).sum(), 'tokens': weights.sum()}


@pytest.mark.parametrize('cfg', [
    TINY, make_config(TINY_FIELDS, name='hred', tie_embeddings=False),
    make_config(TINY_FIELDS, name='mnsrf', share_embeddings=True)],
                         ids=['mtn_tied', 'hred_untied', 'mnsrf_tied_shared'])
def test_session_losses_equal_the_definition_in_values_and_gradients(cfg):
  """Same dropout masks, same sums, same gradients for every parameter (the output layer's
  included, which the fused loss differentiates itself), in one group or two."""
  model = create_model(cfg)
  rngs = {'dropout': jax.random.key(1)}

  def mean_loss(sums_fn):
    def fn(params):
      sums = sums_fn(params)
      return sums['loss'] / sums['tokens'], sums
    return jax.grad(fn, has_aux=True)

  @jax.jit
  def plain_and_fused(params):
    plain = mean_loss(lambda p: plain_session_sums(
        model, p, SESSIONS, train=True, rngs=rngs, label_smoothing=0.1,
        entropy_weight=0.1))(params)
    # 2 sessions x 2 pairs x 5 positions = 20 slots, 8 real: chunks of 3 in one group of 20
    # slots, and of 2 in two groups of 10.
    fused = [mean_loss(lambda p, c=c, g=g: session_losses(
        model, p, {'queries': SESSIONS}, train=True, rngs=rngs, label_smoothing=0.1,
        entropy_weight=0.1,
        chunk_tokens=c, groups=g))(params) for c, g in ((3, 1), (2, 2))]
    return plain, fused

  (plain_grads, plain), fused = plain_and_fused(random_params(model))
  # Targets: [7 8 9 </s>], [10 </s>], [15 </s>], and a padding pair.
  assert float(plain['tokens']) == 8
  for grads, sums in fused:
    assert float(sums['pairs']) == 3
    for key in plain:
      np.testing.assert_allclose(sums[key], plain[key], rtol=1e-5, atol=1e-5)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
                 grads, plain_grads)
  assert float(optax.tree.norm(plain_grads)) > 0


def test_session_losses_in_bfloat16_match_the_definition():
  model = create_model(TINY.replace(compute_dtype='bfloat16'))
  plain, fused = jax.jit(lambda params: [
      plain_session_sums(model, params, SESSIONS, train=False, label_smoothing=0.1),
      session_losses(model, params, {'queries': SESSIONS}, train=False, label_smoothing=0.1,
                     chunk_tokens=6)])(random_params(model))
  assert all(x.dtype == jnp.float32 for x in fused.values())
  for key in plain:
    np.testing.assert_allclose(fused[key], plain[key], rtol=1e-3)


def test_session_losses_refuse_a_batch_that_does_not_split_into_groups():
  model = create_model(TINY)
  with pytest.raises(ValueError, match='does not split into 3 data-parallel groups'):
    session_losses(model, random_params(model), {'queries': SESSIONS}, train=False,
                   chunk_tokens=4,
                   groups=3)


def test_the_training_loss_is_the_mean_per_real_target_token():
  """The step's loss and the logged training loss: the loss summed over the batch's target
  tokens, over their number (not over the pairs, which would weigh long queries more); an
  all-padding batch (0 tokens) gives its sum, 0, not a division by zero."""
  sums = {'loss': jnp.float32(6.0), 'nll': jnp.float32(5.0), 'tokens': jnp.float32(4.0),
          'pairs': jnp.float32(2.0)}
  assert float(GenerationTask.training_loss(sums)) == 1.5
  assert float(GenerationTask.training_loss({**sums, 'loss': jnp.float32(0.0),
                                             'tokens': jnp.float32(0.0)})) == 0.0


def test_validation_figures_are_the_cross_entropy_and_accuracy_per_target_token():
  """Validation loss is the summed cross-entropy ('nll', not the smoothed objective) over the
  real target tokens, perplexity its exp, capped at exp(50) so that a diverged model still
  reports a number; token accuracy per token, pairs as counted; an empty split (0 tokens)
  gives zeros, not a division by zero."""
  totals = {'loss': 9.0, 'nll': 6.0, 'correct': 3.0, 'tokens': 4.0, 'pairs': 2.0}
  assert GenerationTask.summarize(totals) == {
      'loss': 1.5, 'perplexity': math.exp(1.5), 'token_accuracy': 0.75, 'pairs': 2.0}
  assert GenerationTask.summarize({**totals, 'nll': 4000.0})['perplexity'] == math.exp(50.0)
  assert GenerationTask.summarize(dict.fromkeys(totals, 0.0)) == {
      'loss': 0.0, 'perplexity': 1.0, 'token_accuracy': 0.0, 'pairs': 0.0}


def test_a_generation_task_takes_each_loss_setting_from_its_own_key():
  """Label smoothing and the entropy regulariser are both 0.1 in their papers: a task that read
  one key for the other would train another objective without a sign."""
  train = ml_collections.ConfigDict(dict(label_smoothing=0.1, entropy_weight=0.2,
                                         loss_chunk_tokens=7))
  task = GenerationTask.from_config(TINY, train)
  assert (task.label_smoothing, task.entropy_weight, task.chunk_tokens) == (0.1, 0.2, 7)
