# Whether this machine has an NVIDIA GPU, asked once when configuring: STRATA_BUILD_CUDA=AUTO builds the CUDA
# programs (GPU tests, .cu examples and benchmarks) only where they can run, because without a GPU they would
# all report themselves skipped after most of the build's compile time.
include_guard(GLOBAL)

# Sets `out` to TRUE where nvidia-smi lists a GPU or the driver's first device node exists. A false "yes" costs
# compile time only; a false "no" on a GPU machine is what STRATA_REQUIRE_GPU=1 (or STRATA_BUILD_CUDA=ON) is for.
function(strata_gpu_present out)
  set(found FALSE)
  find_program(STRATA_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(STRATA_NVIDIA_SMI)
  if(STRATA_NVIDIA_SMI)
    execute_process(COMMAND "${STRATA_NVIDIA_SMI}" -L OUTPUT_VARIABLE listed RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0 AND listed MATCHES "GPU [0-9]+:")
      set(found TRUE)
    endif()
  endif()
  if(EXISTS "/dev/nvidia0")
    set(found TRUE)
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# Resolves STRATA_BUILD_CUDA=AUTO to ON or OFF in the caller's scope (a normal variable over the cache entry, so
# every `if(STRATA_BUILD_CUDA)` below reads the answer), and sets STRATA_CUDA_LEFT_OUT to why it is OFF.
macro(strata_resolve_cuda_auto)
  set(STRATA_CUDA_LEFT_OUT "")
  if(STRATA_BUILD_CUDA STREQUAL "AUTO")
    strata_gpu_present(strata_gpu_here)
    if(strata_gpu_here OR "$ENV{STRATA_REQUIRE_GPU}" STREQUAL "1")
      set(STRATA_BUILD_CUDA ON)
    else()
      set(STRATA_BUILD_CUDA OFF)
      set(STRATA_CUDA_LEFT_OUT "no GPU found when configuring")
      message(STATUS "strata: no GPU here: the CUDA programs (GPU tests, .cu examples and benchmarks) are not built; "
                     "-DSTRATA_BUILD_CUDA=ON (or STRATA_REQUIRE_GPU=1 in the environment) builds them")
    endif()
  endif()
endmacro()
