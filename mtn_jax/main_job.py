"""The main job (`--mode=all`): preprocess -> train -> evaluate -> sample suggestions -> report.

In:  a config and a workdir. Out: everything the single modes write into the workdir
(`data/`, `checkpoints/`, `metrics.jsonl`, `eval/`, `report/`), and the paths printed at the
end. Running it again reuses the corpus, resumes (or skips) training from the latest
checkpoint, and redoes evaluation and report.
"""

from __future__ import annotations

import os

import jax
import ml_collections

from mtn_jax import inference
from mtn_jax import tasks
from mtn_jax.evaluation import evaluate as evaluation
from mtn_jax.evaluation import report
from mtn_jax.inference import hypothesis_decoding
from mtn_jax.inference import learned
from mtn_jax.inference import learned_training
from mtn_jax.serving import prepare
from mtn_jax.training import checkpoints
from mtn_jax.training import train as train_loop

SAMPLES_SHOWN = 5


def print_samples(samples: list[dict], limit: int = SAMPLES_SHOWN) -> None:
  """A few evaluated pairs in the paper's Table-5 form."""
  print('Sample suggestions (previous session queries -> predicted | actual next query):')
  for sample in samples[:limit]:
    print(f'  {", ".join(sample["context"])}\n'
          f'      -> {sample["predicted"] or "(empty)"} | {sample["actual"]}')


# What a workdir's top-level files are, for the closing summary of --mode=train.
WORKDIR_FILES = {
    'data': 'the corpus (--mode=preprocess)',
    'checkpoints': 'the model, one folder a saved step',
    'metrics.jsonl': 'training and validation figures, a line each',
    'tensorboard': 'the same for TensorBoard',
    'config.json': 'the config trained with',
    'hypotheses': 'the generators\' suggestions a ranker learns from',
    'eval': 'evaluation results (--mode=eval)',
    'report': 'the report (--mode=report)',
    'decode': 'suggestions written by --mode=decode',
    'serve': 'the service\'s users\' histories and compiled programs',
    'folds': 'the generators trained without one fold of the users each (learned ranker)',
    'ranker': 'the learned ranker (config.suggest.strategy=learned)',
    'candidate_cache': 'the candidate pool\'s vectors for the best checkpoint (a ranker\'s)',
    'retrieval': 'IMDNA\'s BM25 indexes of its documents',
}


def train(config: ml_collections.ConfigDict, workdir: str, preprocessed: bool = False) -> dict:
  """`--mode=train`: the corpus is built (its summary printed) where it is not already, the
  files a ranker learns from generators' suggestions are made (`config.train.hypotheses_from`,
  for the splits training reads), then the run trains or resumes; returns the trainer's
  summary, after a closing summary (the best checkpoint, the workdir's files). With
  `config.serve.prepare_after_train`, a run that was not stopped then compiles the service's
  programs into its compilation cache (`serving.prepare`), its learned ranker included."""
  with train_loop.training_alone(workdir):  # the corpus, the generators and the ranker
    summary = _train_all(config, workdir, preprocessed)
    if not summary['interrupted'] and jax.process_index() == 0:
      prepare.after_training(config, workdir)
  return summary


def _train_all(config: ml_collections.ConfigDict, workdir: str, preprocessed: bool) -> dict:
  if not preprocessed:
    train_loop.prepare_corpus(config, workdir, verbose=True)
  hypothesis_decoding.prepare(config, workdir, ('train', 'valid'))
  if not learns_ranker(config):
    return _train_one(config, workdir)
  folds = config.suggest.ranker_folds
  parts = folds + 2
  print(f'== [1/{parts}] The generator', flush=True)
  summary = train_loop.train_and_evaluate(config, workdir)  # its summary once all is made
  if summary['interrupted']:
    return summary
  for k in range(folds):
    print(f'== [{k + 2}/{parts}] The generator without the training users of fold {k} of '
          f'{folds} (the learned ranker\'s candidates for them)', flush=True)
    try:
      fold = train_loop.train_and_evaluate(learned_training.fold_config(config, k),
                                           learned.fold_workdir(workdir, k))
    except checkpoints.CheckpointMismatch as e:
      if 'config.train.user_folds' not in str(e):  # which is ranker_folds here
        raise
      raise checkpoints.CheckpointMismatch(
          f'{e} (config.suggest.ranker_folds sets the fold generators\' '
          f'config.train.user_folds: move {os.path.dirname(learned.fold_workdir(workdir, k))} '
          'away to train them afresh)') from None
    if fold['interrupted']:
      return fold
  print(f'== [{parts}/{parts}] The learned ranker', flush=True)
  trained = inference.load_trained(config, workdir)
  if learned.LearnedRanker.is_current(workdir, trained, config):
    print(f'The learned ranker in {learned.ranker_dir(workdir)} is current.', flush=True)
  else:
    learned_training.fit(config, workdir)
  if jax.process_index() == 0:
    print(training_summary(summary, workdir), flush=True)
  return summary


