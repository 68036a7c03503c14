"""The command line's modes (`--mode`), one function each, and what `--help` says of them.

Each function takes (config, workdir) and returns the signal that stopped training early
('SIGINT', 'SIGTERM') or None. Imports are per mode so that preprocessing does not pay for JAX
start-up. eval, decode, suggest and serve use the workdir's model with the config it was
trained with (`mtn_jax.inference.trained.check_config`); only the decoding settings may
change. The main job (`--mode=all`) and the steps it shares with train and eval:
`mtn_jax.main_job`.
"""


def preprocess(config, workdir):
  from mtn_jax.data import preprocess as preprocessing  # pylint: disable=g-import-not-at-top
  preprocessing.prepare(config, workdir, verbose=True)


def train(config, workdir):
  from mtn_jax import main_job  # pylint: disable=g-import-not-at-top
  return main_job.train(config, workdir)['stopped_by']


def _checked_workdir(config, workdir):
  """eval, decode and suggest: the workdir's model is the config's (`check_config`), and its
  compilation cache is used as the service's (said by the service alone: a run of a workdir
  never trained, or one JAX cannot write in, would otherwise print a folder that stays
  empty)."""
  from mtn_jax.inference import trained  # pylint: disable=g-import-not-at-top
  trained.check_config(config, workdir)
  trained.keep_compiled_programs(workdir, config.serve.compile_cache, lambda text: None)


def evaluate(config, workdir):
  from mtn_jax.evaluation import evaluate as evaluation  # pylint: disable=g-import-not-at-top
  _checked_workdir(config, workdir)
  evaluation.evaluate(config, workdir)


def decode(config, workdir):
  from mtn_jax.inference import suggest  # pylint: disable=g-import-not-at-top
  _checked_workdir(config, workdir)
  suggest.decode_file(config, workdir)


def interactive(config, workdir):
  from mtn_jax.inference import suggest  # pylint: disable=g-import-not-at-top
  _checked_workdir(config, workdir)
  suggest.interactive(config, workdir)


def serve(config, workdir):
  from mtn_jax.inference import trained  # pylint: disable=g-import-not-at-top
  from mtn_jax.serving import service  # pylint: disable=g-import-not-at-top
  trained.check_config(config, workdir)
  service.serve(config, workdir)


def report(config, workdir):
  from mtn_jax.evaluation import report as reporting  # pylint: disable=g-import-not-at-top
  reporting.write_report(config, workdir)


def run_all(config, workdir):
  from mtn_jax import main_job  # pylint: disable=g-import-not-at-top
  return main_job.run_all(config, workdir).get('stopped_by')


MODES = {'all': run_all, 'preprocess': preprocess, 'train': train, 'eval': evaluate,
         'decode': decode, 'suggest': interactive, 'serve': serve, 'report': report}
# The modes that share their work among the processes of `--distributed` (each reads its rows;
# process 0 alone writes). The others would each write the same files, or serve on one port.
MULTI_PROCESS_MODES = ('all', 'train', 'eval')


HELP = """\
  all (default)  preprocess -> train -> eval -> sample suggestions -> report
  preprocess     reads the raw log, writes <workdir>/data/ and prints a summary
  train          preprocesses where needed, then trains or resumes from the latest checkpoint
                 in the workdir (with config.suggest.strategy=learned, also the fold
                 generators and the learned ranker)
  eval           decodes config.decode.eval_split (test) with the best checkpoint: BLEU,
                 n-gram precision and ranking figures in <workdir>/eval/
  decode         offline suggestions for a file: --config.decode.input=FILE
                 [--config.decode.output=OUT.jsonl] (formats below)
  suggest        interactive: type a session's queries, see suggestions after each
  serve          an HTTP service of the best checkpoint (config.serve): POST /v1/suggest,
                 a page at /, /healthz, /readyz, /metrics, OpenAPI at /docs
  report         tables, charts and samples over --config.report.workdirs=A,B
                 (default: the --workdir alone)"""
