// The one interface every attention implementation is checked through: the reference core, the mutant zoo,
// C plug-ins and subprocesses all become an `Implementation`, so there is one harness, not several.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/attention.hpp"

namespace attncheck {

/// One call: inputs at `dtype`, held as double but exactly representable in `dtype` (so converting to the
/// native type and back is exact).
struct Problem {
  DType dtype = DType::f32;
  Tensor<double> q{Shape{}}, k{Shape{}}, v{Shape{}};  ///< [B,H,T_q,D], [B,H,T_k,D], [B,H,T_k,D]
  std::optional<double> scale;                        ///< empty: the implementation's default, 1/√D
  CausalAlignment alignment = kDefaultAlignment;
  bool want_weights = true;  ///< the law reads the weights; ignored by implementations that cannot return them
};

/// What one call returned, widened to double (exact for every supported dtype).
struct Outcome {
  Tensor<double> output{Shape{}};         ///< [B,H,T_q,D]
  std::optional<Tensor<double>> weights;  ///< [B,H,T_q,T_k], when the implementation returns them
};

/// What an implementation accepts; the generators only produce cases inside it.
struct Capabilities {
  std::vector<DType> dtypes{DType::f32, DType::f64, DType::f16, DType::bf16};
  bool returns_weights = true;
  bool cross_lengths = true;  ///< accepts T_q != T_k
  std::vector<CausalAlignment> alignments{CausalAlignment::TopLeft, CausalAlignment::BottomRight};
  bool custom_scale = true;
  Index max_T = Index{1} << 20;
  /// Claims boolean-mask (select) semantics: NaN or Inf in a masked score, key or value never reaches an
  /// output. Most additive-mask kernels compute 0·Inf = NaN there and do not claim it.
  bool nonfinite_safe = false;

  bool supports(DType t) const;
  bool supports(CausalAlignment a) const;
};

/// The implementation under test misbehaved: an error status, a crash, a hang, output of the wrong size,
/// a broken protocol, a NaN or Inf from finite inputs. A law that meets one is falsified (with the case that
/// caused it), not an internal error.
class ImplementationError : public std::runtime_error {
 public:
  enum class Kind { error_status, crash, timeout, wrong_size, protocol, nonfinite };
  ImplementationError(Kind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

/// The name of an ImplementationError kind ("error status", "crash", ...).
std::string_view kind_name(ImplementationError::Kind k);

/// An attention implementation under test.
class Implementation {
 public:
  virtual ~Implementation() = default;
  /// The name as `--impl` takes it: "reference", "mutant:mask-zero", "plugin:./libfoo.so", "exec:...".
  virtual const std::string& name() const = 0;
  /// One line for `attncheck list`.
  virtual const std::string& description() const = 0;
  virtual const Capabilities& capabilities() const = 0;
  /// Runs attention on `p`. Throws ImplementationError when the implementation misbehaves.
  virtual Outcome forward(const Problem& p) const = 0;
};

using ImplementationPtr = std::shared_ptr<const Implementation>;
using ForwardFn = std::function<Outcome(const Problem&)>;

/// Registers any callable as an implementation (in-process C++).
ImplementationPtr make_implementation(std::string name, std::string description, Capabilities caps, ForwardFn fn);

/// Converts the problem's tensors to the native scalar of its dtype (exactly), calls
/// `f(q, k, v, problem, weights_or_null) -> Tensor<S> output` and widens the results back. `f` is generic
/// over S (a template lambda), so one body serves all four dtypes.
template <class F> Outcome run_typed(const Problem& p, F&& f) {
  return visit_dtype(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    const Tensor<S> q = p.q.template cast<S>(), k = p.k.template cast<S>(), v = p.v.template cast<S>();
    Tensor<S> w(Shape{1, 1, 1, 1});
    Outcome o;
    o.output = f(q, k, v, p, p.want_weights ? &w : nullptr).template cast<double>();
    if (p.want_weights) o.weights = w.template cast<double>();
    return o;
  });
}

/// The reference core (attncheck::attention with a BoolMask) as an implementation named "reference"; it
/// claims every capability, nonfinite_safe included.
ImplementationPtr reference_implementation();

/// Checks that an outcome has the shapes the problem implies; throws ImplementationError(wrong_size)
/// naming what was expected and what came.
void check_outcome_shape(const Problem& p, const Outcome& o, const std::string& impl_name);

}  // namespace attncheck
