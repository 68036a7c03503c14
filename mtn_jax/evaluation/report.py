"""The paper's results section, made from evaluated workdirs (`--mode=report`).

In:  `config.report.workdirs`, comma-separated (default: the run's own workdir); each a
     trained and evaluated workdir holding `eval/results.json` and `eval/samples.jsonl`
     (written by `mtn_jax.evaluation.evaluate`), or the files of the config's
     `decode.eval_split` and `suggest.strategy` where they are not the test split and
     'generate' (`eval/learned_results.json`, ...).
Out, in `config.report.output` (default `<workdir>/report/`):
  `report.md`   a Table-2-style Markdown table (model, size MB, 1/2/3/4-gram precision, BLEU)
                with the trivial suggesters' lines, the figures, and sample suggestions in the
                form of the paper's Tables 4-5 (previous queries, predicted, actual)
  `bleu.png`    BLEU per model, like the paper's Fig. 2, beside each model's 1-4-gram
                precisions
  `layers.png`  only where the workdirs hold one model of the layer ablation (the
                Transformer, MTN) at more than one depth: BLEU per layer layout
                ("Transformer (4Q enc, 4 dec)", "MTN (3Q+2S, 3)"), like Fig. 3
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
from collections.abc import Sequence

import ml_collections

from mtn_jax import errors
from mtn_jax import files
from mtn_jax import models
from mtn_jax.evaluation import evaluate
from mtn_jax.evaluation import metrics
from mtn_jax.evaluation import trivial
from mtn_jax.training import checkpoints

SAMPLES_PER_MODEL = 10
_REQUIRED_KEYS = ('model', 'model_config', 'size_mb', 'step', 'pairs', 'scores')
_SCORE_KEYS = ('bleu', 'precisions', 'line')


class ReportError(errors.Error, ValueError):
  """A workdir that cannot be reported on; the message names it."""


@dataclasses.dataclass(frozen=True)
class EvaluatedRun:
  """One workdir's eval/results.json, its samples and the names it is shown under."""

  workdir: str
  results: dict
  samples: list[dict]

  @property
  def name(self) -> str:
    return models.display_name(self.results['model'])

  @property
  def layer_label(self) -> str:
    """The paper's Fig.-3 label: "Transformer (4Q enc, 4 dec)", "MTN (3Q+2S, 3)"."""
    return layer_label(self.results['model'], self.results['model_config'])


def layer_label(model: str, model_config: dict) -> str:
  """A model's name with its layer counts (its registry entry's label); recurrent models
  have no layers to count."""
  if model not in models.REGISTRY:
    return model
  return models.spec(model).label(model_config)


