// What the laws share (support.hpp).
#include "support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace attncheck::law_kit {

double scale_of(const Problem& p) { return p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D)); }

KeyRange keys_of(const Problem& p, Index b, Index i) { return p.visibility(b).keys(i); }

Index causal_last_key(const Problem& p, Index i) {
  return last_visible_key(i, p.q.shape().T, p.k.shape().T, p.alignment);
}

std::string why_hidden(const Problem& p, Index b, Index i, Index j) {
  const Visibility v = p.visibility(b);
  const std::string q = "query " + std::to_string(i);
  if (j > v.position(i)) return "in the future of " + q;
  if (v.key_length >= 0 && j >= v.key_length)
    return "padding (key_lengths[" + std::to_string(b) + "] = " + std::to_string(v.key_length) + ")";
  if (v.window) return "outside the window of " + q + " (window " + std::to_string(*v.window) + ")";
  return "hidden from " + q;
}

std::string idx(std::initializer_list<Index> v) {
  std::string s = "[";
  for (auto it = v.begin(); it != v.end(); ++it) s += (it == v.begin() ? "" : ",") + std::to_string(*it);
  return s + "]";
}

bool same_bits(double a, double b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}

Outcome call(const Implementation& impl, const Problem& p) {
  Outcome o = impl.forward(p);
  check_outcome_shape(p, o, impl.name());
  if (p.want_weights && !o.weights)
    throw ImplementationError(ImplementationError::Kind::protocol,
                              impl.name() + ": returned no weights although it declares that it returns them");
  return o;
}

std::string needs_weights(const GenConfig& g) {
  return g.caps.returns_weights ? "" : "needs the attention weights, which this implementation does not return";
}

OracleRun run_oracle(const Problem& p) {
  OracleRun r;
  AttentionOptions opts = p.options();
  opts.scale = scale_of(p);
  r.out = attention<double>(p.q, p.k, p.v, opts, &r.w);
  r.tol_out = Tensor<double>(r.out.shape());
  r.tol_w = Tensor<double>(r.w.shape());
  const Shape& s = p.q.shape();
  for (Index b = 0; b < s.B; ++b) {
    const BoolMask mask = BoolMask::of(p.visibility(b));
    for (Index h = 0; h < s.H; ++h) {
      const Index g = kv_of(p, h);
      const HeadTolerance t = head_tolerance(p.dtype, p.q.head(b, h), p.k.head(b, g), p.v.head(b, g), mask,
                                             *opts.scale, r.out.head(b, h), r.w.head(b, h), kSafety);
      r.tol_out.head(b, h) = t.output;
      r.tol_w.head(b, h) = t.weights;
    }
  }
  return r;
}

std::optional<Violation> compare(const std::string& what, const std::string& quantity, const Tensor<double>& expected,
                                 const Tensor<double>& actual, const Tensor<double>* tol, const Include& include) {
  const Shape& s = expected.shape();
  std::optional<std::array<Index, 4>> worst;
  double worst_ratio = 0, worst_diff = 0, worst_tol = 0;
  bool nonfinite = false;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < s.D; ++j) {
          if (include && !include(b, h, i, j)) continue;
          const double e = expected(b, h, i, j), a = actual(b, h, i, j);
          if (!tol) {
            if (same_bits(e, a)) continue;
            const double diff = std::isfinite(a - e) ? std::abs(a - e) : std::numeric_limits<double>::infinity();
            if (!worst || diff > worst_diff || std::isnan(a)) {
              worst = {b, h, i, j};
              worst_diff = std::isnan(a - e) ? std::numeric_limits<double>::quiet_NaN() : diff;
              if (std::isnan(a)) goto done;
            }
            continue;
          }
          if (!std::isfinite(e) && same_bits(e, a)) continue;  // the same Inf or NaN: nothing to measure
          if (!std::isfinite(e) || !std::isfinite(a)) {
            worst = {b, h, i, j};
            worst_diff = std::abs(a - e);
            worst_tol = (*tol)(b, h, i, j);
            nonfinite = true;
            goto done;
          }
          const double t = (*tol)(b, h, i, j), diff = std::abs(a - e);
          if (diff <= t) continue;
          const double ratio = t > 0 ? diff / t : std::numeric_limits<double>::infinity();
          if (!worst || ratio > worst_ratio) {
            worst = {b, h, i, j};
            worst_ratio = ratio;
            worst_diff = diff;
            worst_tol = t;
          }
        }
