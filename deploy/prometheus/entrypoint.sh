#!/bin/sh
# Starts mqgrad's Prometheus. Writes the bearer token the services' /metrics ask for when
# one is set (the first line of MQGRAD_HTTP_TOKEN_FILE, else MQGRAD_HTTP_TOKEN; empty =
# none) to /etc/prometheus/http-token, which every scrape job of prometheus.yml sends. Then
# runs the command: `prometheus` alone gets this deployment's flags; any other command
# (promtool, or prometheus with flags of your own) runs as given.
set -eu
umask 077
token_file=/etc/prometheus/http-token
if [ -n "${MQGRAD_HTTP_TOKEN_FILE:-}" ]; then
    token=$(head -n 1 "$MQGRAD_HTTP_TOKEN_FILE")
else
    token="${MQGRAD_HTTP_TOKEN:-}"
fi
if ! printf '%s\n' "$token" 2>/dev/null >"$token_file"; then
    # Another user than the image's (docker run --user): fine as long as there is no token.
    if [ -n "$token" ]; then
        echo "mqgrad-prometheus: cannot write the token to $token_file as uid $(id -u)" >&2
        exit 1
    fi
fi
if [ "$#" -eq 1 ] && [ "$1" = prometheus ]; then
    set -- prometheus \
        --config.file=/etc/prometheus/prometheus.yml \
        --storage.tsdb.path=/var/lib/prometheus/metrics2 \
        --storage.tsdb.retention.time="${MQGRAD_PROMETHEUS_RETENTION:-7d}" \
        --web.listen-address=:9090
fi
exec "$@"
