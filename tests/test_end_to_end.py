"""The whole system through its command line, on tiny configs: train, evaluate, decode files
(sessions and raw logs), interactive suggestions, the report, and the main job.

Two trained workdirs are shared by every test of the module: MTN made by `--mode=all`, and
the Transformer made by `--mode=train` then `--mode=eval` on two devices.
"""

import json
import re
import subprocess
import sys

import pytest

from mtn_jax.data import sessions
from mtn_jax.evaluation import metrics
from mtn_jax.evaluation import trivial
from tests import cli

pytestmark = pytest.mark.slow

RUN = ('--config.train.num_epochs=2', '--config.decode.top_k=3')
# Few session lengths, few batch shapes, few compilations: MTN sees sessions of 3 and 4
# queries (two buckets), the Transformer only sessions of 3. MTN's layers run under `nn.scan`,
# as the shipped configs' do (the tiny runs of other tests loop over them).
MTN = ('--config.data.max_session_queries=4', '--config.model.scan_layers=True')
TRANSFORMER = ('--config.data.max_session_queries=3',)
TRANSFORMER_CONFIG = 'configs/demo.py:transformer'
BLEU_LINE = r'BLEU = \d+\.\d\d, \d+\.\d/\d+\.\d/\d+\.\d/\d+\.\d'


@pytest.fixture(scope='module')
def mtn_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('mtn')
  return workdir, cli.run(workdir, *RUN, *MTN, mode='all')


@pytest.fixture(scope='module')
def transformer_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('transformer')
  # Trained and evaluated on two (simulated) devices; the main job re-evaluates it on one,
  # loading checkpoints saved with another device count.
  cli.run(workdir, *RUN, *TRANSFORMER, mode='train', config=TRANSFORMER_CONFIG, devices=2)
  return workdir, cli.run(workdir, *RUN, *TRANSFORMER, mode='eval', config=TRANSFORMER_CONFIG,
                          devices=2)


def vocabulary_words(workdir, count):
  """`count` ordinary words of the run's vocabulary (after the special tokens)."""
  words = json.loads((workdir / 'data' / 'vocab.json').read_text(encoding='utf-8'))['words']
  return words[5:5 + count]


def read_jsonl(path):
  return [json.loads(line) for line in path.read_text(encoding='utf-8').splitlines()]


def summary(stdout):
  """The machine-readable summary line that decoding prints last."""
  line = next(l for l in stdout.splitlines() if l.startswith('Summary: '))
  return json.loads(line[len('Summary: '):])


def assert_ranked(suggestions, top_k, vocabulary):
  assert len(suggestions) == top_k
  scores = [s['score'] for s in suggestions]
  assert scores == sorted(scores, reverse=True)
  assert len({s['query'] for s in suggestions}) == top_k  # beams are distinct
  for s in suggestions:
    assert set(s['query'].split()) <= vocabulary


def test_main_job_prints_paths_and_writes_the_report(mtn_run):
  workdir, result = mtn_run
  out = result.stdout
  for stage in ('== Preprocessing', '== Training', '== Evaluation', '== Report'):
    assert stage in out
  assert f'Checkpoints: {workdir / "checkpoints"}' in out
  assert f'Results:     {workdir / "eval" / "results.json"}' in out
  assert f'Report:      {workdir / "report" / "report.md"}' in out
  assert 'Sample suggestions' in out and ' -> ' in out
  results = json.loads((workdir / 'eval' / 'results.json').read_text())
  stats = json.loads((workdir / 'data' / 'stats.json').read_text())
  assert results['model'] == 'mtn' and results['pairs'] == stats['test']['pairs']
  for key in ('model', 'repeat_previous', 'most_frequent_next'):
    assert re.fullmatch(BLEU_LINE, results['scores'][key]['line'])
    assert results['scores'][key]['line'] in out
  assert f'{results["size_mb"]:.2f} MB (fp32)' in out
  report_md = (workdir / 'report' / 'report.md').read_text(encoding='utf-8')
  assert '| Model | Size (MB) | 1/2/3/4-gram | BLEU |' in report_md
  assert f'| MTN | {results["size_mb"]:.1f} |' in report_md
  assert '| Repeat previous query | - |' in report_md
  assert (workdir / 'report' / 'bleu.png').read_bytes()[:4] == b'\x89PNG'


