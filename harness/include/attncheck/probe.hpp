// Black-box probing: recover the weights of an implementation that returns only outputs (one-hot V), and
// find out which scale and causal alignment it really uses.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attncheck/implementation.hpp"

namespace attncheck {

// recover_weights and with_recovered_weights (the weights of an implementation that returns none, by one-hot
// probing) live beside the Implementation interface, attncheck/implementation.hpp, where the zoo uses them too.

/// What probing found out about an implementation's conventions.
struct Conventions {
  DType dtype = DType::f64;                             ///< the dtype probed at
  std::vector<std::pair<Index, double>> default_scale;  ///< (D, scale used when none is given)
  std::string scale_rule;                               ///< "1/√D", "1/D", "1", or "" when none of these fits
  std::optional<double> custom_scale_used;              ///< the scale used when asked for kProbeCustomScale
  std::string causal;                                   ///< "causal", or which future key a query sees
  std::vector<std::pair<CausalAlignment, std::string>> alignment;  ///< asked for -> what it does
  std::string summary;  ///< one line: "top-left alignment, scale 1/√D (0.125 at D=64)"
};

/// The custom scale probing asks for, to see whether an implementation honours it.
inline constexpr double kProbeCustomScale = 0.375;

/// Calls `impl` on a few tiny problems to infer its scale, its causal mask and its alignment for
/// T_q != T_k. Never throws for a misbehaving implementation: the summary says what failed.
Conventions probe_conventions(const Implementation& impl);

}  // namespace attncheck
