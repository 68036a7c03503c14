"""Where the time of a train step goes: a jax.profiler trace, summed by part of the model.

  python launch/profile_step.py --config=configs/demo.py
  python launch/profile_step.py --config=configs/aol.py --bucket=4 --steps=3 --top=30

In: the flags of `launch/bench_train.py` that shape a step (`--config`, `--vocab_size`,
`--batch_queries`, `--steps`, `--seed`) and `--bucket` (the session length of the batch).
The step is `bench_train.JaxStep`, the trainer's jit-compiled `train.train_step`, compiled
and run once before `--steps` traced steps.

Out (stdout): the step's wall time, then the traced time of the compiled program's operations
(self time: a loop's time excludes the operations it runs), each attributed through the
`op_name` XLA keeps from the JAX program (the Flax module path, `transpose(...)` for the
backward pass) to one part: embeddings, query encoder, session level, decoder, output layer
and loss, dropout masks, optimizer update, or "no op_name" (copies and buffer initialisation
that XLA adds, such as the stacked activations a scanned layer stack saves for the backward
pass); forward and backward apart. Then the time by kernel kind (matmul, fusion, copy / data
movement, collective, control flow, other), the device's busy and idle time over the steps,
and the `--top` most expensive operations with their shapes and op_names. `--trace_dir`
keeps the trace for TensorBoard or Perfetto; `--from_trace=FILE` summarises a kept trace by
kernel kind without compiling anything; `--json` writes the figures.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_report
from launch import bench_train
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax.data import input_pipeline
# pylint: enable=g-import-not-at-top,wrong-import-position

_BUCKET = flags.DEFINE_integer('bucket', 4, 'Session length (queries) of the profiled batch.')
_TOP = flags.DEFINE_integer('top', 25, 'Most expensive operations listed.')
_FROM_TRACE = flags.DEFINE_string(
    'from_trace', '', 'Summarise a kept trace (a .trace.json.gz of --steps steps) by kernel '
    'kind from the kernels\' names alone, without compiling anything (no HLO at hand: parts '
    'of the model are not told apart).')
_TRACE_DIR = flags.DEFINE_string('trace_dir', '', 'Keep the trace here (default: a temporary '
                                 'folder, removed).')

# (part, substrings of the op_name), first match wins: dropout masks are drawn inside every
# module (their keys, derived outside the differentiated function, count with them), and the
# fused loss head (`losses.output_layer_losses`, scope 'output_layer_loss') makes its gradients
# in its forward pass, so its backward part is only their scaling.
PARTS = (
    ('dropout masks', ('Dropout', 'embedding_dropout', '_bernoulli', '_threefry_fold_in')),
    ('embeddings', ('word_embedding', 'encoder_embedding', 'decoder_embedding',
                    'token_positions')),
    ('query encoder', ('query_encoder',)),
    ('session level', ('session_levels',)),
    ('output layer + loss', ('output_layer_loss', 'output_logits')),
    ('decoder', ('decode_hidden', 'decoder')),
)
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
# The opcode: the first `word(` after the result shape (a tuple shape holds spaces and
# parentheses of its own, so it is skipped by balancing them).
_OPCODE = re.compile(r'([a-z][a-z0-9\-]*)\(')
_COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute',
                'all-to-all')
_DATA_MOVEMENT = ('copy', 'copy-start', 'copy-done', 'transpose', 'dynamic-slice',
                  'dynamic-update-slice', 'slice', 'concatenate', 'pad', 'broadcast',
                  'gather', 'scatter')


def _opcode(line: str) -> str:
  rest = line.split(' = ', 1)[1]
  if rest.startswith('('):  # tuple shape: skip to its closing parenthesis
    depth = 0
    for i, char in enumerate(rest):
      depth += {'(': 1, ')': -1}.get(char, 0)
      if depth == 0:
        rest = rest[i + 1:]
        break
  match = _OPCODE.search(rest)
  return match.group(1) if match else ''


_CALLS = re.compile(r'calls=%?([\w.\-]+)')


def computations_with_products(hlo_text: str) -> set[str]:
  """Names of the HLO computations whose body holds a dot or a convolution."""
  names, current = set(), None
  for line in hlo_text.split('\n'):
    if line and not line[0].isspace() and line.rstrip().endswith('{'):
      current = line.split()[1 if line.startswith('ENTRY') else 0].lstrip('%')
    elif current and (' dot(' in line or ' convolution(' in line):
      names.add(current)
  return names


def kernel_kind(opcode: str, line: str, with_products: set[str] = frozenset()) -> str:
  """The kind of kernel an HLO instruction runs as: matrix products (dots, fusions around
  one -- cuBLAS / Triton GEMM on a GPU, YNNPACK / oneDNN on a CPU -- and GEMM custom calls),
  other fusions, data movement, collectives, control flow (a loop's own time: its condition
  and, on a GPU, the host's round trip), other."""
  calls = _CALLS.search(line)
  gemm = (any(word in line for word in ('gemm', 'cublas', '__cudnn'))
          or bool(calls and calls.group(1) in with_products))
  if opcode in ('dot', 'convolution') or (opcode in ('fusion', 'custom-call') and gemm):
    return 'matmul'
  if opcode == 'fusion':
    return 'fusion'
  if opcode.startswith(_COLLECTIVES):
    return 'collective'
  if opcode in _DATA_MOVEMENT:
    return 'copy / data movement'
  if opcode in ('while', 'conditional', 'call'):
    return 'control flow'
  return 'other'


_MOVEMENT_WORDS = ('memcpy', 'memset', 'copy', 'dynamic_update_slice', 'transpose',
                   'concatenate', 'pad', 'slice', 'broadcast', 'scatter', 'gather')


def kind_of_kernel(kernel: str) -> str:
  """The kind of a GPU kernel from its name alone, for kernels that name no HLO instruction
  (library GEMMs, and kernels run inside a command buffer, a CUDA graph, whose events name
  the buffer): XLA names a fusion's kernel after it ('loop_add_fusion_44',
  'input_reduce_fusion', 'gemm_fusion_dot_12'); cuBLAS's GEMMs are 'nvjet_...' and
  '..._xmma_gemm_...'."""
  name = kernel.lower()
  if any(word in name for word in ('gemm', 'nvjet', 'xmma', 'cutlass', 'cublas')):
    return 'matmul'
  if name.startswith(('all_reduce', 'all-reduce', 'nccl')):
    return 'collective'
  if any(word in name for word in _MOVEMENT_WORDS):
    return 'copy / data movement'
  if 'reduce' in name:
    return 'fusion (with a reduction)'
  if 'fusion' in name or name.startswith(('wrapped_', 'loop_', 'input_')):
    return 'fusion'
  return 'other'


def instruction_metadata(hlo_text: str) -> dict[str, tuple[str, str, str]]:
  """HLO instruction name -> (result shape, op_name or '', kernel kind) for every
  instruction."""
  metadata, with_products = {}, computations_with_products(hlo_text)
  for line in hlo_text.split('\n'):
    match = _INSTRUCTION.match(line)
    if match:
      op_name = _OP_NAME.search(line)
      metadata[match.group(1)] = (match.group(2), op_name.group(1) if op_name else '',
                                  kernel_kind(_opcode(line), line, with_products))
  return metadata


def busy_us(events: list[dict]) -> tuple[float, float]:
  """(span, busy) µs of `events`: from the first start to the last end, and the time in it
  when at least one of them ran (the union of their intervals). span - busy is the time the
  device waited: host dispatch, synchronisation, gaps between kernels."""
  if not events:
    return 0.0, 0.0
  intervals = sorted((e['ts'], e['ts'] + e['dur']) for e in events)
  busy, (start, end) = 0.0, intervals[0]
  span_start, span_end = start, max(stop for _, stop in intervals)
  for lo, hi in intervals[1:]:
    if lo > end:
      busy += end - start
      start, end = lo, hi
    else:
      end = max(end, hi)
  busy += end - start
  return span_end - span_start, busy


def part_of(op_name: str) -> str:
  """The part of the step an op_name belongs to, '... backward' for the backward pass."""
  if not op_name:
    return 'no op_name (XLA copies, buffer init)'
  differentiated = 'jvp(' in op_name or 'transpose(' in op_name
  direction = ' backward' if 'transpose(' in op_name else ' forward'
  for part, needles in PARTS:
    # Dropout keys are derived outside the differentiated function; every other part is in it.
    if (differentiated or part == 'dropout masks') and any(n in op_name for n in needles):
      return part + direction
  return 'other' + direction if differentiated else 'optimizer update + metrics'


def self_times(events: list[dict]) -> dict[str, float]:
  """Event name -> summed self time (µs): the time nested events on its thread took is not its
  own (a loop's event spans the operations of its body). An event that starts inside another
  and ends after it (kernels overlapping on a GPU's stream line) takes only the overlap from
  the other's time, so that no self time is negative."""
  totals: collections.Counter = collections.Counter()
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[(e.get('pid'), e.get('tid'))].append(e)
  for thread_events in by_thread.values():
    thread_events.sort(key=lambda e: (e['ts'], -e['dur']))
    stack: list[list] = []  # [end, name, child time]
    def close(entry):
      totals[entry[1]] += entry[3] - entry[2]
    for e in thread_events:
      while stack and stack[-1][0] <= e['ts']:
        close(stack.pop())
      if stack:
        stack[-1][2] += min(e['ts'] + e['dur'], stack[-1][0]) - e['ts']
      stack.append([e['ts'] + e['dur'], e['name'], 0.0, e['dur']])
    while stack:
      close(stack.pop())
  return totals


def _trace_events(trace_dir: str) -> list[dict]:
  paths = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True)
  if not paths:
    raise RuntimeError(f'jax.profiler wrote no trace under {trace_dir}')
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    trace = json.load(f)
  process_names = {e['pid']: e.get('args', {}).get('name', '') for e in trace['traceEvents']
                   if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  events = []
  for e in trace['traceEvents']:
    if e.get('ph') == 'X' and 'dur' in e:
      # GPU kernels name their HLO operation in args; CPU thunks are named after it.
      events.append({**e, 'name': e.get('args', {}).get('hlo_op', e['name']),
                     'kernel': e['name'],
                     'pid_name': process_names.get(e.get('pid'), '')})
  # On a GPU the host's threads also record the operations they launch: only the device's
  # own events count there, or each operation would count twice.
  on_gpu = [e for e in events if 'GPU' in e['pid_name']]
  return on_gpu or events


def profile(config, *, vocab_size: int, batch_queries: int, bucket: int, steps: int,
            seed: int, trace_dir: str) -> dict:
  """Traces `steps` train steps; returns wall time, per-part and per-operation self times."""
  cfg = models.make_config(config.model, vocab_size=vocab_size,
                           max_query_words=config.data.max_query_words)
  rows = input_pipeline.bucket_batch_sizes(np.array([bucket]), batch_queries,
                                           jax.device_count())[bucket]
  queries = bench_train.synthetic_queries(np.random.default_rng(seed), (rows, bucket),
                                          cfg.max_query_words, vocab_size)
  step = bench_train.JaxStep(config, cfg, seed)
  on_device = step.put(queries)
  step.compile(on_device)
  wall, _ = step.run(on_device, steps)  # untraced, for the wall time
  jax.profiler.start_trace(trace_dir)
  step.run(on_device, steps)
  jax.profiler.stop_trace()
  metadata = instruction_metadata(step.compiled_text(on_device))
  # A GPU kernel run inside a command buffer names the buffer as its operation; its own name
  # is the instruction's with '.' as '_'. Library kernels (cuBLAS) name none.
  by_kernel_name = {name.replace('.', '_'): name for name in metadata}
  events, unmatched = [], []
  for e in _trace_events(trace_dir):
    name = e['name'] if e['name'] in metadata else by_kernel_name.get(
        e.get('kernel', e['name']).replace('.', '_'))
    (events if name else unmatched).append({**e, 'name': name or e.get('kernel', e['name'])})
  times = {name: us / steps for name, us in self_times(events).items()}
  parts: collections.Counter = collections.Counter()
  kinds: collections.Counter = collections.Counter()
  for name, us in times.items():
    parts[part_of(metadata[name][1])] += us
    kinds[metadata[name][2]] += us
  for e in unmatched:
    parts['no HLO instruction named (library kernels)'] += e['dur'] / steps
    kinds[kind_of_kernel(e['name'])] += e['dur'] / steps
  # On a GPU its kernels' streams; on a CPU every thread.
  span, busy = busy_us(events + unmatched)
  top = [{'op': name, 'us': us, 'shape': metadata[name][0], 'op_name': metadata[name][1],
          'kind': metadata[name][2]}
         for name, us in sorted(times.items(), key=lambda item: -item[1])]
  return {'shape': list(queries.shape), 'wall_step_s': wall, 'parts_us': dict(parts),
          'kinds_us': dict(kinds), 'span_us': span / steps, 'busy_us': busy / steps,
          'ops': top}


def summarise_trace(path: str, steps: int) -> None:
  """Prints a kept trace's time per step by kernel kind (`kind_of_kernel`) and the device's
  idle time."""
  with gzip.open(path) as f:
    trace = json.load(f)
  names = {e['pid']: e.get('args', {}).get('name', '') for e in trace['traceEvents']
           if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  events = [e for e in trace['traceEvents'] if e.get('ph') == 'X' and 'dur' in e
            and 'GPU' in names.get(e.get('pid'), '')]
  if not events:
    raise app.UsageError(f'{path}: no GPU kernels in this trace')
  kinds: collections.Counter = collections.Counter()
  for e in events:
    kinds[kind_of_kernel(e['name'])] += e['dur'] / steps
  total = sum(kinds.values())
  span, busy = busy_us(events)
  print(f'{path}: {len(events):,} kernels, {total / 1e3:.2f} ms of kernels per step')
  print(f'{"kernel kind":>40} {"ms/step":>9} {"share":>7}')
  for kind, us in kinds.most_common():
    print(f'{kind:>40} {us / 1e3:9.2f} {us / total:7.1%}')
  print(f'{"device idle in the traced steps":>40} {(span - busy) / steps / 1e3:9.2f} '
        f'{(span - busy) / span:7.1%} of {span / steps / 1e3:.2f} ms per step')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _FROM_TRACE.value:
    summarise_trace(_FROM_TRACE.value, flags.FLAGS.steps)
    return
  parallel.set_cpu_devices(flags.FLAGS.cpu_devices)
  config = bench_train.CONFIG_FLAG.value
  if config is None:
    raise app.UsageError('--config is required (or --from_trace)')
  vocab_size = flags.FLAGS.vocab_size or bench_train.default_vocab_size(config)
  batch_queries = flags.FLAGS.batch_queries or config.input.train_queries_per_batch
  trace_dir = _TRACE_DIR.value or tempfile.mkdtemp(prefix='profile_step_')
  header = bench_report.print_header(bench_train.command_line('launch/profile_step.py'))
  result = profile(config, vocab_size=vocab_size, batch_queries=batch_queries,
                   bucket=_BUCKET.value, steps=flags.FLAGS.steps, seed=flags.FLAGS.seed,
                   trace_dir=trace_dir)
  traced = sum(result['parts_us'].values())
  print(f'batch {"x".join(map(str, result["shape"]))}, vocabulary {vocab_size:,}: '
        f'{result["wall_step_s"] * 1e3:.2f} ms per step (wall); {traced / 1e3:.2f} ms of '
        'operations traced per step (operations may overlap on several threads)')
  print(f'{"part":>40} {"ms/step":>9} {"share":>7}')
  for part, us in sorted(result['parts_us'].items(), key=lambda item: -item[1]):
    print(f'{part:>40} {us / 1e3:9.2f} {us / traced:7.1%}')
  print(f'\n{"kernel kind":>40} {"ms/step":>9} {"share":>7}')
  for kind, us in sorted(result['kinds_us'].items(), key=lambda item: -item[1]):
    print(f'{kind:>40} {us / 1e3:9.2f} {us / traced:7.1%}')
  idle = result['span_us'] - result['busy_us']
  print(f'{"device idle in the traced steps":>40} {idle / 1e3:9.2f} '
        f'{idle / max(result["span_us"], 1e-9):7.1%} of {result["span_us"] / 1e3:.2f} ms '
        '(host dispatch, synchronisation, gaps between kernels)')
  print(f'\n{"ms/step":>8}  {"operation":<40} {"shape":<34} op_name')
  for op in result['ops'][:_TOP.value]:
    print(f'{op["us"] / 1e3:8.2f}  {op["op"][:40]:<40} {op["shape"][:34]:<34} '
          f'{op["op_name"][-110:]}')
  bench_report.write_json({**header, 'vocab_size': vocab_size,
                           'profile': {**result, 'ops': result['ops'][:_TOP.value]}},
                          flags.FLAGS.json)
  if not _TRACE_DIR.value:
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(trace_dir, ignore_errors=True)
  else:
    print(f'trace kept in {trace_dir}')


if __name__ == '__main__':
  bench_report.run(main)
