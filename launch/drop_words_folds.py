"""Can the previous query with some words dropped beat repeating it, as the first suggestion?
Measured on the training split's folds of users (thousands of contexts each) and on the
validation split.

  python launch/drop_words_folds.py --workdir=RUN [--seed=0]

RUN: any run on a corpus split by user (its data/ is read). Repeating the previous query is
the strongest top-1 BLEU suggester on the AOL sample (docs/RESULTS.md): a reformulation keeps
most of the previous query's words. Its n-grams that the next query drops cost precision, so
dropping the words least likely to recur should raise BLEU if they can be told in advance.
This measures whether they can: a network (`bleu_gain.fit_net`, Poisson loss) predicts for
each n-gram of the previous query whether the next query holds it, from what is known before
the next query (the word's position; how often other users' next queries kept the word after
issuing it; how common it is; whether the session's earlier queries hold the n-gram; how much
the last two queries share). Each context's suggestion is then the contiguous run of the
previous query's words (a sub-span adds no n-gram the query lacks) with the largest expected
gain in corpus log BLEU, to first order as in `mtn_jax.bleu_gain`:

  gain(span) = sum over its n-grams g of (P(g recurs) / M_n - 1 / T_n) / 4 + w * len / (4 T_1),

M_n, T_n the matches and n-grams of repeating the previous query on the fitted fold, w the
brevity penalty's weight on length; the whole query keeps a margin. Fitted on one fold of the
training users, suggesting for the other and for the validation split, at every length weight
and margin of `bleu_gain`. The word statistics of a training context leave its own user out,
as a new user's are unknown. Prints corpus BLEU (METRICS.md) of repeating the previous query
and of the spans chosen, and how often the choice is the whole previous query. The oracle line
chooses with the true matches instead: the room there is.
"""

from __future__ import annotations

import collections
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

from mtn_jax import parallel

FLAGS = flags.FLAGS

ORDERS = 4  # n-gram orders, as BLEU's


def contexts_of(split, session_ids, max_words):
  """[(user, earlier queries' words [t][*], previous query's words, next query's words)]; the
  next query cut to `max_words` as the evaluation's references are."""
  out = []
  for s in session_ids:
    texts = [q.split() for q in split.session_texts(int(s))]
    for t in range(1, len(texts)):
      out.append((int(split.users[s]), texts[:t - 1], texts[t - 1], texts[t][:max_words]))
  return out


def has_ngram(words, gram):
  n = len(gram)
  return any(tuple(words[j:j + n]) == gram for j in range(len(words) - n + 1))


class WordStats:
  """How often each word was issued, and kept by the next query after a previous query held
  it, with each user's own share kept apart so that a context's user can be left out."""

  def __init__(self, contexts):
    self.issued, self.kept, self.seen = (collections.Counter() for _ in range(3))
    self.by_user = collections.defaultdict(lambda: [collections.Counter() for _ in range(3)])
    for user, earlier, previous, following in contexts:
      own = self.by_user[user]
      # Each query of a session once: the next query of its context, the first one as the
      # previous query of the session's first context.
      issued = set(following) | (set(previous) if not earlier else set())
      for w in issued:
        self.issued[w] += 1
        own[0][w] += 1
      for w in set(previous):
        kept = w in following
        self.seen[w] += 1
        self.kept[w] += kept
        own[1][w] += 1
        own[2][w] += kept
    self.base_rate = sum(self.kept.values()) / max(1, sum(self.seen.values()))

  def of(self, word, user=None):
    """(log issued, smoothed share kept, log times seen in a previous query), `user` left out."""
    own = self.by_user[user] if user in self.by_user else None
    issued = self.issued[word] - (own[0][word] if own else 0)
    seen = self.seen[word] - (own[1][word] if own else 0)
    kept = self.kept[word] - (own[2][word] if own else 0)
    return math.log1p(issued), (kept + 2 * self.base_rate) / (seen + 2), math.log1p(seen)


def features(context, stats, leave_user_out):
  """float [len(previous), F] one row per start position of the previous query's n-grams, and
  float [len(previous), ORDERS] whether the next query holds the n-gram of each order that
  starts there (0 where the query is too short for it)."""
  user, earlier, previous, following = context
  before = earlier[-1] if earlier else []
  union = set(previous) | set(before)
  shared = len(set(previous) & set(before)) / len(union) if before else -1.0
  rows, targets = [], []
  for i in range(len(previous)):
    row = [len(previous), i, len(previous) - i, len(earlier) + 1, shared]
    for k in range(ORDERS):
      if i + k < len(previous):
        word = previous[i + k]
        row += [1.0, *stats.of(word, user if leave_user_out else None),
                float(any(c.isdigit() for c in word)), float('.' in word), len(word)]
      else:
        row += [0.0] * 7
    target = []
    for n in range(1, ORDERS + 1):
      gram = tuple(previous[i:i + n])
      exists = i + n <= len(previous)
      row += [float(exists and has_ngram(before, gram)),
              float(exists and any(has_ngram(q, gram) for q in earlier))]
      target.append(float(exists and has_ngram(following, gram)))
    rows.append(row)
    targets.append(target)
  return rows, targets


