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
printf -v quoted_repo %q "$repo"  # the remote shell reads the command: a path with spaces
pids=()
for i in "${!hosts[@]}"; do
  cmd="cd $quoted_repo && .venv/bin/python -m mtn_jax.main --mode=train --distributed \
--coordinator_address=${hosts[0]}:$port --num_processes=${#hosts[@]} --process_id=$i $(printf '%q ' "$@")"
  # Each in a process group of its own, so that stopping it stops the training under it.
  if [ "${hosts[$i]}" = localhost ]; then setsid bash -c "$cmd" & else setsid ssh "${hosts[$i]}" "$cmd" & fi
  pids+=($!)
done
# One process that fails leaves the others waiting at a collective (on CPU devices for up to
# 30 minutes): the first failure stops the rest (a remote one through its ssh connection).
status=0
remaining=("${pids[@]}")
while ((${#remaining[@]})); do
  wait -n -p done_pid "${remaining[@]}" && rc=0 || rc=$?
  still=()
  for pid in "${remaining[@]}"; do [[ $pid == "$done_pid" ]] || still+=("$pid"); done
  remaining=("${still[@]}")
  if ((rc != 0 && status == 0)); then
    status=$rc
    echo "process $done_pid exited with $rc: stopping the others" >&2
    # The group, or the process where setsid has not made its group yet.
    for pid in "${remaining[@]}"; do kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true; done
  fi
done
exit $status
