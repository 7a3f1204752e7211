#!/usr/bin/env bash
# Installs the Debian packages mqgrad needs that are missing (Debian 12). Idempotent and quick
# when everything is there. Usage: tools/install-deps.sh [build|test|torch|bench|all]
# (torch: what PyTorch workers need, examples/torch and python/)
set -euo pipefail
what="${1:-test}"
pkgs=(build-essential cmake pkg-config libzmq3-dev libczmq-dev libprotobuf-c-dev
      protobuf-c-compiler python3 libopenblas-dev libmicrohttpd-dev zlib1g-dev libsodium-dev
      dataset-fashion-mnist)
case "$what" in
    build) ;;
    test) pkgs+=(libcriterion-dev gnuplot-nox curl mmdebstrap clang-14 libclang-rt-14-dev python3 procps
                 tmux python3-torch python3-numpy python3-pytest) ;;
    torch) pkgs+=(python3 python3-torch python3-numpy) ;;
    bench) pkgs+=(libcriterion-dev gnuplot-nox python3-torch iproute2) ;;
    all) pkgs+=(libcriterion-dev gnuplot-nox curl mmdebstrap clang-14 libclang-rt-14-dev python3
              tmux python3-torch python3-numpy python3-pytest iproute2) ;;
    *) echo "usage: $0 [build|test|torch|bench|all]" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
