"""The copy mixture (pointer-generator): a distribution over the extended vocabulary, a loss
whose fused, chunked form equals its definition, and session words outside the vocabulary
written out verbatim in suggestions."""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from mtn_jax import inference
from mtn_jax import models
from mtn_jax import tasks
from mtn_jax.data import extended
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import search
from mtn_jax.inference import inputs
from mtn_jax.inference import sources
from mtn_jax.models import copying
from mtn_jax.models.base import decoder_io
from mtn_jax.tasks import losses


VOCAB = Vocab(SPECIAL_TOKENS + tuple(f'w{i}' for i in range(32)))
FIELDS = dict(
    vocab_size=len(VOCAB), max_query_words=4, emb_dim=12, d_model=16, num_heads=2, ff_dim=16,
    query_layers=1, session_layers=1, num_levels=2, decoder_layers=1, dropout=0.1,
    share_embeddings=False, tie_embeddings=True, pre_norm=False, learned_positions=False,
    scan_layers=False, remat='none', compute_dtype='float32', max_session_queries=8,
    copy=True)
# Two sessions of three queries; 'zq', 'xv' and 'kk' are not in VOCAB. In session 0, 'xv'
# first appears in the last query (its target cannot be copied), 'zq' in the first.
TEXTS = [['w1 zq', 'w3 xv zq', 'zq w2'], ['kk w4 w5 w6', 'w7 kk', '']]


def session_batch():
  queries = np.zeros((2, 3, 4), np.int32)
  oov = np.zeros((2, 3, 4), np.int32)
  for b, session in enumerate(TEXTS):
    words = [t.split() for t in session]
    for t, query in enumerate(words):
      queries[b, t, :len(query)] = VOCAB.encode(query)
    oov[b] = extended.oov_numbers(words, VOCAB, 4)
  return {'queries': jnp.asarray(queries), 'oov': jnp.asarray(oov)}


def test_oov_numbers_follow_first_appearance():
  words = [t.split() for t in TEXTS[0]]
  np.testing.assert_array_equal(extended.oov_numbers(words, VOCAB, 4),
                                [[0, 1, 0, 0], [0, 2, 1, 0], [1, 0, 0, 0]])
  assert extended.oov_words(words, VOCAB) == ['zq', 'xv']
  # A special token's spelling typed as a word is <unk>, never a word to copy back as text.
  typed = [['<unk>', 'zq', '</s>'], ['<pad>', 'xv']]
  np.testing.assert_array_equal(extended.oov_numbers(typed, VOCAB, 3), [[0, 1, 0], [0, 2, 0]])
  assert extended.oov_words(typed, VOCAB) == ['zq', 'xv']
  batch = session_batch()
  # After query 0 one such word can be copied, after query 1 two.
  np.testing.assert_array_equal(copying.copyable_words(batch), [[1, 2, 2], [1, 1, 1]])


@pytest.fixture(scope='module', params=['mtn', 'transformer'])
def copy_model(request):
  cfg = models.make_config(dict(FIELDS, name=request.param))
  model = models.create_model(cfg)
  params = jax.jit(lambda key: model.init(key, session_batch(), train=False))(
      jax.random.key(0))['params']
  return cfg, model, params


def test_the_mixture_is_a_distribution_over_the_extended_vocabulary(copy_model):
  cfg, model, params = copy_model
  log_probs = jax.jit(lambda p: model.apply({'params': p}, session_batch(), train=False))(params)
  assert log_probs.shape[-1] == cfg.extended_vocab_size == len(VOCAB) + 8 * 4
  np.testing.assert_allclose(np.exp(np.asarray(log_probs)).sum(-1), 1.0, atol=1e-5)
  # Session 0's words outside the vocabulary have mass after query 0 ('zq' only) and after
  # query 1 ('zq' and 'xv'); no other extended id ever does.
  has_mass = np.exp(np.asarray(log_probs))[0, :, 0, len(VOCAB):] > 0
  np.testing.assert_array_equal(np.flatnonzero(has_mass[0]), [0])
  np.testing.assert_array_equal(np.flatnonzero(has_mass[1]), [0, 1])


