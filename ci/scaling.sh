#!/usr/bin/env bash
# Scaling figure: wall-clock of the same 8 smoke runs (BC and CFCQL on MPE CN random, 4 seeds,
# the smoke profile's budget) with `all --jobs 1`, `all --jobs 2` and `all --executor ray`
# on 2 workers. Datasets are built once beforehand and every variant starts from empty results.
#   bash ci/scaling.sh            (run it on a quiet machine; it prints the load average too)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
WORK=$(mktemp -d /tmp/plcql-scaling.XXXX)
trap 'rm -rf "$WORK"' EXIT
BENCH="$BIN/plcql-bench --data-dir $WORK/data"
ONLY="algo=bc,cfcql,tier=random,seed=0,1,2,3"
# The smoke profile with 4 seeds (its matrix has 2): same budget, so the same runs as smoke's.
sed 's/^  seeds: \[0, 1\]/  seeds: [0, 1, 2, 3]/; s/^name: smoke/name: scaling/' suite/runs/profiles/smoke.yaml > "$WORK/scaling.yaml"
$BENCH datasets build mpe-cn random --profile "$WORK/scaling.yaml" >/dev/null

timeit() {  # label, then the `all` arguments
  local label=$1; shift
  local t0 t1
  t0=$(date +%s%N)
  $BENCH --results-dir "$WORK/results-$label" all --profile "$WORK/scaling.yaml" --only "$ONLY" "$@" >/dev/null
  t1=$(date +%s%N)
  printf '%-10s %7.1f s   (%s)\n' "$label" "$(awk "BEGIN{print ($t1 - $t0) / 1e9}")" \
    "$(uptime | sed 's/.*load average/load average/')"
}

echo "8 smoke runs on $(nproc) cores, $(date -u +%FT%TZ)"
timeit jobs1 --jobs 1
# The same, with one torch thread (what each of the 2 parallel jobs gets): separates the gain of
# running 2 at once from the cost of 2-thread intra-op parallelism on a busy machine.
OMP_NUM_THREADS=1 timeit jobs1-1thr --jobs 1
timeit jobs2 --jobs 2
if "$BIN/python" -c "import ray" 2>/dev/null; then
  timeit ray2 --executor ray --jobs 2
else
  echo "ray2       skipped (pip install 'plcql-bench[ray]')"
fi
