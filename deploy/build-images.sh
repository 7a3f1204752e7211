#!/usr/bin/env bash
# Builds mqgrad's container images on a machine that cannot pull from any registry:
# the Debian base images come from Debian's packages (mmdebstrap or debootstrap into a
# root filesystem, then `docker import`), so deploy/Dockerfile builds unchanged.
#
# usage: deploy/build-images.sh [--base-only] [--force-base] [--tag IMAGE]
#                               [--prometheus | --prometheus-only] [--prometheus-tag IMAGE]
#                               [--torch | --torch-only] [--torch-tag IMAGE]
#   --base-only    make debian:bookworm and debian:bookworm-slim, not the project image
#   --force-base   rebuild the base images even when they exist
#   --tag IMAGE    name of the project image (default: $MQGRAD_IMAGE or mqgrad:latest)
#   --prometheus   also build the Prometheus image of the compose profile "monitoring"
#                  (deploy/prometheus: Debian's prometheus package, the scrape configuration
#                  and recording rules, checked by promtool while it builds)
#   --prometheus-only   the base images and the Prometheus image, not the project image
#   --prometheus-tag IMAGE  its name (default: $MQGRAD_PROMETHEUS_IMAGE or
#                  mqgrad-prometheus:latest)
#   --torch        also build the PyTorch worker image of the compose profile "torch"
#                  (deploy/torch: Debian's python3-torch, libmqgrad, the Python package and
#                  examples/torch)
#   --torch-only   the same as --torch: the PyTorch image is built from the project image
#                  (libmqgrad), which is rebuilt from these sources first (cached when unchanged)
#   --torch-tag IMAGE  its name (default: $MQGRAD_TORCH_IMAGE or mqgrad-torch:latest)
# env: MQGRAD_DEBIAN_MIRROR / MQGRAD_DEBIAN_SECURITY_MIRROR override the mirror read
#      from this host's apt sources; MQGRAD_SUITE (default bookworm).
# Idempotent: existing base images are kept, the project image reuses the build cache.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
suite="${MQGRAD_SUITE:-bookworm}"
image="${MQGRAD_IMAGE:-mqgrad:latest}"
prometheus_image="${MQGRAD_PROMETHEUS_IMAGE:-mqgrad-prometheus:latest}"
torch_image="${MQGRAD_TORCH_IMAGE:-mqgrad-torch:latest}"
base_only=0
force_base=0
project=1
prometheus=0
torch=0

while [ $# -gt 0 ]; do
    case "$1" in
        --base-only) base_only=1 ;;
        --force-base) force_base=1 ;;
        --tag) image="$2"; shift ;;
        --prometheus) prometheus=1 ;;
        --prometheus-only) prometheus=1; project=0 ;;
        --prometheus-tag) prometheus_image="$2"; shift ;;
        --torch) torch=1 ;;
        --torch-only) torch=1 ;;
        --torch-tag) torch_image="$2"; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "build-images: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

log() { echo "build-images: $*" >&2; }
die() { log "error: $*"; exit 1; }

docker info >/dev/null 2>&1 || die "no Docker engine answers (is dockerd running? are you in the docker group?)"

# The first URI this host's apt uses for a suite matching $1 (a regex over suite names),
# read from deb822 .sources files and from one-line sources.list files.
host_mirror() {
    local want="$1" f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        awk -v want="$want" '
            function flush() { if (uri != "" && suites ~ want && types ~ /(^| )deb( |$)/) { print uri; found = 1; exit } }
            /^[ \t]*$/ { flush(); uri = ""; suites = ""; types = ""; next }
            /^URIs:/    { uri = $2 }
            /^Suites:/  { $1 = ""; suites = $0 }
            /^Types:/   { $1 = ""; types = $0 }
            END { if (!found) flush() }' "$f"
    done | head -n1 | grep . && return 0
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        awk -v want="$want" '
            $1 == "deb" {
                i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) ~ want) { print $i; exit }
            }' "$f"
    done | head -n1 | grep .
}

# Mirrors whose suite we can use: the main archive and the security archive.
mirror="${MQGRAD_DEBIAN_MIRROR:-$(host_mirror "(^| )${suite}( |$)" || true)}"
security="${MQGRAD_DEBIAN_SECURITY_MIRROR:-$(host_mirror "${suite}-security" || true)}"
[ -n "$mirror" ] || die "cannot find a Debian mirror for '$suite' in /etc/apt/sources.list*; set MQGRAD_DEBIAN_MIRROR"

