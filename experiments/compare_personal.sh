#!/usr/bin/env bash
# Personalised suggestions on one AOL-format log: the zero attention family (QEM, HEM, AEM,
# ZAM) and MTN without and with a user memory, on the same time-ordered split, each user's
# history the 20 queries before the session (configs/zam_aol.py).
#
#   experiments/compare_personal.sh RAW_LOG OUT_DIR [--config.KEY=VALUE ...]
#
# Out: OUT_DIR/<variant>/ one workdir per variant, each evaluated on the validation split
# (eval/valid_results.json) and the test split (eval/results.json), and OUT_DIR/table.md, the
# figures by user history (experiments/personal_table.py; with --config.decode.max_eval_sessions=N
# passed, of each split's first N sessions, as its tables say). Run from anywhere; the Python is
# ${PYTHON:-python}. Running it again resumes unfinished training and redoes evaluation.

set -euo pipefail

if [[ $# -lt 2 || "$1" == -* || "$2" == -* ]]; then
  echo "usage: $0 RAW_LOG OUT_DIR [--config.KEY=VALUE ...]" >&2
  exit 2
fi
RAW_LOG=$1
OUT_DIR=$2
shift 2
[[ "$RAW_LOG" == /* ]] || RAW_LOG="$PWD/$RAW_LOG"
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PYTHON=${PYTHON:-python}
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VARIANTS=(${VARIANTS:-qem hem aem zam mtn mtn_aem mtn_zam})
for variant in "${VARIANTS[@]}"; do
  workdir="$OUT_DIR/$variant"
  args=(--config="configs/zam_aol.py:$variant" --config.data.raw_files="$RAW_LOG"
        --workdir="$workdir" "$@")
  echo "== $variant"
  "$PYTHON" -m mtn_jax.main "${args[@]}" --mode=train
  for split in valid test; do
    "$PYTHON" -m mtn_jax.main "${args[@]}" --mode=eval --config.decode.eval_split=$split
  done
done
"$PYTHON" experiments/personal_table.py "$OUT_DIR" "${VARIANTS[@]}" | tee "$OUT_DIR/table.md"
