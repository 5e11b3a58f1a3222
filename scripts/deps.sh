#!/usr/bin/env bash
# Installs the Debian packages the build needs, only those that are missing, and the pinned
# Python packages into build/venv. Prints one line when it installs something; apt's and pip's
# own output goes to a log that is shown only on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ cmake ninja-build clang-format libgtest-dev libgmock-dev libbenchmark-dev
          nlohmann-json3-dev libcli11-dev libssl-dev python3-dev python3-venv pkg-config
          redis-server libhiredis-dev libxxhash-dev)
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

# The Python packages (pinned in python/requirements.txt) in a virtual environment of our own,
# build/venv; reinstalled only when the pins change.
venv=build/venv
pins=python/requirements.txt
if [[ ! -x $venv/bin/python ]] || ! cmp -s "$pins" "$venv/.pins"; then
  echo "deps: installing the Python packages of $pins into $venv (pip; log in /tmp/hybridkv-pip.log)"
  log=/tmp/hybridkv-pip.log
  if ! { python3 -m venv "$venv" && "$venv/bin/pip" install -q -r "$pins"; } >"$log" 2>&1; then
    cat "$log"
    echo "deps: pip failed (above)"
    exit 1
  fi
  cp "$pins" "$venv/.pins"
fi
