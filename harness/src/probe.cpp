// Black-box probing of an implementation through its outputs only: scale from the odds of a two-key softmax, mask
// and alignment from which keys get a non-zero weight (each read from weights recovered by one-hot values).
#include "attncheck/probe.hpp"

#include <cmath>

#include "attncheck/format.hpp"

namespace attncheck {
namespace {

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
