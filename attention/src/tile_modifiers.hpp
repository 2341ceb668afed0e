// The score modifiers over a whole tile of scores, on SIMD packets; private to the core's hot loops.
//
// modified_score (attention.hpp) modifies one score at a time, with the C library's scalar tanh for a softcap: at
// T = 16384 that was half the time of a long check (1.3·10⁸ scores a causal head, ~12 ns each in float and in
// double). The streamed forward, the streaming oracle and the streamed backward (compiled once per instruction
// set) modify a tile at once here: the same operations in the same order (s/cap, tanh, cap·t, then ALiBi's
// slope·(j - p), the bias, ln n), with tanh on packets of doubles.
//
// Eigen vectorises tanh in float only, and to 4.9 u·|x| (measured over every float in [2⁻³⁰, 16]), past the
// share tolerance.cpp step 7 gives it: the softcap's division, tanh and product together within 5u_a·|s_raw|, so
// tanh within 3u_a·|x| (the division's u_a·|x| passes through tanh' ≤ 1, the product adds u_a·|cap·t| ≤
// u_a·|s_raw|). tanh_in_place is Cephes' form (S. L. Moshier's tanh.c and tanhf.c): x + x·z·R(z) (z = x²) for
// |x| < 0.625, 1 - 2/(e^{2|x|} + 1) above, the sign restored. In double, R is a rational function: within 2.5 ulp
// relative (tile_modifiers_test measures it against long double), for the float64 oracle. In float, R is a
// polynomial of degree 4 and e^{2|x|} Eigen's float exp: within 2.16 u_f·|x| over every float in [2⁻³⁰, 20] (at
// 0.6254, measured exhaustively on the generic, x86-64-v3 and x86-64-v4 copies' instruction sets), inside the
// share, at a tenth of the double's cost. Every element of a row, its tail included, goes through the same packet
// code, so a score's value does not depend on where in its tile it sits (the exact laws compare calls that tile a
// row differently).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>

#include "attncheck/attention.hpp"

