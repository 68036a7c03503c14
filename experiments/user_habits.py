"""Do a user's own habits beat repeating the previous query, as the first suggestion?
Measured on the training split's users (all, and each of two folds) and on held-out users.

  python experiments/user_habits.py --workdir=RUN [--split=valid]

RUN: any run on a corpus split by user (its data/ is read). Repeating the previous query is
the strongest top-1 BLEU suggester on the AOL sample (docs/RESULTS.md), and no candidate
judged from the session alone beats it. Many users, though, come back to the same few
queries. `mtn_jax.inference.habits` (what `config.suggest.habit_rate` does in 'rerank') suggests a
user's habit query first where their past shows it right often enough; this prints corpus
BLEU (mtn_jax/evaluation/metrics.py) of repeating the previous query and of that rule, the previous query
elsewhere, for every rate and minimum past of the grid, with how many contexts it changes,
how many of those it suggests the next query exactly, and for how many users. Nothing is
fitted: a user's figures come from their own past alone, as a new user's would, so the
training users are a test bed of thousands of contexts and hundreds of users, where the
validation split holds a few hundred contexts of a few users. Reported for all training
users, each of two folds of them (`sessions.user_folds`, seed 0), and the
`--split` users; then, for the setting best on all training users, how often it is above
repeating the previous query on random sets of as many training users as the `--split`
holds (`DRAWS` sets): how much a split of that size can say.
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags

import numpy as np
from sacrebleu.metrics import BLEU

from mtn_jax.data import preprocess
from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.inference import habits

FLAGS = flags.FLAGS

RATES = (0.05, 0.1, 0.15, 0.2, 0.3)
MIN_PAST = (5, 10, 20)
DRAWS = 1000


@dataclasses.dataclass(frozen=True)
class Context:
  """One (session so far -> next query) pair of a user, with their habit figures before it."""

  user: int
  session: tuple[str, ...]  # the queries so far
  reference: str
  habit: str | None  # the user's habit query outside the session so far
  rate: float  # the user's habit rate
  past: int  # over so many past queries

  @property
  def previous(self) -> str:
    return self.session[-1]


def split_contexts(data_dir: str, name: str) -> list[Context]:
  split = sessions.load_split(data_dir, name)
  out = []
  for i, user in enumerate(habits.carried(habits.past_queries(data_dir, split))):
    texts = split.session_texts(i)
    out.extend(Context(int(split.users[i]), tuple(texts[:t + 1]), texts[t + 1],
                       user.habit_query(set(texts[:t + 1])), user.rate, user.past)
               for t in range(len(texts) - 1))
  return out


def suggest(contexts: list[Context], rate: float, min_past: int) -> list[str]:
  """Each context's habit query where `habits.habitual`, its previous query elsewhere."""
  return [c.habit if c.habit is not None and habits.habitual(c.rate, c.past, rate, min_past)
          else c.previous for c in contexts]


def report(name: str, contexts: list[Context]) -> dict[tuple[float, int], float]:
  """Prints the grid; returns {(rate, min_past): BLEU}."""
  references = [c.reference for c in contexts]
  grid = {}
  repeat = metrics.bleu([c.previous for c in contexts], references)
  print(f'{name}: {len(contexts):,} contexts of {len({c.user for c in contexts})} users; '
        f'repeat the previous query: BLEU {repeat.bleu:.2f}')
  for rate in RATES:
    for min_past in MIN_PAST:
      suggested = suggest(contexts, rate, min_past)
      changed = [i for i, c in enumerate(contexts) if suggested[i] != c.previous]
      exact = sum(suggested[i] == references[i] for i in changed)
      users = len({contexts[i].user for i in changed})
      grid[rate, min_past] = metrics.bleu(suggested, references).bleu
      print(f'  rate >= {rate:<4g} over >= {min_past:>2} past queries: BLEU '
            f'{grid[rate, min_past]:5.2f}; {len(changed):5,} changed '
            f'({exact:,} exactly the next query) for {users} users')
  return grid


def match_matrix(texts: list[str]) -> np.ndarray:
  """float32 [MAX_NGRAM_ORDER, T, T] the clipped n-gram matches (mtn_jax/evaluation/metrics.py's
  definition) of every pair of `texts`, n = 1..MAX_NGRAM_ORDER (symmetric: a match is the
  smaller count of a shared n-gram)."""
  words = [t.split() for t in texts]
  out = np.zeros((metrics.MAX_NGRAM_ORDER, len(texts), len(texts)), np.float32)
  for n in range(1, metrics.MAX_NGRAM_ORDER + 1):
    index: dict[tuple[str, ...], int] = {}
    rows, cols = [], []
    for i, w in enumerate(words):
      for j in range(len(w) - n + 1):
        rows.append(i)
        cols.append(index.setdefault(tuple(w[j:j + n]), len(index)))
    if index:
      counts = np.zeros((len(texts), len(index)), np.float32)
      np.add.at(counts, (rows, cols), 1.0)
      out[n - 1] = np.minimum(counts[:, None], counts[None]).sum(-1)
  return out


