"""Workdirs written before the role packages still load, evaluate and decode.

The run is made by the code of the last commit before the restructuring (its own command
line, from `git archive`), then read by today's: the same suggestions, the same figures.
"""

import json
import os
import subprocess
import sys

import pytest

from tests import cli

pytestmark = pytest.mark.slow

BEFORE_THE_MOVE = '19c772c'  # main as it was before mtn_jax/ became role packages


@pytest.fixture(scope='module')
def old_code(tmp_path_factory):
  folder = tmp_path_factory.mktemp('old_code')
  archive = subprocess.run(['git', 'archive', '--format=tar', BEFORE_THE_MOVE], cwd=cli.REPO,
                           capture_output=True)
  if archive.returncode != 0:  # a clone without history: nothing to compare against
    message = (f'commit {BEFORE_THE_MOVE} is not in this clone (a shallow one? `git fetch '
               f'--unshallow` brings it): {archive.stderr[-200:]!r}')
    if os.environ.get('CI'):  # CI clones main whole: the commit is there, or CI is broken
      pytest.fail(message)
    pytest.skip(message)
  subprocess.run(['tar', '-x', '-C', str(folder)], input=archive.stdout, check=True)
  return folder


def run(code, workdir, *overrides, mode):
  """The command line of the code in folder `code` (today's: through `cli.run`)."""
  if code == cli.REPO:
    return cli.run(workdir, *overrides, mode=mode)
  result = subprocess.run(
      [sys.executable, '-m', 'mtn_jax.main', '--config=configs/demo.py',
       f'--workdir={workdir}', f'--mode={mode}', *cli.TINY, *overrides],
      cwd=code, env=cli.env(), capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


def test_a_workdir_of_the_old_code_decodes_and_evaluates_alike(old_code, tmp_path):
  workdir = tmp_path / 'run'
  sessions = tmp_path / 'sessions.txt'
  settings = ('--config.train.max_steps=3', '--config.decode.top_k=3',
              '--config.decode.max_eval_sessions=20', f'--config.decode.input={sessions}')
  run(old_code, workdir, *settings, mode='train')
  words = json.loads((workdir / 'data' / 'vocab.json').read_text())['words'][5:11]
  sessions.write_text(f'{words[0]}\t{words[1]} {words[2]}\n{words[3]}\n{words[4]}\t{words[5]}\n')
  old_decode = tmp_path / 'old.jsonl'
  run(old_code, workdir, *settings, f'--config.decode.output={old_decode}', mode='decode')
  old_results = run(old_code, workdir, *settings, mode='eval')
  old_figures = json.loads((workdir / 'eval' / 'results.json').read_text())

  new_decode = tmp_path / 'new.jsonl'
  run(cli.REPO, workdir, *settings, f'--config.decode.output={new_decode}', mode='decode')
  run(cli.REPO, workdir, *settings, mode='eval')
  # Today's code files an evaluation of the first sessions apart from the whole split's.
  new_figures = json.loads((workdir / 'eval' / 'first20_results.json').read_text())
  old_lines = [json.loads(l) for l in old_decode.read_text().splitlines()]
  new_lines = [json.loads(l) for l in new_decode.read_text().splitlines()]
  assert [r['context'] for r in new_lines] == [r['context'] for r in old_lines]
  for new, old in zip(new_lines, old_lines):
    assert [s['query'] for s in new['suggestions']] == [s['query'] for s in old['suggestions']]
    assert [s['score'] for s in new['suggestions']] == pytest.approx(
        [s['score'] for s in old['suggestions']], abs=1e-4)
  # The paper's protocol is scored on the same lists as before.
  assert new_figures['step'] == old_figures['step']
  for name in ('model', 'repeat_previous', 'most_frequent_next'):
    assert new_figures['scores'][name]['line'] == old_figures['scores'][name]['line']
    old_ranking = old_figures['scores'][name]['ranking']
    new_ranking = {k: new_figures['scores'][name]['ranking'][k] for k in old_ranking}
    assert new_ranking == pytest.approx(old_ranking, abs=1e-9)
  assert 'BLEU' in old_results.stdout and os.path.isdir(workdir / 'checkpoints')
