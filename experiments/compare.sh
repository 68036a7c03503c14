#!/usr/bin/env bash
# The paper's model comparison (Table 2, Fig. 2 and the Fig.-3 layer ablation), re-run on one
# AOL-format log: every model on the same corpus, with the same budget.
#
#   experiments/compare.sh RAW_LOG OUT_DIR [EPOCHS [--config.KEY=VALUE ...]]
#
# e.g. experiments/compare.sh ../shared/data/aol-sample/aol-500users.tsv.gz /tmp/compare 8
#
# In:  RAW_LOG, an AOL-format query log (plain or .gz; a glob or comma-separated list works
#      too); EPOCHS for every model (default: the small configs' own); any further arguments
#      are config overrides given to every model (e.g. --config.decode.max_eval_sessions=100).
# Out: OUT_DIR/<model>/ one workdir per model (corpus, checkpoints, metrics.jsonl, eval/),
#      OUT_DIR/report/ (report.md: the Table-2 table with the trivial suggesters' lines;
#      bleu.png: Fig. 2; layers.png: Fig. 3; each workdir's eval/ holds the test and the
#      validation figures), and OUT_DIR/summary.md: per model the best
#      validation perplexity, the training throughput and the wall times of training and
#      evaluation. Run from anywhere; the Python is ${PYTHON:-python}.
#
# Same corpus: every workdir preprocesses RAW_LOG with the same data config (all the small
# configs share configs/aol.py's data section and split seed), and before any training the
# script checks that every workdir's corpus files (manifest.json with the input fingerprint,
# stats.json, vocab.json, the split arrays and texts) are byte for byte those of the first.
# Running the script again resumes unfinished training and redoes evaluation and report.

set -euo pipefail

