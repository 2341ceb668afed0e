// The additive bias's laws: bias-row-shift (adding one constant to every bias of a query row changes no weight
// and moves the row's log-sum-exp by exactly that constant) and bias-minus-inf (a bias of -inf is a mask).
#include <algorithm>
#include <cmath>
#include <limits>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace bias_law {

// A bias per (query, key) cell of a T_q x T_k call is held only up to 2^18 cells (the generators' limit for
// dense masks and biases, 2 MiB): a long context's would be gigabytes. So the laws draw T_q, T_k <= 512.
constexpr double kMaxCells = double(1 << 18);
constexpr Index kMaxT = 512;

std::string needs_bias(const GenConfig& g) {
  if (!g.caps.declares(Feature::bias))
    return "needs an additive bias (ATTNCHECK_CAP4_BIAS), which this implementation does not declare";
  if (g.shape && double((*g.shape)[2]) * double((*g.shape)[3]) > kMaxCells)
    return "a bias per cell of T_q x T_k = " + std::to_string((*g.shape)[2]) + " x " + std::to_string((*g.shape)[3]) +
           " is past the 2^18 cells a case holds";
  if (!g.long_lengths.empty()) return "a bias per cell of a --long context is past the 2^18 cells a case holds";
  if (g.min_T > kMaxT)
    return "draws T <= 512 (a bias per cell, 2^18 cells), but the run asks for T >= " + std::to_string(g.min_T);
  return "";
}

// cfg with T capped at 512 (min_T is at most that where the laws apply).
GenConfig capped(GenConfig cfg) {
  cfg.max_T = std::min(cfg.max_T, kMaxT);
  cfg.max_T_tail = std::min(cfg.max_T_tail, kMaxT);
  return cfg;
}

// ---- bias-row-shift -------------------------------------------------------------------------------------------

const char* kShiftWhy =
    "Softmax does not see a constant added to every score of a row: with c_i added to each bias b_ij of query row "
    "i, every weight and output stays as it was and the row's log-sum-exp moves by exactly c_i. The law adds c_i = "
    "+C on even rows and -C on odd ones to the case's bias (to a bias of 0 where the case has none), C the largest "
    "power of two up to 2^10 that keeps every b_ij + c_i exact in the dtype (2^10 without a bias, or in float32 and "
    "float64: e^(2^10) overflows every float type and e^(-2^10) is 0 in every one; with a drawn bias, 2^8 in "
    "float16 and 2^5 in bfloat16), and compares "
    "the outputs with the case's own call's within both calls' derived bounds plus what their float64 oracles "
    "differ by (nothing, in exact arithmetic); with the LSE, lse_i + c_i within both calls' LSE bounds (lse-oracle's) "
    "plus their oracles' difference. Sinks are not drawn (a sink is a logit the row's constant does not move). A "
    "kernel that takes the row max before adding the bias (or starts its running max at 0) overflows to Inf or "
    "underflows to 0/0 there; one that adds the bias to its LSE twice, or not at all, moves the LSE wrongly.";

// C for p: the largest power of two up to 2^10 with every b + C and b - C exact in p's dtype (2^10 without a bias).
double shift_for(const Problem& p) {
  double C = 1024;
  if (!p.bias) return C;
  const auto exact = [&](double c) {
    for (double b : p.bias->values)
      if (round_to(p.dtype, b + c) != b + c || round_to(p.dtype, b - c) != b - c) return false;
    return true;
  };
  while (C > 1 && !exact(C)) C /= 2;
  return C;
}

// Row i's constant: +C on even rows, -C on odd ones (so that both overflow and underflow show).
double row_shift(double C, Index i) { return i % 2 == 0 ? C : -C; }

// p with c_i added to every bias of row i (a bias of 0 first where p has none), its extents kept.
Problem shifted(const Problem& p, double C) {
  Problem s = p;
  const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
  ScoreBias b = p.bias ? *p.bias : ScoreBias{.B = 1, .H = 1, .T_q = T_q, .T_k = T_k, .values = {}};
  if (!p.bias) b.values.assign(std::size_t(T_q * T_k), 0.0);
  for (std::size_t n = 0; n < b.values.size(); ++n) b.values[n] += row_shift(C, Index(n / std::size_t(T_k)) % T_q);
  s.bias = std::move(b);
  return s;
}

