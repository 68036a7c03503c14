"""Beam search and greedy decoding on tiny random models of every registered kind.

Checked against independent references: teacher-forced log-probabilities, greedy decoding,
and exhaustive enumeration where a beam cannot miss anything. Models and shapes are shared
across tests (module-scoped fixtures) and most variations change only parameter values, so
each search compiles once per model.
"""

import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import default
from configs import families
from mtn_jax import models
from mtn_jax.data.vocab import BOS_ID
from mtn_jax.data.vocab import EOS_ID
from mtn_jax.data.vocab import PAD_ID
from mtn_jax.data.vocab import SPECIAL_TOKENS
from mtn_jax.data.vocab import UNK_ID
from mtn_jax.data.vocab import Vocab
from mtn_jax.decoding import search

MODEL_NAMES = list(families.GENERATORS)  # every model that writes its suggestions
# Odd, so the output layer's bias is the only [VOCAB_SIZE] leaf among the tiny model's params.
VOCAB_SIZE = 29
QUERY_WORDS = 5
BEAM, MAX_LEN, ALPHA = 4, 6, 0.6
# Two sessions of S = 3 queries: the second has two real queries and a padding row.
QUERIES = np.array([[[5, 6, 7, 0, 0], [8, 9, 0, 0, 0], [10, 11, 12, 13, 0]],
                    [[14, 15, 0, 0, 0], [16, 17, 18, 0, 0], [0, 0, 0, 0, 0]]], np.int32)


def tiny_model(name, vocab_size, **changes):
  c = default.get_config(name).model
  sizes = dict(share_embeddings=True, emb_dim=16, d_model=16, num_heads=2, ff_dim=32,
               query_layers=1, session_layers=1, decoder_layers=2, lstm_units=8,
               max_session_queries=4, dropout=0.0, **changes)
  c.update({k: v for k, v in sizes.items() if k in c})  # the keys of the model's family
  return models.create_model(models.make_config(c, vocab_size=vocab_size,
                                                 max_query_words=QUERY_WORDS))


def suggest(model, params, queries, *, beam_size, max_len, length_penalty, emit_unk=False,
            block_repeats=False, **kwargs):
  """`search.search_sessions` over `queries` with the search given by keywords."""
  settings = search.SearchSettings(beam_size=beam_size, max_len=max_len,
                                   length_penalty=length_penalty, emit_unk=emit_unk,
                                   top_k=beam_size, block_repeats=block_repeats)
  return search.search_sessions(model, params, {'queries': queries}, settings, **kwargs)


