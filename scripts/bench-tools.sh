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