def load_run(workdir: str, prefix: str = '') -> EvaluatedRun:
  """Reads one evaluated workdir's `prefix`results.json and `prefix`samples.jsonl (the prefix
  of a split and strategy, `evaluate.results_prefix`); raises ReportError naming it when
  something is missing."""
  if not os.path.isdir(workdir):
    raise ReportError(f'report workdir {workdir} does not exist')
  eval_dir = os.path.join(workdir, 'eval')
  results_path = os.path.join(eval_dir, f'{prefix}results.json')
  samples_path = os.path.join(eval_dir, f'{prefix}samples.jsonl')
  if not os.path.exists(results_path):
    # Its results of other strategies or splits, if any: a ranker's run has no learned
    # strategy's, and the advice to evaluate it so could not be followed.
    others = sorted(n for n in os.listdir(eval_dir) if n.endswith('results.json')
                    ) if os.path.isdir(eval_dir) else []
    if others:
      raise ReportError(f'report workdir {workdir} has no {results_path}; it holds '
                        f'{", ".join(others)} only: a report takes one strategy\'s results '
                        'on one split from every run, as config.suggest.strategy, '
                        'config.decode.eval_split and config.decode.max_eval_sessions name '
                        'them (a strategy its model has)')
    raise ReportError(f'report workdir {workdir} has not been evaluated ({results_path} is '
                      'missing): run --mode=eval on it first with the same '
                      'config.suggest.strategy, config.decode.eval_split and '
                      'config.decode.max_eval_sessions')
  try:
    with open(results_path, encoding='utf-8') as f:
      results = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ReportError(f'{results_path} is not valid JSON: {e}') from None
  if not isinstance(results, dict) or not isinstance(results.get('scores', {}), dict):
    raise ReportError(f'{results_path} is not what --mode=eval writes (an object with its '
                      f'scores): re-run --mode=eval on {workdir}')
  if 'pool' in results and 'model' not in results.get('scores', {}):
    # A Cross-encoder's evaluation: the sampled protocols alone (eval's R@1/20 and R@1/100).
    raise ReportError(f'report workdir {workdir} holds a model that makes no suggestions of '
                      f'its own (a Cross-encoder: {results_path} holds R@1/20 and R@1/100 '
                      'only): leave it out of config.report.workdirs')
  missing = [k for k in _REQUIRED_KEYS if k not in results]
  required = [name for name in trivial.SUGGESTERS if name not in trivial.OPTIONAL]
  scores = {name: results.get('scores', {}).get(name) for name in ('model', *required)}
  missing += [f'scores.{name}' for name, score in scores.items()
              if score is not None and not isinstance(score, dict)]
  missing += [f'scores.{name}.{k}' for name, score in scores.items() for k in _SCORE_KEYS
              if not isinstance(score, dict) or k not in score
              or (k == 'bleu' and not isinstance(score[k], (int, float)))]
  if missing:
    raise ReportError(f'{results_path} lacks {", ".join(missing)} (or holds something else '
                      f'there): re-run --mode=eval on {workdir}')
  best = checkpoints.named_best_step(workdir)
  if best is not None and results.get('step') != best:
    raise ReportError(f'{results_path} was written for step {results.get("step")}, and the '
                      f'best checkpoint of {workdir} is now step {best}: re-run --mode=eval')
  if not os.path.exists(samples_path):
    raise ReportError(f'report workdir {workdir} has no {samples_path}: re-run --mode=eval')
  samples = []
  with open(samples_path, encoding='utf-8') as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        sample = json.loads(line)
        samples.append({k: sample[k] for k in ('context', 'predicted', 'actual')})
      except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ReportError(f'{samples_path}:{number}: not a sample record ({e!r})') from None
  return EvaluatedRun(workdir, results, samples)


def _labels(runs: Sequence[EvaluatedRun]) -> list[str]:
  """The model name, or its layer layout where two runs share a name, or both plus the
  workdir's name where even that is shared: every row of the table is told apart."""
  names = [r.name for r in runs]
  labels = [r.layer_label if names.count(r.name) > 1 else r.name for r in runs]
  return [f'{label} [{os.path.basename(os.path.normpath(r.workdir))}]'
          if labels.count(label) > 1 else label for label, r in zip(labels, runs)]


# Markdown would read `<unk>` as an HTML tag (and drop it, as in the paper's own tables) and
# `*`, `_` or `|` in a query as formatting: queries are escaped before they go into a cell.
_MARKDOWN_SPECIAL = re.compile(r'([\\`*_\[\]|~])')


def markdown_cell(text: str) -> str:
  return _MARKDOWN_SPECIAL.sub(r'\\\1', html.escape(text, quote=False))


def code_cell(text: str) -> str:
  """A path as inline code; a table cell still ends at a bare `|`, even inside code."""
  return '`' + text.replace('|', '\\|') + '`'


def _precisions(score: dict) -> str:
  return '/'.join(f'{p:.1f}' for p in score['precisions'])


# The pairs column's heading, by the split evaluated (config.decode.eval_split).
_PAIRS_HEADING = {'test': 'Test pairs', 'valid': 'Validation pairs'}


def _pairs(results: dict) -> str:
  """The number of pairs evaluated, and which part of their split they come from when
  `config.decode.max_eval_sessions` limited the evaluation."""
  sessions, total = results.get('sessions'), results.get('sessions_total')
  if sessions is not None and total is not None and sessions < total:
    return f'{results["pairs"]:,} (first {sessions:,} of {total:,} sessions)'
  return f'{results["pairs"]:,}'


