"""`--mode=preprocess`: raw query logs -> the session corpus in `<workdir>/data`.

In: `config.data` (every key is described in configs/default.py) and the log files it names
(`raw_files`), or, with `source='demo'`, the demo log written to `<workdir>/data/` first.
Reading, cleaning and sessions follow the paper's Sec. 5.1; `mtn_jax.data.aol_log` documents
every rule and the reason each skipped line is counted under.

Splits: `split_by='session'` (the paper's) partitions the kept sessions at random
(`split_sessions`); `split_by='user'` puts all of a user's sessions in one split
(`split_users`), to score suggestions for users never seen in training; `split_by='time'`
gives valid and test each user's latest sessions (`split_by_time`), so that everything a
user did before a valid or test session can serve as its history. In every case the seed
is `split_seed` and the sizes follow `split_fractions` counted in sessions. A split that comes
out empty although training or evaluation needs it (train always; valid and test whenever
their fraction is above 0, as training selects its model on valid and evaluation reads test)
fails here, with `SplitTooSmallError`, rather than in training later.

Out, in `data_dir(workdir)`: for each split what `mtn_jax.data.sessions.save_split` writes
(vocabulary ids int32 `[num_queries, max_query_words]`, 0-padded; row offsets int64
`[num_sessions + 1]`; the cleaned texts, one per query row, not mapped through the
vocabulary; each session's user and start time, int64 `[num_sessions]`; its user's
`history_queries` most recent earlier queries, from the kept sessions of every split in
user-then-time order, so never a later one), `vocab.json`
(training words seen at least `min_word_count` times), `stats.json`:

    {"lines_read": n, "latin1_lines": n, "skipped": {reason: count, ...},
     "train": {"sessions": n, "pairs": n}, "valid": {...}, "test": {...},
     "tokenizer": "word" or "sentencepiece", "vocab_size": n, "candidates": n,
     ["cut_queries": n (sentencepiece), "train_users": {...} (config.data.train_users),
      "time_split_short": {split: [sessions, asked]} (split_by='time', a share not met)]}

(pairs = sum over sessions of (queries - 1); `lines_read` = queries of kept sessions + all
skipped lines, checked at every build (the skip reasons: `aol_log.REASONS`, and
`user_left_out` for the training users `train_users` leaves out); `latin1_lines` counts the lines read as Latin-1, which are
among those, not a skip reason) and `manifest.json`, the fingerprint of the inputs
(resolved paths, sizes, modification times) and of `config.data` without `strict`, with the
size of every file written. A later `prepare` with the same fingerprint reuses the corpus
where every file has its size (a damaged one is built again; with `strict`, one whose log
had malformed lines is refused as a fresh build would be); any change rebuilds it, except
where the workdir holds checkpoints: then other settings are refused by name, and other
inputs may only make the same files again (the same log moved). The corpus is built in a
temporary folder that then replaces `data/` by a rename, so an interrupted run never leaves
a half corpus behind, and under the workdir's lock (`files.workdir_alone`): a second run
preprocessing or training there is refused.

Cost: the log is read by one process per file and CPU core; the rest is numpy or C-level
string work over the kept queries, and memory grows with the log's lines
(docs/PERFORMANCE.md has the measurements).
"""

from __future__ import annotations

import collections
import filecmp
import glob
import hashlib
import json
import os
import shutil
import tempfile

import ml_collections
import numpy as np

from mtn_jax import errors
from mtn_jax import files
from mtn_jax.data import aol_log
from mtn_jax.data import candidate_pool
from mtn_jax.data import sessions as sessions_lib
from mtn_jax.data.vocab import SentencePieceVocab

# Part of the fingerprint: bump it when the files written here change meaning.
from mtn_jax.data.vocab import train_sentencepiece
from mtn_jax.data.vocab import Vocab
# 2: queries lower-cased, Latin-1 lines kept, sessions' users and times; 3: Latin-1 read per
# field, the dotted capital I lower-cased to 'i'; 4: each split's {split}.history.npy; 5: the
# candidate pool (`mtn_jax.data.candidate_pool`) and each split's {split}.history_items.npy.
CORPUS_FORMAT = 5
DEMO_LOG = 'demo-log.tsv.gz'
_DEMO_LOG_INFO = 'demo-log.json'
_STATS, _MANIFEST, _VOCAB = 'stats.json', 'manifest.json', 'vocab.json'
_BUILD_PREFIX, _OLD_PREFIX = '.data-build-', '.data-old-'
# Python lists of words live only this many queries at a time.
_BATCH_QUERIES = 1 << 20
# The skip reason of the queries of training users left out by `config.data.train_users`.
USER_LEFT_OUT = 'user_left_out'


class EmptyCorpusError(errors.Error, ValueError):
  """The rules kept no session at all."""


def data_dir(workdir: str) -> str:
  return os.path.join(workdir, 'data')