def test_evaluation_samples_match_offline_decoding(mtn_run, tmp_path):
  # The evaluation decodes every position of a session in one pass; offline decoding of
  # the same prefixes, one context per line, must suggest the same queries with the same
  # scores, also with the scanned layers' parameters read into a loop over the layers.
  workdir, _ = mtn_run
  samples = read_jsonl(workdir / 'eval' / 'samples.jsonl')
  assert len(samples) == min(50, json.loads((workdir / 'eval' / 'results.json').read_text())[
      'pairs'])
  sessions_file = tmp_path / 'prefixes.tsv'
  sessions_file.write_text(''.join('\t'.join(s['context']) + '\n' for s in samples),
                           encoding='utf-8')
  output = tmp_path / 'prefixes.jsonl'
  cli.run(workdir, *RUN, *MTN, f'--config.decode.input={sessions_file}',
          f'--config.decode.output={output}', '--config.model.scan_layers=False', mode='decode')
  records = read_jsonl(output)
  assert [r['context'] for r in records] == [s['context'] for s in samples]
  for record, sample in zip(records, samples):
    assert [s['query'] for s in record['suggestions']] == [
        s['query'] for s in sample['suggestions']]
    assert [s['score'] for s in record['suggestions']] == pytest.approx(
        [s['score'] for s in sample['suggestions']], abs=1e-4)
    assert sample['predicted'] == sample['suggestions'][0]['query']


def test_a_checkpoint_of_scanned_layers_decodes_with_its_layers_in_a_loop(mtn_run):
  """Inference runs a model's layer stacks as a Python loop whatever layout it was trained in
  (under `nn.scan` a search would slice each layer's weights out of the stack at every step):
  the scanned checkpoint's parameters are read into one parameter set per layer."""
  from mtn_jax import inference  # pylint: disable=g-import-not-at-top
  from mtn_jax.training import checkpoints  # pylint: disable=g-import-not-at-top
  workdir, _ = mtn_run
  trained = inference.load_trained(cli.config(*MTN), str(workdir))
  assert checkpoints.saved_scan_layers(trained.meta) is True
  assert trained.task.cfg.scan_layers is False
  decoder = trained.params['decoder']['stack']
  assert set(decoder) == {f'layers_{i}' for i in range(trained.task.cfg.decoder_layers)}


def test_eval_on_the_validation_split_leaves_the_test_results_alone(mtn_run):
  # Tuning decoding on the validation split must neither read nor overwrite the test results.
  workdir, _ = mtn_run
  test_results = (workdir / 'eval' / 'results.json').read_bytes()
  result = cli.run(workdir, *RUN, *MTN, '--config.decode.eval_split=valid', mode='eval')
  assert (workdir / 'eval' / 'results.json').read_bytes() == test_results
  valid = json.loads((workdir / 'eval' / 'valid_results.json').read_text())
  stats = json.loads((workdir / 'data' / 'stats.json').read_text())
  assert valid['split'] == 'valid' and valid['pairs'] == stats['valid']['pairs']
  assert f'on {valid["pairs"]:,} valid pairs' in result.stdout
  # The trivial suggester's line is that of the validation split's own pairs.
  previous, references = sessions.load_split(workdir / 'data', 'valid').pair_texts()
  expected = str(metrics.bleu(trivial.repeat_previous(previous), references))
  assert valid['scores']['repeat_previous']['line'] == expected
  assert expected in result.stdout
  samples = read_jsonl(workdir / 'eval' / 'valid_samples.jsonl')
  assert len(samples) == min(50, valid['pairs'])


@pytest.fixture(params=['mtn', 'transformer'])
def trained(request, mtn_run, transformer_run):
  if request.param == 'mtn':
    return mtn_run[0], MTN, 'configs/demo.py'
  return transformer_run[0], TRANSFORMER, TRANSFORMER_CONFIG


