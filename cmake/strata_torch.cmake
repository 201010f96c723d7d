# PyTorch's CMake package for libstrata_torch_hooks.so (plugin/CMakeLists.txt). `pip install .` must build the
# hooks library wherever PyTorch is importable, or fail saying what to run: without it strata_torch.enable()
# refuses under PyTorch 2.11, long after the install looked fine. pip's build isolation hides the installing
# environment's packages (through PYTHONPATH), so the interpreter is asked twice: as the build runs it, and
# with -E, which ignores PYTHONPATH and sees the environment pip installs into.
include_guard(GLOBAL)

# Sets `out` to torch.utils.cmake_prefix_path as `python` sees it, plainly or with -E; empty where neither
# imports torch or the path is not a directory.
function(strata_torch_cmake_prefix python out)
  set(${out} "" PARENT_SCOPE)
  foreach(isolation IN ITEMS as_run without_pythonpath)
    set(flags "")
    if(isolation STREQUAL "without_pythonpath")
      set(flags -E)
    endif()
    execute_process(COMMAND "${python}" ${flags} -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE prefix RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET TIMEOUT 120)
    if(rc EQUAL 0 AND IS_DIRECTORY "${prefix}")
      set(${out} "${prefix}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

# What a failed search says: the commands that build the hooks library by hand.
function(strata_torch_remedy out python)
  set(${out} "build it by hand: CMAKE_PREFIX_PATH=$(${python} -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') pip install --no-build-isolation -v . (pip install -v . shows CMake's reasons)" PARENT_SCOPE)
endfunction()

# Finds Torch (Torch_FOUND, TORCH_LIBRARIES, TORCH_CXX_FLAGS in the caller's scope) as STRATA_TORCH_HOOKS asks:
# OFF: never; ON: or fail; AUTO (the default): where CMAKE_PREFIX_PATH leads to it, and under pip
# (scikit-build-core sets SKBUILD) wherever the installing Python imports torch, failing if it then does not load.
macro(strata_find_torch)
  set(STRATA_TORCH_HOOKS AUTO CACHE STRING "Build libstrata_torch_hooks.so: AUTO, ON (PyTorch required) or OFF")
  set_property(CACHE STRATA_TORCH_HOOKS PROPERTY STRINGS AUTO ON OFF)
  if(NOT STRATA_TORCH_HOOKS STREQUAL "OFF")
    find_package(Torch QUIET)
    if(NOT Torch_FOUND AND (SKBUILD OR STRATA_TORCH_HOOKS STREQUAL "ON"))
      find_package(Python3 COMPONENTS Interpreter QUIET)
      set(strata_torch_python "${Python3_EXECUTABLE}")
      if(Python_EXECUTABLE)  # scikit-build-core's: the interpreter pip runs
        set(strata_torch_python "${Python_EXECUTABLE}")
      endif()
      set(strata_torch_prefix "")
      if(strata_torch_python)
        strata_torch_cmake_prefix("${strata_torch_python}" strata_torch_prefix)
      endif()
      strata_torch_remedy(strata_torch_how "${strata_torch_python}")
      if(strata_torch_prefix)
        list(APPEND CMAKE_PREFIX_PATH "${strata_torch_prefix}")
        find_package(Torch QUIET)
        if(NOT Torch_FOUND)
          message(FATAL_ERROR "strata: PyTorch is importable (${strata_torch_python}) but its CMake package in "
                              "${strata_torch_prefix} did not load, so libstrata_torch_hooks.so cannot be built; "
                              "${strata_torch_how}; or, for a package without it, pip install . -C "
                              "cmake.define.STRATA_TORCH_HOOKS=OFF")
        endif()
      elseif(STRATA_TORCH_HOOKS STREQUAL "ON")
        message(FATAL_ERROR "strata: STRATA_TORCH_HOOKS=ON but no PyTorch was found (CMAKE_PREFIX_PATH, or "
                            "'${strata_torch_python}' importing torch); ${strata_torch_how}")
      else()
        message(WARNING "strata: PyTorch is not importable by ${strata_torch_python}: the package is built without "
                        "libstrata_torch_hooks.so (CuPy only; strata_torch.enable() under PyTorch 2.11 needs it). "
                        "Install PyTorch, then pip install . again")
      endif()
    endif()
  endif()
endmacro()
