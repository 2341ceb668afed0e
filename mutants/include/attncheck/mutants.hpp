// The mutant zoo: realistic buggy attention implementations, each with the smallest case that shows its bug,
// plus correct controls written differently. The suite must kill every mutant and pass every control.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/implementation.hpp"
#include "attncheck/law.hpp"

namespace attncheck {

/// One entry of the zoo: a realistic buggy implementation, or a correct control written differently.
struct Mutant {
  /// Named "mutant:<name>" or "control:<name>".
  ImplementationPtr impl;
  /// The mistake in one line ("mask filled with 0 instead of -inf"); for controls, what differs.
  std::string bug;
  /// A correct alternative: no law may fail on it.
  bool control = false;
  /// {B,H,T,D} of the smallest case that can show the bug (T = T_q).
  Shape minimal_shape;
  /// Why nothing smaller can show it.
  std::string why_minimal;
  /// Laws expected to falsify it.
  std::vector<std::string> killed_by;
  /// Other q shapes where shrinking may stop instead: as small (a bug only some values show may need a longer T
  /// at D = 1 than at D = 2), or a local minimum no single step leaves. The kill test lists the k side of each.
  std::vector<Shape> also_minimal{};
  /// Its bug shows only past 2^15 positions (an int16 index): the kill tests and the kill matrix check it as
  /// `--long` does, over keys of 2^15 ± 1 and 2^16 ± 1 (mutant_options), decode steps and chunks only.
  bool long_context = false;
  /// Whether `q` is minimal_shape or one of also_minimal.
  bool is_minimal(const Shape& q) const {
    return q == minimal_shape || std::find(also_minimal.begin(), also_minimal.end(), q) != also_minimal.end();
  }
};

/// The most queries a zoo kernel gets in a call over --long's keys: the zoo's kernels hold each head's [T_q,T_k]
/// weights, so a square call of 2^16 would need 32 GiB; decode steps and chunks need 64 · 2^16 · 8 bytes = 32 MiB.
inline constexpr Index kZooLongMaxQueries = 64;

/// `base` as the kill tests and the kill matrix run `m`: under --long's lengths (decode steps and chunks of up to 64
/// queries, B = 1, H <= 2, D <= 8) for a long-context mutant, unchanged otherwise.
RunOptions mutant_options(const Mutant& m, RunOptions base);

/// Every mutant and control, in a stable order.
const std::vector<Mutant>& mutant_zoo();

/// The zoo entry whose impl->name() is `name`, or nullptr.
const Mutant* find_mutant(std::string_view name);

/// The smallest shrunk counterexample among `results` (falsified ones with a case, each measured by failing_problem:
/// the derived call that computed wrongly when a law reports one), or nullptr: fewest q elements,
/// then fewest k elements, then fewest options set (window, key lengths, explicit scale,
/// softcap, ALiBi slopes, sinks, each mask family beyond causal), then fewest nonzero
/// inputs (q, k, v, dO), then the clearest (largest margin; exact laws and non-finite values count as infinite),
/// then the first. The kill matrix shows it, and the kill test checks it is the mutant's minimal case.
const LawResult* smallest_counterexample(const std::vector<LawResult>& results);

}  // namespace attncheck
