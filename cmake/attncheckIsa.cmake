# The core's hot loops for several instruction sets in one portable binary (function multiversioning by object):
#
#   attncheck_isa_copies(<target> SOURCES <src>... ISAS <isa>...)
#
# compiles each source once per instruction set, with <target>'s settings and, last, -O3 and that set's -march, as
# an object library of its own;
# cmake/isa_prefix.cmake then renames every symbol each copy defines with its set's prefix (attncheck_isa_<id>_),
# so no two copies share a name (Eigen's templates and inline functions included: one body each, never the
# linker's pick of one for all), and the renamed objects join <target>. The dispatcher (attention/src/isa.cpp)
# reads each copy's table through its prefixed name and chooses, at run time, the best set this CPU supports.
# A copy must not run code before that choice: no static constructor (attention/tests/isa_symbols.sh checks).
#
# The sets: `generic` (the preset's own flags, at -O3), and on x86-64 `x86-64-v3` (AVX2, FMA, F16C) and
# `x86-64-v4` (AVX-512 F/BW/DQ/VL/CD). With ATTNCHECK_NATIVE the whole build targets this machine: generic only.
# Under the sanitizers, one copy, `generic` compiled for this machine (-march=native): the copies differ in their
# packets' widths (2, 4 and 8 doubles), and what the sanitizers look for there is a tile's tail read or written past
# its end; the widest packets this machine runs leave the most tail lengths, and Eigen's AVX-512 path takes its
# half and quarter packets (4 and 2 doubles) on the tails too. A second copy cost the sanitizer build about 120 s
# of CPU; the narrower copies' results are the default build's question (attention_test once per copy).
include(CheckCXXCompilerFlag)

set(ATTNCHECK_ISAS generic)
set(candidates x86-64-v3 x86-64-v4)
if(ATTNCHECK_SANITIZE)
  set(candidates "")
  check_cxx_compiler_flag(-march=native ATTNCHECK_HAS_MARCH_NATIVE)
endif()
if(NOT ATTNCHECK_NATIVE AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  foreach(isa IN LISTS candidates)
    string(MAKE_C_IDENTIFIER "${isa}" id)
    check_cxx_compiler_flag(-march=${isa} ATTNCHECK_HAS_MARCH_${id})
    if(ATTNCHECK_HAS_MARCH_${id})
      list(APPEND ATTNCHECK_ISAS ${isa})
    endif()
  endforeach()
endif()
if(NOT CMAKE_NM OR NOT CMAKE_OBJCOPY)
  message(FATAL_ERROR "attncheck: the core's instruction-set copies need nm and objcopy (binutils); "
                      "found CMAKE_NM='${CMAKE_NM}', CMAKE_OBJCOPY='${CMAKE_OBJCOPY}'")
endif()

# The flags of one set: its -march (none for generic), and -O3 for every copy: the loops are what -O3 is for. Not
# under the sanitizers, whose preset's -O1 is for finding defects, not speed (six -O3 copies cost the sanitizer
# build about two minutes).
function(attncheck_isa_flags isa out)
  set(flags "")
  if(NOT ATTNCHECK_SANITIZE)
    list(APPEND flags -O3)
  endif()
  if(isa STREQUAL "native" OR (isa STREQUAL "generic" AND ATTNCHECK_SANITIZE AND ATTNCHECK_HAS_MARCH_NATIVE))
    list(APPEND flags -march=native)
  elseif(NOT isa STREQUAL "generic")
    list(APPEND flags -march=${isa} -mtune=generic)
  endif()
  if(NOT isa STREQUAL "generic" OR ATTNCHECK_SANITIZE)
    # GCC 12 warns inside its own AVX-512 intrinsics as Eigen uses them (_mm512_undefined_pd's self-initialised
    # __Y, read only under a full mask; -Wuninitialized where it inlines Eigen's exp into tanh_in_place): noise from
    # the compiler's headers, not from this code.
    list(APPEND flags $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized> $<$<CXX_COMPILER_ID:GNU>:-Wno-uninitialized>)
  endif()
  set(${out} ${flags} PARENT_SCOPE)
endfunction()

function(attncheck_isa_copies target)
  cmake_parse_arguments(ARG "" "" "SOURCES;ISAS" ${ARGN})
  foreach(isa IN LISTS ARG_ISAS)
    string(MAKE_C_IDENTIFIER "${isa}" id)
    attncheck_isa_flags(${isa} flags)
    foreach(src IN LISTS ARG_SOURCES)
      get_filename_component(stem ${src} NAME_WE)
      set(lib ${target}_${stem}_${id})
      # The target's own compile settings (its dependencies' include directories and definitions included),
      # then the set's flags, which come last and so win.
      add_library(${lib} OBJECT ${src})
      target_include_directories(${lib} PRIVATE $<TARGET_PROPERTY:${target},INCLUDE_DIRECTORIES>)
      target_compile_definitions(${lib} PRIVATE $<TARGET_PROPERTY:${target},COMPILE_DEFINITIONS>)
      target_compile_options(${lib} PRIVATE $<TARGET_PROPERTY:${target},COMPILE_OPTIONS> ${flags})
      target_compile_features(${lib} PRIVATE cxx_std_20)
      target_link_libraries(${lib} PRIVATE Eigen3::Eigen)  # its headers as system ones, as for <target>
      set_target_properties(${lib} PROPERTIES POSITION_INDEPENDENT_CODE ON)
      set(out ${CMAKE_CURRENT_BINARY_DIR}/isa/${id}/${stem}.o)
      add_custom_command(
        OUTPUT ${out}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/isa/${id}
        COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DOBJCOPY=${CMAKE_OBJCOPY} -DPREFIX=attncheck_isa_${id}_
                "-DINPUT=$<TARGET_OBJECTS:${lib}>" -DOUT=${out} -P ${PROJECT_SOURCE_DIR}/cmake/isa_prefix.cmake
        DEPENDS $<TARGET_OBJECTS:${lib}> ${PROJECT_SOURCE_DIR}/cmake/isa_prefix.cmake
        COMMENT "Renaming ${stem}'s ${isa} copy (attncheck_isa_${id}_)" VERBATIM)
      target_sources(${target} PRIVATE ${out})
      set_source_files_properties(${out} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    endforeach()
    string(TOUPPER "${id}" ID)
    target_compile_definitions(${target} PRIVATE ATTNCHECK_ISA_${ID}=1)
  endforeach()
endfunction()
