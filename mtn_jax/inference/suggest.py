"""The suggestion modes: offline over a file (`--mode=decode`), or typed (`--mode=suggest`).
Only the parameters are loaded, never the optimizer state; suggestions come from the one
suggestion pipeline (`mtn_jax.inference.pipeline`), the lists `--mode=eval` scores.

`decode_file` reads `config.decode.input` (a sessions file or a raw AOL-format log:
`mtn_jax.inference.inputs` says how each is read) and writes `config.decode.output` (default
`<workdir>/decode/<the input's file name>.suggestions.jsonl`), one JSON object per suggestion point:
  {"line": 3, "context": ["q1", "q2"], "suggestions": [{"query": "...", "score": -0.42}, ...]}
  {"user": 4945, "session": 0, "position": 1, "context": [...], "reference": "q3" or null,
   "suggestions": [...]}
with the `config.decode.top_k` best suggestions, best first. Every suggestion has a 'score',
the value its list is ordered by: the beam's length-normalised log-probability, a ranker's
score, or, where minimum Bayes risk reorders the list (`config.decode.mbr`), its expected
BLEU, the model's own score then kept as 'model_score' (a session query MBR adds has none);
under the learned ranker, whose presentation reorders its list, 1 / place, the ranker's
score kept as 'model_score'. The header line printed before decoding names the kind.
The changes made to the input are counted and printed at the end.

Input is decoded in chunks of `CHUNK_BATCHES * config.decode.batch_sessions` sessions, each
chunk sorted by session length into batches `[batch_sessions, queries, tokens]` and written
out in input order before the next chunk is read, so memory stays bounded on any session file
(a raw log is held in memory as the log reader's flat columns, which sessionizing by user and
time needs).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TextIO

import ml_collections

from mtn_jax import errors
from mtn_jax import files
from mtn_jax.data import aol_log
from mtn_jax.inference import inputs
from mtn_jax.inference import pipeline
from mtn_jax.inference import sources as inference_sources
from mtn_jax.inference.inputs import Context

CHUNK_BATCHES = 8


def _records(context: Context, suggestions: list[list[dict]]) -> Iterator[dict]:
  for t, ranked in zip(range(context.first_output, len(context.queries)), suggestions):
    record = dict(context.info)
    if context.references is not None:
      record['position'] = context.first_position + t
    record['context'] = list(context.queries[:t + 1])
    if context.references is not None:
      record['reference'] = context.references[t]
    record['suggestions'] = ranked
    yield record


def _chunked(items: Iterable[Context], size: int) -> Iterator[list[Context]]:
  chunk = []
  for item in items:
    chunk.append(item)
    if len(chunk) == size:
      yield chunk
      chunk = []
  if chunk:
    yield chunk


# Each count's words for one and for several.
_COUNT_WORDS = {
    'latin1_lines': ('line that is not UTF-8 read as Latin-1',
                     'lines that are not UTF-8 read as Latin-1'),
    'empty_lines': ('empty line skipped', 'empty lines skipped'),
    'empty_queries': ('empty query skipped', 'empty queries skipped'),
    'control_character_lines': ('line holding a control character skipped',
                                'lines holding a control character skipped'),
    'log_lines': ('line of an AOL log in a sessions file skipped',
                  'lines of an AOL log in a sessions file skipped'),
    'duplicate_queries': ('successive duplicate query removed',
                          'successive duplicate queries removed'),
    'oov_words': ('word outside the vocabulary became <unk>',
                  'words outside the vocabulary became <unk>'),
    'long_queries': ('query cut to {n}', 'queries cut to {n}'),
    'long_sessions': ('context cut to its last {s} queries',
                      'contexts cut to their last {s} queries'),
}


def describe_counts(counts: dict, limit: str, max_session_queries: int) -> str:
  """The input changes in words, e.g. '3 empty lines skipped, 1 query cut to 10 words'
  (`limit`: what a query is cut to, `inputs.QueryReader.limit`), or 'none'. Only the changes
  made are named (the summary line holds every count, zeros too)."""
  parts = [f'{counts[key]:,} ' + words[counts[key] != 1].format(n=limit, s=max_session_queries)
           for key, words in _COUNT_WORDS.items() if counts.get(key)]
  parts += [f'{counts[key]:,} log line{"s" if counts[key] != 1 else ""} skipped '
            f'({key[len("skipped_"):]})'
            for key in sorted(k for k in counts if k.startswith('skipped_')) if counts[key]]
  return ', '.join(parts) or 'none'


def with_protocol(config: ml_collections.ConfigDict,
                  user_facing: bool) -> ml_collections.ConfigDict:
  """`config` with config.decode.exclude_session_queries set to the mode's default where it
  is unset: `user_facing` for --mode=suggest and --mode=serve, the paper's protocol for
  --mode=decode (what evaluation scores as the paper's)."""
  if config.decode.exclude_session_queries is not None:
    return config
  config = config.copy_and_resolve_references()
  config.decode.exclude_session_queries = user_facing
  return config


def protocol_words(user_facing: bool) -> str:
  """The protocol in words, with the setting that gives the other one."""
  if user_facing:
    return ('the user-facing protocol: no query of the session is suggested again '
            '(--config.decode.exclude_session_queries=false: the paper\'s)')
  return ('the paper\'s protocol: a query of the session may be suggested again '
          '(--config.decode.exclude_session_queries=true: never)')


def _default_output(workdir: str, input_path: str) -> str:
  """`<workdir>/decode/<the input's file name>.suggestions.jsonl`. The whole name: `s.txt`
  and `s.txt.gz` (or `s.tsv`) decoded in one workdir keep their own outputs."""
  name = os.path.basename(input_path)
  return os.path.join(os.path.abspath(workdir), 'decode', f'{name}.suggestions.jsonl')


class DecodeOutputError(errors.Error):
  """A decode output that cannot be written; the message names config.decode.output."""


def _check_output(output: str, input_path: str) -> list[str]:
  """Refuses, before the model loads, an output that is the input itself (opening it would
  erase the sessions before they are read), a folder, or one no file can be made at; makes
  its folder, and returns the folders it made, deepest first (a run refused when the model
  loads removes them, `_unmade`)."""
  key = f'config.decode.output={output}'
  if os.path.exists(output):
    if os.path.samefile(output, input_path):
      raise DecodeOutputError(f'{key} is the input file: writing it would erase the sessions '
                              'before they are read')
    if os.path.isdir(output):
      raise DecodeOutputError(f'{key} is a folder, not a file')
  else:
    problem = files.cannot_create(output)
    if problem:
      raise DecodeOutputError(f'{key}: {problem}')
  folder = os.path.dirname(os.path.abspath(output))
  made, above = [], folder
  while not os.path.exists(above):
    made.append(above)
    above = os.path.dirname(above)
  try:
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):  # the file system's own word, before any work
      pass
  except OSError as e:
    _unmade(made)
    raise DecodeOutputError(f'{key}: cannot write in {folder} ({e.strerror or e})') from None
  return made


