# libkiln.cmake — what ships to production hosts and how it installs.
#
#   libkiln.so.0 (SONAME) / libkiln.a   the public C API (runtime/kiln.h) with
#       the CPU executor and, in builds with CUDA, the GPU executor. Both are
#       made of the same objects as kiln_api + kiln_rt + kiln_cuda +
#       kiln_ksec + kiln_common (compiled once, position-independent); they
#       never contain NVRTC, LLVM or the front end. libkiln.so exports only kiln.h's
#       functions (cmake/libkiln.map).
#   cmake --install   bin/kiln, bin/kiln-run, lib/libkiln.so*, lib/libkiln.a,
#       include/kiln.h, lib/pkgconfig/kiln.pc, lib/cmake/kiln/ (find_package:
#       kiln::kiln = the shared library, kiln::kiln_static = the static one),
#       share/man/man1/kiln.1, kiln-run.1.
# The driver (libcuda.so.1) and cuBLASLt (libcublasLt.so.N) are loaded with
# dlopen when a GPU context is made; the RUNPATH $ORIGIN (and $ORIGIN/../lib
# for the programs) lets a copy of libcublasLt sit beside the binary.
include(GNUInstallDirs)

set(kiln_lib_parts kiln_api kiln_rt kiln_ksec kiln_common)
if(TARGET kiln_cuda)
  list(APPEND kiln_lib_parts kiln_cuda)
endif()
set(kiln_lib_objects)
foreach(part ${kiln_lib_parts})
  list(APPEND kiln_lib_objects $<TARGET_OBJECTS:${part}>)
endforeach()
# The libraries libkiln needs, as plain paths (exportable, unlike imported
# targets): the small C libraries only.
set(kiln_lib_deps ${JANSSON_LINK_LIBRARIES} ${ZSTD_LINK_LIBRARIES} ${XXHASH_LINK_LIBRARIES}
    ${PCRE2_LINK_LIBRARIES} m Threads::Threads ${CMAKE_DL_LIBS})

add_library(kiln_shared SHARED ${kiln_lib_objects})
set_target_properties(kiln_shared PROPERTIES
  OUTPUT_NAME kiln EXPORT_NAME kiln
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  BUILD_RPATH "\$ORIGIN" INSTALL_RPATH "\$ORIGIN"
  LINK_DEPENDS ${CMAKE_SOURCE_DIR}/cmake/libkiln.map)
target_link_options(kiln_shared PRIVATE -Wl,--version-script=${CMAKE_SOURCE_DIR}/cmake/libkiln.map)
if(NOT KILN_SANITIZE AND NOT KILN_FUZZ)  # clang leaves the sanitizer runtime to the program
  target_link_options(kiln_shared PRIVATE -Wl,--no-undefined)
endif()
target_link_libraries(kiln_shared PRIVATE ${kiln_lib_deps})
target_include_directories(kiln_shared INTERFACE $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/runtime>
                           $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/common> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

add_library(kiln_static STATIC ${kiln_lib_objects})
set_target_properties(kiln_static PROPERTIES OUTPUT_NAME kiln EXPORT_NAME kiln_static)
target_link_libraries(kiln_static INTERFACE ${kiln_lib_deps})
target_include_directories(kiln_static INTERFACE $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/runtime>
                           $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/common> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

if(TARGET test_api_dlopen)
  add_dependencies(test_api_dlopen kiln_shared)
  target_link_libraries(test_api_dlopen PRIVATE ${CMAKE_DL_LIBS})
endif()

# The programs find a libcublasLt copied beside them (in the build folder
# too, so a copied build behaves as an installed one) or in ../lib.
set_target_properties(kiln kiln-run PROPERTIES BUILD_RPATH "\$ORIGIN" INSTALL_RPATH "\$ORIGIN:\$ORIGIN/../lib")

# Linkage check: what kiln-run, libkiln.so and kiln NEED (tests/linkage.sh).
if(KILN_TESTS)
  add_test(NAME linkage
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/linkage.sh $<TARGET_FILE:kiln> $<TARGET_FILE:kiln-run>
                   $<TARGET_FILE:kiln_shared> ${CMAKE_SOURCE_DIR} ${KILN_SHARED_DIR})
endif()

# ---- install ----
install(TARGETS kiln kiln-run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kiln_shared kiln_static EXPORT kiln
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${CMAKE_SOURCE_DIR}/runtime/kiln.h ${CMAKE_SOURCE_DIR}/common/kiln_status.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_SOURCE_DIR}/docs/man/kiln.1 ${CMAKE_SOURCE_DIR}/docs/man/kiln-run.1
        DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)

# kiln.pc: relocatable (prefix from the .pc file's own place), so an install
# with `cmake --install --prefix DIR` works where it lands.
file(RELATIVE_PATH kiln_pc_up /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
string(REGEX REPLACE "/$" "" kiln_pc_up "${kiln_pc_up}")
if(CMAKE_DL_LIBS)
  set(kiln_pc_libs_private "-lm -lpthread -l${CMAKE_DL_LIBS}")
else()
  set(kiln_pc_libs_private "-lm -lpthread")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/kiln.pc.in ${CMAKE_BINARY_DIR}/kiln.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kiln.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# find_package(kiln): kiln::kiln and kiln::kiln_static.
include(CMakePackageConfigHelpers)
install(EXPORT kiln FILE kilnTargets.cmake NAMESPACE kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kilnConfig.cmake.in ${CMAKE_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
# A newer 0.x satisfies an older request (find_package(kiln 0.1) takes 0.2): the library keeps ABI 0,
# adding only struct_size-versioned fields and new functions (docs/c-api.md, "Ownership and ABI").
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kilnConfig.cmake ${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