def test_decode_sessions_file_counts_and_ranks(trained, tmp_path):
  workdir, overrides, config = trained
  w = vocabulary_words(workdir, 5)
  lines = [
      f'\ufeff{w[0]} {w[1]}\t{w[2]}'.encode(),  # 1, after a byte-order mark
      b'',  # 2: empty
      # 3: a Latin-1 query (an OOV word) beside a UTF-8 one (another), an empty query
      f'{w[0]} '.encode() + b'caf\xe9\t' + f'{w[1]} na\u00efve\t\t{w[3]}'.encode(),
      ' '.join([w[0]] * 12).encode(),  # 4: 12 words, cut to 10
      '\t'.join([w[4]] * 20).encode(),  # 5: 20 queries, the model's table holds 16
      b' \t ',  # 6: blanks only
  ]
  input_file = tmp_path / 'sessions.tsv'
  input_file.write_bytes(b'\n'.join(lines) + b'\n')
  output = tmp_path / 'out' / 'suggestions.jsonl'
  result = cli.run(workdir, *RUN, *overrides, f'--config.decode.input={input_file}',
                   f'--config.decode.output={output}', mode='decode', config=config)
  counts = summary(result.stdout)
  assert {k: counts[k] for k in ('format', 'sessions', 'suggestion_points', 'empty_lines',
                                 'empty_queries', 'oov_words', 'long_queries',
                                 'long_sessions', 'latin1_lines')} == {
      'format': 'sessions', 'sessions': 4, 'suggestion_points': 4, 'empty_lines': 2,
      'empty_queries': 1, 'oov_words': 2, 'long_queries': 1, 'long_sessions': 1,
      'latin1_lines': 1}
  assert '2 empty lines skipped' in result.stdout
  assert '2 words outside the vocabulary became <unk>' in result.stdout
  records = read_jsonl(output)
  assert [(r['line'], r['context']) for r in records] == [
      (1, [f'{w[0]} {w[1]}', w[2]]),
      (3, [f'{w[0]} caf\u00e9', f'{w[1]} na\u00efve', w[3]]),
      (4, [' '.join([w[0]] * 10)]),
      (5, [w[4]] * 16),
  ]
  vocabulary = set(json.loads((workdir / 'data' / 'vocab.json').read_text())['words'])
  for record in records:
    assert_ranked(record['suggestions'], 3, vocabulary)


def test_decode_raw_log_suggests_after_every_query(mtn_run, tmp_path):
  workdir, _ = mtn_run
  w = vocabulary_words(workdir, 4)
  log = tmp_path / 'log.tsv'
  log.write_text(
      '\ufeffAnonID\tQuery\tQueryTime\tItemRank\tClickURL\n'  # after a byte-order mark
      f'11\t{w[0]}\t2006-03-01 10:00:00\t\t\n'
      '\n'  # a blank line: skipped, counted, no malformed line even with data.strict
      f'11\t{w[0]}\t2006-03-01 10:00:20\t1\thttp://www.example.com\n'  # click repeat
      f'11\t{w[1]} {w[2]}\t2006-03-01 10:03:00\t\t\n'
      f'11\t{" ".join([w[3]] * 11)}\t2006-03-01 10:09:00\t\t\n'  # 11 words
      f'12\t{w[2]}\t2006-03-02 08:00:00\t\t\n'
      f'11\t{w[1]}\t2006-03-01 10:39:00\t\t\n',  # 30 minutes later: a new session
      encoding='utf-8')
  output = tmp_path / 'log.jsonl'
  result = cli.run(workdir, *RUN, *MTN, f'--config.decode.input={log}',
                   f'--config.decode.output={output}', '--config.data.strict=True',
                   '--config.data.session_gap_minutes=29', mode='decode')
  counts = summary(result.stdout)
  # A gap other than the corpus's (the same sessions here): the note says the log is read
  # with it.
  assert ('config.data.session_gap_minutes: 30.0 there, 29.0 here): its corpus and model stay '
          'as they were built and trained; these settings apply only to what this run reads '
          "itself (a log given to decode, a user's past).") in result.stdout
  assert counts['format'] == 'raw' and counts['sessions'] == 3
  assert counts['duplicate_queries'] == 1 and counts['long_queries'] == 1
  assert counts['skipped_header'] == 1 and counts['empty_lines'] == 1
  assert counts['lines_read'] == 8
  long_query = ' '.join([w[3]] * 10)
  records = read_jsonl(output)
  assert [(r['user'], r['session'], r['position'], r['context'], r['reference'])
          for r in records] == [
      (11, 0, 0, [w[0]], f'{w[1]} {w[2]}'),
      (11, 0, 1, [w[0], f'{w[1]} {w[2]}'], long_query),
      (11, 0, 2, [w[0], f'{w[1]} {w[2]}', long_query], None),
      (11, 1, 0, [w[1]], None),
      (12, 2, 0, [w[2]], None),
  ]