def _trivial_identity(run: EvaluatedRun, key: str) -> tuple:
  """What tells a trivial suggester's rows apart: its figures under both protocols and the
  pairs scored. Runs with other training users (a learning curve) have other lists of the
  log's, and so other rows, on the same test pairs."""
  figures = [run.results['scores'][key],
             run.results.get('scores_excluding_session', {}).get(key)]
  return key, json.dumps(figures, sort_keys=True), _pairs(run.results)


def results_table(runs: Sequence[EvaluatedRun], split: str = 'test') -> str:
  """The Table-2 Markdown table: one line per model, then the trivial suggesters' lines.

  The trivial suggesters are listed once per distinct test set (their scores depend only on
  the data), after the models. `split`: the split the runs were evaluated on.
  """
  lines = [f'| Model | Size (MB) | 1/2/3/4-gram | BLEU | {_PAIRS_HEADING[split]} | Workdir |',
           '|---|---:|---|---:|---:|---|']
  for label, run in zip(_labels(runs), runs):
    score = run.results['scores']['model']
    lines.append(f'| {markdown_cell(label)} | {run.results["size_mb"]:.1f} | '
                 f'{_precisions(score)} | {score["bleu"]:.2f} | {_pairs(run.results)} | '
                 f'{code_cell(run.workdir)} |')
  seen = set()
  for run in runs:
    for key, name in trivial.SUGGESTERS.items():
      if key not in run.results['scores']:  # evaluated before this suggester existed
        continue
      score = run.results['scores'][key]
      identity = _trivial_identity(run, key)
      if identity in seen:
        continue
      seen.add(identity)
      lines.append(f'| {markdown_cell(name)} | - | {_precisions(score)} | '
                   f'{score["bleu"]:.2f} | {_pairs(run.results)} | '
                   f'{code_cell(run.workdir)} |')
  return '\n'.join(lines)


def ranking_table(runs: Sequence[EvaluatedRun], split: str = 'test') -> str:
  """Ranked-suggestion metrics (%), models then trivial suggesters (once per distinct test
  set): exact match at 1, Recall@5/@10 and MRR@10 over the distinct suggestions, the share of
  top suggestions that repeat a session query, and BLEU and Recall@10 when no suggestion may
  repeat a session query ('-' for a recall at a rank no list reaches). Runs evaluated before
  these metrics existed are left out. `split`: the split the runs were evaluated on."""
  lines = ['| Suggester | EM@1 | R@5 | R@10 | MRR@10 | top-1 repeats session | '
           f'BLEU, never repeating | R@10, never repeating | {_PAIRS_HEADING[split]} | '
           'Workdir |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|---|']

  def recall(ranking: dict, k: int) -> str:
    # '-' where no list reaches rank k: the figure would repeat the one before.
    return (f'{ranking[f"recall_at_{k}"]:.1f}' if metrics.RankingScore.reaches(ranking, k)
            else '-')

  def row(label: str, run: EvaluatedRun, key: str) -> str:
    rank = run.results['scores'][key]['ranking']
    user = run.results['scores_excluding_session'][key]
    return (f'| {markdown_cell(label)} | {rank["exact_match"]:.1f} | '
            f'{recall(rank, 5)} | {recall(rank, 10)} | '
            f'{rank["mrr_at_10"]:.1f} | {rank["repeats_session"]:.1f} | {user["bleu"]:.2f} | '
            f'{recall(user["ranking"], 10)} | {_pairs(run.results)} | {code_cell(run.workdir)} |')

  ranked = [(label, r) for label, r in zip(_labels(runs), runs)
            if 'ranking' in r.results['scores']['model']
            and 'scores_excluding_session' in r.results]
  lines += [row(label, run, 'model') for label, run in ranked]
  seen = set()
  for _, run in ranked:
    for key, name in trivial.SUGGESTERS.items():
      if key not in run.results['scores']:
        continue
      identity = _trivial_identity(run, key)
      if identity not in seen:
        seen.add(identity)
        lines.append(row(name, run, key))
  return '\n'.join(lines) if ranked else ''


def samples_table(samples: Sequence[dict], limit: int = SAMPLES_PER_MODEL) -> str:
  """The paper's Tables 4-5: previous session queries, predicted and actual next query."""
  lines = ['| Previous session queries | Predicted next query | User next query |',
           '|---|---|---|']
  for sample in samples[:limit]:
    lines.append(f'| {markdown_cell(", ".join(sample["context"]))} | '
                 f'{markdown_cell(sample["predicted"])} | {markdown_cell(sample["actual"])} |')
  return '\n'.join(lines)


