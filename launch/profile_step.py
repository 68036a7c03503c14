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
pass); forward and backward apart. Then the `--top` most expensive operations with their
shapes and op_names. `--trace_dir` keeps the trace for TensorBoard or Perfetto.
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
import time

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=g-import-not-at-top,wrong-import-position
from launch import bench_train
from mtn_jax import models
from mtn_jax import parallel
from mtn_jax.data import input_pipeline
# pylint: enable=g-import-not-at-top,wrong-import-position

_BUCKET = flags.DEFINE_integer('bucket', 4, 'Session length (queries) of the profiled batch.')
_TOP = flags.DEFINE_integer('top', 25, 'Most expensive operations listed.')
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


def instruction_metadata(hlo_text: str) -> dict[str, tuple[str, str]]:
  """HLO instruction name -> (result shape, op_name or '') for every instruction."""
  metadata = {}
  for line in hlo_text.split('\n'):
    match = _INSTRUCTION.match(line)
    if match:
      op_name = _OP_NAME.search(line)
      metadata[match.group(1)] = (match.group(2), op_name.group(1) if op_name else '')
  return metadata


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
  own (a loop's event spans the operations of its body)."""
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
        stack[-1][2] += e['dur']
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
  events = []
  for e in trace['traceEvents']:
    if e.get('ph') == 'X' and 'dur' in e:
      # GPU kernels name their HLO operation in args; CPU thunks are named after it.
      events.append({**e, 'name': e.get('args', {}).get('hlo_op', e['name'])})
  return events


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
  times = {name: us / steps for name, us in self_times(_trace_events(trace_dir)).items()
           if name in metadata}
  parts: collections.Counter = collections.Counter()
  for name, us in times.items():
    parts[part_of(metadata[name][1])] += us
  top = [{'op': name, 'us': us, 'shape': metadata[name][0], 'op_name': metadata[name][1]}
         for name, us in sorted(times.items(), key=lambda item: -item[1])]
  return {'shape': list(queries.shape), 'wall_step_s': wall, 'parts_us': dict(parts),
          'ops': top}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  parallel.set_cpu_devices(flags.FLAGS.cpu_devices)
  config = bench_train.CONFIG_FLAG.value
  vocab_size = flags.FLAGS.vocab_size or bench_train.default_vocab_size(config)
  batch_queries = flags.FLAGS.batch_queries or config.input.train_queries_per_batch
  trace_dir = _TRACE_DIR.value or tempfile.mkdtemp(prefix='profile_step_')
  machine = bench_train.machine()
  print(f'date: {time.strftime("%Y-%m-%dT%H:%M:%S%z")}')
  print(f'command: {bench_train.command_line("launch/profile_step.py")}')
  print(f'machine: {machine["host"]}, {machine["cpu_count"]} CPUs, load average '
        f'{machine["load_average_1min"]}; {machine["device_count"]} x '
        f'{machine["device_kind"]} ({machine["platform"]}), jax {machine["jax"]}')
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
  print(f'\n{"ms/step":>8}  {"operation":<40} {"shape":<34} op_name')
  for op in result['ops'][:_TOP.value]:
    print(f'{op["us"] / 1e3:8.2f}  {op["op"][:40]:<40} {op["shape"][:34]:<34} '
          f'{op["op_name"][-110:]}')
  if not _TRACE_DIR.value:
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(trace_dir, ignore_errors=True)
  else:
    print(f'trace kept in {trace_dir}')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main)
