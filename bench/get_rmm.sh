#!/usr/bin/env bash
# Fetches RMM (the librmm-cu13 wheel from PyPI and the rapids-logger wheel it needs) into .whl/ and builds
# bench/rmm_shim against it into build-rmm/, so bench/peers can compare RMM: peers --rmm-shim build-rmm/libstrata_rmm_shim.so
# Needs network once; build-rmm/ then holds the shim with RMM's libraries beside it, and can be carried alone
# to a machine without network (bench/run_all.sh finds it there).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
if [ ! -d .whl/librmm ]; then
  python3 -m pip download --no-deps -d .whl/wheels "librmm-cu13==26.10.*" "rapids-logger==0.3.*"
  for w in .whl/wheels/*.whl; do python3 -m zipfile -e "$w" .whl/; done
fi
# RMM's CMake package needs CMake 4; a private copy from PyPI where the machine's is older.
cmake_bin=cmake
if ! cmake --version | head -1 | grep -q "version [4-9]"; then
  [ -x .whl/cmake/bin/cmake ] || python3 -m pip install -q --target .whl/cmake "cmake>=4,<5"
  export PYTHONPATH="$PWD/.whl/cmake${PYTHONPATH:+:$PYTHONPATH}"
  cmake_bin=.whl/cmake/bin/cmake
fi
"$cmake_bin" -S bench/rmm_shim -B build-rmm -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/.whl/librmm/lib64/cmake;$PWD/.whl/rapids_logger/lib64/cmake;$PWD/.whl/librmm/lib64/rapids/cmake"
"$cmake_bin" --build build-rmm -j2
