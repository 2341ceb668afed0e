// Dropout's laws. The keep mask a kernel applied is read off the weights it returns (or that probing recovers: V
// set to one-hot rows gives the dropped weights, and the mask does not depend on V): a cell whose weight is 0 was
// dropped. dropout-as-its-mask (the call is the oracle's with that mask: kept weights over 1 - p, the output their
// product with V, the LSE the softmax's), dropout-mask-determinism (the mask is a function of the seed, the offset and
// the cell's coordinates: the same again, with other values, and without the batch's last entry; another offset or
// seed another), dropout-keep-rate (the kept fraction within Hoeffding's bound of 1 - p) and grad-dropout-mask (the
// backward uses the forward's mask).
#include <cmath>
#include <string>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace dropout_law {

// The keep-rate law's false-alarm rate per case: Hoeffding's bound holds for any n, so this is exact, not asymptotic.
constexpr double kFalseAlarm = 1e-9;
// Another offset or seed must give another mask only where an equal one has a chance below 2^-40.
constexpr double kEqualMaskBits = 40;
// And the determinism law's value and batch comparisons (and the others' repeats) miss a moving mask with a chance
// below 2^-16, in at most 8 trials (trials).
constexpr double kPowerBits = 16;
constexpr Index kPowerTrials = 8;

std::string needs_dropout(const GenConfig& g) {
  if (!g.caps.declares(Feature::dropout))
    return "needs dropout on the weights (ATTNCHECK_CAP4_DROPOUT), which this implementation does not declare";
  if (!g.caps.returns_weights)
    return "needs the attention weights, where the keep mask shows (a dropped cell's weight is 0), which this "
           "implementation does not return";
  if (std::string why = pinned_past_materialised(g, "dropout"); !why.empty()) return why;
  return "";
}

std::string needs_dropout_backward(const GenConfig& g) {
  if (std::string why = needs_dropout(g); !why.empty()) return why;
  return needs_backward(g);
}

ProblemOptions options(const GenConfig& cfg) {
  ProblemOptions po;  // the weights: they carry the mask
  po.require.add(Feature::dropout);
  po.want_lse = cfg.caps.declares(Feature::lse);
  return po;
}

rc::Gen<LawCase> gen(const GenConfig& cfg) { return gen_problem(within_materialised(cfg), options(cfg)); }

rc::Gen<LawCase> gen_determinism(const GenConfig& cfg) {
  // The variant without the last batch entry cuts every per-batch field: no positional cells, bias, temperature or
  // rope (their entries are cut with no_cell_masks' laws), and no pages.
  ProblemOptions po = options(cfg).no_cell_masks();
  po.allow.remove(Feature::paged);
  return gen_problem(within_materialised(cfg), po);
}

rc::Gen<LawCase> gen_backward(const GenConfig& cfg) {
  ProblemOptions po = options(cfg);
  po.want_weights = false;  // the backward's case; the forward that reads the mask asks for them itself
  return gen_gradients_with(within_materialised(cfg), po);
}

// The first n batch entries of t.
Tensor<double> rows_of_batch(const Tensor<double>& t, Index n) {
  const Shape& s = t.shape();
  Tensor<double> r(Shape{n, s.H, s.T, s.D});
  for (Index b = 0; b < n; ++b)
    for (Index h = 0; h < s.H; ++h) r.head(b, h) = t.head(b, h);
  return r;
}

// The forward call whose weights carry the mask.
Outcome call_with_weights(const Implementation& impl, const Problem& p) {
  Problem w = p;
  w.want_weights = true;
  return call(impl, w);
}

// The mask as the weights show it: 1 where a weight is not 0 (NaN included: the comparisons flag it).
Tensor<double> zero_pattern(const Tensor<double>& w) {
  Tensor<double> m(w.shape());
  for (Index n = 0; n < w.size(); ++n) m.values()[n] = w.values()[n] != 0 ? 1.0 : 0.0;
  return m;
}

// p's dropout with the keep mask the weights show; at p = 0 every cell kept (nothing may be dropped, and the
// comparison with the oracle then says where something was).
Dropout read_mask(const Problem& p, const Tensor<double>& w) {
  Dropout d = *p.dropout;
  const Shape& s = w.shape();
  d.H = s.H;
  d.T_q = s.T;
  d.T_k = s.D;
  d.keep.resize(std::size_t(w.size()));
  for (Index n = 0; n < w.size(); ++n) d.keep[std::size_t(n)] = d.p == 0 || w.values()[n] != 0 ? 1 : 0;
  return d;
}

