#!/usr/bin/env bash
# The GPU train step of configs/aol.py (bfloat16) and the changes tried on it, in one go, for
# docs/PERFORMANCE.md ("The step against the hardware's limit"):
#
#   bash launch/bench_gpu_step.sh OUTDIR [SECONDS]
#
# The base is the step as these changes were first measured against: layer stacks as nn.scan
# (configs/aol.py has unrolled them since, the `unroll` change below, which gained).
# 1. a jax.profiler trace of the base step (launch/profile_step.py: time by part of the
#    model and by kernel kind, device idle time), sessions of 4 queries;
# 2. the base step, then one change at a time, each in a process of its own (XLA's flags
#    are read at start), same batches and seed (launch/bench_train.py, bucket 4):
#      k4     4 optimizer steps per compiled call (a lax.scan over 4 batches)
#      chunk  the loss head in chunks of 8192 target slots instead of 2048
#      unroll layer stacks as Python loops (scan_layers=False)
#      flags  XLA GPU flags: command buffers (CUDA graphs) for loops and conditionals too,
#             the latency-hiding scheduler
# 3. the changes that each gained over the base step, together, timed alternately with
#    the PyTorch peer compiled with torch.compile in bfloat16 autocast on the same batches;
# 4. the same combination profiled.
# Each step writes OUTDIR/<name>.json and OUTDIR/<name>.log and is named in OUTDIR/steps.txt
# with its exit status; a step that would not fit in the SECONDS left (default 540) is skipped.
set -u
out=${1:?usage: bash launch/bench_gpu_step.sh OUTDIR [SECONDS]}
budget=${2:-540}
# OUTDIR as given from where the command runs, before the cd to the repository.
out=$(mkdir -p "$out" && cd "$out" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
py=${PYTHON:-python3}  # e.g. PYTHON=.venv/bin/python (BUILD.md's set-up)
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run COMMAND with a limit if it fits, log it.
  local name=$1 limit=$2
  shift 2
  if (( SECONDS + limit > budget )); then
    echo "$name skipped: ${limit} s would pass the ${budget} s budget" | tee -a "$out/steps.txt"
    return 99
  fi
  local start=$SECONDS
  timeout --signal=TERM --kill-after=5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start)) limit=$limit" | tee -a "$out/steps.txt"
  grep -E "^ +4 |JAX / |MFU|kernel kind|^ +(fusion|matmul|copy|collective|control|other)|idle" \
    "$out/$name.log" | head -20
  return $rc
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  "$py" -c 'import jax, flax, torch; print("jax", jax.__version__, "flax", flax.__version__,
"torch", torch.__version__, jax.devices())'; } >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

aol=(--config=configs/aol.py --config.model.compute_dtype=bfloat16
     --config.model.scan_layers=True)
bench=("$py" launch/bench_train.py "${aol[@]}" --session_lengths=4 --steps=20 --repeats=3
       --pipeline_sessions=0)
declare -A change=(
  [k4]="--steps_per_call=4"
  [chunk]="--config.train.loss_chunk_tokens=8192"
  [unroll]="--config.model.scan_layers=False")
gpu_flags='--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE --xla_gpu_enable_latency_hiding_scheduler=true'

step profile_base 110 "$py" launch/profile_step.py "${aol[@]}" --bucket=4 --steps=5 --top=30
step base 90 "${bench[@]}" --json="$out/base.json"
for name in k4 chunk unroll; do
  step "$name" 90 "${bench[@]}" ${change[$name]} --json="$out/$name.json"
done
step flags 90 env XLA_FLAGS="$gpu_flags" "${bench[@]}" --json="$out/flags.json"

# The changes that gained at least 2 % over the base step.
gained=$("$py" - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def step_s(name):
  try:
    with open(os.path.join(out, name + '.json')) as f:
      return json.load(f)['train']['epoch_mix']['jax']['step_s']
  except (OSError, KeyError, ValueError):
    return None
base = step_s('base')
print(' '.join(n for n in ('k4', 'chunk', 'unroll', 'flags')
               if base and step_s(n) and step_s(n) < 0.98 * base))
PY
)
echo "gained: ${gained:-none}" | tee -a "$out/steps.txt"
best=()
use_flags=''
for name in $gained; do
  if [[ $name == flags ]]; then use_flags=$gpu_flags; else best+=(${change[$name]}); fi
done
step peer_best 150 env XLA_FLAGS="$use_flags" "${bench[@]}" "${best[@]}" --peer \
  --peer_modes=compiled --json="$out/peer_best.json"
step profile_best 100 env XLA_FLAGS="$use_flags" "$py" launch/profile_step.py "${aol[@]}" \
  --bucket=4 --steps=5 --top=30 $(printf '%s\n' "${best[@]}" | grep -v steps_per_call)
exit 0