def _unmade(folders: Sequence[str]) -> None:
  """Removes `folders` (`_check_output`'s, deepest first) that are still empty."""
  for folder in folders:
    with contextlib.suppress(OSError):
      os.rmdir(folder)


PARTIAL = '.partial'
# Beside a partial output: what made it (`_making`), which a resumed decode must match.
PARTIAL_RECORD = '.partial.json'


def _making(config: ml_collections.ConfigDict, input_path: str, step: int) -> dict:
  """What a decode's lists follow from: the input file (path, size, time), the checkpoint
  step, and the settings of the data, decoding and suggestion (the output's aside)."""
  stat = os.stat(input_path)
  decode = {k: v for k, v in config.decode.to_dict().items() if k != 'output'}
  return json.loads(json.dumps(
      {'input': os.path.abspath(input_path), 'size': stat.st_size,
       'mtime_ns': stat.st_mtime_ns, 'step': step, 'chunk_sessions': CHUNK_BATCHES
       * config.decode.batch_sessions, 'data': config.data.to_dict(), 'decode': decode,
       'suggest': config.suggest.to_dict()}, default=str))


def _resumable(output: str, making: dict) -> list[str]:
  """The whole records of `output` + PARTIAL (a line each), where a decode stopped part-way
  by the same input, checkpoint and settings (`making`) left them: the same command goes on
  from there; none otherwise (said where a partial output was made otherwise). A last line
  cut short (a run killed mid-write) is dropped."""
  partial, record = output + PARTIAL, output + PARTIAL_RECORD
  if not os.path.isfile(partial):
    return []
  try:
    with open(record, encoding='utf-8') as f:
      made = json.load(f)
  except (OSError, ValueError):
    made = None
  if made != making:
    differs = ('no record of what made it' if made is None else 'made with another '
               + ', '.join(k for k in making if made.get(k) != making[k]))
    print(f'Note: {partial} is not gone on from ({differs}): decoding afresh.', flush=True)
    return []
  with open(partial, encoding='utf-8') as f:
    return [line + '\n' for line in f.read().split('\n')[:-1]]