def test_fused_copy_loss_equals_its_definition_in_values_and_gradients(copy_model):
  cfg, model, params = copy_model
  batch = session_batch()
  rngs = {'dropout': jax.random.key(1)}
  vocab_size = cfg.vocab_size

  def plain(p):
    """Label-smoothed cross-entropy on the model's whole mixture, smoothing over V words."""
    log_probs = model.apply({'params': p}, batch, train=True, rngs=rngs)
    _, targets, weights = decoder_io(copying.extended_queries(batch, vocab_size))
    targets = losses.extended_targets(targets, copying.copyable_words(batch)[:, :-1],
                                      vocab_size)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    loss = 0.9 * nll - 0.1 * log_probs[..., :vocab_size].mean(-1)
    return (loss * weights).sum() / weights.sum(), (nll * weights).sum()

  def fused(p, chunk, groups):
    sums = losses.session_losses(model, p, batch, train=True, rngs=rngs, label_smoothing=0.1,
                                 chunk_tokens=chunk, groups=groups)
    return sums['loss'] / sums['tokens'], sums['nll']

  (loss, nll), grads = jax.jit(jax.value_and_grad(plain, has_aux=True))(params)
  assert np.isfinite(float(loss))
  for chunk, groups in ((3, 1), (2, 2)):
    (f_loss, f_nll), f_grads = jax.jit(jax.value_and_grad(
        functools.partial(fused, chunk=chunk, groups=groups), has_aux=True))(params)
    np.testing.assert_allclose(f_loss, loss, rtol=1e-5)
    np.testing.assert_allclose(f_nll, nll, rtol=1e-5)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-6),
                 f_grads, grads)
  # The copy head learns: its parameters receive gradients.
  assert float(jnp.abs(grads['copy_head']['gate']['kernel']).max()) > 0


def test_only_a_copying_model_writes_the_sessions_words_outside_the_vocabulary():
  """`Trained.copied_words`, the words a candidate's unknown words are scored as: those of
  the session, in order of first appearance, for a model that copies; none for one that does
  not, which reads every such word as <unk> (as its training did)."""
  context = ['w1 zq', 'w3 xv zq']
  for copies, words in ((True, ['zq', 'xv']), (False, [])):
    trained = inference.Trained(types.SimpleNamespace(copies=copies), None, VOCAB, 0, {})
    assert trained.copied_words(context) == words


def test_a_target_outside_the_vocabulary_and_the_context_is_unk():
  targets = jnp.array([[[40, 41, 7]]])  # V = 37: extended ids 3 and 4, then a word
  np.testing.assert_array_equal(
      losses.extended_targets(targets, jnp.array([[4]]), 37), [[[40, UNK_ID, 7]]])


def test_copy_token_losses_by_hand():
  """V = 4 uniform words, the gate at 1/2, equal attention over three source positions and a
  masked fourth. Token 0: source [2, 2, 5], target 5: P(5) = 1/6 < P(2) = 1/8 + 1/3, wrong.
  Token 1: the same source, target 2, right. Token 2: source [5, 6, 7], target 5: a three-way
  tie for the best (1/6 each, above any vocabulary word's 1/8), which counts as right.
  Smoothing takes the mean of log P over the V words, word 2 once however often copied."""
  masked = copying.MASKED_SCORE
  sources = jnp.array([[2, 2, 5, -1], [2, 2, 5, -1], [5, 6, 7, -1]], jnp.int32)
  scores = jnp.array([[0.0, 0.0, 0.0, masked]] * 3, jnp.float32)
  loss, nll, correct = jax.jit(functools.partial(losses.copy_token_losses, label_smoothing=0.1))(
      jnp.zeros((3, 4)), jnp.array([5, 2, 5]), jnp.zeros(3), scores, sources)
  p2 = 1 / 8 + 1 / 3
  np.testing.assert_allclose(nll, [np.log(6), -np.log(p2), np.log(6)], rtol=1e-6)
  mean_log_prob = np.array([(3 * np.log(1 / 8) + np.log(p2)) / 4] * 2 + [np.log(1 / 8)])
  np.testing.assert_allclose(loss, 0.9 * np.asarray(nll) - 0.1 * mean_log_prob, rtol=1e-6)
  np.testing.assert_array_equal(correct, [0.0, 1.0, 1.0])


