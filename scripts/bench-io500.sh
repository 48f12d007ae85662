#!/usr/bin/env bash
# IO500's phases (`weft bench io500`: ior-easy and ior-hard write and read, mdtest-easy and
# mdtest-hard, find) in one run on: the local disk, a `weft up` mount (default layout), a
# namespace cluster (four storage hosts, two metadata servers, one client host, 2,000 Mbit/s
# links: the `io500_on_hosts` test of crates/cli/tests/scale.rs), and single-node GlusterFS and
# MooseFS through their FUSE clients (../shared/bench/peers/). The
# same threads and sizes everywhere; each phase and score is printed per target, then Weft's
# as a ratio to the better peer.
# Usage: scripts/bench-io500.sh [THREADS] [EASY_SIZE] [HARD_RECORDS] [EASY_FILES] [HARD_FILES]
#        (default 4 threads, 256M, 2000 records, 2000 and 1000 files per thread)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-4}
ARGS=(--threads "$THREADS" --easy-size "${2:-256M}" --hard-records "${3:-2000}"
      --easy-files "${4:-2000}" --hard-files "${5:-1000}")
WORK=$(mktemp -d /tmp/weft-bench-io500.XXXXXX)
chmod a+rx "$WORK"   # the peers' daemons run as their own users
mkdir -p "$WORK/local"
. scripts/bench-tools.sh
cargo build --release --quiet
WEFT=$PWD/target/release/weft
RESULTS=$WORK/io500.json
io500() { "$WEFT" bench io500 --path "$1" --label "$2" --json "$RESULTS" "${ARGS[@]}"; }

io500 "$WORK/local" local

"$WEFT" up --data-dir "$WORK/data" --mountpoint "$WORK/mnt" > "$WORK/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
io500 "$WORK/mnt" weft
kill -INT $UP; wait $UP || true
trap - EXIT

WEFT_IO500_ARGS="${ARGS[*]}" WEFT_IO500_JSON=$RESULTS TMPDIR=$WORK \
  cargo test --release -p weft --test scale io500_on_hosts -- --ignored --nocapture

each_peer "$WORK" gluster,moosefs io500

python3 - "$RESULTS" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    run = json.loads(line)
    runs[run["label"]] = run["result"]
weft = runs.get("weft")
if weft is None:
    sys.exit("no Weft result")
peers = [runs[p] for p in ("gluster", "moosefs") if p in runs]
def value(result, name):
    if name in ("score", "bandwidth_score", "metadata_score"):
        return result[name]
    return next(p["value"] for p in result["phases"] if p["name"] == name)
names = [p["name"] for p in weft["phases"]] + ["bandwidth_score", "metadata_score", "score"]
labels = list(runs)
wefts = [label for label in ("weft", "weft-hosts") if label in runs]
print("\n| phase | " + " | ".join(labels) + " | "
      + " | ".join(f"{w} / best peer" for w in wefts) + " |")
print("|---|" + "---:|" * (len(labels) + len(wefts)))
for name in names:
    values = [value(runs[label], name) for label in labels]
    best = max((value(p, name) for p in peers), default=0)
    ratios = [value(runs[w], name) / best if best else 0 for w in wefts]
    print(f"| {name} | " + " | ".join(f"{v:.4g}" for v in values) + " | "
          + " | ".join(f"{r:.2f}" for r in ratios) + " |")
PY
echo "results: $RESULTS"
