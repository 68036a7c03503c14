"""Iterative multi-document neural attention: the encoder's masking, the per-word
accumulation, the movie generator, BM25 retrieval's cache, the answers' dependence on their
documents, and training through the shared trainer (exact resume, evaluation)."""

import dataclasses
import functools
import json
import os
import re
import shutil
import signal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import imdna_movies
from mtn_jax.data import bm25
from mtn_jax.data import sessions as session_data
from mtn_jax.data import top_k
from mtn_jax.data.synthetic import movies
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import Vocab
from mtn_jax.evaluation import evaluate
from mtn_jax.evaluation import answer_hits
from mtn_jax.models import imdna
from mtn_jax.tasks import multi_answer
from mtn_jax.training import checkpoints
from mtn_jax.training import metric_writer
from mtn_jax.training import train
from tests import cli
from tests.test_models import random_like
from tests.test_train import final_params


def random_variables(module, seed, *inputs):
  """`module.init`'s variables, the parameters a random draw of their shapes (any parameters
  will do in these tests): no initialiser to compile, a model's takes seconds."""
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), *inputs)
  return {'params': random_like(shapes['params'], seed)}


def tiny_config(**model):
  fields = dict(name='imdna', vocab_size=12, max_query_words=5, max_session_queries=16,
                emb_dim=6, dropout=0.0, share_embeddings=False, tie_embeddings=False,
                compute_dtype='float32', num_items=4, state_dim=5, inference_steps=2,
                hidden_units=7)
  fields.update(model)
  return imdna.IMDNAConfig(**fields)


# ---------------------------------------------------------------------------------------------
# The model


def test_gru_encoder_ignores_padding_whatever_it_holds_and_however_long():
  encoder = imdna.BiGRUEncoder(4)
  rng = np.random.default_rng(0)
  embedded = jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32)
  lengths = jnp.array([3, 5])
  params = random_variables(encoder, 0, embedded, lengths)
  apply = jax.jit(encoder.apply)
  out = apply(params, embedded, lengths)
  # Other values in the padding, and more padding: the real positions do not move.
  noisy = embedded.at[0, 3:].set(100.0)
  longer = jnp.concatenate([noisy, jnp.full((2, 4, 3), -7.0)], axis=1)
  for other in (noisy, longer):
    again = apply(params, other, lengths)
    np.testing.assert_allclose(again[0, :3], out[0, :3], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(again[1, :5], out[1, :5], rtol=1e-6, atol=1e-6)
  # The backward direction starts at each row's last real token, not at the padding: the
  # backward half at the last real token has read that token alone.
  alone = apply(params, embedded[:1, 2:3], jnp.array([1]))
  np.testing.assert_allclose(out[0, 2, 4:], alone[0, 0, 4:], rtol=1e-6, atol=1e-6)


def test_model_ignores_padded_questions_documents_and_missing_documents():
  cfg = tiny_config()
  model = imdna.create(cfg)
  batch = {'question': jnp.array([[3, 4, 5, 0, 0]]),
           'documents': jnp.array([[[6, 7, 8], [9, 3, 0]]])}
  params = random_variables(model, 1, batch)
  read = jax.jit(functools.partial(model.apply, method='read'))
  reading = read(params, batch)
  padded = {'question': jnp.array([[3, 4, 5, 0, 0]]),
            'documents': jnp.array([[[6, 7, 8, 0], [9, 3, 0, 0], [0, 0, 0, 0]]])}
  again = read(params, padded)
  np.testing.assert_allclose(again['logits'], reading['logits'], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(again['word_scores'], reading['word_scores'], rtol=1e-5,
                             atol=1e-7)
  attention = again['document_attention']  # [B, T, K, Ld]
  assert attention.shape == (1, 2, 3, 4)
  np.testing.assert_allclose(attention.sum((2, 3)), 1.0, rtol=1e-6)
  assert float(jnp.abs(attention[0, :, 2]).sum()) == 0.0  # the missing document
  assert float(jnp.abs(attention[0, :, :, 3]).sum()) == 0.0  # padding
  np.testing.assert_allclose(again['query_attention'].sum(-1), 1.0, rtol=1e-6)



def test_question_encoder_prediction_input_and_initial_answer_bias():
  """Two bidirectional GRUs (module docstring), one over the question and another over each
  document: the question's attention moves with the question encoder's weights. The network
  reads z N (`IMDNA.read`). Each answer's bias starts at -log A, so that every answer starts
  at a probability of about 1/A."""
  model = imdna.create(tiny_config())
  batch = {'question': jnp.array([[3, 4, 5, 0, 0]]),
           'documents': jnp.array([[[6, 7, 8], [9, 3, 0]]])}
  params = random_variables(model, 1, batch)['params']
  read = jax.jit(lambda p: model.apply({'params': p}, batch, method='read'))
  negated = {**params, 'question_encoder': jax.tree.map(jnp.negative,
                                                        params['question_encoder'])}
  assert np.abs(np.asarray(read(negated)['query_attention']
                           - read(params)['query_attention'])).max() > 1e-4
  # The prediction network reads z times N, the documents' real tokens (5 here, not 6).
  reading = read(params)
  dense = lambda name, x: x @ np.asarray(params[name]['kernel']) + np.asarray(
      params[name]['bias'])
  hidden = np.maximum(dense('hidden', 5 * np.asarray(reading['word_scores'])), 0)
  np.testing.assert_allclose(reading['logits'], dense('answers', hidden), rtol=1e-5,
                             atol=1e-6)
  answers = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 7)),
                       method=lambda m, hidden: m.answers(hidden))['params']['answers']
  np.testing.assert_allclose(answers['bias'], np.full(4, -np.log(4)), rtol=1e-6)

def test_word_scores_match_a_hand_computation():
  # Two documents stacked: [a b a pad | c a pad pad], a=5, b=6, c=7.
  tokens = jnp.array([[5, 6, 5, 0, 7, 5, 0, 0]])
  attention = jnp.array([[0.1, 0.2, 0.3, 0.0, 0.25, 0.15, 0.0, 0.0]])
  z = imdna.word_scores(attention, tokens, vocab_size=9)
  # score(w) = sum of phi(i, w) over documents / pi(w), pi(w) = w's occurrences.
  expected = np.zeros(9)
  expected[5] = (0.1 + 0.3 + 0.15) / 3
  expected[6] = 0.2 / 1
  expected[7] = 0.25 / 1
  np.testing.assert_allclose(np.asarray(z[0]), expected, rtol=1e-6)