# The 1- to 4-gram precisions in light to dark grey, BLEU in the paper's blue.
_SERIES_COLOURS = ('#d9d9d9', '#b3b3b3', '#8c8c8c', '#666666', '#4c72b0')


def _bar_chart(path: str, labels: Sequence[str], scores: Sequence[dict], title: str,
               baselines: Sequence[tuple[str, float]] = ()) -> None:
  """Per label a group of bars: the 1/2/3/4-gram precisions and BLEU (all in %).

  BLEU alone is the paper's figure; the precisions beside it keep the chart readable when a
  4-gram precision of 0 sends every BLEU to 0, as on small corpora. `scores` are the
  results' score entries; each of `baselines` (label, BLEU) is drawn as a dashed line.
  """
  # Imported here: matplotlib's import would slow every run of the command line, and only
  # the report draws. A bare Figure with the Agg canvas: no pyplot global state, no display.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(max(4.5, 1.5 * len(labels) + 1.5), 3.8), dpi=120)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  series = [(f'{n}-gram', [s['precisions'][n - 1] for s in scores]) for n in range(1, 5)]
  series.append(('BLEU', [s['bleu'] for s in scores]))
  width = 0.8 / len(series)
  for k, ((name, values), colour) in enumerate(zip(series, _SERIES_COLOURS)):
    offsets = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
    bars = ax.bar(offsets, values, width, color=colour, label=name)
    if name == 'BLEU':
      ax.bar_label(bars, labels=[f'{v:.2f}' for v in values], padding=2, fontsize=7)
  ax.set_xticks(range(len(labels)), labels, rotation=20, ha='right', fontsize=8)
  ax.set_ylabel('precision / BLEU (%)')
  ax.set_title(title, fontsize=10)
  top = max([v for _, values in series for v in values] + [1.0])
  for (label, value), colour in zip(baselines, ('#c44e52', '#55a868')):
    ax.axhline(value, color=colour, linestyle='--', linewidth=1,
               label=f'BLEU, {label[0].lower() + label[1:]} ({value:.2f})')
    top = max(top, value)
  ax.legend(fontsize=6, loc='upper right', ncol=2)
  ax.set_ylim(0, top * 1.35)
  fig.tight_layout()
  fig.savefig(path)


def ablation_place(run: EvaluatedRun) -> int | None:
  """The run's model's place in the paper's layer ablation (`models.ModelSpec`), None for
  a model not in it (or unknown: an old results file)."""
  name = run.results['model']
  return models.spec(name).layer_ablation if name in models.REGISTRY else None


def has_depth_variants(runs: Sequence[EvaluatedRun]) -> bool:
  """Whether the runs hold a model of the layer ablation at more than one (encoder,
  decoder) depth."""
  ablation = [r for r in runs if ablation_place(r) is not None]
  depths = {(r.results['model'], r.results['model_config']['query_layers'],
             r.results['model_config']['decoder_layers']) for r in ablation}
  return len(depths) > len({r.results['model'] for r in ablation})


