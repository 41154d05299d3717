# cmake/llvm.cmake — `kiln package`: LLVM for the compiler, and the static
# runtime a packaged executable is linked with. Included once, at the end of
# the top-level CMakeLists.txt (it needs the runtime's targets).
#
# KILN_LLVM=AUTO|ON|OFF: AUTO uses LLVM when found (any LLVM >= 14 with its
# C API: find_package(LLVM CONFIG), looked for in /usr/lib/llvm-NN too, else
# llvm-config), ON requires it, OFF builds without (then `kiln package` says
# so and exits 1). Only the `kiln` binary (codegen/package.c) links
# libLLVM; nothing of the runtime does.
#
# The static runtime: KILN_PACKAGE_LIBS below is the ONE list of static
# libraries a packaged executable links (archives, in a --start-group), and
# KILN_PACKAGE_FLAGS the flags after them. Both are written at configure
# time into the generated generated/kiln_package_link.h: each archive's file
# name, its path in this build tree, and the flags (shared libraries by full
# path). `kiln package` looks for the archives in $KILN_PACKAGE_LIBDIR, then
# in <prefix>/lib/kiln beside an installed kiln (`cmake --install` puts them
# there), then in the build tree, so the link works from both.
set(KILN_LLVM AUTO CACHE STRING "LLVM for `kiln package` (standalone executables): AUTO, ON or OFF")
set_property(CACHE KILN_LLVM PROPERTY STRINGS AUTO ON OFF)

