r"""Records what small trained runs suggest and score, through the command line only, so that
two commits of the project can be compared on one machine: a restructuring must change none
of it.

Each family and strategy is trained for a few steps on the demo log at test sizes, evaluated,
and decoded on the test split's sessions; the record keeps every eval figure (both
protocols), every evaluated list (or sample) and every decoded suggestion with its score.

  git worktree add /tmp/before REV
  python experiments/golden_outputs.py --repo=/tmp/before --out=/tmp/before.json
  python experiments/golden_outputs.py --repo=. --out=/tmp/after.json \
      [--ranker_args=--config.model.scaled_scores=False]  # a default changed since REV
  python experiments/golden_outputs.py --compare /tmp/before.json /tmp/after.json

Only the command line and the files a run writes are read (`python -m mtn_jax.main` in
`--repo`, with this interpreter), nothing imported from the package: the two commits may lay
out their modules differently.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping

# Each run evaluates its split's first sessions alone.
EVAL_SESSIONS = 16
# The sizes of the tests (tests/cli.py), written out: the record must not move with them.
# `config.model` holds the keys of its model's family only: the attention models' sizes and
# warm-up go to the generator (MTN) and the Poly-encoder, not to IMDNA, which reads none of them.
TINY = ('--config.data.demo_users=150', '--config.data.max_session_queries=3',
        '--config.data.min_word_count=2', '--config.model.emb_dim=16',
        '--config.train.learning_rate=0.3', '--config.input.train_queries_per_batch=240',
        '--config.input.eval_queries_per_batch=480', '--config.decode.batch_sessions=32',
        f'--config.decode.max_eval_sessions={EVAL_SESSIONS}')
ATTENTION = TINY + (
    '--config.train.warmup_steps=10',  # the attention models' schedule; IMDNA's has none
    '--config.model.d_model=16', '--config.model.num_heads=2', '--config.model.ff_dim=32',
    '--config.model.query_layers=1', '--config.model.session_layers=1',
    '--config.model.decoder_layers=1', '--config.model.scan_layers=False')
RANKER = 'configs/polyencoder_aol.py:demo'
IMDNA = ('--config.data.source=demo', '--config.model.emb_dim=8', '--config.model.state_dim=8',
         '--config.model.hidden_units=16', '--config.imdna.num_documents=4',
         '--config.imdna.batch_size=16', '--config.train.max_steps=3')
ZAM = ('--config.data.demo_users=150', '--config.data.max_session_queries=4',
       '--config.model.emb_dim=16', '--config.input.train_queries_per_batch=240',
       f'--config.decode.max_eval_sessions={EVAL_SESSIONS}', '--config.train.max_steps=6')
HABITS = ('--config.suggest.habit_rate=0.01', '--config.suggest.habit_min_past=1')


def _run(repo: str, workdir: pathlib.Path, *args: str, mode: str = 'train',
         config: str = 'configs/demo.py') -> None:
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONUNBUFFERED='1',
             XLA_FLAGS='--xla_force_host_platform_device_count=1')
  command = [sys.executable, '-m', 'mtn_jax.main', f'--config={config}',
             f'--workdir={workdir}', f'--mode={mode}', *args]
  result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True)
  if result.returncode:
    raise SystemExit(f'{" ".join(command)}\nexit {result.returncode}\n{result.stderr[-3000:]}')


def _jsonl(path: pathlib.Path) -> list:
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# What a record keeps of an eval's results: the figures, not the times or paths of the run.
_FIGURES = ('split', 'sessions', 'pairs', 'scores', 'scores_excluding_session', 'ranking',
            'answers', 'by_history')


def evaluated(workdir: pathlib.Path, prefix: str = '') -> dict:
  # The files of an evaluation of the first sessions alone: `first16_` after the split and
  # strategy since 2026-12-01, the whole split's names before (either commit may be recorded).
  if (workdir / 'eval' / f'{prefix}first{EVAL_SESSIONS}_results.json').exists():
    prefix = f'{prefix}first{EVAL_SESSIONS}_'
  results = json.loads((workdir / 'eval' / f'{prefix}results.json').read_text())
  record = {key: results[key] for key in _FIGURES if key in results}
  for name in ('lists', 'samples'):
    path = workdir / 'eval' / f'{prefix}{name}.jsonl'
    if path.exists():
      record[name] = _jsonl(path)
  return record


def strategies(poly, imdna) -> dict[str, tuple[str, ...]]:
  """The recorded strategies, by name: the generator's command-line settings for each, with
  the Poly-encoder's workdir `poly` and IMDNA's `imdna`."""
  return {
      'generate': (),
      'retrieve': ('--config.suggest.strategy=retrieve',
                   f'--config.suggest.ranker_workdir={poly}'),
      'rerank': ('--config.suggest.strategy=rerank', f'--config.suggest.ranker_workdir={poly}'),
      'rerank_imdna': ('--config.suggest.strategy=rerank',
                       f'--config.suggest.ranker_workdir={poly}', '--config.suggest.retrieved=0',
                       '--config.suggest.imdna_proposed=3',
                       f'--config.suggest.imdna_workdir={imdna}'),
      'rerank_habits': ('--config.suggest.strategy=rerank',
                        f'--config.suggest.ranker_workdir={poly}', *HABITS),
  }


def eval_prefix(strategy: str) -> str:
  """The prefix of the files a strategy's eval writes ('' for generate, 'rerank_', ...)."""
  return '' if strategy == 'generate' else f'{strategy.split("_")[0]}_'