rc::Gen<LawCase> gen_shift(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.allow.remove(Feature::sinks);
  po.want_lse = cfg.caps.declares(Feature::lse);
  return gen_problem(capped(cfg), po);
}

std::optional<Violation> check_shift(const Implementation& impl, const LawCase& c) {
  const char* law = "bias-row-shift";
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (!p.sinks.empty()) return std::nullopt;  // a stored case with sinks: the law draws none
  const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
  if (double(T_q) * double(T_k) > kMaxCells)
    throw std::invalid_argument(std::string(law) + ": a case of T_q x T_k = " + std::to_string(T_q) + " x " +
                                std::to_string(T_k) + " is past the 2^18 bias cells the law holds");
  const double C = shift_for(p);
  const Problem s = shifted(p, C);
  const Outcome a = call(impl, p), b = call(impl, s);
  const OracleRun ra = run_oracle(p), rb = run_oracle(s);
  const auto seen = seen_rows(p);
  const std::string what =
      "the case with +" + num(C) + " added to the bias of every even query row and -" + num(C) + " to every odd one";
  Tensor<double> tol = ra.tol_out;
  tol.values() += rb.tol_out.values() + (ra.out.values() - rb.out.values()).cwiseAbs();
  if (auto v = compare(law, "output", a.output, b.output, &tol, seen)) {
    v->message += "; a constant added to every bias of a query row must leave its outputs as they are (" + what +
                  " vs. the case as drawn)";
    v->call = s;
    v->call_what = what;
    return v;
  }
  if (!p.want_lse || !a.lse || !b.lse) return std::nullopt;
  Tensor<double> want = *a.lse, tl = lse_bound(p, ra);
  const Tensor<double> tb = lse_bound(s, rb);
  for (Index n = 0; n < want.size(); ++n) {
    const double ci = row_shift(C, n % T_q);
    want.values()[n] += ci;
    const double gap = std::abs(ra.lse.values()[n] + ci - rb.lse.values()[n]);
    tl.values()[n] += tb.values()[n] + (std::isfinite(gap) ? gap : 0.0);
  }
  if (auto v = compare(law, "lse", want, *b.lse, &tl, seen)) {
    const auto& w = v->worst_index;
    v->message += "; adding " + num(row_shift(C, w[2])) + " to every bias of row " + std::to_string(w[2]) +
                  " must add exactly that to its log-sum-exp (" + num(a.lse.value()(w[0], w[1], w[2], 0)) +
                  " as drawn)";
    v->call = s;
    v->call_what = what;
    return v;
  }
  return std::nullopt;
}

// ---- bias-minus-inf -------------------------------------------------------------------------------------------

const char* kMinusInfWhy =
    "A bias of -inf is how FlexAttention's score_mod, SDPA's float attn_mask and T5-style code hide a cell: "
    "exp(-inf) = 0, so the cell's weight is exactly 0 and the call is the call with the cell masked. The law sets "
    "the bias to -inf on a stripe pattern of cells, key j of row i of head (b, h) where j + offset + step i + h + 2b "
    "is a multiple of a period from 2 to 5 (rows whose keys all fall on it see none), keeps the case's bias "
    "elsewhere (0 where it has none), and checks: the "
    "outputs of the rows that still see a key against the float64 oracle of the case with those cells masked, "
    "within oracle-agreement's derived bound; with the weights, each -inf cell's weight exactly 0; each row left "
    "seeing no key all 0 or all NaN, the declared empty-row convention where there is one; and, for an "
    "implementation that takes dense masks, the same case with those cells hidden by a dense mask instead, within "
    "both calls' derived bounds. An online softmax whose running max is still -inf after a tile of -inf cells "
    "computes exp(-inf - (-inf)) = NaN; a kernel that clamps the bias to the dtype's lowest finite value (-3.4e38) "
    "makes a row that sees no key the average of values it must not see.";

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Which cells the law hides: key j of query row i of (b, h) when (j + offset + step·i + h + 2b) is a multiple of
// `period`, a stripe pattern that shrinks toward hiding key 0, 2, 4, ... of every row (a row whose keys all fall on
// the stripes sees none: row 0 of a top-left case, a decode step over one key).
struct Stripes {
  Index period = 2, offset = 0, step = 0;
  bool hides(Index b, Index h, Index i, Index j) const { return (j + offset + step * i + h + 2 * b) % period == 0; }
};

