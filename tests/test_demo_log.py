"""The generated demo log: AOL format, determinism, the real log's quirks, learnable structure.

Sessions here come from a small 30-minute sessionizer of the test's own, so the checks hold
for the log itself and not for one preprocessing of it.
"""

import collections
import datetime
import difflib
import gzip
import itertools
import random
import re
import statistics

import pytest

from mtn_jax.data.synthetic import demo_log
from mtn_jax.evaluation import metrics

DEMO_USERS = 1500  # configs/demo.py
SESSION_GAP = datetime.timedelta(minutes=30)
TIME_PATTERN = re.compile(r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d')

Row = collections.namedtuple('Row', 'user query time rank url')


def parse(text: str) -> list[Row]:
  """Rows of a log's text, asserting the AOL format line by line."""
  lines = text.split('\n')
  assert lines[0] == 'AnonID\tQuery\tQueryTime\tItemRank\tClickURL'
  assert lines[-1] == ''  # the file ends with a newline
  rows = []
  for number, line in enumerate(lines[1:-1], start=2):
    fields = line.split('\t')
    assert len(fields) == 5, f'line {number}: {line!r}'
    user, query, time, rank, url = fields
    assert TIME_PATTERN.fullmatch(time), f'line {number}: {time!r}'
    assert query == query.strip() and query, f'line {number}: {query!r}'
    assert (rank == '') == (url == ''), f'line {number}: rank {rank!r}, url {url!r}'
    if rank:
      assert 1 <= int(rank) <= 20 and url.startswith('http://'), f'line {number}'
    rows.append(Row(int(user), query, datetime.datetime.fromisoformat(time), rank, url))
  return rows


def session_starts(rows: list[Row]) -> list[bool]:
  """Whether each row opens a session: a new user, or >= 30 minutes since the last row."""
  return [i == 0 or row.user != rows[i - 1].user or row.time - rows[i - 1].time >= SESSION_GAP
          for i, row in enumerate(rows)]


def sessionize(rows: list[Row]) -> list[tuple[int, list[str]]]:
  """(user, queries) per 30-minute session; "-" and successive repeats removed."""
  sessions = []
  for row, starts in zip(rows, session_starts(rows)):
    if starts:
      sessions.append((row.user, []))
    queries = sessions[-1][1]
    if row.query != '-' and (not queries or queries[-1] != row.query):
      queries.append(row.query)
  return sessions


def words(query: str) -> list[str]:
  return re.findall(r'[a-z0-9]+', query)


def paper_sessions(sessions):
  """The sessions the paper keeps: 3 to 5 queries of at most 10 words."""
  return [(user, q) for user, q in sessions
          if 3 <= len(q) <= 5 and all(len(words(x)) <= 10 for x in q)]


@pytest.fixture(scope='module')
def demo_written(tmp_path_factory) -> tuple[list[Row], list[list[str]]]:
  """The demo log's rows, and the queries of every session as the generator made them, in
  the order it wrote them."""
  path = tmp_path_factory.mktemp('demo') / 'demo-log.tsv.gz'
  generated, session_lines = [], demo_log._session_lines  # pylint: disable=protected-access

  def recording(draws, queries, start, sites):
    generated.append(list(queries))
    return session_lines(draws, queries, start, sites)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(demo_log, '_session_lines', recording)
    demo_log.write_demo_log(str(path), DEMO_USERS, seed=0)
  with gzip.open(path, 'rt', encoding='utf-8') as f:
    return parse(f.read()), generated


@pytest.fixture(scope='module')
def demo_rows(demo_written) -> list[Row]:
  return demo_written[0]


@pytest.fixture(scope='module')
def demo_sessions(demo_rows) -> list[tuple[int, list[str]]]:
  return sessionize(demo_rows)


@pytest.mark.parametrize('name', ['log.tsv', 'log.tsv.gz'])
def test_same_seed_gives_same_bytes(tmp_path, name):
  first, second = tmp_path / 'a' / name, tmp_path / 'b' / name
  first.parent.mkdir()
  second.parent.mkdir()
  demo_log.write_demo_log(str(first), 40, seed=7)
  demo_log.write_demo_log(second, 40, seed=7)
  assert first.read_bytes() == second.read_bytes()
  assert sorted(p.name for p in tmp_path.glob('*/*')) == [name, name]  # no partial file left


def test_gzip_holds_exactly_the_plain_text(tmp_path):
  demo_log.write_demo_log(str(tmp_path / 'log.tsv'), 40, seed=7)
  demo_log.write_demo_log(str(tmp_path / 'log.tsv.gz'), 40, seed=7)
  compressed = (tmp_path / 'log.tsv.gz').read_bytes()
  assert compressed[:2] == b'\x1f\x8b'
  # The header's flags name no file (FNAME unset) and its MTIME is zero: the bytes depend on
  # the seed alone, not on the file's name or the hour it was written.
  assert compressed[3] == 0 and compressed[4:8] == bytes(4)
  assert gzip.decompress(compressed) == (tmp_path / 'log.tsv').read_bytes()


def test_different_seed_gives_different_log(tmp_path):
  demo_log.write_demo_log(str(tmp_path / 'a.tsv'), 40, seed=0)
  demo_log.write_demo_log(str(tmp_path / 'b.tsv'), 40, seed=1)
  a = parse((tmp_path / 'a.tsv').read_text())
  b = parse((tmp_path / 'b.tsv').read_text())
  assert {r.query for r in a} != {r.query for r in b}
  assert [r.time for r in a[:50]] != [r.time for r in b[:50]]


def test_smaller_log_is_a_prefix_of_a_larger_one(tmp_path):
  demo_log.write_demo_log(str(tmp_path / 'small.tsv'), 25, seed=3)
  demo_log.write_demo_log(str(tmp_path / 'large.tsv'), 60, seed=3)
  small = (tmp_path / 'small.tsv').read_text()
  large = (tmp_path / 'large.tsv').read_text()
  assert len(large) > len(small) and large.startswith(small)


def test_bad_arguments_are_refused(tmp_path):
  with pytest.raises(ValueError, match='num_users must be at least 1, got 0'):
    demo_log.write_demo_log(str(tmp_path / 'log.tsv'), 0, seed=0)
  with pytest.raises(ValueError, match='seed must be non-negative, got -1'):
    demo_log.write_demo_log(str(tmp_path / 'log.tsv'), 5, seed=-1)
  with pytest.raises(FileNotFoundError, match='no directory .*missing'):
    demo_log.write_demo_log(str(tmp_path / 'missing' / 'log.tsv'), 5, seed=0)
  assert list(tmp_path.iterdir()) == []


def test_a_busy_users_sessions_stop_at_the_end_of_may(tmp_path):
  """Seed 8's first 160 users hold one whose sessions, at the gaps drawn, outlast the three
  months: the log still ends with May, as the AOL collection does."""
  demo_log.write_demo_log(str(tmp_path / 'log.tsv'), 160, seed=8)
  rows = parse((tmp_path / 'log.tsv').read_text())
  assert max(r.time for r in rows) < datetime.datetime(2006, 6, 1)


def test_lines_are_sorted_by_user_then_time_within_the_aol_period(demo_rows):
  assert [(r.user, r.time) for r in demo_rows] == sorted((r.user, r.time) for r in demo_rows)
  assert len({r.user for r in demo_rows}) == DEMO_USERS
  assert min(r.time for r in demo_rows) >= datetime.datetime(2006, 3, 1)
  assert max(r.time for r in demo_rows).date() <= datetime.date(2006, 6, 1)
  # March to May, like the AOL collection: each month well filled, none later.
  months = collections.Counter(r.time.month for r in demo_rows)
  assert sorted(months) == [3, 4, 5] and min(months.values()) > len(demo_rows) / 6, months


def test_the_real_logs_quirks_are_present(demo_rows):
  queries = [r for r in demo_rows if r.query != '-']
  click_repeats = sum(1 for a, b in zip(demo_rows, demo_rows[1:])
                      if a.user == b.user and a.query == b.query and b.rank and a.rank)
  over_long = sum(1 for r in queries if len(r.query.split()) > 10)
  dashes = sum(1 for r in demo_rows if r.query == '-')
  gaps = collections.Counter()
  for a, b in zip(demo_rows, demo_rows[1:]):
    if a.user == b.user:
      seconds = (b.time - a.time).total_seconds()
      gaps['exactly 30:00'] += seconds == 1800
      gaps['just under 30:00'] += 25 * 60 <= seconds < 1800
      gaps['just over 30:00'] += 1800 < seconds <= 40 * 60
  clicked = sum(1 for r in queries if r.rank)
  assert 0.1 < click_repeats / len(queries) < 0.3
  assert 0.3 < clicked / len(queries) < 0.7
  assert 10 <= over_long <= 0.01 * len(queries)
  assert 10 <= dashes <= 0.01 * len(demo_rows)
  assert min(gaps.values()) >= 20, gaps
  # ItemRank: 1 to 10 for a click on the first result page, 11 to 20 on the next one.
  assert {int(r.rank) for r in demo_rows if r.rank} == set(range(1, 21))


def test_sessions_hold_1_to_10_queries_and_the_papers_filter_keeps_8k_to_12k(demo_sessions):
  lengths = collections.Counter(len(queries) for _, queries in demo_sessions)
  assert sorted(lengths) == list(range(1, 11))
  kept = [q for _, q in paper_sessions(demo_sessions)]
  assert 8000 <= len(kept) <= 12000
  vocabulary = collections.Counter(w for q in kept for x in q for w in words(x))
  assert 300 <= sum(c >= 2 for c in vocabulary.values()) <= 1500


def test_the_30_minute_rule_recovers_every_generated_session(demo_written, demo_sessions):
  """Gaps within a session stay under 30 minutes and gaps between sessions reach it: the
  sessions split by the rule are exactly those generated, query for query."""
  assert [queries for _, queries in demo_sessions] == demo_written[1]


def test_users_have_1_to_121_sessions_with_a_median_of_13(demo_sessions):
  per_user = collections.Counter(user for user, _ in demo_sessions)
  assert min(per_user.values()) == 1 and 100 <= max(per_user.values()) <= 121
  assert 11 <= statistics.median(per_user.values()) <= 15


def test_sessions_do_not_depend_on_dropping_dashes_and_repeats_first(demo_rows):
  """A preprocessing that drops "-" lines and repeated lines before it splits sessions
  splits the remaining lines exactly where splitting all lines does."""
  session_ids = list(itertools.accumulate(session_starts(demo_rows)))
  kept = [i for i, r in enumerate(demo_rows)
          if r.query != '-' and not (i and demo_rows[i - 1][:2] == r[:2])]
  kept_starts = session_starts([demo_rows[i] for i in kept])
  assert kept_starts == [i == kept[0] or session_ids[i] != session_ids[j]
                         for i, j in zip(kept, [None] + kept[:-1])]


def test_users_have_lasting_interests(demo_sessions):
  """Two sessions of one user share a word far more often than sessions of two users."""
  by_user = collections.defaultdict(list)
  for user, queries in demo_sessions:
    by_user[user].append({w for q in queries for w in words(q)})
  rng = random.Random(0)
  assert statistics.median(len(s) for s in by_user.values()) >= 5
  users = [u for u, s in by_user.items() if len(s) >= 2]
  same, different = 0, 0
  for _ in range(5000):
    u, v = rng.sample(users, 2)
    a, b = rng.sample(by_user[u], 2)
    same += bool(a & b)
    different += bool(rng.choice(by_user[u]) & rng.choice(by_user[v]))
  assert same > 2 * different, (same, different)


def classify(previous: str, following: str) -> str:
  """The reformulation move from one query to the next."""
  a, b = previous.split(), following.split()
  if '.' in following and previous.replace(' ', '') in following:
    return 'navigate'
  if len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1:
    x, y = next((x, y) for x, y in zip(a, b) if x != y)
    if difflib.SequenceMatcher(None, x, y).ratio() >= 0.75:
      return 'correct spelling'
  if len(b) > len(a) and a in [b[:len(a)], b[len(b) - len(a):]]:
    return 'specialise'
  if len(b) < len(a) and b in [a[:len(b)], a[len(a) - len(b):]]:
    return 'generalise'
  common_prefix = len(list(itertools.takewhile(lambda p: p[0] == p[1], zip(a, b))))
  common_suffix = len(list(itertools.takewhile(lambda p: p[0] == p[1], zip(a[::-1], b[::-1]))))
  if common_prefix + common_suffix and set(a) & set(b):
    return 'substitute'
  return 'other'


def test_sessions_reformulate_with_every_move(demo_sessions):
  moves = collections.Counter(classify(a, b) for _, q in demo_sessions for a, b in zip(q, q[1:]))
  total = sum(moves.values())
  for move in ('specialise', 'substitute'):
    assert moves[move] > 0.08 * total, moves
  for move in ('generalise', 'correct spelling', 'navigate'):
    assert moves[move] > 0.01 * total, moves


def test_navigation_always_goes_to_one_address_per_site(demo_sessions):
  addresses = collections.defaultdict(set)
  for _, q in demo_sessions:
    for a, b in zip(q, q[1:]):
      if classify(a, b) == 'navigate':
        addresses[a].add(b)
  assert len(addresses) >= 80
  assert {a: b for a, b in addresses.items() if len(b) > 1} == {}
  assert addresses['bank of america'] == {'www.bankofamerica.com'}
  # A host with a name of its own is typed as it is, without "www.".
  assert addresses['fafsa'] == {'fafsa.ed.gov'}


def test_next_query_is_predictable_from_the_session(demo_sessions):
  """The most frequent next query after (first query, previous query), fitted on even users
  and backing off to the previous query alone, then to repeating it, suggests odd users'
  next queries far better than repeating the previous query: the sessions follow rules."""
  sessions = paper_sessions(demo_sessions)
  from_first_last = collections.defaultdict(collections.Counter)
  from_last = collections.defaultdict(collections.Counter)
  for user, q in sessions:
    if user % 2 == 0:
      for t in range(len(q) - 1):
        from_first_last[q[0], q[t]][q[t + 1]] += 1
        from_last[q[t]][q[t + 1]] += 1
  previous, guesses, references = [], [], []
  for user, q in sessions:
    if user % 2 == 1:
      for t in range(len(q) - 1):
        table = from_first_last.get((q[0], q[t])) or from_last.get(q[t])
        previous.append(q[t])
        guesses.append(table.most_common(1)[0][0] if table else q[t])
        references.append(q[t + 1])
  repeat = metrics.bleu(previous, references)
  lookup = metrics.bleu(guesses, references)
  exact = sum(g == r for g, r in zip(guesses, references)) / len(references)
  assert len(references) > 10000
  assert lookup.bleu > 1.4 * repeat.bleu and exact > 0.2, (lookup, repeat, exact)


def brings_back_the_first_query(sessions) -> float:
  """The share of next queries q[t+1] (t >= 1) with a word of q[0] that q[t] lacks."""
  returns = total = 0
  for _, q in sessions:
    for t in range(1, len(q) - 1):
      returns += bool(set(q[t + 1].split()) & set(q[0].split()) - set(q[t].split()))
      total += 1
  return returns / total


def test_next_query_depends_on_the_first_query_not_only_the_last(demo_sessions):
  sessions = [s for s in demo_sessions if len(s[1]) >= 3]
  # The same sessions rewritten by a first-order Markov chain with the log's own
  # transitions: words of the first query then come back only by chance.
  successors = collections.defaultdict(list)
  for _, q in sessions:
    for a, b in zip(q, q[1:]):
      successors[a].append(b)
  rng = random.Random(0)
  markov_sessions = []
  for user, q in sessions:
    chain = q[:2]
    while len(chain) < len(q):
      chain.append(rng.choice(successors[chain[-1]] or q))
    markov_sessions.append((user, chain))
  log_returns = brings_back_the_first_query(sessions)
  markov_returns = brings_back_the_first_query(markov_sessions)
  assert log_returns > 0.25 and log_returns > 1.5 * markov_returns, (log_returns, markov_returns)
