#!/usr/bin/env bash
# Builds bench/torch_shim (PyTorch's CUDA caching allocator behind a C interface) into build-torch/, against
# the torch that python3 imports, so bench/peers can compare it: peers --torch-shim build-torch/libstrata_torch_shim.so
# TORCH_CMAKE_PREFIX names torch's share/cmake instead (a torch unpacked from its wheel, no import needed).
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${TORCH_CMAKE_PREFIX:-$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')}
# TorchConfig.cmake stops where it finds no CUDA toolkit it likes: then torch's folders are used directly.
cmake -S bench/torch_shim -B build-torch -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" ||
  { rm -rf build-torch && cmake -S bench/torch_shim -B build-torch -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DSTRATA_TORCH_WITHOUT_CONFIG=ON; }
cmake --build build-torch -j2
