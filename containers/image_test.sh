#!/usr/bin/env bash
# Build the CPU image on a local debootstrap base and smoke-run it with /data and /results
# mounted. Minutes (debootstrap, apt and pip inside the build). Run by `make image-test` and by
# .ci/run. Needs root and apt (it installs podman, buildah, runc and debootstrap when missing).
#
#   bash containers/image_test.sh                 # or: make image-test
#   WORK=/tmp/it bash containers/image_test.sh    # work folder (default: build/image-test)
#   IMAGE=localhost/plcql-bench:ci-1 RM_IMAGE=1 bash containers/image_test.sh   # what .ci/run does
#
# Exit status: 0 = IMAGE-TEST OK; 1 = the image failed to build or to run (a real failure);
# 3 = this machine cannot build images (not root, no apt, tools not installable, or too little free
# disk: under MIN_FREE_GB before the build, or full during it): nothing was tested.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BASE=${BASE:-localhost/debian-bookworm-minbase:local}
IMAGE=${IMAGE:-localhost/plcql-bench:cpu-test}
RM_IMAGE=${RM_IMAGE:-0}                      # 1: remove IMAGE at the end (CI; the base stays cached)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=${WORK:-$ROOT/build/image-test}
ONLY=${ONLY:-algo=bc,seed=0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-1500}         # seconds for one build attempt
# The build needs a few GiB: the torch layer is ~1 GiB, written once to podman's storage and once
# more, as a tar, to buildah's temporary folder while the layer is committed.
MIN_FREE_GB=${MIN_FREE_GB:-6}
RECLAIM=${RECLAIM:-1}                        # 0: never prune podman's storage when the disk is low

log() { printf '\n== %s\n' "$*"; }
cannot() { echo "IMAGE-TEST NOT RUN: $*" >&2; exit 3; }

# Two attempts for the steps that download (Debian mirror, PyPI): a network hiccup must not fail
# CI. A second failure is real. Layers cached by the first attempt make the second one cheap.
retry() {
  "$@" && return 0
  echo "-- attempt 1 failed (rc $?): retrying once in 10 s: $*" >&2
  sleep 10
  "$@"
}

# ---------------------------------------------------------------------------- tools
[ "$(id -u)" = 0 ] || cannot "needs root (podman/buildah as root, debootstrap)"

# One image test at a time on a machine (they share the base image and podman's storage).
mkdir -p "$WORK"
exec 9>/tmp/plcql-image-test.lock
flock 9

