// Black-box probing of an implementation through its outputs only: weights by one-hot values, scale from
// the odds of a two-key softmax, mask and alignment from which keys get a non-zero weight.
#include "attncheck/probe.hpp"

#include <cmath>

#include "attncheck/format.hpp"

namespace attncheck {
namespace {

class RecoveredWeights final : public Implementation {
 public:
  explicit RecoveredWeights(ImplementationPtr inner) : inner_(std::move(inner)), caps_(inner_->capabilities()) {
    caps_.returns_weights = true;
    caps_.weights_probed = true;
    description_ = inner_->description() + " (weights recovered by one-hot probing)";
  }
  const std::string& name() const override { return inner_->name(); }
  const std::string& description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string unavailable() const override { return inner_->unavailable(); }
  Outcome forward(const Problem& p) const override {
    Problem plain = p;
    plain.want_weights = false;
    Outcome o = inner_->forward(plain);
    if (p.want_weights) {
      o.weights = recover_weights(*inner_, p);
      o.calls += int((p.k.shape().T + p.v_dim() - 1) / p.v_dim());  // recover_weights: one per D_v keys
    }
    return o;
  }
  // The gradient laws call the backward through this wrapper.
  Gradients backward(const Problem& p) const override {
    Gradients g = inner_->backward(p);
    check_gradients_shape(p, g, name());
    return g;
  }

