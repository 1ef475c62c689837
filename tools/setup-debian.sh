#!/usr/bin/env bash
# Installs what the build, the tests and the training run need on Debian 12: the
# packages listed in .ci/packages.txt (build tools, libraries, the Fashion-MNIST files
# under /usr/share/datasets/fashion-mnist/). As root it calls apt-get itself (a fresh
# container has no sudo); otherwise through sudo. When every package is already
# installed it changes nothing and needs neither.
set -euo pipefail
cd "$(dirname "$0")/.."

read -r -a packages < .ci/packages.txt
missing=()
for p in "${packages[@]}"; do
  if [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null)" != "ii " ]; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all ${#packages[@]} packages of .ci/packages.txt are installed"
  exit 0
fi

as_root=()
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "setup-debian: missing packages (${missing[*]}): run this as root, or install sudo" >&2
    exit 1
  fi
  as_root=(sudo)
fi
echo "setup-debian: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "${packages[@]}"
