#!/usr/bin/env bash
# Local multi-process CPU run: N JAX processes on this machine, each with D fake CPU devices,
# joined by jax.distributed (gloo collectives) — the multi-host code path without a pod.
#
#   NPROC=2 DEVICES=2 launch/local_multiprocess.sh [extra flags for vapo_jax.main]
#
# Variables (environment):
#   NPROC      processes                               (default: 2)
#   DEVICES    fake CPU devices per process            (default: 2)
#   PORT       coordinator port on 127.0.0.1           (default: a free one)
#   CONFIG     experiment config                       (default: configs/tiny.py)
#   WORKDIR    metrics directory (process 0 writes it) (default: /tmp/vapo_multiprocess)
#   DRY_RUN    1: print the commands only              (default: 0)
#
# Each process gets JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, which
# vapo_jax.distributed reads (mode auto). Logs: $WORKDIR/process_<i>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

NPROC="${NPROC:-2}"
DEVICES="${DEVICES:-2}"
CONFIG="${CONFIG:-configs/tiny.py}"
WORKDIR="${WORKDIR:-/tmp/vapo_multiprocess}"
DRY_RUN="${DRY_RUN:-0}"
PORT="${PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"

mkdir -p "$WORKDIR"
pids=()
for ((i = 0; i < NPROC; i++)); do
  cmd=(env JAX_PLATFORMS=cpu "XLA_FLAGS=--xla_force_host_platform_device_count=$DEVICES"
       "JAX_COORDINATOR_ADDRESS=127.0.0.1:$PORT" "JAX_NUM_PROCESSES=$NPROC" "JAX_PROCESS_ID=$i"
       python3 -m vapo_jax.main "--config=$CONFIG" "--workdir=$WORKDIR" --noprogress "$@")
  printf '+'; printf ' %q' "${cmd[@]}"; printf ' > %q 2>&1 &\n' "$WORKDIR/process_$i.log"
  if [[ "$DRY_RUN" != "1" ]]; then
    "${cmd[@]}" > "$WORKDIR/process_$i.log" 2>&1 &
    pids+=($!)
  fi
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=$?
done
if [[ "$DRY_RUN" != "1" ]]; then
  tail -n 20 "$WORKDIR/process_0.log"
fi
exit "$status"