set(KILN_HAVE_LLVM OFF)
set(KILN_LLVM_VERSION_STRING "")
if(NOT KILN_LLVM STREQUAL "OFF")
  set(kiln_llvm_hints)
  foreach(v 20 19 18 17 16 15 14)
    list(APPEND kiln_llvm_hints /usr/lib/llvm-${v}/lib/cmake/llvm)
  endforeach()
  find_package(LLVM CONFIG QUIET HINTS ${kiln_llvm_hints})
  if(LLVM_FOUND AND LLVM_VERSION_MAJOR VERSION_GREATER_EQUAL 14)
    add_library(kiln_llvm INTERFACE)
    target_include_directories(kiln_llvm SYSTEM INTERFACE ${LLVM_INCLUDE_DIRS})
    if(TARGET LLVM) # libLLVM-NN.so (Debian, and LLVM built with LLVM_BUILD_LLVM_DYLIB)
      target_link_libraries(kiln_llvm INTERFACE LLVM)
    else()
      llvm_map_components_to_libnames(kiln_llvm_libs core analysis target native)
      target_link_libraries(kiln_llvm INTERFACE ${kiln_llvm_libs})
    endif()
    set(KILN_LLVM_VERSION_STRING ${LLVM_PACKAGE_VERSION})
    set(KILN_HAVE_LLVM ON)
  else()
    find_program(KILN_LLVM_CONFIG NAMES llvm-config llvm-config-20 llvm-config-19 llvm-config-18 llvm-config-17
                 llvm-config-16 llvm-config-15 llvm-config-14)
    if(KILN_LLVM_CONFIG)
      execute_process(COMMAND ${KILN_LLVM_CONFIG} --version OUTPUT_VARIABLE v OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(v VERSION_GREATER_EQUAL 14)
        execute_process(COMMAND ${KILN_LLVM_CONFIG} --includedir OUTPUT_VARIABLE inc OUTPUT_STRIP_TRAILING_WHITESPACE)
        execute_process(COMMAND ${KILN_LLVM_CONFIG} --ldflags OUTPUT_VARIABLE ldf OUTPUT_STRIP_TRAILING_WHITESPACE)
        execute_process(COMMAND ${KILN_LLVM_CONFIG} --libs core analysis target native
                        OUTPUT_VARIABLE libs OUTPUT_STRIP_TRAILING_WHITESPACE)
        execute_process(COMMAND ${KILN_LLVM_CONFIG} --system-libs core analysis target native
                        OUTPUT_VARIABLE syslibs OUTPUT_STRIP_TRAILING_WHITESPACE)
        separate_arguments(ldf UNIX_COMMAND "${ldf}")
        separate_arguments(libs UNIX_COMMAND "${libs} ${syslibs}")
        add_library(kiln_llvm INTERFACE)
        target_include_directories(kiln_llvm SYSTEM INTERFACE ${inc})
        target_link_options(kiln_llvm INTERFACE ${ldf})
        target_link_libraries(kiln_llvm INTERFACE ${libs} stdc++)
        set(KILN_LLVM_VERSION_STRING ${v})
        set(KILN_HAVE_LLVM ON)
      endif()
    endif()
  endif()
  if(NOT KILN_HAVE_LLVM AND KILN_LLVM STREQUAL "ON")
    message(FATAL_ERROR "KILN_LLVM=ON but no LLVM >= 14 was found (Debian: apt-get install llvm-16-dev; "
                        "or set LLVM_DIR to <llvm>/lib/cmake/llvm)")
  endif()
endif()
message(STATUS "kiln LLVM for `kiln package` (KILN_LLVM=${KILN_LLVM}): ${KILN_HAVE_LLVM} ${KILN_LLVM_VERSION_STRING}")

# The CLI a packaged executable runs: NAME run|bench|inspect (compiler/standalone.c)
# over the commands' own sources; nothing of the front end, passes or codegen.
add_library(kiln_standalone STATIC ${CMAKE_SOURCE_DIR}/compiler/standalone.c)
target_link_libraries(kiln_standalone PUBLIC kiln_cli)

# ---- the ONE list: static libraries + flags of a packaged executable ----
# The packaged entry (standalone.c), the commands kiln-run has (kiln_cli) and libkiln.a (cmake/libkiln.cmake: the whole runtime, CPU
# and GPU executors; NVRTC never, cuBLASLt and the driver through dlopen).
set(KILN_PACKAGE_LIBS kiln_standalone kiln_cli kiln_static)
set(KILN_PACKAGE_FLAGS ${JANSSON_LINK_LIBRARIES} ${ZSTD_LINK_LIBRARIES} ${XXHASH_LINK_LIBRARIES}
    ${PCRE2_LINK_LIBRARIES})
list(APPEND KILN_PACKAGE_FLAGS -pthread -lm ${CMAKE_DL_LIBS})
list(TRANSFORM KILN_PACKAGE_FLAGS REPLACE "^dl$" "-ldl")
if(KILN_SANITIZE) # the archives are instrumented: the executable needs the sanitizer runtimes
  list(APPEND KILN_PACKAGE_FLAGS -fsanitize=address,undefined)
endif()
set(KILN_PACKAGE_INSTALL_LIBDIR lib/kiln)

set(kiln_names "")
set(kiln_built "")
foreach(t ${KILN_PACKAGE_LIBS})
  string(APPEND kiln_names "\"$<TARGET_FILE_NAME:${t}>\", ")
  string(APPEND kiln_built "\"$<TARGET_FILE:${t}>\", ")
endforeach()
set(kiln_flags "")
foreach(f ${KILN_PACKAGE_FLAGS})
  string(APPEND kiln_flags "\"${f}\", ")
endforeach()
file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/generated/kiln_package_link.h CONTENT
"/* Generated by cmake/llvm.cmake: how `kiln package` links an executable. */
#define KILN_LLVM_VERSION \"${KILN_LLVM_VERSION_STRING}\"
#define KILN_PACKAGE_ARCHIVE_NAMES ${kiln_names}
#define KILN_PACKAGE_BUILD_ARCHIVES ${kiln_built}
#define KILN_PACKAGE_LINK_FLAGS ${kiln_flags}\"\"
#define KILN_PACKAGE_INSTALL_LIBDIR \"${KILN_PACKAGE_INSTALL_LIBDIR}\"
")

if(KILN_HAVE_LLVM)
  target_compile_definitions(kiln_codegen PRIVATE KILN_HAVE_LLVM=1)
  target_include_directories(kiln_codegen PRIVATE ${CMAKE_BINARY_DIR}/generated)
  target_link_libraries(kiln_codegen PRIVATE kiln_llvm)
  add_dependencies(kiln ${KILN_PACKAGE_LIBS}) # `kiln package` links them
endif()
install(TARGETS kiln RUNTIME DESTINATION bin)
install(TARGETS ${KILN_PACKAGE_LIBS} ARCHIVE DESTINATION ${KILN_PACKAGE_INSTALL_LIBDIR})