// The cells whose keep bit a correct kernel's weights show without doubt: visible, and with an oracle weight more
// than 4 times its allowed error (kept, it cannot round to 0; dropped, it is exactly 0), from the call without
// dropout.
Include clear_cells(const Problem& p) {
  Problem plain = p;
  plain.dropout.reset();
  const OracleRun r = run_oracle(plain);
  const Shape& s = r.w.shape();
  auto clear = std::make_shared<std::vector<bool>>(std::size_t(s.numel()));
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < s.D; ++j)
          (*clear)[std::size_t(((b * s.H + h) * s.T + i) * s.D + j)] =
              visible(p, b, h, i, j) && r.w(b, h, i, j) > 4 * r.tol_w(b, h, i, j);
  return [clear, s](Index b, Index h, Index i, Index j) {
    return (*clear)[std::size_t(((b * s.H + h) * s.T + i) * s.D + j)];
  };
}

const char* kMaskWhy =
    "Dropout keeps each weight of the softmax with probability 1 - p and divides it by 1 - p, or drops it to 0; the "
    "output is the dropped weights times V and the log-sum-exp is still the softmax's. Which cells a kernel keeps is "
    "its RNG's business, but the weights it returns (or that probing recovers: V set to one-hot rows, the mask not "
    "depending on V) show them: a cell whose weight is 0 was dropped. The law reads that mask and runs the float64 "
    "oracle with it: every weight, the output and the LSE must agree within the derived bound (attention/src/"
    "tolerance.cpp step 11: 1/(1 - p) and its product, the output's bound times 1/(1 - p)). At p = 0 nothing is "
    "dropped. Until a cell has been seen kept and one dropped, the law checks the call at other offsets too (+4 each, "
    "at most 24). A kernel that scales kept "
    "weights by p or not at all, renormalises the kept ones, applies another mask to the output than to the weights "
    "it returns, or computes the LSE after dropping breaks it.";

// The cells of p whose keep bit shows (clear_cells), counted.
Index count_clear(const Problem& p, const Include& clear) {
  Index n = 0;
  for (Index b = 0; b < p.q.shape().B; ++b)
    for (Index h = 0; h < p.q.shape().H; ++h)
      for (Index i = 0; i < p.q.shape().T; ++i)
        for (Index j = 0; j < p.k.shape().T; ++j) n += clear(b, h, i, j) ? 1 : 0;
  return n;
}

Index trials(Index n, double p, double bits_wanted, Index most);

// p's call at offset + 4m.
Problem at_offset(Problem p, Index m) {
  p.dropout->offset += std::uint64_t(4 * m);
  return p;
}

std::optional<Violation> check_mask_at(const Implementation&, const Problem& p, const Outcome& o, Index m) {
  Problem mask = p;
  mask.dropout = read_mask(p, *o.weights);
  const OracleRun r = run_oracle(mask);
  const auto seen = seen_rows(p);
  std::optional<Violation> v = compare("dropout-as-its-mask", "output", r.out, o.output, &r.tol_out, seen);
  if (!v) {
    Tensor<double> tol = r.tol_w;
    const Include hidden = hidden_keys(p);  // a hidden cell's weight stays exactly 0
    for (Index b = 0; b < tol.shape().B; ++b)
      for (Index h = 0; h < tol.shape().H; ++h)
        for (Index i = 0; i < tol.shape().T; ++i)
          for (Index j = 0; j < tol.shape().D; ++j)
            if (hidden(b, h, i, j)) tol(b, h, i, j) = 0;
    v = compare("dropout-as-its-mask", "weights", r.w, *o.weights, &tol, seen);
  }
  if (!v && p.want_lse && o.lse) {
    const Tensor<double> tl = lse_bound(mask, r);
    v = compare("dropout-as-its-mask", "lse", r.lse, *o.lse, &tl, seen);
  }
  if (v) {
    v->message +=
        "; the oracle ran with the keep mask the implementation's weights show (a weight of 0 is a dropped "
        "cell" +
        std::string(p.dropout->p == 0 ? ", none at p = 0" : "") +
        "), kept weights over 1 - p = " + num(1 - p.dropout->p) +
        (m == 0 ? std::string() : ", at offset + " + std::to_string(4 * m));
    v->weights = o.weights;
    if (m > 0) {
      v->call = p;
      v->call_what = "the case at offset + " + std::to_string(4 * m);
    }
  }
  return v;
}