# ---------------------------------------------------------------------------- disk
# A machine whose disk is (nearly) full cannot test the image; that is the machine's state, not the
# image's, so it is reported as "not run" (exit 3) rather than as a failed build. Checked on podman's
# storage, buildah's temporary folder and $WORK, after reclaiming what earlier builds left behind.
nearest() { local d=$1; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; echo "$d"; }
free_gb() { df -Pk "$(nearest "$1")" | awk 'NR == 2 { print int($4 / 1048576) }'; }
STORE=$(podman info --format '{{.Store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)
BUILD_TMP=${TMPDIR:-/var/tmp}
low_disk() {
  local dir
  for dir in "$STORE" "$BUILD_TMP" "$WORK"; do
    if [ "$(free_gb "$dir")" -lt "$MIN_FREE_GB" ]; then echo "$dir ($(free_gb "$dir") GiB free)"; return 0; fi
  done
  return 1
}
if where=$(low_disk); then
  if [ "$RECLAIM" = 1 ]; then
    echo "-- low disk: $where; removing leftover build containers and dangling images" >&2
    buildah rm --all >/dev/null 2>&1 || true
    podman image prune -f >/dev/null 2>&1 || true
    where=$(low_disk) || where=
  fi
  [ -z "$where" ] || cannot "too little free disk: $where, needs $MIN_FREE_GB GiB (MIN_FREE_GB)"
fi

need=()
for tool in podman buildah runc debootstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || cannot "missing ${need[*]} and no apt-get to install them"
  log "installing ${need[*]} (apt)"
  retry apt-get update -qq || cannot "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive retry apt-get install -y -qq --no-install-recommends \
    podman buildah runc debootstrap debian-archive-keyring ca-certificates >/dev/null \
    || cannot "apt-get install podman buildah runc debootstrap failed"
fi

# ---------------------------------------------------------------- podman configuration
# runc, not crun (crun fails on cgroup v1 hybrid hosts), and ulimits within this machine's hard
# limits (podman's defaults exceed them where root lacks CAP_SYS_RESOURCE). nproc stays <= 32768:
# runc fails at the full hard limit on such hosts. Written to $WORK, /etc is untouched.
hard() { local v; v=$(ulimit -H "$1"); [ "$v" = unlimited ] && v=$2; echo $((v < $2 ? v : $2)); }
NOFILE=$(hard -n 20000)
NPROC=$(hard -u 32768)
sed -e "s/nofile=[0-9]*:[0-9]*/nofile=$NOFILE:$NOFILE/" -e "s/nproc=[0-9]*:[0-9]*/nproc=$NPROC:$NPROC/" \
  "$ROOT/containers/containers.conf" >"$WORK/containers.conf"
export CONTAINERS_CONF=$WORK/containers.conf
# Storage: podman's default driver (overlay) where it works; vfs where it does not (overlay on
# overlayfs, some nested containers). STORAGE_DRIVER is read by podman and buildah alike.
if ! podman info >"$WORK/podman-info.txt" 2>&1; then
  echo "-- podman info failed with the default storage driver; using vfs:" >&2
  tail -n 3 "$WORK/podman-info.txt" >&2
  export STORAGE_DRIVER=vfs
  podman info >"$WORK/podman-info.txt" 2>&1 || { cat "$WORK/podman-info.txt" >&2; cannot "podman does not start"; }
fi
echo "podman $(podman version --format '{{.Client.Version}}'), storage $(podman info --format '{{.Store.GraphDriverName}}')," \
  "runtime runc, ulimits nofile=$NOFILE nproc=$NPROC"

# ---------------------------------------------------------------------------- base
make_base() {
  local rootfs
  rootfs=$(mktemp -d /tmp/plcql-rootfs.XXXXXX)
  if ! debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
    tail -n 5 "$WORK/debootstrap.log" >&2; rm -rf "$rootfs"; return 1
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null \
    || { rm -rf "$rootfs"; return 1; }
  rm -rf "$rootfs"
}
if ! podman image exists "$BASE"; then
  log "base: debootstrap bookworm minbase -> $BASE"
  t0=$SECONDS
  retry make_base
  echo "base: $((SECONDS - t0)) s"
else
  log "base: $BASE already present"
fi

# ---------------------------------------------------------------------------- build
# Build context: the tracked and untracked-but-not-ignored files only (no .venv, data, results).
log "context"
rm -rf "$WORK/context" "$WORK/data" "$WORK/results"
mkdir -p "$WORK/context" "$WORK/data" "$WORK/results"
git ls-files -z -co --exclude-standard | tar --null -T - -c | tar -C "$WORK/context" -x

COMMIT=$(git rev-parse HEAD)
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
build_args=(--build-arg "BASE_IMAGE=$BASE" --build-arg "GIT_COMMIT=$COMMIT" --build-arg "BUILD_DATE=$BUILD_DATE")
volumes=()
if [ -d /opt/wheels ]; then   # this machine's local torch CPU wheel
  volumes=(-v /opt/wheels:/wheels:ro)
  build_args+=(--build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_EXTRA_INDEX_URL=)
fi
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then   # the host's CA bundle (TLS-intercepting proxy)
  volumes+=(-v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro)
  build_args+=(--build-arg PIP_CERT=/host-ca.crt)
fi

cleanup() { [ "$RM_IMAGE" = 1 ] && podman rmi -f "$IMAGE" >/dev/null 2>&1; true; }
trap cleanup EXIT

# Docker image format: the OCI format cannot hold the Dockerfile's SHELL (buildah warns and drops it).
# --force-rm: a failed build leaves no working container (a full one holds GiBs).
# --layers: unchanged steps come from podman's layer cache (the Dockerfiles put the per-commit
# labels last, so a new commit rebuilds only the package layer).
build() {
  timeout "$BUILD_TIMEOUT" buildah bud --isolation chroot --format docker --layers --force-rm "${volumes[@]}" "${build_args[@]}" \
    -f "$WORK/context/containers/Dockerfile.cpu" -t "$IMAGE" "$WORK/context" >"$WORK/build.log" 2>&1 \
    || { echo "-- build failed; last lines of $WORK/build.log:" >&2; tail -n 30 "$WORK/build.log" >&2; return 1; }
}
log "build $IMAGE (buildah bud --isolation chroot)"
t0=$SECONDS
if ! retry build; then
  if grep -q "no space left on device" "$WORK/build.log"; then
    cannot "the disk filled during the build ($(low_disk || echo "now $(free_gb "$BUILD_TMP") GiB free in $BUILD_TMP"))"
  fi
  exit 1
fi
tail -n 5 "$WORK/build.log"
echo "build: $((SECONDS - t0)) s"
podman image inspect "$IMAGE" --format '{{json .Config.Labels}}'

# ---------------------------------------------------------------------------- smoke run
run() {
  podman run --rm --runtime runc --ulimit "nofile=$NOFILE:$NOFILE" --ulimit "nproc=$NPROC:$NPROC" \
    -v "$WORK/data:/data" -v "$WORK/results:/results" "$IMAGE" "$@"
}

log "run: plcql-bench all --profile smoke --only $ONLY"
t0=$SECONDS
run all --profile smoke --only "$ONLY"
echo "run: $((SECONDS - t0)) s"
log "run: plcql-bench leaderboard --out /results/site"
run leaderboard --out /results/site
run status --profile smoke

log "checks on the mounted volumes"
finals=$(find "$WORK/results/smoke" -name final.json | wc -l)
echo "final.json files: $finals"
[ "$finals" -ge 1 ] || { echo "FAIL: no final.json under $WORK/results"; exit 1; }
[ -n "$(find "$WORK/data" -name '*.h5' -o -name '*.hdf5' | head -1)" ] || { echo "FAIL: no dataset under $WORK/data"; exit 1; }
[ -s "$WORK/results/site/index.html" ] || { echo "FAIL: no leaderboard at $WORK/results/site/index.html"; exit 1; }
python3 - "$WORK/results" "$COMMIT" "$BUILD_DATE" <<'PY'
import json, pathlib, sys
finals = sorted(pathlib.Path(sys.argv[1]).rglob("final.json"))
blob = json.loads(finals[0].read_text())
def find(o, key):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == key: return v
            r = find(v, key)
            if r is not None: return r
    elif isinstance(o, list):
        for v in o:
            r = find(v, key)
            if r is not None: return r
labels = find(blob, "image") or find(blob, "image_labels")
print("image labels in", finals[0].relative_to(sys.argv[1]), "->", labels)
assert labels and labels.get("variant") == "cpu", "image labels missing from final.json"
# This build's commit and date, not a cached layer's (the layer cache must not keep stale labels).
assert (labels.get("revision"), labels.get("created")) == tuple(sys.argv[2:4]), ("stale labels", labels, sys.argv[2:4])
PY
echo "leaderboard: $(du -sh "$WORK/results/site" | cut -f1) at $WORK/results/site/index.html"
echo "IMAGE-TEST OK ($finals runs)"
