"""Checks that `--mode=decode` writes the lists evaluation scored, shared by the test files of
the models that read a user's history (the habit rule and IMDNA in test_polyencoder_cli, the
zero attention family in test_zam)."""

from __future__ import annotations

import json

import pytest

from tests import cli


def read_jsonl(path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same_list(shown, scored, where, **tolerance):
  """A decoded list is the one eval scored: the same queries in the same order, proposed by
  the same sources, the scores and the model's own scores where the list has them (MBR's,
  the learned ranker's) within `tolerance` (pytest.approx's `abs` or `rel`); `where` names
  the list on failure."""
  assert [s['query'] for s in shown] == [s['query'] for s in scored], where
  assert [s.get('sources') for s in shown] == [s.get('sources') for s in scored], where
  for key in ('score', 'model_score'):
    got, want = [s.get(key) for s in shown], [s.get(key) for s in scored]
    assert [g is None for g in got] == [w is None for w in want], (key, where)
    assert [g for g in got if g is not None] == pytest.approx(
        [w for w in want if w is not None], **tolerance), (key, where)


def assert_raw_log_decode_writes_what_eval_scored(workdir, lists_path, tmp_path, *overrides,
                                                  config: str = 'configs/demo.py',
                                                  protocols=(False, True)):
  """Eval's lists for users (the habit rule reads each user's past; IMDNA leaves each user's
  own sessions out of its documents; the zero attention family attends over each user's
  earlier queries) against decode of an AOL-format log that holds every session of those
  users, from every split, in the same order: the user's earlier sessions in the log are the
  past that evaluation reads from the corpus. Under `protocols` (exclude_session_queries
  values, both by default), the same lists and scores; `overrides` and `config` are the
  run's (those eval was given)."""
  from mtn_jax.data import sessions  # pylint: disable=g-import-not-at-top
  results = json.loads(lists_path.with_name(
      lists_path.name.replace('lists.jsonl', 'results.json')).read_text())
  data = str(workdir / 'data')
  split = sessions.load_split(data, results['split'])
  pairs = read_jsonl(lists_path)
  assert pairs
  users = {int(split.users[p['session']]) for p in pairs}
  by_user = {}  # user -> [(start time, split name, index, texts)]
  for name in sessions.SPLITS:
    other = split if name == split.name else sessions.load_split(data, name)
    for i in range(other.num_sessions):
      if int(other.users[i]) in users:
        by_user.setdefault(int(other.users[i]), []).append(
            (int(other.start_times[i]), name, i, other.session_texts(i)))
  number = {}  # (split name, index) -> the session's number in the log (decode's)
  for user in sorted(by_user):
    by_user[user].sort()
    for _, name, i, _ in by_user[user]:
      number[name, i] = len(number)
  log = tmp_path / f'{lists_path.stem}.log.tsv'
  cli.write_log(log, [(user, [texts for *_, texts in by_user[user]]) for user in sorted(by_user)])
  for exclude in protocols:
    key = 'suggestions_excluding_session' if exclude else 'suggestions'
    output = tmp_path / f'{lists_path.stem}.raw.{key}.jsonl'
    cli.run(workdir, *overrides, f'--config.decode.input={log}',
            f'--config.decode.output={output}',
            f'--config.decode.exclude_session_queries={exclude}', mode='decode', config=config)
    decoded = {(r['session'], r['position']): r for r in read_jsonl(output)}
    for pair in pairs:
      record = decoded[number[split.name, pair['session']], pair['position']]
      assert record['context'] == pair['context']
      assert record['user'] == int(split.users[pair['session']])
      assert_same_list(record['suggestions'], pair[key], (exclude, pair['context']), abs=1e-4)
