// What the laws share: calling an implementation, the float64 oracle with its derived tolerance, the
// element-wise comparison that turns a difference into a Violation, and the problem surgery relational laws
// do (perturbing the future, taking a prefix, slicing one head). Each law lives in its own file beside this.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "attncheck/format.hpp"
#include "attncheck/generators.hpp"
#include "attncheck/law.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck::law_kit {

/// Multiplies first-order bounds (see attention/src/tolerance.cpp).
inline constexpr double kSafety = 2.0;

/// The scale the problem asks for (1/√D unless overridden).
double scale_of(const Problem& p);
/// The keys query i of batch entry b sees (causal alignment, key padding, window): one run [begin, end).
KeyRange keys_of(const Problem& p, Index b, Index i);
inline bool visible(const Problem& p, Index b, Index i, Index j) { return keys_of(p, b, i).contains(j); }
/// The last key query i may see under the causal rule alone (padding and windows only hide more keys), so
/// keys after it are in i's future whatever else holds.
Index causal_last_key(const Problem& p, Index i);
/// Why key j is hidden from query i of batch entry b: "in the future of query i", "padding (...)", or
/// "outside query i's window (...)".
std::string why_hidden(const Problem& p, Index b, Index i, Index j);
/// The kv head query head h reads.
inline Index kv_of(const Problem& p, Index h) { return kv_head(h, p.q.shape().H, p.kv_heads()); }

/// "[1,2,3]".
std::string idx(std::initializer_list<Index> v);
/// A number as messages print it (9 significant digits).
inline std::string num(double x) { return format_number(x, 9); }
/// Bitwise equality of two values widened from the same dtype; any NaN equals any NaN.
bool same_bits(double a, double b);

/// Calls the implementation and insists on weights when the law needs them and the implementation says it
/// returns them.
Outcome call(const Implementation& impl, const Problem& p);

/// not_applicable for laws that read the weights.
std::string needs_weights(const GenConfig& g);
/// not_applicable for laws that always apply.
inline std::string always_applies(const GenConfig&) { return ""; }

/// The float64 oracle on the problem's (already rounded) inputs, with the derived tolerance per element.
struct OracleRun {
  Tensor<double> out{Shape{}}, w{Shape{}}, tol_out{Shape{}}, tol_w{Shape{}};
};
OracleRun run_oracle(const Problem& p);

/// Which entries a comparison looks at: include(b, h, i, j).
using Include = std::function<bool(Index, Index, Index, Index)>;

/// Compares actual with expected element by element: first any non-finite value where the expected one is
/// finite (NaN and Inf come before error metrics), then the largest |actual - expected| / tol. `tol` null
/// means exact (bitwise). Only entries for which include(b,h,i,j) holds are compared. The violation carries
/// expected, actual and (with a tolerance) the tolerances in full.
std::optional<Violation> compare(const std::string& what, const std::string& quantity, const Tensor<double>& expected,
                                 const Tensor<double>& actual, const Tensor<double>* tol, const Include& include);

/// Rows [from, T) of every head of t replaced by the same rows of `other`.
void replace_rows(Tensor<double>& t, const Tensor<double>& other, Index from);
/// Rows [0, n) of every head.
Tensor<double> first_rows(const Tensor<double>& t, Index n);
/// Head (b, h) alone, as a [1,1,T,D] tensor.
Tensor<double> slice(const Tensor<double>& t, Index b, Index h);
/// Query head h of batch entry b alone, with its kv head and its key length: a one-head problem.
Problem slice_problem(const Problem& p, Index b, Index h);

/// A copy of p whose queries after t, and keys and values after the last key query t can see, come from
/// q2, k2, v2: "the future of t".
Problem perturb_future(const Problem& p, Index t, const Tensor<double>& q2, const Tensor<double>& k2,
                       const Tensor<double>& v2);
/// A replacement magnitude: ordinary, or a quarter of the dtype's largest finite value.
rc::Gen<double> gen_replacement_magnitude(DType dtype);

/// Problem options for the laws that read only outputs.
ProblemOptions outputs_only();
rc::Gen<LawCase> gen_outputs_only(const GenConfig& cfg);
rc::Gen<LawCase> gen_plain(const GenConfig& cfg);

/// The shared body of causal-perturbation and strict-causality-nonfinite: the variant changed only the
/// future of position t ("params.t"), so every output at positions <= t must be bit-identical.
std::optional<Violation> check_earlier_outputs_unchanged(const char* law, const char* what_changed,
                                                          const Implementation& impl, const LawCase& c);

/// With T_q == T_k both alignments give the same mask: the one to ask in that the implementation accepts.
CausalAlignment square_alignment(const Capabilities& caps);

}  // namespace attncheck::law_kit
