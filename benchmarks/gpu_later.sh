#!/usr/bin/env bash
# The GPU issue's later rows, one prepared device call each (after
# benchmarks/gpu_next.sh has run): benchmarks/gpu_pending.md says how to call
# them and what to carry.
#
#   OUT=/dir bash benchmarks/gpu_later.sh fedrcl_resnet   # row 3
#   OUT=/dir bash benchmarks/gpu_later.sh scale           # row 4
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/gpu_later.sh fedrcl_resnet
#
# fedrcl_resnet: FedRCL vs FedAvg with the paper's ResNet-18 (GroupNorm,
# five contrast levels) on Fashion-MNIST, alpha 0.1, 500 rounds, seeds 0-2
# (`reproduce fedrcl table1 --scale=gpu500`), all six runs at once on the
# one GPU. A ResNet-18 checkpoint (45 MB) cannot travel back and forth
# within the device tool's 64 MiB, so what carries over between calls is
# the finished runs (their workdirs without checkpoints, which the sweep
# reads as done and skips): $OUT/fedrcl_gpu500.tar.gz, to be put in
# .gpu_runs/ for the next call. Runs cut by the deadline start over in the
# next call; how far each got is in progress.txt.
#
# scale: the population study on the GPU: SCAFFOLD and FedAvg, 10^6
# clients, 10,000 a round, the client table on disk and in host memory
# (`launch.scale`, the CPU study's command with a larger cohort).
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the archives}
DEADLINE=${DEADLINE:-540}
PY=${PYTHON:-python3}
WHAT=${1:?name fedrcl_resnet or scale}
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

case "$WHAT" in
  fedrcl_resnet)
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
    ;;
  scale)
    run 480 "$PY" -m launch.scale --out="$LOGS/scale" --populations=1000000 \
      --cohorts=10000 --algorithms=scaffold,fedavg --placements=disk,host \
      --seeds=0 --rounds=12 --eval_every=4 --timeout=400
    ;;
  *)
    echo "unknown row $WHAT: name fedrcl_resnet or scale" >&2
    exit 2
    ;;
esac
tar czf "$OUT/logs.tar.gz" -C "$LOGS" .