Verdict check_mask(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.dropout) return std::nullopt;  // a stored case the law does not draw
  // At the case's offset and, until a cell whose keep bit shows was seen kept and one dropped, at others (+4 each, at
  // most 24: a correct kernel stops at the first offset that shows both): a bug only kept (or only dropped) cells
  // show is seldom missed on a case of one cell, even at p = 9/10.
  const Include clear = clear_cells(p);
  const Index k = p.dropout->p == 0 ? 0 : trials(count_clear(p, clear), p.dropout->p, kPowerBits, 24);
  bool kept = false, dropped = false;
  for (Index m = 0; m <= k && !(kept && dropped); ++m) {
    const Problem at = at_offset(p, m);
    const Outcome o = call_with_weights(impl, at);
    if (auto v = check_mask_at(impl, at, o, m)) return v;
    const Shape& s = o.weights->shape();
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index j = 0; j < s.D; ++j)
            if (clear(b, h, i, j)) ((*o.weights)(b, h, i, j) != 0 ? kept : dropped) = true;
  }
  return std::nullopt;
}

const char* kDeterminismWhy =
    "A dropout mask comes from a counter-based RNG (Philox in PyTorch and FlashAttention): a function of the seed, "
    "the offset and each cell's coordinates (b, h, i, j), not of the values, not of the batch entries after b, and "
    "not of when or how often the kernel runs, so that the backward can draw it again. The law reads the mask off "
    "the weights (the cells whose keep bit shows without doubt: an oracle weight above 4 times its bound) and "
    "compares, exactly: the same call again; the call with other values (q halved, k and v negated); the call "
    "without the batch's last entry (B >= 2), each at the case's offset and at k others (+4 each), k the fewest for "
    "which a mask these changes move shows no move with a chance below 2^-16 ((p^2 + (1-p)^2)^(n k) over n cells), "
    "at most 8 (a case of one cell at p = 1/2 misses with a chance of 2^-8). And other offsets (+4 each) and other "
    "seeds (+1 each) "
    "must give another mask: a kernel is falsified only when all of as many as make an equal mask's chance 2^-40 "
    "gave the same one. A kernel that ignores the offset or the seed, seeds from the data or numbers its cells from "
    "the batch's end breaks it.";

// The masks of `a` and `b` (zero patterns) on the cells clear in both, exactly.
std::optional<Violation> same_mask(const Tensor<double>& a, const Tensor<double>& b, const Include& clear_a,
                                   const Include& clear_b, const std::string& what) {
  std::optional<Violation> v =
      compare("dropout-mask-determinism", "keep mask", a, b, nullptr,
              [&](Index x, Index y, Index z, Index w) { return clear_a(x, y, z, w) && clear_b(x, y, z, w); });
  if (v) {
    v->message += "; the keep mask (1: kept, 0: dropped, read off the weights) of " + what +
                  " vs. the case as drawn: a mask is a function of the seed, the offset and the cell's coordinates";
  }
  return v;
}

// p with its first n batch entries (the generator draws no per-cell, per-batch field but these).
Problem first_entries(const Problem& p, Index n) {
  Problem r = p;
  r.q = rows_of_batch(p.q, n);
  r.k = rows_of_batch(p.k, n);
  r.v = rows_of_batch(p.v, n);
  if (p.d_output) r.d_output = rows_of_batch(*p.d_output, n);
  if (!p.key_lengths.empty()) r.key_lengths.resize(std::size_t(n));
  if (!p.doc_bounds.empty()) r.doc_bounds.resize(std::size_t(n));
  if (!p.q_doc_bounds.empty()) r.q_doc_bounds.resize(std::size_t(n));
  return r;
}

// How many trials (other offsets, other seeds) a case of n cells whose keep bit shows needs at p for a mask some
// change does not reach to show on all of them with a chance below 2^-bits: (p² + (1-p)²)^(n·k) <= 2^-bits, at most
// `most`. With kEqualMaskBits (40, at most 160: a correct kernel's mask moves at the first or second try, so only a
// kernel whose mask does not pays them) it bounds a false alarm: another offset must give another mask. With
// kPowerBits (16, at most kPowerTrials: each costs two or three calls, and a run's call budget is checked between
// cases) it bounds a miss: a mask the values or the batch reach is seen to move (a case of one cell at p = 1/2 takes
// 8, a miss of 2^-8; one of 16 cells, 1).
Index trials(Index n, double p, double bits_wanted, Index most) {
  const double bits = -std::log2(p * p + (1 - p) * (1 - p));  // per cell and trial
  if (n == 0 || bits <= 0) return 1;
  return std::clamp<Index>(Index(std::ceil(bits_wanted / (double(n) * bits))), 1, most);
}

