// Cases: a shape and its values as one shrinkable (values keyed by coordinates follow the shape as it shrinks),
// the scale's steps, and the gradient case.
#include "parts.hpp"

#include "attncheck/backward.hpp"
#include "attncheck/cancel.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace attncheck {
using namespace generation;

namespace {

// A case while it is shrunk: its geometry, the current value of every entry of q, k, v and, for a gradient law,
// dO (flattened, in that order), and its scale. Shape steps and value steps interleave, so a shape that could not
// shrink while the values were still as drawn is tried again after they simplified (a score that needed two D
// coordinates may need one once its values are powers of two).
struct CaseValues {
  CaseShape s;
  std::vector<double> values;
  double scale = 0;  ///< an explicit scale; 0: the default 1/√D
};

Shape q_shape(const CaseShape& s) { return {s.B, s.H, s.T_q, s.D}; }
Shape kv_shape(const CaseShape& s) { return {s.B, s.H_kv, s.T_k, s.D}; }
Shape v_shape(const CaseShape& s) { return {s.B, s.H_kv, s.T_k, s.value_dim()}; }
Shape o_shape(const CaseShape& s) { return {s.B, s.H, s.T_q, s.value_dim()}; }  // the output's, and dO's

// Where each of `wanted` sits in `ids` (the last place where an id repeats), -1 where it is absent. Ids are
// usually strictly increasing (a shape's coordinates as drawn and shrunk): then a binary search, else a map.
std::vector<Index> indices_in(const std::vector<Index>& ids, const std::vector<Index>& wanted) {
  std::vector<Index> out;
  out.reserve(wanted.size());
  if (std::adjacent_find(ids.begin(), ids.end(), std::greater_equal<Index>()) == ids.end()) {
    for (const Index id : wanted) {
      const auto it = std::lower_bound(ids.begin(), ids.end(), id);
      out.push_back(it != ids.end() && *it == id ? Index(it - ids.begin()) : Index{-1});
    }
    return out;
  }
  std::map<Index, Index> at;
  for (std::size_t n = 0; n < ids.size(); ++n) at[ids[n]] = Index(n);
  for (const Index id : wanted) {
    const auto it = at.find(id);
    out.push_back(it == at.end() ? Index{-1} : it->second);
  }
  return out;
}

// Copies into `to` (entries of shape `ts` at coordinates `tc`) the value of every entry that `from` (shape fs,
// coordinates fc) also has.
void carry_values(const double* from, const Shape& fs, const std::array<std::vector<Index>, 4>& fc, double* to,
                  const Shape& ts, const std::array<std::vector<Index>, 4>& tc) {
  // Each axis's target coordinates as indices into `from` (-1: from has no such coordinate), looked up once per
  // coordinate, not once per entry (a long context's keys are 2^16 coordinates of D entries each).
  std::array<std::vector<Index>, 4> at;
  for (std::size_t axis = 0; axis < 4; ++axis) at[axis] = indices_in(fc[axis], tc[axis]);
  // Every target coordinate of the last axis at its own index in `from` (the usual step, which keeps D): rows copy.
  bool d_kept = true;
  for (std::size_t d = 0; d < at[3].size(); ++d) d_kept = d_kept && at[3][d] == Index(d);
  Index n = 0;
  for (Index b = 0; b < ts.B; ++b)
    for (Index h = 0; h < ts.H; ++h)
      for (Index i = 0; i < ts.T; ++i) {
        const Index ob = at[0][std::size_t(b)], oh = at[1][std::size_t(h)], oi = at[2][std::size_t(i)];
        if (ob < 0 || oh < 0 || oi < 0) {
          n += ts.D;
          continue;
        }
        const double* row = from + ((ob * fs.H + oh) * fs.T + oi) * fs.D;
        if (d_kept) {
          std::copy(row, row + ts.D, to + n);
          n += ts.D;
          continue;
        }
        for (Index d = 0; d < ts.D; ++d, ++n)
          if (const Index od = at[3][std::size_t(d)]; od >= 0) to[n] = row[od];
      }
}

// Generic values for a small case: each tensor's entries 1, 2, 3, ... in order, so no entry is 0 and no two rows,
// heads or batch entries of a tensor are equal (what values that shrank to 0 lose). Only for cases of at most
// kGenericEntries entries in all, the end of shrinking: every value is then a small integer (<= 64), exact in
// every dtype.
constexpr std::size_t kGenericEntries = 64;
// Other draws tried for each step that makes a case smaller, where nothing else shrinks it (fallback_tries).
constexpr std::uint64_t kRedraws = 2;
std::vector<double> generic_values(const CaseShape& s, DType dtype, bool d_output) {
  std::vector<double> v;
  for (const Index n : {q_shape(s).numel(), kv_shape(s).numel(), v_shape(s).numel(),
                        d_output ? o_shape(s).numel() : Index{0}})
    for (Index x = 1; x <= n; ++x) v.push_back(round_to(dtype, double(x)));
  return v;
}

// How a case's values are drawn: q, k and v in one regime (q and k at one magnitude, v at another), and, for a
// gradient law, dO of the output's shape in its own regime and magnitude.
struct ValueDraw {
  Regime regime = Regime::small_int;
  double m_qk = 1, m_v = 1;
  std::optional<std::pair<Regime, double>> d_output{};  ///< dO's regime and magnitude; empty: no dO
  bool custom_scale = false;                            ///< may the case carry an explicit scale
};

// The scales a case's scale may shrink to, simplest first: the default, then simple_values (0 is not a scale).
std::vector<double> scale_shrinks(double scale, DType dtype) {
  if (scale == 0) return {};
  std::vector<double> out{0};
  for (const double x : simple_values(scale, dtype))
    if (x > 0) out.push_back(x);
  return out;
}

// The values of a case of shape s, drawn (ValueDraw, one base per tensor) and shrunk together with it and its
// scale (0: the default).
// How the values of a case are drawn and shrunk (gen_case_values): the case's own draws (bq, bk, bv, bd: one base
// each for q, k, v and dO, from RapidCheck's random at the case's size), and the candidates each shrink step tries.
// Fewer D coordinates change every score in two ways: fewer terms, and (at the default scale) a larger
// 1/√D. A bug that needs a large score (an overflow, a finite mask constant) may then vanish, although one
// coordinate with larger values would show it: so each step that drops D coordinates is also tried with q
// doubled (a power of two stays one). The shape is smaller either way, so shrinking still ends.
//
// Where nothing else shrinks the case any more, each shape step is tried once more in three other ways,
// last (fallback_tries), so that they cost calls only where shrinking would otherwise stop:
//  - A bug that needs a scale other than 1 (a forgotten scale in the backward) vanishes at D = 1 under the
//    default scale, although any explicit scale other than 1 shows it: where the law lets a case carry an
//    explicit scale, a step that drops D coordinates keeps the scale the case had (1/√D of the old D), which
//    then shrinks toward the default and simple values like any scale.
//  - A step that keeps every entry but simplifies the geometry (no window or a narrower one, less padding,
//    the default alignment) may need other values than the shrunk ones: two queries whose values shrank to
//    the same row tell a window bug apart but not, once the window is gone, a bug that needs their rows to
//    differ. In a large case such a step takes the values as first drawn for that shape.
//  - A step that makes a case smaller is also tried with another draw of the values for the smaller
//    shape (kRedraws of them): a bug that only some values show (two summation orders that round apart, a
//    tie) can need a smaller case other values than the ones each step kept, and shrinking would stop at a
//    size where they happened to show it.
//  - In a small case (the end of shrinking) every step takes generic values (generic_values, at the scale
//    each try has): the draw itself may have had those rows equal, or a bug's ingredients may sit in two D
//    coordinates of which each step keeps one.
// The values then shrink again. Every accepted step makes the geometry simpler or, at the same geometry, the
// scale or one value simpler, so shrinking still ends.
struct ValueSteps {
  ShrinkRules rules;
  ValueDraw how;
  DType dtype;
  int size;
  std::uint64_t bq, bk, bv, bd;

