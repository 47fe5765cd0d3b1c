#!/usr/bin/env bash
# Use a short GPU loan fully (a lent machine: 1 GPU, 16 cores, no network, <= 10 minutes a command).
#
# Runs, at the same time and for at most LIMIT seconds:
#   * GPU_ONLY cells on the GPU, PER_GPU runs sharing it (the GPU-sized cells: SMAX ensembles, Half-Cheetah);
#   * CPU_ONLY cells on the remaining cores, one torch thread each;
# then stops both cleanly (SIGINT: each run finishes its round and checkpoints there) and packs every run
# directory they touched into $OUT/runs.tgz, plus the checkpoints of unfinished runs (so the next loan or a CPU
# machine resumes them) in ckpt.tgz.part*. Here: `bash ci/gpu_loan.sh --take-back FILES_AT results` (it keeps
# a run this machine trained further meanwhile), then `make publish-results PROFILE=paper`.
#
# Prepare once on the development machine (what the loan machine lacks, it cannot download):
#   bash ci/gpu_loan.sh --prepare        # wheels for py3.12 into .wheels/ (carry it)
# Then, through the device tool: carry [".wheels"] and run
#   LIMIT=500 GPU_ONLY='algo=plcql,spacql,task=smax-2s3z,tier=medium,seed=0,1,2' bash ci/gpu_loan.sh
# Datasets are built on the machine from committed artifacts (MPE in seconds; SMAX with the carried jaxmarl).
# The runs published in leaderboard/results count as done there (copied into RESULTS, not packed back), so
# a selection may name finished cells.
# The recommended loan (results campaign v2, item 6; rewritten 2026-12-07): the SMAX ensembles first, i.e. PLCQL
# and SPaCQL on 2s3z medium (the paper's SMAC ablation cell), 3 seeds each, one process per run on the GPU; the
# cores take the MPE v2 block's most expensive CPU cells still to do, seeds 3 and 4 of PLCQL and SPaCQL (stage
# mpe-v2-seeds-3-4; ~16-60 min a run at 1 thread here), and their checkpoints come back with the runs, so the
# home campaign resumes what the loan did not finish. Carrying [".wheels"]:
#   LIMIT=500 PER_GPU=6 CPU_JOBS=10 PREBUILD="smax-2s3z:medium" \
#   GPU_ONLY='algo=plcql,spacql,task=smax-2s3z,tier=medium,seed=0,1,2' \
#   CPU_ONLY='algo=plcql,spacql,task=mpe-cn,mpe-pp,mpe-world,seed=3,4' \
#   bash ci/gpu_loan.sh
# (Seeds 0-2 of every MPE v2 cell were done by 2026-12-07; finished cells are skipped anyway, and --take-back keeps
# whichever copy of a cell trained further when the home campaign reached it too.)
# Then Half-Cheetah at the paper budget (GPU_ONLY='algo=...,task=mamujoco-halfcheetah-2x3,...'): its four v2 tiers
# are in tolerance since 2026-12-06 and build on the machine from the committed checkpoints (1,000 episodes
# a tier: ~90-120 s of rollouts each here). Before the v2 block (2026-12-01), phase 1's World rows were the recommended loan:
#   LIMIT=500 PER_GPU=4 CPU_JOBS=7 STACK=3 \
#   PREBUILD="mpe-world:expert mpe-world:medium mpe-world:medium-replay mpe-world:random" \
#   GPU_ONLY='algo=plcql,task=mpe-world,seed=0,1,2;algo=spacql,task=mpe-world,seed=0,1,2' \
#   CPU_ONLY='algo=dof,task=mpe-cn,mpe-pp,mpe-world,seed=0,1,2' \
#   bash ci/gpu_loan.sh
# The 2s3z medium ablation column (stage plcql-ablations-smax-2s3z) is the loan after that (below).
# A second call on the warm machine (start it with `test -d results/paper || exit 3`, LIMIT ~265) resumes
# from the machine's results/ folder; both use ~14 minutes. Back here: pause the home campaign,
# `bash ci/gpu_loan.sh --take-back FILES_AT /work/campaign/results`, publish, resume.
# The SMAX 2s3z ensembles need their 2 GB tier built on the machine (~3 min) and ~16 GPU-minutes a run
# (PLCQL ~0.56 s a round on an H200 with the cores busy): a loan of their own.
# The CPU cells start at once (the cores train while the GPU is benched); the GPU cells start after the
# benches, with what is left of LIMIT. SPEED_BENCH="plcql+spacql:smax-6h_vs_8z" times other algorithms on
# the device (issue 19's P2 at n = 6). The 2026-11-27 loan (benches first, then the CN random study stacked):
#   LIMIT=520 PER_GPU=6 CPU_JOBS=8 STACK=3 BENCH_STACK=8 STACK_ROUNDS=8 \
#   STACK_BENCH="cfcql:mpe-cn plcql:mpe-cn cfcql:mamujoco-halfcheetah-2x3 plcql:mamujoco-halfcheetah-2x3" \
#   SPEED_BENCH="plcql+spacql:smax-6h_vs_8z" \
#   GPU_ONLY='algo=plcql,plcql-kn,plcql-lcb,plcql-uniform,plcql-k1,plcql-k2,plcql-w1,plcql-target-actors,task=mpe-cn,tier=random,seed=0,1,2' \
#   CPU_ONLY='algo=plcql-k2,task=mpe-cn,tier=medium-replay,seed=2;algo=plcql-w1,plcql-t0.1,plcql-t10,task=mpe-cn,tier=medium-replay,seed=0,1,2' \
#   bash ci/gpu_loan.sh
# Several seeds per GPU process: STACK=3 trains up to 3 seeds of each GPU_ONLY cell as stacked models
# (`all --stack`, the continuous CFCQL family; docs/runner.md), PER_GPU such processes sharing the GPU.
# STACK_BENCH="cfcql:mpe-cn plcql:mamujoco-halfcheetah-2x3 ..." first times, per algo:task, STACK separate
# rounds against one stacked round on the device (`bench-speed --stack`) into $OUT/stack_bench.log, e.g.
#   STACK=8 STACK_ROUNDS=10 STACK_BENCH="cfcql:mpe-cn plcql:mpe-cn cfcql:mamujoco-halfcheetah-2x3 \
#     plcql:mamujoco-halfcheetah-2x3" LIMIT=60 GPU_ONLY=... bash ci/gpu_loan.sh   (~4 device-minutes)
# Partial runs trained here resume there: `--pack-partial` (below) packs them into build/loan-ckpt/ckpt.tgz;
# carry [".wheels", "build/loan-ckpt"] and the first call unpacks them (2026-11-28: 51.1 + 2.7 + 9.5 MB for
# six CN PLCQL checkpoints, tree + wheels + tarball, of the 64 MiB).
# Check it here on CPU with a tiny budget (the smoke profile's cells; the project's python first on PATH):
#   PATH=$PWD/.venv/bin:$PATH DEVICE=cpu PROFILE=smoke LIMIT=60 OUT=/tmp/out RESULTS=/tmp/r DATA=/tmp/d \
#   GPU_ONLY='algo=plcql,task=mpe-cn,tier=random,seed=0' CPU_ONLY='algo=bc,cfcql,task=mpe-cn,tier=random,seed=0' \
#   bash ci/gpu_loan.sh          (checked 2026-11-27: 3 runs trained and packed in 18 s; later, a stack of 5 PLCQL
#   seeds and a CFCQL run stopped at LIMIT with checkpoints at rounds 33 and 547, and a second call resumed both)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

