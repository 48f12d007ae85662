#!/usr/bin/env bash
# Linear scaling across hosts, measured: a cluster whose every server and client host is a
# network namespace of its own, each link rate-limited with tc (jumbo frames), so that the
# network and not this machine's cores is the limit. Sequential fio writes, then reads
# (1 MiB, O_DIRECT, 2 jobs of queue depth 16 per client host, every file striped over every
# storage target):
# - 1, 2, 4 and 8 storage hosts with STORAGE_MBIT links, two client hosts without a limit;
# - 1, 2 and 4 client hosts with CLIENT_MBIT links, four storage hosts without a limit;
# - one storage host on one rail and on two (each rail's link at STORAGE_MBIT), one client host.
# Each point is printed as a ratio to the sum of the limiting links' rates; the table and an
# SVG plot go to OUT (default docs/img: scale.md, scale.svg).
# The cluster's directories (targets included) are under WEFT_SCALE_TMP, /dev/shm by default:
# the hosts of a real cluster have a disk each, the namespaces of this machine share one, whose
# bandwidth would otherwise be what the larger points measure (set WEFT_SCALE_TMP=/tmp to see
# it).
# WEFT_SCALE_ONLY=storage (clients, rails) runs one curve only.
# Usage: scripts/bench-scale.sh [SECONDS] [STORAGE_MBIT] [CLIENT_MBIT] [OUT]
#        (default 10 s per phase, 200 and 400 Mbit/s)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-tools.sh
need fio
OUT=$(realpath "${4:-docs/img}")
mkdir -p "$OUT"
WEFT_SCALE_SECONDS=${1:-10} WEFT_SCALE_STORAGE_MBIT=${2:-200} WEFT_SCALE_CLIENT_MBIT=${3:-400} \
  WEFT_SCALE_OUT="$OUT" TMPDIR=${WEFT_SCALE_TMP:-/dev/shm} \
  cargo test --release -p weft --test scale scaling_curve -- --ignored --nocapture
echo "table: $OUT/scale.md, plot: $OUT/scale.svg"