def test_a_copied_word_fed_back_to_the_decoder_is_read_as_unk(copy_model):
  """The search feeds a copied word back by its extended id, which the decoder's word table
  has no row for: it reads `<unk>` there, as training read the same word (the queries hold
  `<unk>` for it), whatever the extended id."""
  cfg, model, params = copy_model
  memory = jax.jit(lambda b: model.apply({'params': params}, b, method='encode'))(
      session_batch())
  inputs = jnp.array([[1, 5, 0, 0]] * 6, jnp.int32)  # <s>, a word: rows of memory
  # One compiled program for the five decodes (run eagerly, each operation compiles alone).
  decode = jax.jit(lambda ids: model.apply({'params': params}, memory, ids, method='decode'))
  as_unk = decode(inputs.at[:, 2].set(UNK_ID))
  for extended_id in (cfg.vocab_size, cfg.vocab_size + 5, cfg.extended_vocab_size - 1):
    np.testing.assert_allclose(decode(inputs.at[:, 2].set(extended_id)), as_unk, atol=1e-6)
  assert not np.allclose(decode(inputs.at[:, 2].set(6)), as_unk, atol=1e-4)


def test_a_session_word_outside_the_vocabulary_is_suggested_verbatim(copy_model):
  """With the gate shut on the vocabulary (its bias very negative), every suggested word is
  copied; a context made only of unknown words is then written back in those words."""
  cfg, _, params = copy_model
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x - 50.0 if 'gate' in jax.tree_util.keystr(path) and
      x.ndim == 1 else x, params)
  config = default.get_config()
  task = tasks.make_task(cfg, config.train)
  trained = inference.Trained(task, params, VOCAB, step=0, meta={})
  # Two copyable words and no end token: exactly four suggestions of two words each.
  settings = search.SearchSettings(beam_size=4, max_len=2, length_penalty=0.0,
                                   emit_unk=False, top_k=4)
  context = inputs.Context(('zzyzx quokka',), 0, {})
  [[ranked]] = sources.generated(trained, [context], settings, positions='last', batch_rows=1)
  assert ranked
  for suggestion in ranked:
    words = suggestion['query'].split()
    assert words and set(words) <= {'zzyzx', 'quokka'}, suggestion
  # The user-facing protocol drops a suggestion that repeats the session's query.
  assert sorted(s['query'] for s in ranked) == ['quokka quokka', 'quokka zzyzx',
                                                'zzyzx quokka', 'zzyzx zzyzx']
  [[user_facing]] = sources.generated(
      trained, [context], dataclasses.replace(settings, exclude_session_queries=True),
      positions='last', batch_rows=1)
  assert user_facing == [s for s in ranked if s['query'] != 'zzyzx quokka']


