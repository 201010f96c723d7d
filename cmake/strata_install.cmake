# strata's programs and the plug-in install as their own components, and only where they were built: the
# library is header-only, so `cmake --install` right after configuring installs the headers and the CMake
# package and says which built pieces it left out.

# strata_install_if_built(TARGET COMPONENT [FILES file...] [PROGRAMS file...]): installs TARGET (a program into
# bin/, a shared library into lib/) as part of COMPONENT when its file exists at install time, with the files
# that belong to it (FILES into include/, PROGRAMS into bin/); otherwise prints how to build it.
function(strata_install_if_built target component)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "FILES;PROGRAMS")
  set(companions "")
  foreach(file IN LISTS arg_FILES)
    get_filename_component(file "${file}" ABSOLUTE)
    string(APPEND companions "
      file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_INCLUDEDIR}\" TYPE FILE FILES \"${file}\")")
  endforeach()
  foreach(file IN LISTS arg_PROGRAMS)
    get_filename_component(file "${file}" ABSOLUTE)
    string(APPEND companions "
      file(INSTALL DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\" TYPE PROGRAM FILES \"${file}\")")
  endforeach()
  install(CODE "
    if(NOT EXISTS \"$<TARGET_FILE:${target}>\")
      message(STATUS \"strata: ${target} (component ${component}) is not built, so not installed; build it with: cmake --build \\\"${PROJECT_BINARY_DIR}\\\" --target ${target}\")
    else()${companions}
    endif()" COMPONENT ${component})
  install(TARGETS ${target} COMPONENT ${component} OPTIONAL
          RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
          LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endfunction()
