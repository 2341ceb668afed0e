// Generators for attention problems. RapidCheck's built-in floating-point generator stays in a narrow range,
// so values are built from integers (which shrink toward 0) mapped through a regime and a magnitude.
#include "attncheck/generators.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attncheck {
namespace {

constexpr int kSteps = 1024;  // resolution of a unit-interval draw

// A unit-variance bell-shaped value from a symmetric integer: the logistic quantile ln((1+u)/(1-u)) scaled by
// √3/π, whose variance is 1. The integer 0 maps to 0.
double logistic(int n) {
  const double u = double(n) / (kSteps + 1);
  return std::log((1 + u) / (1 - u)) * std::sqrt(3.0) / M_PI;
}

}  // namespace

std::string regime_name(Regime r) {
  switch (r) {
    case Regime::small_int: return "small-int";
    case Regime::normal: return "normal";
    case Regime::uniform: return "uniform";
    case Regime::ties: return "ties";
    case Regime::one_hot: return "one-hot";
    case Regime::sparse: return "sparse";
  }
  return "?";
}

double round_to(DType dtype, double x) {
  const double lim = max_finite(dtype) / 2;
  x = std::clamp(x, -lim, lim);
  return visit_dtype(dtype, [x](auto tag) { return double(static_cast<decltype(tag)>(x)); });
}

