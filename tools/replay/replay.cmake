# tools/replay: the trace reader and replay shared by bench/replay, bench/peers, strata-plan and the tests.
# One INTERFACE target, defined once whoever includes this first: zlib reads .gz traces where CMake finds it;
# without it the reader runs `gzip -dc`.
include_guard(GLOBAL)
add_library(strata_replay INTERFACE)
target_include_directories(strata_replay INTERFACE "${CMAKE_CURRENT_LIST_DIR}")
target_link_libraries(strata_replay INTERFACE strata::strata)
find_package(ZLIB)
if(ZLIB_FOUND)
  target_link_libraries(strata_replay INTERFACE ZLIB::ZLIB)
  target_compile_definitions(strata_replay INTERFACE STRATA_REPLAY_ZLIB)
else()
  message(STATUS "strata: zlib not found; .gz traces are read through gzip -dc")
endif()