def test_the_generator_scores_its_own_beam_as_the_search_did(copy_model):
  """The learned ranker's teacher-forced score of a candidate
  (`teacher_forcing.candidate_log_probs`) is the log-probability the beam search gave the
  same words (copied words outside the vocabulary included, by extended id): without a
  length penalty the search's score is that sum, and per token it is the sum over the words
  and `</s>` (none after a hypothesis of the most tokens, which the search ends there)."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  cfg, _, params = copy_model
  trained = inference.Trained(tasks.make_task(cfg, default.get_config().train), params, VOCAB,
                              step=0, meta={})
  settings = search.SearchSettings(beam_size=4, max_len=cfg.target_len, length_penalty=0.0,
                                   emit_unk=True, top_k=4)
  contexts = [inputs.Context(('w1 zq', 'w3 xv zq'), 0, {}), inputs.Context(('kk w4',), 0, {})]
  beams = sources.generated(trained, contexts, settings, positions='all', batch_rows=2)
  texts = [[[c['query'] for c in at] for at in lists] for lists in beams]
  assert any('zq' in q.split() for lists in texts for at in lists for q in at)
  scored = teacher_forcing.candidate_log_probs(trained, contexts, texts, positions='all',
                                               batch_rows=2)
  for lists, beam_lists, scores in zip(texts, beams, scored):
    for at, beam, values in zip(lists, beam_lists, scores):
      np.testing.assert_allclose(values[:, 0], [c['score'] for c in beam], rtol=1e-5,
                                 atol=1e-5)
      lengths = np.array([min(len(q.split()) + 1, cfg.target_len) for q in at])
      np.testing.assert_allclose(values[:, 1], values[:, 0] / lengths, rtol=1e-6)
  # A candidate scored after its context's last query only ('last') scores the same.
  last = teacher_forcing.candidate_log_probs(trained, contexts, [[t[-1]] for t in texts],
                                     positions='last', batch_rows=2)
  for lists, values in zip(scored, last):
    np.testing.assert_allclose(values[0], lists[-1], rtol=1e-5, atol=1e-5)


def test_a_candidate_is_scored_after_a_position_as_if_the_session_ended_there(copy_model):
  """Scoring every position of a session (evaluation, the ranker's training data) gives a
  candidate the figure a request ending at that position gives it: a word typed only in a
  later query ('xv') is unknown there, not a copy the model cannot make (-inf), which would
  tell the ranker what follows."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  cfg, _, params = copy_model
  trained = inference.Trained(tasks.make_task(cfg, default.get_config().train), params, VOCAB,
                              step=0, meta={})
  texts = ['xv', 'w1 xv', 'zq']
  every = teacher_forcing.candidate_log_probs(
      trained, [inputs.Context(('w1 zq', 'w3 xv zq'), 0, {})], [[texts, texts]],
      positions='all', batch_rows=1)[0][0]
  alone = teacher_forcing.candidate_log_probs(
      trained, [inputs.Context(('w1 zq',), 0, {})], [[texts]], positions='last',
      batch_rows=1)[0][0]
  assert np.isfinite(every).all()
  np.testing.assert_allclose(every, alone, rtol=1e-5, atol=1e-5)


def test_the_beams_own_candidates_are_not_forced_again(copy_model):
  """`teacher_forcing.beam_log_probs` reads the generator's own hypotheses' log-probabilities
  off the beam (its length penalty undone, MBR's 'model_score' where reranked): they equal teacher
  forcing to float rounding, and `candidate_log_probs` given them as `known` forces only the
  other candidates and returns the known sums as they are."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  cfg, _, params = copy_model
  trained = inference.Trained(tasks.make_task(cfg, default.get_config().train), params, VOCAB,
                              step=0, meta={})
  settings = search.SearchSettings(beam_size=4, max_len=cfg.target_len, length_penalty=1.2,
                                   emit_unk=True, top_k=4, mbr='beam+session')
  source = sources.Generate(trained, settings)
  contexts = [inputs.Context(('w1 zq', 'w3 xv zq'), 0, {}), inputs.Context(('kk w4',), 0, {})]
  lists = source.propose(contexts, positions='all', batch_rows=2)
  known = teacher_forcing.beam_log_probs(trained, source, contexts, lists)
  # What MBR adds (the session's queries) has no beam score: such a candidate is not known,
  # nor one of another source ('w4 w1').
  texts = [[[c['query'] for c in at] + ['w4 w1'] for at in by_position] for by_position in lists]
  assert all(set(k) == {c['query'] for c in at if 'model_score' in c}
             for by_k, by_l in zip(known, lists) for k, at in zip(by_k, by_l))
  forced = teacher_forcing.candidate_log_probs(trained, contexts, texts, positions='all',
                                               batch_rows=2)
  packed = []  # the tokens laid in packed rows to be forced
  add = teacher_forcing._Packing.add  # pylint: disable=protected-access
  def counting(self, memory_row, tokens):
    packed.append(len(tokens))
    add(self, memory_row, tokens)
  teacher_forcing._Packing.add = counting  # pylint: disable=protected-access
  try:
    mixed = teacher_forcing.candidate_log_probs(trained, contexts, texts, positions='all',
                                                batch_rows=2, known=known)
  finally:
    teacher_forcing._Packing.add = add  # pylint: disable=protected-access
  vocab_ids = lambda q: min(len(q.split()) + 1, cfg.target_len)
  unknown_tokens = sum(vocab_ids(q) for by_k, by_t in zip(known, texts)
                       for k, at in zip(by_k, by_t) for q in at if q not in k)
  assert 0 < sum(packed) == unknown_tokens
  for by_k, by_t, by_f, by_m in zip(known, texts, forced, mixed):
    for k, at, f, m in zip(by_k, by_t, by_f, by_m):
      np.testing.assert_allclose(m, f, rtol=1e-5, atol=1e-5)
      for j, q in enumerate(at):
        if q in k:
          assert m[j, 0] == np.float32(k[q])


def test_a_windowed_context_is_scored_after_its_own_output_positions(copy_model):
  """A raw log's windowed context suggests only after positions first_output.. (here after
  its 2nd and 3rd queries): a candidate scored there with positions='all' scores what it
  does after the same queries with positions='last', not what it would after the 1st."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  cfg, _, params = copy_model
  trained = inference.Trained(tasks.make_task(cfg, default.get_config().train), params, VOCAB,
                              step=0, meta={})
  session = ('w1 zq', 'w3 xv zq', 'zq w2')
  texts = [['w4 w1', 'zq w5'], ['w6', 'w2 zq w7']]
  [windowed] = teacher_forcing.candidate_log_probs(
      trained, [inputs.Context(session, 1, {})], [texts], positions='all', batch_rows=1)
  assert len(windowed) == 2
  last = teacher_forcing.candidate_log_probs(
      trained, [inputs.Context(session[:2], 0, {}), inputs.Context(session, 0, {})],
      [[texts[0]], [texts[1]]], positions='last', batch_rows=2)
  for at, values in zip(windowed, last):
    np.testing.assert_allclose(at, values[0], rtol=1e-5, atol=1e-5)


