# cmake -DNM=nm -DOBJCOPY=objcopy -DPREFIX=attncheck_isa_x86_64_v4_ -DINPUT=a.o -DOUT=b.o -P isa_prefix.cmake
#
# One instruction set's copy of a hot-loop source (cmake/attncheckIsa.cmake) made private to itself: every symbol
# the object defines is renamed PREFIX + name. Without it the copies' template instantiations and inline functions
# (Eigen's products, exp, the tile loops) would share names across the copies, and the linker would keep one body
# per name for all of them: AVX-512 code behind the portable path (an illegal instruction on an older CPU), or the
# portable code behind the AVX-512 one. The names it uses but does not define (the C and C++ libraries, the rest of
# the core) stay as they are. The dispatcher (attention/src/isa.cpp) names each copy's table, the one symbol it
# reads, by its prefixed name.
foreach(var NM OBJCOPY PREFIX INPUT OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "isa_prefix.cmake: -D${var}=... is required")
  endif()
endforeach()
execute_process(COMMAND ${NM} --defined-only --format=posix ${INPUT} OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "isa_prefix.cmake: ${NM} ${INPUT} failed (${rc})")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(names "")
foreach(line IN LISTS lines)
  # "name type value size". Renamed: every symbol the object defines, the local ones too ('n' among them: a
  # COMDAT group's signature, such as the D5 of a destructor's aliases, by which the linker keeps one group of a
  # name for the whole program); not the names it only uses ('U') nor absolute or debugging ones ('a', 'N').
  if(line MATCHES "^([^ ]+) ([A-Za-z]) ")
    set(name "${CMAKE_MATCH_1}")
    set(type "${CMAKE_MATCH_2}")
    if(NOT type MATCHES "^[NaU]$" AND NOT name MATCHES "^\\.")
      list(APPEND names "${name}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES names)  # two local symbols of one name (static functions of two scopes): one rename each
set(map "")
foreach(name IN LISTS names)
  string(APPEND map "${name} ${PREFIX}${name}\n")
endforeach()
file(WRITE ${OUT}.map "${map}")
execute_process(COMMAND ${OBJCOPY} --redefine-syms=${OUT}.map ${INPUT} ${OUT}.tmp RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "isa_prefix.cmake: ${OBJCOPY} --redefine-syms ${INPUT} failed (${rc})")
endif()
file(RENAME ${OUT}.tmp ${OUT})
