// The source card's exercise as a program: every step's shape, the intermediate values, and the three
// structural checks (rows sum to 1, future weights are 0, an extreme future token changes no earlier output).
#include "demo.hpp"

#include <cmath>
#include <cstring>
#include <iomanip>

#include "attncheck/attention.hpp"

namespace attncheck::cli {
namespace {

template <class M> void print_matrix(std::ostream& out, const char* name, const M& m) {
  out << "  " << name << " " << shape_string(m.rows(), m.cols()) << "\n";
  for (Index i = 0; i < m.rows(); ++i) {
    out << "    ";
    for (Index j = 0; j < m.cols(); ++j) out << std::setw(10) << std::fixed << std::setprecision(5) << double(m(i, j));
    out << "\n";
  }
}

}  // namespace

int run_demo(std::ostream& out) {
  // X [T=3, C=3]; W_q = W_k pick the first two channels, W_v mixes all three.
  Matrix<double> x(3, 3), w_q(3, 2), w_v(3, 2);
  x << 1, 0, 0, 0, 1, 0, 1, 1, 1;
  w_q << 1, 0, 0, 1, 0, 0;
  w_v << 1, 2, 3, 4, 5, 6;
  const auto p = single_head_attention(x, w_q, w_q, w_v);

  out << "Scaled causal attention, single head, T=3, d=2 (the source card's exercise)\n\n";
  out << "step                      shape\n";
  out << "X                         " << shape_string(x.rows(), x.cols()) << "   [T,C]\n";
  out << "W_q, W_k, W_v             " << shape_string(w_q.rows(), w_q.cols()) << "   [C,d]\n";
  out << "Q, K, V = X W             " << shape_string(p.Q.rows(), p.Q.cols()) << "   [T,d]\n";
  out << "scores = Q Kᵀ / √d        " << shape_string(p.head.scores.rows(), p.head.scores.cols()) << "   [T,T]\n";
  out << "weights = softmax(masked) " << shape_string(p.head.weights.rows(), p.head.weights.cols())
      << "   [T,T], softmax over keys\n";
  out << "output = weights V        " << shape_string(p.head.output.rows(), p.head.output.cols()) << "   [T,d]\n\n";
  print_matrix(out, "scores", p.head.scores);
  print_matrix(out, "weights", p.head.weights);
  print_matrix(out, "output", p.head.output);

  // 1. Every row of weights sums to 1 (within a few roundings: 8u for three terms).
  double worst_sum = 0;
  for (Index i = 0; i < 3; ++i) worst_sum = std::max(worst_sum, std::abs(p.head.weights.row(i).sum() - 1));
  const bool rows_ok = worst_sum <= 8 * std::ldexp(1.0, -53);
  // 2. Future weights are exactly 0.
  bool future_ok = true;
  for (Index i = 0; i < 3; ++i)
    for (Index j = i + 1; j < 3; ++j) future_ok = future_ok && p.head.weights(i, j) == 0.0;
  // 3. An extreme last token changes nothing at positions 0 and 1 (bit for bit).
  Matrix<double> x2 = x;
  x2.row(2).setConstant(1e300);
  const auto p2 = single_head_attention(x2, w_q, w_q, w_v);
  const bool past_ok = std::memcmp(p.head.output.data(), p2.head.output.data(), 2 * 2 * sizeof(double)) == 0;

  out << "\ninvariant                                        result\n";
  out << "1. every row of weights sums to 1                " << (rows_ok ? "holds" : "FAILS")
      << " (worst |sum - 1| = " << std::scientific << std::setprecision(1) << worst_sum << ")\n";
  out << "2. future weights are exactly 0                  " << (future_ok ? "holds" : "FAILS") << "\n";
  out << "3. last token set to 1e300: outputs 0..1 same    " << (past_ok ? "holds (bit-identical)" : "FAILS") << "\n";
  return rows_ok && future_ok && past_ok ? 0 : 1;
}

}  // namespace attncheck::cli