def design(contexts, stats, leave_user_out):
  """x [positions, F], y [positions, ORDERS] and each context's first row [contexts + 1]."""
  import numpy as np
  xs, ys, offsets = [], [], [0]
  for context in contexts:
    rows, targets = features(context, stats, leave_user_out)
    xs += rows
    ys += targets
    offsets.append(len(xs))
  return np.asarray(xs, np.float32), np.asarray(ys, np.float32), np.asarray(offsets)


def best_span(expected, matches_total, ngrams_total, length_weight, margin):
  """The (start, end) of the contiguous run of words with the largest expected gain.

  `expected` [words, ORDERS]: the expected match of the n-gram of each order starting at each
  word (ignored where the query is too short for it); the whole query wins ties and has
  `margin` added."""
  words = len(expected)

  def gain(a, b):
    value = length_weight * (b - a) / (4 * ngrams_total[0])
    for n in range(1, ORDERS + 1):
      for i in range(a, b - n + 1):
        value += (expected[i, n - 1] / matches_total[n - 1] - 1 / ngrams_total[n - 1]) / 4
    return value

  best, best_gain = (0, words), gain(0, words) + margin
  for a in range(words):
    for b in range(a + 1, words + 1):
      if (a, b) != (0, words) and gain(a, b) > best_gain:
        best, best_gain = (a, b), gain(a, b)
  return best


def repeat_totals(contexts):
  """The clipped matches and n-grams, per order, of repeating the previous query."""
  from mtn_jax import bleu_gain  # pylint: disable=g-import-not-at-top
  import numpy as np
  texts = [' '.join(c[2]) for c in contexts]
  matches = sum(bleu_gain.match_matrix([t, ' '.join(c[3])])[:, 0, 1].astype(np.float64)
                for t, c in zip(texts, contexts))
  return matches, bleu_gain.ngram_totals(texts).sum(0)


def bleu_of(contexts, spans):
  from mtn_jax import metrics  # pylint: disable=g-import-not-at-top
  return metrics.bleu([' '.join(c[2][a:b]) for c, (a, b) in zip(contexts, spans)],
                      [' '.join(c[3]) for c in contexts]).bleu


def main(argv):
  del argv
  parallel.set_cpu_devices(0)
  import numpy as np
  from mtn_jax import bleu_gain
  from mtn_jax.data import preprocess, sessions

  data_dir = preprocess.data_dir(os.path.abspath(FLAGS.workdir))
  train = sessions.load_split(data_dir, 'train')
  valid = sessions.load_split(data_dir, 'valid')
  max_words = train.max_query_words
  fold_of_session = sessions.session_folds(train, 2, FLAGS.seed)
  folds = [contexts_of(train, np.flatnonzero(fold_of_session == k), max_words) for k in (0, 1)]
  held_out = {'fold 0': folds[0], 'fold 1': folds[1],
              'validation': contexts_of(valid, range(len(valid.lengths)), max_words)}
  for a, fitted in enumerate(folds):
    stats = WordStats(fitted)
    x, y, _ = design(fitted, stats, leave_user_out=True)
    net = bleu_gain.fit_net(x, y, FLAGS.seed)
    matches_total, ngrams_total = repeat_totals(fitted)
    for name, contexts in held_out.items():
      if name == f'fold {a}':
        continue
      x, y, offsets = design(contexts, stats, leave_user_out=False)
      expected = bleu_gain.predict(net, x)
      whole = [(0, len(c[2])) for c in contexts]
      predicted = y[:, 0].sum(), expected[:, 0].sum()
      print(f'fitted on fold {a} ({len(fitted):,} contexts), suggesting for {name} '
            f'({len(contexts):,} contexts): repeating the previous query BLEU '
            f'{bleu_of(contexts, whole):.2f}; unigrams kept {predicted[0]:,.0f}, predicted '
            f'{predicted[1]:,.0f}')
      oracle = [best_span(y[offsets[k]:offsets[k + 1]], matches_total, ngrams_total, 4.0, 0.0)
                for k in range(len(contexts))]
      print(f'  oracle (true matches, length weight 4): BLEU {bleu_of(contexts, oracle):.2f}')
      print('  length weight / margin: BLEU (whole previous query)')
      for w in bleu_gain.LENGTH_WEIGHTS:
        cells = []
        for margin in bleu_gain.PREVIOUS_MARGINS:
          spans = [best_span(expected[offsets[k]:offsets[k + 1]], matches_total, ngrams_total,
                             w, margin) for k in range(len(contexts))]
          kept = np.mean([s == full for s, full in zip(spans, whole)])
          cells.append(f'{margin:g}: {bleu_of(contexts, spans):.2f} ({100 * kept:.0f} %)')
        print(f'  {w:g}  ' + '  '.join(cells), flush=True)


if __name__ == '__main__':
  # Defined here, not at import: the tests import this module beside other scripts that
  # define a --seed of their own.
  flags.DEFINE_string('workdir', None, 'A run on a corpus split by user (its data/ is read).')
  flags.DEFINE_integer('seed', 0, 'Seeds the folds of users (0: those of the cross-fitted '
                       'generators of configs/aol.py, data.split_seed 0) and the fits.')
  flags.mark_flags_as_required(['workdir'])
  app.run(main)