@contextlib.contextmanager
def _written(output: str, making: dict | None = None):
  """`write(text)` appending to a temporary file beside `output` and flushing it (a chunk at
  a time), which replaces `output` when the block ends (`files.atomic_path`): a run stopped
  by an error leaves `output` as it was, and what it wrote in `output` + PARTIAL, with
  `making` (what made it) in `output` + PARTIAL_RECORD, and says so. A link, a device or a
  pipe (`/dev/stdout`) is written in place, as it is. What the system refuses of the output
  (a full disk) is an error naming config.decode.output; an error of the block itself (the
  input's) passes as it is."""
  def refused(e: OSError) -> DecodeOutputError:
    return DecodeOutputError(f'config.decode.output={output}: {e.strerror or e}')
  existed = os.path.exists(output)
  in_place = os.path.islink(output) or (existed and not os.path.isfile(output))
  with (contextlib.nullcontext(output) if in_place else files.atomic_path(output)) as path:
    try:
      out = open(path, 'w', encoding='utf-8')
    except OSError as e:
      raise refused(e) from None

    def write(text: str) -> None:
      try:
        out.write(text)
        out.flush()
      except OSError as e:
        raise refused(e) from None
    try:
      yield write
    except BaseException:
      with contextlib.suppress(OSError):
        out.close()
        if not in_place and os.path.getsize(path):
          os.replace(path, output + PARTIAL)
          if making is not None:
            files.write_text(output + PARTIAL_RECORD, json.dumps(making) + '\n')
          print(f'Stopped: the suggestions written before are in {output + PARTIAL}'
                + (' (the same command goes on from them)' if making else '')
                + '; ' + (f'{output} is as it was.' if existed else f'no {output} was written.'),
                flush=True)
      raise
    try:
      try:
        if not in_place:
          os.fsync(out.fileno())
      finally:
        out.close()
    except OSError as e:
      raise refused(e) from None


def history_note(input_format: str, suggestions: pipeline.Pipeline) -> str | None:
  """What decode says where the pipeline reads users' earlier queries (a personalising model,
  the habit rule) and the input names no users (a sessions file), else None."""
  if input_format == 'sessions' and suggestions.past_read:
    return ('Note: a sessions file names no users, so the model reads no earlier queries of '
            'one (an AOL-format log gives each user\'s earlier sessions in it).')
  return None


