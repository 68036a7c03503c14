#!/usr/bin/env bash
# The GPU figures of docs/PERFORMANCE.md in one go, most wanted first, each step under a time
# limit of its own so that one slow or failing step leaves the others' figures:
#
#   bash launch/bench_gpu.sh OUTDIR
#
# 1. the rankers' Table 5 (launch/bench_rankers.py): the `:small` rankers at 1k and 100k
#    candidates, the Cross-encoder timed directly at 100k (no extrapolation);
# 2. training throughput of configs/aol.py (the paper-size MTN) in bfloat16 and in float32,
#    against the one-AOL-epoch-in-2-minutes target (launch/bench_train.py);
# 3. the PyTorch peer on the same batches (eager and torch.compile), float32 with TF32
#    products as JAX's, sessions of 4 queries;
# 4. how the rankers' times scale with model and pool size.
# Each step writes OUTDIR/<name>.json (the figures) and OUTDIR/<name>.log (its output); a step
# that fails or runs out of time is named in OUTDIR/steps.txt with its exit status, and the
# next one runs. Nothing here is specific to one kind of GPU; on a CPU it runs too (slowly).
set -u
out=${1:?usage: bash launch/bench_gpu.sh OUTDIR}
# OUTDIR as given from where the command runs, before the cd to the repository.
out=$(mkdir -p "$out" && cd "$out" && pwd) || exit 1
cd "$(dirname "$0")/.." || exit 1
py=${PYTHON:-python3}  # e.g. PYTHON=.venv/bin/python (BUILD.md's set-up)
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run COMMAND with a limit, log it, record its status.
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - start)) limit=$limit" | tee -a "$out/steps.txt"
  tail -n 40 "$out/$name.log"
  return $rc
}

{ date -u; uname -a; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    2>/dev/null; "$py" -c 'import jax, flax; print("jax", jax.__version__, "flax",
flax.__version__, jax.devices())'; } >"$out/machine.txt" 2>&1
cat "$out/machine.txt"
# Fail fast: if the project does not import here, no step can run.
step imports 120 "$py" -c 'import grain, bm25s, usearch
from mtn_jax import main; from mtn_jax.training import train; from mtn_jax.evaluation import evaluate; print("imports ok")' || exit 1

step rankers 110 "$py" launch/bench_rankers.py --pools=1000,100000 --cross_direct \
  --repeats=20 --warmup=2 --json="$out/rankers.json"
# The layer stacks as nn.scan, as the tables of docs/PERFORMANCE.md were measured (configs/aol.py
# has unrolled them since).
scan=(--config.model.scan_layers=True)
step train_bf16 180 "$py" launch/bench_train.py --config=configs/aol.py "${scan[@]}" \
  --config.model.compute_dtype=bfloat16 --repeats=3 --json="$out/train_bf16.json"
step train_fp32 150 "$py" launch/bench_train.py --config=configs/aol.py "${scan[@]}" \
  --pipeline_sessions=0 --repeats=3 --json="$out/train_fp32.json"
step peer 150 "$py" launch/bench_train.py --config=configs/aol.py "${scan[@]}" --peer \
  --peer_modes=eager,compiled --session_lengths=4 --pipeline_sessions=0 --repeats=3 --json="$out/peer.json"
step rankers_scaling 100 "$py" launch/bench_rankers.py --sizes=64x1,256x4 \
  --pools=1000,10000,100000 --cross_direct --repeats=10 --warmup=1 \
  --json="$out/rankers_scaling.json"
exit 0