  // The values of shape s: the case's own draw (`salt` 0), or a different draw of the same shape (fallback_tries).
  CaseValues draw(const CaseShape& s, std::uint64_t salt = 0) const {
    const auto salted = [salt](std::uint64_t base) { return salt ? (base ^ salt) * 0x9e3779b97f4a7c15ull : base; };
    const Coords q_at{s.b_ids, s.h_ids, s.q_ids, s.d_ids}, kv_at{s.b_ids, s.kv_ids, s.k_ids, s.d_ids},
        v_at{s.b_ids, s.kv_ids, s.k_ids, s.value_ids()}, o_at{s.b_ids, s.h_ids, s.q_ids, s.value_ids()};
    CaseValues c{s, draw_values(q_shape(s), q_at, how.regime, how.m_qk, dtype, salted(bq), size)};
    for (const auto& [base, m, shape, at] :
         {std::tuple{bk, how.m_qk, kv_shape(s), kv_at}, std::tuple{bv, how.m_v, v_shape(s), v_at}}) {
      const auto t = draw_values(shape, at, how.regime, m, dtype, salted(base), size);
      c.values.insert(c.values.end(), t.begin(), t.end());
    }
    if (how.d_output) {  // at the output's coordinates: dO's entry (i, d) belongs to O's entry (i, d)
      const auto t = draw_values(o_shape(s), o_at, how.d_output->first, how.d_output->second, dtype, salted(bd), size);
      c.values.insert(c.values.end(), t.begin(), t.end());
    }
    return c;
  }

