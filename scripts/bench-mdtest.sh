#!/usr/bin/env bash
# The public mdtest (IOR project) in IO500's two shapes, at 1 and 4 processes, in one run on:
# the local disk, a bindfs passthrough of it (the FUSE ceiling over ext4), `weft up` as
# configured by default (metadata answered before its sync, durable by replay), `weft up
# --sync-every-change` (every change synced before its answer), and single-node GlusterFS and
# MooseFS through their FUSE clients. The easy shape makes empty files in a directory per
# process (`-u -F`); the hard shape makes 3,901-byte files in one directory for all of them
# (`-F -w 3901 -e 3901`). Operations per second per phase, then Weft's ratios against bindfs
# and the better peer.
#
# mdtest and mpirun come from no package of this system: build mdtest from the IOR sources
# (autotools, with Open MPI's libopenmpi-dev and openmpi-bin) and name the binary.
# Usage: MDTEST=/path/to/mdtest [WEFT=BINARY] [EASY_FILES=N] [HARD_FILES=N]
#          scripts/bench-mdtest.sh [TARGETS (default local,bindfs,weft,weft-sync,gluster,moosefs)]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=${1:-local,bindfs,weft,weft-sync,gluster,moosefs}
MDTEST=${MDTEST:?MDTEST names an mdtest binary of the IOR project}
EASY_FILES=${EASY_FILES:-2000}   # per process
HARD_FILES=${HARD_FILES:-1000}   # per process
command -v mpirun > /dev/null || { echo "$0: mpirun is not on PATH (Debian: openmpi-bin)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/weft-bench-mdtest.XXXXXX)
chmod a+rx "$WORK"   # the peers' daemons run as their own users
. scripts/bench-tools.sh
need bindfs
if [ -z "${WEFT:-}" ]; then cargo build --release --quiet; fi
WEFT=${WEFT:-$PWD/target/release/weft}   # WEFT=BINARY measures another build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# `shapes DIR LABEL`: both shapes at 1 and 4 processes in DIR; one line per phase in results.
shapes() {
  local dir=$1 label=$2 procs
  for procs in 1 4; do
    mdtest_run "$dir" "$label" easy "$procs" -n "$EASY_FILES" -u -F
    mdtest_run "$dir" "$label" hard "$procs" -n "$HARD_FILES" -F -w 3901 -e 3901
  done
}
mdtest_run() {
  local dir=$1 label=$2 shape=$3 procs=$4 out
  shift 4
  out=$WORK/$label-$shape-$procs.txt
  mkdir -p "$dir/mdtest-$shape-$procs"
  if ! timeout 900 mpirun --oversubscribe -np "$procs" "$MDTEST" "$@" -d "$dir/mdtest-$shape-$procs" > "$out" 2>&1; then
    echo "  $label $shape $procs failed or took over 900 s: see $out" >&2
  fi
  awk -v label="$label" -v shape="$shape" -v procs="$procs" \
    '/^ *File (creation|stat|read|removal) / { print label, shape, procs, $2, $5 }' "$out" | tee -a "$WORK/results"
}
weft_target() {
  local label=$1 up
  shift
  "$WEFT" up "$@" --data-dir "$WORK/$label-data" --mountpoint "$WORK/$label" > "$WORK/$label-up.log" 2>&1 &
  up=$!
  for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/$label-up.log" && break; sleep 0.2; done
  shapes "$WORK/$label" "$label"
  kill -INT $up; wait $up || true
}

for target in ${TARGETS//,/ }; do
  settle
  echo "$target:"
  case $target in
    local) mkdir -p "$WORK/local"; shapes "$WORK/local" local ;;
    bindfs) on_bindfs "$WORK" shapes ;;
    weft) weft_target weft ;;
    weft-sync) weft_target weft-sync --sync-every-change ;;
    gluster|moosefs) each_peer "$WORK" "$target" shapes ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
done

echo
echo "operations per second (shape, processes, phase), and each Weft's ratio to bindfs and to the better peer:"
awk '
  { v[$1, $2, $3, $4] = $5; labels[$1] = 1; rows[$2 " " $3 " " $4] = 1 }
  END {
    n = split("local bindfs weft weft-sync gluster moosefs", order, " ")
    printf "%-22s", "shape procs phase"
    for (i = 1; i <= n; i++) if (order[i] in labels) printf " %10s", order[i]
    printf " %12s %12s %12s %12s\n", "weft/bindfs", "weft/peer", "sync/bindfs", "sync/peer"
    m = split("easy 1 creation,easy 1 stat,easy 1 read,easy 1 removal,hard 1 creation,hard 1 stat,hard 1 read,hard 1 removal,easy 4 creation,easy 4 stat,easy 4 read,easy 4 removal,hard 4 creation,hard 4 stat,hard 4 read,hard 4 removal", want, ",")
    for (r = 1; r <= m; r++) {
      if (!(want[r] in rows)) continue
      split(want[r], k, " ")
      printf "%-22s", want[r]
      for (i = 1; i <= n; i++) if (order[i] in labels) printf " %10s", v[order[i], k[1], k[2], k[3]]
      peer = v["gluster", k[1], k[2], k[3]] + 0
      if (v["moosefs", k[1], k[2], k[3]] + 0 > peer) peer = v["moosefs", k[1], k[2], k[3]] + 0
      bind = v["bindfs", k[1], k[2], k[3]] + 0
      split("weft weft-sync", ws, " ")
      for (j = 1; j <= 2; j++) {
        w = v[ws[j], k[1], k[2], k[3]] + 0
        printf " %12s %12s", (bind > 0 && w > 0) ? sprintf("%.2f", w / bind) : "-", (peer > 0 && w > 0) ? sprintf("%.2f", w / peer) : "-"
      }
      printf "\n"
    }
  }' "$WORK/results"
echo "results: $WORK/results"
