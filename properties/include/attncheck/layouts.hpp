// q, k and v laid out in memory as Problem::layout says: the buffers and strides a call through the C
// ABI passes (the plug-in host) and the zoo's strided kernels read. The values are the tensors'; what lies between
// them (gaps, the rest of a broadcast buffer) is NaN, so a kernel that reads there shows it.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "attncheck/implementation.hpp"
#include "attncheck/tensor.hpp"

namespace attncheck {

/// A [B,H,T,D] tensor read through strides (in elements): element (b,h,t,d) at
/// data[b·strides[0] + h·strides[1] + t·strides[2] + d·strides[3]].
template <class S> struct StridedView {
  const S* data = nullptr;
  std::array<Index, 4> shape{}, strides{};
  S at(Index b, Index h, Index t, Index d) const {
    return data[b * strides[0] + h * strides[1] + t * strides[2] + d * strides[3]];
  }
};

/// The buffers and views of one call's q, k and v.
template <class S> struct LaidOutInputs {
  std::vector<S> q_buffer, k_buffer, v_buffer;  ///< v_buffer is empty when V lies in K's buffer
  StridedView<S> q, k, v;
};

/// The [B,H,T,D] tensor a kernel reads from v when it takes element (b,h,t,d) at v.data[address(v, b, h, t, d)]
/// (v.at's strides, for a kernel that reads them right).
template <class S, class Address> Tensor<S> read_through(const StridedView<S>& v, Address address) {
  Tensor<S> t(Shape{v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  for (Index b = 0; b < v.shape[0]; ++b)
    for (Index h = 0; h < v.shape[1]; ++h)
      for (Index i = 0; i < v.shape[2]; ++i)
        for (Index d = 0; d < v.shape[3]; ++d) t(b, h, i, d) = v.data[address(v, b, h, i, d)];
  return t;
}

namespace layout_detail {

template <class S> S poison() {
  if constexpr (std::numeric_limits<S>::has_quiet_NaN) return std::numeric_limits<S>::quiet_NaN();
  return S(0);
}

// The strides of layout l for a tensor of shape s (kv: k or v, which kv_broadcast reads at one head).
inline std::array<Index, 4> strides_of(InputLayout l, const Shape& s, bool kv) {
  switch (l) {
    case InputLayout::token_major: return {s.T * s.H * s.D, s.D, s.H * s.D, 1};
    case InputLayout::padded: {
      const Index row = s.D + 3, head = s.T * row + 5;
      return {s.H * head + 7, head, row, 1};
    }
    case InputLayout::kv_broadcast:
      if (kv) return {s.T * s.D, 0, s.D, 1};
      break;
    case InputLayout::kv_interleaved:  // lay_out: K and V share rows of D + D_v elements
    case InputLayout::contiguous:
    case InputLayout::v_is_k: break;
  }
  return {s.H * s.T * s.D, s.T * s.D, s.D, 1};
}

// One past the last element a view of shape s and strides st reaches.
inline Index extent(const Shape& s, const std::array<Index, 4>& st) {
  return (s.B - 1) * st[0] + (s.H - 1) * st[1] + (s.T - 1) * st[2] + (s.D - 1) * st[3] + 1;
}

// Writes t into buf at offset `at` through strides st (a stride of 0 writes head 0's values once).
template <class S>
void scatter(const Tensor<S>& t, std::vector<S>& buf, Index at, const std::array<Index, 4>& st) {
  const Shape& s = t.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < (st[1] == 0 ? 1 : s.H); ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index d = 0; d < s.D; ++d) buf[std::size_t(at + b * st[0] + h * st[1] + i * st[2] + d * st[3])] = t(b, h, i, d);
}

}  // namespace layout_detail

/// q, k and v in layout l. Each buffer holds at least as many elements as its tensor has, so a kernel that reads it
/// as contiguous stays inside it (and reads NaN where the layout left gaps). kv_broadcast keeps head 0 of each
/// batch entry of k and v (the caller's kv heads must be equal); v_is_k makes v the view k is (v must equal k), or,
/// with a V head dimension D_v < D, the view of K's first D_v columns (MLA's V inside its latent K; v must equal
/// them); kv_interleaved puts each token's k and v of a head side by side in one row of D + D_v elements.
template <class S>
LaidOutInputs<S> lay_out(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, InputLayout l) {
  using namespace layout_detail;
  LaidOutInputs<S> r;
  const auto place = [&](const Tensor<S>& t, std::vector<S>& buf, bool kv) {
    const std::array<Index, 4> st = strides_of(l, t.shape(), kv);
    buf.assign(std::size_t(std::max(extent(t.shape(), st), t.shape().numel()) + t.shape().numel()), poison<S>());
    scatter(t, buf, 0, st);
    const Shape& s = t.shape();
    return StridedView<S>{buf.data(), {s.B, s.H, s.T, s.D}, st};
  };
  r.q = place(q, r.q_buffer, false);
  const Shape& s = k.shape();
  const Index D_v = v.shape().D;
  if (l == InputLayout::kv_interleaved) {
    const Index row = s.D + D_v;
    const std::array<Index, 4> st{s.T * s.H * row, row, s.H * row, 1};
    r.k_buffer.assign(std::size_t(s.B * s.H * s.T * row + row), poison<S>());
    scatter(k, r.k_buffer, 0, st);
    scatter(v, r.k_buffer, s.D, st);
    r.k = StridedView<S>{r.k_buffer.data(), {s.B, s.H, s.T, s.D}, st};
    r.v = StridedView<S>{r.k_buffer.data() + s.D, {s.B, s.H, s.T, D_v}, st};
    return r;
  }
  r.k = place(k, r.k_buffer, true);
  if (l == InputLayout::v_is_k) {
    r.v = r.k;
    r.v.shape[3] = std::min(D_v, s.D);
  } else {
    r.v = place(v, r.v_buffer, true);
  }
  return r;
}

}  // namespace attncheck