  // A simpler shape keeps the current values of the entries it keeps (q, k, v and dO each at its own coordinates)
  // and the scale; entries it adds are drawn.
  CaseValues reshape(const CaseValues& c, const CaseShape& to) const {
    CaseValues n = draw(to);
    n.scale = c.scale;
    const Shape fq = q_shape(c.s), fk = kv_shape(c.s), fv = v_shape(c.s), fo = o_shape(c.s);
    const Shape tq = q_shape(to), tk = kv_shape(to), tv = v_shape(to), to_ = o_shape(to);
    carry_values(c.values.data(), fq, {c.s.b_ids, c.s.h_ids, c.s.q_ids, c.s.d_ids}, n.values.data(), tq,
                 {to.b_ids, to.h_ids, to.q_ids, to.d_ids});
    carry_values(c.values.data() + fq.numel(), fk, {c.s.b_ids, c.s.kv_ids, c.s.k_ids, c.s.d_ids},
                 n.values.data() + tq.numel(), tk, {to.b_ids, to.kv_ids, to.k_ids, to.d_ids});
    // V (and dO) at V's coordinates: d_ids or dv_ids. A step between the two (D_v to none) keeps the entries whose
    // coordinates both have.
    carry_values(c.values.data() + fq.numel() + fk.numel(), fv, {c.s.b_ids, c.s.kv_ids, c.s.k_ids, c.s.value_ids()},
                 n.values.data() + tq.numel() + tk.numel(), tv, {to.b_ids, to.kv_ids, to.k_ids, to.value_ids()});
    if (how.d_output)
      carry_values(c.values.data() + fq.numel() + fk.numel() + fv.numel(), fo,
                   {c.s.b_ids, c.s.h_ids, c.s.q_ids, c.s.value_ids()},
                   n.values.data() + tq.numel() + tk.numel() + tv.numel(), to_,
                   {to.b_ids, to.h_ids, to.q_ids, to.value_ids()});
    return n;
  }

  CaseValues with_q_doubled(CaseValues c) const {
    const Index n = q_shape(c.s).numel();
    for (Index k = 0; k < n; ++k) c.values[std::size_t(k)] = round_to(dtype, 2 * c.values[std::size_t(k)]);
    return c;
  }

