// Values: drawn from integers mapped through a regime and a magnitude, keyed by each entry's coordinates (so
// they shrink with the shape), rounded to the dtype; the simple values they shrink toward.
#include "parts.hpp"

#include "attncheck/cancel.hpp"
#include "../mix64.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace attncheck {
using namespace generation;

namespace {

constexpr int kSteps = 1024;  // resolution of a unit-interval draw

// A unit-variance bell-shaped value from a symmetric integer: the logistic quantile ln((1+u)/(1-u)) scaled by
// √3/π, whose variance is 1. The integer 0 maps to 0.
double logistic(int n) {
  // Tabulated: every entry of a normal-regime tensor takes one (a log each was a tenth of a run's time).
  static const std::array<double, 2 * kSteps + 1> table = [] {
    std::array<double, 2 * kSteps + 1> t{};
    for (int m = -kSteps; m <= kSteps; ++m) {
      const double u = double(m) / (kSteps + 1);
      t[std::size_t(m + kSteps)] = std::log((1 + u) / (1 - u)) * std::sqrt(3.0) / M_PI;
    }
    return t;
  }();
  return table[std::size_t(n + kSteps)];
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

// A per-coordinate random integer in [-lim, lim]: the value at (b,h,i,d) depends only on the case's base seed
// and those four numbers, never on the shape. So when shrinking makes T or D smaller, the entries that remain
// keep their values and the case usually still fails, and shrinking can go on down to the smallest shape.
// The key is mixed by splitmix64's finalizer (mix64.hpp). It was rc::Random(key).next(), a Threefish block per
// entry: a quarter of the CPU time of a run of every law, for one integer an entry. The randomness still comes from
// RapidCheck alone (`base` is drawn from the case's rc::Random); this only spreads it over the coordinates.
// The key is mixed one coordinate at a time, so a row's key (b, h, i) is mixed once and each entry of the row adds
// its d (draw_values); coord_int is the two steps in one.
std::uint64_t mix(std::uint64_t key, Index c) { return (key ^ std::uint64_t(c)) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull; }
std::uint64_t row_key(std::uint64_t base, Index b, Index h, Index i) { return mix(mix(mix(base, b), h), i); }
int entry_int(std::uint64_t row, Index d, int lim) {
  return int(mix64(mix(row, d)) % std::uint64_t(2 * lim + 1)) - lim;
}
int coord_int(std::uint64_t base, Index b, Index h, Index i, Index d, int lim) {
  return entry_int(row_key(base, b, h, i), d, lim);
}

// A small integer (|n| <= 64) or a power of two (2^e, e of any sign): what values shrink toward.
bool is_simple(double x) {
  if (x == 0 || (x == std::trunc(x) && std::abs(x) <= 64)) return true;
  int e = 0;
  return std::isfinite(x) && std::abs(std::frexp(x, &e)) == 0.5;
}

}  // namespace

std::vector<double> simple_values(double x, DType dtype) {
  std::vector<double> out;
  if (x == 0 || !std::isfinite(x)) return out;
  const double sign = x < 0 ? -1 : 1;
  const auto add = [&](double c) {
    c = round_to(dtype, c);
    if (c != x && is_simple(c) && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  add(0);
  add(sign);
  if (x == std::trunc(x) && std::abs(x) <= 64) {  // a small integer: smaller ones only
    auto seq = rc::shrink::towards<int>(int(x), 0);
    while (auto n = seq.next()) add(*n);
    return out;
  }
  int e = 0;
  if (is_simple(x)) {  // a power of two: exponents toward 0 only
    std::frexp(x, &e);
    auto seq = rc::shrink::towards<int>(e - 1, 0);
    while (auto n = seq.next()) add(sign * std::ldexp(1.0, *n));
    return out;
  }
  add(sign * std::exp2(std::round(std::log2(std::abs(x)))));
  if (std::abs(std::round(x)) <= 64) add(std::round(x));
  return out;
}

rc::Gen<Tensor<double>> gen_tensor(const Shape& s, Regime regime, double magnitude, DType dtype) {
  return gen_tensor(s, Coords{}, regime, magnitude, dtype);
}

// The drawn value of every entry of a tensor of shape s whose entries sit at coordinates `at`: a function of the
// regime, the magnitude, `base` and each entry's coordinates only (coord_int), rounded to the dtype.
std::vector<double> generation::draw_values(const Shape& s, const Coords& at, Regime regime, double magnitude, DType dtype,
                                std::uint64_t base, int size) {
  const auto coord = [](const std::vector<Index>& ids, Index x) { return ids.empty() ? x : ids[std::size_t(x)]; };
  // Like rc::gen::inRange, the range grows with RapidCheck's size, so the first cases are the simplest.
  const auto lim = [size](int max_abs) { return std::max(1, int(std::int64_t(max_abs) * std::min(size, 100) / 100)); };
  // Each entry's integer maps to its value in the regime.
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
  std::vector<double> values(std::size_t(s.numel()));
  // round_to's clamp and rounding, with the dtype chosen once per tensor rather than once per entry.
  const double most = max_finite(dtype) / 2;
  const int reach = regime == Regime::small_int ? 3 : regime == Regime::sparse ? 4 * lim(kSteps) : lim(kSteps);
  const int tie = coord_int(base, 0, 0, 0, 0, lim(kSteps));  // the one value of a ties-regime tensor
  visit_dtype(dtype, [&](auto tag) {
    using S = decltype(tag);
    std::size_t n = 0;
    for (Index bx = 0; bx < s.B; ++bx)
      for (Index hx = 0; hx < s.H; ++hx)
        for (Index ix = 0; ix < s.T; ++ix) {
          const std::uint64_t row = row_key(base, coord(at.b, bx), coord(at.h, hx), coord(at.i, ix));
          // the row's hot column in the one-hot regime, drawn per row and folded into [0, D)
          const Index hot = regime == Regime::one_hot ? std::abs(entry_int(row, 0, 1 << 20)) % s.D : -1;
          for (Index d = 0; d < s.D; ++d, ++n) {
            const int r = regime == Regime::ties      ? tie
                          : regime == Regime::one_hot ? (d == hot ? 1 : 0)
                                                      : entry_int(row, coord(at.d, d), reach);
            values[n] = double(static_cast<S>(std::clamp(value(r), -most, most)));
          }
        }
  });
  return values;
}

// Every vector with one value replaced by a simpler one (simple_values), lazily.
rc::Seq<std::vector<double>> generation::value_shrinks(const std::vector<double>& v, DType dtype) {
  return rc::shrink::eachElement(v, [dtype](double x) { return rc::seq::fromContainer(simple_values(x, dtype)); });
}

Tensor<double> generation::as_tensor(const Shape& s, const double* v) {
  Tensor<double> t(s);
  std::copy(v, v + s.numel(), t.data());
  return t;
}

rc::Gen<Tensor<double>> gen_tensor(const Shape& s, const Coords& at, Regime regime, double magnitude, DType dtype) {
  return [=](const rc::Random& random, int size) {
    const std::uint64_t base = rc::Random(random).next();
    return rc::shrinkable::map(
        rc::shrinkable::shrinkRecur(draw_values(s, at, regime, magnitude, dtype, base, size),
                                    [dtype](const std::vector<double>& v) { return value_shrinks(v, dtype); }),
        [s](const std::vector<double>& v) { return as_tensor(s, v.data()); });
  };
}

}  // namespace attncheck