def test_interactive_suggestions_from_piped_stdin(mtn_run):
  workdir, _ = mtn_run
  w = vocabulary_words(workdir, 4)
  # An arrow key's escape sequence is not read as a query; a query that is not UTF-8 is read
  # as Latin-1 (as decode reads it), the lines before it kept.
  typed = f'{w[0]}\n\x1b[A\n{w[1]} {w[2]}\n\n{w[3]} '.encode() + b'caf\xe9\n'
  result = cli.run(workdir, *RUN, *MTN, mode='suggest', stdin=typed)
  heads = re.findall(r'^after (.*):$', result.stdout, re.M)
  # The new session starts afresh and notes the unknown word.
  assert heads == [w[0], f'{w[0]} | {w[1]} {w[2]}',
                   f'{w[3]} caf\u00e9 (1 word(s) outside the vocabulary read as <unk>; not '
                   'UTF-8: read as Latin-1)']
  assert ('not read: the query holds the control character U+001B (an arrow or function '
          'key?); type it again') in result.stdout
  assert result.stdout.count('-- new session --') == 1
  # By default suggest shows what the service shows (the user-facing protocol), and says so.
  assert 'the user-facing protocol' in result.stdout.splitlines()[0]
  typed_so_far = ([w[0]], [w[0], f'{w[1]} {w[2]}'], [f'{w[3]} <unk>', f'{w[3]} caf\u00e9'])
  blocks = re.split(r'^after .*:$', result.stdout, flags=re.M)[1:]
  for block, session in zip(blocks, typed_so_far, strict=True):
    shown = re.findall(r'^  \d\. (.*)  \((-?\d+\.\d+)\)$', block, re.M)
    scores = [float(score) for _, score in shown]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)
    assert not {query for query, _ in shown} & set(session), (session, shown)


def test_interactive_scores_every_suggestion_with_the_aol_small_decode_settings(mtn_run):
  """configs/aol.py:small's decode settings (beam 10, MBR with the session's queries among
  the candidates) put session queries, which the model did not propose, among the
  suggestions: each still has a score (its expected BLEU, the list's order), and typing a
  session never crashes on one."""
  from configs import aol
  workdir, _ = mtn_run
  small = aol.get_config('small').decode
  assert small.mbr == 'beam+session'  # what this test is about
  decode = [f'--config.decode.{key}={small[key]}'
            for key in ('beam_size', 'top_k', 'length_penalty', 'block_repeats', 'mbr')]
  decode.append('--config.decode.exclude_session_queries=false')  # the paper's: they may show
  w = vocabulary_words(workdir, 6)
  typed = f'{w[0]}\n{w[1]} {w[2]}\n{w[0]}\n{w[3]} {w[4]}\n{w[5]}\n'
  result = cli.run(workdir, *RUN, *MTN, *decode, mode='suggest', stdin=typed)
  assert 'score = expected BLEU (MBR)' in result.stdout
  assert 'the paper\'s protocol' in result.stdout.splitlines()[0]
  blocks = re.split(r'^after .*:$', result.stdout, flags=re.M)[1:]
  assert len(blocks) == 5
  session_queries_shown = 0
  for block in blocks:
    # "  1. query  (expected BLEU; model its log-probability)": a session query MBR added
    # has no log-probability of the model's.
    lines = re.findall(r'^  \d+\. (.*)  \((-?\d+\.\d+)(?:; model (-?\d+\.\d+))?\)$', block,
                       re.M)
    assert len(lines) == len(re.findall(r'^  \d+\. ', block, re.M)) > 0
    scores = [float(score) for _, score, _ in lines]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert all(float(model) <= 0 for _, _, model in lines if model)
    assert any(model for _, _, model in lines)
    session_queries_shown += sum(q in (w[0], f'{w[1]} {w[2]}', f'{w[3]} {w[4]}', w[5])
                                 for q, _, _ in lines)
  assert session_queries_shown > 0  # the case that crashed is met


def test_report_over_both_models(mtn_run, transformer_run, tmp_path):
  (mtn_dir, _), (transformer_dir, eval_result) = mtn_run, transformer_run
  # The model's label carries its layer counts: 'Transformer (1Q enc, 1 dec)'.
  assert re.search(r'Transformer \(1Q enc, 1 dec\)\s+' + BLEU_LINE, eval_result.stdout)
  out_dir = tmp_path / 'report'
  cli.run(mtn_dir, *RUN, *MTN, f'--config.report.workdirs={mtn_dir},{transformer_dir}',
          f'--config.report.output={out_dir}', mode='report')
  text = (out_dir / 'report.md').read_text(encoding='utf-8')
  transformer = json.loads((transformer_dir / 'eval' / 'results.json').read_text())
  bleu = transformer['scores']['model']
  assert (f'| Transformer | {transformer["size_mb"]:.1f} | '
          + '/'.join(f'{p:.1f}' for p in bleu['precisions']) + f' | {bleu["bleu"]:.2f} |'
          in text)
  assert '| MTN |' in text and '## Sample suggestions: Transformer' in text
  assert (out_dir / 'bleu.png').exists() and not (out_dir / 'layers.png').exists()


