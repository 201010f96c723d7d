#!/usr/bin/env bash
# Builds libstrata_alloc.so and strata's PyTorch backend (libstrata_torch_hooks.so) on a machine without a GPU
# or PyTorch, against the PyTorch wheel the GPU machine has installed, into build-device-torch/. Carried to the
# GPU machine (the device tool's `carry`), it is used there as built (build_plugin.sh checks its stamp: the
# same PyTorch, the same sources), so a device session spends none of its minutes building the plug-in.
#   tests/device/torch/prebuild_plugin.sh [TORCH_VERSION] [PYTHON_VERSION]    (defaults: 2.11.0 3.12)
# From the repository root. Needs nvcc's CUDA toolkit (the plug-in links the CUDA runtime), pip and network
# access to PyPI; the wheel (about 530 MB) is kept under $STRATA_WHEEL_DIR (default /tmp/strata-torch-wheel).
set -euo pipefail
version=${1:-2.11.0}
python=${2:-3.12}
wheels=${STRATA_WHEEL_DIR:-/tmp/strata-torch-wheel}
source tests/device/torch/build_plugin.sh
mkdir -p "$wheels"
wheel=$(ls "$wheels"/torch-"$version"-cp"${python/./}"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "downloading torch $version for Python $python"
  pip download --no-deps "torch==$version" --python-version "$python" --only-binary :all: \
    --platform manylinux_2_28_x86_64 -d "$wheels" >/dev/null
  wheel=$(ls "$wheels"/torch-"$version"-cp"${python/./}"-*.whl | head -1)
fi
tree=$wheels/torch-$version-py$python
if [ ! -f "$tree/torch/version.py" ]; then
  echo "unpacking $(basename "$wheel") (headers, libraries, CMake package)"
  python3 - "$wheel" "$tree" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
keep = ("torch/lib/", "torch/include/", "torch/share/", "torch/version.py")
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith(keep)])
PY
fi
stamp=$(strata_torch_stamp "$(python3 -c "
import runpy; v = runpy.run_path('$tree/torch/version.py'); print(v['__version__'], v['git_version'])")")
export PATH=/usr/local/cuda/bin:$PATH
rm -rf build-device-torch
cmake -S . -B build-device-torch -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
  -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_TOOLS=OFF -DSTRATA_BUILD_CUDA=OFF -DSTRATA_BUILD_PLUGIN=ON \
  -DCMAKE_PREFIX_PATH="$tree/torch/share/cmake" >/dev/null
cmake --build build-device-torch --target strata_python_libs -j "$(nproc)" >/dev/null
[ -f build-device-torch/plugin/libstrata_torch_hooks.so ] || { echo "the PyTorch backend was not built" >&2; exit 1; }
echo "$stamp" > build-device-torch/strata_torch_stamp.txt
echo "built build-device-torch/ for: $stamp"
