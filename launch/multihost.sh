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
hosts_file=${1:?usage: launch/multihost.sh HOSTS_FILE -- ARGS...}; shift
[ "${1:-}" = "--" ] && shift
mapfile -t hosts < <(grep -v '^\s*\(#\|$\)' "$hosts_file")
port=${PORT:-12355}
repo=$(cd "$(dirname "$0")/.." && pwd)
printf -v quoted_repo %q "$repo"  # the remote shell reads the command: a path with spaces
pids=()
for i in "${!hosts[@]}"; do
  cmd="cd $quoted_repo && .venv/bin/python -m mtn_jax.main --mode=train --distributed \
--coordinator_address=${hosts[0]}:$port --num_processes=${#hosts[@]} --process_id=$i $(printf '%q ' "$@")"
  # Each in a process group of its own, so that stopping it stops the training under it; a
  # remote one on a terminal (-tt), whose hangup when its connection closes stops it there.
  if [ "${hosts[$i]}" = localhost ]; then setsid bash -c "$cmd" & else setsid ssh -tt "${hosts[$i]}" "$cmd" & fi
  pids+=($!)
done
# One process that fails leaves the others waiting at a collective (on CPU devices for up to
# 30 minutes): the first failure stops the rest. Polled, not `wait -n -p` (bash 5.1 and later).
status=0
remaining=("${pids[@]}")
while ((${#remaining[@]})); do
  still=()
  for pid in "${remaining[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then still+=("$pid"); continue; fi
    wait "$pid" && rc=0 || rc=$?
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "process $pid exited with $rc: stopping the others" >&2
    fi
  done
  remaining=("${still[@]}")
  if ((status != 0)); then
    # The group, or the process where setsid has not made its group yet.
    for pid in "${remaining[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
    for pid in "${remaining[@]}"; do wait "$pid" 2>/dev/null || true; done
    break
  fi
  ((${#remaining[@]})) && sleep 1
done
exit $status
