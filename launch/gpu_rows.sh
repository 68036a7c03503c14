#!/usr/bin/env bash
# The GPU rows of issue 45 in one go, on one GPU machine that reaches no package index, most
# wanted first, within a time budget:
#
#   bash launch/gpu_wheels.sh                    # here, once: .whl/ (carry it to the machine)
#   bash launch/gpu_rows.sh OUTDIR [SECONDS]     # there; SECONDS of wall time, default 480
#   REHEARSE=1 PYTHON=.venv/bin/python bash launch/gpu_rows.sh OUTDIR   # every row, tiny, on a CPU
#
# Rows, each in a process of its own (a `configs/aol.py` step in bfloat16 unless said):
#   a_step     the step on sessions of 4 queries, alternating with the PyTorch peer compiled
#              with torch.compile in bfloat16 autocast: step ms, pairs/s, MFU (executed FLOPs),
#              JAX / peer (launch/bench_train.py)
#   a_profile  where the step's kernels spend their time, and the device's idle time
#              (launch/profile_step.py)
#   a_vocab    a study: a_step's step (no peer) with the vocabulary's rows padded to a multiple
#              of 128, where XLA pads the loss head's operands on every step (76,604 -> 76,608)
#   corpus     a synthetic AOL-format log of 1M lines, preprocessed: the data of the next rows
#   bc_kernels XLA's kernels against the `config.model.kernels` choice (the loss head's
#              gradient products in bfloat16), timed alternately in one process, and what the
#              bfloat16 head gradients change in 300 steps of training on the corpus against
#              another seed's run (launch/bench_kernels.py)
#   d_train    `configs/aol.py:small` trained briefly on the corpus (--mode=train): a workdir
#   d_serve    the service on the GPU: a lone request's p50, loads up to saturation, half of it
#              (the tail target), offline decoding of the same contexts (launch/bench_serve.py)
#   d_tail     a study of the tail: the service with two workers at d_serve's rates (d_serve
#              runs the GPU's default, one), and with the interpreter's lock handed over
#              every 0.5 ms
#   e_preprocess  a 40th of a log ten times AOL's 36.4M lines written and preprocessed
#   e_epoch    a slice of a training epoch through the real input pipeline on that corpus
#              repeated to the ten-times size: its time, whether the device ever waits for
#              input, and the projected preprocessing + epoch (launch/bench_epoch.py)
#
# A row runs if 60 % of its limit is left of the budget, for at most its limit or what is left;
# one that fails or runs out of time is recorded and the next one runs. Programs compiled by
# one row are read back by the next ones (JAX_COMPILATION_CACHE_DIR in the work folder, kept
# between runs on the same machine, as are the generated logs). ROWS='e_epoch bc_kernels'
# runs only those rows (and the data they need, unless an earlier run left it), keeping the
# other rows' figures from an earlier run on the same machine in the report: the rows a first
# run had no time for, or a row again after a change. Nothing is downloaded: the
# missing Python packages come from `.whl/` (launch/gpu_wheels.sh), the data is synthesised.
# d_train may not fit a machine's minutes: launch/gpu_serve_workdir.sh makes d_serve's workdir
# on a CPU instead, into .serve/ (given a trained aol.py:small workdir, it packs that one: the
# default that users are served, the learned ranker); carried with .whl/, it is served
# without d_train.
# OUTDIR gets rows.md (a table per row, with the device, date and command), rows.json (every
# figure), logs.tar.gz (each row's log and JSON) and, off a rehearsal, jax_cache.tar.gz: the
# compiled programs, the smallest first up to 15 MiB (what a machine sends back). Copied to
# .gpu_cache/jax_cache.tar.gz here and carried, it seeds the next machine's cache: a fresh
# machine compiles every row's programs again, most of the service row's start.
set -u
out=${1:?usage: bash launch/gpu_rows.sh OUTDIR [SECONDS]}
budget=${2:-480}
rehearse=${REHEARSE:-0}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${GPU_ROWS_WORK:-/tmp/gpu_rows}
mkdir -p "$work"
rows=${ROWS:-}
wanted() { [[ -z $rows || " $rows " == *" $1 "* ]]; }
if [[ -z $rows ]]; then
  rm -f "$work"/*.log "$work"/*.json "$work/steps.tsv"
else
  for name in $rows; do
    rm -f "$work/$name.log" "$work/$name.json" "$work/$name"_*.log "$work/$name"_*.json
    [[ -f $work/steps.tsv ]] && sed -i -E "/^$name(_[a-z0-9_]+)?\t/d" "$work/steps.tsv"
  done
fi
export JAX_COMPILATION_CACHE_DIR=$work/jax_cache
if [[ $rehearse == 0 && -f .gpu_cache/jax_cache.tar.gz ]]; then
  mkdir -p "$work/jax_cache" && tar -xzf .gpu_cache/jax_cache.tar.gz -C "$work/jax_cache" \
    && echo "compilation cache: $(ls "$work/jax_cache" | wc -l) files after the carried ones"
fi
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

if [[ $rehearse == 0 ]] && compgen -G '.whl/*.whl' >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{ date -u +%Y-%m-%dT%H:%M:%SZ; uname -srm; nproc
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
  "$py" - <<'PY'
import importlib
for name in ('jax', 'jaxlib', 'flax', 'optax', 'grain', 'torch'):
  try:
    print(name, importlib.import_module(name).__version__)
  except Exception as e:  # pylint: disable=broad-except
    print(name, 'missing:', type(e).__name__)
import jax
print('devices', jax.devices())
PY
} >"$work/machine.txt" 2>&1
cat "$work/machine.txt"

# A rehearsal's limits are LIMIT_SCALE (default 3) times the GPU's: a 2-core CPU shared with
# other jobs compiles and trains the tiny models slower than a GPU machine the large ones.
scale=${LIMIT_SCALE:-$(( rehearse == 1 ? 3 : 1 ))}
fits() { (( budget - SECONDS >= $1 * scale * 6 / 10 )); }  # fits LIMIT: 60 % of it is left
skip() {  # skip NAME LIMIT COMMAND [WHY]: recorded as skipped
  printf '%s\tskipped\t0\t%s\t%s\n' "$1" "$(($2 * scale))" "$3" >>"$work/steps.tsv"
  echo "== $1 skipped: ${4:-$((budget - SECONDS)) s left of ${budget}, it needs about $(($2 * scale * 6 / 10))}"
}
row() {  # row NAME LIMIT COMMAND...: COMMAND under a limit, if it fits; logged and recorded.
  local name=$1 limit=$2
  shift 2
  [[ -n ${FORCE:-} ]] || wanted "$name" || return 98
  local left=$((budget - SECONDS))
  if ! fits "$limit"; then
    skip "$name" "$limit" "$*"
    return 99
  fi
  limit=$((limit * scale))
  (( limit > left )) && limit=$left
  local start=$SECONDS
  echo "== $name (at most ${limit} s): $*"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$limit" "$*" \
    >>"$work/steps.tsv"
  echo "   rc=$rc after $((SECONDS - start)) s"
  grep -vE '^[IW][0-9]{4} ' "$work/$name.log" | tail -n 12
  return $rc
}

aol_lines=36389567 aol_train_pairs=4285507  # the paper's Table 1
if [[ $rehearse == 0 ]]; then
  model=(--config=configs/aol.py --config.model.compute_dtype=bfloat16)
  sizes=()
  a_runs=(--steps=20 --repeats=3)
  profile_steps=5
  corpus_lines=1000000 files=16
  kernel_runs=(--steps=20 --repeats=3 --learn_steps=300 --learn_window=25)
  serve_train=(--config.train.max_steps=30)
  serve_rates=(--rates=5,150,300,450,800)
  serve_load=(--seconds=5)  # each rate offered this long (a rehearsal: smaller batches too)
  serve_offline=(--offline_contexts=512 --offline_batches=8)
  target_lines=$((10 * aol_lines)) target_pairs=$((10 * aol_train_pairs))
  slice_steps=300
else
  # Every row once, tiny, on a CPU: the demo model, a small vocabulary and batch.
  model=(--config=configs/demo.py --config.model.compute_dtype=bfloat16)
  sizes=(--vocab_size=2000 --batch_queries=128)
  a_runs=(--steps=2 --repeats=1)
  profile_steps=2
  corpus_lines=200000 files=2
  kernel_runs=(--steps=2 --repeats=1 --learn_steps=20 --learn_window=5)
  serve_train=(--config.train.max_steps=5 --config.input.train_queries_per_batch=64)
  serve_rates=(--rates=2,20)
  serve_load=(--seconds=2 --set=serve.max_batch=2)
  serve_offline=(--offline_contexts=16 --offline_batches=8)
  target_lines=$((4 * corpus_lines)) target_pairs=$((target_lines / 5))
  slice_steps=20
fi
e_lines=$((target_lines / 40))
peer=(--peer --peer_modes=compiled)
if ! "$py" -c 'import torch' 2>/dev/null; then
  peer=()
  echo "no torch here: a_step runs without the PyTorch peer"
fi
serve_model=(--config=configs/aol.py:small --config.data.raw_files="$work/corpus/log-*.tsv.gz"
             --config.suggest.strategy=blend --config.serve.prepare_after_train=False)
if [[ $rehearse == 1 ]]; then serve_model+=(--config.model.max_session_queries=8); fi

# The data rows run when a row that reads their output runs and no earlier run left it.
need_corpus() { wanted bc_kernels || wanted d_serve; }

row a_step 170 "$py" launch/bench_train.py "${model[@]}" "${sizes[@]}" --session_lengths=4 \
  "${a_runs[@]}" --pipeline_sessions=0 "${peer[@]}" --json="$work/a_step.json"
row a_profile 90 "$py" launch/profile_step.py "${model[@]}" "${sizes[@]}" --bucket=4 \
  --steps="$profile_steps" --top=30 --json="$work/a_profile.json"
# The vocabulary a_step ran with (bench_train's default for configs/aol.py: the paper's), its
# rows padded to a multiple of 128: the model's arithmetic on 0.1 % more rows, no pad op.
vocab=$(grep -oP -- '--vocab_size=\K[0-9]+' <<<"${sizes[*]}" || echo 76604)
row a_vocab 120 "$py" launch/bench_train.py "${model[@]}" "${sizes[@]}" \
  --vocab_size=$(( (vocab + 127) / 128 * 128 )) --session_lengths=4 "${a_runs[@]}" \
  --pipeline_sessions=0 --json="$work/a_vocab.json"
if need_corpus; then
  if [[ ! -f $work/corpus/lines.txt || $(cat "$work/corpus/lines.txt") != "$corpus_lines" ]]; then
    rm -rf "$work/corpus"
    FORCE=1 row corpus 60 "$py" launch/bench_preprocess.py --lines="$corpus_lines" \
      --files="$files" --write_workers="$files" --keep="$work/corpus" \
      --json="$work/corpus.json" && echo "$corpus_lines" >"$work/corpus/lines.txt"
  else
    sed -i '/^corpus\t/d' "$work/steps.tsv" 2>/dev/null
    printf '%s\tkept\t0\t0\t%s\n' corpus "the log and corpus of an earlier run" \
      >>"$work/steps.tsv"
  fi
fi
# The base step's FLOPs as a_step counted them, if it did: the same step on the same batch.
flops=$("$py" -c 'import json, sys
print(json.load(open(sys.argv[1]))["train"]["epoch_mix"]["jax"]["flops_per_step"])' \
  "$work/a_step.json" 2>/dev/null || echo 0)
row bc_kernels 170 "$py" launch/bench_kernels.py "${model[@]}" "${sizes[@]}" --bucket=4 \
  "${kernel_runs[@]}" --corpus="$work/corpus/run" --executed_flops="$flops" \
  --json="$work/bc_kernels.json"
# The service's command; a carried workdir's serve_args.txt (launch/gpu_serve_workdir.sh
# WORKDIR) holds the overrides it was trained with, in place of d_train's.
serve_command() {
  local sets=()
  if [[ -f $work/serve_workdir/serve_args.txt ]]; then
    mapfile -t sets <"$work/serve_workdir/serve_args.txt"
  else
    for setting in "${serve_model[@]:1}"; do sets+=("--set=${setting#--config.}"); done
  fi
  serve_base=("$py" launch/bench_serve.py --workdir="$work/serve_workdir"
              --config=configs/aol.py:small "${sets[@]}" --set=serve.prepare_after_train=False
              --set=serve.warm_up_background=False)
  serve=("${serve_base[@]}" "${serve_load[@]}" "${serve_rates[@]}" "${serve_offline[@]}"
         --half_saturation --json="$work/d_serve.json")
}
if wanted d_serve; then
  # A workdir made on a CPU and carried (.serve/, launch/gpu_serve_workdir.sh) is served as
  # it is, as is one an earlier run left in the work folder when ROWS names d_serve alone.
  # Else the workdir is trained here first, if the service's row fits after it.
  kept_why=
  if [[ $rehearse == 0 && -f .serve/serve_workdir.tar.gz ]]; then
    rm -rf "$work/serve_workdir"
    tar -xzf .serve/serve_workdir.tar.gz -C "$work"
    kept_why="made on a CPU by launch/gpu_serve_workdir.sh and carried"
  elif ! wanted d_train && [[ -f $work/serve_workdir/config.json ]]; then
    kept_why="a workdir already in the work folder"
  fi
  serve_command
  if [[ -n $kept_why ]]; then
    sed -i "/^d_train\t/d" "$work/steps.tsv" 2>/dev/null
    printf '%s\tkept\t0\t0\t%s\n' d_train "$kept_why" >>"$work/steps.tsv"
    row d_serve 300 "${serve[@]}"  # the learned strategy compiles 88 programs first
  elif fits $((120 + 150)); then
    rm -rf "$work/serve_workdir"
    serve_command
    if FORCE=1 row d_train 120 "$py" -m mtn_jax.main --mode=train \
        --workdir="$work/serve_workdir" "${serve_model[@]}" "${serve_train[@]}"; then
      row d_serve 150 "${serve[@]}"
    else
      skip d_serve 150 "${serve[*]}" 'd_train made no workdir'
    fi
  else
    skip d_train $((120 + 150)) "a trained workdir, with d_serve after it"
    skip d_serve 150 "${serve[*]}"
  fi
fi
# A study of the tail. d_serve runs the service's default, one worker on a GPU; the study
# runs d_serve's rates again with two (the CPU's default, and the GPU's before 2026-11-29:
# at 107/s its p99 was 11.2x a lone p50, one worker's 2.37x), for their saturation and tail;
# then the default with the interpreter's lock handed over every 0.5 ms rather than Python's
# 5 (a worker back from the device waits for it less), at 5/s and at d_serve's half
# saturation. Each reads d_serve's programs back from the compilation cache.
if wanted d_tail; then
  half=$("$py" -c 'import json, sys
print(round(json.load(open(sys.argv[1]))["tail"]["saturation_per_s"] / 2, 1))' \
    "$work/d_serve.json" 2>/dev/null)
  if [[ -z $half || ! -f $work/serve_workdir/config.json ]]; then
    skip d_tail 120 "launch/bench_serve.py ..." 'no d_serve figures or workdir here'
  else
    [[ -n ${serve_base:-} ]] || serve_command
    FORCE=1 row d_tail_workers2 120 "${serve_base[@]}" "${serve_load[@]}" "${serve_rates[@]}" \
      --offline_contexts=0 --half_saturation --set=serve.workers=2 \
      --json="$work/d_tail_workers2.json"
    FORCE=1 row d_tail_switch05 60 "${serve_base[@]}" "${serve_load[@]}" --rates="5,$half" \
      --offline_contexts=0 --switch_interval_ms=0.5 --json="$work/d_tail_switch05.json"
  fi
fi
epoch=("$py" launch/bench_epoch.py "${model[@]}" "${sizes[@]}" --workdir="$work/e_log/run"
       --preprocess_json="$work/e_preprocess.json" --target_lines="$target_lines"
       --target_pairs="$target_pairs"
       --slice_steps="$slice_steps" --json="$work/e_epoch.json")
e_kept=0
[[ -f $work/e_log/lines.txt && $(cat "$work/e_log/lines.txt") == "$e_lines" ]] && e_kept=1
if wanted e_epoch && (( e_kept == 0 )) && ! fits $((100 + 150)); then
  # The log is written only if the epoch's row fits after it.
  skip e_preprocess $((100 + 150)) "a 40th of the ten-times log, with e_epoch after it"
  skip e_epoch 150 "${epoch[*]}"
elif wanted e_epoch; then
  if (( e_kept == 0 )); then
    rm -rf "$work/e_log"
    FORCE=1 row e_preprocess 100 "$py" launch/bench_preprocess.py --lines="$e_lines" \
      --files="$files" --write_workers="$files" --keep="$work/e_log" \
      --json="$work/e_preprocess.json" \
      && echo "$e_lines" >"$work/e_log/lines.txt" && cp "$work/e_preprocess.json" "$work/e_log/"
  elif ! grep -q "^e_preprocess	" "$work/steps.tsv" 2>/dev/null; then
    # Measured by an earlier run on this machine: its figures stand.
    cp "$work/e_log/e_preprocess.json" "$work/"
    printf '%s\tkept\t0\t0\t%s\n' e_preprocess "the log and corpus of an earlier run" \
      >>"$work/steps.tsv"
  fi
  row e_epoch 150 "${epoch[@]}"
fi
"$py" launch/gpu_rows_report.py --work="$work" --out="$out" --budget="$budget" \
  --rehearse="$rehearse"
tar -czf "$out/logs.tar.gz" -C "$work" machine.txt steps.tsv \
  $(cd "$work" && ls *.log *.json 2>/dev/null)
if [[ $rehearse == 0 && -d $work/jax_cache ]]; then
  # The smallest programs first, up to 15 MiB before compression.
  (cd "$work/jax_cache" && find . -maxdepth 1 -type f -printf '%s %P\n' | sort -n \
     | awk '(total += $1) <= 15 * 2^20 {print $2}' >"$work/cache_files.txt" \
     && tar -czf "$out/jax_cache.tar.gz" -T "$work/cache_files.txt")
fi
echo "== $((SECONDS)) s of ${budget}; wrote $out/rows.md, rows.json, logs.tar.gz"
cat "$out/rows.md"