def test_eval_decode_suggest_and_benchmarks_refuse_another_model_config(mtn_run, tmp_path):
  """A run is evaluated, decoded and suggested from with the model config it was trained
  with, as training resumes only under it: another one (another config file, or an override)
  is refused in one line, exit code 1, before anything is written. The decoding settings, the
  model's runtime fields (its layer layout) and other models' fields are free to differ."""
  workdir, _ = mtn_run
  results = (workdir / 'eval' / 'results.json').read_bytes()
  input_file = tmp_path / 'one.tsv'
  input_file.write_text('a\tb\n', encoding='utf-8')
  output = tmp_path / 'out.jsonl'
  decode = (f'--config.decode.input={input_file}', f'--config.decode.output={output}')
  # configs/aol.py:small, sized as the tiny runs (cli.TINY), copies from the session.
  other_file = cli.run(workdir, config='configs/aol.py:small', mode='eval', check=False)
  overridden = [cli.run(workdir, *RUN, *MTN, '--config.model.d_model=32', *decode,
                        mode='decode', check=False),
                cli.run(workdir, *RUN, *MTN, '--config.model.d_model=32', mode='suggest',
                        stdin='a\n', check=False)]
  for refused in (other_file, *overridden):
    assert refused.returncode == 1, refused.stderr[-3000:]
    [line] = refused.stderr.strip().splitlines()
    assert re.fullmatch(r'error: checkpoint \S+ holds another model \(.*\): use the config it '
                        r'was trained with, or a new workdir', line), line
  assert 'model.copy: checkpoint False vs config True' in other_file.stderr
  # A benchmark of the run measures its model or none, refused as the command line refuses.
  bench = subprocess.run(
      [sys.executable, 'launch/bench_decode.py', '--config=configs/demo.py', *cli.tiny(), *MTN,
       '--config.model.d_model=32', f'--workdir={workdir}', '--repeats=1'],
      cwd=cli.REPO, env=cli.env(), capture_output=True, text=True, timeout=300, check=False)
  for refused in (*overridden, bench):
    assert 'holds another model (model.d_model: checkpoint 16 vs config 32)' in refused.stderr
  assert bench.returncode == 1 and bench.stderr.strip().splitlines()[-1].startswith(
      'error: checkpoint '), bench.stderr[-3000:]
  assert (workdir / 'eval' / 'results.json').read_bytes() == results
  assert not output.exists()
  result = cli.run(workdir, *RUN, *MTN, '--config.model.dropout=0.2',
                   '--config.model.scan_layers=False', '--config.decode.beam_size=4',
                   '--config.decode.top_k=2', *decode, mode='decode')
  assert 'Traceback' not in result.stderr and 'differs' not in result.stdout
  [record] = read_jsonl(output)
  assert len(record['suggestions']) == 2


def test_report_of_its_own_workdir_by_default(mtn_run, tmp_path):
  workdir, _ = mtn_run
  out_dir = tmp_path / 'report'
  cli.run(workdir, *RUN, *MTN, f'--config.report.output={out_dir}', mode='report')
  text = (out_dir / 'report.md').read_text(encoding='utf-8')
  results = json.loads((workdir / 'eval' / 'results.json').read_text())
  # One run of a model: the label is its name; layer counts tell runs of one model apart.
  assert f'| MTN | {results["size_mb"]:.1f} |' in text
  assert '## Sample suggestions: MTN' in text


def test_main_job_again_resumes_and_redoes_eval_and_report(mtn_run, transformer_run):
  workdir, _ = transformer_run
  before = json.loads((workdir / 'eval' / 'results.json').read_text())
  samples_before = read_jsonl(workdir / 'eval' / 'samples.jsonl')
  steps = [r['step'] for r in read_jsonl(workdir / 'metrics.jsonl') if r['kind'] == 'train']
  # The report over the runs config.report.workdirs lists, as --mode=report's.
  result = cli.run(workdir, *RUN, *TRANSFORMER, f'--config.report.workdirs={mtn_run[0]},{workdir}',
                   mode='all', config=TRANSFORMER_CONFIG)
  assert 'Reusing the corpus' in result.stdout
  assert 'Training is already complete' in result.stdout
  assert [r['step'] for r in read_jsonl(workdir / 'metrics.jsonl')
          if r['kind'] == 'train'] == steps  # no step trained twice
  text = (workdir / 'report' / 'report.md').read_text(encoding='utf-8')
  assert '| MTN |' in text and '| Transformer |' in text
  # The evaluation on one device equals the one on two.
  after = json.loads((workdir / 'eval' / 'results.json').read_text())
  assert before['devices'] == '2 x cpu' and after['devices'] == '1 x cpu'
  assert after['scores'] == before['scores'] and after['step'] == before['step']
  samples_after = read_jsonl(workdir / 'eval' / 'samples.jsonl')
  assert [(s['context'], s['predicted']) for s in samples_after] == [
      (s['context'], s['predicted']) for s in samples_before]
  for a, b in zip(samples_after, samples_before):
    assert [s['score'] for s in a['suggestions']] == pytest.approx(
        [s['score'] for s in b['suggestions']], abs=1e-4)