def random_params(model, queries, seed):
  """N(0, 0.5^2) parameters on the shapes `model.init` gives: drawn by numpy, no compilation.

  The large scale gives peaked, varied next-word distributions.
  """
  shapes = jax.eval_shape(functools.partial(model.init, train=False), jax.random.key(0),
                          {'queries': queries})['params']
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: (0.5 * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


def with_output_bias(params, vocab_size, changes):
  """A copy of `params` with `changes` {word id: amount} added to the output layer's bias."""
  changed = []

  def bump(path, x):
    if getattr(path[-1], 'key', None) != 'bias' or x.shape != (vocab_size,):
      return x
    changed.append(path)
    x = x.copy()
    for word, amount in changes.items():
      x[word] += amount
    return x

  params = jax.tree_util.tree_map_with_path(bump, params)
  assert len(changed) == 1, changed
  return params


def with_end_boost(params, vocab_size, boost):
  """A copy of `params` whose `</s>` logit is raised by `boost`."""
  return with_output_bias(params, vocab_size, {EOS_ID: boost})


def endings(sequences):
  """(ends with `</s>` bool [...], scored length int [...]) of sequences [..., MAX_LEN]."""
  return (sequences == EOS_ID).any(-1), np.asarray(search.sequence_lengths(sequences))


@pytest.fixture(scope='module', params=MODEL_NAMES)
def searched(request):
  """(model, params, memory [B*S, ...], (sequences [B, S, BEAM, MAX_LEN], scores [B, S, BEAM])).

  A tiny random model and its suggestions after every position of QUERIES, for parameters
  whose hypotheses end both with `</s>` (at several lengths) and at MAX_LEN.
  """
  model = tiny_model(request.param, VOCAB_SIZE)
  params = random_params(model, QUERIES, seed=0)
  # A random model almost never prefers `</s>`, and a raised `</s>` logit tips it from never
  # ending to ending within a step or two; the first boost on a grid that gives both kinds of
  # ending exercises every stopping rule. Only the parameters change: nothing recompiles.
  for boost in np.arange(1.0, 5.0, 0.2):
    boosted = with_end_boost(params, VOCAB_SIZE, boost)
    sequences, scores = suggest(model, boosted, QUERIES, beam_size=BEAM,
                                       max_len=MAX_LEN, length_penalty=ALPHA)
    ends, lengths = endings(np.asarray(sequences))
    if ends.any() and not ends.all() and len(set(lengths[ends])) > 1:
      memory = search.encode_sessions(model, boosted, {'queries': QUERIES})
      return model, boosted, memory, (np.asarray(sequences), np.asarray(scores))
  raise AssertionError(f'{request.param}: no </s> boost gives both kinds of ending')


def test_length_normalize_and_lengths():
  assert float(search.length_normalize(-3.0, 7, 0.6)) == pytest.approx(-3.0 / 2.0**0.6)
  assert float(search.length_normalize(-3.0, 7, 0.0)) == -3.0
  sequences = jnp.array([[5, 3, 0, 0], [5, 6, 7, 8], [3, 0, 0, 0], [5, 6, 0, 0]])
  np.testing.assert_array_equal(search.sequence_lengths(sequences), [2, 4, 1, 2])


def test_to_words_stops_at_end():
  vocab = Vocab(SPECIAL_TOKENS + ('how', 'to', 'cook'))
  assert search.to_words(vocab, np.array([5, 7, EOS_ID, 6, 0])) == ['how', 'cook']
  assert search.to_words(vocab, jnp.array([6, 5, 6])) == ['to', 'how', 'to']


def test_to_words_stops_at_padding_too():
  # A sequence given without `</s>` (a caller's, or one padded after max_len) ends at its
  # first padding id, as documented (`Vocab.decode`): a word after it is no part of the
  # query, and `<pad>` is never written as a word.
  vocab = Vocab(SPECIAL_TOKENS + ('how', 'to', 'cook'))
  assert search.to_words(vocab, np.array([5, PAD_ID, 7, EOS_ID])) == ['how']
  assert vocab.decode_text(np.array([6, 7, PAD_ID, 5])) == 'to cook'


def test_a_decoder_input_reads_as_its_query():
  # `<s>` + query reads as the query (`Vocab.decode` drops `<s>`), and an id past the
  # vocabulary as the context's word it copies.
  vocab = Vocab(SPECIAL_TOKENS + ('how', 'to', 'cook'))
  assert vocab.decode(np.array([BOS_ID, 5, 6, EOS_ID, 7])) == ['how', 'to']
  assert vocab.decode_text(np.array([BOS_ID, 7, len(vocab) + 1]), ['paris', 'rome']) == (
      'cook rome')


def test_suggest_matches_beam_search_on_the_memory(searched):
  model, params, memory, beams = searched
  sequences, scores = search.beam_search(model, params, memory, beam_size=BEAM,
                                         max_len=MAX_LEN, length_penalty=ALPHA)
  assert sequences.shape == (6, BEAM, MAX_LEN) and sequences.dtype == jnp.int32
  assert scores.shape == (6, BEAM) and scores.dtype == jnp.float32
  np.testing.assert_array_equal(beams[0].reshape(6, BEAM, MAX_LEN), sequences)
  np.testing.assert_array_equal(beams[1].reshape(6, BEAM), scores)


def test_hypotheses_are_sorted_and_distinct(searched):
  beams = searched[3]
  sequences, scores = beams[0].reshape(-1, BEAM, MAX_LEN), beams[1].reshape(-1, BEAM)
  assert np.isfinite(scores).all()
  assert (np.diff(scores, axis=1) <= 0).all()
  for row in sequences:
    assert len({tuple(s) for s in row}) == BEAM


def test_scores_are_length_normalised_teacher_forced_log_probs(searched):
  model, params, memory, beams = searched
  sequences = jnp.asarray(beams[0].reshape(-1, BEAM, MAX_LEN))
  log_probs = search.sequence_log_prob(model, params, memory, sequences)
  expected = search.length_normalize(log_probs, search.sequence_lengths(sequences), ALPHA)
  np.testing.assert_allclose(beams[1].reshape(-1, BEAM), expected, atol=1e-4, rtol=0)


def _tree_rows(sequences_by_row, packs):
  """(inputs, parents, picks, targets) lists per packed row, and each sequence's (row, start,
  end) among its row's targets: a row per memory row holding its sequences as a tree of
  their shared prefixes (one row per sequence where the model cannot pack)."""
  rows, spans = [], []
  for n, sequences in enumerate(sequences_by_row):
    for k, tokens in enumerate(sequences):
      if not packs or not k:
        rows.append((n, [], [], [], [], {}))
      _, inputs, parents, picks, targets, children = rows[-1]
      start, position = len(targets), -1
      for token, target in zip([BOS_ID, *tokens[:-1]], tokens):
        if (position, token) not in children:
          children[(position, token)] = len(inputs)
          inputs.append(token)
          parents.append(position)
        position = children[(position, token)]
        picks.append(position)
        targets.append(target)
      spans.append((n, k, len(rows) - 1, start, len(targets)))
  return rows, spans


def _packed_arrays(rows, width: int, memory):
  """`_tree_rows`' rows as the memory of each and (inputs, parents, picks, targets) int32
  [rows, width], padded as the ranker's packing pads them."""
  arrays = [np.full((len(rows), width), fill, np.int32) for fill in (0, -1, -1, 0)]
  for r, (_, *values, _) in enumerate(rows):
    for array, value in zip(arrays, values):
      array[r, :len(value)] = value
  return jax.tree.map(lambda x: x[np.array([r[0] for r in rows])], memory), arrays


def test_sequences_packed_as_a_tree_score_as_each_alone(searched):
  """Every row's hypotheses packed in one decoder row as a tree of their shared prefixes
  (`packed_token_log_probs`, as the learned ranker scores its candidates) get exactly the
  log-probabilities each gets alone (`sequence_log_prob`), padding at the row's end
  included, in fewer positions than their tokens; a recurrent model, which cannot mask
  sequences apart, takes one a row and refuses parents."""
  model, params, memory, beams = searched
  sequences = np.asarray(beams[0].reshape(-1, BEAM, MAX_LEN))
  alone = np.asarray(search.sequence_log_prob(model, params, memory, jnp.asarray(sequences)))
  lengths = np.asarray(search.sequence_lengths(sequences))
  assert len(set(lengths.ravel())) > 1
  packs = model.packs_sequences
  rows, spans = _tree_rows([[list(sequences[n, k, :lengths[n, k]]) for k in range(BEAM)]
                            for n in range(len(sequences))], packs)
  if packs:  # the beam's hypotheses share prefixes: the tree reads each once
    assert sum(len(r[1]) for r in rows) < lengths.sum()
  width = BEAM * MAX_LEN + 3 if packs else MAX_LEN
  rows_memory, arrays = _packed_arrays(rows, width, memory)
  packed = np.asarray(search.packed_token_log_probs(model, params, rows_memory, *arrays))
  assert (packed[arrays[2] == -1] == 0).all()
  for n, k, r, start, end in spans:
    np.testing.assert_allclose(packed[r, start:end].sum(), alone[n, k], atol=1e-4, rtol=1e-5)
  if not packs:
    with pytest.raises(ValueError, match='one sequence per row'):
      model.apply({'params': params}, rows_memory, arrays[0], method='decode',
                  parents=arrays[1])


def test_learned_positions_read_a_packed_row_wider_than_their_table():
  """A packed row's positions are its sequences' depths: with learned positions (a table of
  `target_len` rows) a row of many sequences, wider than the table, scores each as alone."""
  model = tiny_model('mtn', VOCAB_SIZE, learned_positions=True)
  params = random_params(model, QUERIES, seed=1)
  memory = search.encode_sessions(model, params, {'queries': QUERIES})
  candidates = [[10, 11, EOS_ID], [10, 12, 13, EOS_ID], [14, 15, 16, 17, 18, EOS_ID]]
  num_rows = len(jax.tree.leaves(memory)[0])
  sequences = np.zeros((num_rows, len(candidates), MAX_LEN), np.int32)
  for k, candidate in enumerate(candidates):
    sequences[:, k, :len(candidate)] = candidate
  alone = np.asarray(search.sequence_log_prob(model, params, memory, jnp.asarray(sequences)))
  rows, spans = _tree_rows([candidates] * num_rows, True)
  assert max(len(r[1]) for r in rows) > MAX_LEN >= model.config.target_len
  rows_memory, arrays = _packed_arrays(rows, 2 * MAX_LEN + 3, memory)
  packed = np.asarray(search.packed_token_log_probs(model, params, rows_memory, *arrays))
  for n, k, r, start, end in spans:
    np.testing.assert_allclose(packed[r, start:end].sum(), alone[n, k], atol=1e-4, rtol=1e-5)


def test_stops_at_end_token_or_max_len(searched):
  sequences = searched[3][0].reshape(-1, MAX_LEN)
  for sequence, ended, length in zip(sequences, *endings(sequences)):
    if ended:
      assert sequence[length - 1] == EOS_ID
    else:
      assert length == MAX_LEN
    assert (sequence[length:] == PAD_ID).all()
    # Words only before the end: no padding, <s>, <sep> or (by default) <unk> is emitted.
    assert not np.isin(sequence[:length], search.never_emitted(emit_unk=False)).any()
    assert (sequence[:length - 1] != EOS_ID).all()


def test_without_end_every_hypothesis_runs_to_max_len(searched):
  model, params, memory, _ = searched
  sequences, scores = search.beam_search(
      model, with_end_boost(params, VOCAB_SIZE, -50.0), memory, beam_size=BEAM,
      max_len=MAX_LEN, length_penalty=ALPHA)
  assert np.isfinite(scores).all()
  assert not (np.asarray(sequences) == EOS_ID).any()
  assert not np.isin(sequences, search.never_emitted(emit_unk=False)).any()


def test_unk_is_suggested_only_when_asked_for(searched):
  model, params, memory, _ = searched
  # <unk> made the likeliest word everywhere: by default the search routes around it, and its
  # scores stay the teacher-forced log-probabilities of what it returns.
  unk_first = with_output_bias(params, VOCAB_SIZE, {UNK_ID: 8.0})
  sequences, scores = search.beam_search(model, unk_first, memory, beam_size=BEAM,
                                         max_len=MAX_LEN, length_penalty=0.0)
  assert np.isfinite(scores).all() and not (np.asarray(sequences) == UNK_ID).any()
  np.testing.assert_allclose(
      scores, search.sequence_log_prob(model, unk_first, memory, sequences), atol=1e-4)
  greedy_sequences, _ = search.greedy(model, unk_first, memory, max_len=MAX_LEN)
  assert not (np.asarray(greedy_sequences) == UNK_ID).any()
  # Asked for, it leads every suggestion.
  greedy_sequences, _ = search.greedy(model, unk_first, memory, max_len=MAX_LEN, emit_unk=True)
  assert (np.asarray(greedy_sequences)[:, 0] == UNK_ID).all()
  sequences, _ = search.beam_search(model, unk_first, memory, beam_size=BEAM, max_len=MAX_LEN,
                                    length_penalty=0.0, emit_unk=True)
  assert (np.asarray(sequences)[:, 0, 0] == UNK_ID).all()
  # The sessions' search reads it from its settings.
  sequences, _ = suggest(model, unk_first, QUERIES, beam_size=BEAM, max_len=MAX_LEN,
                         length_penalty=0.0, emit_unk=True)
  assert (np.asarray(sequences)[..., 0, 0] == UNK_ID).all()


def test_a_certain_end_stops_every_hypothesis_at_once(searched):
  # p(</s>) ~ 1: the best suggestion is the empty one; the other three beams continue with
  # their next best words, end at the next step and fill the beam, which stops the search.
  model, params, memory, _ = searched
  sequences, scores = search.beam_search(
      model, with_end_boost(params, VOCAB_SIZE, 50.0), memory, beam_size=BEAM,
      max_len=MAX_LEN, length_penalty=ALPHA)
  ended, lengths = endings(np.asarray(sequences))
  assert ended.all()
  np.testing.assert_array_equal(lengths, np.broadcast_to([1, 2, 2, 2], lengths.shape))
  np.testing.assert_allclose(scores[:, 0], 0.0, atol=1e-5)


def test_beam_of_one_is_greedy(searched):
  model, params, memory, _ = searched
  # Several `</s>` boosts (same shapes: no recompilation), so that `</s>` is at times the
  # best next token and at times the runner-up, which a beam of one must not finish.
  ended = []
  for boost in np.linspace(-2.0, 2.0, 9):
    boosted = with_end_boost(params, VOCAB_SIZE, boost)
    greedy_sequences, greedy_scores = search.greedy(model, boosted, memory, max_len=MAX_LEN)
    sequences, scores = search.beam_search(model, boosted, memory, beam_size=1,
                                           max_len=MAX_LEN, length_penalty=0.0)
    np.testing.assert_array_equal(sequences[:, 0], greedy_sequences)
    np.testing.assert_allclose(scores[:, 0], greedy_scores, rtol=0, atol=1e-6)
    ended += endings(np.asarray(greedy_sequences))[0].tolist()
  assert any(ended) and not all(ended)  # both cases met


def test_every_position_is_searched_in_calls_that_bound_the_memory(searched):
  """A search holds its rows' memory once per beam, and a row's memory grows with the
  session's width: after every position of B sessions S queries wide, a call searches at most
  SEARCH_POSITIONS_BY_WIDTH // S positions of each session (all of them where S is short, as
  a corpus's sessions are), and the lists are those of one call over all the rows."""
  model, params, _, beams = searched
  calls = []
  beam_search = search.beam_search

  def counted(model, params, memory, **kwargs):
    calls.append(search._num_rows(memory))  # pylint: disable=protected-access
    return beam_search(model, params, memory, **kwargs)

  wide = np.concatenate([QUERIES, QUERIES], axis=1)  # sessions 6 queries wide
  run = functools.partial(suggest, model, params, beam_size=BEAM, max_len=MAX_LEN,
                          length_penalty=ALPHA)
  sessions = QUERIES.shape[0]
  assert search.SEARCH_POSITIONS_BY_WIDTH // 6 == 4
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(search, 'beam_search', counted)
    short = run(QUERIES)
    assert calls == [sessions * 3]  # 3 positions: one call
    calls.clear()
    grouped = run(wide)
    assert calls == [sessions * 4, sessions * 2]  # positions 0-3, then 4-5
    calls.clear()
    patch.setattr(search, 'SEARCH_POSITIONS_BY_WIDTH', 36)
    at_once = run(wide)
    assert calls == [sessions * 6]
    calls.clear()
    patch.setattr(search, 'SEARCH_POSITIONS_BY_WIDTH', 6)
    compiled = search._positions._cache_size()  # pylint: disable=protected-access
    one_by_one = run(wide)
    assert calls == [sessions] * 6
    # One program picks every group of a size, whichever position it starts at (compiled
    # here at most: another model of the module may have compiled it).
    assert search._positions._cache_size() <= compiled + 1  # pylint: disable=protected-access
  np.testing.assert_array_equal(short[0], beams[0])
  np.testing.assert_array_equal(short[1], beams[1])
  for split in (grouped, one_by_one):
    np.testing.assert_array_equal(split[0], at_once[0])
    # Another call's row count may round the scores otherwise (XLA on a CPU).
    np.testing.assert_allclose(split[1], at_once[1], rtol=0, atol=1e-5)
  # A session's first queries are suggested after as they are in the narrower batch.
  np.testing.assert_array_equal(grouped[0][:, :3], beams[0])


def test_last_position_equals_its_row_of_all_positions(searched):
  model, params, _, beams = searched
  # Each session of QUERIES three times, with `lengths` naming each of its real queries as
  # the last in turn: six rows, the shape the fixture's search compiled.
  sessions, lengths = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 2, 3, 1, 2, 2])
  sequences, scores = suggest(model, params, QUERIES[sessions], beam_size=BEAM,
                                     max_len=MAX_LEN, length_penalty=ALPHA, positions='last',
                                     lengths=lengths)
  assert sequences.shape == (6, 1, BEAM, MAX_LEN) and scores.shape == (6, 1, BEAM)
  np.testing.assert_array_equal(sequences[:, 0], beams[0][sessions, lengths - 1])
  np.testing.assert_allclose(scores[:, 0], beams[1][sessions, lengths - 1], atol=1e-5, rtol=0)


