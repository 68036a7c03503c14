#!/usr/bin/env bash
# Generic multi-host launcher: starts one training process per host over ssh.
#
#   launch/multihost.sh HOSTS_FILE -- --config=configs/aol.py --workdir=/shared/runs/mtn ...
#
# HOSTS_FILE lists one host per line; the first is the coordinator (process 0). Each host
# needs this repository at the same path with its .venv, and the workdir on a shared file
# system. Set PORT to change the coordinator port (default 12355). Use `localhost` lines to
# run several processes on one machine (each then sees all local devices unless
# CUDA_VISIBLE_DEVICES / XLA_FLAGS say otherwise).
set -euo pipefail
hosts_file=$1; shift
[ "${1:-}" = "--" ] && shift
mapfile -t hosts < <(grep -v '^\s*\(#\|$\)' "$hosts_file")
port=${PORT:-12355}
repo=$(cd "$(dirname "$0")/.." && pwd)
pids=()
for i in "${!hosts[@]}"; do
  cmd="cd $repo && .venv/bin/python -m mtn_jax.main --mode=train --distributed \
--coordinator_address=${hosts[0]}:$port --num_processes=${#hosts[@]} --process_id=$i $(printf '%q ' "$@")"
  if [ "${hosts[$i]}" = localhost ]; then bash -c "$cmd" & else ssh "${hosts[$i]}" "$cmd" & fi
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
