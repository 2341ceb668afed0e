// The core's hot loops behind one table per instruction set; private to the core.
//
// streamed.cpp (the streamed forward and the streaming oracle's rows) and backward_streamed.cpp (the streamed
// backward, its oracle and bound) are compiled once per instruction set (cmake/attncheckIsa.cmake); each copy
// defines its table, `attncheck_forward_kernels` or `attncheck_backward_kernels`, renamed per copy
// (attncheck_isa_<id>_attncheck_forward_kernels). isa.cpp holds the copies this build has, picks the best this CPU
// supports once, and routes the core's streamed entry points through it. A table is constant data: nothing in a
// copy runs before the choice, so a copy for a newer CPU is never entered on an older one.
#pragma once

#include "attncheck/attention.hpp"
#include "attncheck/backward.hpp"

namespace attncheck::detail {

template <class S>
using StreamedForward = Tensor<S> (*)(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                      const AttentionOptions& opts, double scale, Tensor<double>* stats, bool bounds);

/// One copy's entry points, one per storage type.
struct ForwardKernels {
  StreamedForward<float> f32;
  StreamedForward<double> f64;
  StreamedForward<Eigen::half> f16;
  StreamedForward<Eigen::bfloat16> bf16;
};

template <class S>
using StreamedBackward = AttentionGradients<S> (*)(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                                   const Tensor<S>& d_output, const AttentionOptions& opts);
template <class S>
using OracleBackward = AttentionGradients<double> (*)(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                                                      const Tensor<S>& d_output, const AttentionOptions& opts);

/// One copy's backward entry points: detail::streamed_backward and streaming_oracle_backward per storage type,
/// streamed_gradient_check and streamed_weight_relative_error (backward.hpp says what each computes).
struct BackwardKernels {
  StreamedBackward<float> f32;
  StreamedBackward<double> f64;
  StreamedBackward<Eigen::half> f16;
  StreamedBackward<Eigen::bfloat16> bf16;
  OracleBackward<float> oracle_f32;
  OracleBackward<double> oracle_f64;
  OracleBackward<Eigen::half> oracle_f16;
  OracleBackward<Eigen::bfloat16> oracle_bf16;
  GradientCheck (*gradient_check)(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                  const Tensor<double>& v, const Tensor<double>& d_output, const AttentionOptions& opts,
                                  double safety, const GradientRows* only);
  Tensor<double> (*weight_relative_error)(DType dtype, const Tensor<double>& q, const Tensor<double>& k,
                                          const AttentionOptions& opts);
};

/// Causal attention under opts (alignment, key lengths, window) with O(T·D) extra memory. `stats`, when not
/// null, receives [B,H,T_q,4]: per row m, l and, with `bounds`, max|s| and max scale·Σ|q·k| (see RowStats).
/// Runs the chosen instruction set's copy (isa.cpp).
template <class S>
Tensor<S> streamed_forward(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const AttentionOptions& opts,
                           double scale, Tensor<double>* stats, bool bounds);

/// The table the core runs now; `use_forward_kernels(t)` replaces it (a benchmark's copy built for this machine
/// alone, cmake/attncheckIsa.cmake's `native`), `nullptr` goes back to the chosen instruction set's.
const ForwardKernels& forward_kernels();
void use_forward_kernels(const ForwardKernels* table);

/// The backward table of the chosen instruction set.
const BackwardKernels& backward_kernels();

}  // namespace attncheck::detail

// Each copy's tables, under the names isa_prefix.cmake gives them: attncheck_isa_<id>_attncheck_forward_kernels.
#define ATTNCHECK_FORWARD_KERNELS(id) attncheck_isa_##id##_attncheck_forward_kernels
#define ATTNCHECK_BACKWARD_KERNELS(id) attncheck_isa_##id##_attncheck_backward_kernels
