// Fuzzes what a served implementation decodes from attncheck: the whole input of serve() (the plug-in host's
// loop: hello, forward frames, bye) with the reference implementation behind it. serve() must answer or
// return an exit code for any input; a crash, a sanitizer report or an escaping exception is a bug.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fcntl.h>

#include "attncheck/harness.hpp"

using namespace attncheck;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // serve() reads a file descriptor: the input in a memory file, the answers to /dev/null.
  static const int out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const int in = ::memfd_create("fuzz-input", MFD_CLOEXEC);
  if (in < 0 || out < 0) __builtin_trap();
  std::size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(in, data + done, size - done);
    if (n <= 0) __builtin_trap();
    done += std::size_t(n);
  }
  ::lseek(in, 0, SEEK_SET);
  serve([] { return reference_implementation(); }, in, out);
  ::close(in);
  return 0;
}
