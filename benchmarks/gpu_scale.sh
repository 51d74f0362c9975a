#!/usr/bin/env bash
# The GPU issue's row 4, one prepared device call: the population study of
# docs/results/scale.md on the GPU, SCAFFOLD and FedAvg at 10^6 clients,
# 10,000 a round, the client table on disk and in host memory (the CPU
# study's `launch.scale` command with a cohort ten times larger).
#
#   OUT=/dir bash benchmarks/gpu_scale.sh      # -> $OUT/scale.tar.gz
#
# Each point is its own process with its own time limit (--timeout); the
# whole call stops by LIMIT seconds (default 480). The tool returns at most
# 8 files, so the study's folder comes back as one archive.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the archive}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
STUDY=$(mktemp -d)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout -s TERM -k 30 "${LIMIT:-480}" "$PY" -m launch.scale --out="$STUDY/scale" \
  --populations=1000000 --cohorts=10000 --algorithms=scaffold,fedavg \
  --placements=disk,host --seeds=0 --rounds=12 --eval_every=4 --timeout=400 \
  2>&1 | tee "$STUDY/scale.log"
tar czf "$OUT/scale.tar.gz" -C "$STUDY" .