  // The candidates for one shape step from c to `to`, in the order they are tried: the values carried, and q
  // doubled when D coordinates go.
  // An explicit scale that a step to fewer D coordinates would make the new default (scale 1 at D = 1, 1/2 at
  // D = 4) stops being a scale other than the default: a bug that needs one (a kernel that ignores the
  // explicit scale) then vanishes, and D could never drop. Such a step is also tried with the scale doubled and
  // q halved, and halved with q doubled: the scale moves by a power of two and q the other way, so every score
  // is kept (up to underflow), and the scale is still not the default.
  CaseValues with_scale_times(CaseValues c, double f) const {
    c.scale *= f;
    const Index n = q_shape(c.s).numel();
    for (Index k = 0; k < n; ++k) c.values[std::size_t(k)] = round_to(dtype, c.values[std::size_t(k)] / f);
    return c;
  }

  std::vector<CaseValues> step_tries(const CaseValues& c, const CaseShape& to) const {
    CaseValues n = reshape(c, to);
    std::vector<CaseValues> tries{n};
    const bool becomes_default = to.D != c.s.D && c.scale > 0 && c.scale == 1 / std::sqrt(double(to.D));
    if (becomes_default)
      for (const double f : {2.0, 0.5}) tries.push_back(with_scale_times(n, f));
    if (to.D != c.s.D) tries.push_back(with_q_doubled(std::move(n)));
    return tries;
  }

  // The candidates tried for the same step once nothing else shrinks c (so they cost calls only where shrinking
  // would stop): the old scale kept when D coordinates go, fresh values for a same-size step of a large case,
  // kRedraws other draws for a step to a smaller case, generic values for any step of a small one.
  std::vector<CaseValues> fallback_tries(const CaseValues& c, const CaseShape& to) const {
    std::vector<CaseValues> tries;
    const bool small = c.values.size() <= kGenericEntries;
    const bool keep_scale = to.D != c.s.D && how.custom_scale && c.scale == 0;
    const bool same_size = to.D == c.s.D && q_shape(to).numel() == q_shape(c.s).numel() &&
                           kv_shape(to).numel() == kv_shape(c.s).numel() && v_shape(to).numel() == v_shape(c.s).numel();
    const bool smaller = !same_size && q_shape(to).numel() <= q_shape(c.s).numel() &&
                         kv_shape(to).numel() <= kv_shape(c.s).numel() && v_shape(to).numel() <= v_shape(c.s).numel();
    if (!small && !keep_scale && !same_size && !smaller) return tries;  // (no reshape for a step with nothing to try)
    const CaseValues n = reshape(c, to);
    std::optional<double> kept_scale;
    if (keep_scale) {
      kept_scale = 1 / std::sqrt(double(c.s.D));
      CaseValues kept = n;
      kept.scale = *kept_scale;
      tries.push_back(std::move(kept));
    }
    if (!small && same_size) {
      CaseValues fresh = draw(to);
      fresh.scale = c.scale;
      if (fresh.values != n.values) tries.push_back(std::move(fresh));
    }
    if (smaller)
      for (std::uint64_t salt = 1; salt <= kRedraws; ++salt) {
        CaseValues fresh = draw(to, salt);
        fresh.scale = c.scale;
        tries.push_back(std::move(fresh));
      }
    if (small) {
      CaseValues generic = n;
      generic.values = generic_values(to, dtype, bool(how.d_output));
      if (generic.values != n.values) {
        tries.push_back(generic);
        if (kept_scale) {
          generic.scale = *kept_scale;
          tries.push_back(std::move(generic));
        }
      }
    }
    return tries;
  }