@pytest.fixture(scope='module')
def tiny_vocab_searches():
  """Beam searches with a vocabulary of 8, the only ones of their shapes, under a counter.

  Returns (model, memory, searches, traces): `searches` [(params, alpha, sequences [6, 20, 3],
  scores [6, 20])] for two settings, `traces[i]` the decoding steps traced by the end of
  search i (`_apply_decode` runs only while a search is traced, never when it runs).
  """
  model = tiny_model('mtn', 8)
  queries = np.where(QUERIES > 0, QUERIES % 3 + 5, 0).astype(np.int32)
  params = random_params(model, queries, seed=1)
  memory = search.encode_sessions(model, params, {'queries': queries})
  apply_decode = search._apply_decode  # pylint: disable=protected-access
  traced = []

  def counting_apply_decode(*args, **kwargs):
    traced.append(1)
    return apply_decode(*args, **kwargs)

  searches, traces = [], []
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(search, '_apply_decode', counting_apply_decode)
    # The second search changes the value of every traced argument but none of the shapes.
    for end_boost, alpha in ((0.0, ALPHA), (1.5, 0.0)):
      boosted = with_end_boost(params, 8, end_boost)
      sequences, scores = search.beam_search(model, boosted, memory, beam_size=20, max_len=3,
                                             length_penalty=alpha, emit_unk=True)
      searches.append((boosted, alpha, np.asarray(sequences), np.asarray(scores)))
      traces.append(len(traced))
  return model, memory, searches, traces