namespace attncheck::detail {

/// tanh of x[0..n) in place, in double (see above). NaN stays NaN, ±inf gives ±1, -0 stays -0.
inline void tanh_in_place(double* x, Index n) {
  namespace ei = Eigen::internal;
  using P = ei::packet_traits<double>::type;
  constexpr Index kWidth = ei::packet_traits<double>::size;
  // Cephes' tanh.c (S. L. Moshier): the rational part for |x| < 0.625, relative error 2.5e-16 peak there.
  const P p0 = ei::pset1<P>(-9.64399179425052238628e-1), p1 = ei::pset1<P>(-9.92877231001918586564e1),
          p2 = ei::pset1<P>(-1.61468768441708447952e3);
  const P q0 = ei::pset1<P>(1.12811678491632931402e2), q1 = ei::pset1<P>(2.23548839060100448583e3),
          q2 = ei::pset1<P>(4.84406305325125486048e3);
  const P one = ei::pset1<P>(1.0), two = ei::pset1<P>(2.0), split = ei::pset1<P>(0.625), sign_bit = ei::pset1<P>(-0.0);
  const auto packet = [&](const P& a) {
    const P ax = ei::pabs(a);
    // |x| >= 0.625: 1 - 2/(e^{2|x|} + 1) (e^{2|x|} = inf past 354 gives exactly 1).
    const P e = ei::pexp(ei::padd(ax, ax));
    const P big = ei::psub(one, ei::pdiv(two, ei::padd(e, one)));
    // |x| < 0.625: |x| + |x|·z·P(z)/Q(z), Q monic of degree 3.
    const P z = ei::pmul(ax, ax);
    const P num = ei::padd(ei::pmul(ei::padd(ei::pmul(p0, z), p1), z), p2);
    const P den = ei::padd(ei::pmul(ei::padd(ei::pmul(ei::padd(z, q0), z), q1), z), q2);
    const P small = ei::padd(ax, ei::pmul(ei::pmul(ax, z), ei::pdiv(num, den)));
    const P t = ei::pselect(ei::pcmp_lt(ax, split), small, big);
    return ei::por(t, ei::pand(a, sign_bit));  // tanh is odd (a NaN's sign is harmless)
  };
  Index i = 0;
  for (; i + kWidth <= n; i += kWidth) ei::pstoreu(x + i, packet(ei::ploadu<P>(x + i)));
  if (i < n) {  // the tail through the same code: padded to a whole packet
    double tail[kWidth] = {};
    std::copy(x + i, x + n, tail);
    ei::pstoreu(tail, packet(ei::ploadu<P>(tail)));
    std::copy(tail, tail + (n - i), x + i);
  }
}

/// tanh of x[0..n) in place, in float (see above). NaN stays NaN, ±inf gives ±1, -0 stays -0.
inline void tanh_in_place(float* x, Index n) {
  namespace ei = Eigen::internal;
  using P = ei::packet_traits<float>::type;
  constexpr Index kWidth = ei::packet_traits<float>::size;
  // Cephes' tanhf.c: the polynomial part for |x| < 0.625.
  const P r0 = ei::pset1<P>(-5.70498872745e-3f), r1 = ei::pset1<P>(2.06390887954e-2f),
          r2 = ei::pset1<P>(-5.37397155531e-2f), r3 = ei::pset1<P>(1.33314422036e-1f),
          r4 = ei::pset1<P>(-3.33332819422e-1f);
  const P one = ei::pset1<P>(1.0f), two = ei::pset1<P>(2.0f), split = ei::pset1<P>(0.625f),
          sign_bit = ei::pset1<P>(-0.0f);
  const auto packet = [&](const P& a) {
    const P ax = ei::pabs(a);
    const P e = ei::pexp(ei::padd(ax, ax));  // inf past 44: exactly 1 below
    const P big = ei::psub(one, ei::pdiv(two, ei::padd(e, one)));
    const P z = ei::pmul(ax, ax);
    P poly = ei::padd(ei::pmul(r0, z), r1);
    poly = ei::padd(ei::pmul(poly, z), r2);
    poly = ei::padd(ei::pmul(poly, z), r3);
    poly = ei::padd(ei::pmul(poly, z), r4);
    const P small = ei::padd(ax, ei::pmul(ei::pmul(ax, z), poly));
    const P t = ei::pselect(ei::pcmp_lt(ax, split), small, big);
    return ei::por(t, ei::pand(a, sign_bit));
  };
  Index i = 0;
  for (; i + kWidth <= n; i += kWidth) ei::pstoreu(x + i, packet(ei::ploadu<P>(x + i)));
  if (i < n) {
    float tail[kWidth] = {};
    std::copy(x + i, x + n, tail);
    ei::pstoreu(tail, packet(ei::ploadu<P>(tail)));
    std::copy(tail, tail + (n - i), x + i);
  }
}

/// tanh over a row-major tile in place, element by element as tanh_in_place in the tile's own type.
template <class A, class Tile>
void tanh_tile(Tile& t) {
  tanh_in_place(t.data(), t.size());
}

/// The modified scores of a row-major tile of rows i0.. and keys j0.. (modified_score on each, softcap through
/// tanh_in_place): s = cap·tanh(s/cap), then + slope·(j - p), + the bias, + ln n, each in the accumulation type A.
/// With a softcap, `tanh_out` (when not null) receives tanh(s_raw/cap) (the backward's derivative reads it).
template <class A, class Tile>
void modify_tile(Tile& s, const HeadModifiers& m, Index i0, Index j0, Tile* tanh_out = nullptr) {
  const Index n = s.rows(), w = s.cols();
  if (m.softcap) {
    const A cap = static_cast<A>(*m.softcap);
    s /= cap;
    tanh_tile<A>(s);
    if (tanh_out) *tanh_out = s;
    s *= cap;
  }
  if (m.alibi_slope != 0) {
    const A slope = static_cast<A>(m.alibi_slope);
    for (Index r = 0; r < n; ++r) {
      if (m.rows.depths) {  // a tree: distances between places, not positions
        for (Index c = 0; c < w; ++c) s(r, c) += slope * static_cast<A>(m.alibi_distance(i0 + r, j0 + c));
        continue;
      }
      const Index d0 = j0 - m.position(i0 + r);  // j - p for j = j0..: exact integers, then cast as modified_score
      s.row(r) += slope * Eigen::Array<Index, 1, Eigen::Dynamic>::LinSpaced(w, d0, d0 + w - 1).template cast<A>();
    }
  }
  if (m.bias)
    for (Index r = 0; r < n; ++r)
      s.row(r) += Eigen::Map<const Eigen::Array<double, 1, Eigen::Dynamic>>(m.bias + (i0 + r) * m.bias_cols + j0, w)
                      .template cast<A>();
  if (m.counted)
    for (Index r = 0; r < n; ++r)
      for (Index c = 0; c < w; ++c) s(r, c) += static_cast<A>(m.log_count(i0 + r, j0 + c));
}

}  // namespace attncheck::detail