namespace {

std::vector<Index> towards_one(Index x) {
  std::vector<Index> out;
  auto seq = rc::shrink::towards<Index>(x, 1);
  while (auto v = seq.next()) out.push_back(*v);
  return out;
}

// The divisors of n, ascending.
std::vector<Index> divisors(Index n) {
  std::vector<Index> d;
  for (Index k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  return d;
}

// A shape with T_k changed keeps its key lengths inside [0, T_k] and its padding per batch entry.
void fit_key_lengths(CaseShape& c) {
  if (c.key_lengths.empty()) return;
  c.key_lengths.resize(std::size_t(c.B), c.T_k);
  for (Index& len : c.key_lengths) len = std::min(len, c.T_k);
}

// Every shape one step simpler than s. The whole geometry is one shrinkable, so after any accepted step all
// extents are tried again: gen::exec never returns to an earlier draw, so a T_q that could not shrink while
// T_k was still large stayed large after T_k shrank. A square case may also become a cross-length one with
// fewer elements, under either alignment: T_q = 1, T_k = 2 is reachable from T_q = T_k = 2. H and H_kv shrink
// together (H_kv always divides H); padding and the window shrink toward none.
std::vector<CaseShape> shape_shrinks(const CaseShape& s, bool cross, bool gqa, const Capabilities& caps) {
  std::vector<CaseShape> out;
  const bool bottom_right = caps.supports(CausalAlignment::BottomRight);
  const auto add = [&](CaseShape c) {
    if (c.T_q == c.T_k && caps.supports(kDefaultAlignment)) c.alignment = kDefaultAlignment;
    fit_key_lengths(c);
    out.push_back(c);
    if (c.T_q != c.T_k && bottom_right && c.alignment == CausalAlignment::TopLeft) {  // same step, other alignment
      c.alignment = CausalAlignment::BottomRight;
      out.push_back(c);
    }
  };
  for (const Index b : towards_one(s.B)) {
    CaseShape c = s;
    c.B = b;
    add(c);
  }
  // Fewer query heads per kv head, fewer kv heads with the same group size, then fewer heads of either kind.
  const Index group = s.H / s.H_kv;
  for (const Index g : towards_one(group)) {
    CaseShape c = s;
    c.H = s.H_kv * g;
    add(c);
  }
  for (const Index kv : towards_one(s.H_kv)) {
    CaseShape c = s;
    c.H_kv = kv;
    c.H = kv * group;
    add(c);
  }
  for (const Index h : towards_one(s.H)) {
    CaseShape c = s;
    c.H = h;
    c.H_kv = std::gcd(h, s.H_kv);
    add(c);
  }
  for (const Index kv : divisors(s.H))  // grouping heads is a step only for kernels that accept it
    if (gqa && kv < s.H_kv) {
      CaseShape c = s;
      c.H_kv = kv;
      add(c);
    }
  if (s.T_q == s.T_k)
    for (const Index t : towards_one(s.T_q)) {
      CaseShape c = s;
      c.T_q = c.T_k = t;
      add(c);
    }
  if (cross) {
    for (const Index t : towards_one(s.T_q)) {
      CaseShape c = s;
      c.T_q = t;
      add(c);
    }
    for (const Index t : towards_one(s.T_k)) {
      CaseShape c = s;
      c.T_k = t;
      add(c);
    }
  }
  for (const Index d : towards_one(s.D)) {
    CaseShape c = s;
    c.D = d;
    add(c);
  }
  if (!s.key_lengths.empty()) {
    CaseShape c = s;
    c.key_lengths.clear();
    add(c);
    for (std::size_t b = 0; b < s.key_lengths.size(); ++b) {
      auto seq = rc::shrink::towards<Index>(s.key_lengths[b], s.T_k);
      while (auto len = seq.next()) {
        CaseShape l = s;
        l.key_lengths[b] = *len;
        add(l);
      }
    }
  }
  if (s.window) {
    CaseShape c = s;
    c.window.reset();
    add(c);
    for (const Index w : towards_one(*s.window + 1)) {  // toward window 0
      CaseShape l = s;
      l.window = w - 1;
      add(l);
    }
  }
  if (s.alignment != kDefaultAlignment && caps.supports(kDefaultAlignment)) {
    CaseShape c = s;
    c.alignment = kDefaultAlignment;
    out.push_back(c);
  }
  return out;
}

}  // namespace

rc::Gen<CaseShape> gen_shape(const GenConfig& cfg, const ProblemOptions& opts) {
  const Index max_T = std::min<Index>(cfg.max_T, cfg.caps.max_T);
  const Index max_tail = std::max<Index>(max_T, std::min<Index>(cfg.max_T_tail, cfg.caps.max_T));
  // T: usually in [1, max_T]; one case in eight reaches into the tail (inRange scales with size, so the tail
  // is only reached as RapidCheck's size grows).
  const auto gen_T = [=] {
    if (max_tail <= max_T) return rc::gen::inRange<Index>(1, max_T + 1);
    return rc::gen::join(weighted_choice<rc::Gen<Index>>(
        {{7, rc::gen::inRange<Index>(1, max_T + 1)}, {1, rc::gen::inRange<Index>(1, max_tail + 1)}}));
  };
  const auto gen_D = gen_head_dim(cfg);
  const bool cross = opts.allow_cross_lengths && cfg.caps.cross_lengths;
  const bool gqa = opts.allow_gqa && cfg.caps.gqa, padding = opts.allow_padding && cfg.caps.key_padding,
             window = opts.allow_window && cfg.caps.window;
  const Capabilities caps = cfg.caps;
  const Index max_B = cfg.max_B;
  // The first value is drawn with ordinary generators; shrinking is shape_shrinks' alone.
  const auto initial = rc::gen::exec([=] {
    CaseShape s;
    s.B = *rc::gen::inRange<Index>(1, cfg.max_B + 1);
    s.H = *rc::gen::inRange<Index>(1, cfg.max_H + 1);
    s.T_q = *gen_T();
    // Draws are unconditional: a draw that happens only for some values of an earlier one would shift every
    // later draw when shrinking changes that value, and the case would change entirely instead of shrinking.
    // (Conditions on the run's capabilities and options are fine: they never change within a run.)
    const bool differ = cross && *weighted_choice<bool>({{2, false}, {1, true}});
    const Index T_k = *gen_T();
    s.T_k = differ ? T_k : s.T_q;
    s.D = *gen_D;
    if (!caps.alignments.empty()) {
      std::vector<std::pair<std::size_t, CausalAlignment>> choices;
      for (const auto a : caps.alignments) choices.emplace_back(1, a);
      const CausalAlignment drawn = *weighted_choice(choices);
      // With T_q == T_k both alignments are the same mask; keep the default unless it is not supported.
      s.alignment = s.T_q != s.T_k || !caps.supports(s.alignment) ? drawn : s.alignment;
    }
    s.H_kv = s.H;
    if (gqa) {
      // H_kv among the divisors of H: all of them (no grouping), one (multi-query), or any divisor, a third each.
      const int kind = *rc::gen::inRange(0, 3);
      const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
      const std::vector<Index> ds = divisors(s.H);
      s.H_kv = kind == 0 ? s.H : kind == 1 ? 1 : ds[std::size_t(pick) % ds.size()];
    }
    if (padding) {
      // Half the cases padded; each entry's length is then T_k (unpadded), 0 (all padding) or anywhere between.
      const bool padded = *rc::gen::arbitrary<bool>();
      std::vector<Index> lengths;
      for (Index b = 0; b < max_B; ++b) {
        const int kind = *weighted_choice<int>({{2, 2}, {1, 0}, {1, 1}});
        const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
        lengths.push_back(kind == 0 ? s.T_k : kind == 1 ? 0 : pick % (s.T_k + 1));
      }
      if (padded) s.key_lengths.assign(lengths.begin(), lengths.begin() + s.B);
    }
    if (window) {
      // Half the cases windowed: 0 (a query sees only its own key), 1, or anything up to beyond T_k.
      const bool windowed = *rc::gen::arbitrary<bool>();
      const int kind = *rc::gen::inRange(0, 3);
      const Index pick = *rc::gen::inRange<Index>(0, 1 << 20);
      if (windowed) s.window = kind == 0 ? 0 : kind == 1 ? 1 : pick % (std::max(s.T_q, s.T_k) + 2);
    }
    return s;
  });
  return [=](const rc::Random& random, int size) {
    return rc::shrinkable::shrinkRecur(initial(random, size).value(), [=](const CaseShape& s) {
      return rc::seq::fromContainer(shape_shrinks(s, cross, gqa, caps));
    });
  };
}

rc::Gen<Index> gen_head_dim(const GenConfig& cfg) {
  const Index max_D = cfg.max_D;
  Index n_pow2 = 0;
  while ((Index{1} << n_pow2) <= max_D) ++n_pow2;
  return rc::gen::join(weighted_choice<rc::Gen<Index>>(
      {{3, rc::gen::inRange<Index>(1, std::min<Index>(max_D, 16) + 1)},
       {3, rc::gen::inRange<Index>(1, max_D + 1)},
       {2, rc::gen::map(rc::gen::inRange<Index>(0, n_pow2), [](Index e) { return Index{1} << e; })}}));
}

rc::Gen<double> gen_magnitude() {
  // 10^(n/10) for n uniform in [-30, 40] whatever the size (log-uniform over [1e-3, 1e4]); shrinks toward
  // n = 0, magnitude 1.
  return [](const rc::Random& random, int) {
    const int n = int(rc::Random(random).next() % 71) - 30;
    return rc::shrinkable::map(rc::shrinkable::shrinkRecur(n, [](int x) { return rc::shrink::towards(x, 0); }),
                               [](int x) { return std::pow(10.0, x / 10.0); });
  };
}

namespace {

// A per-coordinate random integer in [-lim, lim]: the value at (b,h,i,d) depends only on the case's base seed
// and those four numbers, never on the shape. So when shrinking makes T or D smaller, the entries that remain
// keep their values and the case usually still fails, and shrinking can go on down to the smallest shape.
int coord_int(std::uint64_t base, Index b, Index h, Index i, Index d, int lim) {
  std::uint64_t key = base;
  for (const Index c : {b, h, i, d}) key = (key ^ std::uint64_t(c)) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  return int(rc::Random(key).next() % std::uint64_t(2 * lim + 1)) - lim;
}

}  // namespace

rc::Gen<Tensor<double>> gen_tensor(const Shape& s, Regime regime, double magnitude, DType dtype) {
  return [=](const rc::Random& random, int size) {
    const std::uint64_t base = rc::Random(random).next();
    // Like rc::gen::inRange, the range grows with RapidCheck's size, so the first cases are the simplest.
    const auto lim = [size](int max_abs) { return std::max(1, int(std::int64_t(max_abs) * std::min(size, 100) / 100)); };
    std::vector<int> raw(std::size_t(s.numel()));
    std::size_t n = 0;
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index d = 0; d < s.D; ++d, ++n) switch (regime) {
              case Regime::small_int: raw[n] = coord_int(base, b, h, i, d, 3); break;
              case Regime::ties: raw[n] = coord_int(base, 0, 0, 0, 0, lim(kSteps)); break;
              case Regime::one_hot:  // the row's hot column, drawn per row and folded into [0, D)
                raw[n] = (d == std::abs(coord_int(base, b, h, i, 0, 1 << 20)) % s.D) ? 1 : 0;
                break;
              case Regime::sparse: raw[n] = coord_int(base, b, h, i, d, 4 * lim(kSteps)); break;
              default: raw[n] = coord_int(base, b, h, i, d, lim(kSteps)); break;
            }
    // Each entry's integer maps to its value; shrinking moves each integer toward 0, i.e. each value toward 0.
    const auto value = [=](int r) -> double {
      switch (regime) {
        case Regime::small_int: return r;
        case Regime::normal: return magnitude * logistic(r);
        case Regime::uniform:
        case Regime::ties: return magnitude * r / kSteps;
        case Regime::one_hot: return magnitude * r;
        case Regime::sparse: return r % 4 ? 0.0 : magnitude * logistic(r / 4);  // three entries in four are 0
      }
      return 0;
    };
    const auto build = [=](const std::vector<int>& v) {
      Tensor<double> t(s);
      for (std::size_t k = 0; k < v.size(); ++k) t.values()[Index(k)] = round_to(dtype, value(v[k]));
      return t;
    };
    return rc::shrinkable::map(rc::shrinkable::shrinkRecur(std::move(raw),
                                                           [](const std::vector<int>& v) {
                                                             return rc::shrink::eachElement(v, [](int x) {
                                                               return rc::shrink::towards(x, 0);
                                                             });
                                                           }),
                               build);
  };
}

