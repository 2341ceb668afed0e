// Error types of the attention core. Every message names the function, what it expected and what came,
// so a caller can fix the call without reading the source.
#pragma once

#include <stdexcept>
#include <string>

namespace attncheck {

/// A tensor, matrix or mask has the wrong extents for the call it was passed to.
class ShapeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A scalar argument (such as the softmax scale) is outside the values the call accepts.
class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace attncheck