Verdict check_determinism(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.dropout) return std::nullopt;
  const Include clear = clear_cells(p);
  const Index n = count_clear(p, clear);
  if (n == 0) return std::nullopt;
  const double pr = p.dropout->p, equal = pr * pr + (1 - pr) * (1 - pr);
  const Index k = trials(n, pr, kPowerBits, kPowerTrials);
  // Other values: q halved, k and v negated (the keep bits clear in both are compared).
  Problem other = p;
  for (double& x : other.q.values()) x = round_to(p.dtype, x / 2);
  for (double& x : other.k.values()) x = -x;
  for (double& x : other.v.values()) x = -x;
  const Include clear_other = clear_cells(other);
  const Index B = p.q.shape().B;
  const std::optional<Problem> fewer = B >= 2 ? std::optional(first_entries(p, B - 1)) : std::nullopt;
  const Include clear_fewer = fewer ? clear_cells(*fewer) : Include{};
  Tensor<double> first{Shape{}};    // the case's own mask (trial 0)
  for (Index m = 0; m <= k; ++m) {  // the case's own offset, then k others
    const std::string at = m == 0 ? std::string() : " (both at offset + " + std::to_string(4 * m) + ")";
    const Tensor<double> mask = zero_pattern(*call_with_weights(impl, at_offset(p, m)).weights);
    if (m == 0) {
      first = mask;
      if (auto v =
              same_mask(mask, zero_pattern(*call_with_weights(impl, p).weights), clear, clear, "the same call again"))
        return v;
    }
    if (auto v = same_mask(mask, zero_pattern(*call_with_weights(impl, at_offset(other, m)).weights), clear,
                           clear_other, "the call with other values (q halved, k and v negated)" + at))
      return v;
    if (fewer) {
      const Tensor<double> theirs = zero_pattern(*call_with_weights(impl, at_offset(*fewer, m)).weights);
      if (auto v = same_mask(rows_of_batch(mask, B - 1), theirs, clear_fewer, clear_fewer,
                             "the call without the batch's last entry" + at))
        return v;
    }
  }
  // Other offsets and seeds: another mask somewhere. A correct kernel shows one at the first or second try; a mask
  // no change moved is a violation only once all of them being equal had a chance below 2^-40.
  if (pr == 0) return std::nullopt;
  const Index most = trials(n, pr, kEqualMaskBits, 160);
  for (const bool seed : {false, true}) {
    bool moved = false;
    for (Index m = 1; m <= most && !moved; ++m) {
      Problem q = p;
      if (seed)
        q.dropout->seed += std::uint64_t(m);
      else
        q = at_offset(p, m);
      moved = same_mask(first, zero_pattern(*call_with_weights(impl, q).weights), clear, clear, "").has_value();
    }
    if (moved) continue;
    Violation v;
    v.message = "the keep mask of all " + std::to_string(n) + " cells whose keep bit shows was the same under " +
                (seed ? "seed + 1" : "offset + 4") +
                (most > 1 ? " to + " + std::to_string(seed ? most : 4 * most) : std::string()) + ", a chance of 2^" +
                num(double(n * most) * std::log2(equal)) + " for independent masks at p = " + num(pr) + ": the " +
                (seed ? "seed" : "offset") + " does not reach the RNG";
    v.quantity = "keep mask";
    v.magnitude = double(n);
    v.expected = first;
    return v;
  }
  return std::nullopt;
}

const char* kRateWhy =
    "Each cell is kept with probability 1 - p, independently of the others (what a counter-based RNG's uniforms give, "
    "and what makes the expected output the undropped one). Over the n cells whose keep bit shows (visible, an oracle "
    "weight above 4 times its bound) the kept count K is then Binomial(n, 1 - p), and Hoeffding's inequality, "
    "P(|K/n - (1 - p)| >= t) <= 2 exp(-2 n t^2), holds for every n: with t = sqrt(ln(2/alpha) / (2n)) a correct kernel "
    "fails a case with probability at most alpha = 1e-9. At p = 0 every cell is kept, exactly. A kernel that keeps "
    "with probability p instead of 1 - p, or compares its uniform the wrong way, breaks it once n is large enough for "
    "t to be small.";

