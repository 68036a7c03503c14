#!/usr/bin/env bash
# d_serve's workdir (launch/gpu_rows.sh), made here on a CPU and packed for a GPU machine
# whose few minutes would otherwise go to training and validating it (d_train ran out of its
# 120 s on an H200).
#
#   bash launch/gpu_serve_workdir.sh [TARBALL] [WORKDIR]   # TARBALL: .serve/serve_workdir.tar.gz
#   # there, carrying .whl and .serve: d_serve serves it, d_train is skipped
#   bash launch/gpu_rows.sh OUTDIR 480      # or ROWS=d_serve for that row alone
#
# With WORKDIR, a trained `configs/aol.py:small` workdir (docs/RESULTS.md's, on the AOL sample:
# its default, the learned ranker, is what a user is served) is packed as the service reads
# it: its config, prepared data, last checkpoint's parameters, meta and vocabulary, and
# ranker; serve_args.txt beside them holds the `--set` overrides of `configs/aol.py:small`
# it was trained with, which d_serve passes on. Without WORKDIR: gpu_rows.sh's corpus of 1M
# synthetic lines, `configs/aol.py:small` trained 30 steps, served by its blend (no ranker).
set -euo pipefail
tarball=${1:-.serve/serve_workdir.tar.gz}
trained=${2:-}
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n $trained ]]; then
  [[ -f $trained/config.json ]] || { echo "$trained: no config.json (not a trained workdir)" >&2; exit 1; }
  step=$(ls "$trained/checkpoints" | sort -n | tail -n 1)
  mkdir -p "$work/serve_workdir/checkpoints/$step"
  cp -r "$trained/config.json" "$trained/data" "$work/serve_workdir/"
  cp -r "$trained/checkpoints/$step"/{_CHECKPOINT_METADATA,commit_success.txt,meta,params,vocab} \
    "$work/serve_workdir/checkpoints/$step/"
  if [[ -d $trained/ranker ]]; then
    mkdir -p "$work/serve_workdir/ranker"
    cp "$trained"/ranker/{model.txt,ranker.json} "$work/serve_workdir/ranker/"
  fi
  # The overrides that make configs/aol.py:small the config the workdir was trained with.
  "$py" - "$trained/config.json" >"$work/serve_workdir/serve_args.txt" <<'PY'
import json, sys
from configs import aol
def flat(d, prefix=''):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from flat(v, f'{prefix}{k}.')
    else:
      yield f'{prefix}{k}', list(v) if isinstance(v, tuple) else v
base = dict(flat(aol.get_config('small').to_dict()))
for key, value in flat(json.load(open(sys.argv[1]))["config"]):
  # prepare_after_train acts when training ends; d_serve sets it off.
  if key in base and value != base[key] and key != 'serve.prepare_after_train':
    if isinstance(value, (list, tuple)):
      sys.exit(f'{sys.argv[1]}: {key}={value!r} differs from configs/aol.py:small, and a list '
               'is not passed as an override')
    print(f'--set={key}={value}')
PY
  echo "overrides of configs/aol.py:small:"; cat "$work/serve_workdir/serve_args.txt"
else
  "$py" launch/bench_preprocess.py --lines=1000000 --files=16 --write_workers="$(nproc)" \
    --keep="$work/corpus" --json="$work/corpus.json"
  "$py" -m mtn_jax.main --mode=train --workdir="$work/serve_workdir" --config=configs/aol.py:small \
    --config.data.raw_files="$work/corpus/log-*.tsv.gz" --config.suggest.strategy=blend \
    --config.serve.prepare_after_train=False --config.train.max_steps=30
  rm -rf "$work"/serve_workdir/checkpoints/*/{train,data_iter} "$work/serve_workdir/tensorboard"
fi
mkdir -p "$(dirname "$tarball")"
tar -czf "$tarball" -C "$work" serve_workdir
du -h "$tarball"