def _decoded(repo, workdir: pathlib.Path, sessions_file: pathlib.Path, tag: str,
             *args: str) -> list:
  output = workdir / f'decoded_{tag}.jsonl'
  _run(repo, workdir, *ATTENTION, *args, f'--config.decode.input={sessions_file}',
       f'--config.decode.output={output}', mode='decode')
  return [{'context': r['context'], 'suggestions': r['suggestions']} for r in _jsonl(output)]


def record(repo: str, root: pathlib.Path, ranker_args: list[str]) -> dict:
  """Trains, evaluates and decodes every family and strategy; returns what they gave."""
  out: dict[str, dict] = {}
  generator, poly, imdna, zam = (root / n for n in ('generator', 'poly', 'imdna', 'zam'))
  _run(repo, generator, *ATTENTION, '--config.train.max_steps=4')
  _run(repo, poly, *ATTENTION, *ranker_args, '--config.train.max_steps=6', config=RANKER)
  _run(repo, imdna, *TINY, *IMDNA, config='configs/imdna_aol.py')
  _run(repo, zam, *ZAM, config='configs/zam_aol.py:demo')
  # The sessions decoded: the test split's contexts, as eval lists them.
  _run(repo, generator, *ATTENTION, mode='eval')
  contexts = [s['context'] for s in evaluated(generator)['samples']]
  sessions_file = root / 'sessions.txt'
  sessions_file.write_text(''.join('\t'.join(c) + '\n' for c in contexts))

  for name, args in strategies(poly, imdna).items():
    started = time.time()
    _run(repo, generator, *ATTENTION, *args, mode='eval')
    out[name] = {'eval': evaluated(generator, eval_prefix(name))}
    for exclude in (False, True):
      out[name][f'decode_exclude_{exclude}'] = _decoded(
          repo, generator, sessions_file, f'{name}_{exclude}', *args,
          f'--config.decode.exclude_session_queries={exclude}')
    print(f'{name}: {time.time() - started:.0f} s', flush=True)
  _run(repo, poly, *ATTENTION, *ranker_args, mode='eval', config=RANKER)
  out['ranker'] = {'eval': evaluated(poly)}
  _run(repo, imdna, *TINY, *IMDNA, mode='eval', config='configs/imdna_aol.py')
  out['imdna'] = {'eval': evaluated(imdna)}
  _run(repo, zam, *ZAM, mode='eval', config='configs/zam_aol.py:demo')
  out['zam'] = {'eval': evaluated(zam)}
  return out


def compare(before: dict, after: dict, rel_tol: float = 0.0,
            abs_tol: Mapping[str, float] | None = None, skip: tuple[str, ...] = ()
            ) -> tuple[list[str], list[str]]:
  """(changed, added): where the records differ (a path into them and the two values, or
  what only `before` holds), and what only `after` holds (a figure or file added since).
  Two floats within `rel_tol` of each other (relative to the larger) are the same, and so
  are two whose key has a tolerance in `abs_tol` ({key: absolute tolerance}) within it;
  paths that end with one of `skip` are not compared."""
  changed, added = [], []
  abs_tol = abs_tol or {}

  def same(a, b, key) -> bool:
    if isinstance(a, float) and isinstance(b, float):
      if key in abs_tol:
        return abs(a - b) <= abs_tol[key]
      if rel_tol:
        return math.isclose(a, b, rel_tol=rel_tol)
    return a == b

  def walk(a, b, path):
    if path.endswith(skip):
      return
    if isinstance(a, dict) and isinstance(b, dict):
      for key in dict.fromkeys([*a, *b]):
        if key not in b:
          changed.append(f'{path}/{key}: only before')
        elif key not in a:
          added.append(f'{path}/{key}')
        else:
          walk(a[key], b[key], f'{path}/{key}')
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
      for i, (x, y) in enumerate(zip(a, b)):
        walk(x, y, f'{path}[{i}]')
    elif not same(a, b, path.rsplit('/', 1)[-1]):
      changed.append(f'{path}: {json.dumps(a)[:200]} != {json.dumps(b)[:200]}')

  walk(before, after, '')
  return changed, added


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--repo', default='.', help='the checkout whose command line runs')
  parser.add_argument('--out', help='where the record (JSON) goes')
  parser.add_argument('--ranker_args', default='',
                      help='space-separated overrides of the ranker\'s training and eval: '
                      'a default changed on purpose between the two commits, stated')
  parser.add_argument('--compare', nargs=2, metavar=('BEFORE', 'AFTER'),
                      help='two records: print where they differ (exit 1 if they do)')
  args = parser.parse_args()
  if args.compare:
    for path in args.compare:
      if not os.path.isfile(path):
        parser.error(f'--compare: {path}: no such record')
    before, after = (json.loads(pathlib.Path(p).read_text()) for p in args.compare)
    changed, added = compare(before, after)
    print(f'Compared {", ".join(sorted(before))}: {len(changed)} value(s) changed or gone, '
          f'{len(added)} added.')
    for title, lines in (('Changed or gone', changed), ('Added', added)):
      if lines:
        print(f'{title}:\n  ' + '\n  '.join(lines[:50]))
    sys.exit(1 if changed else 0)
  if not args.out:
    parser.error('--out is needed to record')
  if not os.path.isfile(os.path.join(args.repo, 'mtn_jax', 'main.py')):
    parser.error(f'--repo={args.repo}: no checkout of the project (no mtn_jax/main.py)')
  with tempfile.TemporaryDirectory() as root:
    out = record(os.path.abspath(args.repo), pathlib.Path(root), args.ranker_args.split())
  pathlib.Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
  print(f'Wrote {args.out}')


if __name__ == '__main__':
  main()
