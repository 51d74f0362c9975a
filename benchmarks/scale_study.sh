#!/usr/bin/env bash
# The population / cohort / model-size study of docs/results/scale.md:
#
#   bash benchmarks/scale_study.sh [OUT]        # OUT defaults to runs/scale
#
# Every point is its own process; a study that stops resumes where it
# stopped (finished points are read back, not rerun). About 40 minutes on
# 2 CPU cores; run it on a quiet machine, since it measures time.
set -euo pipefail
OUT=${1:-runs/scale}
run() { nice -n 5 python -m launch.scale "$@" --rounds=12 --eval_every=4 --timeout=1800; }
run --out="$OUT/population" --populations=1000,10000,100000,1000000 --cohorts=1000 \
  --algorithms=fedavg,scaffold --placements=host,disk --seeds=0,1,2
run --out="$OUT/population" --populations=1000,10000,100000,1000000 --cohorts=1000 \
  --algorithms=scaffold --placements=disk --noprefetch --seeds=0,1,2
run --out="$OUT/cohort" --populations=1000000 --cohorts=10,100,1000,10000 \
  --algorithms=fedavg,scaffold,fedau --placements=disk --seeds=0,1,2
run --out="$OUT/mlp" --model=mlp --populations=1000,10000,100000,1000000 --cohorts=1000 \
  --algorithms=fedavg,scaffold --placements=disk
