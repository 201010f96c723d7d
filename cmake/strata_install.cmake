# strata's programs and the plug-in install as their own components, and only where they were built: the
# library is header-only, so `cmake --install` right after configuring installs the headers and the CMake
# package and says which built pieces it left out.

# strata_install_if_built(TARGET COMPONENT): installs TARGET (a program into bin/, a shared library into lib/)
# as part of COMPONENT when its file exists at install time, and otherwise prints how to build it.
function(strata_install_if_built target component)
  install(CODE "
    if(NOT EXISTS \"$<TARGET_FILE:${target}>\")
      message(STATUS \"strata: ${target} (component ${component}) is not built, so not installed; build it with: cmake --build \\\"${PROJECT_BINARY_DIR}\\\" --target ${target}\")
    endif()" COMPONENT ${component})
  install(TARGETS ${target} COMPONENT ${component} OPTIONAL
          RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
          LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endfunction()
