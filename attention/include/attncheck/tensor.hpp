// A contiguous row-major [B,H,T,D] tensor backed by Eigen storage, with zero-copy views of one (b,h) head.
#pragma once

#include <Eigen/Core>
#include <array>
#include <string>

#include "attncheck/error.hpp"

namespace attncheck {

using Index = Eigen::Index;

/// Row-major matrix of scalar S: one head's [T,D] slice, or a [T_q,T_k] score/weight matrix.
template <class S> using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Extents of a 4-D attention tensor. For a weight tensor the last extent is T_k rather than D.
struct Shape {
  Index B = 1, H = 1, T = 1, D = 1;

  Index numel() const { return B * H * T * D; }
  friend bool operator==(const Shape&, const Shape&) = default;
};

/// "[B,H,T,D]" with the numbers filled in, as every error message prints shapes.
std::string to_string(const Shape& s);
/// "[R,C]" for a matrix.
std::string shape_string(Index rows, Index cols);

/// Throws ShapeError("<who>: shape [..] has a non-positive extent (T = 0)") unless every extent is >= 1.
void check_extents(const Shape& s, const char* who);

/// Contiguous row-major [B,H,T,D] tensor: element (b,h,i,d) lives at ((b*H + h)*T + i)*D + d.
template <class S> class Tensor {
 public:
  using Scalar = S;
  using HeadMap = Eigen::Map<Matrix<S>, Eigen::Unaligned>;
  using ConstHeadMap = Eigen::Map<const Matrix<S>, Eigen::Unaligned>;

  /// A zero-filled tensor; throws ShapeError when an extent is not positive.
  explicit Tensor(const Shape& shape) : shape_(shape) {
    check_extents(shape, "Tensor");
    data_.setZero(shape.numel());
  }

  /// A tensor holding `values` in row-major order; throws ShapeError when the count does not match.
  Tensor(const Shape& shape, const Eigen::Matrix<S, Eigen::Dynamic, 1>& values) : shape_(shape) {
    check_extents(shape, "Tensor");
    if (values.size() != shape.numel())
      throw ShapeError("Tensor: shape " + to_string(shape) + " needs " + std::to_string(shape.numel()) +
                       " values but got " + std::to_string(values.size()));
    data_ = values;
  }

  const Shape& shape() const { return shape_; }
  Index size() const { return data_.size(); }
  S* data() { return data_.data(); }
  const S* data() const { return data_.data(); }

  /// Zero-copy [T,D] view of head (b,h).
  HeadMap head(Index b, Index h) { return HeadMap(data_.data() + offset(b, h), shape_.T, shape_.D); }
  ConstHeadMap head(Index b, Index h) const {
    return ConstHeadMap(data_.data() + offset(b, h), shape_.T, shape_.D);
  }

  S& operator()(Index b, Index h, Index i, Index d) { return data_[offset(b, h) + i * shape_.D + d]; }
  const S& operator()(Index b, Index h, Index i, Index d) const {
    return data_[offset(b, h) + i * shape_.D + d];
  }

  /// Element-wise conversion to another scalar type (exact when widening).
  template <class U> Tensor<U> cast() const { return Tensor<U>(shape_, data_.template cast<U>()); }

  /// The flat row-major storage.
  const Eigen::Matrix<S, Eigen::Dynamic, 1>& values() const { return data_; }
  Eigen::Matrix<S, Eigen::Dynamic, 1>& values() { return data_; }

 private:
  Index offset(Index b, Index h) const { return (b * shape_.H + h) * shape_.T * shape_.D; }

  Shape shape_;
  Eigen::Matrix<S, Eigen::Dynamic, 1> data_;
};

}  // namespace attncheck
