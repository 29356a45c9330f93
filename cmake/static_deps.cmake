# STRATA_STATIC_DEPS: link the third-party libraries that a bare GPU machine (Ubuntu 24.04 with
# the CUDA toolkit, no apt) lacks from their static archives, and the C++ runtime statically too,
# so one binary built here runs there. What stays dynamic: glibc, libm, libgomp (GCC's OpenMP
# runtime, present wherever g++ is) and the CUDA runtime (present wherever the toolkit is).
#
# Each library is found here, before the subdirectories ask for it, as an imported target that
# points at the archive; the subdirectories' own find_package() calls then reuse these targets.
# scripts/device_bundle.sh builds with this option; a normal build never turns it on.

set(_strata_saved_suffixes ${CMAKE_FIND_LIBRARY_SUFFIXES})
set(CMAKE_FIND_LIBRARY_SUFFIXES .a)

# yaml-cpp's CMake package names only its shared library, so the target is made by hand.
find_library(STRATA_YAML_CPP_ARCHIVE NAMES yaml-cpp REQUIRED)
find_path(STRATA_YAML_CPP_INCLUDE NAMES yaml-cpp/yaml.h REQUIRED)
add_library(yaml-cpp STATIC IMPORTED)
set_target_properties(yaml-cpp PROPERTIES
  IMPORTED_LOCATION "${STRATA_YAML_CPP_ARCHIVE}"
  INTERFACE_INCLUDE_DIRECTORIES "${STRATA_YAML_CPP_INCLUDE}")
add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)

# PCRE2: pkg-config's target, resolved to the archive (find_library sees only .a here).
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)

# ICU: the common library needs its data library and libdl when linked statically.
find_package(ICU REQUIRED COMPONENTS uc data)
set_property(TARGET ICU::uc APPEND PROPERTY INTERFACE_LINK_LIBRARIES ICU::data ${CMAKE_DL_LIBS})

set(CMAKE_FIND_LIBRARY_SUFFIXES ${_strata_saved_suffixes})

# OpenBLAS: FindBLAS (called in ops/) takes the archive. cblas_sgemm pulls no Fortran code
# from it, so no Fortran runtime is needed.
set(BLA_STATIC ON)
set(BLA_VENDOR OpenBLAS)

add_link_options($<$<LINK_LANGUAGE:CXX>:-static-libstdc++> $<$<LINK_LANGUAGE:CXX>:-static-libgcc>)
message(STATUS "strata: third-party libraries linked statically (STRATA_STATIC_DEPS)")