if [[ $# -lt 2 || "$1" == -* || "$2" == -* ]]; then
  echo "usage: $0 RAW_LOG OUT_DIR [EPOCHS [--config.KEY=VALUE ...]]" >&2
  exit 2
fi
RAW_LOG=$1
OUT_DIR=$2
shift 2
OVERRIDES=()
if [[ $# -gt 0 ]]; then
  if ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
    echo "$0: EPOCHS must be a positive whole number, got '$1'" >&2
    exit 2
  fi
  OVERRIDES+=("--config.train.num_epochs=$1")
  shift
fi
OVERRIDES+=("$@")
PYTHON=${PYTHON:-python}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The runs start in the repository: resolve relative log paths against the caller's directory.
IFS=, read -ra log_paths <<< "$RAW_LOG"
for i in "${!log_paths[@]}"; do
  if [[ "${log_paths[$i]}" != /* ]]; then
    log_paths[$i]="$PWD/${log_paths[$i]}"
  fi
done
RAW_LOG=$(IFS=,; echo "${log_paths[*]}")
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
cd "$REPO"

# workdir name, config: the Table-2 models, then the Fig.-3 Transformer with 5 + 5 layers.
MODELS=(
  "mtn configs/aol.py:small"
  "transformer configs/transformer_aol.py:small"
  "transformer_enc5dec5 configs/transformer_aol.py:small,enc5dec5"
  "seq2seq configs/seq2seq_aol.py:small"
  "hred configs/hred_aol.py:small"
  "mnsrf configs/mnsrf_aol.py:small"
)

# Every model suggests with its own beam (`strategy=generate`): the paper compares the
# generators, and configs/aol.py:small's default (the learned ranker) would train fold
# generators and a ranker that this table does not read.
run() {  # run NAME CONFIG MODE [FLAG ...]: one mode of mtn_jax.main on OUT_DIR/NAME
  "$PYTHON" -m mtn_jax.main --config="$2" --workdir="$OUT_DIR/$1" --mode="$3" \
    --config.data.raw_files="$RAW_LOG" --config.suggest.strategy=generate "${OVERRIDES[@]}" \
    "${@:4}"
}

echo "== Corpus: $RAW_LOG, once per workdir"
first=""
for entry in "${MODELS[@]}"; do
  read -r name config <<< "$entry"
  run "$name" "$config" preprocess > "$OUT_DIR/$name.preprocess.log"
  if [[ -z "$first" ]]; then
    first=$name
    cat "$OUT_DIR/$name.preprocess.log"
    continue
  fi
  for file in "$OUT_DIR/$first"/data/*; do
    if ! cmp -s "$file" "$OUT_DIR/$name/data/$(basename "$file")"; then
      echo "$0: $OUT_DIR/$name/data/$(basename "$file") differs from $file: the models" \
           "would not be compared on the same corpus" >&2
      exit 1
    fi
  done
done
echo "All ${#MODELS[@]} workdirs hold byte-identical corpora ($(ls "$OUT_DIR/$first/data" | wc -l) files each)."

printf 'model\ttrain_s\teval_s\n' > "$OUT_DIR/wall_times.tsv"
workdirs=()
for entry in "${MODELS[@]}"; do
  read -r name config <<< "$entry"
  echo "== $name ($config)"
  start=$SECONDS
  run "$name" "$config" train 2>&1 | tee "$OUT_DIR/$name.train.log"
  trained=$SECONDS
  run "$name" "$config" eval 2>&1 | tee "$OUT_DIR/$name.eval.log"
  # The table's validation columns (eval/valid_results.json).
  run "$name" "$config" eval --config.decode.eval_split=valid > "$OUT_DIR/$name.eval_valid.log" 2>&1
  printf '%s\t%d\t%d\n' "$name" $((trained - start)) $((SECONDS - trained)) \
    >> "$OUT_DIR/wall_times.tsv"
  echo "$name: wall time $((trained - start)) s training, $((SECONDS - trained)) s evaluation"
  workdirs+=("$OUT_DIR/$name")
done

echo "== Report"
joined=$(IFS=,; echo "${workdirs[*]}")
# With the overrides, the report reads the files the evaluations wrote (a look at the first N
# sessions alone, config.decode.max_eval_sessions=N, has files of its own).
"$PYTHON" -m mtn_jax.main --config=configs/aol.py:small --workdir="$OUT_DIR" --mode=report \
  --config.suggest.strategy=generate "${OVERRIDES[@]}" \
  --config.report.workdirs="$joined" --config.report.output="$OUT_DIR/report"
# Per-model figures beside the report: the best validation perplexity, and the training
# throughput as the median over the logged windows (the first window holds the compilation,
# and a window after an epoch's end holds the validation).
"$PYTHON" - "$OUT_DIR" "${workdirs[@]}" <<'EOF'
import csv
import json
import os
import statistics
import sys

from mtn_jax.training import metric_writer

out_dir, workdirs = sys.argv[1], sys.argv[2:]
with open(os.path.join(out_dir, 'wall_times.tsv'), encoding='utf-8') as f:
  wall = {row['model']: row for row in csv.DictReader(f, delimiter='\t')}
lines = ['| Workdir | Model | Params | Best valid ppl (step) | Train sessions/s | BLEU | '
         'Train wall (s) | Eval wall (s) |', '|---|---|---:|---:|---:|---:|---:|---:|']
for workdir in workdirs:
  name = os.path.basename(workdir)
  # The test split's results, as its evaluation named them (its log's 'Results: PATH').
  with open(os.path.join(out_dir, f'{name}.eval.log'), encoding='utf-8') as f:
    results_path = [l[len('Results: '):].strip() for l in f if l.startswith('Results: ')][-1]
  with open(results_path, encoding='utf-8') as f:
    results = json.load(f)
  valid = metric_writer.read_metrics(workdir, 'valid')
  best = min(valid, key=lambda r: r['loss'])
  speeds = [r['sessions_per_s'] for r in metric_writer.read_metrics(workdir, 'train')[1:]]
  throughput = f'{statistics.median(speeds):.0f}' if speeds else '- (one window)'
  lines.append(
      f'| {name} | {results["label"]} | {results["num_params"]:,} | '
      f'{best["perplexity"]:.2f} ({best["step"]}) | {throughput} | '
      f'{results["scores"]["model"]["bleu"]:.2f} | {wall[name]["train_s"]} | '
      f'{wall[name]["eval_s"]} |')
summary = '\n'.join(lines) + '\n'
with open(os.path.join(out_dir, 'summary.md'), 'w', encoding='utf-8') as f:
  f.write(summary)
print(summary + f'\nReport: {os.path.join(out_dir, "report", "report.md")}\n'
      f'Summary: {os.path.join(out_dir, "summary.md")}')
EOF
