#!/usr/bin/env bash
# `make image`: build the trimq container image without any container registry.
#
# 1. Wheels for trimq and its runtime dependencies are built on the host into deploy/wheels,
#    and Debian's etcd-server .deb (with dependencies a minimal base may lack) is downloaded
#    into deploy/debs with the host's apt (the Makefile does both and calls this script after).
# 2. The base image: $BASE (default python:3.11-slim) when it is present locally; otherwise a
#    local Debian bookworm base ($LOCAL_BASE, default trimq-base:bookworm) made once with
#    mmdebstrap from this machine's own apt sources and `docker import`ed; later runs reuse it.
# 3. `docker build` installs the .debs with dpkg and the wheels with `pip --no-index`: nothing
#    in it needs the network.
set -euo pipefail

IMAGE=${IMAGE:-trimq:latest}
BASE=${BASE:-python:3.11-slim}
LOCAL_BASE=${LOCAL_BASE:-trimq-base:bookworm}
SUITE=${SUITE:-bookworm}
here=$(cd "$(dirname "$0")" && pwd)

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

if ! ls "$here"/wheels/app/trimq-*.whl >/dev/null 2>&1; then
    echo "build-image: no trimq wheel in $here/wheels (run 'make image')" >&2
    exit 2
fi

if ! ls "$here"/debs/etcd-server_*.deb >/dev/null 2>&1; then
    echo "build-image: no etcd-server .deb in $here/debs (run 'make image')" >&2
    exit 2
fi

base=$BASE
if ! have_image "$base"; then
    base=$LOCAL_BASE
    if ! have_image "$base"; then
        echo "build-image: $BASE is not present locally; building $LOCAL_BASE with mmdebstrap" >&2
        if ! command -v mmdebstrap >/dev/null 2>&1; then
            sudo_cmd=()
            [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
            "${sudo_cmd[@]}" apt-get install -y mmdebstrap
        fi
        # The machine's own apt sources, passed as files (mmdebstrap copies them into the
        # rootfs), so no mirror host name lives in this repository.
        sources=()
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            /etc/apt/sources.list.d/*.sources; do
            [ -s "$f" ] && sources+=("$f")
        done
        if [ "${#sources[@]}" -eq 0 ]; then
            echo "build-image: no apt sources found under /etc/apt" >&2
            exit 1
        fi
        tmp=$(mktemp -d)
        trap 'rm -rf "$tmp"' EXIT
        mmdebstrap --variant=apt --mode=auto \
            --include=python3,python3-venv,python3-pip,ca-certificates \
            --aptopt='Acquire::Check-Valid-Until "false"' \
            --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
            "$SUITE" "$tmp/rootfs.tar" "${sources[@]}" </dev/null
        docker import \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --change 'ENV LANG=C.UTF-8' \
            --change 'CMD ["/bin/bash"]' \
            "$tmp/rootfs.tar" "$base"
        rm -rf "$tmp"
        trap - EXIT
    fi
fi

echo "build-image: building $IMAGE from $base" >&2
docker build --build-arg "BASE=$base" -t "$IMAGE" -f "$here/Dockerfile" "$here"
