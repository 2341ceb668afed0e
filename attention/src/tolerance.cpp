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
//    |w̃_ij - w_ij| ≤ w_ij·ρ_i with ρ_i = exp(2Δ_i + λ_i + γ_T + 5u_a) - 1 (λ_i: step 2b), and the weights are
//    rounded to the dtype (returned, or stored before the product with V): + u_s·w_ij.
// 2b. A rounded log-sum-exp. Split-KV and tiled kernels normalise by a log-sum-exp held in the accumulation
//    type: FlashAttention's split-KV decode merges partial results with exp(L_c - L) (L_c the LSE of the keys
//    of split c, L = log Σ_c exp(L_c)), its backward recomputes weights as exp(s - L). Every |L_c| and |L| is at
//    most Λ_i := max_j|s_ij| + ln T_vis (an LSE lies between its largest term and that plus the log of the
//    count). Each L_c = m_c + log(l_c) is off by u_a·|L_c| (the sum's rounding) + u_a·ln T_vis (log's own
//    ulp, on a value ≤ ln T_vis), so ≤ 2u_a·Λ_i; L inherits the largest of those and adds its own two roundings,
//    ≤ 3u_a·Λ_i; the difference L_c - L (|L_c - L| ≤ 2Λ_i) rounds by 2u_a·Λ_i; a base-2 kernel (exp2 of
//    (L_c - L)·log2 e) rounds that product by another u_a·|L_c - L| ≤ 2u_a·Λ_i, in natural units: 9·u_a·Λ_i
//    in all (a backward's exp(s - L): L's 2u_a·Λ_i, s - L's rounding 2u_a·Λ_i, base 2 another 2u_a·Λ_i, less),
//    budgeted as λ_i = 10·u_a·Λ_i. It is the same shift for every weight of the row, so unlike step 2's score
//    errors (which a max-subtracted softmax renormalises away) it moves the row's sum by a factor within
//    e^{±λ_i} too: NUMERICS.md's correct row sum of 1 - 2e-4 at |lse| ≈ 4,000 in float32 is within λ = 2.4e-3.
// 3. Output. o_i = Σ_j w_ij v_j: |δo_ic| ≤ Σ_j |δw_ij||v_jc| + γ_T·Σ_j w̃_ij|v_jc|
//    ≤ max_j|v_jc|·(ρ_i + u_s + γ_T·(1 + ρ_i + u_s)), then rounding to the dtype: + u_s·|o_ic|.
// 4. Floors. Eigen's vectorised float exp returns about 2^-128 instead of a denormal for arguments below -87.3:
//    an absolute error of at most 2^-126 per weight, hence T_vis·2^-126·max|v| on an output. Its double exp
//    does the same below -708.4, at 2^-1022 (a correct float64 kernel returned 5.1e-309 for exp(-717.5) =
//    2.3e-312): the float64 floor is 2^-1022. Flush-to-zero: a kernel built with -Ofast or -ffast-math (FTZ and
//    DAZ for the whole process), or a GPU kernel compiled with ftz, returns 0 for any result below the smallest
//    normal N of its type, and reads any such input or intermediate as 0: an absolute error below N_a (2^-126
//    in float, 2^-1022 in double) on every weight (the 2^-126 above already), on each of the T_vis products
//    w_ij·v_jc and on each of the T_vis partial sums, hence 2·T_vis·N_a more on an output; and storing a
//    result in the dtype is off by up to the dtype's N_s absolutely (storage_floor: 2^-14 for float16, 2^-126
//    for bfloat16 and float32, 2^-1022 for float64), on every stored weight and output. This replaces gradual
//    underflow's half-subnormal-spacing (2^-25, 2^-134, 2^-150, 0), which is smaller and would call a correct
//    FTZ kernel wrong. An input that is itself subnormal in the accumulation type (DAZ reads it as 0) is
//    handled in head_tolerance by the oracle on the flushed inputs (daz_inputs).
// 4b. A flushed intermediate times what it multiplies. In a product of several factors a kernel may form any
//    partial product first, and under FTZ a partial below N_a is 0, and so is the whole term: an error below N_a
//    times the factors not yet applied (never more than the term itself, which vanishes). A floor on subnormal
//    results alone misses those factors (backward.cpp step 9b: a flushed scale·dS times |q| in dK). The forward's
//    products: (a) the output's terms w_ij·v_jc, whatever the order (e_ij·v_jc summed and divided by l_i after,
//    rescaled by exp(m_old - m_new) or exp(L_c - L)): every factor after a flushed partial is 1/l_i ≤ 1, a rescale
//    ≤ 1, or v_jc, so a term errs by at most N_a·max(1, |v_jc|) and a flushed running sum or accumulator by N_a
//    times at most T_vis·max|v| (rescaled only by factors ≤ 1): step 4's T_vis·N_a·(max|v| + 2) holds it. (b) The
//    scores' terms scale·q_ic·k_jc (times log2 e in a base-2 kernel): a flushed q_ic·k_jc errs by scale·N_a·log2 e
//    on the score, relatively far below step 1's 4u_a; but a flushed scale·q_ic (or scale·log2e·q_ic, or the same
//    with k_jc) drops the whole term scale·q_ic·k_jc, which may be far above N_a when |k_jc| is large. Such a
//    partial is below N_a only for an input with |q_ic|·scale < N_a (log2 e > 1 only raises the partial), so the
//    score s_ij errs by at most φ_ij = scale·Σ_c |q_ic||k_jc| over the c where |q_ic|·scale < N_a or
//    |k_jc|·scale < N_a, and step 1's Δ_i grows by max_j φ_ij (a score error like any other). The generators never
//    draw such inputs (their magnitudes start at 1e-3); a stored case may hold them. Inputs below N_a themselves
//    (DAZ) are the flushed problem's, below.
// 5. Saturation. When Δ is large (scores ~1e10 in float), ρ overflows: the dtype cannot resolve the softmax at
//    all. Weights still lie in [0, 1] and outputs in the hull of the visible values, so a weight is off by at
//    most 1 (the weight bound is capped at 1, and is 1 where ρ overflows, which keeps 0·∞ out of it) and an
//    output by at most 2·max|v| (ρ is capped at 2 in the output bound). Capping ρ itself at 2 in the weight
//    bound would be wrong: with identical keys at |s| ~ 1e8, float32 rounds one score of a row differently and
//    that key takes 0.87 of the weight where the oracle gives each of 9 keys 1/9.
// 6. Log-sum-exp. lse_i = log(Σ_j exp(s_ij) [+ exp(σ)]): perturbing every exponent by at most Δ_i moves it by at
//    most Δ_i, the sum's rounding by log(1 + γ_T) ≤ γ_T, exp's ulps by 4u_a, and forming m + log l in the
//    accumulation type by step 2b's 2u_a·Λ_i ≤ λ_i: |δlse_i| ≤ 2Δ_i + λ_i + γ_T + 5u_a = log(1 + ρ_i). Where ρ_i
//    overflows (step 5) the LSE still lies in [max s, max s + ln T], and a kernel's in its own such interval:
//    off by at most max(1, |lse|) + ln T, taken as max(1, |lse|)·2, where its scores are near the oracle's; where
//    they are not (Δ_i past |lse|: a coarse declared rounding, step 12b), the LSE is 1-Lipschitz in the scores'
//    largest change and moves by at most Δ_i and the roundings above, which 2Δ_i + λ_i + γ_T + 5u_a (ρ_i's exponent,
//    finite where ρ_i is not) holds: the larger of the two. A row that sees no key (and no sink) has
//    lse = -inf exactly. Plus u_a·|lse| for storing it.
// 7. Modifiers (HeadModifiers). Softcap s = cap·tanh(s_raw/cap) has derivative ≤ 1, so step 1's error in s_raw
//    passes through at most as large; tanh to a few ulp, the division and the product add ≤ 5u_a·|s_raw|. ALiBi
//    adds b = slope·(j - p): the slope rounded to the accumulation type and the product, 2u_a·|b|, and the sum
//    (covered by the 4u_a·max|s| of step 1, taken over the larger of |s_raw| and the modified |s|). An additive
//    bias b_ij (AttentionOptions::bias) holds values of the call's dtype, exact in the accumulation type: only its
//    sum, covered the same way (max|s| then over |s_raw| ≤ scale·Σ|q||k| and the modified |s|). A sink σ is
//    one more softmax term: its rounding u_a·|σ| (in max|s|), and T_vis + 1 terms in γ_T and λ. A key an index list
//    names n times where duplicates count (IndexList::counted) weighs n·e^s, the score plus ln n: ln n rounded to
//    the accumulation type, u_a·ln n, and the sum, within the 4u_a·max|s| of step 1 (the larger of |s_raw| and
//    |s_raw + ln n| is at least ln n / 2). A kernel may instead multiply e^(s - m) by n (one more rounding, u_a
//    relative, as ln n's) or add the key's term n times: T_vis counts each key as often as its row lists it.
// 8. Temperature. s_ij = scale·(q_i·k_j)/τ_i is attention on q'_i = q_i/τ_i, and the bound above is taken on q'
//    (every entry point folds it: fold_temperature), so it already holds for a kernel that rounds nothing more.
//    A kernel may fold τ in its own way, each one rounding more: (a) q·(1/τ) in the dtype (τ or 1/τ rounded to
//    the dtype, the quotient, the product: u_s each), or q/τ rounded once as the reference does; (b) the score
//    divided by τ in the accumulation type, or τ folded into the scale (τ rounded, the division: u_a·|s| each).
//    (a) errs on each q'_ic by at most 3u_s relative, so on s_ij by 3u_s·scale·Σ_c|q'_ic k_jc| (the oracle's own
//    q/τ in double, 2^-53 relative, inside it); (b) by 2u_a·|s_ij|. Δ_i grows by their sum, 3u_s·max(abs_dot) +
//    2u_a·max|s|, with abs_dot and s those of q'.
// 9. Rotary position embeddings. The bound is taken on q' = R_q q and k' = R_k k, rotated in double from the
//    declared frequencies; a kernel rotates in its own arithmetic. Its angle pos/factor·base^(-2m/r) rounds (the
//    frequency's pow to a few ulp, the position and the product: 5u_f·|θ|, which grows with the position) and cos and
//    sin round (2u_f), in float whatever the dtype (u_f = 2^-24: Hugging Face's rotary embedding computes inv_freq,
//    the angles, cos and sin in float32 even for a float64 model); cos and sin may be stored in the dtype (u_s, as
//    its caches are) and x_a·cos - x_b·sin rounds its two products and its sum in the dtype or the accumulation type
//    (2u_a + 2u_s, whichever it is): each element of a rotated pair errs by at most ε(pos)·(|x_a| + |x_b|),
//    ε(pos) = 5u_f·max_m|θ_m(pos)| + 2u_f + 2u_a + 3u_s (rope_rotation_error). On a score,
//    Σ_c |δq'_c||k'_c| ≤ ε_q Σ_pairs (|q_a| + |q_b|)(|k'_a| + |k'_b|) ≤ 2ε_q Σ_pairs ‖q_p‖‖k'_p‖ ≤ 2ε_q‖q'‖‖k'‖
//    (a rotation keeps each pair's norm; Cauchy-Schwarz twice), and the same for k: Δ_i grows by
//    2(ε_q,i + max_j ε_k,j)·scale·‖q'_i‖·max_j‖k'_j‖ over the visible keys j (first order).
// 9b. A scaled rope's frequencies. NTK-aware scaling computes base·factor^(r/(r-2)) (a pow, its exponent's quotient and
//    the product: 3u_f relative on the base) before base^(-2m/r), whose relative error is |2m/r| <= 1 times the base's:
//    3u_f more on ω'_m. Llama 3's takes the wavelength 2π/ω_m (2u_f), the band's smoothing factor s = (L/λ_m -
//    l)/(h - l) (its quotient, difference and division, 3u_f relative on L/λ_m <= h, so |δs| <= 5u_f·h/(h - l) with the
//    wavelength's) and the blend (1 - s)·ω/f + s·ω (three products and a sum, 4u_f relative), with |δs|·|ω - ω/f| <=
//    |δs|·ω: for Llama 3.1's h/(h - l) = 4/3, 7u_f + 4u_f, and (its h and l as drawn) at most 11u_f·max(1, h/(h - l))
//    relative on ω'_m. The piecewise rule is continuous at the band's edges (s = 0 gives ω/f, s = 1 gives ω), so a
//    kernel that rounds λ_m to the other side of an edge errs by as little. Either way θ errs by that much more:
//    ε(pos) grows by κ·u_f·|θ|, κ = 3 (ntk) or 11·max(1, h/(h - l)) (llama3) (rope_rotation_error).
// 10. QK-norm. The bound is taken on y = w ⊙ x / r for the normalised side(s), computed in double. A kernel's mean of
//    squares errs by γ_D relative (its square root by half that), the eps's sum, the root, the division and the
//    weight's product by a unit roundoff each, in float whatever the dtype (an RMSNorm layer computes in float32:
//    Hugging Face's casts even a float64 row down to it), and the weight and y are held in the dtype (2u_s): each
//    y_c errs by at most ε_n·|y_c|, ε_n = γ_D(u_f)/2 + 5u_f + 2u_s (qk_norm_error, u_f = 2^-24). On a score that is
//    (ε_q + ε_k)·scale·Σ_c|q'_c k'_c|: Δ_i grows by (ε_q + ε_k)·abs_dot, each ε 0 for a side not normalised.
// 11. Dropout. The weights a kernel returns and multiplies V by are w'_ij = μ_ij·w_ij, μ_ij = M_ij/(1 - p) with M the
//    keep mask (the oracle runs with the kernel's own mask, read off its weights, so M is exact). 1/(1 - p) rounds in
//    the accumulation type and so does the product: |δw'_ij| ≤ μ_ij·w_ij·(ρ_i + 2u_a) + u_s·w'_ij, capped at
//    1/(1 - p) (both lie in [0, 1/(1 - p)]). On the output, Σ_j μ_ij w_ij ≤ 1/(1 - p), so step 3's bound is
//    1/(1 - p) times itself with ρ_i + 2u_a for ρ_i (the saturated cap of step 5 too: |o| ≤ max|v|/(1 - p)), and
//    step 4's flushed products w'_ij·v_jc at most N_a·max|v|/(1 - p) each. A kernel that scales the output by 1/(1 - p)
//    instead of the weights rounds the same two products in another order: within the same bound. The LSE is the
//    softmax's, before dropout: step 6 unchanged.
// 12. Quantised K and V (AttentionOptions::quant). The bound is taken on the dequantised values k = (code - z)·σ, exact
//    doubles (tolerance holds for the oracle on them); a kernel dequantises in its own arithmetic. Each element it
//    uses errs by at most four roundings, each ≤ u_s relative where the value is normal in the dtype (u_a ≤ u_s for
//    the accumulation type): the scale into the dtype, the product code·σ, its store in the dtype, or, for a kernel
//    that folds σ into the softmax scale (or the output) instead, that product's rounding: ε_x = 4u_s·|x|, first
//    order. A value below the dtype's smallest normal N_s rounds absolutely (half a subnormal step) or is flushed by
//    an FTZ store: N_s more. On a score that is scale·Σ_c |q_ic|·ε_k,jc (Δ_i grows by its largest visible value),
//    and on an output Σ_j w_ij·ε_v,jc ≤ 4u_s·max_j|v_jc| + N_s where a visible v_jc is that small (times 1/(1 - p)
//    with dropout's kept weights). The codes themselves are exact in every dtype (e4m3's 4 significant bits, e5m2's
//    3, int8's 8 and e5m2's subnormals 2^-16 all fit float16 and bfloat16), so nothing else rounds. ggml's Q4_1 and
//    Q5_1 blocks hold x = d·n + m, and a kernel may form d·n and m apart (ggml's dot is d·Σq_c·n_c + m·Σq_c), each
//    rounding relative to itself: |d·n| + |m| ≤ |x| + 2|m|, so ε_x = 4u_s·(|x| + 2M) with M the largest |m| of the
//    side (HeadModifiers::k_min_magnitude, v_min_magnitude; 0 for the other formats). A quantised q (FP8 or int8,
//    QuantizedKV::q, HeadModifiers::dequantised_q) is dequantised the same way: ε_q,ic = 4u_s·|q_ic| (+ N_s), and the
//    score errs by scale·Σ_c ε_q,ic·|k_jc| more (first order: the product of both sides' errors is second order).
// 12b. Q rounded to ggml's Q8_0 blocks (HeadModifiers::q_dot_ggml_q8, declared: ggml's CPU kernel does it with a
//    block-quantised K). Per block β of 32 elements of a row q_i, with a = max_c∈β |q_ic|: d = a/127 in float (u_f
//    = 2^-24), each code round(q_c·(1/d)) with |code| ≤ 127 and the product rounded (|code - q_c/d| ≤ 1/2 + 255u_f),
//    d stored as float16 (relative 2^-11 where d ≥ 2^-14, absolutely 2^-25 below): the q'_c = code·fp16(d) the dot
//    uses err by δ_β = d̄·(1/2 + 255u_f + 127·2^-11) + 127·2^-25 with d̄ = a(1 + u_f)/127. With a Q8_0, Q4_0 or Q5_0
//    K the dot is exactly Σ_c k_c·q'_c before its own rounding (step 1's, on q' within second order), so the score
//    errs by scale·Σ_β δ_β·Σ_c∈β |k_jc|. With Q4_1 and Q5_1 (k_c = d_k·n_c + m_k) Q goes to Q8_1, whose block also
//    holds s = fp16(d·Σ code) for the m_k·s term: |d_k·n_c| ≤ |k_c| + M and |s - Σ_c q_c| ≤ 32·d̄(1/2 + 255u_f)
//    (each code's error) + (2^-11 + u_f)·(Σ_c|q_c| + 32·d̄) + 2^-25 (the product and the float16), so the score errs
//    by scale·Σ_β [δ_β·(Σ_c∈β |k_jc| + 32M) + M·(that)], M = HeadModifiers::k_min_magnitude (0 for the _0 kinds).
//    Δ_i grows by its largest visible value. Where d or s passes float16's 65504 (|q| past 8.3e6, or a block's Σ|q|
//    past 65504 with Q8_1) the kernel's dot is unresolved: an infinite error, whose weights step 5 caps.
// 12c. P cast to FP8 e4m3 for P·V (HeadModifiers::p_fp8, declared: FlashAttention 3's FP8 forward). Each
//    p_j = exp(s_j - m) ≤ 1 (m the running maximum; a later rescale by exp(m_old - m) ≤ 1 scales its error with it)
//    becomes a code of e4m3: off by at most 2^-4·p_j (three mantissa bits) where p_j ≥ 2^-6 (the smallest normal), by
//    half the subnormal step, 2^-10, below; a kernel that scales P into the format's range first (by up to 448) only
//    shrinks both. Call it e_j; with l = Σ_j p_j (the oracle's: l = 1/max_j w_ij, since the largest p_j is 1) and E =
//    Σ_j e_j, a kernel that divides Σ_j p'_j v_jc by l errs by Σ_j e_j|v_jc|/l, one that divides by its own l' = Σ_j
//    p'_j (|l' - l| ≤ E) by at most (Σ_j e_j|v_jc| + E·max_j|v_jc|)/(l - E): the output's bound grows by the latter
//    (e_j/l = 2^-4·w_ij or 2^-10/l); at most (2 + E/l)·max_j|v_jc| in any case (the kernel's output lies within (1 +
//    E/l)·max_j|v_jc|, the oracle's within max_j|v_jc|), which is the bound where E ≥ l. The weights a kernel returns
//    (normalised from P in float) and the LSE are not affected.
// The whole first-order bound is multiplied by `safety`.
#include "attncheck/tolerance.hpp"

