#!/usr/bin/env bash
# Builds RMM's memory-resource tests against librmm over strata's stacks and over RMM's own resources
# (tests/rmm/CMakeLists.txt), here, without a GPU; the device only runs them (tests/rmm/run.sh).
# RMM's test sources are RMM's code and stay out of git: they go to .rmm_tests/src, from RMM_GIT_DIR (a clone
# of rapidsai/rmm; RMM_REF, default HEAD) unless already there. librmm comes from bench/get_rmm.sh's .whl/.
# Everything the device needs ends up in .rmm_tests/build/bin (programs and RMM's libraries); it also runs the
# ABI guard's compile-fail test, which needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${STRATA_RMM_ROOT:-$PWD}   # where .whl/ and .rmm_tests/ live (a worktree may point at the main checkout)
src="$root/.rmm_tests/src"
if [ ! -e "$src/cpp/tests/mr/mr_ref_test.hpp" ]; then
  : "${RMM_GIT_DIR:?no RMM tests in $src: set RMM_GIT_DIR to a clone of rapidsai/rmm}"
  mkdir -p "$src"
  git --git-dir="$RMM_GIT_DIR" archive "${RMM_REF:-HEAD}" cpp/tests | tar -x -C "$src"
  git --git-dir="$RMM_GIT_DIR" rev-parse "${RMM_REF:-HEAD}" > "$src/RMM_COMMIT"
fi
[ -d "$root/.whl/librmm" ] || { echo "no librmm in $root/.whl: run bench/get_rmm.sh first" >&2; exit 1; }
cmake_bin=cmake
if ! cmake --version | head -1 | grep -q "version [4-9]"; then
  export PYTHONPATH="$root/.whl/cmake${PYTHONPATH:+:$PYTHONPATH}"
  cmake_bin="$root/.whl/cmake/bin/cmake"
fi
export PATH=/usr/local/cuda/bin:$PATH
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# A build folder configured from another checkout (a worktree) is started afresh: CMake refuses to reuse it.
cache="$root/.rmm_tests/build/CMakeCache.txt"
if [ -f "$cache" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD/tests/rmm" "$cache"; then
  rm -rf "$root/.rmm_tests/build"
fi
"$cmake_bin" -S tests/rmm -B "$root/.rmm_tests/build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DRMM_TEST_SOURCES="$src/cpp/tests" \
  -DCMAKE_PREFIX_PATH="$root/.whl/librmm/lib64/cmake;$root/.whl/rapids_logger/lib64/cmake;$root/.whl/librmm/lib64/rapids/cmake"
"$cmake_bin" --build "$root/.rmm_tests/build" -j"${JOBS:-2}"
(cd "$root/.rmm_tests/build" && "${cmake_bin%cmake}ctest" --output-on-failure -R abi_guard_mismatch)
cp "$src/RMM_COMMIT" "$root/.rmm_tests/build/RMM_COMMIT"
cp "$root/.whl/librmm/VERSION" "$root/.rmm_tests/build/RMM_VERSION"
du -sh "$root/.rmm_tests/build/bin"
