#!/bin/sh
# isa_symbols.sh OBJDUMP NM BINARY COPY_OBJECT...
#
# The instruction-set copies stay apart in a linked program (cmake/attncheckIsa.cmake, isa_prefix.cmake):
#  1. no function outside an x86-64-v3 or -v4 copy (names attncheck_isa_x86_64_v*) holds an AVX instruction (a
#     %ymm or %zmm register): had the linker kept one copy's body of a shared Eigen template for all, the portable
#     path would run AVX-512 code and die on an older CPU;
#  2. each AVX copy holds its own AVX code (%ymm for v3, %zmm for v4): the copies are really built for their sets;
#  3. no copy runs code before the dispatcher's choice: none has a static constructor (.init_array or .ctors);
#  4. every name a copy defines is defined in the program: a copy's COMDAT group kept under another copy's
#     signature would leave its renamed aliases undefined, weak, and called as address 0.
set -eu
objdump=$1
nm=$2
binary=$3
shift 3
status=0
for obj in "$@"; do
  if "$objdump" -h "$obj" | grep -Eq '[[:space:]]\.(init_array|ctors)'; then
    echo "FAIL: $obj has a static constructor: its code would run before the CPU is asked what it supports"
    status=1
  fi
done
undefined=$("$nm" "$binary" | grep -E ' [wUv] attncheck_isa_' | head -5 || true)
if [ -n "$undefined" ]; then
  echo "FAIL: names of a copy left undefined in $binary:"
  echo "$undefined"
  status=1
fi
report=$("$objdump" -d --no-show-raw-insn "$binary" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $2; next }
  /%[yz]mm/ {
    if (fn ~ /^<attncheck_isa_x86_64_v3_/) v3 = 1
    else if (fn ~ /^<attncheck_isa_x86_64_v4_/) { if ($0 ~ /%zmm/) v4 = 1 }
    else if (!(fn in bad)) { bad[fn] = 1; nbad++; if (nbad <= 10) print "FAIL: AVX outside a copy: " fn ": " $0 }
  }
  END {
    if (nbad > 10) print "FAIL: ... " nbad " functions in all"
    if (!v3) print "FAIL: no %ymm instruction in the x86-64-v3 copy"
    if (!v4) print "FAIL: no %zmm instruction in the x86-64-v4 copy"
  }')
if [ -n "$report" ]; then
  echo "$report"
  status=1
fi
[ $status -eq 0 ] && echo "the copies stay apart in $binary: AVX only inside them, no static constructor in any"
exit $status
