#!/usr/bin/env bash
# What FUSE's transport alone gives metadata operations: the probe of scripts/fuse-uring-probe
# (a file system of empty files kept in memory) served over /dev/fuse by four threads, and
# over FUSE over io_uring with one queue per CPU, in the order given (alternate them: dev
# uring uring dev). Each round: one Python process makes N empty files (open O_CREAT,
# close), then unlinks them. Needs root and the fuse module's enable_uring (set here for the
# run, put back after).
# Usage: scripts/bench-fuse-uring.sh [--files N] dev|uring ...
set -eu
cd "$(dirname "$0")/.."
N=20000
if [ "${1:-}" = --files ]; then N=$2; shift 2; fi
cargo build --quiet --release --manifest-path scripts/fuse-uring-probe/Cargo.toml
PROBE=scripts/fuse-uring-probe/target/release/fuse-uring-probe
PARAM=/sys/module/fuse/parameters/enable_uring
WAS=$(cat $PARAM)
DIR=$(mktemp -d /tmp/weft-fuse-uring.XXXXXX)
trap 'mountpoint -q $DIR/mnt && umount -l $DIR/mnt; echo $WAS > $PARAM; rm -rf $DIR' EXIT
echo Y > $PARAM
mkdir $DIR/mnt
cat > $DIR/ops.py <<'PY'
import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
t = time.time()
for i in range(n):
    os.close(os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644))
created = time.time() - t
t = time.time()
for i in range(n):
    os.unlink(f"{d}/f{i}")
print(f"create {n / created:.0f}/s unlink {n / (time.time() - t):.0f}/s")
PY
for mode in "$@"; do
  $PROBE $DIR/mnt $mode 4 &
  for _ in $(seq 100); do mountpoint -q $DIR/mnt && break; sleep 0.05; done
  echo "$mode: $(python3 $DIR/ops.py $DIR/mnt $N)"
  umount $DIR/mnt
  wait
done