# Makes image tag $1 from a root filesystem; $2 = "slim" drops docs, man pages and locales
# the way Debian's official -slim images do.
make_base() {
    local tag="$1" flavour="$2" tarball
    if [ "$force_base" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
        log "$tag exists, kept"
        return 0
    fi
    log "making $tag from $mirror ($suite) ..."
    local work
    work="$(mktemp -d)"
    # shellcheck disable=SC2064
    trap "rm -rf '$work'" RETURN
    tarball="$work/rootfs.tar"

    local -a sources=("deb $mirror $suite main" "deb $mirror ${suite}-updates main")
    [ -n "$security" ] && sources+=("deb $security ${suite}-security main")
    # The host's apt trusts archive snapshots whose Release files are past Valid-Until;
    # the image must too, or apt-get update inside the Dockerfile fails the same way.
    local -a opts=(
        --variant=minbase --format=tar
        --aptopt='Acquire::Check-Valid-Until "false"'
        --aptopt='Acquire::Check-Date "false"'
        --aptopt='APT::Install-Recommends "false"'
        --dpkgopt='force-unsafe-io'
        --customize-hook='rm -f "$1"/etc/apt/apt.conf.d/99mmdebstrap.dpkg-old'
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'
    )
    if [ "$flavour" = slim ]; then
        opts+=(
            --dpkgopt='path-exclude=/usr/share/man/*'
            --dpkgopt='path-exclude=/usr/share/doc/*'
            --dpkgopt='path-include=/usr/share/doc/*/copyright'
            --dpkgopt='path-exclude=/usr/share/info/*'
            --dpkgopt='path-exclude=/usr/share/locale/*'
            --dpkgopt='path-exclude=/usr/share/groff/*'
            --dpkgopt='path-exclude=/usr/share/lintian/*'
            --dpkgopt='path-exclude=/usr/share/linda/*'
        )
    fi
    if command -v mmdebstrap >/dev/null 2>&1; then
        # Lay out merged /usr directly (as Debian's official images are) instead of
        # installing usrmerge, which would pull perl into the image.
        local hooks=/usr/share/mmdebstrap/hooks/merged-usr
        [ -d "$hooks" ] && opts+=(--hook-dir="$hooks")
        # The sources go in as one multi-line argument: the first line also names the suite.
        mmdebstrap "${opts[@]}" "$suite" "$tarball" "$(printf '%s\n' "${sources[@]}")" >&2
    elif command -v debootstrap >/dev/null 2>&1; then
        local root="$work/root"
        debootstrap --variant=minbase "$suite" "$root" "$mirror" >&2
        printf '%s\n' "${sources[@]}" >"$root/etc/apt/sources.list"
        printf 'Acquire::Check-Valid-Until "false";\nAcquire::Check-Date "false";\nAPT::Install-Recommends "false";\n' \
            >"$root/etc/apt/apt.conf.d/99mqgrad"
        if [ "$flavour" = slim ]; then
            rm -rf "$root"/usr/share/{man,doc,info,locale,groff,lintian,linda}/*
        fi
        rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
        tar -C "$root" -cf "$tarball" .
    else
        die "neither mmdebstrap nor debootstrap is installed (apt-get install mmdebstrap)"
    fi
    docker import \
        --change 'CMD ["bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --message "mqgrad offline base: $suite minbase${flavour:+ ($flavour)} from $mirror" \
        "$tarball" "$tag" >/dev/null
    log "$tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
}

make_base "debian:${suite}" full
make_base "debian:${suite}-slim" slim

[ "$base_only" = 1 ] && exit 0


if [ "$project" = 1 ]; then
    log "building $image from deploy/Dockerfile ..."
    start=$(date +%s)
    docker build -f "$repo/deploy/Dockerfile" -t "$image" "$repo" >&2
    log "$image built in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
fi

# The Prometheus image: its own small build context (deploy/prometheus), on the slim base.
if [ "$prometheus" = 1 ]; then
    log "building $prometheus_image from deploy/prometheus/Dockerfile ..."
    start=$(date +%s)
    docker build --build-arg RUNTIME_IMAGE="debian:${suite}-slim" \
        -f "$here/prometheus/Dockerfile" -t "$prometheus_image" "$here/prometheus" >&2
    log "$prometheus_image built in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$prometheus_image" | awk '{printf "%.0f MB", $1/1e6}')"
fi

# The PyTorch worker image: the repository is its build context (the Python package and the
# examples), libmqgrad is the project image's.
if [ "$torch" = 1 ]; then
    log "building $torch_image from deploy/torch/Dockerfile ..."
    start=$(date +%s)
    docker build --build-arg MQGRAD_IMAGE="$image" \
        -f "$here/torch/Dockerfile" -t "$torch_image" "$repo" >&2
    log "$torch_image built in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Size}}' "$torch_image" | awk '{printf "%.0f MB", $1/1e6}')"
fi
