// attncheck-plugin-host PATH.so: loads one C ABI plug-in and serves it over the exec: protocol on
// stdin/stdout, so a plug-in that crashes or hangs takes down this worker, never the harness.
#include <unistd.h>

#include <iostream>

#include "../src/c_plugin.hpp"
#include "attncheck/harness.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: attncheck-plugin-host PATH.so (started by attncheck for plugin:PATH.so; speaks the exec "
                 "protocol on stdin/stdout)\n";
    return 2;
  }
  // The protocol keeps the original stdout; whatever the plug-in prints goes to stderr instead.
  const int protocol_out = ::dup(1);
  ::dup2(2, 1);
  const std::string path = argv[1];
  return attncheck::serve([&] { return attncheck::detail::load_c_plugin(path, "plugin:" + path); }, 0, protocol_out);
}