// p with a bias of -inf on the cells the stripes hide, and p's own bias (or 0) elsewhere.
Problem with_minus_inf(const Problem& p, const Stripes& stripes) {
  const Shape& s = p.q.shape();
  const Index T_k = p.k.shape().T;
  const ScoreBias zero{.B = 1, .H = 1, .T_q = s.T, .T_k = T_k, .values = std::vector<double>(std::size_t(s.T * T_k))};
  ScoreBias b = (p.bias ? *p.bias : zero).written_out(s.B, s.H);
  for (std::size_t n = 0; n < b.values.size(); ++n) {
    const Index j = Index(n) % T_k, i = Index(n) / T_k % s.T, h = Index(n) / (T_k * s.T) % s.H,
                bb = Index(n) / (T_k * s.T * s.H);
    if (stripes.hides(bb, h, i, j)) b.values[n] = kNegInf;
  }
  Problem m = p;
  m.bias = std::move(b);
  return m;
}

// p with the cells of m's -inf bias hidden by a dense mask (with p's own dense mask, if any) and p's bias.
Problem with_dense_mask(const Problem& p, const Problem& m) {
  const Shape& s = p.q.shape();
  const Index T_k = p.k.shape().T;
  DenseMask d{.B = s.B, .H = s.H, .T_q = s.T, .T_k = T_k, .cells = {}};
  d.cells.reserve(std::size_t(s.B * s.H * s.T * T_k));
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < T_k; ++j)
          d.cells.push_back((*m.bias)(b, h, i, j) != kNegInf && (!p.dense_mask || p.dense_mask->visible(b, h, i, j)));
  Problem q = p;
  q.dense_mask = std::move(d);
  return q;
}

rc::Gen<LawCase> gen_minus_inf(const GenConfig& cfg) {
  return rc::gen::exec([cfg] {
    LawCase c = *gen_problem(capped(cfg), ProblemOptions{});
    const Index period = *rc::gen::inRange<Index>(2, 6);
    c.params["period"] = double(period);
    c.params["offset"] = double(*rc::gen::inRange<Index>(0, period));
    c.params["step"] = double(*rc::gen::inRange<Index>(0, period));
    return c;
  });
}

std::optional<Violation> check_minus_inf(const Implementation& impl, const LawCase& c) {
  const char* law = "bias-minus-inf";
  const Index T_q = c.problem.q.shape().T, T_k = c.problem.k.shape().T;
  if (double(T_q) * double(T_k) > kMaxCells)
    throw std::invalid_argument(std::string(law) + ": a case of T_q x T_k = " + std::to_string(T_q) + " x " +
                                std::to_string(T_k) + " is past the 2^18 bias cells the law holds");
  Stripes stripes;
  stripes.period = int_param(c, law, "period", 1, kMaxExtent);
  stripes.offset = int_param(c, law, "offset", 0, kMaxExtent);
  stripes.step = int_param(c, law, "step", 0, kMaxExtent);
  const Problem m = with_minus_inf(outputs_first(impl, c.problem), stripes);
  const std::string what = "the case with a bias of -inf on the cells it hides";
  const auto blame = [&](std::optional<Violation> v, const std::string& why) {
    if (v) {
      v->message += "; " + why;
      v->call = m;
      v->call_what = what;
    }
    return v;
  };
  const Outcome o = call(impl, m);
  const OracleRun r = run_oracle(m);  // the -inf cells are hidden (Visibility::bias): the masked case's oracle
  if (auto v = blame(compare(law, "output", r.out, o.output, &r.tol_out, seen_rows(m)),
                     "a bias of -inf must hide its cell as a mask does"))
    return v;
  // Rows left seeing no key: all 0 or all NaN, the declared convention where there is one.
  const std::optional<EmptyRows> declared = impl.capabilities().empty_rows;
  const Shape& s = m.q.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = m.visibility(b, h);
      for (Index i = 0; i < s.T; ++i) {
        if (!vis.keys(i).empty()) continue;
        // With sinks the row is not empty: the sink takes all of its weight, and the output is exactly 0.
        const bool nan = m.sinks.empty() && std::isnan(o.output(b, h, i, 0));
        for (Index d = 0; d < o.output.shape().D; ++d) {
          const double x = o.output(b, h, i, d);
          const bool ok = nan ? std::isnan(x) && declared != EmptyRows::zero
                              : x == 0 && (declared != EmptyRows::nan || !m.sinks.empty());
          if (ok) continue;
          Violation v;
          v.quantity = "output";
          v.worst_index = {b, h, i, d};
          v.magnitude = x;
          v.actual = o.output;
          v.message = std::string(law) + ": output" + idx({b, h, i, d}) + " = " + num(x) + ", but query " +
                      std::to_string(i) + " sees no key (every key it may see has a bias of -inf): its row must be " +
                      (!m.sinks.empty() ? std::string("all 0 (its sink takes all of its weight)")
                       : declared       ? std::string("all ") + (*declared == EmptyRows::zero ? "0" : "NaN") +
                                        " (the declared empty-row convention)"
                                  : std::string("all 0 or all NaN (an empty-row convention)"));
          return blame(v, "a bias of -inf must hide its cell as a mask does");
        }
      }
    }
  if (o.weights) {
    const auto minus_inf = [&](Index b, Index h, Index i, Index j) { return (*m.bias)(b, h, i, j) == kNegInf; };
    if (auto v = nonzero_hidden_weight(law, impl, m, *o.weights, minus_inf)) {
      v->call = m;
      v->call_what = what;
      return v;
    }
  }
  if (!impl.capabilities().declares(Feature::dense_mask)) return std::nullopt;
  Problem masked = with_dense_mask(c.problem, m);
  masked.want_weights = false;
  const Outcome a = call(impl, masked);
  Tensor<double> tol = r.tol_out;
  tol.values() *= 2;  // both calls within the same derived bound of the same oracle
  return blame(compare(law, "output", a.output, o.output, &tol, seen_rows(m)),
               "a bias of -inf must give the call that hides the same cells with a dense mask");
}