def test_beam_search_is_exact_when_nothing_is_pruned(tiny_vocab_searches):
  # Five emittable ids (<unk>, allowed here, </s>, 5, 6, 7). Up to 3 tokens there are 1 + 4 + 4 * 4 * 5 = 85
  # sequences, and at most 4 * 5 = 20 continuations per step before the last: with a beam of
  # 20 nothing is pruned, so the beam holds the exact best 20.
  model, memory, searches, _ = tiny_vocab_searches
  words = (1, 5, 6, 7)
  candidates = np.array([(EOS_ID, 0, 0)] + [(a, EOS_ID, 0) for a in words]
                        + list(itertools.product(words, words, words + (EOS_ID,))), np.int32)
  lengths = search.sequence_lengths(jnp.asarray(candidates))
  num_rows = QUERIES.shape[0] * QUERIES.shape[1]
  for params, alpha, sequences, scores in searches:
    log_probs = search.sequence_log_prob(
        model, params, memory, jnp.broadcast_to(candidates, (num_rows, *candidates.shape)))
    all_scores = np.asarray(search.length_normalize(log_probs, lengths, alpha))
    for row in range(num_rows):
      best = np.argsort(-all_scores[row])[:20]
      np.testing.assert_allclose(scores[row], all_scores[row, best], atol=1e-5, rtol=0)
      assert {tuple(s) for s in sequences[row]} == {tuple(candidates[i]) for i in best}


