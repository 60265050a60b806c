# deploy/packaging.cmake - install rules and Debian packages (`make deb`):
# lynx-coordinator, lynx-agent, lynx-frontend, lynxctl and lynx-dev (the
# application SDK: headers, pkg-config file, CMake package, examples and
# docs/writing-apps.md), one CPack DEB component each, for the build's architecture (amd64, or arm64 with
# LYNX_ARCH=arm64). Each daemon's package holds its program, its systemd
# unit (deploy/systemd/) and its configuration file under /etc/lynx/ (a
# conffile), with maintainer scripts (deploy/debian/) that create the lynx
# system user and enable and start the unit where systemd runs.
# Dependencies on the runtime libraries come from dpkg-shlibdeps.

set(LYNX_VERSION "0.18.0")
set(LYNX_DAEMONS coordinator agent frontend)

foreach(d IN LISTS LYNX_DAEMONS)
  install(TARGETS lynx-${d} RUNTIME DESTINATION bin COMPONENT ${d})
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/lynx-${d}.service
          DESTINATION lib/systemd/system COMPONENT ${d})
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/conf/${d}.conf
          DESTINATION /etc/lynx COMPONENT ${d})
endforeach()
install(TARGETS lynxctl RUNTIME DESTINATION bin COMPONENT lynxctl)

# The SDK (component dev): header only, so arch-independent paths
# (share/pkgconfig, share/cmake); both files find the headers relative to
# themselves. The plug-in ABI version is read from the header itself.
file(STRINGS ${PROJECT_SOURCE_DIR}/include/lynx/lynx_app.h _abi
     REGEX "^#define LYNX_APP_ABI_VERSION ")
string(REGEX REPLACE ".* ([0-9]+)u?$" "\\1" LYNX_APP_ABI "${_abi}")
set(LYNX_SDK_DIR ${CMAKE_BINARY_DIR}/sdk)
configure_file(${PROJECT_SOURCE_DIR}/deploy/sdk/lynx.pc.in
               ${LYNX_SDK_DIR}/lynx.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/deploy/sdk/LynxConfig.cmake.in
               ${LYNX_SDK_DIR}/LynxConfig.cmake @ONLY)
include(CMakePackageConfigHelpers)
write_basic_package_version_file(${LYNX_SDK_DIR}/LynxConfigVersion.cmake
  VERSION ${LYNX_VERSION} COMPATIBILITY SameMajorVersion ARCH_INDEPENDENT)
install(FILES ${PROJECT_SOURCE_DIR}/include/lynx/lynx_app.h
              ${PROJECT_SOURCE_DIR}/include/lynx/lynx_io.h
              ${PROJECT_SOURCE_DIR}/include/lynx/mqueue.h
              ${PROJECT_SOURCE_DIR}/include/lynx/lathist.h
              ${PROJECT_SOURCE_DIR}/include/lynx/lynx_call.h
              ${PROJECT_SOURCE_DIR}/include/lynx/lynx_gpu.h
              ${PROJECT_SOURCE_DIR}/include/lynx/lynx_dev.cuh
              ${PROJECT_SOURCE_DIR}/include/lynx/lynx_kernel.cuh
        DESTINATION include/lynx COMPONENT dev)
install(FILES ${LYNX_SDK_DIR}/lynx.pc DESTINATION share/pkgconfig COMPONENT dev)
install(FILES ${LYNX_SDK_DIR}/LynxConfig.cmake
              ${LYNX_SDK_DIR}/LynxConfigVersion.cmake
        DESTINATION share/cmake/Lynx COMPONENT dev)
install(FILES ${PROJECT_SOURCE_DIR}/docs/writing-apps.md
        DESTINATION share/doc/lynx-dev COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/
        DESTINATION share/doc/lynx-dev/examples COMPONENT dev)

# maintainer scripts and conffiles, per package
set(LYNX_DEB_DIR ${CMAKE_BINARY_DIR}/debian)
foreach(d IN LISTS LYNX_DAEMONS)
  string(TOUPPER ${d} D)
  set(PKG lynx-${d})
  set(UNIT lynx-${d}.service)
  if(d STREQUAL "coordinator")
    set(PURGE_DIRS "/var/lib/lynx")
  else()
    set(PURGE_DIRS "")
  endif()
  set(dir ${LYNX_DEB_DIR}/${d})
  foreach(s postinst prerm postrm)
    configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/${s}.in ${dir}/${s}
                   @ONLY FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE
                   GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  endforeach()
  file(WRITE ${dir}/conffiles "/etc/lynx/${d}.conf\n")
  set(CPACK_DEBIAN_${D}_PACKAGE_NAME ${PKG})
  set(CPACK_DEBIAN_${D}_FILE_NAME DEB-DEFAULT)
  set(CPACK_DEBIAN_${D}_PACKAGE_CONTROL_EXTRA
      "${dir}/postinst;${dir}/prerm;${dir}/postrm;${dir}/conffiles")
  set(CPACK_DEBIAN_${D}_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
  set(CPACK_DEBIAN_${D}_PACKAGE_SECTION net)
endforeach()
set(CPACK_DEBIAN_LYNXCTL_PACKAGE_NAME lynxctl)
set(CPACK_DEBIAN_LYNXCTL_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_LYNXCTL_PACKAGE_SECTION net)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME lynx-dev)
set(CPACK_DEBIAN_DEV_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE all) # headers and text only
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "pkgconf | pkg-config")
set(CPACK_COMPONENT_COORDINATOR_DESCRIPTION
    "Lynx coordinator: registry, placement, leases and dispatch tables\n Lynx serves network clients from message queues in accelerator memory;\n the coordinator places services on the accelerators of the cluster.")
set(CPACK_COMPONENT_AGENT_DESCRIPTION
    "Lynx agent: accelerator instances and their message queues\n Runs on every accelerator (GPU) host of a Lynx cluster.")
set(CPACK_COMPONENT_FRONTEND_DESCRIPTION
    "Lynx frontend: serves UDP and TCP clients from accelerator memory\n Runs on a SmartNIC's cores (BlueField) or an edge host.")
set(CPACK_COMPONENT_LYNXCTL_DESCRIPTION
    "Lynx command-line client of the coordinator's JSON API")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "Lynx application SDK: plug-ins the Lynx agent serves\n Headers of the plug-in ABI and the accelerator I/O API, a pkg-config\n file (lynx) and a CMake package (find_package(Lynx)), examples and\n docs/writing-apps.md.")

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME lynx)
set(CPACK_PACKAGE_VERSION ${LYNX_VERSION})
set(CPACK_PACKAGE_CONTACT "Lynx-C maintainers <maintainers@lynx-c.invalid>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL ${LYNX_DAEMONS} lynxctl dev)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd")
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR STREQUAL "aarch64")
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
endif()
set(CPACK_OUTPUT_FILE_PREFIX ${CMAKE_BINARY_DIR}/packages)
include(CPack)
