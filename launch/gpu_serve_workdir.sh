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
# it (launch/pack_serve_workdir.py), with serve_args.txt: the `--set` overrides of
# `configs/aol.py:small` it was trained with, which d_serve passes on. Without WORKDIR:
# gpu_rows.sh's corpus of 1M synthetic lines, `configs/aol.py:small` trained 30 steps, served
# by its blend (no ranker).
set -euo pipefail
tarball=${1:-.serve/serve_workdir.tar.gz}
trained=${2:-}
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [[ -n $trained ]]; then
  "$py" launch/pack_serve_workdir.py --workdir="$trained" --out="$work/serve_workdir"
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
