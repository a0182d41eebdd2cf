#!/usr/bin/env bash
# SLURM GPU cluster: one task per node, all GPUs of a node to its task, the same command on
# every node. Submit with sbatch (or print the batch script with DRY_RUN=1):
#
#   NODES=4 GPUS_PER_NODE=8 launch/slurm_gpu.sh [extra flags for vapo_jax.main]
#
# Variables (environment):
#   NODES          nodes (= JAX processes)                      (default: 2)
#   GPUS_PER_NODE  GPUs per node                                (default: 8)
#   PARTITION      SLURM partition                              (default: the cluster's)
#   TIME           wall-clock limit                             (default: 24:00:00)
#   CONFIG         experiment config                            (default: configs/qwen32b.py)
#   WORKDIR        shared directory for metrics and checkpoints (default: $PWD/runs/vapo)
#   JOB_NAME       job name                                     (default: vapo)
#   DRY_RUN        1: print the batch script instead of submitting it (default: 0)
#
# Inside the job, vapo_jax.distributed (mode auto) sees SLURM_JOB_ID / SLURM_NTASKS and calls
# jax.distributed.initialize(), which reads the coordinator, process count and id from SLURM.
set -euo pipefail
cd "$(dirname "$0")/.."

NODES="${NODES:-2}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
TIME="${TIME:-24:00:00}"
CONFIG="${CONFIG:-configs/qwen32b.py}"
WORKDIR="${WORKDIR:-$PWD/runs/vapo}"
JOB_NAME="${JOB_NAME:-vapo}"
DRY_RUN="${DRY_RUN:-0}"
EXTRA=""
if (($#)); then EXTRA="$(printf ' %q' "$@")"; fi
PARTITION_LINE=""
if [[ -n "${PARTITION:-}" ]]; then PARTITION_LINE="#SBATCH --partition=$PARTITION"; fi

script="#!/usr/bin/env bash
#SBATCH --job-name=$JOB_NAME
#SBATCH --nodes=$NODES
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=$GPUS_PER_NODE
#SBATCH --cpus-per-task=32
#SBATCH --time=$TIME
#SBATCH --output=$WORKDIR/slurm-%j.out
$PARTITION_LINE
set -euo pipefail
cd $PWD
srun python3 -m vapo_jax.main --config=$CONFIG --workdir=$WORKDIR --noprogress$EXTRA
"

if [[ "$DRY_RUN" == "1" ]]; then
  printf '%s' "$script"
else
  mkdir -p "$WORKDIR"
  printf '%s' "$script" | sbatch
fi
