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