def test_following_queries_are_those_after_the_best_match_in_each_retrieved_session():
  """AOL: in each retrieved session, best first (a missing one, -1, skipped), the queries
  after the first that shares most words with the context's last query; each once, none of
  the context's."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  document_queries = [
      ['paris hotels cheap', 'louvre tickets', 'cheap flights'],  # 'paris hotels cheap' has 2
      ['paris', 'hotels', 'museum'],  # a tie of 1 word: the first, 'paris'
      ['weather', 'hotels paris', 'eiffel tower', 'louvre tickets']]  # 'hotels paris' has 2
  library = imdna_library.Library(
      vocab=None, documents=[], document_tokens=np.zeros((1, 1), np.int32), answers=[],
      answer_words=np.zeros(0, np.int32), splits={},
      extra={'document_queries': document_queries})
  questions = imdna_library.QuestionSet(
      question=np.zeros((1, 1), np.int32), documents=np.array([[2, -1, 1, 0]]),
      document_scores=np.zeros((1, 4), np.float32), answers=np.full((1, 1), -1, np.int32),
      texts=[''], answer_texts=[''])
  assert imdna_library.following_queries(
      library, questions, 0, ['cheap flights', 'paris hotels']) == [
          'eiffel tower', 'louvre tickets', 'hotels', 'museum']


def test_next_queries_are_ranked_by_the_mean_probability_of_their_known_words():
  from mtn_jax.data.vocab import SPECIAL_TOKENS  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import UNK_ID  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import imdna_proposer  # pylint: disable=g-import-not-at-top
  vocab = Vocab(SPECIAL_TOKENS + ('eiffel', 'tower', 'louvre', 'tickets', 'museum'))
  probabilities = np.zeros(len(vocab), np.float32)
  probabilities[UNK_ID] = 0.99  # never read: an unknown word counts for nothing
  probabilities[vocab.encode(['eiffel', 'tower', 'louvre', 'tickets', 'museum'])] = [
      0.9, 0.1, 0.6, 0.6, 0.55]
  # Means: 0.5, 0.6, 0 (no known word), 0.55 (the unknown word left out), 0.6 (a tie, after
  # the first in the given order); by sums 'eiffel tower' (1.0) would come before 'museum'.
  candidates = ['eiffel tower', 'louvre tickets', 'hotels', 'museum zzz', 'tickets louvre']
  assert imdna_proposer.by_word_probability(candidates, probabilities, vocab) == [
      'louvre tickets', 'tickets louvre', 'museum zzz', 'eiffel tower', 'hotels']


def test_removing_the_document_that_holds_the_answer_removes_it_from_the_top():
  """With a prediction network that passes each word's score to the answer naming it, the
  answers are read off the documents: the answer whose document goes away drops out."""
  vocab, answers = 12, 4
  answer_words = np.array([8, 9, 10, 11])
  cfg = tiny_config(vocab_size=vocab, num_items=answers, hidden_units=vocab)
  model = imdna.create(cfg)
  batch = {'question': jnp.array([[3, 4, 0, 0, 0]]),
           'documents': jnp.array([[[3, 8, 5], [6, 7, 2], [4, 11, 0]]])}
  params = random_variables(model, 2, batch)['params']
  read = jax.jit(functools.partial(model.apply, method='read'))
  params['hidden'] = {'kernel': jnp.eye(vocab), 'bias': jnp.zeros(vocab)}
  params['answers'] = {'kernel': jnp.eye(vocab)[:, answer_words],
                       'bias': jnp.zeros(answers)}
  reading = read({'params': params}, batch)
  logits = np.asarray(reading['logits'][0])
  z = np.asarray(reading['word_scores'][0])
  tokens = int((batch['documents'] != 0).sum())  # N = 8: the network reads z * N
  np.testing.assert_allclose(logits, z[answer_words] * tokens, rtol=1e-6)
  top = set(np.flatnonzero(logits > 0))
  assert top == {0, 3}  # words 8 and 11, in documents 0 and 2
  without = {'question': batch['question'], 'documents': batch['documents'].at[0, 0].set(0)}
  logits_without = np.asarray(read({'params': params}, without)['logits'][0])
  assert logits_without[0] == 0.0 and logits_without[3] > 0


def softmax_over(logits, mask):
  weights = np.where(mask, np.exp(logits - logits[mask].max()), 0.0)
  return weights / weights.sum()


@pytest.mark.parametrize('gates_at_half', [True, False])
def test_one_inference_step_by_hand(gates_at_half):
  """Sordoni et al.'s step (module docstring): the query attentive read over the real
  question tokens, the document read keyed by [s, q_t] over the real document tokens, and
  the GRU fed [g_q * q_t, g_d * d_t], each gate scaling its own read (gates of 1/2, or the
  gates sigmoid(MLP(r)) of r = [s, q_t, d_t, q_t * d_t] by hand)."""
  rng = np.random.default_rng(0)
  state = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)
  question = jnp.asarray(rng.normal(size=(2, 4, 6)), jnp.float32)
  documents = jnp.asarray(rng.normal(size=(2, 7, 6)), jnp.float32)
  question_mask = jnp.array([[True, True, False, False], [True, True, True, True]])
  documents_mask = jnp.array([[True] * 5 + [False] * 2, [True, False] * 3 + [True]])
  encodings = (question, question_mask, documents, documents_mask)
  step = imdna.InferenceStep(5)
  params = random_variables(step, 0, state, encodings)['params']
  for gate in ('query_gate', 'document_gate') if gates_at_half else ():
    params[gate]['out'] = jax.tree.map(jnp.zeros_like, params[gate]['out'])  # sigmoid(0)
  new_state, (query_attention, document_attention) = jax.jit(step.apply)(
      {'params': params}, state, encodings)
  dense = lambda name, x, p=params: x @ np.asarray(p[name]['kernel']) + np.asarray(
      p[name]['bias'])
  gate = lambda name, r: 1 / (1 + np.exp(-dense('out', np.maximum(
      dense('hidden', r, params[name]), 0), params[name])))
  gru = nn.GRUCell(5, parent=None)
  for b in range(2):
    s, q_tokens, d_tokens = map(np.asarray, (state[b], question[b], documents[b]))
    a = softmax_over(q_tokens @ dense('query_read', s), np.asarray(question_mask[b]))
    np.testing.assert_allclose(query_attention[b], a, rtol=1e-5, atol=1e-7)
    q = a @ q_tokens
    d_weights = softmax_over(d_tokens @ dense('document_read', np.concatenate([s, q])),
                             np.asarray(documents_mask[b]))
    np.testing.assert_allclose(document_attention[b], d_weights, rtol=1e-5, atol=1e-7)
    d = d_weights @ d_tokens
    r = np.concatenate([s, q, d, q * d])
    g_q, g_d = gate('query_gate', r), gate('document_gate', r)
    if gates_at_half:
      np.testing.assert_allclose(np.concatenate([g_q, g_d]), 0.5)
    expected, _ = gru.apply({'params': params['search_state']}, s[None],
                            np.concatenate([g_q * q, g_d * d])[None])
    np.testing.assert_allclose(new_state[b], expected[0], rtol=1e-5, atol=1e-6)


def test_answers_are_read_off_the_last_inference_steps_document_attention():
  """z (`word_scores`) comes from the attention of the last of the T steps, the one that has
  read the question and documents T times, not the first."""
  model = imdna.create(tiny_config(inference_steps=3))
  batch = {'question': jnp.array([[3, 4, 5, 0, 0], [6, 0, 0, 0, 0]]),
           'documents': jnp.array([[[6, 7, 8], [9, 3, 0]], [[5, 5, 4], [0, 0, 0]]])}
  params = random_variables(model, 1, batch)
  reading = jax.jit(functools.partial(model.apply, method='read'))(params, batch)
  attention = reading['document_attention']  # [B, T, K, Ld]
  assert np.abs(np.asarray(attention[:, -1] - attention[:, 0])).max() > 1e-4
  np.testing.assert_allclose(
      reading['word_scores'],
      imdna.word_scores(attention[:, -1].reshape(2, -1), batch['documents'].reshape(2, -1), 12),
      rtol=1e-6)


def test_supervised_embeddings_score_the_mean_of_the_real_question_words():
  """Dodge et al.'s baseline: the mean of the question's word embeddings (its padding left
  out) dotted with each answer's embedding, plus the answer's bias."""
  model = imdna.create(tiny_config(reader='embeddings'))
  batch = {'question': jnp.array([[3, 4, 5, 0, 0], [6, 0, 0, 0, 0]]),
           'documents': jnp.zeros((2, 1, 2), jnp.int32)}
  params = random_variables(model, 1, batch)['params']
  logits = jax.jit(model.apply)({'params': params}, batch)
  table = np.asarray(params['Embed_0']['embedding'])
  for b, words in enumerate(([3, 4, 5], [6])):
    np.testing.assert_allclose(
        logits[b], table[words].mean(0) @ np.asarray(params['answer_embeddings']).T
        + np.asarray(params['answer_bias']), rtol=1e-5, atol=1e-6)


def test_the_loss_counts_questions_with_an_answer_and_hits_at_1_their_top_answer():
  """The summed sigmoid cross-entropy over every candidate answer of each question that has
  an answer (a question with none is no example), and 'correct' (HITS@1): the answer
  scored highest is one of the question's answers."""
  task = multi_answer.IMDNATask(tiny_config())
  batch = {'question': jnp.array([[3, 4, 0, 0, 0], [6, 7, 8, 0, 0], [9, 0, 0, 0, 0]]),
           'documents': jnp.array([[[6, 7, 8], [9, 3, 0]]] * 3)}
  params = random_variables(task.model, 1, batch)['params']
  logits = np.asarray(jax.jit(task.model.apply)({'params': params}, batch))
  best, worst = logits.argmax(-1), logits.argmin(-1)
  # Question 0: its best answer and another, not its worst; question 1: one neither its best
  # nor its worst (a miss); question 2: no answer.
  other = [a for a in range(4) if a not in (best[0], worst[0])][0]
  middle = [a for a in range(4) if a not in (best[1], worst[1])][0]
  answers = jnp.array([[best[0], other], [middle, -1], [-1, -1]], jnp.int32)
  sums = jax.jit(lambda p, b: task.loss_sums(p, b, train=False))(
      params, {**batch, 'answers': answers})
  expected = 0.0
  for q, hits in ((0, {best[0], other}), (1, {middle})):
    targets = np.array([float(a in hits) for a in range(4)])
    p = 1 / (1 + np.exp(-logits[q]))
    expected -= (targets * np.log(p) + (1 - targets) * np.log(1 - p)).sum()
  np.testing.assert_allclose(float(sums['loss']), expected, rtol=1e-5)
  assert float(sums['tokens']) == float(sums['pairs']) == 2
  assert float(sums['correct']) == 1


