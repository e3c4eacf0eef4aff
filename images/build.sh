#!/usr/bin/env bash
# Build Trainyard's images with no container registry at all:
#   trainyard-base:bookworm     Debian bookworm (minbase) with python3, made with debootstrap
#                               and `docker import` (needs root; only when missing)
#   trainyard-learner:latest    images/learner/Dockerfile: torch (CPU), numpy, runners/
#   trainyard:latest            ./Dockerfile: the control plane and the node agent
# Python packages come from wheelhouses built here on the host with `pip wheel` (pip inside a
# build cannot verify the registry's certificate). Each image carries a `trainyard.content`
# label, a hash of what it is built from; an image whose label matches is not built again.
# Usage: images/build.sh   (PYTHON: the interpreter whose pip builds the wheelhouses)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BASE=trainyard-base:bookworm
LEARNER=trainyard-learner:latest
PROJECT=trainyard:latest
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-venv brings ensurepip, so the Dockerfiles install into a venv with no pip package.
PACKAGES=python3,python3-venv
WHEELS=images/.wheelhouse
export DOCKER_BUILDKIT=0 # the classic builder: Debian's docker.io has no buildx

say() { echo "images: $*" >&2; }

# A short hash of the files under the given paths (names and contents), caches left out.
tree_hash() {
    find "$@" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | sort -z \
        | xargs -0 sha256sum | sha256sum | cut -c1-16
}

label_of() {
    docker image inspect --format '{{ index .Config.Labels "trainyard.content" }}' "$1" \
        2>/dev/null || true
}

# Run a step and say how long it took: the images are part of CI's time on a fresh machine.
timed() {
    local what=$1 start=$SECONDS
    shift
    "$@"
    say "$what took $((SECONDS - start))s"
}

base_image() {
    local hash
    hash=$(echo "$SUITE $PACKAGES minbase" | sha256sum | cut -c1-16)
    if [ "$(label_of "$BASE")" = "$hash" ]; then
        return
    fi
    if [ "$(id -u)" != 0 ] || ! command -v debootstrap >/dev/null; then
        say "no $BASE image, and making one needs root and debootstrap (apt-get install debootstrap)"
        exit 1
    fi
    local root
    root=$(mktemp -d)
    say "making $BASE with debootstrap from $MIRROR"
    if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" \
        >"$root.log" 2>&1; then
        cat "$root.log" >&2
        rm -rf "$root" "$root.log"
        exit 1
    fi
    # What only the build machine needed: downloaded packages, package lists, documentation.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
        "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar -C "$root" -c . | docker import \
        --change "LABEL trainyard.content=$hash" \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' \
        - "$BASE" >/dev/null
    rm -rf "$root" "$root.log"
}

# pip wheel writes every wheel the packages need into the directory (and keeps ones already
# there), from the indexes and wheel directories the host's pip is configured with.
wheelhouse() {
    local dir=$WHEELS/$1
    shift
    mkdir -p "$dir"
    if ! "$PYTHON" -m pip wheel --disable-pip-version-check --wheel-dir "$dir" "$@" \
        >"$dir.log" 2>&1; then
        cat "$dir.log" >&2
        exit 1
    fi
}

# stale IMAGE HASH: whether IMAGE must be built (it is missing, or built from other content).
stale() {
    if [ "$(label_of "$1")" = "$2" ]; then
        say "$1 is up to date"
        return 1
    fi
}

docker_build() {
    local image=$1 dockerfile=$2 hash=$3
    docker build --quiet --file "$dockerfile" --label "trainyard.content=$hash" \
        --build-arg "BASE=$BASE" --tag "$image" . >/dev/null 2>"$WHEELS/build.log" \
        || { cat "$WHEELS/build.log" >&2; exit 1; }
}

timed "the base image" base_image
base=$(label_of "$BASE")

hash=$(echo "$base $(tree_hash images/learner runners images/build.sh .dockerignore)" | sha256sum | cut -c1-16)
if stale "$LEARNER" "$hash"; then
    timed "the learner wheelhouse" wheelhouse learner torch==2.13.0 numpy "pydantic>=2.6,<3" \
        "scikit-learn>=1.4"
    timed "$LEARNER" docker_build "$LEARNER" images/learner/Dockerfile "$hash"
fi

hash=$(echo "$base $(tree_hash Dockerfile pyproject.toml README.md cli controlplane trainyard \
    node_agent runners migrations sim images/build.sh .dockerignore)" | sha256sum | cut -c1-16)
if stale "$PROJECT" "$hash"; then
    # This project's own wheel is rebuilt from the tree each time; its dependencies are kept.
    rm -f "$WHEELS"/trainyard/trainyard-*.whl
    timed "the project's wheelhouse" wheelhouse trainyard .
    timed "$PROJECT" docker_build "$PROJECT" Dockerfile "$hash"
fi
