// Gradient law grad-finite-difference (float64 only): the backward's directional derivatives agree with
// central differences of the same implementation's forward.
#include "registry.hpp"
#include "support.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "attncheck/cancel.hpp"

namespace attncheck::law_kit {
namespace {
namespace grad_finite_difference_law {

const char* kWhy =
    "The backward must be the derivative of the forward it ships with: for L(x) = sum(dO o O(x)) and a random "
    "direction d of q, of k, of v, (with sinks) of the sink logits and (with dBias) of the bias in turn, <grad, d> "
    "must "
    "equal the central difference "
    "D(h) = (L(x + h d) - L(x - h d)) / 2h of the implementation's own forward. Step: d is scaled like the "
    "inputs, and h = u^(1/3) / max(1, sigma), sigma the largest rate at which a score moves along d, so no score "
    "moves by more than u^(1/3) (about 6e-6): the balance of truncation (~h^2) and rounding (~u/h). Tolerance: "
    "D(h) = L' + c h^2 + O(h^4), so D(h/2) is off by |D(h) - D(h/2)|/3 (Richardson's estimate); rounding in L "
    "(the forward's derived float64 bound on each output times |dO|, eps_L) adds 2 eps_L / h to D(h/2); the "
    "gradient side adds sum |d| times the grad-oracle bound and the dot product's own rounding. The first two "
    "are doubled. Float64 only: in float32 the rounding term eps_L / h would be larger than the gradient.";

rc::Gen<LawCase> gen(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_gradients(cfg);
    c.params["direction_seed"] = double(*rc::gen::inRange<int>(0, 1 << 30));
    return c;
  });
}

// A direction like x: entries uniform in [-1, 1] times x's largest magnitude (1 when x is all 0).
Tensor<double> direction(const Tensor<double>& x, std::uint64_t seed) {
  rc::Random r(seed);
  Tensor<double> d(x.shape());
  const double m = x.values().cwiseAbs().maxCoeff();
  for (double& e : d.values()) e = (double(r.next() % 2049) / 1024.0 - 1.0) * (m > 0 ? m : 1.0);
  return d;
}

// Σ dO ∘ O for the implementation's forward on p, over the rows that see a key: a row that sees none is a
// constant (0, or NaN under the nan convention, where its dO is 0) whatever the inputs.
double loss(const Implementation& impl, const Problem& p) {
  Problem plain = p;
  plain.want_weights = false;
  Tensor<double> out = call(impl, plain).output;
  const Shape& s = out.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        if (sees_none(p, b, h, i)) out.head(b, h).row(i).setZero();
  return out.values().dot(p.d_output->values());
}

// score_rate for a long context: the same maximum, query rows 256 at a time against keys 1024 at a time, so no
// [T_q,T_k] matrix is held (the key chunks a row's run does not reach are skipped).
double score_rate_streamed(const Problem& p, const Tensor<double>& dq, const Tensor<double>& dk) {
  constexpr Index kRows = 256, kKeys = 1024;
  const Shape& s = p.q.shape();
  const Index T_k = p.k.shape().T;
  double rate = 0;
  Matrix<double> r;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Index kv = kv_of(p, h);
      const Visibility vis = p.visibility(b, h);
      const auto q = p.q.head(b, h), k = p.k.head(b, kv), dqh = dq.head(b, h), dkh = dk.head(b, kv);
      for (Index i0 = 0; i0 < s.T; i0 += kRows) {
        throw_if_cancelled("grad-finite-difference");  // seconds per head at long T: an interrupt must not wait
        const Index n = std::min(kRows, s.T - i0);
        Index lo = T_k, hi = 0;  // the keys the rows' runs span
        for (Index i = i0; i < i0 + n; ++i)
          if (const KeyRange run = vis.run(i); !run.empty()) {
            lo = std::min(lo, run.begin);
            hi = std::max(hi, run.end);
          }
        for (Index j0 = lo / kKeys * kKeys; j0 < hi; j0 += kKeys) {
          const Index w = std::min(kKeys, T_k - j0);
          r.noalias() = dqh.middleRows(i0, n) * k.middleRows(j0, w).transpose();
          r.noalias() += q.middleRows(i0, n) * dkh.middleRows(j0, w).transpose();
          r *= scale_of(p);
          for (Index i = i0; i < i0 + n; ++i)
            vis.for_each_run(i, j0, j0 + w, [&](Index a, Index e) {
              rate = std::max(rate, r.row(i - i0).segment(a - j0, e - a).cwiseAbs().maxCoeff());
            });
        }
      }
    }
  return rate;
}