@pytest.mark.slow
def test_decode_keeps_its_programs_in_the_workdir_and_a_later_run_reads_them_back(mtn_run,
                                                                                tmp_path):
  """Without a compilation cache of the process's own, decode keeps what it compiles in the
  workdir's (config.serve.compile_cache): the second run of the same decode reads its search
  back, adds no program, and writes the same suggestions."""
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  shutil.copytree(mtn_run[0], workdir, ignore=shutil.ignore_patterns('serve'))
  w = vocabulary_words(workdir, 2)
  sessions_file = tmp_path / 'sessions.txt'
  sessions_file.write_text(f'{w[0]}\t{w[1]}\n', encoding='utf-8')
  own_cache = {k: v for k, v in cli.env().items() if k != 'JAX_COMPILATION_CACHE_DIR'}
  own_cache['JAX_DEBUG_LOG_MODULES'] = 'jax._src.compiler'  # logs each program read back
  cache = workdir / 'serve' / 'compile_cache'
  hit = "Persistent compilation cache hit for 'jit_beam_search'"
  kept, outputs = [], []
  for run in range(2):
    output = tmp_path / f'out{run}.jsonl'
    result = subprocess.run(
        cli.command(workdir, *RUN, *MTN, f'--config.decode.input={sessions_file}',
                    f'--config.decode.output={output}', mode='decode'),
        cwd=cli.REPO, env=own_cache, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (hit in result.stderr) == (run == 1), result.stderr[-3000:]
    kept.append(sorted(p.name for p in cache.iterdir()))
    outputs.append(output.read_text(encoding='utf-8'))
  assert kept[0] and kept[1] == kept[0]
  assert outputs[1] == outputs[0]


def test_decode_of_a_file_whose_every_line_is_skipped_is_refused_as_an_empty_one(mtn_run,
                                                                                tmp_path):
  workdir, _ = mtn_run
  input_file = tmp_path / 'bad.tsv'
  input_file.write_bytes(b'a\x1b[A\tb\n' * 3 + b'\n')  # typed escape sequences, a blank line
  output = tmp_path / 'new' / 'out.jsonl'
  result = cli.run(workdir, *RUN, *MTN, f'--config.decode.input={input_file}',
                   f'--config.decode.output={output}', mode='decode', check=False)
  assert result.returncode == 1
  [line] = result.stderr.strip().splitlines()
  assert line == (f'error: {input_file}: no session to decode (every line was skipped: '
                  '3 control_character_lines, 1 empty_lines)'), line
  assert not (tmp_path / 'new').exists()


def test_a_loaded_model_runs_a_whole_batch_on_one_device_and_a_split_one_on_all(
    transformer_run):
  """On two devices: the parameters of a loaded model are on one, so a batch given whole runs
  there once (replicated, every device would compute all of it); an evaluation that splits
  its batches has them on both."""
  workdir, _ = transformer_run
  code = ('import jax; from mtn_jax import inference; from mtn_jax.inference import sources; '
          'from tests import cli; '
          f'config = cli.config(*{TRANSFORMER!r}, name="demo:transformer"); '
          f'trained = inference.load_trained(config, {str(workdir)!r}); '
          'split = sources.Generate(trained, None).on_local_devices(); '
          'on = lambda params: len({d for x in jax.tree.leaves(params) for d in x.devices()}); '
          'print(jax.local_device_count(), on(trained.params), on(split.trained.params))')
  ran = subprocess.run([sys.executable, '-c', code], env=cli.env(devices=2), cwd=cli.REPO,
                       capture_output=True, text=True, timeout=120, check=True)
  assert ran.stdout.split()[-3:] == ['2', '1', '2'], ran.stdout + ran.stderr
