#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) from the PyPI sdist against the venv's torch, with Gloo
# CPU operations and no MPI/TensorFlow/MXNet, and install it. The wheel is cached, keyed by the
# torch and Python versions, so later setups take seconds.
#
# Two fixes to the published sdist are needed for torch 2.x (measured, see docs/horovod.md):
#  - both CMAKE_CXX_STANDARD 14 lines (CMakeLists.txt and horovod/torch/CMakeLists.txt) -> 17
#    (torch headers need C++17; patching only one gives duplicate gloo symbols at link time)
#  - CMAKE_POLICY_VERSION_MINIMUM=3.5 for CMake 4.
# And one fix to Horovod itself: GlooContext::InitializeForProcessSet builds its device from its
# own (empty) interface name instead of the global context's HOROVOD_GLOO_IFACE, so gloo falls
# back to resolving the hostname; where that gives loopback (Debian's 127.0.1.1, a container),
# ranks on different hosts are told to connect to 127.0.0.1 (found on the emulated multi-host
# cluster, tests/test_hosts.py). The patch makes it use the global context's interface.
# GPU build: where a CUDA toolkit (nvcc), a CUDA build of torch and NCCL (the nvidia-nccl wheel
# torch ships with, or a system libnccl) are all found, Horovod is built with
# HOROVOD_GPU_OPERATIONS=NCCL; else Gloo/CPU only. HOROVOD_GPU=1 insists on NCCL (an error if any of
# the three is missing), HOROVOD_GPU=0 builds for the CPU. Recipe measured on an H200 (docs/horovod.md).
# Offline: put the sdist at $SPARKML_DIST_CACHE/horovod-0.28.1.tar.gz (a download is kept there too).
set -euo pipefail
venv=${1:-.venv}
[ -d "$venv" ] && venv=$(cd "$venv" && pwd)
py="$venv/bin/python"
version=0.28.1
step() { echo "[horovod] $*"; }
fail() { echo "[horovod] FAILED at step '$1': $2" >&2; exit 1; }

[ -x "$py" ] || fail "find venv" "no $py; run scripts/setup_env.sh first"
patch_level=p1  # bump when the patches change: a different cache entry and a reinstall
marker="$venv/.horovod-$version-$patch_level"
if [ -f "$marker" ] && "$py" -c "import horovod.torch" 2>/dev/null; then
  step "horovod $("$py" -c 'import horovod; print(horovod.__version__)') already installed"; exit 0
fi
torch_v=$("$py" -c 'import torch; print(torch.__version__.replace("+", "_"))')
py_v=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache_root=${SPARKML_DIST_CACHE:-$HOME/.cache/sparkml_dist}
pip=("$py" -m pip --disable-pip-version-check)

# --- NCCL or not: a CUDA toolkit, a CUDA torch and NCCL's header and library -------------------
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
torch_cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")')
nccl=$("$py" - <<'FIND' || true
import glob, os, site, sys
roots = [*site.getsitepackages(), site.getusersitepackages()]
for root in roots:  # the nvidia-nccl-cu* wheel torch depends on
    inc, lib = os.path.join(root, "nvidia", "nccl", "include"), os.path.join(root, "nvidia", "nccl", "lib")
    if os.path.exists(os.path.join(inc, "nccl.h")) and glob.glob(os.path.join(lib, "libnccl.so*")):
        print(inc, sorted(glob.glob(os.path.join(lib, "libnccl.so*")))[0]); sys.exit(0)
for inc, lib in (("/usr/include", "/usr/lib/x86_64-linux-gnu"), ("/usr/local/cuda/include", "/usr/local/cuda/lib64")):
    found = sorted(glob.glob(os.path.join(lib, "libnccl.so*")))
    if os.path.exists(os.path.join(inc, "nccl.h")) and found:
        print(inc, found[0]); sys.exit(0)
sys.exit(1)
FIND
)
if [ "${HOROVOD_GPU:-}" = "0" ]; then
  variant=cpu
elif [ -n "$nvcc" ] && [ -n "$torch_cuda" ] && [ -n "$nccl" ]; then
  variant=nccl
elif [ -n "${HOROVOD_GPU:-}" ]; then
  fail "detect GPU build" "HOROVOD_GPU=$HOROVOD_GPU but nvcc='${nvcc:-none}', torch CUDA='${torch_cuda:-none}', NCCL='${nccl:-none}'"
else
  variant=cpu
fi
cache=$cache_root/horovod-$version-torch$torch_v-$py_v-$variant-$patch_level

