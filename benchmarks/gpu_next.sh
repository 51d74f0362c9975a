#!/usr/bin/env bash
# One prepared device call: the GPU numbers most wanted, then the test suite
# on the GPU with whatever time is left (benchmarks/gpu_pending.md says why
# each). A session is lent about 15 minutes of device time in all, so the
# whole call ends by DEADLINE seconds (default 560) after it starts.
#
#   OUT=/some/dir bash benchmarks/gpu_next.sh     # on the device tool: $OUT is set
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/gpu_next.sh   # print the steps only
#
# Each step has its own time limit, cut to what is left before the deadline,
# so a step that runs long costs its own share and not the rest; `timeout`
# signals the step's whole process group (the benchmark's per-point child
# processes too). Logs and tables go to $OUT (they come back); a failed step
# is reported in $OUT/steps.txt and the next one still runs.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs and tables}
DEADLINE=${DEADLINE:-560}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
status=0

step() {  # step NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, time it.
  local name=$1 seconds=$2
  shift 2
  local left=$((DEADLINE - SECONDS))
  ((seconds > left)) && seconds=$left
  if ((seconds < 10)); then
    echo "== $name: not run (deadline)" | tee -a "$OUT/steps.txt"
    status=1
    return
  fi
  if [ -n "${DRY_RUN:-}" ]; then
    echo "$name (${seconds} s): $*"
    return
  fi
  local start=$SECONDS
  timeout -k 5 "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
  local code=${PIPESTATUS[0]}
  echo "== $name: exit $code after $((SECONDS - start)) s (limit $seconds)" \
    | tee -a "$OUT/steps.txt"
  [ "$code" -eq 0 ] || status=1
}

bench() {  # bench NAME SECONDS FLAGS...: one benchmarks.bench table.
  local name=$1 seconds=$2
  shift 2
  step "$name" "$seconds" "$PY" -m benchmarks.bench --rounds=5 \
    --out="$OUT/$name.md" "$@"
}

# The machine, and what the image lacks, in seconds.
step imports 40 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv; git log -1 --format='commit %H %cs' 2>/dev/null; $PY -c \"
import jax, flax, optax, absl, ml_collections, orbax.checkpoint, sklearn, tqdm
import torch
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'torch', torch.__version__, 'cuda', torch.cuda.is_available())
print(jax.devices())\""

# 1. FedMetric's protocol (10,000 one-step rounds of 10 clients, evaluated
#    every 500) with the clients vmapped, the form meant for GPUs, against
#    its 2-minute goal (342 s on the 2-core CPU, benchmarks/cpu_rounds.md).
step rounds 100 "$PY" -m benchmarks.rounds_bench \
  --cases=fedmetric_protocol_vmap,fedavg_1step_scan_vmap \
  --out="$OUT/rounds_gpu.md"

# 2. The executor table against the PyTorch peers (median of 5 rounds, each
#    point in its own process). Small CNN: vmap and sequential against the
#    eager PyTorch loop (cudnn.benchmark, channels-last) at 10 and 100
#    clients (goal: vmap >= 100x the loop at 100); at 1,000 clients only
#    the JAX forms (the loop would take about 2 minutes of the call).
bench small 75 --model=small_cnn --image_shape=28,28,1 --clients=10,100 \
  --executors=vmap,sequential --torch
bench small_1000 40 --model=small_cnn --image_shape=28,28,1 --clients=1000 \
  --executors=vmap,sequential --notorch
# FedQuad CNN: vmap and sequential at 10 / 100 / 1,000 (goal: vmap >=
# sequential at every size), then bf16 against bf16 autocast (goal: >= 30%
# of the bf16 peak), then the float32 peers at 100 clients: the eager loop,
# torch.func vmap and that step in torch.compile max-autotune.
bench fedquad 70 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=10,100,1000 --executors=vmap,sequential --notorch
bench fedquad_bf16 60 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=100,1000 --executors=vmap --notorch --precision=bf16
bench fedquad_bf16_peer 40 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=100 --executors=torch_vmap --notorch --notorch_compile \
  --precision=bf16
bench fedquad_peers 90 --model=fedquad_cnn --image_shape=32,32,3 \
  --clients=100 --executors=torch_vmap --torch \
  --torch_compile_modes=max-autotune

# 3. The implicit-GEMM convolution (a Pallas Triton kernel): tested only in
#    Pallas' interpreter so far, never timed.
step implicit_tests 45 "$PY" -m pytest -q -p no:cacheprovider \
  tests/test_implicit_conv.py tests/test_patch_conv.py
bench implicit 40 --model=fedquad_cnn --image_shape=32,32,3 --clients=100 \
  --executors=vmap --notorch --conv_impl=implicit

# 4. The quick tier of the suite on the GPU, with the time left: one line a
#    test (-v), so a run cut by the deadline still says what passed.
step suite 600 "$PY" -m pytest -v -p no:cacheprovider --quick tests -n 12 \
  -rfE --timeout=150

exit $status