def test_multi_hot_ignores_padding():
  hot = multi_answer.multi_hot(jnp.array([[2, 0, -1], [-1, -1, -1]]), 4)
  np.testing.assert_array_equal(hot, [[1, 0, 1, 0], [0, 0, 0, 0]])


def test_validation_figures_are_per_question_with_an_answer():
  """The summed loss per question and HITS@1 in percent, as the evaluation reports its hits;
  a split with no question gives zeros, not a division by zero."""
  totals = {'loss': 6.0, 'nll': 6.0, 'correct': 1.0, 'tokens': 4.0, 'pairs': 4.0}
  assert multi_answer.IMDNATask.summarize(totals) == {
      'loss': 1.5, 'hits_at_1': 25.0, 'questions': 4.0}
  assert multi_answer.IMDNATask.summarize(dict.fromkeys(totals, 0.0)) == {
      'loss': 0.0, 'hits_at_1': 0.0, 'questions': 0.0}


def test_hits_and_recall_at_k():
  ranked = np.array([[3, 1, 2], [0, 1, 2]])
  answers = np.array([[1, -1], [2, 5]])
  assert answer_hits.hits_at(ranked, answers, (1, 2)) == {'hits_at_1': 0.0, 'hits_at_2': 50.0}
  assert answer_hits.recall_at(ranked, answers, (3,)) == {'recall_at_3': 75.0}
  # A question without an answer counts 0, in the mean like any other.
  ranked, answers = np.vstack([ranked, [[1, 2, 3]]]), np.vstack([answers, [[-1, -1]]])
  assert answer_hits.recall_at(ranked, answers, (3,)) == {'recall_at_3': 50.0}
  assert answer_hits.hits_at(ranked, answers, (3,)) == {'hits_at_3': pytest.approx(200 / 3)}


def _stub_library(split='test', **extra):
  """Four words ('paris', 'louvre', 'museum' are the candidate answers, 'hotels' is not),
  two documents and the padding row a missing document (-1) lands on."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import SPECIAL_TOKENS  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import Vocab  # pylint: disable=g-import-not-at-top
  vocab = Vocab(SPECIAL_TOKENS + ('paris', 'louvre', 'museum', 'hotels'))
  paris, louvre, museum, hotels = vocab.encode(['paris', 'louvre', 'museum', 'hotels'])
  questions = imdna_library.QuestionSet(
      question=np.array([[paris, hotels, 0]], np.int32),
      documents=np.array([[0, -1, 1]], np.int32),
      document_scores=np.array([[2.0, 5.0, 0.5]], np.float32),
      answers=np.array([[1]], np.int32), texts=['paris hotels'], answer_texts=['b'])
  library = imdna_library.Library(
      vocab=vocab, documents=['paris louvre louvre', 'museum hotels'],
      document_tokens=np.array([[paris, louvre, louvre], [museum, hotels, 0], [0, 0, 0]],
                               np.int32),
      answers=['paris', 'louvre', 'museum'],
      answer_words=np.array([paris, louvre, museum], np.int32),
      splits={split: questions}, extra=extra)
  return library, questions


def _question_set(n):
  """n questions, question i reading documents (i % 2, -1): the second one missing."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  return imdna_library.QuestionSet(
      question=np.arange(1, n + 1, dtype=np.int32)[:, None] + np.zeros((1, 2), np.int32),
      documents=np.stack([np.arange(n) % 2, np.full(n, -1)], 1).astype(np.int32),
      document_scores=np.ones((n, 2), np.float32),
      answers=np.arange(n, dtype=np.int32)[:, None], texts=[''] * n, answer_texts=[''] * n)


