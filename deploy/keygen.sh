#!/usr/bin/env bash
# Makes a compose or swarm cluster's keys (SECURITY.md) in DIR (default deploy/keys), with
# the image itself: the services' secrets belong to the containers' user (10001), the
# public keys and the operator's secret to you. Never overwrites a key.
#   deploy/keygen.sh [DIR]          then: docker compose up -d
#   MQGRAD_KEYS=DIR mqgrad bits --agent tcp://127.0.0.1:7200     (the operator's key)
set -euo pipefail
dir="${1:-$(cd "$(dirname "$0")" && pwd)/keys}"
image="${MQGRAD_IMAGE:-mqgrad:latest}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
docker run --rm --user 0:0 --entrypoint /bin/sh -v "$dir:/keys" "$image" -c \
    "mqgrad keygen /keys --owner 10001:10001 && chown $(id -u):$(id -g) /keys/*.key /keys/operator.key_secret"
echo "keys in $dir: give the operator's (operator.key_secret) only to operators"
