#!/usr/bin/env bash
# Where the time of one I/O goes, from measurement: runs fio jobs (psync, O_DIRECT, one job)
# through a `weft up` mount and reads the storage server's metrics before and after each, to
# set fio's latency per operation against the time the request spent in the storage server
# and, of that, on the target's disk thread; plus the CPU the Weft process used.
# Usage: scripts/bench-stages.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-tools.sh
need fio
cargo build --release --quiet
WORK=$(mktemp -d /tmp/weft-bench-stages.XXXXXX)
target/release/weft up --data-dir "$WORK/data" --mountpoint "$WORK/mnt" > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
STORAGE=$(sed -n 's/^  storage *storage-1 at \([0-9.:]*\),.*/\1/p' "$WORK/up.log")

snapshot() {
  curl -s "http://$STORAGE/metrics" | awk '
    /^weft_request_duration_seconds_(sum|count)\{.*op="(write|read)"/ {
      split($1, a, "op=\""); split(a[2], b, "\""); kind = ($1 ~ /_sum/) ? "sum" : "count"
      s["request_" b[1] "_" kind] += $2 }
    /^weft_storage_operation_duration_seconds_(sum|count)/ {
      split($1, a, "op=\""); split(a[2], b, "\""); kind = ($1 ~ /_sum/) ? "sum" : "count"
      s["disk_" b[1] "_" kind] += $2 }
    /^weft_process_cpu_seconds_total/ { s["cpu"] = $2 }
    END { for (k in s) print k, s[k] }'
}

stage() {
  local name=$1 op=$2; shift 2
  snapshot > "$WORK/before"
  local start end
  start=$(date +%s.%N)
  fio --name="$name" --directory="$WORK/mnt" "$@" --ioengine=psync --direct=1 \
      --output-format=json > "$WORK/fio.json" 2>/dev/null
  end=$(date +%s.%N)
  snapshot > "$WORK/after"
  python3 - "$name" "$op" "$start" "$end" "$WORK" <<'PY'
import json, sys
name, op, start, end, work = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
def load(path):
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in open(path))}
before, after = load(work + "/before"), load(work + "/after")
delta = lambda key: after.get(key, 0) - before.get(key, 0)
job = json.load(open(work + "/fio.json"))["jobs"][0][op]
requests = delta(f"request_{op}_count")
print(f"{name:8} {job['bw'] / 1024:8.0f} MB/s  fio {job['clat_ns']['mean'] / 1000:6.0f} us/op  "
      f"server {1e6 * delta(f'request_{op}_sum') / max(requests, 1):5.0f} us/request "
      f"(disk thread {1e6 * delta(f'disk_{op}_sum') / max(delta(f'disk_{op}_count'), 1):5.0f} us)  "
      f"requests/op {requests / max(job['total_ios'], 1):4.1f}  "
      f"Weft CPU {100 * delta('cpu') / (float(end) - float(start)):4.0f} % of a core")
PY
}

stage seqwrite write --rw=write --bs=1M --size=512M --end_fsync=1
stage seqread read --rw=read --bs=1M --size=512M
stage randwrite write --rw=randwrite --bs=4k --size=64M --runtime=10 --time_based
stage randread read --rw=randread --bs=4k --size=64M --runtime=10 --time_based
