"""Do a user's own habits beat repeating the previous query, as the first suggestion?
Measured on the training split's users (all, and each of two folds) and on held-out users.

  python launch/user_habits.py --workdir=RUN [--split=valid]

RUN: any run on a corpus split by user (its data/ is read). Repeating the previous query is
the strongest top-1 BLEU suggester on the AOL sample (docs/RESULTS.md), and no candidate
judged from the session alone beats it. Many users, though, come back to the same few
queries. `mtn_jax.habits` (what `config.suggest.habit_rate` does in 'rerank') suggests a
user's habit query first where their past shows it right often enough; this prints corpus
BLEU (METRICS.md) of repeating the previous query and of that rule, the previous query
elsewhere, for every rate and minimum past of the grid, with how many contexts it changes,
how many of those it suggests the next query exactly, and for how many users. Nothing is
fitted: a user's figures come from their own past alone, as a new user's would, so the
training users are a test bed of thousands of contexts and hundreds of users, where the
validation split holds a few hundred contexts of a few users. Reported for all training
users, each of the gain model's two folds of them (`sessions.user_folds`, seed 0), and the
`--split` users.
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

from mtn_jax import habits
from mtn_jax import metrics
from mtn_jax.data import preprocess
from mtn_jax.data import sessions

FLAGS = flags.FLAGS

RATES = (0.05, 0.1, 0.15, 0.2, 0.3)
MIN_PAST = (5, 10, 20)


@dataclasses.dataclass(frozen=True)
class Context:
  """One (session so far -> next query) pair of a user, and their past before the session."""

  user: int
  session: tuple[str, ...]  # the queries so far
  reference: str
  past: habits.Habits  # the user's queries before the session

  @property
  def previous(self) -> str:
    return self.session[-1]


def split_contexts(data_dir: str, name: str) -> list[Context]:
  split = sessions.load_split(data_dir, name)
  pasts = habits.past_queries(data_dir, split)
  out = []
  for i, past in enumerate(pasts):
    texts, user = split.session_texts(i), habits.Habits(past)
    out.extend(Context(int(split.users[i]), tuple(texts[:t + 1]), texts[t + 1], user)
               for t in range(len(texts) - 1))
  return out


def suggest(contexts: list[Context], rate: float, min_past: int) -> list[str]:
  return [c.past.first(c.session, rate, min_past) or c.previous for c in contexts]


def report(name: str, contexts: list[Context]) -> None:
  references = [c.reference for c in contexts]
  repeat = metrics.bleu([c.previous for c in contexts], references)
  print(f'{name}: {len(contexts):,} contexts of {len({c.user for c in contexts})} users; '
        f'repeat the previous query: BLEU {repeat.bleu:.2f}')
  for rate in RATES:
    for min_past in MIN_PAST:
      suggested = suggest(contexts, rate, min_past)
      changed = [i for i, c in enumerate(contexts) if suggested[i] != c.previous]
      exact = sum(suggested[i] == references[i] for i in changed)
      users = len({contexts[i].user for i in changed})
      print(f'  rate >= {rate:<4g} over >= {min_past:>2} past queries: BLEU '
            f'{metrics.bleu(suggested, references).bleu:5.2f}; {len(changed):5,} changed '
            f'({exact:,} exactly the next query) for {users} users')


def main(argv):
  del argv
  data_dir = preprocess.data_dir(os.path.abspath(FLAGS.workdir))
  train = split_contexts(data_dir, 'train')
  report('training users', train)
  folds = sessions.user_folds(np.array([c.user for c in train]), 2, seed=0)
  for k in (0, 1):
    report(f'fold {k} of the training users', [c for c, f in zip(train, folds) if f == k])
  report(f'{FLAGS.split} users', split_contexts(data_dir, FLAGS.split))


if __name__ == '__main__':
  # Defined here, not at import: the tests import this module beside others with flags.
  flags.DEFINE_string('workdir', None, 'a run on a corpus split by user', required=True)
  flags.DEFINE_enum('split', 'valid', ['valid', 'test'], 'the held-out users to report')
  app.run(main)
