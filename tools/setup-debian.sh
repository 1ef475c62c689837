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
# TensorBoard is not packaged in Debian 12: the test that reads the run's event files
# back (tests/test_tensorboard.py) needs it from PyPI, for the system python the tests use.
install_tensorboard() {
  if /usr/bin/python3 -c "import tensorboard" 2>/dev/null; then return 0; fi
  echo "setup-debian: installing tensorboard (pip) for /usr/bin/python3"
  "${as_root[@]}" /usr/bin/python3 -m pip install --quiet --break-system-packages tensorboard
}
# The consumers of `engine export` (tests/test_export_onnxruntime.py,
# tests/test_export_torch.py) need onnxruntime and safetensors from PyPI, which are not in
# Debian 12. Pinned, and with numpy held at Debian's (python3-numpy 1.24), so pip does not
# replace the numpy that torch and h5py were built against.
install_export_consumers() {
  if /usr/bin/python3 -c "import onnxruntime, safetensors" 2>/dev/null; then return 0; fi
  echo "setup-debian: installing onnxruntime and safetensors (pip) for /usr/bin/python3"
  local constraints
  constraints="$(mktemp)"
  /usr/bin/python3 -c 'import numpy; print("numpy==" + numpy.__version__)' >"$constraints"
  chmod 644 "$constraints"
  "${as_root[@]}" /usr/bin/python3 -m pip install --quiet --break-system-packages \
    -c "$constraints" onnxruntime==1.32.0 safetensors==0.8.0
  rm -f "$constraints"
}
# The arm64 builds of HDF5 and zlib for the aarch64 cross build's test (tests/aarch64.sh),
# downloaded into .deps/ without installing them. Not fatal: without them that test skips.
fetch_arm64_libs() {
  tools/fetch-arm64-libs.sh || echo "setup-debian: the arm64 libraries could not be fetched: the aarch64 test will skip" >&2
}
as_root=()
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then as_root=(sudo); fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-debian: all ${#packages[@]} packages of .ci/packages.txt are installed"
  install_tensorboard
  install_export_consumers
  fetch_arm64_libs
  exit 0
fi

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
install_tensorboard
install_export_consumers
fetch_arm64_libs
