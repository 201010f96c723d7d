# Sourced by the device scripts that run PyTorch with the plug-in (torch.sh, speed_verdict.sh, speed_study.sh,
# calls_per_step.sh): `strata_build_plugin LOG` builds libstrata_alloc.so (and, with PyTorch's CMake package
# found, the hooks library) in build-device-torch/, its output to LOG, and exports STRATA_ALLOC_LIBRARY and
# PYTHONPATH for `import strata_torch`. Returns non-zero when the build fails; the caller says so. Run from the
# repository root. With STRATA_ALLOC_LIBRARY already naming a built library (a driver that built it once before
# starting several scripts side by side) nothing is rebuilt.
strata_build_plugin() {
  if [ -n "${STRATA_ALLOC_LIBRARY:-}" ] && [ -f "$STRATA_ALLOC_LIBRARY" ]; then
    export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
    echo "using the plug-in already built: $STRATA_ALLOC_LIBRARY" >"$1"
    return 0
  fi
  export PATH=/usr/local/cuda/bin:$PATH
  local torch_prefix
  torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) &&
    export CMAKE_PREFIX_PATH=$torch_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  { cmake -S . -B build-device-torch -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
      -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_TOOLS=OFF -DSTRATA_BUILD_CUDA=OFF -DSTRATA_BUILD_PLUGIN=ON &&
    cmake --build build-device-torch --target strata_python_libs -j "$(nproc)"; } >"$1" 2>&1 || return 1
  export STRATA_ALLOC_LIBRARY=$(find "$PWD/build-device-torch" -name libstrata_alloc.so | head -1)
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
}