def test_compiles_once_per_shape(tiny_vocab_searches):
  traces = tiny_vocab_searches[3]
  assert traces[0] > 0
  assert traces[1] == traces[0]


def test_long_hypotheses_and_early_stopping_are_exact():
  # Every word but one, w, made impossible (logit -1e9; <unk> is never emitted by default):
  # the only sequences are w^k </s> (k < MAX_LEN) and w^MAX_LEN, a single chain that a beam of 4 never prunes, so the
  # search must return the exact best 4 of these 7, whether they are long (a strong length
  # penalty, a rare `</s>`) or short (a likely `</s>` fills the beam after 4 steps, and the
  # search may stop before MAX_LEN). Last, a beam of one (the shapes of
  # `test_beam_of_one_is_greedy`) under a strong length penalty, whose best is of MAX_LEN: the
  # search may stop only when no live hypothesis can reach the worst finished score at any
  # length still to come, and a bound at the current length alone (a longer hypothesis gains
  # from the penalty) stops it at a short one. The shapes are the fixture's: nothing
  # recompiles.
  model = tiny_model('mtn', VOCAB_SIZE)
  params = random_params(model, QUERIES, seed=0)
  memory = search.encode_sessions(model, params, {'queries': QUERIES})
  word = len(SPECIAL_TOKENS)
  chain = np.array([[word] * k + [EOS_ID] + [PAD_ID] * (MAX_LEN - k - 1)
                    for k in range(MAX_LEN)] + [[word] * MAX_LEN], np.int32)
  lengths = search.sequence_lengths(jnp.asarray(chain))
  best_lengths = set()
  for beam, end_boost, alpha in ((BEAM, -1.0, 3.0), (BEAM, 0.0, 1.0), (BEAM, 1.0, 0.6),
                                 (BEAM, 3.0, 0.0), (1, 3.0, 10.0)):
    changes = {other: -1e9 for other in range(word + 1, VOCAB_SIZE)}
    changes[EOS_ID] = end_boost
    masked = with_output_bias(params, VOCAB_SIZE, changes)
    log_probs = search.sequence_log_prob(model, masked, memory,
                                         jnp.broadcast_to(chain, (6, *chain.shape)))
    all_scores = np.asarray(search.length_normalize(log_probs, lengths, alpha))
    sequences, scores = search.beam_search(model, masked, memory, beam_size=beam,
                                           max_len=MAX_LEN, length_penalty=alpha)
    for row in range(6):
      best = np.argsort(-all_scores[row])[:beam]
      np.testing.assert_allclose(scores[row], all_scores[row, best], atol=1e-4, rtol=0)
      np.testing.assert_array_equal(sequences[row], chain[best])
      best_lengths.add(int(lengths[best[0]]))
  assert min(best_lengths) < 3 and max(best_lengths) == MAX_LEN


