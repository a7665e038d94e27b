#!/usr/bin/env bash
# Builds the aarch64 emulation setup for `make cross-test` from the package registries only (Debian, PyPI):
# qemu-user, an aarch64 Python 3.11 unpacked from Debian's arm64 packages into a sysroot, and the aarch64
# wheels of what epctx imports to load a model (onnx and onnx-ir only for models with CPU nodes: a context
# model of EPContext nodes alone loads without them). Idempotent: a finished sysroot is left as it is.
#   scripts/cross/setup_aarch64.sh [SYSROOT]   (default: build/cross-aarch64)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SYSROOT="${1:-$ROOT/build/cross-aarch64}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
STAMP="$SYSROOT/.ready"
if [ -f "$STAMP" ]; then
    echo "aarch64 sysroot ready: $SYSROOT"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! command -v qemu-aarch64 >/dev/null; then
    echo "installing qemu-user (Debian)"
    $SUDO apt-get install -y -q qemu-user >/dev/null || { $SUDO apt-get update -q >/dev/null; $SUDO apt-get install -y -q qemu-user >/dev/null; }
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "adding Debian's arm64 package lists"
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -q >/dev/null
fi

DEBS="$SYSROOT.debs"
mkdir -p "$DEBS" "$SYSROOT"
# An aarch64 Python 3.11 and the shared libraries it and the wheels below load.
PACKAGES="libc6 libgcc-s1 libstdc++6 zlib1g libffi8 libssl3 libexpat1 libbz2-1.0 liblzma5 libzstd1
  libncursesw6 libtinfo6 libreadline8 libsqlite3-0 libuuid1 libcrypt1 libdb5.3 libgdbm6 libnsl2 libtirpc3
  libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1
  python3.11-minimal libpython3.11-minimal libpython3.11-stdlib"
echo "downloading Debian arm64 packages"
(cd "$DEBS" && apt-get download -q $(for p in $PACKAGES; do echo "$p:arm64"; done) >/dev/null)
for deb in "$DEBS"/*.deb; do dpkg -x "$deb" "$SYSROOT"; done

SITE="$SYSROOT/usr/lib/python3/dist-packages"  # on the path of Debian's python3.11
WHEELS="$SYSROOT.wheels"
mkdir -p "$SITE" "$WHEELS"
echo "downloading aarch64 wheels (PyPI)"
"$PY" -m pip download -q --dest "$WHEELS" --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
    --implementation cp --abi cp311 --abi abi3 --abi none \
    numpy ml_dtypes iree-base-runtime xxhash threadpoolctl \
    "onnx>=1.17,<1.24" "onnx-ir>=0.1.10,<0.2" protobuf typing_extensions packaging
for wheel in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$wheel" "$SITE"; done
touch "$STAMP"
echo "aarch64 sysroot ready: $SYSROOT ($(du -sh "$SYSROOT" | cut -f1))"
