#!/bin/sh
# Cross-checks the link emulation against the kernel: two network namespaces joined by a veth
# pair with a tbf qdisc on the sender's side, and the same bench_link transfer (1 MB messages,
# DEALER -> ROUTER) once shaped by tc without emulation, once emulated (--mbps) on loopback.
# Needs root and `ip netns`; prints SKIP otherwise.
#
# usage: bench/link_tc.sh      environment: BENCH_LINK (default build/bench/bench_link),
#        RATES ("100 10", Mbit/s), SECS (2: seconds of transfer per run), REPS (3 runs, median)
set -u

here=$(cd "$(dirname "$0")/.." && pwd)
BENCH_LINK=${BENCH_LINK:-$here/build/bench/bench_link}
RATES=${RATES:-"100 10"}
SECS=${SECS:-2}
REPS=${REPS:-3}
SIZE=1048576
NS_RX=mqgrad-tc-rx-$$
NS_TX=mqgrad-tc-tx-$$
DEV_RX=mqrx$$
DEV_TX=mqtx$$
RX_IP=10.213.0.1
TX_IP=10.213.0.2

skip() { echo "SKIP: $*"; exit 0; }
[ "$(id -u)" = 0 ] || skip "link_tc.sh needs root (network namespaces, tc)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "ip or tc not found (apt-get install iproute2)"
[ -x "$BENCH_LINK" ] || { echo "link_tc.sh: $BENCH_LINK is not executable (build first)" >&2; exit 2; }

cleanup() {
    ip netns del "$NS_RX" 2>/dev/null
    ip netns del "$NS_TX" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$NS_RX" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN?)"
ip netns add "$NS_TX" || skip "ip netns add failed"
if ! { ip link add "$DEV_RX" type veth peer name "$DEV_TX" &&
       ip link set "$DEV_RX" netns "$NS_RX" && ip link set "$DEV_TX" netns "$NS_TX" &&
       ip -n "$NS_RX" addr add "$RX_IP/24" dev "$DEV_RX" &&
       ip -n "$NS_TX" addr add "$TX_IP/24" dev "$DEV_TX" &&
       ip -n "$NS_RX" link set "$DEV_RX" up && ip -n "$NS_TX" link set "$DEV_TX" up &&
       ip -n "$NS_RX" link set lo up && ip -n "$NS_TX" link set lo up; }; then
    skip "cannot set up the veth pair"
fi

# One two-process transfer; prints the receiver's achieved Mbit/s.
#   transfer RX_NS TX_NS HOST PORT MBPS MESSAGES
transfer() {
    out=$(mktemp)
    ip netns exec "$1" "$BENCH_LINK" --recv "tcp://$3:$4" --mbps "$5" >"$out" 2>&1 &
    rx=$!
    if ! ip netns exec "$2" "$BENCH_LINK" --send "tcp://$3:$4" --mbps "$5" --size "$SIZE" \
        --messages "$6" >/dev/null; then
        kill "$rx" 2>/dev/null
    fi
    wait "$rx"
    sed -n 's/.*achieved=//p' "$out"
    cat "$out" >&2
    rm -f "$out"
}

# Median and range of the numbers on stdin: "MEDIAN LO HI".
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print "0 0 0"; else printf "%s %s %s", v[int((NR + 1) / 2)], v[1], v[NR] }'; }

count() { awk -v r="$1" -v s="$SECS" -v z="$SIZE" 'BEGIN { n = r * 1e6 / 8 * s / z; printf "%d", n < 1 ? 1 : (n == int(n) ? n : int(n) + 1) }'; }

echo "link_tc.sh: $SIZE-byte messages, ~$SECS s per run, median of $REPS; veth $NS_TX -> $NS_RX"
raw=$(transfer "$NS_RX" "$NS_TX" "$RX_IP" 5601 0 200 2>/dev/null)
echo "veth without shaping: ${raw:-?} Mbit/s (the ceiling of this path)"
echo
echo "tbf counts whole frames: a 1448-byte TCP segment (timestamps on) is a 1514-byte frame,"
echo "so TCP goodput under tbf tops out at ~0.956 x the rate; the emulation counts payload only."
echo
printf "%10s | %12s %7s %15s | %12s %7s %15s | %8s\n" configured "tc (tbf)" ratio range \
    emulated ratio range "emu / tc"
port=5610
for r in $RATES; do
    n=$(count "$r")
    burst=$(awk -v r="$r" 'BEGIN { b = r * 1e6 / 8 / 1000 * 2; printf "%d", b < 32768 ? 32768 : b }')
    ip netns exec "$NS_TX" tc qdisc replace dev "$DEV_TX" root tbf rate "${r}mbit" \
        burst "$burst" latency 100ms || { echo "tc qdisc tbf failed" >&2; exit 2; }
    tcs=$(for i in $(seq "$REPS"); do
        transfer "$NS_RX" "$NS_TX" "$RX_IP" $((port + i)) 0 "$n" 2>/dev/null; done | median)
    ip netns exec "$NS_TX" tc qdisc del dev "$DEV_TX" root
    emus=$(for i in $(seq "$REPS"); do
        transfer "$NS_RX" "$NS_RX" 127.0.0.1 $((port + 10 + i)) "$r" "$n" 2>/dev/null; done | median)
    port=$((port + 20))
    # shellcheck disable=SC2086 # word splitting of "median lo hi" intended
    set -- $tcs $emus
    awk -v r="$r" -v t="$1" -v tl="$2" -v th="$3" -v e="$4" -v el="$5" -v eh="$6" 'BEGIN {
        printf "%5s Mb/s | %7.2f Mb/s %7.4f %7.4f..%.4f | %7.2f Mb/s %7.4f %7.4f..%.4f | %8.4f\n",
               r, t, t / r, tl / r, th / r, e, e / r, el / r, eh / r, (t > 0 ? e / t : 0) }'
done