def test_bad_arguments_are_refused(searched):
  model, params, memory, _ = searched
  with pytest.raises(ValueError, match="positions must be 'all' or 'last'"):
    suggest(model, params, QUERIES, beam_size=2, max_len=3, length_penalty=0.0,
                   positions='first')
  with pytest.raises(ValueError, match='needs lengths'):
    suggest(model, params, QUERIES, beam_size=2, max_len=3, length_penalty=0.0,
                   positions='last')
  with pytest.raises(ValueError, match=r'lengths must lie in 1\.\.3'):
    suggest(model, params, QUERIES, beam_size=2, max_len=3, length_penalty=0.0,
                   positions='last', lengths=np.array([3, 4]))
  with pytest.raises(ValueError, match=r'queries must be \[batch, queries, tokens\]'):
    suggest(model, params, QUERIES[0], beam_size=2, max_len=3, length_penalty=0.0)
  with pytest.raises(ValueError, match=r'lengths must lie in 1\.\.3'):
    suggest(model, params, QUERIES, beam_size=2, max_len=3, length_penalty=0.0,
            positions='last', lengths=np.array([0, 2]))
  with pytest.raises(ValueError, match='beam_size must be at least 1'):
    search.beam_search(model, params, memory, beam_size=0, max_len=3, length_penalty=0.0)
  # Memory whose leaves disagree on the rows, or sequences for other rows than the memory's.
  rows = len(jax.tree.leaves(memory)[0])
  uneven = {'a': jnp.zeros((rows, 2)), 'b': jnp.zeros((rows - 1, 2))}
  with pytest.raises(ValueError, match='every memory leaf must lead with the number of rows'):
    search.greedy(model, params, uneven, max_len=3)
  with pytest.raises(ValueError, match=f'memory has {rows} rows but sequences {rows - 1}'):
    search.sequence_log_prob(model, params, memory,
                             jnp.zeros((rows - 1, 1, MAX_LEN), jnp.int32))