std::vector<std::string> shape_tags(const Problem& p) {
  const Shape& q = p.q.shape();
  std::vector<std::string> tags;
  const Index T = q.T;
  tags.push_back(T == 1 ? "T=1" : T < 16 ? "T=2..15" : T <= 64 ? "T=16..64" : "T>64");
  const Index D = q.D;
  const bool pow2 = (D & (D - 1)) == 0;
  const Index r = Index(std::lround(std::sqrt(double(D))));
  tags.push_back(pow2 ? "D=pow2" : "D=non-pow2");
  if (D % 2) tags.push_back("D=odd");
  if (r * r != D) tags.push_back("D=non-square");
  if (p.k.shape().T != T) tags.push_back("T_q!=T_k");
  if (p.kv_heads() != q.H) tags.push_back(p.kv_heads() == 1 ? "H_kv=1<H (MQA)" : "1<H_kv<H (GQA)");
  if (!p.key_lengths.empty()) {
    tags.push_back("padded");
    for (const Index len : p.key_lengths)
      if (len == 0) {
        tags.push_back("a-sequence-of-length-0");
        break;
      }
  }
  if (p.window) tags.push_back(*p.window == 0 ? "window=0" : "window");
  // A query that sees no key (bottom-right with T_q > T_k, all padding, ...): its weights must be 0, not uniform.
  bool empty_row = false;
  for (Index b = 0; b < q.B && !empty_row; ++b)
    for (Index i = 0; i < T && !empty_row; ++i) empty_row = p.visibility(b).keys(i).empty();
  if (empty_row) tags.push_back("a-query-sees-nothing");
  // Largest |score| = scale·max|q|·max|k|·D is an upper bound; use the real maximum per head instead.
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(D));
  double smax = 0;
  for (Index b = 0; b < q.B; ++b)
    for (Index h = 0; h < q.H; ++h)
      smax = std::max(smax, (Matrix<double>(p.q.head(b, h)) *
                             Matrix<double>(p.k.head(b, kv_head(h, q.H, p.kv_heads()))).transpose())
                                    .cwiseAbs()
                                    .maxCoeff() *
                                scale);
  tags.push_back(smax > 1e4 ? "|score|>1e4" : smax > 10 ? "|score|=10..1e4" : "|score|<=10");
  return tags;
}

