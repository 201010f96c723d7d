# Sourced by the device scripts that run PyTorch with the plug-in (torch.sh, speed_verdict.sh, speed_study.sh,
# calls_per_step.sh): `strata_build_plugin LOG` builds libstrata_alloc.so (and, with PyTorch's CMake package
# found, the hooks library) in build-device-torch/, its output to LOG, and exports STRATA_ALLOC_LIBRARY and
# PYTHONPATH for `import strata_torch`. Returns non-zero when the build fails; the caller says so. Run from the
# repository root. With STRATA_ALLOC_LIBRARY already naming a built library (a driver that built it once before
# starting several scripts side by side) nothing is rebuilt; nor when build-device-torch/ was built elsewhere
# (prebuild_plugin.sh) for the PyTorch installed here and from the sources here (its stamp says so).

# "TORCH_VERSION GIT_VERSION sources:SHA256": what a build of the plug-in for that PyTorch from these sources is.
strata_torch_stamp() {
  local sources
  sources=$(find plugin include python/strata_torch cmake CMakeLists.txt -type f \( -name '*.cpp' -o -name '*.hpp' \
              -o -name '*.h' -o -name '*.py' -o -name '*.cmake' -o -name CMakeLists.txt \) | LC_ALL=C sort |
            xargs sha256sum | sha256sum | cut -c1-16)
  echo "$1 sources:$sources"
}

strata_build_plugin() {
  : >"$1"
  if [ -n "${STRATA_ALLOC_LIBRARY:-}" ] && [ -f "$STRATA_ALLOC_LIBRARY" ]; then
    export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
    echo "using the plug-in already built: $STRATA_ALLOC_LIBRARY" >>"$1"
    return 0
  fi
  if [ -f build-device-torch/strata_torch_stamp.txt ] && [ -f build-device-torch/plugin/libstrata_alloc.so ]; then
    local here
    here=$(strata_torch_stamp "$(python3 -c 'import torch; print(torch.__version__, torch.version.git_version)' 2>/dev/null)")
    if [ "$here" = "$(cat build-device-torch/strata_torch_stamp.txt)" ]; then
      export STRATA_ALLOC_LIBRARY=$PWD/build-device-torch/plugin/libstrata_alloc.so
      export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
      echo "using the plug-in built elsewhere for this PyTorch and these sources: $here" >>"$1"
      return 0
    fi
    echo "build-device-torch/ was built for '$(cat build-device-torch/strata_torch_stamp.txt)', not '$here': building again" >>"$1"
    rm -rf build-device-torch
  fi
  export PATH=/usr/local/cuda/bin:$PATH
  local torch_prefix
  torch_prefix=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) &&
    export CMAKE_PREFIX_PATH=$torch_prefix${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  { cmake -S . -B build-device-torch -DCMAKE_BUILD_TYPE=Release -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_EXAMPLES=OFF \
      -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_TOOLS=OFF -DSTRATA_BUILD_CUDA=OFF -DSTRATA_BUILD_PLUGIN=ON &&
    cmake --build build-device-torch --target strata_python_libs -j "$(nproc)"; } >>"$1" 2>&1 || return 1
  export STRATA_ALLOC_LIBRARY=$(find "$PWD/build-device-torch" -name libstrata_alloc.so | head -1)
  export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
}
