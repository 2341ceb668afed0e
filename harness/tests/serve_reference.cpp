// A child for the exec: tests: attncheck's reference core served over the protocol, so a result that went
// through the wire can be compared bit for bit with the same call made in-process.
#include <unistd.h>

#include "attncheck/allocator.hpp"
#include "attncheck/harness.hpp"

int main() {
  attncheck::keep_freed_memory();
  const int protocol_out = ::dup(1);
  ::dup2(2, 1);
  return attncheck::serve([] { return attncheck::reference_implementation(); }, 0, protocol_out);
}