  // The candidates for c with scale x instead (0: the default): as they are, and with the scale moved into q (q
  // times the old scale over the new, rounded to the dtype), which keeps every score up to that rounding.
  std::vector<CaseValues> scale_tries(const CaseValues& c, double x) const {
    CaseValues n = c;
    n.scale = x;
    std::vector<CaseValues> tries{n};
    const double to = x > 0 ? x : 1 / std::sqrt(double(c.s.D));
    const double from = c.scale > 0 ? c.scale : 1 / std::sqrt(double(c.s.D));
    for (Index k = 0; k < q_shape(c.s).numel(); ++k)
      n.values[std::size_t(k)] = round_to(dtype, n.values[std::size_t(k)] * from / to);
    if (n.values != c.values) tries.push_back(std::move(n));
    return tries;
  }
};

// Every case one step simpler than c, in the order tried: the shape steps, the scale, each value, then the shape
// steps' fallbacks.
rc::Seq<CaseValues> case_value_shrinks(const std::shared_ptr<const ValueSteps>& steps, const CaseValues& c) {
  const std::vector<CaseShape> shapes = shape_shrinks(c.s, steps->rules);
  return rc::seq::concat(
      rc::seq::mapcat(rc::seq::fromContainer(shapes),
                      [steps, c](const CaseShape& to) { return rc::seq::fromContainer(steps->step_tries(c, to)); }),
      rc::seq::mapcat(rc::seq::fromContainer(scale_shrinks(c.scale, steps->dtype)),
                      [steps, c](double x) { return rc::seq::fromContainer(steps->scale_tries(c, x)); }),
      // (--long: no value steps. A case of 2^15 keys has millions of values, each step a call over them all; the
      // shape steps still shrink its geometry.)
      rc::seq::map(steps->rules.long_lengths.empty() ? value_shrinks(c.values, steps->dtype) : rc::Seq<std::vector<double>>(),
                   [s = c.s, scale = c.scale](std::vector<double> v) { return CaseValues{s, std::move(v), scale}; }),
      rc::seq::mapcat(rc::seq::fromContainer(shapes),
                      [steps, c](const CaseShape& to) { return rc::seq::fromContainer(steps->fallback_tries(c, to)); }));
}

rc::Gen<CaseValues> gen_case_values(CaseShape s0, double scale0, ShrinkRules rules, ValueDraw how, DType dtype) {
  return [=](const rc::Random& random, int size) {
    rc::Random r = random;
    const std::uint64_t bq = r.next(), bk = r.next(), bv = r.next(), bd = r.next();
    const auto steps = std::make_shared<const ValueSteps>(ValueSteps{rules, how, dtype, size, bq, bk, bv, bd});
    CaseValues c0 = steps->draw(s0);
    c0.scale = scale0;
    return rc::shrinkable::shrinkRecur(std::move(c0),
                                       [steps](const CaseValues& c) { return case_value_shrinks(steps, c); });
  };
}

// The largest spread (largest minus smallest) of one row's visible scaled scores q_i . k_j, over the rows of every
// head (query head h reads kv head h / (H / H_kv)) that spread no further than 30, before any modifier: what a
// softcap is measured against. (A row that spreads further has weights below e^-30 of its largest: an uncapped
// kernel's would then underflow where softcap-bound cannot measure a ratio.)
double max_row_spread(const Problem& p) {
  const Shape& s = p.q.shape();
  const Index group = s.H / p.k.shape().H;
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(s.D));
  double top = 0;
  if (double(s.B) * double(s.H) * double(s.T) * double(p.k.shape().T) > kMaterialisedWeights) {
    // A long context: the spread of the rows of kBlocks blocks of 64 (the first, the last and evenly between; a
    // [T_q,T_k] matrix is 2 GiB at T = 16384), each row's visible runs scanned whole, each block against the keys
    // its rows can see. The cap only has to bite on some row (gen_modifiers: 2c <= spread / 2 on the row of the
    // largest spread found), and a row of the blocks read is one: every row of a T = 16384 head was the draw's
    // own O(T²·D) product in double on the thread that draws for every law (about 5 s a case, the workers idle).
    constexpr Index kRows = 64, kBlocks = 16;
    Matrix<double> scores;
    const Index blocks = (s.T + kRows - 1) / kRows;
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h) {
        const Visibility vis = p.visibility(b, h);
        const auto k = p.k.head(b, h / group);
        Index last = -1;
        for (Index n_blk = 0; n_blk < std::min(blocks, kBlocks); ++n_blk) {
          const Index blk = kBlocks >= blocks ? n_blk : n_blk * (blocks - 1) / (kBlocks - 1);
          if (blk == last) continue;
          last = blk;
          throw_if_cancelled("drawing a long case");  // an interrupt must not wait for a draw
          const Index i0 = blk * kRows, n = std::min(kRows, s.T - i0);
          Index j0 = k.rows(), j1 = 0;  // the keys any row of the block sees
          for (Index i = i0; i < i0 + n; ++i)
            vis.for_each_run(i, 0, k.rows(), [&](Index a, Index e) {
              j0 = std::min(j0, a);
              j1 = std::max(j1, e);
            });
          if (j0 >= j1) continue;
          scores.noalias() = p.q.head(b, h).middleRows(i0, n) * k.middleRows(j0, j1 - j0).transpose();
          scores *= scale;
          for (Index i = i0; i < i0 + n; ++i) {
            double lo = std::numeric_limits<double>::infinity(), hi = -lo;
            vis.for_each_run(i, 0, k.rows(), [&](Index a, Index e) {
              const auto run = scores.row(i - i0).segment(a - j0, e - a);
              lo = std::min(lo, run.minCoeff());
              hi = std::max(hi, run.maxCoeff());
            });
            if (hi > lo && hi - lo <= 30) top = std::max(top, hi - lo);
          }
        }
      }
    return top;
  }
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      const Visibility vis = p.visibility(b, h);
      const Eigen::MatrixXd scores = p.q.head(b, h) * p.k.head(b, h / group).transpose() * scale;
      for (Index i = 0; i < scores.rows(); ++i) {
        double lo = std::numeric_limits<double>::infinity(), hi = -lo;
        vis.for_each_run(i, 0, scores.cols(), [&](Index a, Index e) {  // one run(i) a row, not one an entry
          const auto run = scores.row(i).segment(a, e - a);
          lo = std::min(lo, run.minCoeff());
          hi = std::max(hi, run.maxCoeff());
        });
        if (hi > lo && hi - lo <= 30) top = std::max(top, hi - lo);
      }
    }
  return top;
}

