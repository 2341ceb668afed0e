# `cmake --install` rules: attncheck as a CMake package (libraries, headers, the attncheck-law runner and
# the plug-in host, attncheck_add_laws()), the attncheck command, and the Python client, so another
# project can find_package(attncheck) and check its own implementation in its own ctest.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ATTNCHECK_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/attncheck)
set(ATTNCHECK_INSTALL_PYTHONDIR ${CMAKE_INSTALL_DATADIR}/attncheck/python)

# Exported as attncheck::<EXPORT_NAME>, the same names the aliases give them in this build.
set_target_properties(attncheck_attention PROPERTIES EXPORT_NAME attention)
set_target_properties(attncheck_properties PROPERTIES EXPORT_NAME properties)
set_target_properties(attncheck_harness PROPERTIES EXPORT_NAME harness)
set_target_properties(attncheck_plugin_api PROPERTIES EXPORT_NAME plugin_api)
set_target_properties(attncheck_options PROPERTIES EXPORT_NAME options)
set_target_properties(attncheck_law_main PROPERTIES EXPORT_NAME law_main)
set_target_properties(attncheck-law PROPERTIES EXPORT_NAME law)
set_target_properties(attncheck-plugin-host PROPERTIES EXPORT_NAME plugin_host)

# attncheck_options travels only as a link-only dependency of the static libraries (its flags do not).
install(TARGETS attncheck_attention attncheck_properties attncheck_harness attncheck_plugin_api attncheck_options
                attncheck_law_main attncheck-law attncheck-plugin-host
        EXPORT attncheckTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET attncheck)
  install(TARGETS attncheck RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
foreach(dir attention properties harness)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${dir}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/cli/include/attncheck/law_main.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/attncheck)
install(EXPORT attncheckTargets NAMESPACE attncheck:: DESTINATION ${ATTNCHECK_INSTALL_CMAKEDIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/attncheckConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/attncheckConfig.cmake
                              INSTALL_DESTINATION ${ATTNCHECK_INSTALL_CMAKEDIR}
                              PATH_VARS ATTNCHECK_INSTALL_PYTHONDIR)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/attncheckConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/attncheckConfig.cmake ${PROJECT_BINARY_DIR}/attncheckConfigVersion.cmake
              ${CMAKE_CURRENT_LIST_DIR}/attncheckLaws.cmake
        DESTINATION ${ATTNCHECK_INSTALL_CMAKEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/harness/python/attncheck_plugin.py DESTINATION ${ATTNCHECK_INSTALL_PYTHONDIR})
install(FILES ${PROJECT_SOURCE_DIR}/harness/PROTOCOL.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