def test_a_pool_with_more_tokens_than_a_packed_row_scores_each_candidate_as_alone(copy_model):
  """64 candidates of the most words sharing a 3-word prefix fit a packed row's positions
  but not its 256 scored tokens (`PACKED_TARGETS`): they spill into a second row, no error,
  and each scores as it does in a row of its own."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  cfg, _, params = copy_model
  trained = inference.Trained(tasks.make_task(cfg, default.get_config().train), params, VOCAB,
                              step=0, meta={})
  pool = [f'w1 w2 w3 w{y} w{x}' for y in (4, 5) for x in range(32)]
  assert len(pool) * cfg.target_len > teacher_forcing.PACKED_TARGETS
  context = inputs.Context(('w7 w8',), 0, {})
  [[together]] = teacher_forcing.candidate_log_probs(trained, [context], [[pool]],
                                                     positions='last', batch_rows=1)
  alone = teacher_forcing.candidate_log_probs(trained, [context] * len(pool),
                                              [[[text]] for text in pool],
                                              positions='last', batch_rows=16)
  np.testing.assert_allclose(together, np.concatenate([a[0] for a in alone]), rtol=1e-5,
                             atol=1e-5)


def test_copy_head_is_a_scaled_dot_product_attention_over_the_source_and_a_gate():
  """`CopyHead` by its definition, in float64: scores (h W_q + b_q) . (s W_k + b_k) /
  sqrt(features) at the real source positions (`MASKED_SCORE` elsewhere); the attention's
  context, the sum of the source tokens s themselves weighed by the softmax of the scores;
  the gate's logit, a dense map of [h, context] (the decoder state first)."""
  head = copying.CopyHead(8)
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(2, 3, 8)).astype(np.float32)
  tokens = rng.normal(size=(2, 4, 8)).astype(np.float32)
  mask = np.array([[True, True, False, True], [True, False, False, False]])
  memory = {'copy_tokens': tokens, 'copy_mask': mask}
  params = jax.tree.map(lambda x: rng.normal(0, 0.5, x.shape).astype(np.float32), jax.eval_shape(
      lambda: head.init(jax.random.key(0), hidden, memory))['params'])
  gate, scores = head.apply({'params': params}, hidden, memory)
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  query = hidden @ p['query']['kernel'] + p['query']['bias']
  keys = tokens @ p['key']['kernel'] + p['key']['bias']
  expected = np.einsum('ntd,nld->ntl', query, keys) / np.sqrt(8)
  np.testing.assert_allclose(scores, np.where(mask[:, None], expected, copying.MASKED_SCORE),
                             rtol=1e-5, atol=1e-5)
  weights = np.where(mask[:, None], np.exp(expected - expected.max(-1, keepdims=True)), 0)
  context = np.einsum('ntl,nld->ntd', weights / weights.sum(-1, keepdims=True), tokens)
  expected_gate = (np.concatenate([hidden, context], -1) @ p['gate']['kernel'])[..., 0]
  np.testing.assert_allclose(gate, expected_gate + p['gate']['bias'][0], rtol=1e-5, atol=1e-5)


