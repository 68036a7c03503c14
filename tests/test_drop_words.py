"""launch/drop_words_folds.py: the span choice, its features and the left-out user's statistics."""

import numpy as np

from launch import drop_words_folds as drop

# (user, earlier queries, previous query, next query), words split
CONTEXTS = [
    (1, [], ['cheap', 'flights', 'to', 'rome'], ['flights', 'to', 'rome', 'italy']),
    (1, [['cheap', 'flights', 'to', 'rome']], ['flights', 'to', 'rome', 'italy'],
     ['rome', 'hotels']),
    (2, [], ['rome', 'weather'], ['rome', 'weather', 'march']),
    (3, [], ['cheap', 'cars'], ['used', 'cars']),
]


def test_best_span_keeps_the_recurring_run_when_sure_and_the_whole_query_otherwise():
  following = CONTEXTS[0][3]
  _, targets = drop.features(CONTEXTS[0], drop.WordStats(CONTEXTS), leave_user_out=False)
  targets = np.asarray(targets)
  # The n-grams of 'flights to rome' recur, 'cheap' and every n-gram holding it do not.
  np.testing.assert_array_equal(targets, [[0, 0, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0],
                                          [1, 0, 0, 0]])
  assert drop.has_ngram(following, ('flights', 'to', 'rome'))
  matches, ngrams = np.array([500.0, 200.0, 80.0, 30.0]), np.array([2000.0, 1300, 700, 350])
  # Known matches, the brevity penalty's weight of a word below the references' length:
  # dropping 'cheap' removes one unmatched n-gram of every order and costs one word.
  assert drop.best_span(targets, matches, ngrams, 4.0, 0.0) == (1, 4)  # 'flights to rome'
  # A margin larger than that gain keeps the whole query; so does a high weight on length.
  gain = sum(1 / ngrams[n] for n in range(4)) / 4 - 4 / (4 * ngrams[0])
  assert drop.best_span(targets, matches, ngrams, 4.0, 1.01 * gain) == (0, 4)
  assert drop.best_span(targets, matches, ngrams, 4.0, 0.99 * gain) == (1, 4)
  assert drop.best_span(targets, matches, ngrams, 4.0 + 4 * ngrams[0] * gain * 1.01, 0.0) == (0, 4)
  # Nothing expected to recur: the shortest span costs least, one word.
  a, b = drop.best_span(np.zeros((4, 4)), matches, ngrams, 0.0, 0.0)
  assert b - a == 1


def test_a_users_own_contexts_are_left_out_of_the_word_statistics():
  stats = drop.WordStats(CONTEXTS)
  without_user_1 = drop.WordStats([c for c in CONTEXTS if c[0] != 1])
  for word in ('cheap', 'flights', 'rome', 'cars', 'italy'):
    left_out, alone = stats.of(word, user=1), without_user_1.of(word)
    assert left_out[0] == alone[0] and left_out[2] == alone[2], word  # issued, seen
  # 'rome' was kept after user 1's two previous queries and user 2's: 3 of 3, 1 without them.
  assert (stats.kept['rome'], stats.seen['rome']) == (3, 3)
  assert stats.of('rome', user=1)[1] == (1 + 2 * stats.base_rate) / (1 + 2)
  # A word only user 1 used is unknown once user 1 is left out.
  assert stats.of('italy', user=1) == (0.0, stats.base_rate, 0.0)


def test_design_has_one_row_per_word_of_the_previous_query():
  stats = drop.WordStats(CONTEXTS)
  x, y, offsets = drop.design(CONTEXTS, stats, leave_user_out=True)
  assert offsets.tolist() == [0, 4, 8, 10, 12]
  assert x.shape[0] == y.shape[0] == 12 and y.shape[1] == drop.ORDERS
  # The second context's previous query repeats the first one's 3-gram 'flights to rome':
  # the earlier-query features of its first position say so, order by order.
  row = x[4]
  earlier = row[-2 * drop.ORDERS:].reshape(drop.ORDERS, 2)
  np.testing.assert_array_equal(earlier, [[1, 1], [1, 1], [1, 1], [0, 0]])
  assert y[4].tolist() == [0, 0, 0, 0] and y[6].tolist() == [1, 0, 0, 0]  # 'rome' recurs
