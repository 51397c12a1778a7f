#!/usr/bin/env bash
# Download the wheels of tools/gpu-wheels.txt, and build those of tools/gpu-sdists.txt (pure
# Python, no ops prebuilt), into .whl/ for a GPU node without a package index.
# Usage (from anywhere, on a machine that reaches PyPI): tools/gpu-wheels.sh [PYTHON_VERSION]
# PYTHON_VERSION is the GPU node's (default 3.12); copy .whl/ there beside the checkout, or
# carry it with the working tree, then run tools/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
mkdir -p .whl
grep -v '^#' tools/gpu-wheels.txt | grep . | xargs python3 -m pip download --quiet --no-deps \
  --only-binary=:all: --python-version "$version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl
# DeepSpeed's setup.py imports torch: built against this machine's, without isolation (which
# would download torch); DS_BUILD_OPS=0 leaves every op to be compiled where it is used
grep -v '^#' tools/gpu-sdists.txt | grep . | DS_BUILD_OPS=0 xargs python3 -m pip wheel --quiet \
  --no-deps --no-build-isolation --no-binary=:all: -w .whl
du -sh .whl
