#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those that are missing. Prints one line
# when it installs something; apt's own output goes to a log that is shown only on failure.
set -euo pipefail
packages=(g++ cmake ninja-build clang-format libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libssl-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]} (Debian packages; log in /tmp/hybridkv-apt.log)"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  log=/tmp/hybridkv-apt.log
  if ! { $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
         $SUDO apt-get install -y -q "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log"
    echo "deps: apt-get failed (above)"
    exit 1
  fi
fi
