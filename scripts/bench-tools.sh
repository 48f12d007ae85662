# Sourced by the benchmark scripts: `need TOOL...` installs each missing tool from Debian's
# packages (a fresh machine has none of them), and says which when it cannot.
need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" > /dev/null 2>&1 || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing ${missing[*]}" >&2
  if [ "$(id -u)" -ne 0 ]; then
    echo "the benchmarks need ${missing[*]}; install them or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
}

# `each_peer WORK PEERS COMMAND...` starts each peer of PEERS (comma-separated: gluster,
# moosefs; ../shared/bench/peers/) with its mount and data under WORK, runs
# `COMMAND... MOUNTPOINT PEER`, and stops it again; a peer that does not start is skipped with
# a line naming its log.
each_peer() {
  local work=$1 peers=$2 shared=${SHARED_BENCH:-../shared/bench} peer
  shift 2
  for peer in ${peers//,/ }; do
    if "$shared/peers/$peer.sh" up "$work/$peer-mnt" "$work/$peer-base" > "$work/$peer.log" 2>&1; then
      "$@" "$work/$peer-mnt" "$peer"
    else
      echo "$peer did not start; see $work/$peer.log" >&2
    fi
    "$shared/peers/$peer.sh" down "$work/$peer-mnt" "$work/$peer-base" >> "$work/$peer.log" 2>&1 || true
  done
}

# `on_bindfs WORK COMMAND...`: runs `COMMAND... MOUNTPOINT bindfs` on a bindfs passthrough of a
# directory under WORK (the FUSE ceiling over the local disk), then unmounts it.
on_bindfs() {
  local work=$1
  shift
  mkdir -p "$work/bindfs-base" "$work/bindfs"
  bindfs "$work/bindfs-base" "$work/bindfs"
  "$@" "$work/bindfs" bindfs
  umount "$work/bindfs"
}

# `settle` before each target, so that it starts on a quiet machine: the peers' daemons have
# exited (they go on for a while after their stop script returns, and measurably slowed the
# next rows), what the target before left dirty is written back, and the files it deleted no longer slow new ones.
# The last matters on an ext4 without a journal (as this machine's): it will not reuse an
# inode freed in the last 60 s and reads each such inode on the way to a free one, so every
# file created within a minute of mass deletes costs a scan past all of them — a whole row
# measured the row before it instead of itself. SETTLE_SECONDS=0 skips the wait.
SETTLE_SECONDS=${SETTLE_SECONDS:-65}
settle() {
  for _ in $(seq 1 60); do pgrep -f 'glusterd|glusterfs|mfsmaster|mfschunkserver|mfsmount' > /dev/null || break; sleep 0.5; done
  sync; sleep 2
  if [ "$(findmnt -no FSTYPE -T "${WORK:?}")" = ext4 ] && ! has_journal "${WORK:?}"; then
    sleep "$SETTLE_SECONDS"
  fi
}
# Whether the ext4 file system holding $1 has a journal (jbd2 lists the devices it serves).
has_journal() {
  local dev
  dev=$(basename "$(findmnt -no SOURCE -T "$1")")
  compgen -G "/proc/fs/jbd2/$dev-*" > /dev/null
}