// gen_problem, with an upstream gradient dO drawn and shrunk with the case when `d_output`.
rc::Gen<LawCase> gen_case(const GenConfig& cfg, const ProblemOptions& opts, bool d_output) {
  const auto [first, rules] = first_shape(cfg, opts);
  return rc::gen::exec([=, first = first, rules = rules] {
    const CaseShape s0 = *rc::gen::noShrink(first);
    ValueDraw how;
    how.regime = *weighted_choice<Regime>({{2, Regime::small_int},
                                           {4, Regime::normal},
                                           {2, Regime::uniform},
                                           {1, Regime::ties},
                                           {1, Regime::one_hot},
                                           {1, Regime::sparse}});
    const double m_qk_drawn = *gen_magnitude(), m_v_drawn = *gen_magnitude();  // unconditional, see gen_shape
    how.m_qk = how.regime == Regime::small_int ? 1.0 : m_qk_drawn;
    how.m_v = how.regime == Regime::small_int ? 1.0 : m_v_drawn;
    const double custom = *weighted_choice<double>({{6, 0.0}, {1, 1.0}, {1, 0.125}, {1, 2.0}});
    how.custom_scale = opts.allow_custom_scale && cfg.caps.custom_scale;
    if (d_output) {
      const Regime r = *weighted_choice<Regime>({{2, Regime::small_int}, {4, Regime::normal}, {1, Regime::sparse}});
      const double m_drawn = *gen_magnitude();  // unconditional, see gen_shape
      how.d_output = {r, r == Regime::small_int ? 1.0 : m_drawn};
    }
    const CaseValues cv = *gen_case_values(s0, how.custom_scale ? custom : 0.0, rules, how, cfg.dtype);
    const CaseShape& s = cv.s;
    LawCase c;
    Problem& p = c.problem;
    p.dtype = cfg.dtype;
    const Shape qs = q_shape(s), ks = kv_shape(s), vs = v_shape(s);
    p.q = as_tensor(qs, cv.values.data());
    p.k = as_tensor(ks, cv.values.data() + qs.numel());
    p.v = as_tensor(vs, cv.values.data() + qs.numel() + ks.numel());
    if (d_output) p.d_output = as_tensor(o_shape(s), cv.values.data() + qs.numel() + ks.numel() + vs.numel());
    p.alignment = s.alignment;  // drawn and shrunk with the shape
    p.key_lengths = s.key_lengths;
    p.window = s.window;
    p.causal = !s.bidirectional;
    p.prefix_length = s.prefix;
    p.window_right = s.window_right;
    p.chunk_size = s.chunk;
    if (!s.doc_coords.empty())
      for (const Index b : s.b_ids) {  // each bound at the position of the first key at or past its coordinate
        std::vector<Index> bounds;
        for (const Index c : s.doc_coords[std::size_t(b)])
          bounds.push_back(Index(std::lower_bound(s.k_ids.begin(), s.k_ids.end(), c) - s.k_ids.begin()));
        p.doc_bounds.push_back(std::move(bounds));
      }
    if (!s.q_doc_coords.empty())
      for (const Index b : s.b_ids) {  // each at the first query at or past its coordinate
        std::vector<Index> bounds;
        for (const Index c : s.q_doc_coords[std::size_t(b)])
          bounds.push_back(Index(std::lower_bound(s.q_ids.begin(), s.q_ids.end(), c) - s.q_ids.begin()));
        p.q_doc_bounds.push_back(std::move(bounds));
      }
    if (s.cells.kind == 1) p.dense_mask = cells_of(s);
    if (s.cells.kind == 2) p.block_mask = block_mask_of(s);
    if (cv.scale > 0) p.scale = cv.scale;
    if (s.q_ids != iota(s.T_q)) c.positions = s.q_ids;  // a position was deleted: the others keep their ids
    p.want_weights = opts.want_weights && cfg.caps.returns_weights;
    p.want_lse = opts.want_lse && cfg.caps.declares(Feature::lse);
    // Last: shrinking a modifier re-draws nothing else, and an implementation without any draws nothing more.
    const FeatureSet declared = declared_features(cfg.caps);
    const bool any_modifier =
        opts.may_use(Feature::softcap, declared) || opts.may_use(Feature::alibi, declared) ||
        opts.may_use(Feature::sinks, declared) || opts.may_use(Feature::bias, declared) ||
        opts.may_use(Feature::temperature, declared) || opts.may_use(Feature::rope, declared) ||
        opts.may_use(Feature::rope_interleaved, declared) || opts.may_use(Feature::qk_norm, declared) ||
        opts.may_use(Feature::qk_norm_eps_outside, declared) || opts.may_use(Feature::dropout, declared);
    if (any_modifier)
      (*gen_modifiers(cfg, opts, cfg.caps.declares(Feature::softcap) ? max_row_spread(p) : 0.0)).apply(p, s);
    // (V's pool has rows D_v wide where V has a head dimension of its own.)
    if (!d_output && opts.may_use(Feature::paged, declared)) p.paged = *gen_paged_plan(cfg, opts);
    // After the pages (a paged case quantised only where paged_quant is declared) and only where a format may be drawn.
    // (ggml's blocks need both K's D and V's D_v multiples of 32: their gcd is.)
    if (!d_output && may_quantise(cfg, opts))
      (*gen_quant(cfg, opts, std::gcd(p.k.shape().D, p.v.shape().D))).apply(p, s);
    if (!d_output && opts.may_use(Feature::index_list, declared)) (*gen_index_list(cfg, opts)).apply(p, s);
    if (opts.may_use(Feature::tree, declared) || opts.may_use(Feature::tree_bitmask, declared))
      (*gen_tree(cfg, opts)).apply(p, s, cfg.caps);
    c.tags = shape_tags(p);
    if (p.index_list) {
      c.tags.push_back(p.index_list->block_size > 1 ? "index-list=blocks of " + std::to_string(p.index_list->block_size)
                                                    : std::string("index-list=keys"));
    }
    if (p.tree) c.tags.push_back(p.tree->form == TokenTree::Form::parents ? "tree=parents" : "tree=bitmask");
    if (p.quant) {
      c.tags.push_back("kv=" + std::string(quant_format_name(p.quant->format)));
      for (const auto& [side, g] : {std::pair{"k", p.quant->k.granularity}, {"v", p.quant->v.granularity}})
        c.tags.push_back(std::string(side) + "-scales=" + std::string(quant_granularity_name(g)));
      if (p.quant->q) c.tags.push_back("q-scales=" + std::string(quant_granularity_name(p.quant->q->granularity)));
    }
    c.tags.push_back("regime=" + regime_name(how.regime));
    if (how.d_output) c.tags.push_back("dO=" + regime_name(how.d_output->first));
    return c;
  });
}

}  // namespace