rc::Gen<LawCase> gen_problem(const GenConfig& cfg, const ProblemOptions& opts) {
  return rc::gen::exec([=] {
    const CaseShape s = *gen_shape(cfg, opts);
    const Regime regime = *weighted_choice<Regime>({{2, Regime::small_int},
                                                             {4, Regime::normal},
                                                             {2, Regime::uniform},
                                                             {1, Regime::ties},
                                                             {1, Regime::one_hot},
                                                             {1, Regime::sparse}});
    const double m_qk_drawn = *gen_magnitude(), m_v_drawn = *gen_magnitude();  // unconditional, see gen_shape
    const double m_qk = regime == Regime::small_int ? 1.0 : m_qk_drawn;
    const double m_v = regime == Regime::small_int ? 1.0 : m_v_drawn;
    LawCase c;
    Problem& p = c.problem;
    p.dtype = cfg.dtype;
    p.q = *gen_tensor({s.B, s.H, s.T_q, s.D}, regime, m_qk, cfg.dtype);
    p.k = *gen_tensor({s.B, s.H_kv, s.T_k, s.D}, regime, m_qk, cfg.dtype);
    p.v = *gen_tensor({s.B, s.H_kv, s.T_k, s.D}, regime, m_v, cfg.dtype);
    p.alignment = s.alignment;  // drawn and shrunk with the shape
    p.key_lengths = s.key_lengths;
    p.window = s.window;
    if (opts.allow_custom_scale && cfg.caps.custom_scale) {
      const double custom = *weighted_choice<double>({{6, 0.0}, {1, 1.0}, {1, 0.125}, {1, 2.0}});
      if (custom > 0) p.scale = custom;
    }
    p.want_weights = opts.want_weights && cfg.caps.returns_weights;
    c.tags = shape_tags(p);
    c.tags.push_back("regime=" + regime_name(regime));
    return c;
  });
}

}  // namespace attncheck