// The largest |d s_ij / dt| along the direction (visible pairs only).
double score_rate(const Problem& p, const Tensor<double>& dq, const Tensor<double>& dk) {
  if (long_context(p)) return score_rate_streamed(p, dq, dk);
  const Shape& s = p.q.shape();
  double rate = 0;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Index kv = kv_of(p, h);
      const Matrix<double> r = (Matrix<double>(dq.head(b, h)) * Matrix<double>(p.k.head(b, kv)).transpose() +
                                Matrix<double>(p.q.head(b, h)) * Matrix<double>(dk.head(b, kv)).transpose()) *
                               scale_of(p);
      for (Index i = 0; i < s.T; ++i) {
        const Visibility vis = p.visibility(b, h);
        vis.for_each_run(i, 0, p.k.shape().T, [&](Index a, Index e) {
          for (Index j = a; j < e; ++j) rate = std::max(rate, std::abs(r(i, j)));
        });
      }
    }
  return rate;
}

// The backward's derivative `analytic` of gradient `grad` ("dq", ..., "d_sinks") along `along` is not the central
// difference `central` (step `step`) within `tol`.
Violation directional_violation(const std::string& grad, const std::string& along, double analytic, double central,
                                double tol, double step) {
  const double diff = std::abs(analytic - central);
  Violation v;
  v.quantity = grad + "-directional";
  v.worst_index = {0, 0, 0, 0};
  v.magnitude = diff;
  v.tolerance = tol;
  v.expected = Tensor<double>({1, 1, 1, 1});
  v.expected->values()[0] = central;
  v.actual = Tensor<double>({1, 1, 1, 1});
  v.actual->values()[0] = analytic;
  v.message = "grad-finite-difference: along " + along + ", the " + grad + " of the backward give" +
              (grad == "d_sinks" || grad == "d_bias" ? "" : "s") + " a derivative of " + num(analytic) +
              " but central differences of its forward give " + num(central) + " (off by " + num(diff) +
              ", tolerance " + num(tol) + "; step " + num(step) + ")";
  return v;
}

