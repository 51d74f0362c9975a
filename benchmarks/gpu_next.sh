#!/usr/bin/env bash
# The next GPU session's first device call: about 9 minutes at most, the
# most wanted numbers first (benchmarks/gpu_pending.md says why each).
#
#   OUT=/some/dir bash benchmarks/gpu_next.sh     # on the device tool: $OUT is set
#
# Each command has its own time limit, so one that runs long costs its own
# share and not the rest. Logs and tables go to $OUT (they come back); a
# failed command is reported and the next one still runs.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs and tables}
mkdir -p "$OUT"
status=0
step() {  # step NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, time it.
  local name=$1 seconds=$2
  shift 2
  local start=$SECONDS
  timeout "$seconds" "$@" 2>&1 | tee "$OUT/$name.log"
  local code=${PIPESTATUS[0]}
  echo "== $name: exit $code after $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
  [ "$code" -eq 0 ] || status=1
}

# What the image lacks shows here in seconds, not after the first command.
step imports 60 python -c "import jax, flax, optax, absl, ml_collections, orbax.checkpoint, sklearn, tqdm; print(jax.devices())"

# 1. FedMetric's protocol (10,000 one-step rounds of 10 clients, evaluated
#    every 500) with the clients vmapped, the form meant for GPUs: the
#    2-minute goal measured on this CPU at 342 s (benchmarks/cpu_rounds.md).
step rounds 300 python -m benchmarks.rounds_bench \
  --cases=fedmetric_protocol_vmap,fedmetric_1step_scan_vmap,fedavg_1step_scan_vmap \
  --out="$OUT/rounds_gpu.md"

# 2. The implicit-GEMM convolution (a Pallas Triton kernel): tested only in
#    Pallas' interpreter so far, never timed.
step implicit_tests 120 python -m pytest -q tests/test_implicit_conv.py tests/test_patch_conv.py
step implicit_bench 100 python -m benchmarks.bench --rounds=3 --model=fedquad_cnn \
  --image_shape=32,32,3 --clients=10,100 --executors=vmap --notorch \
  --conv_impl=implicit --out="$OUT/bench_implicit.md"

exit $status
