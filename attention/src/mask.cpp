// Causal mask builders and the explicit conversions between boolean and additive masks.
#include "attncheck/mask.hpp"

#include <algorithm>
#include <limits>

namespace attncheck {

Index last_visible_key(Index i, Index T_q, Index T_k, CausalAlignment a) {
  return a == CausalAlignment::TopLeft ? i : i + T_k - T_q;
}

Index Visibility::position(Index i) const {
  return alignment == CausalAlignment::TopLeft ? i : i + T_k - T_q;
}

KeyRange Visibility::keys(Index i) const {
  const Index p = position(i);
  Index end = causal ? std::min(p + 1, T_k) : T_k;
  if (key_length >= 0) end = std::min(end, key_length);
  const Index begin = window ? std::max<Index>(0, p - *window) : 0;
  return {begin, std::max(begin, end)};
}

BoolMask::BoolMask(Array visible) : visible_(std::move(visible)) {
  if (visible_.rows() < 1 || visible_.cols() < 1)
    throw ShapeError("BoolMask: mask is " + shape_string(visible_.rows(), visible_.cols()) +
                     "; both extents must be positive");
}

BoolMask BoolMask::causal(Index T_q, Index T_k, CausalAlignment a) {
  if (T_q < 1 || T_k < 1)
    throw ShapeError("BoolMask::causal: T_q and T_k must be positive, got " + shape_string(T_q, T_k));
  Array m(T_q, T_k);
  for (Index i = 0; i < T_q; ++i)
    for (Index j = 0; j < T_k; ++j) m(i, j) = j <= last_visible_key(i, T_q, T_k, a);
  return BoolMask(std::move(m));
}

BoolMask BoolMask::of(const Visibility& v) {
  if (v.T_q < 1 || v.T_k < 1)
    throw ShapeError("BoolMask::of: T_q and T_k must be positive, got " + shape_string(v.T_q, v.T_k));
  Array m = Array::Constant(v.T_q, v.T_k, false);
  for (Index i = 0; i < v.T_q; ++i) {
    const KeyRange r = v.keys(i);
    if (!r.empty()) m.row(i).segment(r.begin, r.size()).setConstant(true);
  }
  return BoolMask(std::move(m));
}

BoolMask BoolMask::full(Index T_q, Index T_k) {
  if (T_q < 1 || T_k < 1)
    throw ShapeError("BoolMask::full: T_q and T_k must be positive, got " + shape_string(T_q, T_k));
  return BoolMask(Array::Constant(T_q, T_k, true));
}

AdditiveMask BoolMask::to_additive() const {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  return AdditiveMask(visible_.select(AdditiveMask::Array::Zero(rows(), cols()), neg_inf));
}

AdditiveMask::AdditiveMask(Array bias) : bias_(std::move(bias)) {
  if (bias_.rows() < 1 || bias_.cols() < 1)
    throw ShapeError("AdditiveMask: mask is " + shape_string(bias_.rows(), bias_.cols()) +
                     "; both extents must be positive");
}

AdditiveMask AdditiveMask::causal(Index T_q, Index T_k, CausalAlignment a) {
  return BoolMask::causal(T_q, T_k, a).to_additive();
}

BoolMask AdditiveMask::to_bool() const {
  return BoolMask(bias_ != -std::numeric_limits<float>::infinity());
}

}  // namespace attncheck