// A gradient that is a vector of parameters (the sink logits, the bias's values) along direction `dir`: each moves
// a score at |dir_k| per unit step, so h = u^(1/3) / max(1, max|dir|); `along(x, step)` moves problem x by step·dir.
template <class Along>
std::optional<Violation> along_direction(const Implementation& impl, const Problem& p, const char* name,
                                         const char* what, const std::vector<double>& grad,
                                         const std::vector<double>& dir, const std::vector<double>& grad_tolerance,
                                         double eps_L, Along&& along) {
  const double u = unit_roundoff(DType::f64);
  double rate = 0, analytic = 0, grad_tol = 0, abs_sum = 0;
  for (std::size_t k = 0; k < dir.size(); ++k) {
    rate = std::max(rate, std::abs(dir[k]));
    analytic += grad[k] * dir[k];
    grad_tol += grad_tolerance[k] * std::abs(dir[k]);
    abs_sum += std::abs(grad[k] * dir[k]);
  }
  if (rate == 0) return std::nullopt;
  const double h = std::cbrt(u) / std::max(1.0, rate);
  const auto central = [&](double step) {
    Problem up = p, down = p;
    along(up, step);
    along(down, -step);
    return (loss(impl, up) - loss(impl, down)) / (2 * step);
  };
  const double D_h = central(h), D_half = central(h / 2);
  const double tol =
      kSafety * (std::abs(D_h - D_half) / 3 + 2 * eps_L / h) + grad_tol + gamma(Index(dir.size()), u) * abs_sum;
  if (std::isfinite(analytic) && std::abs(analytic - D_half) <= tol) return std::nullopt;
  return directional_violation(name, what, analytic, D_half, tol, h / 2);
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  const Gradients g = accept_nan_empty_rows(impl, p, call_backward(impl, p));
  const GradientCheck oracle = run_gradient_oracle(p);
  // eps_L: the forward's derived float64 bound per output, weighted by |dO|, plus the n-term dot product.
  const OracleRun fwd = run_oracle(p);
  const double u = unit_roundoff(DType::f64);
  const Eigen::VectorXd abs_dO = p.d_output->values().cwiseAbs();
  const double eps_L = fwd.tol_out.values().dot(abs_dO) +
                       gamma(p.q.size(), u) * fwd.out.values().cwiseAbs().dot(abs_dO);
  const std::uint64_t seed = std::uint64_t(int_param(c, "grad-finite-difference", "direction_seed", 0, kMaxSeed));
  const struct {
    const char* name;
    Tensor<double> Problem::*x;
    const Tensor<double> Gradients::*grad;
  } parts[] = {{"dq", &Problem::q, &Gradients::dq}, {"dk", &Problem::k, &Gradients::dk}, {"dv", &Problem::v, &Gradients::dv}};
  for (std::size_t n = 0; n < 3; ++n) {
    const auto& part = parts[n];
    const Tensor<double> d = direction(p.*part.x, seed + n);
    Tensor<double> dq(p.q.shape()), dk(p.k.shape());
    if (part.x == &Problem::q) dq = d;
    if (part.x == &Problem::k) dk = d;
    const double h = std::cbrt(u) / std::max(1.0, score_rate(p, dq, dk));
    const auto central = [&](double step) {
      Problem up = p, down = p;
      (up.*part.x).values() += step * d.values();
      (down.*part.x).values() -= step * d.values();
      return (loss(impl, up) - loss(impl, down)) / (2 * step);
    };
    const double D_h = central(h), D_half = central(h / 2);
    const double analytic = (g.*part.grad).values().dot(d.values());
    const Eigen::VectorXd abs_d = d.values().cwiseAbs();
    const double tol = kSafety * (std::abs(D_h - D_half) / 3 + 2 * eps_L / h) +
                       (oracle.tolerance.*part.grad).values().dot(abs_d) +
                       gamma(d.size(), u) * (g.*part.grad).values().cwiseAbs().dot(abs_d);
    const double diff = std::abs(analytic - D_half);
    if (std::isfinite(analytic) && diff <= tol) continue;
    return directional_violation(part.name, std::string("a random direction of ") + (part.name + 1), analytic,
                                 D_half, tol, h / 2);
  }
  // The sinks' gradient, along a random direction of the finite sink logits (a sink of -inf stays where it is).
  if (!p.sinks.empty() && g.dsinks.size() == p.sinks.size()) {
    rc::Random r(seed + 3);
    std::vector<double> ds(p.sinks.size(), 0.0);
    for (std::size_t h = 0; h < ds.size(); ++h)
      if (std::isfinite(p.sinks[h])) ds[h] = double(r.next() % 2049) / 1024.0 - 1.0;
    const auto along = [&](Problem& x, double step) {
      for (std::size_t k = 0; k < ds.size(); ++k) x.sinks[k] += step * ds[k];
    };
    if (auto v = along_direction(impl, p, "d_sinks", "a random direction of the sink logits", g.dsinks, ds,
                                 oracle.tolerance.dsinks, eps_L, along))
      return v;
  }
  // dBias, along a random direction of the bias in its own shape (a cell a bias of -inf hides stays hidden).
  if (p.bias && g.dbias && oracle.tolerance.dbias) {
    const ScoreBias& b = *p.bias;
    Tensor<double> at(g.dbias->shape());
    for (Index n = 0; n < at.size(); ++n)
      at.values()[n] = std::isfinite(b.values[std::size_t(n)]) ? b.values[std::size_t(n)] : 0;
    Tensor<double> d = direction(at, seed + 4);
    for (Index n = 0; n < d.size(); ++n)
      if (!std::isfinite(b.values[std::size_t(n)])) d.values()[n] = 0;
    const std::vector<double> grad(g.dbias->values().begin(), g.dbias->values().end()),
        dir(d.values().begin(), d.values().end()),
        tol(oracle.tolerance.dbias->values().begin(), oracle.tolerance.dbias->values().end());
    const auto along = [&](Problem& x, double step) {
      for (std::size_t k = 0; k < dir.size(); ++k) x.bias->values[k] += step * dir[k];
    };
    if (auto v = along_direction(impl, p, "d_bias", "a random direction of the bias", grad, dir, tol, eps_L, along))
      return v;
  }
  return std::nullopt;
}

std::string applies(const GenConfig& g) {
  if (auto why = needs_backward(g); !why.empty()) return why;
  return g.dtype == DType::f64 ? ""
                               : "float64 only: at " + std::string(dtype_name(g.dtype)) +
                                     " the rounding error of a central difference exceeds the gradient it estimates";
}

}  // namespace grad_finite_difference_law
}  // namespace

Law grad_finite_difference() {
  using namespace grad_finite_difference_law;
  return {"grad-finite-difference",
          "float64: the backward agrees with central differences of the same forward (derived step and bound)",
          kWhy,
          LawDoc{"38",
                 "float64: ⟨grad, d⟩ equals central differences of the same forward along random directions of q, k, "
                 "v, the sinks and the bias",
                 "step h = u^⅓ / max(1, σ); Richardson |D(h)−D(h/2)|/3 + 2ε_L/h (doubled) + gradient-side bound"},
          applies,
          gen,
          check,
          0,
          true};
}

}  // namespace attncheck::law_kit
