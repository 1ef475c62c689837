#!/usr/bin/env bash
# Downloads Debian's arm64 builds of the libraries the engine links (HDF5 with what it
# needs at run time, zlib) into .deps/arm64-debs/, for the aarch64 cross build and its
# test (tests/aarch64.sh, docs/packaging.md "aarch64"). libhdf5-dev is not multi-arch in
# Debian 12, so libhdf5-dev:arm64 cannot be installed beside the native one: the test
# unpacks these packages into a folder of its own instead (dpkg-deb -x). The host's dpkg
# is not touched: apt runs with a private state for the arm64 architecture only.
# Called by tools/setup-debian.sh; downloads nothing when every package is already here.
# A failure (no network) is reported and leaves the test to skip, saying why.
#   tools/fetch-arm64-libs.sh [DEST]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$ROOT/.deps/arm64-debs}"
state="$ROOT/.deps/arm64-apt"
# The packages the cross compiler (crossbuild-essential-arm64) brings itself.
toolchain_has='^(libc6|libc6-dev|linux-libc-dev|libcrypt-dev|libnsl-dev|libtirpc-dev|rpcsvc-proto|libc-dev-bin|gcc-12-base|libgcc-s1|libstdc\+\+6|libgomp1)$'

all_present() {
  [[ -f "$dest/packages.txt" ]] || return 1
  local f
  while read -r f; do [[ -f "$dest/$f" ]] || return 1; done <"$dest/packages.txt"
}
if all_present; then
  echo "fetch-arm64-libs: $(wc -l <"$dest/packages.txt") arm64 packages already in $dest"
  exit 0
fi
mkdir -p "$dest" "$state/lists/partial" "$state/cache/archives/partial"
: >"$state/status"
apt_opts=(-o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o "Dir::State::Lists=$state/lists"
          -o "Dir::State::status=$state/status" -o "Dir::Cache=$state/cache" -o Debug::NoLocking=1
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" -qq update
# HDF5's run-time closure (curl, ssl, ...) and zlib's headers; libhdf5-dev itself without
# its dependencies (its Fortran and C++ parts are not used).
mapfile -t packages < <(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances --no-pre-depends libhdf5-103-1 zlib1g-dev \
  | grep -v '^[ <]' | sort -u | grep -Ev "$toolchain_has")
packages+=(libhdf5-dev)
rm -f "$dest"/*.deb
(cd "$dest" && apt-get "${apt_opts[@]}" -qq download "${packages[@]}")
(cd "$dest" && ls -1 ./*.deb | sed 's|^\./||') >"$dest/packages.txt"
echo "fetch-arm64-libs: $(wc -l <"$dest/packages.txt") arm64 packages in $dest"
