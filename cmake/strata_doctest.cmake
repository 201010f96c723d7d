# doctest::doctest for every test program of the project (tests/, plugin/tests/, tools/), found once: its CMake
# package where installed, else its header alone (Debian's doctest-dev ships both; some machines only the header).
include_guard(GLOBAL)
find_package(doctest QUIET)
if(NOT TARGET doctest::doctest)
  find_path(STRATA_DOCTEST_INCLUDE doctest/doctest.h REQUIRED)
  add_library(doctest::doctest INTERFACE IMPORTED GLOBAL)
  target_include_directories(doctest::doctest INTERFACE "${STRATA_DOCTEST_INCLUDE}")
else()
  set_property(TARGET doctest::doctest PROPERTY IMPORTED_GLOBAL TRUE)
endif()
