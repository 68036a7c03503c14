#!/usr/bin/env bash
# d_serve's workdir (launch/gpu_rows.sh), trained here on a CPU and packed for a GPU machine
# whose few minutes would otherwise go to compiling and validating it (d_train ran out of its
# 120 s on an H200): gpu_rows.sh's corpus of 1M synthetic lines, `configs/aol.py:small`
# trained 30 steps, packed without the optimizer state (serving reads params, meta and vocab).
#
#   bash launch/gpu_serve_workdir.sh [TARBALL]   # default .serve/serve_workdir.tar.gz (git-ignored)
#   # there, carrying .whl and .serve: d_serve serves it, d_train is skipped
#   bash launch/gpu_rows.sh OUTDIR 480      # or ROWS=d_serve for that row alone
set -euo pipefail
tarball=${1:-.serve/serve_workdir.tar.gz}
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" launch/bench_preprocess.py --lines=1000000 --files=16 --write_workers="$(nproc)" \
  --keep="$work/corpus" --json="$work/corpus.json"
"$py" -m mtn_jax.main --mode=train --workdir="$work/serve_workdir" --config=configs/aol.py:small \
  --config.data.raw_files="$work/corpus/log-*.tsv.gz" --config.suggest.strategy=blend \
  --config.serve.prepare_after_train=False --config.train.max_steps=30
rm -rf "$work"/serve_workdir/checkpoints/*/{train,data_iter} "$work/serve_workdir/tensorboard"
mkdir -p "$(dirname "$tarball")"
tar -czf "$tarball" -C "$work" serve_workdir
du -h "$tarball"
