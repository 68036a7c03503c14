#!/usr/bin/env bash
# Wheels of the packages this project needs that a GPU machine's image lacks, for a machine
# that cannot reach a package index: run here (with pip and a network), carry `.whl/` there,
# and `launch/gpu_rows.sh` installs them first (`pip install --no-index --no-deps --target`).
#
#   bash launch/gpu_wheels.sh [DIR]          # default .whl (git-ignored)
#
# The image this is sized for: Python 3.12 on x86-64 with jax and jaxlib (CUDA), flax, optax,
# orbax-checkpoint, numpy, scipy, absl-py, PyYAML, sacrebleu, sentencepiece, aiohttp, httpx,
# anyio, h11, click, jinja2, packaging, narwhals, etils, cloudpickle, protobuf,
# prometheus-client, uvloop, torch. Left out, so that the wheels stay small (about 20 MB): jax
# and the CUDA libraries (the image's own), usearch (imported only for
# config.suggest.index='usearch'; its kernels' wheel alone is 11 MB), and the test-only
# packages (selenium, import-linter, schemathesis).
# Versions: requirements.txt's pins, and for their dependencies the versions the CPU install
# of requirements.txt resolves.
set -euo pipefail
dir=${1:-.whl}
cd "$(dirname "$0")/.."
mkdir -p "$dir"
wheels=(
  # the input pipeline (mtn_jax/data/input_pipeline.py) and its dependencies
  grain==0.2.18 array-record==0.8.6 portpicker==1.6.0
  ml_collections==1.1.0        # every config
  bm25s==0.3.16                # IMDNA's retrieval (mtn_jax/data/bm25.py)
  lightgbm==4.7.0              # the learned ranker (mtn_jax/inference/learned.py)
  tensorboardX==2.6.5          # training's metric writer (mtn_jax/training/metric_writer.py)
  # the service (mtn_jax/serving/): fastapi and what it needs beside the image's packages
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5
  annotated-types==0.8.0 annotated-doc==0.0.7 typing-inspection==0.4.5 typing-extensions==4.16.0
  opentelemetry-api==1.45.2 uvicorn==0.54.0 httptools==0.9.0 swagger-ui-py==25.7.1
)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
    manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${platforms[@]}" -d "$dir" "${wheels[@]}"
# One version of each package: a second would stop the install.
ls "$dir"/*.whl | sed 's#.*/##; s/-[0-9].*//' | tr 'A-Z_' 'a-z-' | sort | uniq -d \
  | { if read -r twice; then echo "two versions of $twice in $dir" >&2; exit 1; fi; }
du -sh "$dir"
ls "$dir"