#include "attncheck/attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace attncheck {

double gamma(Index n, double u) {
  const double nu = static_cast<double>(n) * u;
  return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

double smallest_normal(DType dtype) {
  switch (dtype) {
    case DType::f16: return std::ldexp(1.0, -14);
    case DType::bf16:
    case DType::f32: return std::ldexp(1.0, -126);
    case DType::f64: break;
  }
  return std::ldexp(1.0, -1022);
}

double storage_floor(DType dtype) { return smallest_normal(dtype); }  // step 4: a flush-to-zero store

double lse_exponent_error(DType dtype, double abs_score, Index n_vis) {
  if (n_vis <= 0) return 0.0;
  return 10 * accumulation_roundoff(dtype) * (abs_score + std::log(double(n_vis)));  // step 2b
}

Eigen::VectorXd row_score_bound(const Matrix<double>& q, const Matrix<double>& k, const Visibility& vis,
                                double scale) {
  const Matrix<double> k_norm = k.rowwise().norm();  // [T_k,1]
  const VisibleRange r = visible_value_range(k_norm, vis);
  Eigen::VectorXd bound = Eigen::VectorXd::Zero(vis.T_q);
  for (Index i = 0; i < vis.T_q; ++i)
    if (!vis.keys(i).empty()) bound(i) = std::abs(scale) * q.row(i).norm() * r.max(i, 0);
  return bound;
}

double accumulation_roundoff(DType dtype) {
  return dtype == DType::f64 ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
}

namespace {

// Step 12b: Σ_β [δ_iβ·(Σ_c∈β |k_jc| + 32M) + M·ζ_iβ] for every row i of q and key j, [T_q, T_k], blocks of 32 along D.
Matrix<double> ggml_q8_dot_error(const Matrix<double>& q, const Matrix<double>& k, double M) {
  const Index D = q.cols(), blocks = (D + 31) / 32;
  const double u_f = unit_roundoff(DType::f32), code = 0.5 + 255 * u_f, tiny = 127 * std::ldexp(1.0, -25);
  Matrix<double> delta(q.rows(), blocks), k_sum(k.rows(), blocks);
  Eigen::VectorXd zeta = Eigen::VectorXd::Zero(q.rows());
  for (Index n = 0; n < blocks; ++n) {
    const Index c0 = 32 * n, w = std::min<Index>(32, D - c0);
    for (Index i = 0; i < q.rows(); ++i) {
      const auto row = q.row(i).segment(c0, w).cwiseAbs();
      const double d = row.maxCoeff() * (1 + u_f) / 127;
      if (d > 65504) {  // float16's d overflows: a kernel's dot is then unresolved
        delta(i, n) = zeta(i) = std::numeric_limits<double>::infinity();
        continue;
      }
      delta(i, n) = d * (code + 127 * std::ldexp(1.0, -11)) + tiny;
      if (M > 0)  // (s as float16 overflows where |d·Σ code| may pass 65504: the m·s term is then unresolved)
        zeta(i) += row.sum() + 32 * d >= 65504
                       ? std::numeric_limits<double>::infinity()
                       : 32 * d * code + (std::ldexp(1.0, -11) + u_f) * (row.sum() + 32 * d) + std::ldexp(1.0, -25);
    }
    for (Index j = 0; j < k.rows(); ++j) k_sum(j, n) = k.row(j).segment(c0, w).cwiseAbs().sum() + 32 * M;
  }
  Matrix<double> e = delta * k_sum.transpose();
  if (M > 0) e.colwise() += M * zeta;
  return e.unaryExpr([](double x) { return std::isnan(x) ? std::numeric_limits<double>::infinity() : x; });
}

// The terms of one row i (steps 1-4): its relative weight error ρ_w from the largest scale·Σ_c|q_ic k_jc|
// and |s_ij| over its n_vis visible keys, and its output bound from ρ_w and the largest |v_jc| per column.
struct RowTerms {
  DType dtype;
  double u_s, u_a, tiny, store_floor, g_D, pre_scale, safety;

  RowTerms(DType t, Index D, double safety_)
      : dtype(t),
        u_s(unit_roundoff(t)),
        u_a(accumulation_roundoff(t)),
        tiny(std::ldexp(1.0, t == DType::f64 ? -1022 : -126)),  // step 4: exp's flush (and FTZ's N_a), per weight
        store_floor(storage_floor(t)),
        g_D(gamma(D, u_a)),
        pre_scale(t == DType::f64 ? 0.0 : 2 * unit_roundoff(t)),  // q (and k) scaled in the dtype first
        safety(safety_) {}

  // 2Δ_i + λ_i + γ_T + 5u_a: ρ_i's exponent, and the LSE's bound (step 6).
  double exponent(double abs_dot, double s_max, Index n_vis, double modifier_error = 0) const {
    const double delta = (g_D + pre_scale) * abs_dot + (4 * u_a + u_s) * s_max + modifier_error;  // steps 4b, 7
    const double lambda = lse_exponent_error(dtype, s_max, n_vis);  // step 2b
    return 2 * delta + lambda + gamma(n_vis, u_a) + 5 * u_a;
  }
  double rho_w(double abs_dot, double s_max, Index n_vis, double modifier_error = 0) const {
    return std::expm1(exponent(abs_dot, s_max, n_vis, modifier_error));  // may be +inf: the weights are unresolved
  }

  // `cap`: the largest weight, 1/(1 - p) with dropout (step 11), whose w is then the kept weight w'.
  double weight(double w, double rho_w, double cap = 1) const {
    return (std::isinf(rho_w) ? cap : std::min(cap, safety * (w * rho_w + u_s * w))) + tiny + store_floor;
  }

  // `kept`: 1/(1 - p) with dropout (step 11), 1 without.
  template <class Row, class Out>
  void output(double rho_w, Index n_vis, const Eigen::RowVectorXd& v_col_max, const Row& oracle_out, Out&& tol,
              double kept = 1) const {
    const double rho = std::min(rho_w, 2.0), g_T = gamma(n_vis, u_a), v_max = v_col_max.maxCoeff();
    for (Index c = 0; c < v_col_max.size(); ++c)
      tol(c) = safety * (v_col_max(c) * kept * std::min(rho + u_s + g_T * (1 + rho + u_s), 2.0) +
                         u_s * std::abs(oracle_out(c))) +
               static_cast<double>(n_vis) * tiny * (v_max * kept + 2) + store_floor;  // step 4 (tiny = N_a)
  }
};

}  // namespace

double row_weight_relative_error(DType dtype, Index D, const RowScoreStats& r, bool sink, bool softcap,
                                 double* exponent) {
  if (exponent) *exponent = 0;
  if (r.n_vis <= 0) return 0.0;  // an empty row: zero
  const double u_a = accumulation_roundoff(dtype);
  const double temper = r.tempered ? 3 * unit_roundoff(dtype) * r.abs_dot + 2 * u_a * r.s_max : 0.0;  // step 8
  const double mod_err = (softcap ? 5 * u_a * r.raw_max : 0.0) + 2 * u_a * r.bias_max + r.flushed + temper + r.rope +
                         r.qk_norm + r.dequant;  // 4b, 7-10, 12
  const double x = RowTerms(dtype, D, 1.0).exponent(r.abs_dot, r.s_max, r.n_vis + (sink ? 1 : 0), mod_err);
  if (exponent) *exponent = x;
  return std::expm1(x);
}

Eigen::VectorXd weight_relative_error(DType dtype, const Matrix<double>& q, const Matrix<double>& k,
                                      const BoolMask& mask, double scale, const HeadModifiers& mods,
                                      Eigen::VectorXd* exponents) {
  const Index T_q = q.rows(), T_k = k.rows(), D = q.cols();
  const Matrix<double> abs_qk = q.cwiseAbs() * k.cwiseAbs().transpose() * scale;  // Σ_c |q_ic k_jc|·scale
  const Matrix<double> s = q * k.transpose() * scale;
  // Step 4b: φ_ij, the terms an FTZ kernel drops by flushing scale·q_ic or scale·k_jc (none for normal-sized inputs).
  const double n_a = std::ldexp(1.0, dtype == DType::f64 ? -1022 : -126);
  const auto tiny = [&](const Matrix<double>& x) {
    return Matrix<double>(x.cwiseAbs().unaryExpr([&](double a) { return a * std::abs(scale) < n_a ? a : 0.0; }));
  };
  const Matrix<double> q_tiny = tiny(q), k_tiny = tiny(k);
  Matrix<double> flushed;
  if (!q_tiny.isZero(0) || !k_tiny.isZero(0))
    flushed = (q_tiny * k.cwiseAbs().transpose() + q.cwiseAbs() * k_tiny.transpose()) * std::abs(scale);
  const bool sink = mods.sink && std::isfinite(*mods.sink);
  // Step 12: scale·Σ_c |q_ic|·ε_k,jc with ε(x) = 4u_s·|x|, and N_s more where 0 < |x| < N_s.
  Matrix<double> dequant;
  if (mods.dequantised_kv) {
    const double u_s = unit_roundoff(dtype), n_s = smallest_normal(dtype);
    const Matrix<double> eps = k.cwiseAbs().unaryExpr(
        [&](double a) { return 4 * u_s * (a + 2 * mods.k_min_magnitude) + (a > 0 && a < n_s ? n_s : 0.0); });
    dequant = q.cwiseAbs() * eps.transpose() * std::abs(scale);
    if (mods.dequantised_q)  // and q's own, each element ε_q = 4u_s·|q| (+ N_s), times |k|
      dequant += q.cwiseAbs().unaryExpr([&](double a) { return 4 * u_s * a + (a > 0 && a < n_s ? n_s : 0.0); }) *
                 k.cwiseAbs().transpose() * std::abs(scale);
    if (mods.q_dot_ggml_q8) dequant += ggml_q8_dot_error(q, k, mods.k_min_magnitude) * std::abs(scale);
  }
  // Step 9: each row's and key's rotation error and norms (q and k are the rotated ones).
  Eigen::VectorXd q_norm, k_norm, eps_k;
  if (mods.rope) {
    q_norm = q.rowwise().norm();
    k_norm = k.rowwise().norm();
    eps_k.resize(T_k);
    for (Index j = 0; j < T_k; ++j)
      eps_k(j) = rope_rotation_error(dtype, *mods.rope, mods.rope->k_positions[std::size_t(mods.rope_batch * T_k + j)]);
  }
  Eigen::VectorXd rho = Eigen::VectorXd::Zero(T_q);
  if (exponents) exponents->setZero(T_q);
  for (Index i = 0; i < T_q; ++i) {
    RowScoreStats r;
    r.tempered = mods.tempered;
    double k_most = 0, eps_k_most = 0;
    r.s_max = sink ? std::abs(*mods.sink) : 0.0;
    for (Index j = 0; j < T_k; ++j) {
      if (!mask.visible(i, j)) continue;
      r.n_vis += mods.counted ? std::max<Index>(1, mods.counted->count(mods.list_b, mods.list_h, i, j)) : 1;
      r.abs_dot = std::max(r.abs_dot, abs_qk(i, j));
      r.raw_max = std::max(r.raw_max, std::abs(s(i, j)));
      r.s_max = std::max({r.s_max, std::abs(s(i, j)), std::abs(modified_score<double>(s(i, j), mods, i, j))});
      r.bias_max = std::max(r.bias_max, std::abs(mods.alibi_slope * double(mods.alibi_distance(i, j))));
      if (flushed.size() > 0) r.flushed = std::max(r.flushed, flushed(i, j));
      if (dequant.size() > 0) r.dequant = std::max(r.dequant, dequant(i, j));
      if (mods.rope) {
        k_most = std::max(k_most, k_norm(j));
        eps_k_most = std::max(eps_k_most, eps_k(j));
      }
    }
    if (mods.qk_norm) r.qk_norm = qk_norm_score_error(dtype, D, *mods.qk_norm, r.abs_dot);
    if (mods.rope && r.n_vis > 0) {
      const double eps_q =
          rope_rotation_error(dtype, *mods.rope, mods.rope->q_positions[std::size_t(mods.rope_batch * T_q + i)]);
      r.rope = 2 * (eps_q + eps_k_most) * std::abs(scale) * q_norm(i) * k_most;
    }
    rho(i) =
        row_weight_relative_error(dtype, D, r, sink, mods.softcap.has_value(), exponents ? &(*exponents)(i) : nullptr);
  }
  return rho;
}

double lse_tolerance(DType dtype, double rho_w, double oracle_lse, double safety, double exponent) {
  if (std::isinf(oracle_lse) && oracle_lse < 0) return 0.0;  // step 6: exactly -inf
  const double u_a = accumulation_roundoff(dtype), a = std::abs(oracle_lse);
  const double first = std::isinf(rho_w) ? std::max(2 * std::max(1.0, a), exponent) : std::log1p(rho_w);
  return safety * first + u_a * a;
}

namespace {

HeadTolerance head_tolerance_at(DType dtype, const Matrix<double>& q, const Matrix<double>& k,
                                const Matrix<double>& v, const BoolMask& mask, double scale,
                                const Matrix<double>& oracle_output, const Matrix<double>& oracle_weights,
                                double safety, const HeadModifiers& mods) {
  // D: the scores' dot products (Q's and K's head dimension); D_v: the output's columns (V's, which may differ).
  const Index T_q = q.rows(), T_k = k.rows(), D = q.cols(), D_v = v.cols();
  const RowTerms terms(dtype, D, safety);
  const Eigen::VectorXd rho_rows = weight_relative_error(dtype, q, k, mask, scale, mods);

  HeadTolerance tol{Matrix<double>::Zero(T_q, D_v), Matrix<double>::Zero(T_q, T_k)};
  for (Index i = 0; i < T_q; ++i) {
    Index n_vis = 0;
    Eigen::RowVectorXd v_col_max = Eigen::RowVectorXd::Zero(D_v);
    for (Index j = 0; j < T_k; ++j) {
      if (!mask.visible(i, j)) continue;
      ++n_vis;
      v_col_max = v_col_max.cwiseMax(v.row(j).cwiseAbs());
    }
    if (n_vis == 0) continue;  // the row is exactly zero in every correct kernel
    // Step 11: with dropout, the kept weights' 1/(1 - p) and its product (2u_a), and the cap 1/(1 - p).
    const double rho_w = rho_rows(i) + (mods.keep ? 2 * terms.u_a : 0.0);  // may be +inf: the weights are unresolved
    for (Index j = 0; j < T_k; ++j)
      if (mask.visible(i, j)) tol.weights(i, j) = terms.weight(oracle_weights(i, j), rho_w, mods.keep_scale);
    terms.output(rho_w, n_vis, v_col_max, oracle_output.row(i), tol.output.row(i), mods.keep_scale);
    if (mods.p_fp8) {  // step 12c: P cast to e4m3, (Σ_j e_j|v_jc| + E·max|v_jc|)/(l - E) with e_j/l, E/l from w
      double w_max = 0;
      for (Index j = 0; j < T_k; ++j)
        if (mask.visible(i, j)) w_max = std::max(w_max, oracle_weights(i, j));
      const double inv_l = w_max;  // 1/l
      Eigen::RowVectorXd a = Eigen::RowVectorXd::Zero(D_v);
      double e_sum = 0;  // E/l
      for (Index j = 0; j < T_k; ++j) {
        if (!mask.visible(i, j)) continue;
        const double w = oracle_weights(i, j);
        const double e = w >= std::ldexp(1.0, -6) * inv_l ? std::ldexp(w, -4) : std::ldexp(1.0, -10) * inv_l;
        e_sum += e;
        a += e * v.row(j).cwiseAbs();
      }
      // (Capped at (2 + E/l)·max|v_jc|: the kernel's output within (1 + E/l)·max|v_jc|, the oracle's within max|v_jc|.)
      for (Index c = 0; c < D_v; ++c) {
        const double cap = (2 + e_sum) * v_col_max(c) * mods.keep_scale;
        tol.output(i, c) +=
            e_sum >= 1 ? cap : std::min(cap, safety * (a(c) + e_sum * v_col_max(c)) / (1 - e_sum) * mods.keep_scale);
      }
    }
    if (mods.dequantised_kv) {  // step 12: V's dequantisation, 4u_s·max|v_jc| and N_s where a visible v_jc is tiny
      const double u_s = unit_roundoff(dtype), n_s = smallest_normal(dtype);
      for (Index c = 0; c < D_v; ++c) {
        bool tiny = false;
        for (Index j = 0; j < T_k; ++j)
          if (const double a = std::abs(v(j, c)); mask.visible(i, j) && a > 0 && a < n_s) tiny = true;
        tol.output(i, c) +=
            mods.keep_scale * (safety * 4 * u_s * (v_col_max(c) + 2 * mods.v_min_magnitude) + (tiny ? n_s : 0.0));
      }
    }
  }
  return tol;
}

}  // namespace

bool daz_inputs(DType dtype, Matrix<double>& x) {
  const double n_a = dtype == DType::f64 ? smallest_normal(DType::f64) : smallest_normal(DType::f32);
  bool any = false;
  for (Index i = 0; i < x.size(); ++i)
    if (double& e = x.data()[i]; e != 0 && std::abs(e) < n_a) {
      e = 0;
      any = true;
    }
  return any;
}

HeadTolerance head_tolerance(DType dtype, const Matrix<double>& q, const Matrix<double>& k, const Matrix<double>& v,
                             const BoolMask& mask, double scale, const Matrix<double>& oracle_output,
                             const Matrix<double>& oracle_weights, double safety, const HeadModifiers& mods) {
  HeadTolerance tol = head_tolerance_at(dtype, q, k, v, mask, scale, oracle_output, oracle_weights, safety, mods);
  // Step 4, DAZ: a kernel that reads subnormal inputs as 0 computes the problem on the flushed inputs, within
  // that problem's bound of its oracle, which differs from this oracle by what it differs.
  Matrix<double> q0 = q, k0 = k, v0 = v;
  const bool dq = daz_inputs(dtype, q0), dk = daz_inputs(dtype, k0), dv = daz_inputs(dtype, v0);
  if (!(dq || dk || dv)) return tol;
  const HeadTrace<double> t = attend<double>(q0, k0, v0, mask, scale, mods);
  const HeadTolerance t0 =
      head_tolerance_at(dtype, q0, k0, v0, mask, scale, t.output, t.returned_weights(), safety, mods);
  tol.output = tol.output.cwiseMax(t0.output + (t.output - oracle_output).cwiseAbs());
  tol.weights = tol.weights.cwiseMax(t0.weights + (t.returned_weights() - oracle_weights).cwiseAbs());
  return tol;
}

VisibleRange visible_value_range(const Matrix<double>& v, const Visibility& vis) {
  const Index T_q = vis.T_q, D = v.cols();
  VisibleRange r{Matrix<double>::Zero(T_q, D), Matrix<double>::Zero(T_q, D)};
  if (vis.has_cells()) {  // a block or dense mask: the visible keys may have gaps, so each row reads its own
    for (Index i = 0; i < T_q; ++i) {
      bool any = false;
      vis.for_each_run(i, 0, vis.T_k, [&](Index a, Index e) {
        const auto seg = v.middleRows(a, e - a);
        const Eigen::RowVectorXd mn = seg.colwise().minCoeff(), mx = seg.colwise().maxCoeff();
        r.min.row(i) = any ? r.min.row(i).cwiseMin(mn) : mn;
        r.max.row(i) = any ? r.max.row(i).cwiseMax(mx) : mx;
        any = true;
      });
    }
    return r;
  }
  // The queues walk one column at a time: over a column-major copy of V and into column-major results, with each
  // row's keys found once, not once a column (V and the results are row-major; a long context's V has 2^16 rows,
  // and a walk down a row-major column missed the cache at every key).
  std::vector<KeyRange> keys(static_cast<std::size_t>(T_q));
  for (Index i = 0; i < T_q; ++i) keys[std::size_t(i)] = vis.keys(i);
  const Eigen::MatrixXd by_column = v;
  Eigen::MatrixXd mins = Eigen::MatrixXd::Zero(T_q, D), maxs = Eigen::MatrixXd::Zero(T_q, D);
  std::vector<Index> lo, hi;  // monotone queues of key indices: values increasing (lo) or decreasing (hi)
  for (Index c = 0; c < D; ++c) {
    const double* x = by_column.col(c).data();
    double* mn = mins.col(c).data();
    double* mx = maxs.col(c).data();
    lo.clear();
    hi.clear();
    std::size_t lo_head = 0, hi_head = 0;
    Index next = 0;  // keys [0, next) have entered the queues
    for (Index i = 0; i < T_q; ++i) {
      const KeyRange kr = keys[std::size_t(i)];
      if (kr.empty()) continue;
      for (next = std::max(next, kr.begin); next < kr.end; ++next) {
        while (lo.size() > lo_head && x[lo.back()] >= x[next]) lo.pop_back();
        while (hi.size() > hi_head && x[hi.back()] <= x[next]) hi.pop_back();
        lo.push_back(next);
        hi.push_back(next);
      }
      while (lo[lo_head] < kr.begin) ++lo_head;
      while (hi[hi_head] < kr.begin) ++hi_head;
      mn[i] = x[lo[lo_head]];
      mx[i] = x[hi[hi_head]];
    }
  }
  r.min = mins;
  r.max = maxs;
  return r;
}

Matrix<double> streamed_output_tolerance(DType dtype, Index D_k, const Matrix<double>& v, const Visibility& vis,
                                         const Eigen::VectorXd& abs_dot, const Eigen::VectorXd& abs_score,
                                         const Matrix<double>& oracle_output, Eigen::VectorXd* rho_w, double safety,
                                         const HeadModifiers& mods) {
  const Index T_q = vis.T_q, D = v.cols();  // D_k: the scores' dot products; D = D_v: the output's columns
  if (mods.rope || mods.keep || mods.dequantised_kv)  // step 9 needs the rotated q and k, step 11 the mask, step 12
    // each element's size: the row statistics hold none of them
    throw std::logic_error(
        "streamed_output_tolerance: no streamed bound for RoPE, dropout or a quantised cache yet "
        "(their cases stay below 2^22 weights)");
  const RowTerms terms(dtype, D_k, safety);
  const double u_a = accumulation_roundoff(dtype);
  const bool sink = mods.sink && std::isfinite(*mods.sink);
  const VisibleRange range = visible_value_range(v, vis);
  Matrix<double> tol = Matrix<double>::Zero(T_q, D);
  if (rho_w) rho_w->setZero(T_q);
  for (Index i = 0; i < T_q; ++i) {
    const Index n_vis = vis.count(i);
    if (n_vis == 0) continue;
    // Step 7 from the row statistics: |s_raw| ≤ abs_dot, the bias largest at the visible run's ends; abs_score
    // already holds the modified scores and the sink.
    const KeyRange kr = vis.keys(i);
    const Index p = mods.position(i);
    const double bias_max = std::abs(mods.alibi_slope) * double(std::max(std::abs(kr.begin - p), std::abs(kr.end - 1 - p)));
    // |s_raw| ≤ abs_dot; without a softcap or a bias tensor also ≤ |s| + |ALiBi's b|, which is tighter.
    const double s_max =
        mods.softcap || mods.bias || mods.counted ? std::max(abs_score(i), abs_dot(i)) : abs_score(i) + bias_max;
    const double temper = mods.tempered ? 3 * terms.u_s * abs_dot(i) + 2 * u_a * s_max : 0.0;  // step 8
    const double normed = mods.qk_norm ? qk_norm_score_error(dtype, D_k, *mods.qk_norm, abs_dot(i)) : 0.0;  // 10
    const double mod_err = (mods.softcap ? 5 * u_a * abs_dot(i) : 0.0) + 2 * u_a * bias_max + temper + normed;
    const double r = terms.rho_w(abs_dot(i), s_max, n_vis + (sink ? 1 : 0), mod_err);
    if (rho_w) (*rho_w)(i) = r;
    const Eigen::RowVectorXd v_col_max = range.min.row(i).cwiseAbs().cwiseMax(range.max.row(i).cwiseAbs());
    terms.output(r, n_vis, v_col_max, oracle_output.row(i), tol.row(i));
  }
  return tol;
}

double qk_norm_error(DType dtype, Index D) {
  const double u_f = unit_roundoff(DType::f32);
  return gamma(D, u_f) / 2 + 5 * u_f + 2 * unit_roundoff(dtype);  // step 10: the norm in float
}

double qk_norm_score_error(DType dtype, Index D, const QkNorm& norm, double abs_dot) {
  const double eps = qk_norm_error(dtype, D);
  return ((norm.q_weight.empty() ? 0.0 : eps) + (norm.k_weight.empty() ? 0.0 : eps)) * abs_dot;  // step 10
}

double rope_rotation_error(DType dtype, const Rope& rope, Index pos) {
  const double u_a = accumulation_roundoff(dtype), u_s = unit_roundoff(dtype), u_f = unit_roundoff(DType::f32);
  // Step 9b: a scaled rope's own frequencies.
  const double kappa = rope.scaling == RopeScaling::ntk ? 3.0
                       : rope.scaling == RopeScaling::llama3
                           ? 11 * std::max(1.0, rope.high_freq_factor / (rope.high_freq_factor - rope.low_freq_factor))
                           : 0.0;
  // Step 9: the angle, cos and sin in float.
  return (5 + kappa) * u_f * rope.max_angle(pos) + 2 * u_f + 2 * u_a + 3 * u_s;
}

double weight_tolerance(DType dtype, double w, double rho_w, double safety) {
  return RowTerms(dtype, 1, safety).weight(w, rho_w);
}

}  // namespace attncheck
