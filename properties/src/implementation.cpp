// In-process implementations: the callable wrapper, the reference core, and the outcome shape check.
#include "attncheck/implementation.hpp"

#include <algorithm>

namespace attncheck {

bool Capabilities::supports(DType t) const { return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end(); }
bool Capabilities::supports(CausalAlignment a) const {
  return std::find(alignments.begin(), alignments.end(), a) != alignments.end();
}

std::string_view kind_name(ImplementationError::Kind k) {
  switch (k) {
    case ImplementationError::Kind::error_status: return "error status";
    case ImplementationError::Kind::crash: return "crash";
    case ImplementationError::Kind::timeout: return "timeout";
    case ImplementationError::Kind::wrong_size: return "wrong size";
    case ImplementationError::Kind::protocol: return "protocol error";
    case ImplementationError::Kind::nonfinite: return "non-finite output";
  }
  return "error";
}

namespace {

class CallableImplementation final : public Implementation {
 public:
  CallableImplementation(std::string name, std::string description, Capabilities caps, ForwardFn fn)
      : name_(std::move(name)), description_(std::move(description)), caps_(std::move(caps)), fn_(std::move(fn)) {}
  const std::string& name() const override { return name_; }
  const std::string& description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }
  Outcome forward(const Problem& p) const override {
    Outcome o = fn_(p);
    check_outcome_shape(p, o, name_);
    return o;
  }

 private:
  std::string name_, description_;
  Capabilities caps_;
  ForwardFn fn_;
};

}  // namespace

ImplementationPtr make_implementation(std::string name, std::string description, Capabilities caps, ForwardFn fn) {
  return std::make_shared<CallableImplementation>(std::move(name), std::move(description), std::move(caps),
                                                  std::move(fn));
}

void check_outcome_shape(const Problem& p, const Outcome& o, const std::string& impl_name) {
  const Shape& q = p.q.shape();
  const Shape want_out = q;
  if (o.output.shape() != want_out)
    throw ImplementationError(ImplementationError::Kind::wrong_size,
                              impl_name + ": output is " + to_string(o.output.shape()) + " but q is " + to_string(q) +
                                  " (the output must have q's shape)");
  const Shape want_w{q.B, q.H, q.T, p.k.shape().T};
  if (o.weights && o.weights->shape() != want_w)
    throw ImplementationError(ImplementationError::Kind::wrong_size,
                              impl_name + ": weights are " + to_string(o.weights->shape()) + " but must be " +
                                  to_string(want_w) + " ([B,H,T_q,T_k])");
}

ImplementationPtr reference_implementation() {
  Capabilities caps;
  caps.nonfinite_safe = true;
  static const ImplementationPtr ref = make_implementation(
      "reference", "attncheck's Eigen core: boolean causal mask, stable softmax, float accumulation", caps,
      [](const Problem& p) {
        return run_typed(p, [](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          return attention(q, k, v, AttentionOptions{.scale = pr.scale, .alignment = pr.alignment}, w);
        });
      });
  return ref;
}

}  // namespace attncheck
