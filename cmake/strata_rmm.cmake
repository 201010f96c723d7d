# strata with RMM: strata_use_rmm(<target>) links the target to RMM (find_package(rmm) first) and to strata's
# headers, and tells interop/rmm_current.hpp which CCCL librmm was built with (STRATA_RMM_BUILT_WITH_CCCL), so
# a translation unit that sees another CCCL fails to compile naming both (Note [librmm's CCCL]).
# RMM brings its own CCCL (CCCL::CCCL from its package), newer than the toolkit's: such a target must not link
# strata::strata, whose CCCL is the toolkit's; it takes strata's include directory alone.
function(strata_use_rmm target)
  if(NOT TARGET rmm::rmm)
    message(FATAL_ERROR "strata_use_rmm(${target}): find_package(rmm) first")
  endif()
  if(NOT CCCL_VERSION)
    message(FATAL_ERROR "strata_use_rmm(${target}): RMM's package did not say which CCCL it found (CCCL_VERSION)")
  endif()
  string(REPLACE "." ";" strata_cccl_parts "${CCCL_VERSION}")
  list(GET strata_cccl_parts 0 strata_cccl_major)
  list(GET strata_cccl_parts 1 strata_cccl_minor)
  list(LENGTH strata_cccl_parts strata_cccl_n)
  set(strata_cccl_patch 0)
  if(strata_cccl_n GREATER 2)
    list(GET strata_cccl_parts 2 strata_cccl_patch)
  endif()
  math(EXPR strata_cccl_encoded "${strata_cccl_major} * 1000000 + ${strata_cccl_minor} * 1000 + ${strata_cccl_patch}")
  target_include_directories(${target} PRIVATE "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/../include")
  target_compile_definitions(${target} PRIVATE STRATA_RMM_BUILT_WITH_CCCL=${strata_cccl_encoded})
  target_link_libraries(${target} PRIVATE rmm::rmm CUDA::cuda_driver)
  target_compile_features(${target} PRIVATE cxx_std_20)
endfunction()
