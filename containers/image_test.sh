#!/usr/bin/env bash
# Build the CPU image on a local debootstrap base and smoke-run it with /data and /results
# mounted. Slow (minutes: debootstrap, apt and pip inside the build), so it is `make image-test`,
# not part of `make test` / .ci/run. Needs root, podman, buildah, runc and debootstrap.
#
#   bash containers/image_test.sh            # or: make image-test
#   WORK=/tmp/it bash containers/image_test.sh   # work folder (default: build/image-test)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

BASE=${BASE:-localhost/debian-bookworm-minbase:local}
IMAGE=${IMAGE:-localhost/plcql-bench:cpu-test}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=${WORK:-$ROOT/build/image-test}
ONLY=${ONLY:-algo=bc,seed=0}
export CONTAINERS_CONF=$ROOT/containers/containers.conf

log() { printf '\n== %s\n' "$*"; }

need=()
for tool in podman buildah runc debootstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
if ((${#need[@]})); then
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah runc debootstrap >/dev/null
fi

if ! podman image exists "$BASE"; then
  log "base: debootstrap bookworm minbase -> $BASE"
  rootfs=$(mktemp -d /tmp/plcql-rootfs.XXXXXX)
  debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE"
  rm -rf "$rootfs"
else
  log "base: $BASE already present"
fi

# Build context: the tracked and untracked-but-not-ignored files only (no .venv, data, results).
log "context"
rm -rf "$WORK" && mkdir -p "$WORK/context" "$WORK/data" "$WORK/results"
git ls-files -z -co --exclude-standard | tar --null -T - -c | tar -C "$WORK/context" -x

build_args=(--build-arg "BASE_IMAGE=$BASE"
            --build-arg "GIT_COMMIT=$(git rev-parse HEAD)"
            --build-arg "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
volumes=()
if [ -d /opt/wheels ]; then   # this machine's local torch CPU wheel
  volumes=(-v /opt/wheels:/wheels:ro)
  build_args+=(--build-arg PIP_FIND_LINKS=/wheels --build-arg PIP_EXTRA_INDEX_URL=)
fi
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then   # the host's CA bundle (TLS-intercepting proxy)
  volumes+=(-v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro)
  build_args+=(--build-arg PIP_CERT=/host-ca.crt)
fi

log "build $IMAGE (buildah bud --isolation chroot)"
t0=$SECONDS
buildah bud --isolation chroot --layers "${volumes[@]}" "${build_args[@]}" \
  -f "$WORK/context/containers/Dockerfile.cpu" -t "$IMAGE" "$WORK/context" 2>&1 | tail -n 25
echo "build: $((SECONDS - t0)) s"
podman image inspect "$IMAGE" --format '{{json .Config.Labels}}'

run() {
  podman run --rm --runtime runc --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
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
python3 - "$WORK/results" <<'PY'
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
PY
echo "leaderboard: $(du -sh "$WORK/results/site" | cut -f1) at $WORK/results/site/index.html"
echo "IMAGE-TEST OK ($finals runs)"