def test_a_missing_document_and_a_padding_row_read_no_document():
  """Document id -1 (BM25 found fewer than K) lands on the all-padding row that follows the
  documents, not on the last document; the evaluation's last batch is padded with rows of no
  question (-1), no answer and no document."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  settings = imdna_movies.get_config('test').imdna
  settings.max_document_words = 3
  tokens = imdna_library._document_tokens(  # pylint: disable=protected-access
      [[5, 6], [7, 8, 9, 10]], settings)
  np.testing.assert_array_equal(tokens, [[5, 6, 0], [7, 8, 9], [0, 0, 0]])
  batches = list(imdna_library.question_batches(_question_set(3), tokens, 2))
  assert len(batches) == 2  # evaluation: every question, the last batch padded
  np.testing.assert_array_equal(batches[0]['documents'],
                                [[[5, 6, 0], [0, 0, 0]], [[7, 8, 9], [0, 0, 0]]])
  last = batches[1]
  np.testing.assert_array_equal(last['question_ids'], [2, -1])
  np.testing.assert_array_equal(last['documents'], [[[5, 6, 0], [0, 0, 0]], [[0, 0, 0]] * 2])
  np.testing.assert_array_equal(last['answers'], [[2], [-1]])
  np.testing.assert_array_equal(last['question'], [[3, 3], [0, 0]])


def test_answer_scores_give_each_question_its_own_row_whatever_the_batch_size():
  """3 questions in batches of 2 score as the first 3 of 4 do: the padding row of the last
  batch (question id -1) is written nowhere, not on the last question's row as index -1."""
  library, _ = _stub_library()
  task = multi_answer.IMDNATask(tiny_config(vocab_size=len(library.vocab), num_items=3))
  batch = {'question': np.ones((1, 2), np.int32), 'documents': library.document_tokens[None]}
  params = random_variables(task.model, 0, batch)['params']
  four = task.answer_scores(params, library, _question_set(4), batch_size=2)
  assert four.shape == (4, 3) and len({tuple(row) for row in four.round(6)}) == 4
  np.testing.assert_allclose(task.answer_scores(params, library, _question_set(3), batch_size=2),
                             four[:3], rtol=1e-6)


def test_training_batches_reshuffle_every_epoch_and_repeat_exactly():
  """With a seed: step s is batch s % steps_per_epoch of epoch s // steps_per_epoch's own
  permutation (seeded by the seed and the epoch), whole batches only, each question at most
  once an epoch; a pure function of the step, so a resumed run reads the same batches."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  tokens = np.zeros((3, 2), np.int32)
  questions = _question_set(7)
  stream = iter(imdna_library.question_batches(questions, tokens, 3, seed=4))
  ids = [next(stream)['question_ids'].tolist() for _ in range(6)]  # 3 epochs of 2 batches
  epochs = [ids[i] + ids[i + 1] for i in (0, 2, 4)]
  for epoch in epochs:
    assert len(set(epoch)) == 6 and set(epoch) <= set(range(7))
  assert len({tuple(epoch) for epoch in epochs}) == 3
  again = iter(imdna_library.question_batches(questions, tokens, 3, seed=4))
  assert [next(again)['question_ids'].tolist() for _ in range(6)] == ids


def test_a_long_question_keeps_its_latest_words():
  """AOL questions are session prefixes: cut to max_question_words, they keep their end (the
  latest queries, which the next one follows), documents and answers their beginning."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  np.testing.assert_array_equal(
      imdna_library.pad_rows([[1, 2, 3, 4, 5], [6]], 3, 0, keep='last'), [[3, 4, 5], [6, 0, 0]])
  np.testing.assert_array_equal(
      imdna_library.pad_rows([[1, 2, 3, 4, 5], [6]], 3, -1), [[1, 2, 3], [6, -1, -1]])


def test_aol_questions_read_other_users_sessions_and_answer_each_word_once(tmp_path):
  """AOL (`imdna_library`): a question (a session prefix) reads the K training sessions BM25
  finds most like it among OTHER users' (its own user's would hand it the answer: here
  every query names its user, 'u3'); its answers are the words of the logged next query,
  each once (`<unk>` would be left out)."""
  from configs import imdna_aol  # pylint: disable=g-import-not-at-top
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.vocab import UNK_ID  # pylint: disable=g-import-not-at-top
  from tests.test_data_layer import row, write  # pylint: disable=g-import-not-at-top
  texts = ['paris hotels', 'hotels paris hotels', 'cheap flights', 'rome flights']
  log = write(tmp_path / 'log.tsv', [
      row(user, f'{texts[(user + k + i) % 4]} u{user}', f'{8 + 2 * k:02d}:0{i}')
      for user in range(1, 7) for k in range(3) for i in range(3)])
  config = imdna_aol.get_config()
  config.data.raw_files, config.data.min_word_count = log, 1
  config.data.split_fractions = (0.6, 0.2, 0.2)
  config.imdna.num_documents = 4
  library = imdna_library.load_library(config, str(tmp_path / 'w'))
  users = library.extra['document_users']
  repeated = 0
  for name, questions in library.splits.items():
    split = session_data.load_split(str(tmp_path / 'w' / 'data'), name)
    question_users = np.repeat(split.users, split.lengths - 1)
    assert len(questions) == len(question_users) > 0
    for i, user in enumerate(question_users):
      found = questions.documents[i][questions.documents[i] >= 0]
      assert len(found) == 4 and user not in users[found].tolist(), (name, i)
      words = [w for w in dict.fromkeys(library.vocab.encode_text(questions.answer_texts[i]))
               if w != UNK_ID]
      assert questions.answers[i][questions.answers[i] >= 0].tolist() == words
      repeated += 'hotels paris hotels' in questions.answer_texts[i]
  assert repeated  # a next query that repeats a word