rc::Gen<LawCase> gen_problem(const GenConfig& cfg, const ProblemOptions& opts) { return gen_case(cfg, opts, false); }
Index gradient_max_T(const GenConfig& cfg) {
  const double heads = double(std::max<Index>(cfg.max_B, 1)) * double(std::max<Index>(cfg.max_H, 1));
  return std::max<Index>(1, Index(std::sqrt(kMaterialisedWeights / heads)));
}

rc::Gen<LawCase> gen_gradient_case(const GenConfig& config, const ProblemOptions& opts) {
  GenConfig cfg = config;
  cfg.max_T = std::min(cfg.max_T, gradient_max_T(config));
  cfg.max_T_tail = std::min(cfg.max_T_tail, gradient_max_T(config));
  return rc::gen::map(gen_case(cfg, opts, true), [dtype = cfg.dtype](LawCase c) {
    Problem& p = c.problem;
    // Room: an eighth of the dtype's largest value, so the kernel's own rounding cannot push a gradient over it.
    const double room = max_finite(dtype) / 8;
    // A bound on every gradient first, in O(T·D): with c = D_v·max|dO|·max|v| ≥ |dP_ij| ≥ |Δ_i|, |dS_ij| ≤
    // 2c·P_ij (softcap's derivative is at most 1) and each row's weights sum to at most 1, so |dQ| ≤ 2c·scale·
    // max|k|, |dK| ≤ 2c·scale·max|q|·n and |dV| ≤ n·max|dO| over n = group·T_q rows (dQ and dK each times 1/τ at
    // most under a temperature: the scores' derivative by q or k carries scale/τ_i). Where it fits (every case
    // but float16's large ones) the oracle's exact maximum would not scale dO either, and is not computed: the
    // case is the same, and a long context is spared a float64 backward per case.
    const auto max_abs = [](const Tensor<double>& t) { return t.values().cwiseAbs().maxCoeff(); };
    const double n_rows = double(p.q.shape().T) * double(p.q.shape().H / p.kv_heads());
    const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(p.q.shape().D));
    const double c_dp = double(p.v.shape().D) * max_abs(*p.d_output) * max_abs(p.v);
    // dBias (returned at the dtype) sums |dS_ij| <= 2c over the n_b heads a bias entry is read for.
    const double n_b = p.bias ? double(p.q.shape().B / p.bias->B) * double(p.q.shape().H / p.bias->H) : 0.0;
    const double inv_tau =
        p.temperature ? 1 / *std::min_element(p.temperature->values.begin(), p.temperature->values.end()) : 1.0;
    const double bound =
        std::max({2 * c_dp * scale * inv_tau * max_abs(p.k), 2 * c_dp * scale * inv_tau * max_abs(p.q) * n_rows,
                  n_rows * max_abs(*p.d_output), 2 * c_dp * n_b}) *
        (1 + 1e-9);  // the bound's own rounding, a few ulp
    // (A QK-norm's Jacobian, up to |w|/r for a row of small rms r, is not in that bound: such a case asks the oracle.)
    if (std::isfinite(bound) && bound <= room && !p.qk_norm) return c;
    const AttentionGradients<double> g = oracle_backward<double>(p.q, p.k, p.v, *p.d_output, p.options());
    const double g_max =
        std::max({g.dq.values().cwiseAbs().maxCoeff(), g.dk.values().cwiseAbs().maxCoeff(),
                  g.dv.values().cwiseAbs().maxCoeff(), g.dbias ? g.dbias->values().cwiseAbs().maxCoeff() : 0.0});
    if (g_max > room) {
      const int e = int(std::ceil(std::log2(g_max / room)));
      for (double& x : p.d_output->values()) x = round_to(dtype, std::ldexp(x, -e));
      c.tags.push_back("dO-scaled-to-fit");
    }
    return c;
  });
}

}  // namespace attncheck
