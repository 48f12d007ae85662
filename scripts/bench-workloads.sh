#!/usr/bin/env bash
# Real workloads on a tree of at least 20,000 files, in one run: the local disk, a bindfs
# passthrough of it (the FUSE ceiling over ext4), a `weft up` mount, and single-node GlusterFS
# and MooseFS through their FUSE clients. On each: untar the tree, `git clone` a local
# repository of it, then `find`, `du -s`, `ls -lR` with cold caches, and `rm -rf` of both
# copies. Seconds per step, then Weft's ratios (speed: the other's time over Weft's) against
# bindfs and the better peer.
#
# The tree: /usr/include, /usr/share/doc and the crate sources cargo unpacked to build Weft
# (~/.cargo/registry/src), as found on the machine; its file count is printed. A tree can be
# given instead (TREE=DIR).
# Usage: [WEFT=BINARY] scripts/bench-workloads.sh [TARGETS (default local,bindfs,weft,gluster,moosefs)]
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=${1:-local,bindfs,weft,gluster,moosefs}
WORK=$(mktemp -d /tmp/weft-bench-workloads.XXXXXX)
chmod a+rx "$WORK"   # the peers' daemons run as their own users
. scripts/bench-tools.sh
need bindfs git
cargo build --release --quiet
WEFT=${WEFT:-$PWD/target/release/weft}   # WEFT=BINARY measures another build
STEP_MAX=900   # seconds: a step that takes longer is cut and reported as such

# The tree, as a tarball and as a git repository.
mkdir -p "$WORK/src/tree"
if [ -n "${TREE:-}" ]; then
  cp -a "$TREE/." "$WORK/src/tree/"
else
  for dir in /usr/include /usr/share/doc "$HOME/.cargo/registry/src"; do
    [ -d "$dir" ] && mkdir -p "$WORK/src/tree$dir" && cp -a "$dir/." "$WORK/src/tree$dir/"
  done
fi
FILES=$(find "$WORK/src/tree" -type f | wc -l)
tar -C "$WORK/src" -cf "$WORK/tree.tar" tree
git -C "$WORK/src/tree" init -q
git -C "$WORK/src/tree" add -A
git -C "$WORK/src/tree" -c user.name=bench -c user.email=bench@localhost commit -qm tree
echo "tree: $FILES files, $(du -sh "$WORK/tree.tar" | cut -f1) as a tarball"

cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# `step NAME COMMAND...`: runs the command in the target's directory, prints its seconds.
step() {
  local name=$1 started ended
  shift
  started=$(date +%s.%N)
  if ! timeout "$STEP_MAX" "$@" > /dev/null 2>"$WORK/step.err"; then
    echo "  $name failed or took over ${STEP_MAX}s: $(tail -c 300 "$WORK/step.err")" >&2
    echo "$LABEL $name -" >> "$WORK/results"
    return 0
  fi
  ended=$(date +%s.%N)
  echo "$LABEL $name $(echo "$ended - $started" | bc)" >> "$WORK/results"
}
workloads() {
  local dir=$1/work
  LABEL=$2
  mkdir -p "$dir"
  cold; step untar tar -C "$dir" -xf "$WORK/tree.tar"
  cold; step git-clone git clone -q --no-local "$WORK/src/tree" "$dir/clone"
  cold; step find find "$dir/tree"
  cold; step du-s du -s "$dir/tree"
  cold; step ls-lR ls -lR "$dir/tree"
  cold; step rm-rf rm -rf "$dir/tree" "$dir/clone"
  grep "^$LABEL " "$WORK/results" | awk '{printf "  %-8s %s\n", $2, $3}'
}
for target in ${TARGETS//,/ }; do
  settle
  echo "$target:"
  case $target in
    local) mkdir -p "$WORK/local"; workloads "$WORK/local" local ;;
    bindfs) on_bindfs "$WORK" workloads ;;
    weft)
      "$WEFT" up --data-dir "$WORK/weft-data" --mountpoint "$WORK/weft" > "$WORK/up.log" 2>&1 &
      UP=$!
      for _ in $(seq 1 300); do grep -q "Press Ctrl-C" "$WORK/up.log" && break; sleep 0.2; done
      workloads "$WORK/weft" weft
      kill -INT $UP; wait $UP || true ;;
    gluster|moosefs) each_peer "$WORK" "$target" workloads ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
done

echo
echo "Weft's speed against bindfs and the better peer (their seconds over Weft's; > 1: Weft faster):"
awk '
  $3 != "-" { t[$1, $2] = $3; steps[$2] = 1 }
  END {
    n = split("untar git-clone find du-s ls-lR rm-rf", order, " ")
    for (i = 1; i <= n; i++) {
      s = order[i]; w = t["weft", s]
      if (w == "") continue
      best = ""
      if (t["gluster", s] != "") best = t["gluster", s]
      if (t["moosefs", s] != "" && (best == "" || t["moosefs", s] < best)) best = t["moosefs", s]
      printf "  %-8s weft %7.2fs", s, w
      if (t["bindfs", s] != "") printf "  vs bindfs %5.2f", t["bindfs", s] / w
      if (best != "") printf "  vs better peer %5.2f", best / w
      printf "\n"
    }
  }' "$WORK/results"
echo "results: $WORK/results"