Verdict check_rate(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.dropout) return std::nullopt;
  const Outcome o = call_with_weights(impl, p);
  const Include clear = clear_cells(p);
  const Shape& s = o.weights->shape();
  Index n = 0, kept = 0;
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index j = 0; j < s.D; ++j)
          if (clear(b, h, i, j)) {
            ++n;
            kept += (*o.weights)(b, h, i, j) != 0 ? 1 : 0;
          }
  if (n == 0) return std::nullopt;
  const double pr = p.dropout->p, rate = double(kept) / double(n), off = std::abs(rate - (1 - pr));
  const double t = pr == 0 ? 0.0 : std::sqrt(std::log(2 / kFalseAlarm) / (2 * double(n)));
  if (off <= t) return std::nullopt;
  Violation v;
  v.message = "kept " + std::to_string(kept) + " of " + std::to_string(n) + " cells (" + num(rate) +
              ") at p = " + num(pr) +
              (pr == 0 ? ": at p = 0 every cell is kept"
                       : "; the kept fraction must lie within 1 - p = " + num(1 - pr) + " +- " + num(t) +
                             " (Hoeffding's bound at a false-alarm rate of 1e-9 per case)");
  v.quantity = "keep rate";
  v.magnitude = off;
  v.tolerance = t;
  v.weights = o.weights;
  return v;
}

const char* kBackwardWhy =
    "The backward of a call with dropout differentiates the output the forward computed, with the forward's mask: dV = "
    "P'^T dO with P' the dropped weights, dP = mask/(1 - p) o (dO V^T), dS = P o (dP - rowsum(P o dP)) with P the "
    "softmax's weights. A kernel draws the mask again from the seed and the offset, so the law reads the forward's "
    "mask off its weights and compares dQ, dK and dV with the float64 oracle backward under that mask, within the "
    "derived bound (attention/src/backward.cpp step 16), at the case's offset and at as many others as the "
    "determinism law's value comparisons take. A backward that draws a fresh mask (another offset), drops nothing, or "
    "forgets 1/(1 - p) breaks it.";

Verdict check_backward(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.dropout) return std::nullopt;
  // At the case's offset and, as the determinism law does, at k others (+4 each): a backward whose mask differs from
  // the forward's in one cell of a case of one cell shows it at one offset in two.
  const Index k =
      p.dropout->p == 0 ? 0 : trials(count_clear(p, clear_cells(p)), p.dropout->p, kPowerBits, kPowerTrials);
  for (Index m = 0; m <= k; ++m) {
    const Problem at = at_offset(p, m);
    const Outcome o = call_with_weights(impl, at);
    Problem mask = at;
    mask.dropout = read_mask(at, *o.weights);
    const Gradients g = accept_nan_empty_rows(impl, at, call_backward(impl, at));
    const GradientCheck r = run_gradient_oracle(mask);
    if (std::optional<Violation> v = compare_gradients("grad-dropout-mask", r.oracle, g, &r.tolerance)) {
      v->message += "; the oracle backward ran with the keep mask the forward's weights show" +
                    (m == 0 ? std::string() : ", both at offset + " + std::to_string(4 * m));
      v->weights = o.weights;
      return v;
    }
  }
  return std::nullopt;
}

}  // namespace dropout_law
}  // namespace

Law dropout_as_its_mask() {
  using namespace dropout_law;
  return {"dropout-as-its-mask",
          "with dropout, the call is the oracle's under the keep mask its own weights show",
          kMaskWhy,
          LawDoc{"58",
                 "the weights, output and LSE of a call with dropout are the oracle's under the mask its weights "
                 "show (none dropped at p = 0)",
                 "derived (step 11: 1/(1 - p) and its product)"},
          needs_dropout,
          gen,
          check_mask,
          0};
}

Law dropout_mask_determinism() {
  using namespace dropout_law;
  return {"dropout-mask-determinism",
          "a dropout mask depends on the seed, the offset and the cell only",
          kDeterminismWhy,
          LawDoc{"59",
                 "the mask is the same again, with other values and without the last batch entry; another "
                 "offset or seed gives another",
                 "exact (another mask: where an equal one has a chance below 2⁻⁴⁰)"},
          needs_dropout,
          gen_determinism,
          check_determinism,
          0};
}

Law dropout_keep_rate() {
  using namespace dropout_law;
  return {"dropout-keep-rate",
          "the kept fraction of cells is 1 - p within Hoeffding's bound",
          kRateWhy,
          LawDoc{"60", "the kept fraction of the cells whose keep bit shows is 1 − p",
                 "Hoeffding: √(ln(2/α)/(2n)), α = 10⁻⁹ per case; exact at p = 0"},
          needs_dropout,
          gen,
          check_rate,
          0};
}

Law grad_dropout_mask() {
  using namespace dropout_law;
  return {"grad-dropout-mask",
          "the backward of a call with dropout uses the forward's keep mask",
          kBackwardWhy,
          LawDoc{"61", "dQ, dK, dV of a call with dropout are the oracle backward's under the forward's mask",
                 "derived (`attention/src/backward.cpp` step 16)"},
          needs_dropout_backward,
          gen_backward,
          check_backward,
          0,
          true};
}

}  // namespace attncheck::law_kit