def write_report(config: ml_collections.ConfigDict, workdir: str,
                 workdirs: Sequence[str] | None = None) -> str:
  """Writes the report; returns the path of report.md.

  Args:
    config: its `report.workdirs` lists the runs (default: `workdir` alone) unless
      `workdirs` is given; `report.output` is where the report goes (default
      `<workdir>/report`).
    workdir: this run's workdir.
    workdirs: the evaluated workdirs to report on, overriding `config.report.workdirs`.
  """
  if workdirs is None:
    workdirs = [w.strip() for w in config.report.workdirs.split(',') if w.strip()] or [workdir]
  if not workdirs:
    raise ReportError('no workdirs to report on: pass --config.report.workdirs=A,B')
  seen = {}
  for w in workdirs:  # a run named twice would be two rows of one run
    if (real := os.path.realpath(w)) in seen:
      raise ReportError(f'config.report.workdirs names one run twice ({seen[real]}, {w}): '
                        'name each once')
    seen[real] = w
  prefix = evaluate.results_prefix(config)
  runs = [load_run(os.path.abspath(w), prefix) for w in workdirs]
  out_dir = os.path.abspath(config.report.output or os.path.join(workdir, 'report'))
  try:
    os.makedirs(out_dir, exist_ok=True)
  except OSError as e:
    raise ReportError(f'config.report.output={out_dir}: cannot be the report\'s folder '
                      f'({e.strerror})') from None

  labels = _labels(runs)
  split, strategy = config.decode.eval_split, config.suggest.strategy
  # The trivial suggesters' lines only where every run has the same ones (one test set):
  # another corpus's would be drawn as this one's.
  shared = [key for key in trivial.SUGGESTERS if all(key in r.results['scores'] for r in runs)
            and len({_trivial_identity(r, key) for r in runs}) == 1]
  _bar_chart(os.path.join(out_dir, 'bleu.png'), labels,
             [r.results['scores']['model'] for r in runs],
             f'n-gram precision and BLEU on the {split} split',
             baselines=[(trivial.SUGGESTERS[key], runs[0].results['scores'][key]['bleu'])
                        for key in shared])
  how = ('the models by beam search' if strategy == 'generate' else
         f'the suggestions of the {strategy} strategy, named under each run\'s samples')
  # A run may have been evaluated by another strategy than asked (a workdir without a
  # learned ranker, by the blend): its results say so.
  instead = sorted({r.results.get('strategy', {}).get('strategy', strategy) for r in runs}
                   - {strategy})
  if instead:
    how += f'; {" and ".join(instead)} where a run had no {strategy} ' + (
        'ranker' if strategy == 'learned' else 'lists')
  sections = ['# Next-query suggestion: results', '',
              'n-gram precision (1/2/3/4-gram, %) and BLEU of the best checkpoint of each run '
              f'on its {split} split ({how}; references are the raw next queries). Size: '
              'parameters in MB at fp32 (2**20 bytes, as the paper counts).', '',
              results_table(runs, split), '']
  # The split's digest where every run has one (eval writes it), else the pairs' count.
  digests = {r.results.get('split_digest') for r in runs}
  evaluated_on = list(dict.fromkeys(_pairs(r.results) for r in runs))
  if (len(digests) > 1 if None not in digests else len(evaluated_on) > 1):
    # Runs on other corpora (or other parts of one) in one table: said, not left to the eye.
    note = (f'Note: the runs were evaluated on different {split} splits (pairs: '
            f'{"; ".join(evaluated_on)}{" each" if len(evaluated_on) == 1 else ""}): their '
            'figures do not compare.')
    print(note, flush=True)
    sections += [f'**{note}**', '']
  sections += ['![BLEU per model](bleu.png)', '']
  ranking = ranking_table(runs, split)
  if ranking:
    sections += ['## Ranked suggestions', '',
                 'Where the logged next query ranks among the distinct suggestions (%); the '
                 'columns "never repeating" drop every suggestion that repeats a query of the '
                 'session, as a deployed suggester would.', '', ranking, '']
  if has_depth_variants(runs):
    # The paper's Fig. 3 order: the Transformers, then the MTNs.
    ablation = sorted((r for r in runs if ablation_place(r) is not None), key=ablation_place)
    _bar_chart(os.path.join(out_dir, 'layers.png'), [r.layer_label for r in ablation],
               [r.results['scores']['model'] for r in ablation],
               'Layer layout (Q: query/encoder, S: session layers; decoder)')
    sections += ['## Layer ablation', '', '![BLEU per layer layout](layers.png)', '']
  for label, run in zip(labels, runs):
    step, decode = run.results['step'], run.results.get('decode', {})
    how = run.results.get('strategy', {}).get('label')
    sections += [f'## Sample suggestions: {markdown_cell(label)}', '',
                 f'Checkpoint step {step}; beam size {decode.get("beam_size", "?")}'
                 + (f'; {markdown_cell(how)}.' if how else '.'), '',
                 samples_table(run.samples), '']
  report_path = os.path.join(out_dir, 'report.md')
  files.write_text(report_path, '\n'.join(sections))
  print(f'Report on {len(runs)} run(s) written to {report_path}', flush=True)
  return report_path
