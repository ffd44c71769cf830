#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) from the PyPI sdist against the venv's torch, with Gloo
# CPU operations and no MPI/TensorFlow/MXNet, and install it. The wheel is cached, keyed by the
# torch and Python versions, so later setups take seconds.
#
# Two fixes to the published sdist are needed for torch 2.x (measured, see docs/horovod.md):
#  - both CMAKE_CXX_STANDARD 14 lines (CMakeLists.txt and horovod/torch/CMakeLists.txt) -> 17
#    (torch headers need C++17; patching only one gives duplicate gloo symbols at link time)
#  - CMAKE_POLICY_VERSION_MINIMUM=3.5 for CMake 4.
# GPU build: HOROVOD_GPU=1 scripts/build_horovod.sh (adds HOROVOD_GPU_OPERATIONS=NCCL).
set -euo pipefail
venv=${1:-.venv}
[ -d "$venv" ] && venv=$(cd "$venv" && pwd)
py="$venv/bin/python"
version=0.28.1
step() { echo "[horovod] $*"; }
fail() { echo "[horovod] FAILED at step '$1': $2" >&2; exit 1; }

[ -x "$py" ] || fail "find venv" "no $py; run scripts/setup_env.sh first"
if "$py" -c "import horovod.torch" 2>/dev/null; then
  step "horovod $("$py" -c 'import horovod; print(horovod.__version__)') already installed"; exit 0
fi
torch_v=$("$py" -c 'import torch; print(torch.__version__.replace("+", "_"))')
py_v=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
variant=${HOROVOD_GPU:+nccl}; variant=${variant:-cpu}
cache=${SPARKML_DIST_CACHE:-$HOME/.cache/sparkml_dist}/horovod-$version-torch$torch_v-$py_v-$variant
pip=("$py" -m pip --disable-pip-version-check)

if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
  command -v cmake >/dev/null || "${pip[@]}" install -q cmake || fail "cmake" "no cmake on PATH and pip could not install it"
  command -v g++ >/dev/null || fail "compiler" "g++ not found (Debian: apt-get install build-essential)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  step "downloading the horovod $version sdist"
  "${pip[@]}" download -q --no-deps --no-binary :all: "horovod==$version" -d "$work" \
    || fail "download" "pip download horovod==$version (is PyPI reachable?)"
  tar -xzf "$work"/horovod-$version.tar.gz -C "$work" || fail "unpack" "tar of the sdist"
  src="$work/horovod-$version"
  step "patching C++14 -> C++17 in both CMake files"
  for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q "CMAKE_CXX_STANDARD 14" "$f" || fail "patch" "no 'CMAKE_CXX_STANDARD 14' in $f (sdist changed?)"
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
  done
  "${pip[@]}" install -q setuptools wheel psutil pyyaml cloudpickle packaging || fail "build deps" "pip install of build requirements"
  step "building (Gloo CPU ops; takes ~2 minutes on 2 cores)"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
         CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)"
  [ -n "${HOROVOD_GPU:-}" ] && export HOROVOD_GPU_OPERATIONS=NCCL
  mkdir -p "$cache"
  (cd "$src" && "$py" -m pip wheel -q --no-build-isolation --no-deps . -w "$cache") > "$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; fail "build" "pip wheel (log tail above)"; }
fi
step "installing $(basename "$cache"/horovod-*.whl)"
"${pip[@]}" install -q "$cache"/horovod-*.whl psutil pyyaml cloudpickle packaging || fail "install" "pip install of the cached wheel"
"$py" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'gloo missing'" || fail "import" "horovod.torch does not import or lacks Gloo"
step "ok: horovod $version with Gloo for torch $torch_v"
