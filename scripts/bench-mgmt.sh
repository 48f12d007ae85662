#!/usr/bin/env bash
# Management under simulated nodes (`weft bench mgmt`): a management service of its own, then
# simulated storage servers (one target each) and client sessions that register, heartbeat
# (every 2 s and 5 s, as by default) and follow the cluster map with one connection each,
# while a target is registered every 2 s (a map change every node must fetch). Sizes from
# SIZES (servers:clients,...), each against a fresh management; prints heartbeat and map push
# latencies, management's CPU and bytes sent per size, and a Markdown table at the end.
# Usage: scripts/bench-mgmt.sh [SIZES] [CHANGES]   (default 50:250,100:500,200:1000, 10)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${1:-50:250,100:500,200:1000}
CHANGES=${2:-10}
cargo build --release --quiet
WEFT=$PWD/target/release/weft
WORK=$(mktemp -d /tmp/weft-bench-mgmt.XXXXXX)
MGMT_PID=
cleanup() {
  [ -n "$MGMT_PID" ] && kill "$MGMT_PID" 2>/dev/null && wait "$MGMT_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
# Every simulated node holds a connection of its own, on both sides.
ulimit -n "$(ulimit -Hn)"
export WEFT_KEY_FILE="$WORK/cluster.key"
"$WEFT" keygen "$WEFT_KEY_FILE" > /dev/null
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RESULTS=$WORK/mgmt.json
for SIZE in ${SIZES//,/ }; do
  SERVERS=${SIZE%%:*}; CLIENTS=${SIZE##*:}
  MGMT=127.0.0.1:$(port)
  rm -rf "$WORK/mgmt"; mkdir -p "$WORK/mgmt"
  "$WEFT" serve mgmt --set "auth_key_file=\"$WEFT_KEY_FILE\"" --data-dir "$WORK/mgmt" \
    --listen "$MGMT" > "$WORK/mgmt-$SIZE.log" 2>&1 &
  MGMT_PID=$!
  for _ in $(seq 1 100); do grep -q "management serving" "$WORK/mgmt-$SIZE.log" && break; sleep 0.1; done
  "$WEFT" bench mgmt --mgmt "$MGMT" --servers "$SERVERS" --clients "$CLIENTS" \
    --changes "$CHANGES" --mgmt-pid "$MGMT_PID" --json "$RESULTS"
  kill "$MGMT_PID"; wait "$MGMT_PID" 2>/dev/null || true
  MGMT_PID=
done
python3 - "$RESULTS" <<'PY'
import json, sys
print("\n| servers | client sessions | registrations/s | server heartbeat p50 / p99 ms | client heartbeat p50 / p99 ms | map push p50 / p99 / max ms | mgmt CPU cores | mgmt sent MB/s | map bytes |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    run = json.loads(line)
    c, r = run["config"], run["result"]
    s, cl, m = r["server_heartbeat"], r["client_heartbeat"], r["map_push"]
    cpu = r["mgmt_cpu_cores"]
    print(f"| {c['servers']} | {c['clients']} | {r['registrations_per_second']:.0f} | "
          f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f} | {cl['p50_ms']:.2f} / {cl['p99_ms']:.2f} | "
          f"{m['p50_ms']:.1f} / {m['p99_ms']:.1f} / {m['max_ms']:.1f} | "
          f"{cpu:.3f} | {r['mgmt_sent_bytes_per_second'] / 1e6:.2f} | {r['map_bytes']} |"
          if cpu is not None else "")
PY
