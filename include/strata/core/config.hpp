#pragma once
// The one place strata pulls in the CUDA runtime and CCCL's memory-resource vocabulary.
// CCCL 3.0 keeps cuda::mr behind an opt-in switch; the CMake target defines it too, so a translation unit
// that included <cuda/memory_resource> before strata still sees the concepts.
#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif
#include <cuda/memory_resource>
#include <cuda/stream_ref>
#include <cuda_runtime_api.h>