class Bigram(nn.Module):
  """A decoder whose next-word logits are the row of `params['table']` of the last word:
  probabilities set by hand. Its memory (leaves [N, ...]) is not read."""

  @nn.compact
  def decode(self, memory, tokens, decode=False):
    del memory
    table = self.param('table', nn.initializers.ones, (8, 8))
    if decode:
      self.variable('cache', 'steps', lambda: jnp.zeros((), jnp.int32))
    return jnp.log(table)[tokens]


def bigram_table(first, after):
  """The probabilities of `Bigram`'s table [8, 8] (words 5, 6, 7): `first` after `<s>`, and
  `after[w]` after word w, each {word id: probability}; uniform after any other token."""
  table = np.full((8, 8), 1 / 8, np.float32)
  for row, probabilities in [(BOS_ID, first), *after.items()]:
    table[row] = 0.0
    for word, p in probabilities.items():
      table[row, word] = p
  return {'table': jnp.asarray(table)}


def bigram_search(params, **kwargs):
  memory = {'rows': jnp.zeros((1, 1))}
  sequences, scores = search.beam_search(Bigram(), params, memory, **kwargs)
  return np.asarray(sequences)[0], np.asarray(scores)[0]


def test_a_vocabulary_too_small_for_the_beam_leaves_empty_slots():
  """One word (5) and `</s>` make three suggestions of at most two tokens: a beam of four
  returns them best first and one empty slot (score -inf, all padding), never a suggestion
  continued after its `</s>`."""
  params = bigram_table({EOS_ID: 0.6, 5: 0.4}, {5: {EOS_ID: 0.25, 5: 0.75}})
  sequences, scores = bigram_search(params, beam_size=4, max_len=2, length_penalty=0.0)
  np.testing.assert_array_equal(sequences, [[EOS_ID, 0], [5, 5], [5, EOS_ID], [0, 0]])
  np.testing.assert_allclose(scores, [*np.log([0.6, 0.3, 0.1]), -np.inf], rtol=1e-6)


