// `attncheck demo`: the source card's T=3, d=2 walk-through with its shape table and three invariants.
#pragma once

#include <ostream>

namespace attncheck::cli {

/// Prints the walk-through to `out`; returns 0 when all three invariants hold, 1 otherwise.
int run_demo(std::ostream& out);

}  // namespace attncheck::cli