def test_packing_lays_sequences_as_a_tree_of_their_prefixes_by_hand():
  """`teacher_forcing._Packing`: each sequence's inputs (`<s>`, then its tokens but the last)
  share the row's existing nodes of the same (parent, token) and add the rest; a sequence
  starts a new row when its new positions would pass `width`, its tokens `num_targets`, or it
  reads another memory row. Targets pick the position of the input they follow."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  s = teacher_forcing.BOS_ID
  packing = teacher_forcing._Packing(6, 16, one_per_row=False)  # pylint: disable=protected-access
  packing.add(0, [5, 6, 2])
  packing.add(0, [5, 7, 2])  # shares <s> 5: one new position
  packing.add(0, [4, 4, 2])  # two new positions fill the row's 6; the second 4 is 4's child
  packing.known(-1.5, 3)
  packing.add(0, [5, 6, 8, 2])  # one new position would make 7 (its 4 targets fit): a new row
  packing.add(1, [5, 6, 8, 2])  # another memory row: a new row
  inputs, parents, picks, targets, memory_rows = packing.arrays()
  np.testing.assert_array_equal(inputs, [[s, 5, 6, 7, 4, 4], [s, 5, 6, 8, 0, 0],
                                         [s, 5, 6, 8, 0, 0]])
  np.testing.assert_array_equal(parents, [[-1, 0, 1, 1, 0, 4], [-1, 0, 1, 2, -1, -1],
                                          [-1, 0, 1, 2, -1, -1]])
  np.testing.assert_array_equal(picks, [[0, 1, 2, 0, 1, 3, 0, 4, 5] + [-1] * 7,
                                        [0, 1, 2, 3] + [-1] * 12, [0, 1, 2, 3] + [-1] * 12])
  np.testing.assert_array_equal(targets, [[5, 6, 2, 5, 7, 2, 4, 4, 2] + [0] * 7,
                                          [5, 6, 8, 2] + [0] * 12, [5, 6, 8, 2] + [0] * 12])
  np.testing.assert_array_equal(memory_rows, [0, 0, 1])
  assert packing.spans == [(0, 0, 3), (0, 3, 6), (0, 6, 9), (-1, 0, 3), (1, 0, 4), (2, 0, 4)]
  assert packing.given == [0.0, 0.0, 0.0, -1.5, 0.0, 0.0]
  # Scored tokens: a third two-token sequence would make 6 of at most 5.
  packing = teacher_forcing._Packing(64, 5, one_per_row=False)  # pylint: disable=protected-access
  for tokens in ([5, 2], [6, 2], [7, 2]):
    packing.add(0, tokens)
  assert packing.spans == [(0, 0, 2), (0, 2, 4), (1, 0, 2)]


def test_a_known_candidates_mean_is_over_its_words_and_its_end_token(copy_model):
  """A candidate whose sum of log p is `known` (the beam's own) is averaged over the tokens
  teacher forcing would have scored: its words and `</s>`, none after a candidate of the most
  tokens (`target_len`), as for a forced one."""
  from mtn_jax.inference import teacher_forcing  # pylint: disable=g-import-not-at-top
  cfg, _, params = copy_model
  trained = inference.Trained(tasks.make_task(cfg, default.get_config().train), params, VOCAB,
                              step=0, meta={})
  texts = ['w4 w1', 'w1 w2 w3 w4 w5']
  assert len(texts[1].split()) == cfg.target_len
  [[values]] = teacher_forcing.candidate_log_probs(
      trained, [inputs.Context(('w1 zq',), 0, {})], [[texts]], positions='last', batch_rows=1,
      known=[[{'w4 w1': -3.0, 'w1 w2 w3 w4 w5': -5.0}]])
  np.testing.assert_allclose(values, [[-3.0, -1.0], [-5.0, -1.0]])