def prepare(config: ml_collections.ConfigDict, workdir: str, verbose: bool = False) -> dict:
  """Builds the corpus in `data_dir(workdir)`, or reuses it; returns the stats dict.

  Reads `config.data` only. With `verbose`, prints `summary(stats)`.

  Raises (all `mtn_jax.errors.Error`s, with a one-line message):
    aol_log.MissingLogError (a FileNotFoundError): a log file is missing, or a glob matches
      nothing.
    aol_log.LogListError (a ValueError): `raw_files` names a file twice.
    aol_log.LogFormatError (a ValueError): a file is not a query log, or (with `strict`) a
      line is malformed; the message names the file (and line) and the reason.
    EmptyCorpusError (a ValueError): the rules kept no session.
  """
  cfg = config.data
  if cfg.source == 'movies':  # a generated knowledge base, not a log
    from mtn_jax.data.synthetic import movies  # pylint: disable=g-import-not-at-top
    return movies.prepare(config, workdir, verbose)
  target = data_dir(workdir)
  paths = _input_paths(cfg, target)
  manifest = _manifest(cfg, paths, target)
  built = _read_json(os.path.join(target, _MANIFEST))
  same_recipe = built is not None and built.get('fingerprint') == manifest['fingerprint']
  stats = _intact_stats(target, built) if same_recipe else None
  if stats is not None and cfg.strict and any(stats['skipped'].get(reason, 1)
                                              for reason in aol_log.MALFORMED):
    # Built without `strict` (or before a reason was counted: its lines were kept): building
    # again names the first malformed line.
    stats = None
  if stats is not None:
    # A corpus built before its stats named these: the tokenizer is the fingerprint's, and the
    # left-out users' queries are what the counts lack.
    stats.setdefault('tokenizer', cfg.tokenizer)
    if 'train_users' in stats and USER_LEFT_OUT not in stats['skipped']:
      stats['skipped'][USER_LEFT_OUT] = (stats['lines_read'] - kept_queries(stats)
                                         - sum(stats['skipped'].values()))
    if verbose:
      print(f'Reusing the corpus in {target}: same inputs and config.data.')
  else:
    # A corpus that checkpoints were trained on is replaced only by the same files (the same
    # log moved or copied; a damaged file made again; a missing corpus made anew): whatever
    # changed, the log or the code that builds it, the checkpoints keep their corpus.
    trained_on = _checkpoints_folder(workdir)
    if trained_on and built is not None and not same_recipe:
      _check_settings_unchanged(target, built, manifest, trained_on)
    stats = _build(cfg, paths, manifest, workdir, trained_on, (built or {}).get('sizes'))
  if verbose:
    print(summary(stats, target))
  return stats


def settings_differences(data: ml_collections.ConfigDict, workdir: str) -> list[str]:
  """The `config.data` settings (`data`) other than those `workdir`'s corpus was built with,
  as 'config.data.KEY: X there, Y here' (none where there is no corpus; the log files and a
  setting the corpus's manifest does not name are not compared)."""
  built = _read_json(os.path.join(data_dir(workdir), _MANIFEST))
  if built is None:
    return []
  return _differences(built.get('data_config') or {}, _data_config(data))


def corpus_settings(workdir: str) -> dict | None:
  """The `config.data` settings the corpus of `workdir` was built with (its record), None
  where it has none."""
  record = _read_json(os.path.join(data_dir(workdir), _MANIFEST))
  return None if record is None else record.get('data_config') or {}


def corpus_differences(workdir: str, other: str) -> list[str]:
  """The `config.data` settings the corpus of `workdir` was built with other than those of
  `other`'s corpus, as 'config.data.KEY: X there, Y here' (`workdir`'s value there; none where
  either has no corpus record)."""
  there, here = corpus_settings(workdir), corpus_settings(other)
  if there is None or here is None:
    return []
  return _differences(there, here)


def _differences(before: dict, asked: dict) -> list[str]:
  """'config.data.KEY: X there, Y here' for the settings both name that differ (not the log
  files: changed inputs are compared by what they make)."""
  asked = json.loads(json.dumps(asked))  # as a manifest holds it: lists
  return [f'config.data.{k}: {before[k]!r} there, {asked[k]!r} here'
          for k in sorted(set(before) & set(asked)) if k != 'raw_files' and before[k] != asked[k]]


class CorpusInUseError(errors.Error, ValueError):
  """A corpus that the workdir's checkpoints were trained on, asked for with other settings."""


def _checkpoints_folder(workdir: str) -> str | None:
  """The workdir's checkpoints folder where it holds a checkpoint, else None."""
  folder = os.path.join(os.path.abspath(workdir), 'checkpoints')
  if os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder)):
    return folder
  return None


def _check_settings_unchanged(target: str, built: dict, manifest: dict, folder: str) -> None:
  """Refuses to rebuild, with other `config.data` settings, a corpus that the checkpoints in
  `folder` were trained on: they would be left with another vocabulary and splits (train
  would then refuse them, and eval and decode with the old settings too). A setting the
  corpus's manifest does not name (one added since it was built) is not compared; changed
  inputs are compared by what they make (`_build`)."""
  changed = _differences(built.get('data_config') or {}, manifest['data_config'])
  if changed:
    detail = ', '.join(changed)
    raise CorpusInUseError(f'{target} was built with other settings, and the checkpoints in '
                           f'{folder} were trained on it ({detail}): use the settings it was '
                           'built with, or a new workdir')