// ---- alibi-as-bias -------------------------------------------------------------------------------------------

const char* kAlibiWhy =
    "ALiBi adds slope_h (j - p) to the score of key j for a query at aligned position p, after the softcap, exactly "
    "where an additive bias goes: the call with ALiBi slopes and the same call with the bias b_hij = slope_h (j - p) "
    "instead (p as the call's alignment and documents place each query) are the same attention. The law compares "
    "the two calls' outputs (and LSEs, where returned) within both calls' derived bounds plus what their float64 "
    "oracles differ by (nothing where the bias is exact in the dtype, as the drawn slopes 2^-k and 1 make it; a slope "
    "that does not fit is rounded with the bias, and the oracles say by how much). A kernel whose ALiBi has its sign "
    "flipped, reads another head's slope, or measures from the query's row instead of its aligned position (which "
    "moves the LSE) breaks it against its own bias path, and a bias path that drops or misplaces the bias breaks it "
    "against ALiBi.";

std::string needs_alibi_and_bias(const GenConfig& g) {
  if (auto why = needs_bias(g); !why.empty()) return why;
  if (!g.caps.declares(Feature::alibi))
    return "needs ALiBi (ATTNCHECK_CAP3_ALIBI) beside the additive bias, which this implementation does not declare";
  return "";
}

rc::Gen<LawCase> gen_alibi(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.require.add(Feature::alibi);
  po.allow.remove(Feature::bias);  // the law writes ALiBi as the bias itself
  po.want_lse = cfg.caps.declares(Feature::lse);
  return gen_problem(capped(cfg), po);
}

// p without ALiBi and with slope_h (j - p) as its bias, [B, H, T_q, T_k] (positions may differ by batch entry), each
// value rounded to the dtype as a call carries it.
Problem alibi_as_bias(const Problem& p) {
  const Shape& s = p.q.shape();
  const Index T_k = p.k.shape().T;
  Problem q = p;
  q.alibi_slopes.clear();
  ScoreBias b{.B = s.B, .H = s.H, .T_q = s.T, .T_k = T_k, .values = {}};
  b.values.reserve(std::size_t(s.B * s.H * s.T * T_k));
  for (Index bb = 0; bb < s.B; ++bb)
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = p.visibility(bb, h);
      const double slope = p.alibi_slopes[std::size_t(h)];
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < T_k; ++j) b.values.push_back(round_to(p.dtype, slope * double(j - vis.position(i))));
    }
  q.bias = std::move(b);
  return q;
}