done:
  if (!worst) return std::nullopt;
  const auto [b, h, i, j] = *worst;
  Violation v;
  v.quantity = quantity;
  v.worst_index = {b, h, i, j};
  v.magnitude = worst_diff;
  v.tolerance = tol ? worst_tol : 0;
  v.expected = expected;
  v.actual = actual;
  if (tol) v.tolerances = *tol;
  const std::string at = quantity + idx({b, h, i, j});
  if (!tol)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but was " + num(expected(b, h, i, j)) +
                " (must be bit-identical)";
  else if (nonfinite)
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " where " + num(expected(b, h, i, j)) +
                " is expected";
  else
    v.message = what + ": " + at + " is " + num(actual(b, h, i, j)) + " but should be " +
                num(expected(b, h, i, j)) + " (off by " + num(worst_diff) + ", tolerance " + num(worst_tol) + ")";
  return v;
}

void replace_rows(Tensor<double>& t, const Tensor<double>& other, Index from) {
  const Shape& s = t.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = std::max<Index>(from, 0); i < s.T; ++i) t.head(b, h).row(i) = other.head(b, h).row(i);
}

Tensor<double> first_rows(const Tensor<double>& t, Index n) {
  const Shape& s = t.shape();
  Tensor<double> r({s.B, s.H, n, s.D});
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) r.head(b, h) = t.head(b, h).topRows(n);
  return r;
}

Tensor<double> slice(const Tensor<double>& t, Index b, Index h) {
  const Shape& s = t.shape();
  Tensor<double> r({1, 1, s.T, s.D});
  r.head(0, 0) = t.head(b, h);
  return r;
}

Problem slice_problem(const Problem& p, Index b, Index h) {
  Problem one = p;
  one.q = slice(p.q, b, h);
  one.k = slice(p.k, b, kv_of(p, h));
  one.v = slice(p.v, b, kv_of(p, h));
  if (!p.key_lengths.empty()) one.key_lengths = {p.key_lengths[std::size_t(b)]};
  if (p.d_output) one.d_output = slice(*p.d_output, b, h);
  return one;
}

Problem perturb_future(const Problem& p, Index t, const Tensor<double>& q2, const Tensor<double>& k2,
                       const Tensor<double>& v2) {
  Problem v = p;
  replace_rows(v.q, q2, t + 1);
  replace_rows(v.k, k2, causal_last_key(p, t) + 1);
  replace_rows(v.v, v2, causal_last_key(p, t) + 1);
  return v;
}

rc::Gen<double> gen_replacement_magnitude(DType dtype) {
  return rc::gen::join(
      weighted_choice<rc::Gen<double>>({{1, gen_magnitude()}, {1, rc::gen::just(max_finite(dtype) / 4)}}));
}

ProblemOptions outputs_only() {
  ProblemOptions po;
  po.want_weights = false;
  return po;
}

rc::Gen<LawCase> gen_outputs_only(const GenConfig& cfg) { return gen_problem(cfg, outputs_only()); }
rc::Gen<LawCase> gen_plain(const GenConfig& cfg) { return gen_problem(cfg); }

std::optional<Violation> check_earlier_outputs_unchanged(const char* law, const char* what_changed,
                                                          const Implementation& impl, const LawCase& c) {
  const Index t = Index(c.params.at("t"));
  const Outcome a = call(impl, c.problem), b = call(impl, *c.variant);
  auto v = compare(law, "output", a.output, b.output, nullptr, [t](Index, Index, Index i, Index) { return i <= t; });
  if (v) {
    v->message += "; only positions after " + std::to_string(t) + " were " + what_changed;
    v->weights = b.weights;
  }
  return v;
}

CausalAlignment square_alignment(const Capabilities& caps) {
  return caps.supports(kDefaultAlignment) || caps.alignments.empty() ? kDefaultAlignment : caps.alignments.front();
}

}  // namespace attncheck::law_kit
