"""The demo rankers through the real command line: `configs/polyencoder_aol.py:demo` and
`:demo_bi`, with their own learning settings (learning rate, warm-up, d_model and so the
schedule's peak, scaled scores), rank the logged next query far above chance; `:demo_cross`
runs every stage of its default mode.

Before `config.model.scaled_scores`, both trained to exit 0 and learned nothing: the
candidate vectors collapsed to one, the validation loss stayed at chance and 8 queries were
the first suggestion of all 280 test pairs (docs/notes/2026-11-26-demo-rankers.md). Apart from
test_polyencoder_cli.py so that the two files run on two test workers."""

from __future__ import annotations

import json

import pytest

from tests import cli

# Fewer sessions and steps than the demo: 3-query sessions only (one bucket, one program to
# compile) of 1,200 users (3,144 training sessions; the test split's 166 pairs hold 94 next
# queries of the pool, so one pair is ~1 point) and 40 steps, into the warm-up (its peak is at
# step 50): with the plain dot product the demo's validation loss was at chance by step 30.
# Layer stacks as loops (see cli.TINY). The learning settings are the config's.
BRIEF = ('--config.data.demo_users=1200', '--config.data.max_session_queries=3',
         '--config.model.scan_layers=False', '--config.train.max_steps=40',
         '--config.train.log_every_steps=10')
CHANCE = 5.0  # R@1/20: the next query against 19 negatives drawn from the pool


def read_jsonl(path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize('variant', ['demo', 'demo_bi'])
def test_demo_ranker_ranks_the_next_query_far_above_chance(variant, tmp_path):
  config = f'configs/polyencoder_aol.py:{variant}'
  run = lambda mode: cli.run(tmp_path, *BRIEF, mode=mode, config=config, with_tiny=False)
  run('train')
  run('eval')
  results = json.loads((tmp_path / 'eval' / 'results.json').read_text())
  pool = results['pool']
  assert pool['pairs_in_pool'] >= 80, pool
  assert pool['r1_of_20'] >= 5 * CHANCE, pool
  # Sessions get their own suggestions (the collapsed model gave most of them one query).
  firsts = [pair['suggestions'][0]['query']
            for pair in read_jsonl(tmp_path / 'eval' / 'lists.jsonl')]
  assert len(firsts) == pool['pairs'] and len(set(firsts)) >= len(firsts) // 2, firsts


@pytest.mark.slow
def test_demo_cross_encoder_runs_every_stage_and_exits_0(tmp_path):
  """The default mode of `:demo_cross`: a Cross-encoder makes no suggestions of its own (it
  reranks), so after its evaluation (R@1/20 and R@1/100) there is nothing to report, and the
  run ends there instead of failing on the report."""
  result = cli.run(tmp_path, '--config.train.max_steps=2', '--config.decode.max_eval_sessions=8',
                   mode='all', config='configs/polyencoder_aol.py:demo_cross')
  assert 'R@1/20' in result.stdout and 'No report' in result.stdout
  pool = json.loads((tmp_path / 'eval' / 'first8_results.json').read_text())['pool']
  # Percentages of the pairs in the pool: a whole number of them ranked first. R@1/100's
  # negatives hold R@1/20's, so it is never the higher.
  hits = pool['r1_of_20'] * pool['pairs_in_pool'] / 100
  assert pool['pairs_in_pool'] > 0 and hits == pytest.approx(round(hits)), pool
  assert 0 <= pool['r1_of_100'] <= pool['r1_of_20'] <= 100, pool
  assert f'R@1/20 {pool["r1_of_20"]:.1f}' in result.stdout
  # Said for what it is: pairs scored against sampled entries, not suggestions over the pool.
  assert 'the next query scored against sampled pool entries (it makes no suggestions)' in (
      result.stdout)
  assert f'{pool["pairs"]} pairs scored in ' in result.stdout
  assert 'Against sampled pool entries: R@1/20' in result.stdout
  assert 'suggestions in' not in result.stdout and 'whole pool' not in result.stdout
  assert not (tmp_path / 'report').exists()
  # decode (as suggest and serve) is a generator's: one line says where it serves instead.
  sessions_file = tmp_path / 'sessions.txt'
  sessions_file.write_text('weather\tweather chicago\n')
  refused = cli.run(tmp_path, f'--config.decode.input={sessions_file}', mode='decode',
                    config='configs/polyencoder_aol.py:demo_cross', check=False)
  assert refused.returncode == 1 and refused.stderr.count('\n') == 1, refused.stderr
  assert ("holds a 'crossencoder' model, which scores given candidates and suggests nothing "
          'itself') in refused.stderr