# Bytes of what a device call copies: the tracked files and the untracked ones git does not ignore.
tree_bytes() { (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | awk 'END {print $1}'; }

if [[ "${1:-}" == "--prepare" ]]; then
  mkdir -p .wheels
  # The versions this checkout's environment runs (datasets and scores must not depend on the machine).
  pins=$(python3 - <<'PY'
from importlib.metadata import version
names = "mpe2 pettingzoo gymnasium farama-notifications cloudpickle jaxmarl gymnax pytest pluggy iniconfig packaging".split()  # (the leaderboard is built here; pygame: ci/loan_stubs)
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
) || { echo "run --prepare with the project's python (make setup first)"; exit 2; }
  rm -f .wheels/*.whl
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d .wheels $pins
  grep -qx '/.wheels/' .git/info/exclude 2>/dev/null || echo '/.wheels/' >> .git/info/exclude
  du -sh .wheels
  # What a call carries: the tracked files, the untracked ones git does not ignore, and .wheels (<= 64 MiB).
  tree=$(tree_bytes)
  total=$(( tree + $(du -sb .wheels | cut -f1) ))
  echo "a call carries ~$(( total / 1048576 )) MiB of the device tool's 64 MiB"
  (( total < 64 * 1048576 )) || { echo "over 64 MiB: the device tool would refuse the call"; exit 2; }
  exit 0
fi

# Carry partial runs trained elsewhere (their checkpoints resume on any device):
#   bash ci/gpu_loan.sh --pack-partial FROM_RESULTS [PATH_REGEX]
# packs the interrupted runs under FROM_RESULTS/PROFILE (those matching PATH_REGEX, e.g.
# 'plcql-k[12]/mpe-cn/random'), the most rounds reached first, into build/loan-ckpt/ckpt.tgz, as many as
# fit the device tool's 64 MiB beside the tree and .wheels. Runs still training there (status "running")
# are left out. Carry [".wheels", "build/loan-ckpt"]: the first call on a machine unpacks it into RESULTS
# (once: a marker in RESULTS keeps a later call from rolling the runs back).
CARRY_DIR=${CARRY_DIR:-build/loan-ckpt}  # where --pack-partial writes and a loan looks for carried runs
if [[ "${1:-}" == "--pack-partial" ]]; then
  from=${2:?usage: --pack-partial FROM_RESULTS [PATH_REGEX]}
  tree=$(tree_bytes)
  wheels=$(du -sb .wheels 2>/dev/null | cut -f1)
  budget=$(( 64 * 1048576 - tree - ${wheels:-0} - 1048576 ))  # 1 MiB to spare
  mkdir -p "$CARRY_DIR" && rm -f "$CARRY_DIR/ckpt.tgz"
  python3 - "$from/${PROFILE:-paper}" "${3:-.}" "$budget" > "$CARRY_DIR/runs.txt" <<'PY' || exit 2
import json, os, re, sys
root, pattern, budget = sys.argv[1], re.compile(sys.argv[2]), int(sys.argv[3])
runs = []
for dirpath, _, files in os.walk(root):
    if "ckpt.pt" not in files or "final.json" in files or not pattern.search(dirpath):
        continue
    try:
        status = json.load(open(os.path.join(dirpath, "status.json")))
    except (OSError, ValueError):
        continue
    if status.get("status") == "running":
        continue
    size = sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    runs.append((status.get("reached") or status.get("update") or 0, size, dirpath))
used = 0
for reached, size, path in sorted(runs, reverse=True):
    if used + size * 0.85 > budget:  # gzip takes ~15 % off a checkpoint
        print(f"left out (no room): {path} at round {reached}", file=sys.stderr)
        continue
    used += size * 0.85
    print(os.path.relpath(path, os.path.dirname(root)))
PY
  [[ -s "$CARRY_DIR/runs.txt" ]] || { echo "no interrupted run to pack under $from"; exit 2; }
  tar -czf "$CARRY_DIR/ckpt.tgz" -C "$from" --files-from="$CARRY_DIR/runs.txt"
  size=$(du -b "$CARRY_DIR/ckpt.tgz" | cut -f1)
  echo "packed $(wc -l < "$CARRY_DIR/runs.txt") run(s), $(( size / 1048576 )) MiB; a call carries ~$(( (tree + ${wheels:-0} + size) / 1048576 )) MiB of 64"
  (( size <= budget )) || { rm -f "$CARRY_DIR/ckpt.tgz"; echo "over the budget: pack fewer (PATH_REGEX)"; exit 2; }
  exit 0
fi

# Take a loan's files back (on the development machine; pause the home campaign first):
#   bash ci/gpu_loan.sh --take-back FILES_AT RESULTS
# unpacks runs.tgz and ckpt.tgz.part* from FILES_AT into a staging folder and moves each run into RESULTS
# only where it is ahead: finished there, or a checkpoint at a later round than RESULTS holds (a run the
# home campaign trained further meanwhile is kept as it is). Then `make publish-results` (or
# `campaign publish --results-dir RESULTS`) publishes the finished ones.
if [[ "${1:-}" == "--take-back" ]]; then
  files=${2:?usage: --take-back FILES_AT RESULTS}; dest=${3:?usage: --take-back FILES_AT RESULTS}
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  tar -xzf "$files/runs.tgz" -C "$stage" || exit 2
  if compgen -G "$files/ckpt.tgz.part*" > /dev/null; then cat "$files"/ckpt.tgz.part* | tar -xzf - -C "$stage" || exit 2; fi
  python3 - "$stage" "$dest" <<'PY'
import json, os, shutil, sys
stage, dest = sys.argv[1], sys.argv[2]
def progress(run):
    if os.path.exists(os.path.join(run, "final.json")):
        return float("inf")
    try:
        s = json.load(open(os.path.join(run, "status.json")))
    except (OSError, ValueError):
        return -1
    return s.get("reached") or s.get("update") or 0
moved = kept = 0
for dirpath, _, files in sorted(os.walk(stage)):
    if "config.json" not in files:
        continue
    rel = os.path.relpath(dirpath, stage)
    here, there = os.path.join(dest, rel), progress(dirpath)
    if os.path.isdir(here) and progress(here) >= there:
        kept += 1
        print(f"kept (no further there): {rel}")
        continue
    if "final.json" not in files and "ckpt.pt" not in files:
        kept += 1  # an unfinished run whose checkpoint did not come back: nothing to resume from
        print(f"skipped (no checkpoint came back): {rel}")
        continue
    os.makedirs(os.path.dirname(here), exist_ok=True)
    if os.path.isdir(here):
        shutil.rmtree(here)
    shutil.copytree(dirpath, here)
    moved += 1
print(f"took back {moved} run(s) into {dest}; kept {kept} as they were")
PY
  exit $?
fi

LIMIT=${LIMIT:-500}              # seconds of training before the clean stop
PROFILE=${PROFILE:-paper}
DEVICE=${DEVICE:-cuda}
PER_GPU=${PER_GPU:-3}
GPU_ONLY=${GPU_ONLY:-algo=plcql,spacql,task=smax-2s3z,tier=medium,seed=0,1,2}
CPU_ONLY=${CPU_ONLY:-algo=plcql,task=mpe-cn,tier=random,seed=0,1,2}
PREBUILD=${PREBUILD:-}          # "task:tier ..." built in parallel before training (checked against the cards)
STACK=${STACK:-1}                # seeds of a GPU_ONLY cell trained in one process as stacked models
STACK_BENCH=${STACK_BENCH:-}     # "algo:task ..." timed with bench-speed --stack $STACK before training
BENCH_STACK=${BENCH_STACK:-$(( STACK > 1 ? STACK : 3 ))}  # seeds per stacked round in STACK_BENCH
STACK_ROUNDS=${STACK_ROUNDS:-10} # timed pairs per STACK_BENCH entry (rounds per SPEED_BENCH entry)
SPEED_BENCH=${SPEED_BENCH:-}     # "algo[+algo]:task ..." timed with bench-speed on the device before training
LOAN_TESTS=${LOAN_TESTS:-}       # pytest arguments run on this machine beside the training (the CUDA-only tests)
CPU_JOBS=${CPU_JOBS:-$(( $(nproc) > 4 ? $(nproc) - 4 : 1 ))}  # leave cores for the GPU runs' hosts
OUT=${OUT:-$ROOT/build/loan-out}
RESULTS=${RESULTS:-$ROOT/results}
DATA=${DATA:-$ROOT/data}
mkdir -p "$OUT" "$RESULTS" "$DATA"
# Partial runs carried in (--pack-partial): unpacked once per machine, before anything reads RESULTS.
if [[ -f "$CARRY_DIR/ckpt.tgz" && ! -e "$RESULTS/.loan-ckpt-unpacked" ]]; then
  tar -xzf "$CARRY_DIR/ckpt.tgz" -C "$RESULTS" && touch "$RESULTS/.loan-ckpt-unpacked" \
    && echo "unpacked $(tar -tzf "$CARRY_DIR/ckpt.tgz" | grep -c '/ckpt.pt$') carried checkpoint(s) into $RESULTS"
fi
t0=$(date +%s)
log() { echo "[loan +$(( $(date +%s) - t0 ))s] $*"; }

# The package without installing it: plcql_bench.* as links to the checkout's folders.
PKG=$(mktemp -d)
mkdir -p "$PKG/plcql_bench"
cp suite/_root/__init__.py "$PKG/plcql_bench/__init__.py"
for sub in suite algorithms datasets leaderboard; do ln -s "$ROOT/$sub" "$PKG/plcql_bench/$sub"; done
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
if [[ -d .wheels ]]; then
  python3 -m pip install -q --no-deps --no-index --find-links .wheels --target "$PKG/deps" .wheels/*.whl \
    2>&1 | tail -2
  export PYTHONPATH="$PYTHONPATH:$PKG/deps"
fi
# MPE imports pygame only to draw; without it (its wheel would put the trip over 64 MiB) a render-only stub.
python3 -c "import pygame" 2>/dev/null || export PYTHONPATH="$PYTHONPATH:$ROOT/ci/loan_stubs"
BENCH=(python3 -m plcql_bench.suite.commands.main --data-dir "$DATA" --results-dir "$RESULTS")
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true
# Fail fast (a lent minute is precious): the CLI and the MPE env must import.
python3 -c "import plcql_bench.suite.commands.main, mpe2" || { log "imports failed"; exit 2; }
# PROFILE may be a built-in name or a .yaml path; runs and datasets live under the profile's own name.
PROFILE_NAME=$(python3 -c 'import sys
from plcql_bench.suite.runs.profiles import load_profile
from plcql_bench.suite.core.errors import BenchError
try:
    print(load_profile(sys.argv[1]).name)
except BenchError as exc:
    sys.exit(f"PROFILE: {exc}")' "$PROFILE") || exit 2
log "images: $(command -v podman docker buildah 2>/dev/null | tr '\n' ' ')(none listed = cannot build images here)"

# The runs already published count as done here too (this machine sees only the working tree): `campaign
# adopt` copies them into RESULTS, so `all` skips their cells; they are not packed for the trip back.
"${BENCH[@]}" campaign adopt --profile "$PROFILE" --from leaderboard/results 2>&1 | tail -1

# Datasets first, one process per tier, then each one against its committed card: a run on a dataset
# that is neither the card's file nor a rebuild of it (another CPU's rounding, datasets/cards.py) would not be
# the committed cell (its run key would differ).
if [[ -n "$PREBUILD" ]]; then
  for tt in $PREBUILD; do
    "${BENCH[@]}" datasets build --profile "$PROFILE" "${tt%%:*}" "${tt#*:}" > "$OUT/build.${tt//[:\/]/_}.tmp" 2>&1 &
  done
  wait
  cat "$OUT"/build.*.tmp > "$OUT/build.log"; rm -f "$OUT"/build.*.tmp
  python3 - "$DATA/$PROFILE_NAME/manifest.json" <<'PY' | tee -a "$OUT/build.log"
import json, sys
from pathlib import Path
from plcql_bench.datasets.cards import committed_entry, dataset_identity
for key, entry in sorted(json.loads(Path(sys.argv[1]).read_text()).items()):
    card = committed_entry(entry["profile"], entry["task_id"], entry["quality"])
    name, rebuild = dataset_identity(entry)
    verdict = ("no card" if card is None else "sha ok" if card["sha256"] == entry["sha256"] else
               f"rebuild of the card (statistics within {rebuild['max_rel_diff']:.1e})" if rebuild else
               f"SHA DIFFERS from the card's {card['sha256'][:12]}")
    print(f"{key}: {verdict} {entry['sha256'][:12]}")
PY
  log "datasets built"
fi

# The stop: SIGINT at LIMIT seconds after the start (runs checkpoint the round they are in and record
# 'interrupted'), SIGKILL 30 s later. The CPU cells start at once: the cores train while the GPU is benched.
# CPU_ONLY may hold several selections separated by ';' (one queue, `all --queue`, in the order given).
remaining() { echo $(( LIMIT - ($(date +%s) - t0) > 30 ? LIMIT - ($(date +%s) - t0) : 30 )); }
IFS=';' read -ra cpu_sels <<< "$CPU_ONLY"
cpu_queue=(); for sel in "${cpu_sels[@]}"; do cpu_queue+=(--queue "$sel"); done
OMP_NUM_THREADS=1 timeout -s INT -k 30 "$(remaining)" "${BENCH[@]}" all --profile "$PROFILE" --device cpu \
  --jobs "$CPU_JOBS" "${cpu_queue[@]}" > "$OUT/cpu.log" 2>&1 &
cpu_pid=$!

# Tests that only a GPU machine can run (skipped on the CPU CI), e.g. LOAN_TESTS="tests/test_device_resume.py":
# in the background, a few cores' worth, into $OUT/tests.log.
if [[ -n "$LOAN_TESTS" ]]; then
  OMP_NUM_THREADS=1 timeout -k 10 240 python3 -m pytest -q -p no:cacheprovider $LOAN_TESTS > "$OUT/tests.log" 2>&1 &
  tests_pid=$!
fi

# Stacked seeds against separate rounds on this device (the issue-19 target: >= 3x runs per hour on a GPU).
if [[ -n "$STACK_BENCH" ]]; then
  for at in $STACK_BENCH; do
    OMP_NUM_THREADS=1 timeout -k 10 150 "${BENCH[@]}" bench-speed --algo "${at%%:*}" --task "${at#*:}" \
      --device "$DEVICE" --stack "$BENCH_STACK" --rounds "$STACK_ROUNDS" --warmup 2 --no-floor \
      >> "$OUT/stack_bench.log" 2>&1 || { echo "bench-speed $at: exit $?" >> "$OUT/stack_bench.log"; stack_failed=1; }
  done
  grep -h "^#\|^[a-z]" "$OUT/stack_bench.log" | grep -v "^# torch" ; log "stack bench done"
  # An untried path must not cost the loan's training: a stack that failed its bench trains unstacked.
  if [[ -n "${stack_failed:-}" && "$STACK" -gt 1 ]]; then log "a stack bench failed: training with STACK=1"; STACK=1; fi
fi

# Other timings on this device: SPEED_BENCH="plcql+spacql:smax-6h_vs_8z ..." runs bench-speed for those
# algorithms on that task (PLCQL with SPaCQL: their paired per-round ratio) into $OUT/speed_bench.log.
for at in $SPEED_BENCH; do
  algo_args=(); IFS='+' read -ra bench_algos <<< "${at%%:*}"
  for a in "${bench_algos[@]}"; do algo_args+=(--algo "$a"); done
  OMP_NUM_THREADS=1 timeout -k 10 240 "${BENCH[@]}" bench-speed "${algo_args[@]}" --task "${at#*:}" \
    --device "$DEVICE" --rounds "$STACK_ROUNDS" --warmup 2 --no-floor \
    >> "$OUT/speed_bench.log" 2>&1 || echo "bench-speed $at: exit $?" >> "$OUT/speed_bench.log"
done
[[ -n "$SPEED_BENCH" ]] && { grep -h "^#\|^[a-z]" "$OUT/speed_bench.log"; log "speed bench done"; }

export OMP_NUM_THREADS=1
# GPU_ONLY may hold several selections separated by ';' (e.g. the SMAX ensembles and a stage of MPE ablations):
# one `all` process each, all sharing the GPU, PER_GPU runs (or stacks) apiece; logs gpu.log, gpu.2.log, ...
gpu_pids=()
IFS=';' read -ra gpu_sels <<< "$GPU_ONLY"
for i in "${!gpu_sels[@]}"; do
  glog="$OUT/gpu.log"; (( i > 0 )) && glog="$OUT/gpu.$(( i + 1 )).log"
  timeout -s INT -k 30 "$(remaining)" "${BENCH[@]}" all --profile "$PROFILE" --device "$DEVICE" --per-gpu "$PER_GPU" \
    --stack "$STACK" --only "${gpu_sels[$i]}" > "$glog" 2>&1 &
  gpu_pids+=($!)
done
for i in "${!gpu_pids[@]}"; do wait "${gpu_pids[$i]}"; log "gpu part $(( i + 1 )) (${gpu_sels[$i]}) exit $?"; done
wait $cpu_pid; log "cpu part exit $?"
[[ -n "${tests_pid:-}" ]] && { wait "$tests_pid"; log "loan tests exit $?: $(tail -n 1 "$OUT/tests.log")"; }

# Pack for the trip back (the tool returns at most 8 files of <= 16 MiB, 64 MiB in all): every run's small files in
# runs.tgz, and the checkpoints of unfinished runs only (so the next loan or a CPU machine resumes them)
# in <= 15 MiB parts ckpt.tgz.part* (cat them | tar -xzf - over results/).
(cd "$RESULTS" && find . -name config.json -printf '%h\n' | sort -u \
   | while read -r d; do [[ -e "$ROOT/leaderboard/results/$d/final.json" ]] || echo "$d"; done > "$OUT/runs.txt"
 tar -czf "$OUT/runs.tgz" --files-from=<(while read -r d; do
   for f in final.json config.json metrics.jsonl status.json run.log; do [[ -e "$d/$f" ]] && echo "$d/$f"; done
 done < "$OUT/runs.txt")
 while read -r d; do [[ -e "$d/ckpt.pt" && ! -e "$d/final.json" ]] && echo "$d/ckpt.pt"; done < "$OUT/runs.txt" \
   > "$OUT/unfinished.all.txt"
 # The trip back holds 64 MiB in all: checkpoints up to CKPT_MB, the most work at stake first (rounds reached x
 # checkpoint size: a big ensemble's round costs more to redo); those left out are listed in ckpt_left_out.txt
 # (a warm machine still has them for the next call).
 python3 - "$OUT/unfinished.all.txt" "${CKPT_MB:-56}" > "$OUT/unfinished.txt" 2> "$OUT/ckpt_left_out.txt" <<'PY'
import json, os, sys
paths = [line.strip() for line in open(sys.argv[1]) if line.strip()]
def reached(ckpt):
    try:
        return json.load(open(os.path.join(os.path.dirname(ckpt), "status.json"))).get("reached", 0)
    except (OSError, ValueError):
        return 0
budget, used = float(sys.argv[2]) * 2**20, 0
for ckpt in sorted(paths, key=lambda c: reached(c) * os.path.getsize(c), reverse=True):
    size = os.path.getsize(ckpt)
    if used + size <= budget:
        used += size
        print(ckpt)
    else:
        print(f"{ckpt} (round {reached(ckpt)}, {size / 2**20:.1f} MiB): over CKPT_MB", file=sys.stderr)
PY
 [[ -s "$OUT/unfinished.txt" ]] && tar -cf - --files-from="$OUT/unfinished.txt" | gzip -1 \
   | split -b 15M - "$OUT/ckpt.tgz.part")
"${BENCH[@]}" status > "$OUT/status.txt" 2>&1
log "packed $(wc -l < "$OUT/runs.txt") run(s), $(wc -l < "$OUT/unfinished.txt") checkpoint(s): $(du -ch "$OUT"/*.tgz* | tail -1 | cut -f1)$([[ -s "$OUT/ckpt_left_out.txt" ]] && echo "; $(wc -l < "$OUT/ckpt_left_out.txt") left out (ckpt_left_out.txt)")"
for f in "$OUT"/gpu*.log "$OUT/cpu.log"; do echo "== $f"; tail -n 3 "$f"; done
# The logs travel as one file (logs.tgz), so the tool's 8 files are runs.tgz, logs.tgz and <= 6 checkpoint parts.
(cd "$OUT" && logs=$(ls -- *.log *.txt 2>/dev/null) && tar -czf logs.tgz $logs && rm -f $logs)
[[ $(ls "$OUT" | wc -l) -le 8 ]] || log "WARNING: $(ls "$OUT" | wc -l) files under OUT; the tool returns 8"
rm -rf "$PKG"