std::optional<Violation> check_alibi(const Implementation& impl, const LawCase& c) {
  const char* law = "alibi-as-bias";
  Problem p = outputs_first(impl, c.problem);
  p.want_weights = false;
  if (p.alibi_slopes.empty() || p.bias) return std::nullopt;  // a stored case the law does not draw
  const Index T_q = p.q.shape().T, T_k = p.k.shape().T;
  if (double(T_q) * double(T_k) > kMaxCells)
    throw std::invalid_argument(std::string(law) + ": a case of T_q x T_k = " + std::to_string(T_q) + " x " +
                                std::to_string(T_k) + " is past the 2^18 bias cells the law holds");
  const Problem q = alibi_as_bias(p);
  return calls_agree(law, impl, p, q, "the case with its ALiBi slopes written as the bias slope_h (j - p) instead",
                     "ALiBi and the bias slope_h (j - p) are the same attention");
}

// ---- grad-bias -------------------------------------------------------------------------------------------------

const char* kGradWhy =
    "An additive bias is added to each modified score, so its gradient is the score gradient itself: dBias_ij = "
    "dS_ij = P_ij (dP_ij - Delta_i), before softcap's derivative (which belongs to the raw score), summed over the "
    "axes the bias broadcasts over. So each row of dBias sums to 0 without sinks (softmax does not see a row's "
    "constant, as for grad-key-sum-zero), and a bias broadcast over the batch or the heads gets the sum of what the "
    "same values written out for every (b, h) get. The law checks both: |sum_j dBias_ij| <= 2 sum_j t_ij + "
    "gamma_T(u64) sum_j |dBias_ij|, t the grad-oracle bound of dBias (the oracle within t of exact, the kernel "
    "within t of the oracle); then the broadcast call's dBias against the per-(b, h) sum of the written-out call's, "
    "within the broadcast call's bound plus the written-out call's summed (a case whose bias is written out already "
    "is compared with head (0, 0)'s bias broadcast). Sinks are not drawn (a row's dS then sums to -p_sink Delta_i). "
    "grad-oracle compares dBias with the float64 oracle and grad-finite-difference takes it along a random "
    "direction. A dBias not summed over a broadcast axis, taken after softcap's derivative, scaled by the softmax "
    "scale, or missing the -Delta term breaks it.";

std::string needs_bias_grad(const GenConfig& g) {
  if (auto why = needs_backward(g); !why.empty()) return why;
  if (auto why = needs_bias(g); !why.empty()) return why;
  if (!g.caps.declares(Feature::bias_grad))
    return "needs dBias from the backward (ATTNCHECK_CAP4_BIAS_GRAD), which this implementation does not declare";
  return "";
}

rc::Gen<LawCase> gen_grad(const GenConfig& cfg) {
  ProblemOptions po = outputs_only();
  po.require.add(Feature::bias);
  po.allow.remove(Feature::sinks);
  return gen_gradients_with(capped(cfg), po);
}

// t [B, H, T_q, T_k] summed over the axes `to` broadcasts over: `to`'s shape.
Tensor<double> summed_to(const Tensor<double>& t, const Shape& to) {
  Tensor<double> s(to);
  const Shape& f = t.shape();
  for (Index b = 0; b < f.B; ++b)
    for (Index h = 0; h < f.H; ++h) s.head(to.B == 1 ? 0 : b, to.H == 1 ? 0 : h) += t.head(b, h);
  return s;
}

