// The error every plug-in loader throws for a spec that cannot become an implementation. Its own header, so
// the loaders (c_plugin.cpp) need not include the harness that includes them.
#pragma once

#include <stdexcept>

namespace attncheck {

/// A bad implementation spec: unknown scheme, missing/unloadable file, missing symbol, ABI mismatch. CLI exit 2.
class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace attncheck