def ngram_totals(texts: list[str]) -> np.ndarray:
  """float64 [len(texts), MAX_NGRAM_ORDER] the n-grams each text holds."""
  lengths = np.array([len(t.split()) for t in texts], np.float64)
  return np.maximum(lengths[:, None] - np.arange(metrics.MAX_NGRAM_ORDER), 0)


def bleu_of_counts(matches: np.ndarray, ngrams: np.ndarray, reference_length: float) -> float:
  """`metrics.bleu` of a corpus from its summed clipped matches and n-grams [MAX_NGRAM_ORDER]
  and its references' length, by the same engine (sacrebleu, the same settings)."""
  return float(BLEU.compute_bleu(
      correct=[int(m) for m in matches], total=[int(t) for t in ngrams], sys_len=int(ngrams[0]),
      ref_len=int(reference_length), smooth_method='none',
      max_ngram_order=metrics.MAX_NGRAM_ORDER).score)


def pair_counts(suggestions: list[str], references: list[str]) -> np.ndarray:
  """int64 [pairs, 2 * MAX_ORDER + 1]: each pair's clipped n-gram matches, n-grams
  (mtn_jax/evaluation/metrics.py) and reference length, which sum to a corpus's."""
  matches = np.array([match_matrix([s, r])[:, 0, 1]
                      for s, r in zip(suggestions, references)])
  lengths = np.array([[len(r.split())] for r in references])
  return np.concatenate([matches, ngram_totals(suggestions), lengths], 1).astype(
      np.int64)


def corpus_bleu(counts: np.ndarray) -> float:
  """The BLEU of `metrics` of pairs' `pair_counts`."""
  n, total = metrics.MAX_NGRAM_ORDER, counts.sum(0)
  return bleu_of_counts(total[:n], total[n:2 * n], total[-1])


def share_above(contexts: list[Context], suggested: list[str], users_per_draw: int,
                seed: int = 0) -> float:
  """The share of `DRAWS` random sets of `users_per_draw` users whose contexts score a
  higher BLEU with `suggested` than with the previous query."""
  references = [c.reference for c in contexts]
  rule = pair_counts(suggested, references)
  repeat = pair_counts([c.previous for c in contexts], references)
  users = np.array([c.user for c in contexts])
  unique = np.unique(users)
  rng = np.random.default_rng(seed)
  wins = 0
  for _ in range(DRAWS):
    rows = np.isin(users, rng.choice(unique, users_per_draw, replace=False))
    wins += corpus_bleu(rule[rows]) > corpus_bleu(repeat[rows])
  return wins / DRAWS


def main(argv):
  del argv
  workdir = os.path.abspath(FLAGS.workdir)
  if not os.path.isdir(workdir):
    sys.exit(f'--workdir={FLAGS.workdir}: no such folder')
  built = preprocess.corpus_settings(workdir)
  if built is not None and built.get('split_by') != 'user':
    # Its held-out users would be training users too: the figures would not be of new users.
    sys.exit(f'--workdir={FLAGS.workdir}: its corpus is split by {built.get("split_by")!r}; '
             'the study needs one split by user (config.data.split_by=user)')
  data_dir = preprocess.data_dir(workdir)
  train = split_contexts(data_dir, 'train')
  grid = report('training users', train)
  folds = sessions.user_folds(np.array([c.user for c in train]), 2, seed=0)
  for k in (0, 1):
    report(f'fold {k} of the training users', [c for c, f in zip(train, folds) if f == k])
  held_out = split_contexts(data_dir, FLAGS.split)
  report(f'{FLAGS.split} users', held_out)
  rate, min_past = max(grid, key=grid.get)
  size = len({c.user for c in held_out})
  share = share_above(train, suggest(train, rate, min_past), size)
  print(f'rate >= {rate:g} over >= {min_past} past queries (the best on all training users) is '
        f'above repeating the previous query for {100 * share:.1f} % of {DRAWS} random sets of '
        f'{size} training users (as many as the {FLAGS.split} split holds)')


if __name__ == '__main__':
  # Defined here, not at import: the tests import this module beside others with flags.
  flags.DEFINE_string('workdir', None, 'a run on a corpus split by user', required=True)
  flags.DEFINE_enum('split', 'valid', ['valid', 'test'], 'the held-out users to report')
  app.run(main)