std::optional<Violation> check_grad(const Implementation& impl, const LawCase& c) {
  const char* law = "grad-bias";
  const Problem& p = c.problem;
  if (!p.bias || !p.sinks.empty()) return std::nullopt;  // a stored case the law does not draw
  const Gradients g = call_backward(impl, p);
  const GradientCheck r = run_gradient_oracle(p);
  // Each row of dBias sums to 0.
  if (!g.dbias || !r.oracle.dbias) return std::nullopt;  // declared dBias: call_backward has insisted on it
  const Shape& s = r.oracle.dbias->shape();
  Tensor<double> sum({s.B, s.H, s.T, 1}), tol({s.B, s.H, s.T, 1});
  const double g_T = gamma(s.D, unit_roundoff(DType::f64));
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        double total = 0, abs_total = 0, t = 0;
        for (Index j = 0; j < s.D; ++j) {
          const double x = (*g.dbias)(b, h, i, j);
          total += x;
          if (std::isfinite(x)) abs_total += std::abs(x);  // a non-finite dBias fails on its own sum
          t += (*r.tolerance.dbias)(b, h, i, j);
        }
        sum(b, h, i, 0) = total;
        tol(b, h, i, 0) = 2 * t + g_T * abs_total;
      }
  if (auto v = compare(law, "d_bias-row-sum", Tensor<double>(sum.shape()), sum, &tol, {})) {
    v->message += " (the sum over keys j of d_bias[b,h,i,j], which must be 0: softmax does not see a row's constant)";
    return v;
  }
  // Broadcast against written out.
  const Index B = p.q.shape().B, H = p.q.shape().H;
  Problem narrow = p, wide = p;
  const bool full = p.bias->B == B && p.bias->H == H;
  if (full) {
    ScoreBias one{.B = 1, .H = 1, .T_q = p.bias->T_q, .T_k = p.bias->T_k, .values = {}};
    one.values.assign(p.bias->head(0, 0), p.bias->head(0, 0) + p.bias->T_q * p.bias->T_k);
    narrow.bias = std::move(one);
  }
  if (B * H == 1) return std::nullopt;  // nothing broadcasts
  wide.bias = narrow.bias->written_out(B, H);
  const Gradients gn = full ? call_backward(impl, narrow) : g, gw = call_backward(impl, wide);
  const GradientCheck rn = full ? run_gradient_oracle(narrow) : r, rw = run_gradient_oracle(wide);
  if (!gn.dbias || !gw.dbias) return std::nullopt;  // as above
  const Shape ns = rn.oracle.dbias->shape();
  const Tensor<double> want = summed_to(*gw.dbias, ns);
  Tensor<double> t = summed_to(*rw.tolerance.dbias, ns);
  t.values() +=
      rn.tolerance.dbias->values() + (summed_to(*rw.oracle.dbias, ns).values() - rn.oracle.dbias->values()).cwiseAbs();
  const std::string what = "the same bias written out for every batch entry and head";
  if (auto v = compare(law, "d_bias", want, *gn.dbias, &t, {})) {
    v->message += "; a bias [" + std::to_string(ns.B) + "," + std::to_string(ns.H) +
                  ",T_q,T_k] must get the sum over the axes it broadcasts over of what " + what + " gets";
    if (full) {
      v->call = narrow;
      v->call_what = "the case with head (0, 0)'s bias for every batch entry and head";
    }
    return v;
  }
  return std::nullopt;
}

}  // namespace bias_law
}  // namespace

Law bias_row_shift() {
  using namespace bias_law;
  return {"bias-row-shift",
          "a constant added to every bias of a query row changes no output and adds itself to the row's LSE",
          kShiftWhy,
          LawDoc{"49",
                 "adding c_i = ±C (C up to 2¹⁰, b + c_i exact in the dtype) to every bias of query row i leaves the "
                 "outputs as they are and adds c_i to lse_i",
                 "both calls' derived bounds (lse-oracle's for the LSE)"},
          needs_bias,
          gen_shift,
          check_shift,
          0};
}

Law bias_minus_inf() {
  using namespace bias_law;
  return {"bias-minus-inf",
          "a bias of -inf hides its cell exactly as a mask does",
          kMinusInfWhy,
          LawDoc{"50",
                 "a bias of −∞ on a stripe of cells gives the oracle of the masked case, weight exactly 0 there, an "
                 "empty row's convention, and the dense-mask call",
                 "derived output bound; exact for the weights and empty rows; both calls' bounds for the dense mask"},
          needs_bias,
          gen_minus_inf,
          check_minus_inf,
          0};
}

Law alibi_as_bias() {
  using namespace bias_law;
  return {"alibi-as-bias", "ALiBi slopes give what the bias slope_h (j - p) gives", kAlibiWhy,
          LawDoc{"52", "the call with ALiBi and the same call with the bias slope_h·(j − p) instead agree",
                 "both calls' derived bounds (lse-oracle's for the LSE)"},
          needs_alibi_and_bias, gen_alibi, check_alibi, 0};
}

Law grad_bias() {
  using namespace bias_law;
  Law l{"grad-bias",
        "dBias: each row sums to 0, and a broadcast bias gets the sum of what it stands for",
        kGradWhy,
        LawDoc{"51",
               "each row of dBias sums to 0 (no sinks); a bias broadcast over the batch or heads gets Σ of the "
               "written-out call's dBias",
               "2·Σ_j grad-oracle bound + γ_T(u₆₄)·Σ|dBias|; both calls' bounds"},
        needs_bias_grad,
        gen_grad,
        check_grad,
        0};
  l.needs_backward = true;
  return l;
}

}  // namespace attncheck::law_kit