def _data_config(cfg: ml_collections.ConfigDict) -> dict:
  """The settings a corpus records: `config.data` but `strict` (it changes no corpus it
  builds) and `train_users` at 0 (every user: left out so that corpora built before it
  existed stay current)."""
  return {k: v for k, v in cfg.to_dict().items()
          if k != 'strict' and not (k == 'train_users' and not v)}


def _read_json(path: str) -> dict | None:
  """The JSON object in `path`, or None where it is missing or damaged."""
  try:
    with open(path, encoding='utf-8') as f:
      value = json.load(f)
  except (OSError, ValueError):
    return None
  return value if isinstance(value, dict) else None


def _whole(folder: str, name: str, sizes: dict | None) -> bool:
  """Whether the corpus file `name` is in `folder` as it was written: of the size `sizes`
  (the manifest's record) gives it; a corpus older than that record: there at all."""
  path = os.path.join(folder, name)
  return os.path.exists(path) and (sizes is None or os.path.getsize(path) == sizes.get(name))


def _intact_stats(target: str, built: dict) -> dict | None:
  """The corpus's stats where every file of it is as it was written (the sizes the manifest
  recorded; a corpus older than that record: each file there), else None."""
  if not all(_whole(target, name, built.get('sizes')) for name in _written_files()):
    return None
  stats = _read_json(os.path.join(target, _STATS))
  needed = {'lines_read', 'skipped', 'vocab_size', *sessions_lib.SPLITS}
  return stats if stats is not None and needed <= set(stats) else None