def decode_file(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Writes suggestions for every session of config.decode.input; returns the counts."""
  dc = config.decode
  if not dc.input:
    raise inputs.DecodeInputError('config.decode.input is empty: pass --config.decode.input=FILE '
                           '(one session a line, queries separated by tabs, or an AOL log)')
  if dc.input == '-' and not os.path.exists(dc.input):  # the shell's name for standard input
    raise inputs.DecodeInputError("-: standard input is not read (the input is read twice: its "
                                  'format, then its lines): write the input to a file and '
                                  'give that')
  if not os.path.exists(dc.input):
    raise inputs.DecodeInputError(f'{dc.input}: no such decode input file')
  input_format = inputs.detect_format(dc.input)
  output = dc.output or _default_output(workdir, dc.input)
  made = _check_output(output, dc.input)
  config = with_protocol(config, user_facing=False)
  try:
    suggestions = pipeline.Pipeline.load(config, workdir)
  except BaseException:  # a workdir refused (none trained, another model) is left as it was
    _unmade(made)
    raise
  trained = suggestions.trained
  reader = inputs.QueryReader.for_model(trained)
  chunk_size = CHUNK_BATCHES * dc.batch_sessions
  if input_format == 'raw':
    contexts = inputs.read_raw_log(dc.input, reader, config.data, chunk_sessions=chunk_size,
                                   past_queries=suggestions.past_read)
    positions = 'all'
  else:
    contexts = inputs.read_sessions_file(dc.input, reader, strict=config.data.strict)
    positions = 'last'
  suggester = suggestions.suggester
  print(f'Decoding {dc.input} ({"AOL-format log" if input_format == "raw" else "sessions"}) '
        f'with {suggester.cfg.name} (checkpoint step {suggester.step}), {suggestions.how()}, '
        f'top {dc.top_k}; score = {suggestions.score_kind()}; '
        f'{protocol_words(bool(config.decode.exclude_session_queries))}.', flush=True)
  note = history_note(input_format, suggestions)
  if note:
    print(note, flush=True)

  making = _making(config, dc.input, suggester.step)
  kept = _resumable(output, making)
  started = last_log = time.time()
  num_sessions = num_records = longest = 0
  try:
    with _written(output, making) as write:
      if kept:
        # The contexts the partial output holds whole (its chunks are written whole; a run
        # killed mid-write may have cut the last), read again but not decoded.
        contexts = iter(contexts)
        for context in contexts:
          points = len(context.queries) - context.first_output
          if num_records + points > len(kept):
            contexts = itertools.chain([context], contexts)
            break
          num_records += points
          num_sessions += context.first_position == 0
          longest = max(longest, len(context.queries))
        write(''.join(kept[:num_records]))
        print(f'Resuming after the {num_records:,} suggestion points of '
              f'{output + PARTIAL}.', flush=True)
      for chunk in _chunked(contexts, chunk_size):
        lines = []
        for context, ranked in zip(chunk, suggestions.suggest(chunk, positions=positions)):
          lines += [json.dumps(record, ensure_ascii=False) + '\n'
                    for record in _records(context, ranked)]
          num_sessions += context.first_position == 0
          longest = max(longest, len(context.queries))
        write(''.join(lines))
        num_records += len(lines)
        if time.time() - last_log >= inference_sources.PROGRESS_SECONDS:
          last_log = time.time()
          print(f'  {num_sessions:,} sessions done '
                f'({num_sessions / (last_log - started):.1f} sessions/s)', flush=True)
      if not num_sessions:  # as a file of blank lines is refused: nothing was decoded
        skipped = ', '.join(f'{n:,} {key}' for key, n in sorted(reader.counts.items())
                            if n and key != 'lines_read')
        raise inputs.DecodeInputError(f'{dc.input}: no session to decode (every line was '
                                      f'skipped: {skipped})')
  except inputs.DecodeInputError:
    _unmade(made)
    raise
  if kept:  # gone into the output
    for left in (output + PARTIAL, output + PARTIAL_RECORD):
      with contextlib.suppress(FileNotFoundError):
        os.remove(left)
  elapsed = time.time() - started
  counts = {'format': input_format, 'sessions': num_sessions, 'suggestion_points': num_records,
            **{k: reader.counts.get(k, 0) for k in _COUNT_WORDS},
            **{k: v for k, v in reader.counts.items() if k not in _COUNT_WORDS},
            'seconds': round(elapsed, 3), 'output': os.path.abspath(output)}
  print(f'Decoded {num_sessions:,} sessions ({num_records:,} suggestion points) in '
        f'{elapsed:.1f} s ({num_sessions / max(elapsed, 1e-9):.1f} sessions/s) into {output}.')
  print('Input changes: ' + describe_counts(counts, reader.limit,
                                            trained.cfg.max_session_queries) + '.')
  if input_format == 'sessions' and num_sessions > 1 and longest == 1:
    # Valid, but what a file whose tabs an editor turned into spaces gives.
    print('Note: every session was read as one query (a session\'s queries are separated by '
          'tabs, a query\'s words by spaces).', flush=True)
  print('Summary: ' + json.dumps(counts, sort_keys=True), flush=True)
  return counts


# ---------------------------------------------------------------------------------------------
# Interactive


def interactive(config: ml_collections.ConfigDict, workdir: str, stdin: TextIO = sys.stdin,
                stdout: TextIO = sys.stdout, notes: TextIO | None = None) -> None:
  """Suggestions after each query a person types; an empty line starts a new session.

  `stdout` holds the banner and the lists alone; the pipeline's notes on how it was loaded go
  to `notes` (standard error by default), so that piped lists hold nothing else.

  Every context is padded to the model's query-position table, so there is one compilation
  for the whole conversation (the models are causal over queries, so the padding changes
  nothing).
  """
  if stdin is None or stdin.closed:
    raise errors.Error('suggest reads the queries from standard input, which is closed')
  config = with_protocol(config, user_facing=True)
  notes = notes or sys.stderr
  suggestions = pipeline.Pipeline.load(
      config, workdir, log=lambda text, **_: print(text, file=notes, flush=True))
  cfg, suggester = suggestions.trained.cfg, suggestions.suggester
  reader = inputs.QueryReader.for_model(suggestions.trained)
  prompt = stdin.isatty()

  def say(text: str = '') -> None:
    stdout.write(text + '\n')
    stdout.flush()

  # What a personalising model or a source of the user's past reads: the sessions typed
  # before this one, as a log's earlier sessions and a request naming its user are read.
  past = (f' (the sessions typed before are your past: the latest {suggestions.past_read:,} '
          'queries are read)' if suggestions.past_read else '')
  say(f'{suggester.cfg.name} (checkpoint step {suggester.step}, '
      f'{len(suggestions.trained.vocab):,} words; score = {suggestions.score_kind()}); '
      f'{protocol_words(bool(config.decode.exclude_session_queries))}. Type a query per line; '
      f'an empty line starts a new session{past}; end with Ctrl-D.')
  session: list[str] = []
  # The queries of the sessions typed before this one: the history of a model that
  # personalises.
  earlier: list[str] = []
  # Bytes where the stream has them: a line that is not UTF-8 is read as Latin-1, as decode
  # reads its files, not refused with the lines read beside it.
  read_line = getattr(stdin, 'buffer', stdin).readline
  first = True
  while True:
    if prompt:
      stdout.write('query> ')
      stdout.flush()
    line = read_line()
    if not line:
      break
    line, latin1 = aol_log.decode_fields(line) if isinstance(line, bytes) else (line, False)
    if first:  # a byte-order mark before the first line is no part of it, as in decode
      line, first = line.removeprefix('\ufeff'), False
    if refused := inputs.refused_character(line):
      say(f'not read: the query holds {refused} (an arrow or function key?); type it again')
      continue
    if not line.strip():
      if session:
        say('-- new session --')
      earlier += session
      session = []
      continue
    oov_before, long_before = reader.counts['oov_words'], reader.counts['long_queries']
    session = (session + [reader.query(line)])[-cfg.max_session_queries:]
    context = Context(tuple(session), first_output=len(session) - 1, info={},
                      history=tuple(earlier))
    [[ranked]] = suggestions.suggest([context], positions='last', batch_rows=1,
                                     widths=(cfg.max_session_queries,))
    unknown = reader.counts['oov_words'] - oov_before
    notes = [f'{unknown} word(s) outside the vocabulary read as <unk>'] if unknown else []
    if latin1:
      notes.append('not UTF-8: read as Latin-1')
    if reader.counts['long_queries'] > long_before:
      notes.append(f'query cut to {reader.limit}')
    note = f' ({"; ".join(notes)})' if notes else ''
    say(f'after {" | ".join(session)}{note}:')
    for rank, suggestion in enumerate(ranked, 1):
      model = (f'; model {suggestion["model_score"]:.3f}'
               if suggestion.get('model_score') is not None else '')
      say(f'  {rank}. {suggestion["query"]}  ({suggestion["score"]:.3f}{model})')
  say()
