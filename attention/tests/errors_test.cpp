// Every bad input gets a ShapeError or ValueError whose message names the function, what was expected and
// what came. The messages are asserted literally: they are part of the interface.
#include <gtest/gtest.h>

#include <limits>

#include "attncheck/attention.hpp"

namespace attncheck {
namespace {

template <class F> std::string messageOf(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no exception)";
}

#define EXPECT_THROW_MSG(stmt, type, msg)                   \
  do {                                                      \
    EXPECT_THROW(stmt, type);                               \
    EXPECT_EQ(messageOf([&] { stmt; }), std::string(msg)); \
  } while (0)

TEST(Errors, nonPositiveExtents) {
  EXPECT_THROW_MSG(Tensor<float>(Shape{1, 2, 0, 8}), ShapeError,
                   "Tensor: shape [1,2,0,8] has a non-positive extent (T = 0)");
  EXPECT_THROW_MSG(Tensor<float>(Shape{-1, 2, 3, 8}), ShapeError,
                   "Tensor: shape [-1,2,3,8] has a non-positive extent (B = -1)");
  EXPECT_THROW_MSG(Tensor<float>(Shape{1, 2, 3, 4}, Eigen::VectorXf::Zero(23)), ShapeError,
                   "Tensor: shape [1,2,3,4] needs 24 values but got 23");
  const Matrix<double> empty(0, 2), one = Matrix<double>::Ones(1, 2);
  EXPECT_THROW_MSG(attend(empty, one, one, BoolMask::causal(1, 1)), ShapeError,
                   "attend: q is [0,2]; every extent must be positive");
  EXPECT_THROW_MSG(BoolMask::causal(0, 3), ShapeError, "BoolMask::causal: T_q and T_k must be positive, got [0,3]");
}

TEST(Errors, batchHeadAndDimensionMismatches) {
  const Tensor<float> q({1, 2, 5, 16});
  EXPECT_THROW_MSG(attention(q, Tensor<float>({1, 2, 5, 8}), Tensor<float>({1, 2, 5, 8})), ShapeError,
                   "attention: k is [1,2,5,8] but q is [1,2,5,16] (D differs)");
  EXPECT_THROW_MSG(attention(q, Tensor<float>({2, 2, 5, 16}), Tensor<float>({2, 2, 5, 16})), ShapeError,
                   "attention: k is [2,2,5,16] but q is [1,2,5,16] (B differs)");
  EXPECT_THROW_MSG(attention(q, Tensor<float>({1, 3, 5, 16}), Tensor<float>({1, 3, 5, 16})), ShapeError,
                   "attention: k is [1,3,5,16] but q is [1,2,5,16] (k has H_kv = 3 heads and q has H = 2; H must "
                   "be a multiple of H_kv)");
  EXPECT_THROW_MSG(attention(Tensor<float>({1, 4, 5, 16}), Tensor<float>({1, 2, 5, 16}), Tensor<float>({1, 1, 5, 16})),
                   ShapeError, "attention: v is [1,1,5,16] but k is [1,2,5,16] (H differs: V needs one head per K head)");
  EXPECT_THROW_MSG(attention(q, q, Tensor<float>({1, 2, 4, 8})), ShapeError,
                   "attention: v is [1,2,4,8] but k is [1,2,5,16] (T differs: V needs one row per key)");
  // V may have a head dimension of its own (MLA): the output has it.
  EXPECT_EQ(attention(q, q, Tensor<float>({1, 2, 5, 8})).shape(), (Shape{1, 2, 5, 8}));
}

TEST(Errors, keyLengthsAndWindowAreChecked) {
  const Tensor<float> q({2, 1, 3, 4});
  EXPECT_THROW_MSG(attention(q, q, q, AttentionOptions{.key_lengths = {3}}), ShapeError,
                   "attention: key_lengths has 1 entries but B = 2 (one length per batch entry)");
  EXPECT_THROW_MSG(attention(q, q, q, AttentionOptions{.key_lengths = {3, 4}}), ValueError,
                   "attention: key_lengths[1] = 4 is outside [0, T_k = 3]");
  EXPECT_THROW_MSG(attention(q, q, q, AttentionOptions{.window = -1}), ValueError,
                   "attention: window must be >= 0 (0: a query sees only its own position), got -1");
  EXPECT_THROW_MSG(
      attention(q, q, q, BoolMask::causal(3, 3), AttentionOptions{.window = 1}), ValueError,
      "attention: key_lengths, windows, prefix_length, chunk_size, doc_bounds, q_doc_bounds, block_mask, "
      "dense_mask, index_list and tree apply to the causal path; with an explicit mask, fold them into the mask");
}

TEST(Errors, valueLengthDiffersFromKeyLength) {
  const Tensor<float> q({1, 2, 5, 16});
  EXPECT_THROW_MSG(attention(q, q, Tensor<float>({1, 2, 4, 16})), ShapeError,
                   "attention: v is [1,2,4,16] but k is [1,2,5,16] (T differs: V needs one row per key)");
  const Matrix<double> a = Matrix<double>::Ones(3, 2), b = Matrix<double>::Ones(2, 2);
  EXPECT_THROW_MSG(attend(a, a, b, BoolMask::causal(3, 3)), ShapeError,
                   "attend: v is [2,2] but k is [3,2] (T differs: V needs one row per key)");
}

TEST(Errors, maskShapeMismatch) {
  const Tensor<float> q({1, 1, 4, 8}), k({1, 1, 5, 8});
  EXPECT_THROW_MSG(attention(q, k, k, BoolMask::causal(4, 4)), ShapeError,
                   "attention: mask is [4,4] but QKᵀ is [4,5] (the mask must be T_q x T_k)");
  EXPECT_THROW_MSG(attention(q, k, k, AdditiveMask::causal(5, 5)), ShapeError,
                   "attention: mask is [5,5] but QKᵀ is [4,5] (the mask must be T_q x T_k)");
}

TEST(Errors, nonFiniteOrNonPositiveScale) {
  const Tensor<float> q({1, 1, 2, 4});
  const auto with = [&](double s) { attention(q, q, q, AttentionOptions{.scale = s, .alignment = kDefaultAlignment}); };
  EXPECT_THROW_MSG(with(0.0), ValueError, "attention: scale must be finite and positive, got 0");
  EXPECT_THROW_MSG(with(-0.5), ValueError, "attention: scale must be finite and positive, got -0.5");
  EXPECT_THROW_MSG(with(std::numeric_limits<double>::quiet_NaN()), ValueError,
                   "attention: scale must be finite and positive, got nan");
  EXPECT_THROW_MSG(with(std::numeric_limits<double>::infinity()), ValueError,
                   "attention: scale must be finite and positive, got inf");
}

TEST(Errors, projectionShapes) {
  const Matrix<double> x = Matrix<double>::Ones(3, 3), w = Matrix<double>::Ones(3, 2);
  const Matrix<double> w42 = Matrix<double>::Ones(4, 2), w34 = Matrix<double>::Ones(3, 4);
  EXPECT_THROW_MSG(single_head_attention(x, w42, w42, w42), ShapeError,
                   "single_head_attention: W_q is [4,2] but X is [3,3] (W_q needs one row per input channel C = 3)");
  EXPECT_THROW_MSG(single_head_attention(x, w, w34, w), ShapeError,
                   "single_head_attention: W_k is [3,4] but W_q is [3,2] (d differs)");
  EXPECT_THROW_MSG(single_head_attention(x, w, w, w42), ShapeError,
                   "single_head_attention: W_v is [4,2] but W_q is [3,2] (C differs)");
}

}  // namespace
}  // namespace attncheck
