#!/usr/bin/env bash
# TPU pod: create a slice, copy and install vapo_jax on every worker, run the same command on
# all of them, tail the logs, delete the slice. Dry run by default: it prints the gcloud
# commands; set DRY_RUN=0 to run them.
#
#   launch/tpu_pod.sh create|setup|run|logs|ssh|delete|all [-- extra flags for vapo_jax.main]
#
# Variables (environment):
#   TPU_NAME      name of the slice                          (default: vapo-$USER)
#   ZONE          GCP zone                                   (default: us-east5-a)
#   PROJECT       GCP project                                (default: gcloud's default)
#   ACCEL         accelerator type, e.g. v5p-128, v5litepod-16, v6e-8, v4-32  (default: v5p-128)
#   VERSION       TPU VM runtime version     (default by ACCEL: v5p v2-alpha-tpuv5, v5e
#                 v2-alpha-tpuv5-lite, v6e v2-alpha-tpuv6e, v4 tpu-ubuntu2204-base)
#   SPOT          1: a spot (preemptible) slice              (default: 0)
#   CONFIG        experiment config                          (default: configs/qwen32b.py)
#   WORKDIR       where metrics and checkpoints go; use gs:// on a pod (default: gs://$USER-vapo/run)
#   REMOTE_DIR    checkout directory on the workers          (default: vapo_jax)
#   JAX_VERSION   jax version installed with jax[tpu]        (default: the local one, else 0.10.2)
#   LOG           log file on each worker                    (default: /tmp/vapo.log)
#   DRY_RUN       1: print the commands only                 (default: 1)
#
# Every worker runs the same `python -m vapo_jax.main`; jax.distributed finds the slice by
# itself (vapo_jax.distributed, mode auto), process 0 writes the metrics, orbax writes
# checkpoints cooperatively. Before booking a slice, prove the run fits:
#   python -m vapo_jax.pod.compile_check --config="$CONFIG" --topology="$ACCEL"
set -euo pipefail
cd "$(dirname "$0")/.."

TPU_NAME="${TPU_NAME:-vapo-${USER:-me}}"
ZONE="${ZONE:-us-east5-a}"
ACCEL="${ACCEL:-v5p-128}"
case "$ACCEL" in
  v5litepod-*|v5e-*) default_version=v2-alpha-tpuv5-lite ;;
  v6e-*) default_version=v2-alpha-tpuv6e ;;
  v4-*) default_version=tpu-ubuntu2204-base ;;
  *) default_version=v2-alpha-tpuv5 ;;
esac
VERSION="${VERSION:-$default_version}"
SPOT="${SPOT:-0}"
CONFIG="${CONFIG:-configs/qwen32b.py}"
WORKDIR="${WORKDIR:-gs://${USER:-me}-vapo/run}"
REMOTE_DIR="${REMOTE_DIR:-vapo_jax}"
JAX_VERSION="${JAX_VERSION:-$(python3 -c 'import importlib.metadata as m; print(m.version("jax"))' 2>/dev/null || echo 0.10.2)}"
LOG="${LOG:-/tmp/vapo.log}"
DRY_RUN="${DRY_RUN:-1}"
PROJECT_FLAG=()
if [[ -n "${PROJECT:-}" ]]; then PROJECT_FLAG=(--project="$PROJECT"); fi

run() {  # Prints a command; runs it unless DRY_RUN=1.
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [[ "$DRY_RUN" != "1" ]]; then "$@"; fi
}

on_all() {  # Runs a shell command on every worker of the slice, at the same time.
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --worker=all --command="$1"
}

create() {
  local spot=()
  if [[ "$SPOT" == "1" ]]; then spot=(--spot); fi
  run gcloud compute tpus tpu-vm create "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --accelerator-type="$ACCEL" --version="$VERSION" "${spot[@]}"
}

setup() {  # Copies this checkout (tracked files) to every worker and installs it.
  local tarball=/tmp/vapo_jax_src.tar.gz
  run git archive --format=tar.gz -o "$tarball" HEAD
  run gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:/tmp/" --zone="$ZONE" \
    "${PROJECT_FLAG[@]}" --worker=all
  on_all "mkdir -p $REMOTE_DIR && tar -xzf /tmp/vapo_jax_src.tar.gz -C $REMOTE_DIR && \
cd $REMOTE_DIR && pip install -q 'jax[tpu]==$JAX_VERSION' && pip install -q -e ."
}

start() {  # The same command on every host; output to $LOG on each.
  local extra=""
  if (($#)); then extra="$(printf ' %q' "$@")"; fi
  on_all "cd $REMOTE_DIR && nohup python3 -m vapo_jax.main --config=$CONFIG \
--workdir=$WORKDIR --noprogress$extra > $LOG 2>&1 &"
}

logs() {  # Process 0's log (worker 0), followed.
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" \
    --worker=0 --command="tail -n 100 -f $LOG"
}

delete() {
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --quiet
}

cmd="${1:-help}"
shift || true
if [[ "${1:-}" == "--" ]]; then shift; fi
case "$cmd" in
  create) create ;;
  setup) setup ;;
  run) start "$@" ;;
  logs) logs ;;
  ssh) run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone="$ZONE" "${PROJECT_FLAG[@]}" --worker=0 ;;
  delete) delete ;;
  all) create; setup; start "$@"; logs ;;
  *) sed -n '2,29p' "$0"; exit 2 ;;
esac
