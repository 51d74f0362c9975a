#!/usr/bin/env bash
# The GPU issue's row 3, one prepared device call (after
# benchmarks/gpu_next.sh has run; benchmarks/gpu_pending.md says how to call
# it and what to carry):
#
#   OUT=/dir bash benchmarks/gpu_fedrcl_resnet.sh
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/gpu_fedrcl_resnet.sh
#
# FedRCL vs FedAvg with the paper's ResNet-18 (GroupNorm, five contrast
# levels) on Fashion-MNIST, alpha 0.1, 500 rounds, seeds 0-2
# (`reproduce fedrcl table1 --scale=gpu500`), all six runs at once on the
# one GPU, until DEADLINE seconds (default 540). A ResNet-18 checkpoint
# (45 MB) cannot travel back and forth within the device tool's 64 MiB, so
# what carries over between calls is the finished runs (their workdirs
# without checkpoints, which the sweep reads as done and skips):
# $OUT/fedrcl_gpu500.tar.gz, to be put in .gpu_runs/ for the next call. Runs
# cut by the deadline start over in the next call; how far each got is in
# progress.txt ($OUT/logs.tar.gz).
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the archives}
DEADLINE=${DEADLINE:-540}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if [ -d .data ]; then export FEDJAX_METRIC_DATA_DIR=$PWD/.data; fi

run() {  # run SECONDS COMMAND...: until the deadline at most; SIGTERM first,
  # so a sweep saves its points' checkpoints and says how far each got.
  local seconds=$1
  shift
  local left=$((DEADLINE - SECONDS - 40))  # 40 s to pack the results.
  ((seconds > left)) && seconds=$left
  if [ -n "${DRY_RUN:-}" ]; then
    echo "(${seconds} s): $*"
    return
  fi
  timeout -s TERM -k 30 "$seconds" "$@" 2>&1 | tee -a "$LOGS/run.log"
  echo "== exit ${PIPESTATUS[0]} after $SECONDS s" | tee -a "$LOGS/run.log"
}

root=runs/reproduce/fedrcl_table1_gpu500
if [ -f .gpu_runs/fedrcl_gpu500.tar.gz ]; then
  mkdir -p "$root" && tar xzf .gpu_runs/fedrcl_gpu500.tar.gz -C "$root"
fi
run 600 "$PY" -m launch.reproduce fedrcl table1 --scale=gpu500 \
  --methods='FedAvg;FedRCL' --columns='alpha = 0.1' --seeds=3 \
  --parallel="${PARALLEL:-6}"
[ -n "${DRY_RUN:-}" ] && exit 0
# Finished: summary.json holds rounds_completed == 500.
finished=()
for summary in "$root"/*/*/summary.json; do
  [ -f "$summary" ] || continue
  "$PY" -c 'import json, sys; s = json.load(open(sys.argv[1]))
sys.exit(s.get("rounds_completed") != 500)' "$summary" || continue
  run_dir=$(dirname "$summary")
  finished+=("${run_dir#"$root"/}")
done
for metrics in "$root"/*/*/metrics.jsonl; do
  [ -f "$metrics" ] || continue
  echo "$(dirname "$metrics"): last round $(tail -n 1 "$metrics" \
    | "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read())["round"])')" \
    >> "$LOGS/progress.txt"
done
if ((${#finished[@]})); then
  tar czf "$OUT/fedrcl_gpu500.tar.gz" -C "$root" --exclude=checkpoints \
    "${finished[@]}"
fi
tar czf "$OUT/logs.tar.gz" -C "$LOGS" .
