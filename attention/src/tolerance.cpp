// Error bounds for attention at a given dtype against the float64 oracle.
//
// Notation: u_a is the unit roundoff of the accumulation type (float for float32/float16/bfloat16, double for
// float64), u_s that of the storage dtype, γ_n = n·u_a/(1 - n·u_a). Row i, visible keys j, T_vis of them.
//
// 1. Scores. s_ij = scale·Σ_c q_ic k_jc over D terms: |δs_ij| ≤ γ_D·scale·Σ_c |q_ic k_jc| (dot product), plus
//    u_a·|s_ij| each for rounding the scale and the multiply, plus u_a·|s_ij - m_i| ≤ 2u_a·max|s| for
//    subtracting the row max, plus u_s·|s_ij| when the kernel stores the scores in the dtype between steps
//    (PyTorch's math path does: its QKᵀ is a dtype tensor), plus 2u_s·scale·Σ_c|q_ic k_jc| when it scales q
//    (or q and k) in the dtype before the product (as `q / sqrt(D)` does). So
//    Δ_i = max_j [(γ_D + 2u_s)·scale·Σ_c|q_ic k_jc|] + (4·u_a + u_s)·max_j|s_ij|  (u_s terms: not for float64).
// 2. Softmax. Perturbing every exponent by at most Δ moves each weight by a factor within e^{±2Δ}. exp itself
//    is accurate to a few ulp (4u_a budgeted), the T_vis-term sum adds γ_T relative, the division u_a. So
//    |w̃_ij - w_ij| ≤ w_ij·ρ_i with ρ_i = exp(2Δ_i + γ_T + 5u_a) - 1, and the weights are rounded to the dtype
//    (returned, or stored before the product with V): + u_s·w_ij.
// 3. Output. o_i = Σ_j w_ij v_j: |δo_ic| ≤ Σ_j |δw_ij||v_jc| + γ_T·Σ_j w̃_ij|v_jc|
//    ≤ max_j|v_jc|·(ρ_i + u_s + γ_T·(1 + ρ_i + u_s)), then rounding to the dtype: + u_s·|o_ic|.
// 4. Floors. Eigen's vectorised float exp returns about 2^-128 instead of a denormal for arguments below -87.3:
//    an absolute error of at most 2^-126 per weight, hence T_vis·2^-126·max|v| on an output. Rounding into the
//    dtype's subnormal range is absolute, not relative: half the smallest subnormal (2^-25 for float16,
//    2^-134 for bfloat16, 2^-150 for float32) on every stored weight and output.
// 5. Saturation. When Δ is large (scores ~1e10 in float), ρ overflows: the dtype cannot resolve the softmax at
//    all. Weights still lie in [0, 1] and outputs in the hull of the visible values, so a weight is off by at
//    most 1 (the weight bound is capped at 1, and is 1 where ρ overflows, which keeps 0·∞ out of it) and an
//    output by at most 2·max|v| (ρ is capped at 2 in the output bound). Capping ρ itself at 2 in the weight
//    bound would be wrong: with identical keys at |s| ~ 1e8, float32 rounds one score of a row differently and
//    that key takes 0.87 of the weight where the oracle gives each of 9 keys 1/9.
// The whole first-order bound is multiplied by `safety`.
#include "attncheck/tolerance.hpp"

#include <algorithm>
#include <cmath>

namespace attncheck {

double gamma(Index n, double u) {
  const double nu = static_cast<double>(n) * u;
  return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

double storage_floor(DType dtype) {
  switch (dtype) {
    case DType::f16: return std::ldexp(1.0, -25);
    case DType::bf16: return std::ldexp(1.0, -134);
    case DType::f32: return std::ldexp(1.0, -150);
    case DType::f64: break;
  }
  return 0.0;
}

double accumulation_roundoff(DType dtype) {
  return dtype == DType::f64 ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
}

HeadTolerance head_tolerance(DType dtype, const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v,
                             const BoolMask& mask, double scale, const Matrix<double>& oracle_output,
                             const Matrix<double>& oracle_weights, double safety) {
  const double u_s = unit_roundoff(dtype);
  const double u_a = accumulation_roundoff(dtype);
  const double tiny = dtype == DType::f64 ? 0.0 : std::ldexp(1.0, -126);
  const double store_floor = storage_floor(dtype);
  const Index T_q = q.rows(), T_k = k.rows(), D = q.cols();
  const double g_D = gamma(D, u_a);
  const double pre_scale = dtype == DType::f64 ? 0.0 : 2 * u_s;  // q (and k) scaled in the dtype first
  const Matrix<double> abs_qk = q.cwiseAbs() * k.cwiseAbs().transpose() * scale;  // Σ_c |q_ic k_jc|·scale
  const Matrix<double> s = q * k.transpose() * scale;

  HeadTolerance tol{Matrix<double>::Zero(T_q, D), Matrix<double>::Zero(T_q, T_k)};
  for (Index i = 0; i < T_q; ++i) {
    double dot_err = 0, s_max = 0, v_max = 0;
    Index n_vis = 0;
    Eigen::RowVectorXd v_col_max = Eigen::RowVectorXd::Zero(D);
    for (Index j = 0; j < T_k; ++j) {
      if (!mask.visible(i, j)) continue;
      ++n_vis;
      dot_err = std::max(dot_err, (g_D + pre_scale) * abs_qk(i, j));
      s_max = std::max(s_max, std::abs(s(i, j)));
      v_col_max = v_col_max.cwiseMax(v.row(j).cwiseAbs());
    }
    if (n_vis == 0) continue;  // the row is exactly zero in every correct kernel
    v_max = v_col_max.maxCoeff();
    const double delta = dot_err + (4 * u_a + u_s) * s_max;
    const double g_T = gamma(n_vis, u_a);
    const double rho_w = std::expm1(2 * delta + g_T + 5 * u_a);  // may be +inf: the weights are unresolved
    const double rho = std::min(rho_w, 2.0);
    for (Index j = 0; j < T_k; ++j)
      if (mask.visible(i, j))
        tol.weights(i, j) = (std::isinf(rho_w) ? 1.0
                                               : std::min(1.0, safety * (oracle_weights(i, j) * rho_w +
                                                                         u_s * oracle_weights(i, j)))) +
                            tiny + store_floor;
    for (Index c = 0; c < D; ++c)
      tol.output(i, c) =
          safety * (v_col_max(c) * std::min(rho + u_s + g_T * (1 + rho + u_s), 2.0) + u_s * std::abs(oracle_output(i, c))) +
          static_cast<double>(n_vis) * tiny * v_max + store_floor;
  }
  return tol;
}

}  // namespace attncheck