def _train_one(config: ml_collections.ConfigDict, workdir: str) -> dict:
  summary = train_loop.train_and_evaluate(config, workdir)
  if not summary['interrupted'] and jax.process_index() == 0:
    print(training_summary(summary, workdir), flush=True)
  return summary


def learns_ranker(config: ml_collections.ConfigDict) -> bool:
  """Whether training makes a learned ranker: the strategy is 'learned' and the model is a
  generator trained on the session corpus."""
  task_class = tasks.task_class(config.model)
  return (config.suggest.strategy == 'learned'
          and not issubclass(task_class, (tasks.BringsOwnData, tasks.RankingTask)))


def training_summary(summary: dict, workdir: str) -> str:
  """The lines printed when training ends: the best checkpoint and the workdir's files."""
  workdir = os.path.abspath(workdir)
  step, total = summary['step'], summary['total_steps']
  # A workdir trained further by an earlier config than this one asks: no "step 300 of 100".
  lines = [f'Training done at step {step:,} of {total:,}.' if step <= total else
           f'Training done at step {step:,}, past the {total:,} this config trains (an earlier '
           'run trained further).']
  if summary.get('best_step') is not None:
    lines.append(f'Best checkpoint: step {summary["best_step"]:,}, validation loss '
                 f'{summary["best_valid_loss"]:.4f} (the one every later mode reads), in '
                 f'{checkpoints.checkpoint_dir(workdir)}')
  lines.append(f'The workdir, {workdir}:')
  for name in sorted(n for n in os.listdir(workdir) if not n.startswith('.')):
    shown = name + ('/' if os.path.isdir(os.path.join(workdir, name)) else '')
    lines.append(f'  {shown:<16} {WORKDIR_FILES.get(name, "")}'.rstrip())
  return '\n'.join(lines)


def run_all(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs every stage; returns the evaluation results, or {'stopped_by': signal name} when a
  signal stopped training (after a checkpoint)."""
  workdir = os.path.abspath(workdir)
  with train_loop.training_alone(workdir):
    print('== Preprocessing', flush=True)
    train_loop.prepare_corpus(config, workdir, verbose=True)
    print('== Training', flush=True)
    summary = train(config, workdir, preprocessed=True)
  if summary['interrupted']:
    print(f'Training was stopped at step {summary["step"]}; run the same command again to '
          'resume. Evaluation and report skipped.', flush=True)
    return {'stopped_by': summary['stopped_by']}
  print('== Evaluation', flush=True)
  results = evaluation.evaluate(config, workdir)
  if jax.process_index() != 0:
    return results
  if issubclass(tasks.task_class(config.model), tasks.BringsOwnData):  # its own measures, no report
    return results
  prefix = evaluation.results_prefix(config)
  results_path = os.path.join(workdir, 'eval', f'{prefix}results.json')
  if 'model' not in results['scores']:
    # A Cross-encoder cannot score the whole pool: it suggests only by reranking another
    # model's candidates, so its evaluation is the sampled protocols alone and there are no
    # suggestions of its own to show or report.
    print('No report: the model makes no suggestions of its own (a Cross-encoder reranks: '
          '--config.suggest.strategy=rerank); its figures are R@1/20 and R@1/100 above.\n'
          f'\nCheckpoints: {checkpoints.checkpoint_dir(workdir)} (best: step {results["step"]})'
          f'\nResults:     {results_path}', flush=True)
    return results
  samples = report.load_run(workdir, prefix).samples
  print_samples(samples)
  print('== Report', flush=True)
  report_path = report.write_report(config, workdir)  # config.report.workdirs, or this run
  print(f'\nCheckpoints: {checkpoints.checkpoint_dir(workdir)} (best: step {results["step"]})'
        f'\nResults:     {results_path}'
        f'\nReport:      {report_path}', flush=True)
  return results
