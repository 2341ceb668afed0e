// Derived error bounds for comparing an attention result at some dtype with the float64 oracle. Every bound
// is a function of the dtype, T, D and the inputs' magnitudes; the derivation is in tolerance.cpp.
#pragma once

#include "attncheck/attention.hpp"
#include "attncheck/dtype.hpp"
#include "attncheck/mask.hpp"
#include "attncheck/tensor.hpp"

namespace attncheck {

/// γ_n = n·u / (1 - n·u): the relative error bound of an n-term floating-point sum or dot product.
double gamma(Index n, double u);

/// The dtype's smallest normal number (2^-14 for float16, 2^-126 for bfloat16 and float32, 2^-1022 for float64).
double smallest_normal(DType dtype);

/// How far a correct kernel's stored result may be from the exact one near 0, absolutely: the dtype's smallest
/// normal, as a flush-to-zero kernel (-Ofast, -ffast-math, GPU ftz) returns 0 for any result below it. With
/// gradual underflow it would be half the subnormal spacing, which is smaller (tolerance.cpp, step 4).
double storage_floor(DType dtype);

/// λ: the error a rounded log-sum-exp puts into every exponent of a row whose largest visible |score| is
/// `abs_score` over `n_vis` keys, 10·u_a·(abs_score + ln n_vis) (tolerance.cpp, step 2b): split-KV merges
/// exp(lse_c - lse) and weights recomputed as exp(s - lse) move every weight of the row by a factor within
/// e^{±λ}, and its row sum with them. 0 for a row that sees no key.
double lse_exponent_error(DType dtype, double abs_score, Index n_vis);

/// Per query row, an upper bound on max_j |s_ij| over the keys it sees by Cauchy-Schwarz,
/// scale·‖q_i‖·max_{j visible}‖k_j‖, in O(T·D) (0 for a row that sees no key).
Eigen::VectorXd row_score_bound(const Matrix<double>& q, const Matrix<double>& k, const Visibility& vis,
                                double scale);

/// Unit roundoff of the type a dtype accumulates in (float for float32/float16/bfloat16, double for float64).
double accumulation_roundoff(DType dtype);

/// Per query row of one head, the relative error ρ_i = exp(2Δ_i + λ_i + γ_T + 5u_a) - 1 a correct kernel at `dtype`
/// may have in every weight of the row (steps 1-2 of tolerance.cpp): +inf where the dtype cannot resolve the
/// softmax at all, 0 for a row that sees no key.
/// `exponents`, when given, gets each row's 2Δ_i + λ_i + γ_T + 5u_a (finite where ρ_i overflows), for lse_tolerance.
Eigen::VectorXd weight_relative_error(DType dtype, const Matrix<double>& q, const Matrix<double>& k,
                                      const BoolMask& mask, double scale, const HeadModifiers& mods = {},
                                      Eigen::VectorXd* exponents = nullptr);

/// What weight_relative_error reads of one query row, over the keys it sees: max scale·Σ_c|q_c k_c| (abs_dot),
/// max |s_raw| (raw_max), max of |s_raw|, |modified s| and |sink| (s_max; a finite sink counts even with no key),
/// max |ALiBi bias| (bias_max), and how many keys it sees (n_vis).
struct RowScoreStats {
  double abs_dot = 0, raw_max = 0, s_max = 0, bias_max = 0;
  /// The largest score error a flush-to-zero kernel makes by flushing scale·q_ic or scale·k_jc (tolerance.cpp step
  /// 4b): 0 unless an input lies within a factor 1/scale of the subnormal range. Not collected by the streamed paths.
  double flushed = 0;
  Index n_vis = 0;
  /// q holds a folded temperature (HeadModifiers::tempered): the folding's roundings (tolerance.cpp step 8).
  bool tempered = false;
  /// The score error of a kernel's own rotation of q and k (tolerance.cpp step 9); 0 without a rope.
  double rope = 0;
  /// The score error of a kernel's own QK-norm (tolerance.cpp step 10); 0 without one.
  double qk_norm = 0;
  /// The score error of a kernel's own dequantisation of K (tolerance.cpp step 12); 0 without a quantised cache.
  double dequant = 0;
};
/// weight_relative_error's ρ_i of one row from its statistics (`sink`: the head has a finite sink; `softcap`: a
/// softcap applies), for callers that stream the scores instead of materialising them: 0 when n_vis is 0.
double row_weight_relative_error(DType dtype, Index D, const RowScoreStats& row, bool sink, bool softcap,
                                 double* exponent = nullptr);

/// Flushes, in place, every entry of x that is subnormal in the type `dtype` accumulates in (what DAZ reads
/// as 0): |x| < 2^-126 for float32/float16/bfloat16, 2^-1022 for float64. True when one was flushed.
bool daz_inputs(DType dtype, Matrix<double>& x);

/// Allowed |actual - oracle| for one head, element by element, for a kernel at `dtype` that accumulates in
/// float (double for float64) and received the same (already rounded) inputs as the oracle.
struct HeadTolerance {
  Matrix<double> output;   ///< [T_q,D]
  Matrix<double> weights;  ///< [T_q,T_k]
};

/// `safety` multiplies the first-order bound (2 by default: the bound is first order in u, and exp's error
/// is only known to be a few ulp). Inputs subnormal in the accumulation type widen it to cover a DAZ kernel.
HeadTolerance head_tolerance(DType dtype, const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v,
                             const BoolMask& mask, double scale, const Matrix<double>& oracle_output,
                             const Matrix<double>& oracle_weights, double safety = 2.0,
                             const HeadModifiers& mods = {});

/// Allowed |lse - oracle lse| on one query row (tolerance.cpp, step 6) whose relative weight error is ρ_w
/// (weight_relative_error, streamed_output_tolerance): 0 for a row whose oracle LSE is -inf (it must be -inf).
/// `exponent`: the row's from weight_relative_error, which bounds the LSE where ρ_w overflows and the scores are
/// unresolved by more than the LSE's own size (0: not known, the saturated bound alone).
double lse_tolerance(DType dtype, double rho_w, double oracle_lse, double safety = 2.0, double exponent = 0);

/// Per row i and column c, the smallest and largest v[j,c] over the keys row i sees (0 for a row that sees
/// none), in O(T·D) with one monotone queue per column: visible runs only move right as i grows.
struct VisibleRange {
  Matrix<double> min, max;  ///< [T_q,D]
};
VisibleRange visible_value_range(const Matrix<double>& v, const Visibility& vis);

/// The output part of head_tolerance without any [T_q,T_k] matrix, for long contexts: the same bound from each
/// row's largest scale·Σ|q·k| (`abs_dot`) and |s| (`abs_score`) over its visible keys, which the streaming
/// oracle's RowStats carry. `rho_w` receives each row's relative weight error ρ_w (+inf where the dtype
/// cannot resolve the row's softmax), for weight_tolerance on sampled weights. D_k is Q's and K's head dimension
/// (the scores'), v [T_k,D_v] the head's values.
Matrix<double> streamed_output_tolerance(DType dtype, Index D_k, const Matrix<double>& v, const Visibility& vis,
                                         const Eigen::VectorXd& abs_dot, const Eigen::VectorXd& abs_score,
                                         const Matrix<double>& oracle_output, Eigen::VectorXd* rho_w,
                                         double safety = 2.0, const HeadModifiers& mods = {});

/// ε_n of tolerance.cpp step 10: each element of a row a kernel normalises (QK-norm over D dims) errs by at most
/// ε_n times itself, ε_n = γ_D(u_f)/2 + 5u_f + 2u_s (the norm in float, u_f = 2^-24).
double qk_norm_error(DType dtype, Index D);
/// Step 10's score error of a row whose largest scale·Σ|q'_c k'_c| is abs_dot: (ε_q + ε_k)·abs_dot over the
/// normalised sides.
double qk_norm_score_error(DType dtype, Index D, const QkNorm& norm, double abs_dot);

/// ε(pos) of tolerance.cpp step 9: each element of a pair a kernel rotates at position pos errs by at most
/// ε·(|x_a| + |x_b|), ε = 5u_f·max|θ(pos)| + 2u_f + 2u_a + 3u_s (u_f float's: the angle, cos and sin in float).
double rope_rotation_error(DType dtype, const Rope& rope, Index pos);

/// Allowed |actual - oracle| on one visible weight whose oracle value is w, in a row with relative error
/// ρ_w (head_tolerance's weight bound, element by element).
double weight_tolerance(DType dtype, double w, double rho_w, double safety = 2.0);

}  // namespace attncheck
