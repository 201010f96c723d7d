# nlohmann_json::nlohmann_json for every part of the project that reads or writes JSON (tools/viewer, the
# plug-in), found once: its CMake package where installed (Debian and Ubuntu: nlohmann-json3-dev; elsewhere
# -Dnlohmann_json_DIR=...), else its headers alone (a machine without the package: .device/nlohmann/, or
# STRATA_NLOHMANN_JSON_INCLUDE). The header-only library in include/ needs none of it.
include_guard(GLOBAL)
find_package(nlohmann_json 3.10 QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_path(STRATA_NLOHMANN_JSON_INCLUDE nlohmann/json.hpp HINTS "${PROJECT_SOURCE_DIR}/.device")
  if(NOT STRATA_NLOHMANN_JSON_INCLUDE)
    message(FATAL_ERROR "strata's tools (strata-plan's --html, strata-view) and its allocator plug-in read and write JSON "
                        "with nlohmann/json, which was not found: install it (Debian/Ubuntu: .ci/deps demo, or apt-get "
                        "install nlohmann-json3-dev), point nlohmann_json_DIR at its CMake package or "
                        "STRATA_NLOHMANN_JSON_INCLUDE at the folder holding nlohmann/json.hpp, or configure with "
                        "-DSTRATA_BUILD_TOOLS=OFF -DSTRATA_BUILD_PLUGIN=OFF")
  endif()
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED GLOBAL)
  target_include_directories(nlohmann_json::nlohmann_json INTERFACE "${STRATA_NLOHMANN_JSON_INCLUDE}")
else()
  set_property(TARGET nlohmann_json::nlohmann_json PROPERTY IMPORTED_GLOBAL TRUE)
endif()