def test_bm25_alone_sums_the_scores_of_the_documents_holding_each_answer():
  """BM25's HITS figure beside the model's: each answer scores the BM25 scores of the
  retrieved documents holding it, once per document however often it occurs there ('louvre'
  twice in document 0: 2.0, not 4.0), a missing document (-1, score 5.0) nothing; with
  `exclude_question_words` (a movie question's entity is never its answer) the question's
  own words score -1, the bottom of the list."""
  library, questions = _stub_library()
  np.testing.assert_array_equal(
      answer_hits.bm25_answer_scores(library, questions, exclude_question_words=False),
      [[2.0, 2.0, 0.5]])
  np.testing.assert_array_equal(
      answer_hits.bm25_answer_scores(library, questions, exclude_question_words=True),
      [[-1.0, 2.0, 0.5]])



def test_bm25_alone_never_answers_a_special_token():
  """On AOL every word of the vocabulary is a candidate answer, the special tokens too: a
  document's padding is no answer, and no special token is ranked above an answer that no
  document holds (they score -1, the bottom of the list)."""
  library, questions = _stub_library()
  library = dataclasses.replace(library, answers=list(library.vocab.words),
                                answer_words=np.arange(len(library.vocab), dtype=np.int32))
  scores = answer_hits.bm25_answer_scores(library, questions, exclude_question_words=False)
  # paris, louvre, museum, hotels after the special tokens; document 1 holds padding.
  np.testing.assert_array_equal(scores, [[-1.0] * len(SPECIAL_TOKENS) + [2.0, 2.0, 0.5, 0.5]])


def test_the_most_frequent_next_query_follows_the_contexts_last_query(tmp_path):
  """AOL's next-query figures: 'most frequent next' answers the context's LAST query. In
  training 'a' was followed by 'b', 'x' by 'c'; after ('x', 'a') the logged next query 'b'
  is the one suggested."""
  from mtn_jax.data.sessions import SessionSplit  # pylint: disable=g-import-not-at-top
  texts = ['a', 'b', 'x', 'c']
  path = tmp_path / 'train.text.txt'
  path.write_text(''.join(t + '\n' for t in texts), encoding='utf-8')
  train = SessionSplit('train', np.zeros((4, 2), np.int32), np.array([0, 2, 4]), str(path))
  library, questions = _stub_library(
      test={'contexts': [['x', 'a']]}, train_split=train,
      document_queries=[['x', 'a', 'b'], ['museum hotels']])
  scores = np.zeros((1, len(library.vocab)), np.float32)
  figures = answer_hits._aol_query_figures(  # pylint: disable=protected-access
      library, questions, 'test', scores)
  assert figures['most_frequent_next']['exact_match'] == 100.0
  assert figures['bm25']['exact_match'] == 100.0  # 'b', after 'a' in document 0