def test_a_penalty_for_length_stops_the_search_only_when_no_live_hypothesis_can_win():
  """With alpha < 0 a longer suggestion is penalised, so a live hypothesis can do best by
  ending at the next step: the search goes on while that could beat the K-th finished one.
  After two steps `</s>` and `6 </s>` are finished and `5 7` is live; `5 7 </s>` then beats
  `6 </s>`, which a bound at max_len alone would have kept."""
  params = bigram_table({EOS_ID: 0.5, 5: 0.3, 6: 0.2},
                        {5: {7: 0.9, EOS_ID: 0.1}, 6: {EOS_ID: 0.9, 5: 0.1},
                         7: {EOS_ID: 0.95, 6: 0.05}})
  alpha = -1.0
  sequences, scores = bigram_search(params, beam_size=2, max_len=6, length_penalty=alpha)
  np.testing.assert_array_equal(sequences, [[EOS_ID, 0, 0, 0, 0, 0], [5, 7, EOS_ID, 0, 0, 0]])
  expected = search.length_normalize(np.log([0.5, 0.3 * 0.9 * 0.95]), np.array([1, 3]), alpha)
  np.testing.assert_allclose(scores, expected, rtol=1e-6)


def _repeats_a_word(sequence) -> bool:
  words = [int(t) for t in sequence if t not in (EOS_ID, PAD_ID)]
  return len(set(words)) < len(words)


def test_blocking_repeats_never_repeats_a_word_and_keeps_exact_scores(searched):
  model, params, memory, (sequences, _) = searched
  # The check has teeth: the same search without blocking repeats words.
  assert any(_repeats_a_word(s) for s in sequences.reshape(-1, MAX_LEN))
  blocked, scores = search.beam_search(model, params, memory, beam_size=BEAM,
                                       max_len=MAX_LEN, length_penalty=ALPHA,
                                       block_repeats=True)
  blocked, scores = np.asarray(blocked), np.asarray(scores)
  filled = np.isfinite(scores)
  assert filled.all()
  assert not any(_repeats_a_word(s) for s in blocked.reshape(-1, MAX_LEN))
  # Scores remain the model's own length-normalised log-probabilities of the tokens.
  log_probs = search.sequence_log_prob(model, params, memory, jnp.asarray(blocked))
  np.testing.assert_allclose(
      scores, search.length_normalize(log_probs, search.sequence_lengths(blocked), ALPHA),
      atol=1e-5, rtol=0)
  # The sessions' search reads it from its settings.
  from_settings, _ = suggest(model, params, QUERIES, beam_size=BEAM, max_len=MAX_LEN,
                             length_penalty=ALPHA, block_repeats=True)
  np.testing.assert_array_equal(np.asarray(from_settings).reshape(blocked.shape), blocked)


def test_encoded_reuses_the_last_encoding_only_for_the_same_inputs():
  """The beam and the scoring of a request's candidates share one encoding: `encoded` returns
  its last memory for equal host inputs (a copy of the arrays too), and encodes anew when the
  params, a token or the rows differ."""
  model = tiny_model('mtn', VOCAB_SIZE)
  params = random_params(model, QUERIES, seed=0)
  rows = np.array([2, 4], np.int32)
  first = search.encoded(model, params, {'queries': QUERIES}, rows)
  assert search.encoded(model, params, {'queries': QUERIES.copy()}, rows.copy()) is first
  for got, want in zip(jax.tree.leaves(first), jax.tree.leaves(
      search.encode_sessions(model, params, {'queries': QUERIES}, rows))):
    np.testing.assert_array_equal(got, want)
  other_params = jax.tree.map(lambda x: x * 1.5, params)
  changed_token = QUERIES.copy()
  changed_token[0, 0, 0] = 9
  for args in ((other_params, QUERIES, rows), (params, changed_token, rows),
               (params, QUERIES, np.array([2, 3], np.int32)), (params, QUERIES, None)):
    again = search.encoded(model, args[0], {'queries': args[1]}, args[2])
    assert again is not first
    for got, want in zip(jax.tree.leaves(again), jax.tree.leaves(
        search.encode_sessions(model, args[0], {'queries': args[1]}, args[2]))):
      np.testing.assert_array_equal(got, want)


def test_decode_says_where_a_model_that_reads_users_is_given_none():
  """A sessions file names no users: a personalising model, or the habit rule, reads no
  earlier queries there, and decode says so; a raw log gives them, and a model that reads
  none needs none."""
  import types  # pylint: disable=g-import-not-at-top
  from mtn_jax.inference import suggest  # pylint: disable=g-import-not-at-top
  pipe = lambda past_read: types.SimpleNamespace(past_read=past_read)
  for reads in (pipe(20), pipe(1000)):
    assert 'a sessions file names no users' in suggest.history_note('sessions', reads)
    assert suggest.history_note('raw', reads) is None
  assert suggest.history_note('sessions', pipe(0)) is None