 private:
  ImplementationPtr inner_;
  Capabilities caps_;
  std::string description_;
};

std::string fmt(double x) { return format_number(x, 6); }

std::string alignment_name(CausalAlignment a) { return a == CausalAlignment::TopLeft ? "top-left" : "bottom-right"; }

Problem tiny(DType dtype, Index T_q, Index T_k, Index D) {
  Problem p;
  p.dtype = dtype;
  p.q = Tensor<double>(Shape{1, 1, T_q, D});
  p.k = Tensor<double>(Shape{1, 1, T_k, D});
  p.v = Tensor<double>(Shape{1, 1, T_k, D});
  p.want_weights = true;
  return p;
}

// The weights of a 2-query, 2-key problem whose query 1 scores 0 against key 0 and `a`·scale against key
// 1: their odds are exp(a·scale), so scale = ln(w[1,1]/w[1,0]) / a.
double measure_scale(const Implementation& impl, DType dtype, Index D, std::optional<double> scale) {
  Problem p = tiny(dtype, 2, 2, D);
  // a = a power of two near 2√D: at scale 1/√D the odds are about e², well inside every dtype's precision.
  const double a = std::exp2(std::round(std::log2(2 * std::sqrt(double(D)))));
  p.q(0, 0, 1, 0) = a;
  p.k(0, 0, 1, 0) = 1;
  p.scale = scale;
  const Tensor<double> w = recover_weights(impl, p);
  return std::log(w(0, 0, 1, 1) / w(0, 0, 1, 0)) / a;
}

// Which keys each query of an all-zero-score problem sees (all scores tie, so exactly the visible keys
// get a non-zero weight), as "0:{0} 1:{0,1}".
std::vector<std::vector<Index>> visible_keys(const Implementation& impl, DType dtype, Index T_q, Index T_k,
                                             CausalAlignment a) {
  Problem p = tiny(dtype, T_q, T_k, 4);
  p.alignment = a;
  const Tensor<double> w = recover_weights(impl, p);
  std::vector<std::vector<Index>> seen(static_cast<std::size_t>(T_q));
  for (Index i = 0; i < T_q; ++i)
    for (Index j = 0; j < T_k; ++j)
      if (w(0, 0, i, j) != 0) seen[std::size_t(i)].push_back(j);
  return seen;
}

std::vector<std::vector<Index>> expected_keys(Index T_q, Index T_k, CausalAlignment a) {
  std::vector<std::vector<Index>> seen(static_cast<std::size_t>(T_q));
  const Index shift = a == CausalAlignment::BottomRight ? T_k - T_q : 0;
  for (Index i = 0; i < T_q; ++i)
    for (Index j = 0; j < T_k && j <= i + shift; ++j) seen[std::size_t(i)].push_back(j);
  return seen;
}

std::string keys_string(const std::vector<std::vector<Index>>& seen) {
  std::string s;
  for (std::size_t i = 0; i < seen.size(); ++i) {
    s += (i ? " " : "") + std::to_string(i) + ":{";
    for (std::size_t j = 0; j < seen[i].size(); ++j) s += (j ? "," : "") + std::to_string(seen[i][j]);
    s += "}";
  }
  return s;
}

}  // namespace

Tensor<double> recover_weights(const Implementation& impl, const Problem& p) {
  const Shape qs = p.q.shape(), ks = p.v.shape();  // V's shape: [B,H_kv,T_k,D_v]
  Tensor<double> w(Shape{qs.B, qs.H, qs.T, ks.T});
  Problem probe = p;
  probe.want_weights = false;
  // One call per block of D_v keys: V = [0; I_D_v; 0] over keys [start, start+D_v) puts weight (i, start+c) in
  // output column c.
  for (Index start = 0; start < ks.T; start += ks.D) {
    probe.v = Tensor<double>(ks);
    const Index width = std::min(ks.D, ks.T - start);
    for (Index b = 0; b < ks.B; ++b)
      for (Index h = 0; h < ks.H; ++h)
        for (Index c = 0; c < width; ++c) probe.v(b, h, start + c, c) = 1;
    const Outcome o = impl.forward(probe);
    for (Index b = 0; b < qs.B; ++b)
      for (Index h = 0; h < qs.H; ++h)
        for (Index i = 0; i < qs.T; ++i)
          for (Index c = 0; c < width; ++c) w(b, h, i, start + c) = o.output(b, h, i, c);
  }
  return w;
}

ImplementationPtr with_recovered_weights(ImplementationPtr impl) {
  return std::make_shared<RecoveredWeights>(std::move(impl));
}

Conventions probe_conventions(const Implementation& impl) {
  Conventions c;
  const Capabilities& caps = impl.capabilities();
  // The most precise dtype it accepts, so the inferred scale has the most digits.
  for (const DType t : {DType::bf16, DType::f16, DType::f32, DType::f64})
    if (caps.supports(t)) c.dtype = t;
  try {
    // Scale at two head sizes, so a rule (1/√D, 1/D, 1) can be told apart.
    for (const Index D : {Index{4}, Index{64}}) c.default_scale.emplace_back(D, measure_scale(impl, c.dtype, D, {}));
    // Relative agreement to accept a rule: the recovered weights carry the dtype's rounding, about u relative,
    // and the odds of two weights near e² amplify it only by a small factor; 16u leaves room and still
    // separates the candidate rules, which differ by factors of 2 or more at these D.
    const double tol = 16 * unit_roundoff(c.dtype);
    const auto fits = [&](auto rule) {
      for (const auto& [D, s] : c.default_scale)
        if (!(std::abs(s - rule(double(D))) <= tol * rule(double(D)))) return false;
      return true;
    };
    if (fits([](double D) { return 1 / std::sqrt(D); }))
      c.scale_rule = "1/√D";
    else if (fits([](double D) { return 1 / D; }))
      c.scale_rule = "1/D";
    else if (fits([](double) { return 1.0; }))
      c.scale_rule = "1";
    if (caps.custom_scale) c.custom_scale_used = measure_scale(impl, c.dtype, 4, kProbeCustomScale);

    const auto square =
        visible_keys(impl, c.dtype, 4, 4, caps.alignments.empty() ? kDefaultAlignment : caps.alignments.front());
    c.causal = square == expected_keys(4, 4, CausalAlignment::TopLeft)
                   ? "causal"
                   : "not causal: at T=4 the queries see keys " + keys_string(square);
    if (caps.cross_lengths)
      for (const CausalAlignment a : caps.alignments) {
        const auto seen = visible_keys(impl, c.dtype, 2, 4, a);
        std::string what = seen == expected_keys(2, 4, CausalAlignment::TopLeft) ? "top-left"
                           : seen == expected_keys(2, 4, CausalAlignment::BottomRight)
                               ? "bottom-right"
                               : "neither: T_q=2, T_k=4 sees " + keys_string(seen);
        c.alignment.emplace_back(a, what);
      }
  } catch (const std::exception& e) {
    c.summary = impl.name() + ": probing failed: " + e.what();
    return c;
  }

  std::string s = impl.name() + " (probed at " + std::string(dtype_name(c.dtype)) + "): " + c.causal;
  if (!caps.cross_lengths) {
    s += ", T_q = T_k only";
  } else {
    for (const auto& [asked, got] : c.alignment)
      s += c.alignment.size() == 1 && got == alignment_name(asked) ? ", " + got + " alignment"
                                                                   : ", asked " + alignment_name(asked) + ": " + got;
  }
  s += ", scale ";
  if (!c.scale_rule.empty()) s += c.scale_rule + " (";
  for (std::size_t i = 0; i < c.default_scale.size(); ++i)
    s += (i ? ", " : "") + fmt(c.default_scale[i].second) + " at D=" + std::to_string(c.default_scale[i].first);
  if (!c.scale_rule.empty())
    s += ")";
  else
    s += ", not 1/√D";
  if (c.custom_scale_used)
    s += std::abs(*c.custom_scale_used - kProbeCustomScale) <= 16 * unit_roundoff(c.dtype) * kProbeCustomScale
             ? "; honours a custom scale"
             : "; asked for scale " + fmt(kProbeCustomScale) + " it used " + fmt(*c.custom_scale_used);
  c.summary = s;
  return c;
}

}  // namespace attncheck