if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
  command -v cmake >/dev/null || "${pip[@]}" install -q cmake || fail "cmake" "no cmake on PATH and pip could not install it"
  command -v g++ >/dev/null || fail "compiler" "g++ not found (Debian: apt-get install build-essential)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  sdist=$cache_root/horovod-$version.tar.gz
  if [ ! -f "$sdist" ]; then
    step "downloading the horovod $version sdist"
    "${pip[@]}" download -q --no-deps --no-binary :all: "horovod==$version" -d "$work" \
      || fail "download" "pip download horovod==$version (is PyPI reachable? offline: put the sdist at $sdist)"
    mkdir -p "$cache_root" && cp "$work/horovod-$version.tar.gz" "$sdist"
  fi
  tar -xzf "$sdist" -C "$work" || fail "unpack" "tar of the sdist"
  src="$work/horovod-$version"
  step "patching C++14 -> C++17 in both CMake files"
  for f in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
    grep -q "CMAKE_CXX_STANDARD 14" "$f" || fail "patch" "no 'CMAKE_CXX_STANDARD 14' in $f (sdist changed?)"
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
  done
  step "patching the process-set Gloo device to use HOROVOD_GLOO_IFACE"
  "$py" - "$src/horovod/common/gloo/gloo_context.cc" <<'PATCH' || fail "patch" "gloo_context.cc (sdist changed?)"
import sys
path = sys.argv[1]
text = open(path).read()
head, sep, tail = text.partition("GlooContext::InitializeForProcessSet(")
old = "device_attr.iface = gloo_iface_;"
assert sep and old in tail, "InitializeForProcessSet's device attribute not found"
open(path, "w").write(head + sep + tail.replace(old, "device_attr.iface = global_context.gloo_iface_;", 1))
PATCH
  # cffi: Horovod's setup.py needs it with torch, and setuptools would otherwise download it
  "${pip[@]}" install -q setuptools wheel psutil pyyaml cloudpickle packaging cffi \
    || fail "build deps" "pip install of build requirements"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO \
         CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)"
  # g++ 13 no longer pulls these in transitively, and Horovod's headers rely on it (std::string in
  # group_table.h, std::logic_error in common.h)
  if [ "$(g++ -dumpversion | cut -d. -f1)" -ge 13 ]; then
    export CXXFLAGS="${CXXFLAGS:-} -include string -include cstdint -include stdexcept -include limits -include memory \
-include functional -include algorithm -include cstring -include mutex -include thread"
  fi
  if [ "$variant" = nccl ]; then
    read -r nccl_include nccl_lib <<<"$nccl"
    # the wheel ships libnccl.so.2 only; the build links -lnccl: give it a libnccl.so beside it
    mkdir -p "$work/nccl-lib" && ln -sf "$nccl_lib" "$work/nccl-lib/libnccl.so"
    arch=$("$py" -c 'import torch; print("".join(map(str, torch.cuda.get_device_capability())) if torch.cuda.is_available() else "70,80,90")')
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=$(dirname "$(dirname "$nvcc")") \
           HOROVOD_BUILD_CUDA_CC_LIST=$arch HOROVOD_NCCL_INCLUDE=$nccl_include \
           HOROVOD_NCCL_LIB=$work/nccl-lib HOROVOD_NCCL_LINK=SHARED
    step "building with NCCL (CUDA $torch_cuda, compute capability $arch; NCCL from $nccl_lib)"
  else
    step "building (Gloo CPU ops; takes ~2 minutes on 2 cores)"
  fi
  mkdir -p "$cache"
  (cd "$src" && "$py" -m pip wheel -q --no-build-isolation --no-deps . -w "$cache") > "$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; fail "build" "pip wheel (log tail above)"; }
fi
step "installing $(basename "$cache"/horovod-*.whl)"
# --force-reinstall: the same version number with other patches must replace the installed one
"${pip[@]}" install -q --force-reinstall --no-deps "$cache"/horovod-*.whl || fail "install" "pip install of the cached wheel"
"${pip[@]}" install -q psutil pyyaml cloudpickle packaging || fail "install" "pip install of Horovod's requirements"
"$py" -c "import horovod.torch as hvd; assert hvd.gloo_built(), 'gloo missing'" || fail "import" "horovod.torch does not import or lacks Gloo"
if [ "$variant" = nccl ]; then
  "$py" -c "import horovod.torch as hvd; assert hvd.nccl_built(), 'NCCL missing'" || fail "import" "horovod.torch lacks NCCL"
fi
touch "$marker"
step "ok: horovod $version with $([ "$variant" = nccl ] && echo "NCCL (GPU) and Gloo (CPU)" || echo Gloo) for torch $torch_v"
