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
#
# SIGTERM or Ctrl-C to this script is passed on to every process, as a pod preemption
# notice would reach every host: they agree on a step boundary, save once and exit 0, and
# the same command resumes. The script exits with the first non-zero process status.
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
forward() {
  echo "local_multiprocess: passing SIGTERM to ${#pids[@]} processes" >&2
  kill -TERM "${pids[@]}" 2>/dev/null || true
}
trap forward TERM INT
status=0
for pid in "${pids[@]}"; do
  # A trapped signal interrupts `wait` while the process still runs: wait again.
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  if [[ $rc -ne 0 && $status -eq 0 ]]; then
    status=$rc
  fi
done
if [[ "$DRY_RUN" != "1" ]]; then
  tail -n 20 "$WORKDIR/process_0.log"
fi
exit "$status"
