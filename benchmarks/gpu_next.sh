#!/usr/bin/env bash
# One prepared device call: the GPU numbers still missing, then the test
# suite on the GPU with whatever time is left (benchmarks/gpu_pending.md says
# why each; benchmarks/gpu.md holds what earlier calls measured). A session is
# lent about 15 minutes of device time in all, so the whole call ends by
# DEADLINE seconds (default 560) after it starts.
#
#   OUT=/some/dir bash benchmarks/gpu_next.sh     # on the device tool: $OUT is set
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/gpu_next.sh   # print the steps only
#
# Each step has its own time limit, cut to what is left before the deadline,
# so a step that runs long costs its own share and not the rest; `timeout`
# signals the step's whole process group (the benchmark's per-point child
# processes too). A failed step is reported in steps.txt and the next one
# still runs. The device tool returns at most 8 files, so the logs and
# tables go to a scratch folder that is packed into one archive,
# $OUT/results.tar.gz, after every step (a call cut short keeps what ran).
# Fashion-MNIST travels as .data/fashion_mnist (FedMetric's protocol reads
# it; the image has no datasets): see benchmarks/gpu_pending.md.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the archive}
DEADLINE=${DEADLINE:-560}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if [ -d .data ]; then export FEDJAX_METRIC_DATA_DIR=$PWD/.data; fi
status=0

step() {  # step NAME SECONDS COMMAND...: run, log to NAME.log, time it.
  local name=$1 seconds=$2
  shift 2
  local left=$((DEADLINE - SECONDS))
  ((seconds > left)) && seconds=$left
  if ((seconds < 10)); then
    echo "== $name: not run (deadline)" | tee -a "$LOGS/steps.txt"
    status=1
    return
  fi
  if [ -n "${DRY_RUN:-}" ]; then
    echo "$name (${seconds} s): $*"
    return
  fi
  local start=$SECONDS
  timeout -k 5 "$seconds" "$@" 2>&1 | tee "$LOGS/$name.log"
  local code=${PIPESTATUS[0]}
  echo "== $name: exit $code after $((SECONDS - start)) s (limit $seconds)" \
    | tee -a "$LOGS/steps.txt"
  [ "$code" -eq 0 ] || status=1
  tar czf "$OUT/results.tar.gz" -C "$LOGS" .
}

bench() {  # bench NAME SECONDS FLAGS...: one benchmarks.bench table.
  local name=$1 seconds=$2
  shift 2
  step "$name" "$seconds" "$PY" -m benchmarks.bench --rounds=5 \
    --out="$LOGS/$name.md" "$@"
}

# The machine, and what the image lacks, in seconds.
step imports 40 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv; $PY -c \"
import jax, flax, optax, absl, ml_collections, orbax.checkpoint, sklearn, tqdm
import torch
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'torch', torch.__version__, 'cuda', torch.cuda.is_available())
print(jax.devices())\"; ls \${FEDJAX_METRIC_DATA_DIR:-/nonexistent}/fashion_mnist"

# 1. FedMetric's protocol (10,000 one-step rounds of 10 clients, evaluated
#    every 500) with the clients vmapped, the form meant for GPUs, against
#    its 2-minute goal (342 s on the 2-core CPU, benchmarks/cpu_rounds.md).
step rounds 150 "$PY" -m benchmarks.rounds_bench \
  --cases=fedmetric_protocol_vmap,fedavg_1step_scan_vmap \
  --out="$LOGS/rounds_gpu.md"

# 2. The executor table against the PyTorch peers (median of 5 rounds, each
#    point in its own process). Small CNN: vmap and sequential against the
#    eager PyTorch loop (cudnn.benchmark, channels-last) at 10 and 100
#    clients (goal: vmap >= 100x the loop at 100). The 1,000-client JAX rows
#    and FedQuad's 10/100-client rows and bf16 rows were measured on
#    2026-11-29 (benchmarks/gpu.md).
bench small 100 --model=small_cnn --image_shape=28,28,1 --clients=10,100 \
  --executors=vmap,sequential --torch
# FedQuad CNN peers at 100 clients: torch.func vmap (float32 and bf16
# autocast; both failed on 2026-11-29 and are fixed since) and that step in
# torch.compile max-autotune; then FedQuad's 1,000-client float32 rows.
bench fedquad_peers 120 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=100 --executors=torch_vmap --notorch \
  --torch_compile_modes=default,max-autotune
bench fedquad_bf16_peer 45 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=100 --executors=torch_vmap --notorch --notorch_compile \
  --precision=bf16
bench fedquad_1000 60 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=1000 --executors=vmap,sequential --notorch

# 3. The implicit-GEMM convolution (a Pallas Triton kernel): its tests pass
#    on the GPU (the quick tier of 2026-11-29); never timed.
bench implicit 45 --model=fedquad_cnn --image_shape=32,32,3 --clients=100 \
  --executors=vmap --notorch --conv_impl=implicit

# 4. The suite on the GPU, with the time left: one line a test (-v), so a
#    run cut by the deadline still says what passed. The quick tier passed
#    there on 2026-11-29 but for missing packages; this is the whole suite.
step suite 600 "$PY" -m pytest -v -p no:cacheprovider tests -n 14 -rfE \
  --timeout=150

exit $status
