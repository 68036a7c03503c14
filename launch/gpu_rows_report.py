"""rows.md and rows.json from the rows `launch/gpu_rows.sh` ran: a table per row, with the
device, the date and each command; a row that failed or was skipped says so.

  python launch/gpu_rows_report.py --work=/tmp/gpu_rows --out=OUTDIR
"""

from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from configs import aol  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORK = flags.DEFINE_string('work', '/tmp/gpu_rows', "gpu_rows.sh's work folder.")
_OUT = flags.DEFINE_string('out', None, 'Where rows.md and rows.json go.')
_BUDGET = flags.DEFINE_integer('budget', 0, 'The run\'s budget, seconds.')
_REHEARSE = flags.DEFINE_integer('rehearse', 0, '1: a rehearsal on a CPU (tiny sizes).')

# Issue 45's acceptance, on an H100 in bfloat16.
TARGET_MFU, TARGET_PEER, TARGET_TAIL, TARGET_MINUTES = 0.25, 2.0, 2.5, 20.0


def load(name: str) -> dict | None:
  try:
    with open(os.path.join(_WORK.value, name + '.json'), encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def steps() -> dict[str, dict]:
  rows = {}
  try:
    with open(os.path.join(_WORK.value, 'steps.tsv'), encoding='utf-8') as f:
      for line in f:
        name, rc, seconds, limit, command = line.rstrip('\n').split('\t', 4)
        rows[name] = {'status': rc, 'seconds': int(seconds), 'limit': int(limit),
                      'command': command}
  except OSError:
    pass
  return rows


def status(runs: dict[str, dict], name: str) -> str:
  run = runs.get(name)
  if run is None:
    return 'not run'
  if run['status'] in ('skipped', 'kept'):
    return run['status']
  if run['status'] == '0':
    return f'ok, {run["seconds"]} s'
  if run['status'] == '124':
    return f'timed out after {run["seconds"]} s'
  return f'failed (exit {run["status"]}) after {run["seconds"]} s'


def command(runs, name: str) -> str:
  run = runs.get(name)
  return f'\n```\n{run["command"].replace(_WORK.value, "$WORK")}\n```\n' if run else '\n'


def pct(x) -> str:
  return f'{x:.1%}' if isinstance(x, (int, float)) else 'n/a'


def verdict(ok: bool | None) -> str:
  if _REHEARSE.value:
    return 'not judged in a rehearsal'
  return 'n/a' if ok is None else ('**met**' if ok else '**not met**')


def section_a(md, runs, summary):
  md.append('## (a) The `configs/aol.py` bfloat16 step, sessions of 4 queries')
  r = load('a_step')
  md.append(f'Status: {status(runs, "a_step")}.' + command(runs, 'a_step'))
  if r:
    t = r['train']
    j, mix = t['epoch_mix']['jax'], t['epoch_mix']
    bucket = next(iter(t['buckets'].values()))
    peer = mix.get('torch_compiled', {})
    ratio = mix.get('jax_over_torch_compiled')
    md.append('| step ms | pairs/s | MFU (executed FLOPs) | peak GiB | compile s | '
              'torch.compile peer ms | JAX / peer |')
    md.append('|---:|---:|---:|---:|---:|---:|---:|')
    md.append(f'| {j["step_s"] * 1e3:.2f} | {j["pairs_per_s"]:,.0f} | {pct(j["mfu"])} | '
              f'{t["memory"]["bytes"] / 2**30:.2f} | {bucket["compile_s"]:.1f} | '
              + (f'{peer["step_s"] * 1e3:.2f} | {ratio:.2f}x |' if ratio else 'n/a | n/a |'))
    md.append(f'\nTargets: MFU >= 25 %: {verdict(j["mfu"] >= TARGET_MFU if j["mfu"] else None)};'
              f' >= 2.0x the peer: {verdict(ratio >= TARGET_PEER if ratio else None)}. '
              f'{j["flops_per_step"]:.3e} executed FLOPs per step, against '
              + (f'{t["peak_flops_per_device"]:.3g} FLOP/s peak.\n'
                 if t['peak_flops_per_device'] else 'no known peak.\n'))
    summary['a_step'] = {'step_ms': j['step_s'] * 1e3, 'pairs_per_s': j['pairs_per_s'],
                         'mfu': j['mfu'], 'jax_over_torch_compiled': ratio,
                         'peer_step_ms': peer.get('step_s', 0) * 1e3 or None}
  p = load('a_profile')
  md.append(f'Kernel profile: {status(runs, "a_profile")}.' + command(runs, 'a_profile'))
  if p:
    prof = p['profile']
    total = sum(prof['kinds_us'].values()) or 1.0
    md.append(f'Wall {prof["wall_step_s"] * 1e3:.2f} ms a step; kernels {total / 1e3:.2f} ms; '
              f'device idle {(prof["span_us"] - prof["busy_us"]) / 1e3:.2f} ms of '
              f'{prof["span_us"] / 1e3:.2f}.\n')
    md.append('| kernel kind | ms/step | share |')
    md.append('|---|---:|---:|')
    for kind, us in sorted(prof['kinds_us'].items(), key=lambda kv: -kv[1]):
      md.append(f'| {kind} | {us / 1e3:.2f} | {us / total:.1%} |')
    md.append('\n| top operations | ms/step | kind | shape |')
    md.append('|---|---:|---|---|')
    for op in prof['ops'][:10]:
      md.append(f'| `{op["op"][:48]}` | {op["us"] / 1e3:.2f} | {op["kind"]} | '
                f'`{op["shape"][:40]}` |')
    md.append('')
    summary['a_profile'] = {'kinds_ms': {k: v / 1e3 for k, v in prof['kinds_us'].items()},
                            'idle_ms': (prof['span_us'] - prof['busy_us']) / 1e3}
  v = load('a_vocab')
  md.append('A study, the vocabulary\'s rows padded to a multiple of 128 (else XLA pads the loss '
            f'head\'s operands on every step): {status(runs, "a_vocab")}.'
            + command(runs, 'a_vocab'))
  if v:
    padded_ms = v['train']['epoch_mix']['jax']['step_s'] * 1e3
    vocab_size = v['train']['model']['vocab_size']
    md.append('| vocabulary | step ms | padded step\'s speed-up |\n|---:|---:|---:|')
    speedup = None
    if r:
      base_ms = summary['a_step']['step_ms']
      speedup = base_ms / padded_ms
      md.append(f'| {r["train"]["model"]["vocab_size"]:,} (a_step) | {base_ms:.2f} | |')
    md.append(f'| {vocab_size:,} | {padded_ms:.2f} | '
              + (f'{speedup:.3f}x |\n' if speedup else 'n/a |\n'))
    summary['a_vocab'] = {'vocab_size': vocab_size, 'step_ms': padded_ms, 'speedup': speedup}


def section_bc(md, runs, summary):
  md.append('## (b) The loss head\'s gradient products in bfloat16 against XLA\'s kernels, '
            'and what the run learns')
  r = load('bc_kernels')
  md.append(f'Status: {status(runs, "bc_kernels")}.' + command(runs, 'bc_kernels'))
  if r:
    k = r['kernels']
    md.append(f'Batch {"x".join(map(str, k["shape"]))}, median of {k["repeats"]} runs of '
              f'{k["steps"]} steps, the variants alternating in one process.\n')
    md.append('| `config.model.kernels` | step ms | pairs/s | MFU | speed-up | compile s |')
    md.append('|---|---:|---:|---:|---:|---:|')
    for name, v in k['variants'].items():
      if 'error' in v:
        md.append(f'| {name} | failed: {v["error"][:160]} | | | | |')
        continue
      md.append(f'| {name} | {v["step_s"] * 1e3:.2f} | {v["pairs_per_s"]:,.0f} | '
                f'{pct(v["mfu"])} | {v["speedup_over_base"] or 0:.3f}x | '
                f'{v["compile_s"]:.1f} |')
    learning = k.get('learning')
    if learning and 'error' not in learning:
      md.append(f'\nLearning: {learning["steps"]} steps on the corpus\'s sessions of '
                f'{k["bucket"]} queries ({learning["sessions"]:,} sessions, '
                f'{learning["passes"]:.2f} passes), the same batches and initial state; '
                f'training loss, means of {learning["window"]} steps:\n')
      means = learning['window_means']
      width = len(next(iter(means.values())))
      md.append('| run | ' + ' | '.join(
          f'{(i + 1) * learning["window"]}' for i in range(width)) + ' |')
      md.append('|---|' + '---:|' * width)
      for name, values in means.items():
        md.append(f'| {name} | ' + ' | '.join(f'{m:.4f}' for m in values) + ' |')
      md.append(f'\nLargest gap of those means from the base run: bf16 head gradients '
                f'{learning["max_window_gap_bf16_head"]:.4f}, another seed '
                f'{learning["max_window_gap_other_seed"]:.4f} (mean gap per step '
                f'{learning["mean_step_gap_bf16_head"]:.4f} against '
                f'{learning["mean_step_gap_other_seed"]:.4f}).\n')
    elif learning:
      md.append(f'\nLearning: {learning["error"]}\n')
    summary['bc_kernels'] = {
        name: ({'error': v['error']} if 'error' in v else
               {'step_ms': v['step_s'] * 1e3, 'speedup': v['speedup_over_base'],
                'mfu': v['mfu']}) for name, v in k['variants'].items()}
    if learning and 'error' not in learning:
      summary['bc_learning'] = {key: learning[key] for key in (
          'max_window_gap_bf16_head', 'max_window_gap_other_seed', 'final_window')}


TAIL_VARIANTS = ('d_tail_workers2', 'd_tail_switch05')


def section_d(md, runs, summary):
  r = load('d_serve')
  served = ''
  if r:  # the strategy served: an override's, else configs/aol.py:small's own
    strategy = aol.get_config('small').suggest.strategy
    for setting in r.get('set', []):
      if setting.startswith('suggest.strategy='):
        strategy = setting.split('=', 1)[1]
    served = f', strategy {strategy!r}'
  md.append(f'## (d) The service on the GPU (`configs/aol.py:small`{served})')
  md.append(f'Workdir: {status(runs, "d_train")}.' + command(runs, 'd_train'))
  md.append(f'Load: {status(runs, "d_serve")}.' + command(runs, 'd_serve'))
  if not r:
    return
  md.append('| offered/s | sent | answered/s | p50 ms | p95 ms | p99 ms | by status | '
            'mean batch | batch run ms |')
  md.append('|---|---:|---:|---:|---:|---:|---|---:|---:|')
  for row in r['rows']:
    statuses = ', '.join(f'{k}: {v}' for k, v in sorted(row['statuses'].items()))
    md.append(f'| {row["rate"]} | {row["sent"]} | {row["throughput"]:.1f} | {row["p50"]:.1f} | '
              f'{row["p95"]:.1f} | {row["p99"]:.1f} | {statuses} | {row["mean_batch"]:.2f} | '
              f'{row["batch_ms"]:.1f} |')
  for o in r.get('offline', []):
    md.append(f'\nOffline decode, batches of {o["batch"]}: {o["rate"]:.1f} contexts/s; '
              f'saturation {r["saturation_per_s"]:.1f}/s = '
              f'{r["saturation_per_s"] / o["rate"]:.2f}x.')
  tail = r.get('tail')
  if tail:
    md.append(f'\nTail target: p99 at half saturation {tail["half_saturation_p99_ms"]:.1f} ms '
              f'/ lone p50 {tail["lone_p50_ms"]:.1f} ms = {tail["p99_over_lone_p50"]:.2f}x '
              f'(<= 2.5x: {verdict(tail["p99_over_lone_p50"] <= TARGET_TAIL)}).\n')
  summary['d_serve'] = {'saturation_per_s': r['saturation_per_s'],
                        'saturation_over_offline': r.get('saturation_over_offline'),
                        'tail': tail}
  variants = [(name, load(name)) for name in TAIL_VARIANTS if name in runs]
  if not variants:
    return
  md.append('A study of the tail, the service restarted for each variant: two workers at the '
            'rates above (their own saturation, and half of it), the lock handed over every '
            '0.5 ms at 5/s and at the half saturation above.\n')
  md.append('| variant | status | lone p50 ms | half saturation /s | p99 there ms | ratio | '
            'saturation /s | mean batch | batch run ms |')
  md.append('|---|---|---:|---:|---:|---:|---:|---:|---:|')
  summary['d_tail'] = {}
  default = f'd_serve ({r.get("serve", {}).get("workers", "?")} worker(s), 5 ms)'
  for name, v in [(default, r)] + variants:
    if not v or len(v.get('rows', [])) < 2:
      md.append(f'| {name} | {status(runs, name)} | | | | | | | |')
      continue
    lone, half = v['rows'][0], v['rows'][-1]
    ratio = half['p99'] / max(lone['p50'], 1e-9)
    saturation = (v.get('tail') or {}).get('saturation_per_s')
    summary['d_tail'][name] = {'lone_p50_ms': lone['p50'], 'half_rate': half['rate'],
                               'half_p99_ms': half['p99'], 'ratio': ratio,
                               'saturation_per_s': saturation}
    md.append(f'| {name} | {status(runs, name) if name in runs else "above"} | '
              f'{lone["p50"]:.1f} | {str(half["rate"]).split(",")[0]} | {half["p99"]:.1f} | '
              f'{ratio:.2f}x | {"" if saturation is None else f"{saturation:.1f}"} | '
              f'{half["mean_batch"]:.2f} | {half["batch_ms"]:.1f} |')
  md.append('')


def section_e(md, runs, summary):
  md.append('## (e) Ten times AOL: preprocessing and one epoch (projected)')
  pre = load('e_preprocess')
  md.append(f'Preprocessing of a 40th: {status(runs, "e_preprocess")}.'
            + command(runs, 'e_preprocess'))
  if pre:
    md.append(f'{pre["lines"]:,} lines in {pre["files"]} files ({pre["log_bytes"] / 2**20:.0f} '
              f'MiB), written in {pre["write_s"] or 0:.0f} s; prepared in '
              f'{pre["prepare_s"]:.1f} s ({pre["lines_per_s"]:,.0f} lines/s, {pre["readers"]} '
              f'readers), peak RSS {pre["peak_rss_gib"]["main"]:.2f} GiB main.\n')
  r = load('e_epoch')
  md.append(f'Epoch slice: {status(runs, "e_epoch")}.' + command(runs, 'e_epoch'))
  if not r:
    return
  e = r['epoch']
  s = e['slice']
  md.append('| | |')
  md.append('|---|---|')
  md.append(f'| split repeated | {e["repeat"]["times"]}x = {e["repeat"]["sessions"]:,} sessions, '
            f'{e["repeat"]["pairs"]:,} pairs |')
  md.append(f'| compile (every bucket, side by side) | {e["compile_wall_s"]:.1f} s |')
  md.append(f'| first batch (the epoch planned) | {e["first_batch_s"]:.2f} s |')
  md.append(f'| slice | {s["steps"]} steps, {s["step_s"] * 1e3:.2f} ms a step, '
            f'{s["pairs_per_s"]:,.0f} pairs/s |')
  md.append(f'| the same batches from the device | {s["compute_step_s"] * 1e3:.2f} ms a step: '
            f'the pipeline costs {s["input_overhead"]:+.1%} |')
  md.append(f'| host waiting in next() | median {s["next_wait_median_s"] * 1e3:.2f} ms, max '
            f'{s["next_wait_max_s"] * 1e3:.2f} ms |')
  md.append(f'| steps before which the device had nothing queued | {s["steps_device_idle"]} of '
            f'{s["steps"]} |')
  md.append(f'| projected epoch | {e["epoch"]["steps"]:,.0f} steps, {e["epoch"]["pairs"]:,.0f} '
            f'pairs: {e["epoch"]["seconds"] / 60:.1f} min |')
  if 'preprocess' in e:
    p = e['preprocess']
    total = e['projected_total_s'] / 60
    md.append(f'| projected preprocessing | {p["target_lines"]:,} lines: '
              f'{p["projected_s"] / 60:.1f} min, peak RSS about '
              f'{p["peak_rss_gib_main_projected"]:.0f} GiB |')
    md.append(f'| **projected preprocessing + epoch** | **{total:.1f} min** (< 20 min: '
              f'{verdict(total < TARGET_MINUTES)}, a projection) |')
  md.append('\nProjected linearly from the measured fraction; the epoch\'s validation and '
            'checkpoints are not counted.\n')
  summary['e_epoch'] = {'projected_total_min': e.get('projected_total_s', 0) / 60 or None,
                        'epoch_min': e['epoch']['seconds'] / 60,
                        'input_overhead': s['input_overhead'],
                        'steps_device_idle': s['steps_device_idle'], 'slice_steps': s['steps']}


def main(argv):
  del argv
  runs = steps()
  try:
    with open(os.path.join(_WORK.value, 'machine.txt'), encoding='utf-8') as f:
      machine = f.read().strip()
  except OSError:
    machine = 'unknown'
  md = ['# Issue 45: the GPU rows', '']
  if _REHEARSE.value:
    md.append('**A rehearsal on a CPU with tiny sizes: no figure here is a GPU row.**\n')
  md.append('Machine (date, kernel, cores, GPU, packages):\n')
  md.append('```\n' + machine + '\n```\n')
  md.append(f'Budget {_BUDGET.value} s. `$WORK` is the run\'s work folder.\n')
  md.append('| row | status | seconds | limit |')
  md.append('|---|---|---:|---:|')
  for name, run in runs.items():
    md.append(f'| {name} | {status(runs, name)} | {run["seconds"]} | {run["limit"]} |')
  md.append('')
  summary: dict = {'machine': machine, 'budget_s': _BUDGET.value,
                   'rehearsal': bool(_REHEARSE.value), 'runs': runs}
  for section in (section_a, section_bc, section_d, section_e):
    try:
      section(md, runs, summary)
    except Exception as e:  # pylint: disable=broad-except
      md.append(f'\n(this section could not be written: {type(e).__name__}: {e})\n')
  summary['raw'] = {name: load(name) for name in (
      'a_step', 'a_profile', 'a_vocab', 'bc_kernels', 'd_serve', *TAIL_VARIANTS,
      'e_preprocess', 'e_epoch', 'corpus')}
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, 'rows.md'), 'w', encoding='utf-8') as f:
    f.write('\n'.join(md) + '\n')
  with open(os.path.join(_OUT.value, 'rows.json'), 'w', encoding='utf-8') as f:
    json.dump(summary, f, indent=2, sort_keys=True, default=str)


if __name__ == '__main__':
  flags.mark_flags_as_required(['out'])
  app.run(main)