def split_sessions(num_sessions: int, fractions, seed: int) -> list[np.ndarray]:
  """Session ids of (train, valid, test): a seeded random partition, each part sorted.

  Part sizes are the rounded cumulative fractions, so they always add up to `num_sessions`.
  """
  permutation = np.random.default_rng(seed).permutation(num_sessions)
  bounds = np.round(np.cumsum(fractions) * num_sessions).astype(np.int64)
  bounds = np.concatenate([[0], np.minimum(bounds[:-1], num_sessions), [num_sessions]])
  return [np.sort(permutation[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def split_users(session_users: np.ndarray, fractions, seed: int) -> list[np.ndarray]:
  """Session ids of (train, valid, test) with all of a user's sessions in one part.

  Users are laid out in a seeded random order, their sessions end to end, and each user goes
  to the part whose share of the sessions holds the middle of its own. The parts' sizes so
  follow `fractions` counted in sessions, not in users: sessions are what the models learn
  from and are scored on, and AOL users differ a lot in how many they have (a split by users
  would give the valid or test split a few heavy users' worth more or less). Each boundary
  is off by at most half of one user's sessions.

  Args:
    session_users: int [num_sessions], each session's user.
  Returns:
    int64 [sessions of the part] session ids, sorted, for each of the three parts.
  """
  users, session_user_index = np.unique(session_users, return_inverse=True)
  per_user = np.bincount(session_user_index, minlength=len(users))
  order = np.random.default_rng(seed).permutation(len(users))
  # The user's place in the order: the sessions of all users before it, then its own half.
  before = np.cumsum(per_user[order]) - per_user[order]
  bounds = np.cumsum(fractions)[:-1] * len(session_users)
  part_of_user = np.empty(len(users), np.int64)
  part_of_user[order] = np.searchsorted(bounds, before + per_user[order] / 2, side='right')
  part = part_of_user[session_user_index]
  return [np.flatnonzero(part == k) for k in range(len(fractions))]


def keep_train_users(train_sessions: np.ndarray, session_users: np.ndarray, keep: int,
                     seed: int) -> tuple[np.ndarray, dict]:
  """The training sessions of `keep` of the training users (a seeded random choice; every
  user when there are fewer), for a learning curve: the validation and test users stay as
  they are. Returns (their session ids in order, {'kept', 'left_out' users,
  'left_out_sessions'})."""
  users = np.unique(session_users[train_sessions])
  chosen = np.random.default_rng([seed, 1]).permutation(users)[:keep]
  kept = train_sessions[np.isin(session_users[train_sessions], chosen)]
  return kept, {'kept': int(len(chosen)), 'left_out': int(len(users) - len(chosen)),
                'left_out_sessions': int(len(train_sessions) - len(kept))}


def split_by_time(session_users: np.ndarray, session_times: np.ndarray, fractions,
                  seed: int) -> list[np.ndarray]:
  """Session ids of (train, valid, test) such that every valid or test session is later
  than all of its user's training sessions: a user's history is always the past.

  Users are taken in a seeded random order; each gives its latest session to test, while the
  test split's share of the sessions is not filled, then (in a second pass over the same
  order) its latest remaining session to valid; all else is training. Sizes follow
  `fractions` counted in sessions, one session a user at most in each of valid and test (so
  a log of fewer users than a share asks gives that split fewer: `prepare` says so); a user
  with one session gives it to one split at most. Each user's order is its own: another
  user's training session may be later than a test session (no global time cut).

  Args:
    session_users: int [num_sessions], each session's user.
    session_times: int [num_sessions], each session's start time.
  Returns:
    int64 [sessions of the part] session ids, sorted, for each of the three parts.
  """
  num_sessions = len(session_users)
  # Sessions by user, then time: a user's sessions are a run, latest last.
  by_user_time = np.lexsort((session_times, session_users))
  users, first = np.unique(session_users[by_user_time], return_index=True)
  ends = np.append(first[1:], num_sessions)  # one past each user's latest session
  order = np.random.default_rng(seed).permutation(len(users))
  part = np.zeros(num_sessions, np.int64)
  taken = np.zeros(len(users), np.int64)  # sessions each user gave away, latest first
  for split in (2, 1):  # test first: the latest sessions
    want = int(round(fractions[split] * num_sessions))
    given = 0
    for user in order:
      if given >= want:
        break
      if ends[user] - first[user] - taken[user] < 1:
        continue
      taken[user] += 1
      part[by_user_time[ends[user] - taken[user]]] = split
      given += 1
  return [np.flatnonzero(part == k) for k in range(len(fractions))]


def kept_queries(stats: dict) -> int:
  """The queries of the corpus's sessions, every split's (a session of n queries: n - 1 pairs)."""
  return sum(stats[split]['sessions'] + stats[split]['pairs'] for split in sessions_lib.SPLITS)


# A log of which at least this share of the lines is malformed is said to be read wrong.
MOSTLY_MALFORMED = 0.1


def malformed_lines(skipped: dict, lines_read: int, at_least: float = 0.0) -> str:
  """'14,597 of the 14,645 lines read (99.7 %) are malformed (bad_user_id 14,597)', or ''
  where none is, or fewer than the share `at_least` of the lines."""
  malformed = {r: skipped.get(r, 0) for r in aol_log.MALFORMED if skipped.get(r, 0)}
  total = sum(malformed.values())
  if not malformed or total < at_least * lines_read:
    return ''
  return (f'{total:,} of the {lines_read:,} lines read ({100 * total / lines_read:.1f} %) are '
          'malformed (' + ', '.join(f'{r} {c:,}' for r, c in malformed.items()) + ')')


def summary(stats: dict, where: str) -> str:
  """Table 1 of the paper for this corpus, then the counts behind it; a warning where many of
  the log's lines are malformed (a log of another format read in part, whose skipped lines
  would otherwise pass as a smaller corpus)."""
  lines = [f'Corpus in {where}', f'{"":<8}{"sessions":>12}{"pairs":>14}']
  for split in sessions_lib.SPLITS:
    lines.append(f'{split:<8}{stats[split]["sessions"]:>12,}{stats[split]["pairs"]:>14,}')
  if 'train_users' in stats:
    t = stats['train_users']
    lines.append(f'training users: {t["kept"]:,} kept of {t["kept"] + t["left_out"]:,} '
                 f'(config.data.train_users); {t["left_out_sessions"]:,} sessions of the '
                 'others left out')
  # What sets its size: the word vocabulary reads no config.data.vocab_size.
  pieces = stats.get('tokenizer') == 'sentencepiece'
  lines.append(f'vocabulary: {stats["vocab_size"]:,} '
               + ('pieces (config.data.vocab_size at most: fewer where the training text '
                  'holds fewer)' if pieces else
                  'words (those of the training split seen config.data.min_word_count times '
                  'or more)')
               + ', special tokens included')
  for split, (got, asked) in stats.get('time_split_short', {}).items():
    lines.append(f'{split}: {got:,} sessions of the {asked:,} config.data.split_fractions '
                 "asks (split_by='time' takes one session a user at most)")
  if stats.get('cut_queries'):
    lines.append(f'queries cut to config.data.max_query_tokens pieces: '
                 f'{stats["cut_queries"]:,}')
  if 'candidates' in stats:
    lines.append(f'candidate pool: {stats["candidates"]:,} distinct training queries')
  lines.append(f'lines read: {stats["lines_read"]:,} ({stats.get("latin1_lines", 0):,} of them '
               f'read as Latin-1): {kept_queries(stats):,} queries kept, '
               f'{sum(stats["skipped"].values()):,} skipped by reason:')
  lines += [f'  {reason:<20}{count:>12,}' for reason, count in stats['skipped'].items()]
  if malformed := malformed_lines(stats['skipped'], stats['lines_read'], MOSTLY_MALFORMED):
    lines.append(f'Warning: {malformed}: is the log in the AOL format (AnonID<TAB>Query<TAB>'
                 'QueryTime[<TAB>ItemRank<TAB>ClickURL], AnonID digits, QueryTime YYYY-MM-DD '
                 'HH:MM:SS)? config.data.strict names the first such line.')
  return '\n'.join(lines)


def _input_paths(cfg: ml_collections.ConfigDict, target: str) -> list[str]:
  if cfg.source == 'demo':
    return [_demo_log(target, cfg.demo_users, cfg.demo_seed)]
  if cfg.source != 'aol':
    raise ValueError(f"config.data.source must be 'aol', 'demo' or 'movies', got {cfg.source!r}")
  if not cfg.raw_files.strip():
    raise aol_log.MissingLogError('config.data.raw_files is empty: pass the AOL-format log '
                                  'files (a glob, or comma-separated paths and globs)')
  return aol_log.expand_paths(cfg.raw_files)


def _demo_log(target: str, num_users: int, seed: int) -> str:
  """Path of the demo log in `target`, written unless it exists for these users and seed."""
  from mtn_jax.data.synthetic import demo_log  # pylint: disable=g-import-not-at-top

  path = os.path.join(target, DEMO_LOG)
  info_path = os.path.join(target, _DEMO_LOG_INFO)
  info = {'demo_users': num_users, 'demo_seed': seed}
  if os.path.exists(path) and os.path.exists(info_path):
    with open(info_path, encoding='utf-8') as f:
      if json.load(f) == info:
        return path
  os.makedirs(target, exist_ok=True)
  # The generator writes whole files (`files.atomic_open`).
  demo_log.write_demo_log(path, num_users, seed)
  files.write_text(info_path, json.dumps(info))
  return path


def _manifest(cfg: ml_collections.ConfigDict, paths: list[str], target: str) -> dict:
  """What the corpus in `target` is built from: the inputs (path, size, time) and
  config.data. An input inside `target` (the demo log) is named relative to it, so that a
  workdir moved whole, or copied keeping its files' times (`cp -a`), still reads its corpus
  as current."""
  inputs = []
  inside = os.path.realpath(target) + os.sep
  for path in paths:
    st = os.stat(path)
    real = os.path.realpath(path)
    name = ('<data>/' + real[len(inside):]) if real.startswith(inside) else real
    inputs.append({'path': name, 'size': st.st_size, 'mtime_ns': st.st_mtime_ns})
  manifest = {'format': CORPUS_FORMAT, 'inputs': inputs, 'data_config': _data_config(cfg)}
  manifest['fingerprint'] = hashlib.sha256(
      json.dumps(manifest, sort_keys=True).encode()).hexdigest()
  return manifest


def _written_files() -> list[str]:
  """The corpus's files but its manifest (which records their sizes)."""
  files = [_STATS, _VOCAB, *candidate_pool.POOL_FILES]
  for split in sessions_lib.SPLITS:
    files += [os.path.basename(p) for p in sessions_lib.split_paths('', split).values()]
  return files


def session_difference(data_dir_a: str, data_dir_b: str) -> str | None:
  """None when the corpora of two data folders hold the same sessions in the same splits
  (each split's query texts, session bounds and users, byte for byte: the vocabulary and
  tokenizer aside), else the first file that differs."""
  for split in sessions_lib.SPLITS:
    for kind in ('text', 'sessions', 'users'):
      a, b = (sessions_lib.split_paths(d, split)[kind] for d in (data_dir_a, data_dir_b))
      if not filecmp.cmp(a, b, shallow=False):
        return f'their {os.path.basename(a)} differ'
  return None


def _build(cfg: ml_collections.ConfigDict, paths: list[str], manifest: dict, workdir: str,
           trained_on: str | None = None, written_sizes: dict | None = None) -> dict:
  """Writes the corpus into a fresh folder, then swaps it in for `data_dir(workdir)`, alone
  in the workdir (`files.workdir_alone`). A workdir this made is removed again when the build
  fails (a log that holds no records leaves nothing behind). With `trained_on` (the folder of
  checkpoints trained on the corpus there), the new corpus replaces it only if every file of
  it that is there whole (its size the one `written_sizes` recorded) is the same."""
  made_workdir = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  with files.workdir_alone(workdir, 'preprocessing'):
    _remove_stale_builds(workdir)
    build = tempfile.mkdtemp(prefix=_BUILD_PREFIX, dir=workdir)
    os.chmod(build, 0o755)  # mkdtemp makes it private; the corpus is not
    try:
      stats = _write_corpus(cfg, paths, build)
      manifest = {**manifest, 'sizes': {n: os.path.getsize(os.path.join(build, n))
                                        for n in _written_files()}}
      if trained_on:
        _check_same_corpus(build, data_dir(workdir), trained_on, written_sizes)
      _write_json(os.path.join(build, _MANIFEST), manifest)
      _replace_dir(build, data_dir(workdir))
    except BaseException as e:
      shutil.rmtree(build, ignore_errors=True)
      if made_workdir and set(os.listdir(workdir)) <= {files.WORKDIR_LOCK}:
        shutil.rmtree(workdir, ignore_errors=True)
      if isinstance(e, OSError) and not e.filename and e.strerror:
        # A write that failed for want of room names no file: the corpus being built is it.
        raise CorpusWriteError(f'{data_dir(workdir)}: writing the corpus failed '
                               f'({e.strerror}); nothing was changed') from None
      raise
  return stats


def _check_same_corpus(build: str, target: str, folder: str, written_sizes: dict | None
                       ) -> None:
  """Refuses to replace the corpus in `target`, which the checkpoints in `folder` were
  trained on, by the one in `build` unless each file that `target` holds whole (`_whole`; a
  damaged or missing one is made again) but the stats (skipped lines may differ) is byte for
  byte the same."""
  for name in _written_files():
    if name == _STATS or not _whole(target, name, written_sizes):
      continue
    old = os.path.join(target, name)
    if not filecmp.cmp(os.path.join(build, name), old, shallow=False):
      raise CorpusInUseError(
          f'{target}: the corpus built now would differ from the one the checkpoints in '
          f'{folder} were trained on (its {name}): its log, or the code that builds it, '
          'changed; give the log it was built from, or use a new workdir')


class CorpusWriteError(errors.Error, OSError):
  """The corpus could not be written (a full disk); the message names its folder."""


def _write_corpus(cfg: ml_collections.ConfigDict, paths: list[str], folder: str) -> dict:
  """Reads the logs and writes the splits, vocab.json and stats.json into `folder`."""
  log = aol_log.read_logs(paths, strict=cfg.strict, scratch_dir=folder)
  sessions = aol_log.sessionize(
      log.records, gap_minutes=cfg.session_gap_minutes, max_query_words=cfg.max_query_words,
      long_query=cfg.long_query, min_queries=cfg.min_session_queries,
      max_queries=cfg.max_session_queries)
  skipped = {**log.skipped, **sessions.skipped}
  stats = {'lines_read': log.lines_read,
           'skipped': {reason: skipped[reason] for reason in aol_log.REASONS}}
  if not sessions.num_sessions:
    raise EmptyCorpusError(
        f'no session kept from {log.lines_read:,} lines of {len(paths)} file(s) '
        f'({paths[0]}{", ..." if len(paths) > 1 else ""}); skipped: '
        + ', '.join(f'{r} {c:,}' for r, c in stats['skipped'].items() if c))
  malformed = malformed_lines(stats['skipped'], log.lines_read)

  stats['latin1_lines'] = log.latin1_lines
  session_lengths = np.diff(sessions.starts)
  first_records = sessions.record_index[sessions.starts[:-1]]
  session_users = log.records.user[first_records]
  session_times = log.records.time[first_records]
  fractions = tuple(cfg.split_fractions)
  if cfg.split_by == 'user':
    parts = split_users(session_users, fractions, cfg.split_seed)
    if cfg.train_users:
      kept_train, stats['train_users'] = keep_train_users(parts[0], session_users,
                                                          cfg.train_users, cfg.split_seed)
      # The queries of the users left out, so that lines read = kept queries + skipped.
      stats['skipped'][USER_LEFT_OUT] = int(
          session_lengths[np.setdiff1d(parts[0], kept_train)].sum())
      parts[0] = kept_train
  elif cfg.split_by == 'time':
    parts = split_by_time(session_users, session_times, fractions, cfg.split_seed)
    # A user gives valid and test a session each at most: with fewer users than a share
    # asks, that split is smaller than the fractions say, and the summary says so.
    asked = [int(round(f * len(session_users))) for f in fractions]
    short = {split: [int(len(parts[k])), asked[k]] for k, split in ((1, 'valid'), (2, 'test'))
             if len(parts[k]) < asked[k]}
    if short:
      stats['time_split_short'] = short
  else:
    parts = split_sessions(sessions.num_sessions, fractions, cfg.split_seed)
  _check_splits_needed(parts, fractions, session_users, cfg.split_by, malformed)
  split_texts, split_starts, split_words = {}, {}, {}
  split_users_, split_times, split_rows, split_history = {}, {}, {}, {}
  history_rows = _history_rows(sessions.starts, session_users, cfg.history_queries)
  for split, session_ids in zip(sessions_lib.SPLITS, parts):
    lengths = session_lengths[session_ids]
    split_rows[split] = _ranges(sessions.starts[session_ids], lengths)
    split_history[split] = history_rows[session_ids]
    split_users_[split] = session_users[session_ids]
    split_times[split] = session_times[session_ids]
    record_index = sessions.record_index[split_rows[split]]
    split_words[split] = log.records.num_words[record_index]
    split_texts[split] = _cut(log.records.texts(record_index), split_words[split],
                              cfg.max_query_words)
    split_words[split] = np.minimum(split_words[split], cfg.max_query_words)
    split_starts[split] = np.concatenate([[0], np.cumsum(lengths)])
  # Every kept query's row, the sessions of training users left out (`train_users`) too:
  # they only hold the place of rows no kept user's history reads.
  num_rows = len(sessions.record_index)
  del log, sessions  # the largest arrays: free them before the encoding

  if cfg.tokenizer == 'sentencepiece':
    # Trained on the training split only, like the word vocabulary.
    vocab = train_sentencepiece(split_texts['train'], cfg.vocab_size)
    stats['cut_queries'] = 0
  else:
    counts = collections.Counter()
    for batch in _batches(split_texts['train']):
      counts.update(' '.join(batch).split(' '))
    vocab = Vocab.from_counts(counts, cfg.min_word_count)
  encoded = {}
  for split in sessions_lib.SPLITS:
    if cfg.tokenizer == 'sentencepiece':
      encoded[split], cut = _encode_pieces(split_texts[split], vocab, token_slots(cfg))
      stats['cut_queries'] += cut
    else:
      encoded[split] = _encode(split_texts[split], split_words[split], vocab,
                               cfg.max_query_words)
  # Every kept query's ids in the global (user, time) order, for the histories.
  all_queries = np.zeros((num_rows, token_slots(cfg)), np.int32)
  for split in sessions_lib.SPLITS:
    all_queries[split_rows[split]] = encoded[split]
  pool, train_pool_ids = candidate_pool.build_pool(split_texts['train'], encoded['train'])
  candidate_pool.save_pool(folder, pool)
  # Every kept query's pool index (-1: not a training query), for the histories' items.
  all_pool_ids = np.full(len(all_queries), -1, np.int32)
  for split in sessions_lib.SPLITS:
    all_pool_ids[split_rows[split]] = (train_pool_ids if split == 'train'
                                       else pool.ids_of(split_texts[split]))
  for split in sessions_lib.SPLITS:
    queries = encoded[split]
    history = (np.where(split_history[split][..., None] >= 0,
                        all_queries[np.maximum(split_history[split], 0)], 0)
               if cfg.history_queries else None)
    sessions_lib.save_split(folder, split, queries, split_starts[split], split_texts[split],
                            split_users_[split], split_times[split], history)
    if cfg.history_queries:
      rows = split_history[split]
      np.save(candidate_pool.history_items_path(folder, split),
              np.where(rows >= 0, all_pool_ids[np.maximum(rows, 0)], -1).astype(np.int32),
              allow_pickle=False)
    num_sessions = len(split_starts[split]) - 1
    stats[split] = {'sessions': num_sessions,
                    'pairs': int(split_starts[split][-1]) - num_sessions}
  # Every line counted once: a query of a split's session, or under a skip reason.
  if stats['lines_read'] != kept_queries(stats) + sum(stats['skipped'].values()):
    raise AssertionError(f'{stats["lines_read"]} lines read but {kept_queries(stats)} queries '
                         f'in the splits and {sum(stats["skipped"].values())} skipped')
  stats['tokenizer'] = cfg.tokenizer
  stats['vocab_size'] = len(vocab)
  stats['candidates'] = len(pool)
  vocab.save(os.path.join(folder, _VOCAB))
  _write_json(os.path.join(folder, _STATS), stats)
  return stats


def _history_rows(starts: np.ndarray, session_users: np.ndarray, size: int) -> np.ndarray:
  """int64 [num_sessions, size]: for each kept session, the global query rows of its user's
  `size` most recent queries before it, oldest first, -1 in front where there are fewer.

  Sessions come in user, then time order, session after session, so a session's history is
  the rows just before its own first row that still belong to its user: every one of them
  is a query of an earlier session, none of a later one, whatever split either is in.

  Args:
    starts: int [num_sessions + 1] each kept session's first global query row.
    session_users: int [num_sessions].
    size: M, queries per history (0: none).
  """
  num_sessions = len(session_users)
  first = starts[:-1]
  new_user = np.ones(num_sessions, bool)
  new_user[1:] = session_users[1:] != session_users[:-1]
  # The first row of the user's first session, carried forward over the user's sessions.
  user_first_row = np.maximum.accumulate(np.where(new_user, first, 0))
  rows = first[:, None] - size + np.arange(size)  # [num_sessions, size], most recent last
  return np.where(rows >= user_first_row[:, None], rows, -1)


class SplitTooSmallError(errors.Error, ValueError):
  """A split that training or evaluation needs came out empty."""


def _check_splits_needed(parts: list[np.ndarray], fractions: tuple, session_users: np.ndarray,
                         split_by: str, malformed: str = '') -> None:
  """Refuses, at preprocessing, a corpus too small to give a split the share it was asked
  for: training or evaluation would fail later, further from the cause.

  The train split is always needed (nothing to learn, no vocabulary); valid and test are
  needed when their fraction is above 0. A fraction of 0 asks for an empty split, which a
  corpus for preprocessing alone, or for training with a valid split only, may want.

  Args:
    parts: the session ids of (train, valid, test), int [sessions of the part] each.
    session_users: int [num_sessions], each session's user.
    malformed: `malformed_lines` of the log, where some are: said first, as the likelier cause.
  """
  total = sum(len(p) for p in parts)
  for index, (name, part) in enumerate(zip(sessions_lib.SPLITS, parts)):
    if len(part) == 0 and (fractions[index] > 0 or name == 'train'):
      kept = f'{total:,} session{"s" * (total != 1)}'
      unit = 'sessions'
      if split_by == 'user':
        num_users = len(np.unique(session_users))
        kept += f' of {num_users:,} user{"s" * (num_users != 1)}'
        unit = 'users'
      cause = (f'{malformed}: is the log in the AOL format? Else, ' if malformed else '')
      raise SplitTooSmallError(
          f'the {name} split is empty: {kept} {"were" if total != 1 else "was"} kept and '
          f'config.data.split_fractions={tuple(fractions)} gives it none of the {unit}; '
          f'{cause}use more data or a larger config.data.split_fractions[{index}]')


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
  """int64 [sum(lengths)]: starts[0], starts[0] + 1, ..., then starts[1], ... (runs)."""
  out_starts = np.cumsum(lengths) - lengths
  return np.arange(int(lengths.sum())) + np.repeat(starts - out_starts, lengths)


def _cut(texts: list[str], num_words: np.ndarray, max_words: int) -> list[str]:
  """Texts of more than `max_words` words (kept by long_query='truncate') cut to that many."""
  for i in np.flatnonzero(num_words > max_words):
    texts[i] = ' '.join(texts[i].split(' ')[:max_words])
  return texts


def _batches(texts: list[str]):
  for begin in range(0, len(texts), _BATCH_QUERIES):
    yield texts[begin:begin + _BATCH_QUERIES]


def _encode(texts: list[str], num_words: np.ndarray, vocab: Vocab,
            max_words: int) -> np.ndarray:
  """int32 [len(texts), max_words]: vocabulary ids of each text's words, 0-padded."""
  ids = np.zeros((len(texts), max_words), np.int32)
  begin = 0
  for batch in _batches(texts):
    lengths = num_words[begin:begin + len(batch)]
    rows = np.repeat(np.arange(begin, begin + len(batch)), lengths)
    columns = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ids[rows, columns] = vocab.encode(' '.join(batch).split(' '))
    begin += len(batch)
  return ids


def built_data_config(workdir: str) -> dict:
  """The `config.data` settings `workdir`'s corpus was built with ({} where there is none)."""
  built = _read_json(os.path.join(data_dir(workdir), _MANIFEST)) or {}
  return built.get('data_config') or {}


def subword_search_problem(decode: ml_collections.ConfigDict, max_query_tokens: int
                           ) -> str | None:
  """Why a search of `decode`'s settings would write broken queries of sentencepiece pieces
  (queries of at most `max_query_tokens` pieces), or None."""
  # The search counts pieces: a shorter one than a query's pieces cuts words (and multi-byte
  # characters) mid-way; and a repeated piece is no repeated word ("mike s forum s").
  if decode.max_len < max_query_tokens + 1:
    return (f'config.decode.max_len ({decode.max_len}) counts subword pieces with '
            "config.data.tokenizer='sentencepiece': at least config.data.max_query_tokens + 1 "
            f'({max_query_tokens + 1}), or suggestions are cut mid-word')
  if decode.block_repeats:
    return ("config.decode.block_repeats blocks repeated tokens, which with "
            "config.data.tokenizer='sentencepiece' are pieces, not words (\"mikes forums\" "
            'repeats one): set it False')
  return None


def token_slots(cfg: ml_collections.ConfigDict) -> int:
  """Token slots per query (n, the models' query width): the words' maximum for words, else
  `config.data.max_query_tokens`."""
  return cfg.max_query_tokens if cfg.tokenizer == 'sentencepiece' else cfg.max_query_words


def _encode_pieces(texts: list[str], vocab: SentencePieceVocab,
                   slots: int) -> tuple[np.ndarray, int]:
  """(int32 [len(texts), slots] piece ids, 0-padded; how many texts were cut to `slots`
  pieces)."""
  ids = np.zeros((len(texts), slots), np.int32)
  cut = 0
  for begin in range(0, len(texts), _BATCH_QUERIES):
    for row, pieces in enumerate(vocab.processor.encode(texts[begin:begin + _BATCH_QUERIES]),
                                 begin):
      cut += len(pieces) > slots
      ids[row, :min(len(pieces), slots)] = pieces[:slots]
  return ids, cut


def _write_json(path: str, value: dict) -> None:
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(value, f, indent=1)


def _remove_stale_builds(workdir: str) -> None:
  """Leftovers of runs interrupted before their final rename."""
  for prefix in (_BUILD_PREFIX, _OLD_PREFIX):
    for stale in glob.glob(os.path.join(glob.escape(workdir), prefix + '*')):
      shutil.rmtree(stale, ignore_errors=True)


def _replace_dir(build: str, target: str) -> None:
  """Makes `build` the new `target`, carrying over the demo log that `target` may hold."""
  for name in (DEMO_LOG, _DEMO_LOG_INFO):
    source = os.path.join(target, name)
    if os.path.exists(source):
      try:
        os.link(source, os.path.join(build, name))
      except OSError:  # a file system without hard links
        shutil.copy2(source, os.path.join(build, name))
  files.replace_dir(build, target, _OLD_PREFIX)