def test_each_aol_question_ranks_its_candidates_by_its_own_model_scores(tmp_path, monkeypatch):
  """AOL's next-query figures rank question i's candidates by row i of the model's word
  probabilities: two questions with the same candidates, each row preferring its own
  question's next query, both ranked first."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from mtn_jax.data.sessions import SessionSplit  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'train.text.txt'
  path.write_text('paris\nmuseum\n', encoding='utf-8')
  train = SessionSplit('train', np.zeros((2, 2), np.int32), np.array([0, 2]), str(path))
  library, one = _stub_library(test={'contexts': [['paris'], ['paris']]}, train_split=train)
  questions = dataclasses.replace(
      one, question=np.repeat(one.question, 2, 0), documents=np.repeat(one.documents, 2, 0),
      document_scores=np.repeat(one.document_scores, 2, 0),
      answers=np.repeat(one.answers, 2, 0), texts=['paris hotels'] * 2,
      answer_texts=['louvre', 'museum'])
  monkeypatch.setattr(answer_hits.imdna_library, 'following_queries',
                      lambda *args: ['louvre', 'museum'])
  scores = np.zeros((2, len(library.vocab)), np.float32)
  louvre, museum = library.vocab.encode(['louvre', 'museum'])
  scores[0, louvre] = scores[1, museum] = 1.0
  figures = answer_hits._aol_query_figures(  # pylint: disable=protected-access
      library, questions, 'test', scores)
  assert figures['model']['exact_match'] == 100.0
  assert figures['bm25']['exact_match'] == 50.0  # the candidates' own order: 'louvre' first
  # A quick look at the first question (config.decode.max_eval_sessions=1): its context alone.
  first = answer_hits._aol_query_figures(  # pylint: disable=protected-access
      library, answer_hits.first_questions(questions, 1), 'test', scores[:1])
  assert (first['model']['pairs'], first['bm25']['exact_match']) == (1, 100.0)


# ---------------------------------------------------------------------------------------------
# The movie world


def test_generator_is_seeded_and_its_answers_follow_from_its_triples():
  world = movies.generate(40, 30, seed=3)
  assert movies.generate(40, 30, seed=3) == world
  assert movies.generate(40, 30, seed=4).movies != world.movies
  triples = set(world.triples())
  titles = {m.title for m in world.movies}
  assert len(titles) == 40
  for question in world.questions['qa']:
    # The one template and entity that write this question.
    ((relation, direction, entity),) = [
        (r, d, w) for r, d, text in movies._QA_TEMPLATES for w in question.text.split()
        if text.format(w) == question.text]
    if direction == 'forward':  # 'who acted in M': every object of that relation
      expected = {o for s, r, o in triples if s == entity and r == relation}
    else:  # 'what does A act in': every movie listing A
      expected = {s for s, r, o in triples if o == entity and r == relation}
    assert set(question.answers) == expected
    assert len(set(question.answers)) == len(question.answers)
  for question in world.questions['recs']:
    (answer,) = question.answers
    assert answer in titles and answer not in question.text.split()
  documents = world.documents()
  assert all(d.split()[0] == m.title for d, m in zip(documents, world.movies))


def test_a_genre_of_exactly_four_movies_is_enough_for_recommendation_questions():
  """A recommendation question names 4 liked movies of one genre: a genre of 4 is enough."""
  world = movies.generate(12, 3, seed=2)
  assert np.bincount([movies.GENRES.index(m.genre) for m in world.movies]).max() == 4
  assert len(world.questions['recs']) == 3


def test_the_world_has_the_documented_shape():
  """A movie has one director, one or two writers, two to four actors and one to three tags;
  people lean to genres and a user's four movies to a taste. The counts add up: a QA question
  per movie and forward template (six) and per person and inverse one (three), a
  recommendation question per user."""
  world = movies.generate(200, 300, seed=3)
  assert {len(m.writers) for m in world.movies} == {1, 2}
  assert {len(m.actors) for m in world.movies} == {2, 3, 4}
  assert {len(m.tags) for m in world.movies} == {1, 2, 3}
  people = [{m.director for m in world.movies}, {w for m in world.movies for w in m.writers},
            {a for m in world.movies for a in m.actors}]
  assert len(world.questions['qa']) == 6 * 200 + sum(len(p) for p in people)
  assert len(world.questions['recs']) == 300
  by_director = {}
  for m in world.movies:
    by_director.setdefault(m.director, []).append(m.genre)
  in_main_genre = sum(max(map(g.count, g)) for g in by_director.values())
  assert in_main_genre > 0.6 * len(world.movies)
  by_title = {m.title: m for m in world.movies}
  shared_tag = 0
  for question in world.questions['recs']:
    liked = [by_title[w] for w in question.text.split() if w in by_title]
    liked.append(by_title[question.answers[0]])
    assert len(liked) == 4 and len({m.genre for m in liked}) == 1
    shared_tag += bool(set.intersection(*(set(m.tags) for m in liked)))
  assert shared_tag > 0.5 * len(world.questions['recs'])


def test_too_few_movies_are_refused_rather_than_searched_without_end():
  with pytest.raises(ValueError, match='num_movies must be at least 12'):
    movies.generate(11, 0, seed=0)
  assert len(movies.generate(12, 0, seed=0).movies) == 12
  # Twelve movies seldom give one genre the four that a recommendation question names: a
  # clear refusal, where the questions' draw would otherwise go on for ever (the alarm makes
  # such a draw a failure of this test, not a suite that never ends).
  def endless(signum, frame):
    raise AssertionError('the recommendation questions were drawn without end')

  previous = signal.signal(signal.SIGALRM, endless)
  signal.alarm(30)
  try:
    with pytest.raises(ValueError, match='gives no genre the 4 movies'):
      movies.generate(12, 3, seed=0)
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_splits_are_a_seeded_80_10_10_partition_in_the_questions_order():
  splits = movies.split_questions(list(range(1000)), seed=5)
  assert [len(splits[s]) for s in movies.SPLITS] == [800, 100, 100]
  assert sorted(sum(splits.values(), [])) == list(range(1000))
  assert all(part == sorted(part) for part in splits.values())
  assert movies.split_questions(list(range(1000)), seed=5) == splits
  assert movies.split_questions(list(range(1000)), seed=6) != splits


def test_prepare_writes_once_and_splits_cover_every_question(tmp_path):
  config = imdna_movies.get_config('test')
  first = movies.prepare(config, str(tmp_path))
  data_dir = tmp_path / 'data'
  stamp = os.stat(data_dir / 'movies.kb.tsv').st_mtime_ns
  assert movies.prepare(config, str(tmp_path)) == first
  assert os.stat(data_dir / 'movies.kb.tsv').st_mtime_ns == stamp
  world = movies.generate(config.movies.num_movies, config.movies.num_users,
                          config.movies.seed)
  for task in movies.TASKS:
    loaded = [q for s in movies.SPLITS for q in movies.load_questions(str(data_dir), task, s)]
    assert sorted(q.text for q in loaded) == sorted(q.text for q in world.questions[task])
  (data_dir / 'movies.qa.test.jsonl').write_text('{"question": "x"}\n')
  with pytest.raises(Exception, match=r'movies.qa.test.jsonl:1: not a question line'):
    movies.load_questions(str(data_dir), 'qa', 'test')


def test_a_build_cut_short_is_made_again_not_reused(tmp_path, monkeypatch):
  # A build for other settings stopped after two of its files leaves the first settings'
  # manifest behind no longer: the first settings' next run rebuilds, with their own world.
  config = imdna_movies.get_config('test')
  movies.prepare(config, str(tmp_path))
  other = imdna_movies.get_config('test')
  other.movies.num_movies += 20
  written, write = [], movies.files.write_text

  def write_text(path, text):
    if len(written) == 2:
      raise KeyboardInterrupt
    written.append(path)
    write(path, text)
  monkeypatch.setattr(movies.files, 'write_text', write_text)
  with pytest.raises(KeyboardInterrupt):
    movies.prepare(other, str(tmp_path))
  monkeypatch.undo()
  manifest = movies.prepare(config, str(tmp_path))
  documents = (tmp_path / 'data' / 'movies.documents.txt').read_text().splitlines()
  assert len(documents) == config.movies.num_movies
  assert manifest == movies.prepare(config, str(tmp_path))


def test_prepare_knows_every_word_and_rebuilds_a_missing_file_or_other_users(tmp_path):
  """The vocabulary holds every word of the documents and questions, and only those; the
  candidate answers are the knowledge base's entities (relation names are none). A file
  removed since, or another number of users, makes prepare build the world again."""
  config = imdna_movies.get_config('test')
  movies.prepare(config, str(tmp_path))
  data_dir = str(tmp_path / 'data')
  where = movies.paths(data_dir)
  documents = movies.load_documents(data_dir)
  texts = documents + [q.text for task in movies.TASKS for split in movies.SPLITS
                       for q in movies.load_questions(data_dir, task, split)]
  vocab = Vocab.load(where['vocab'])
  assert set(vocab.words[len(SPECIAL_TOKENS):]) == {w for text in texts for w in text.split()}
  world = movies.generate(config.movies.num_movies, config.movies.num_users,
                          config.movies.seed)
  assert set(movies.answer_entities(documents)) == (
      {m.title for m in world.movies} | {o for _, _, o in world.triples()})
  os.remove(where['qa.valid'])
  movies.prepare(config, str(tmp_path))
  assert os.path.exists(where['qa.valid'])
  config.movies.num_users += 10
  manifest = movies.prepare(config, str(tmp_path))
  assert sum(manifest[f'recs.{s}'] for s in movies.SPLITS) == config.movies.num_users


# ---------------------------------------------------------------------------------------------
# Retrieval


def test_retrieval_cache_is_reused_and_invalidated(tmp_path):
  folder = str(tmp_path / 'index')
  documents = ['alpha beta', 'beta gamma delta', 'epsilon']
  built = bm25.open_index(folder, documents)
  assert built.built
  ids, scores = built.top_k(['gamma', 'beta', 'zeta'], k=2)
  assert ids[0, 0] == 1 and ids[0, 1] == -1  # only one document holds 'gamma'
  assert set(ids[1]) == {0, 1} and (scores[1] > 0).all()
  assert (ids[2] == -1).all()  # no shared word, no document
  reopened = bm25.open_index(folder, documents)
  assert not reopened.built
  np.testing.assert_array_equal(reopened.top_k(['gamma', 'beta', 'zeta'], k=2)[0], ids)
  assert bm25.open_index(folder, documents + ['gamma']).built  # another corpus
  assert bm25.open_index(folder, documents + ['gamma'], k1=2.0).built  # settings
  index = bm25.open_index(folder, documents)
  assert index.built  # the corpus changed back: the cache holds the last one only
  first = bm25.cached_top_k(index, 'q', ['beta'], 2)
  path = os.path.join(folder, 'q.top_k.npz')
  stamp = os.stat(path).st_mtime_ns
  np.testing.assert_array_equal(bm25.cached_top_k(index, 'q', ['beta'], 2)[0], first[0])
  assert os.stat(path).st_mtime_ns == stamp
  # Another exclusion is another key: the file is rewritten, without document 1.
  excluded = bm25.cached_top_k(index, 'q', ['beta'], 2,
                                    exclude=lambda i, found: found == 1, exclusion='not 1')
  assert list(excluded[0][0]) == [0, -1]


def test_excluded_documents_are_made_up_for_from_further_down(tmp_path):
  """`exclude` drops documents a question may not read (its own user's sessions); the
  next best documents take their places, so the question still reads k of them, however
  many were excluded above them."""
  documents = ['alpha'] * 3 + ['alpha beta', 'alpha beta gamma', 'delta']
  index = bm25.open_index(str(tmp_path / 'index'), documents)
  ids, scores = index.top_k(['alpha'], k=2, exclude=lambda i, found: found < 3)
  np.testing.assert_array_equal(ids, [[3, 4]])
  assert scores[0, 0] > scores[0, 1] > 0
  # More excluded documents above the others than the margin fetched past k.
  documents = ['alpha'] * 70 + ['alpha beta'] * 5 + ['delta']
  index = bm25.open_index(str(tmp_path / 'many'), documents)
  ids, _ = index.top_k(['alpha', 'delta'], k=3, exclude=lambda i, found: found < 70)
  np.testing.assert_array_equal(ids, [[70, 71, 72], [75, -1, -1]])


def test_retrievals_cached_before_exclusions_were_made_up_for_are_redone(tmp_path):
  """A workdir's retrievals cached by the code that fetched a fixed margin past k (short
  lists where many documents were excluded) are not read back: the key says the rule."""
  documents = ['alpha'] * 70 + ['alpha beta'] * 5 + ['delta']
  index = bm25.open_index(str(tmp_path / 'index'), documents)
  exclude = lambda i, found: found < 70
  old_key = bm25._hash(index.fingerprint, ['alpha'], 3, 'own user',  # pylint: disable=protected-access
                       'ties to the lower id')
  with open(tmp_path / 'index' / 'train.top_k.npz', 'wb') as f:
    np.savez(f, key=np.asarray(old_key), ids=np.asarray([[-1, -1, -1]]),
             scores=np.zeros((1, 3), np.float32))
  ids, _ = bm25.cached_top_k(index, 'train', ['alpha'], 3, exclude, exclusion='own user')
  np.testing.assert_array_equal(ids, [[70, 71, 72]])


def test_cached_retrieval_is_keyed_by_the_questions_and_k(tmp_path):
  """`cached_top_k` reads its file back only for the same questions and k: another question
  set or k under the same name is retrieved afresh (and replaces the file)."""
  index = bm25.open_index(str(tmp_path / 'index'), ['alpha beta', 'beta gamma delta', 'gamma'])
  ids, _ = bm25.cached_top_k(index, 'q', ['beta', 'gamma'], 2)
  np.testing.assert_array_equal(ids, [[0, 1], [2, 1]])
  np.testing.assert_array_equal(bm25.cached_top_k(index, 'q', ['beta', 'gamma'], 1)[0],
                                [[0], [2]])
  np.testing.assert_array_equal(bm25.cached_top_k(index, 'q', ['delta'], 1)[0], [[1]])


def test_ties_go_to_the_lower_id_whatever_the_cpus_sort(tmp_path):
  """numpy's partition and sort place equal values by the CPU's algorithm; the top k here
  never depends on it: of tied scores the lower ids make the list, in id order."""
  scores = np.array([1.0, 3.0, 2.0, 3.0, 2.0, 2.0, 0.5, 2.0], np.float32)
  np.testing.assert_array_equal(top_k.best_first(scores, 4), [1, 3, 2, 4])
  np.testing.assert_array_equal(top_k.best_first(scores, 20), [1, 3, 2, 4, 5, 7, 0, 6])
  assert top_k.best_first(scores, 0).shape == (0,)
  with_nan = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)
  np.testing.assert_array_equal(top_k.best_first(with_nan, 4), [3, 1, 0, 2])
  rng = np.random.default_rng(0)
  many = rng.integers(0, 5, size=(50, 300)).astype(np.float32)  # ties everywhere
  ranked = top_k.best_first_rows(many, 40)
  for row, ids in zip(many, ranked):
    expected = sorted(range(300), key=lambda j: (-row[j], j))[:40]
    assert list(ids) == expected
  # BM25: identical documents score the same; the lower ids are the ones read.
  index = bm25.open_index(str(tmp_path / 'index'), ['alpha'] * 3 + ['beta'] * 40)
  ids, scores = index.top_k(['beta'], k=4)
  assert (scores[0] == scores[0, 0]).all() and scores[0, 0] > 0
  assert list(ids[0]) == [3, 4, 5, 6]


# ---------------------------------------------------------------------------------------------
# Through the trainer


def _run(workdir, others=(), **train_settings):
  """`others`: (section, key, value) set beside the training settings."""
  config = imdna_movies.get_config('test')
  for key, value in train_settings.items():
    config.train[key] = value
  for section, key, value in others:
    config[section][key] = value
  return config, train.train_and_evaluate(config, str(workdir))


def test_training_resumes_exactly_and_evaluation_writes_results(tmp_path, monkeypatch,
                                                                capsys):
  straight = tmp_path / 'straight'
  config, summary = _run(straight, max_steps=12, checkpoint_every_steps=5)
  assert summary['step'] == 12
  stopped = tmp_path / 'stopped'
  config7, _ = _run(stopped, max_steps=7, checkpoint_every_steps=5)
  interrupted = tmp_path / 'interrupted'
  shutil.copytree(stopped, interrupted)  # resumed below with a stop request
  # The task's batch size fixes its batches: another is refused; the session corpus's is not
  # the task's, and changes nothing.
  with pytest.raises(checkpoints.CheckpointMismatch, match=re.escape(
      f'was trained with config.imdna.batch_size={config7.imdna.batch_size}, not 3: a resumed '
      'run continues its batches in their order')):
    _run(stopped, [('imdna', 'batch_size', 3)], max_steps=12, checkpoint_every_steps=5)
  _, resumed_summary = _run(stopped, [('input', 'train_queries_per_batch', 64)],
                            max_steps=12, checkpoint_every_steps=5)
  assert resumed_summary['step'] == 12
  step_a, params_a = final_params(straight)
  step_b, params_b = final_params(stopped)
  assert step_a == step_b == 12
  for a, b in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Stopped between two log lines (after step 9, by a stop request): the steps since the last
  # line go with the checkpoint, and the run that resumes logs what the run never stopped
  # did, and trains to the same parameters. The seconds spent saving and validating, and
  # compiling each run's first step, are left out of the pace.
  monitor, stops = train._TrainMonitor, train._StopRequests  # pylint: disable=protected-access
  events, stop_after = [], [8]
  add, pause, restart = monitor.add, monitor.pause, monitor.restart_pace
  monkeypatch.setattr(monitor, 'add', lambda self, step, *args: (
      events.append(step) or add(self, step, *args)))
  monkeypatch.setattr(monitor, 'pause', lambda self, seconds: (
      events.append(('saved', seconds)) or pause(self, seconds)))
  monkeypatch.setattr(monitor, 'restart_pace', lambda self: (
      events.append('validated') or restart(self)))
  monkeypatch.setattr(stops, 'requested', property(lambda self: bool(
      set(stop_after) & set(events))))
  capsys.readouterr()
  assert _run(interrupted, max_steps=12, checkpoint_every_steps=5)[1]['step'] == 9
  window = checkpoints.read_meta(checkpoints.open_manager(str(interrupted), read_only=True),
                                 9)['train_window']
  assert [m['step'] for m in window] == [7, 8]
  stop_after.clear()
  _run(interrupted, max_steps=12, checkpoint_every_steps=5)
  assert (f'Resuming from checkpoint {interrupted}/checkpoints/9 (step 9 of 12, epoch 1 of 1).'
          in capsys.readouterr().out)
  assert [e if not isinstance(e, tuple) else e[0] for e in events] == [
      7, 8, 'saved', 9, 'saved', 10, 11, 'validated']
  assert all(e[1] > 0 for e in events if isinstance(e, tuple))
  figures = lambda workdir: [{k: v for k, v in r.items() if k in (
      'kind', 'step', 'epoch', 'loss', 'nll', 'learning_rate', 'grad_norm', 'hits_at_1',
      'questions')} for r in metric_writer.read_metrics(str(workdir))]
  assert figures(interrupted) == figures(stopped)
  compiling = [r['compile_s'] for r in metric_writer.read_metrics(str(interrupted), 'train')]
  assert compiling[-2] > 0 and compiling[-1] == 0  # the run's first step compiled, no other
  for a, b in zip(jax.tree.leaves(final_params(interrupted)[1]), jax.tree.leaves(params_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Stopped during its last validation: its checkpoint says that validation is pending (a run
  # on another device count is refused, as for steps), a run stopped again in it leaves the
  # checkpoint as it is, and the same command validates then, recorded once, keeping the
  # earlier validations and the best among them, rather than calling training complete.
  meta_file = stopped / 'checkpoints' / '12' / 'meta' / 'metadata'
  meta = json.loads(meta_file.read_text())
  earlier = {**resumed_summary['valid'][0], 'loss': 1.0}  # step 7's, better than step 12's
  meta.update(valid=[earlier], best_step=7, best_valid_loss=1.0, pending_validation=12,
              device_count=jax.device_count() + 1)
  meta_file.write_text(json.dumps(meta))
  with pytest.raises(checkpoints.CheckpointMismatch,
                     match=f'trained on {jax.device_count() + 1} device'):
    _run(stopped, max_steps=12, checkpoint_every_steps=5)
  meta_file.write_text(json.dumps({**meta, 'device_count': jax.device_count()}))
  logged = [(r['kind'], r['step']) for r in metric_writer.read_metrics(str(stopped))]
  monkeypatch.setattr(stops, 'requested', property(lambda self: True))
  assert _run(stopped, max_steps=12, checkpoint_every_steps=5)[1]['valid'] == [earlier]
  assert json.loads(meta_file.read_text())['pending_validation'] == 12
  monkeypatch.undo()
  _, again = _run(stopped, max_steps=12, checkpoint_every_steps=5)
  assert [v['step'] for v in resumed_summary['valid']] == [7, 12]
  assert again['valid'] == [earlier, resumed_summary['valid'][1]]
  assert (again['step'], again['best_step'], again['best_valid_loss']) == (12, 7, 1.0)
  assert (again['stopped_by'], again['interrupted']) == (None, False)
  assert [(r['kind'], r['step']) for r in metric_writer.read_metrics(str(stopped))] == logged
  assert 'pending_validation' not in json.loads(meta_file.read_text())

  results = evaluate.evaluate(config, str(straight))
  written = json.loads((straight / 'eval' / 'results.json').read_text())
  assert written['answers'] == results['answers']
  assert set(written['answers']) == {'model', 'bm25'}
  assert written['questions'] == len(movies.load_questions(str(straight / 'data'), 'qa',
                                                           'test'))
  for entry in written['answers'].values():
    assert 0 <= entry['hits_at_1'] <= entry['hits_at_10'] <= entry['hits_at_100'] <= 100
  # A quick look at the first questions is filed apart and leaves the whole split's alone.
  whole = (straight / 'eval' / 'results.json').read_text()
  quick = config.copy_and_resolve_references()
  quick.decode.max_eval_sessions = 3
  evaluate.evaluate(quick, str(straight))
  first = json.loads((straight / 'eval' / 'first3_results.json').read_text())
  assert (first['questions'], first['split_questions']) == (3, written['questions'])
  tested = movies.load_questions(str(straight / 'data'), 'qa', 'test')
  samples = (straight / 'eval' / 'first3_samples.jsonl').read_text().splitlines()
  assert [json.loads(s)['question'] for s in samples] == [q.text for q in tested[:3]]
  assert (straight / 'eval' / 'results.json').read_text() == whole
  # decode, suggest and serve are a generator's: one error says where IMDNA serves instead.
  from mtn_jax import errors  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import pipeline  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.Error, match=re.escape(
      "holds an IMDNA model ('imdna'), which answers its own questions (--mode=eval) and "
      'suggests nothing itself')):
    pipeline.Pipeline.load(config, str(straight), log=lambda *a, **k: None)


def test_preprocess_mode_writes_the_knowledge_base(tmp_path):
  result = cli.run(tmp_path, mode='preprocess', config='configs/imdna_movies.py:test')
  assert 'Wrote a knowledge base of 60 movies' in result.stdout
  assert (tmp_path / 'data' / 'movies.documents.txt').exists()


def test_a_sessions_queries_are_separated_by_id_and_never_by_their_text():
  """A session's question or document: its queries' ids with `<sep>` between them, by id; a
  query that holds the text `<sep>` is its words (`<unk>` for that one)."""
  from mtn_jax.data import imdna_library  # pylint: disable=g-import-not-at-top
  from mtn_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  words = vocab_lib.Vocab(vocab_lib.SPECIAL_TOKENS + ('a', 'b'))
  assert imdna_library.session_ids(words, ['a', 'b <sep> a', 'c']) == [
      5, vocab_lib.SEP_ID, 6, vocab_lib.UNK_ID, 5, vocab_lib.SEP_ID, vocab_lib.UNK_ID]
  assert imdna_library.session_ids(words, []) == []
