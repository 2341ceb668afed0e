// Visibility masks over [T_q,T_k] scores, as two distinct types: a boolean mask applied as a select, and an
// additive 0/-inf mask applied as an add. Both broadcast over batch and heads; converting is explicit.
#pragma once

#include <Eigen/Core>
#include <optional>
#include <string>
#include <vector>

#include "attncheck/tensor.hpp"

namespace attncheck {

/// Which keys a query may see when T_q != T_k.
///  - TopLeft: query i sees keys j <= i (PyTorch's `is_causal`). The default.
///  - BottomRight: query i sees keys j <= i + T_k - T_q (FlashAttention >= 2.1, KV-cache decoding): the
///    last query sees every key.
/// With T_q == T_k both are the ordinary lower triangle.
enum class CausalAlignment { TopLeft, BottomRight };

/// The alignment used when none is given.
inline constexpr CausalAlignment kDefaultAlignment = CausalAlignment::TopLeft;

/// Last key index query i may see (may be negative: then the row sees nothing).
Index last_visible_key(Index i, Index T_q, Index T_k, CausalAlignment a);

/// A contiguous run of key indices [begin, end); empty when end <= begin.
struct KeyRange {
  Index begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  Index size() const { return end > begin ? end - begin : 0; }
  bool contains(Index j) const { return begin <= j && j < end; }
};

/// Which keys each query of one batch entry may see: every mask family present must allow a key (issue 24).
/// Query i sits at the aligned position p = i (top-left) or i + T_k - T_q (bottom-right); key j is visible when
///  - the causal rule allows it: j <= p, or j < prefix (prefix-LM: the prefix is bidirectional); no rule when
///    causal is false;
///  - it is real: j < key_length (key padding);
///  - it is inside the window: p - window <= j (left) and j <= p + window_right (right);
///  - it is in the query's chunk: floor(j / chunk) == floor(p / chunk) (chunked local attention, Llama 4);
///  - it is in the query's document: documents are contiguous runs of key positions, document d starting at
///    doc_bounds[d - 1] (0 for d = 0) and ending at doc_bounds[d] (T_k for the last), so a bound repeated is an
///    empty document; the query's document is the one holding key position clamp(p, 0, T_k - 1) (packed
///    sequences: causal inside a document through the causal rule).
/// Each family cuts one contiguous range, so the visible keys are always one contiguous range, whose ends never
/// move left as i grows.
struct Visibility {
  Index T_q = 1, T_k = 1;
  CausalAlignment alignment = kDefaultAlignment;
  Index key_length = -1;        ///< keys j >= key_length are padding; negative: no padding (every key is real)
  std::optional<Index> window{};  ///< FlashAttention's left window w >= 0; empty: no window
  /// false: no causal rule (bidirectional, an encoder): every key up to the padding, from the window's start,
  /// is visible whatever the position.
  bool causal = true;
  Index prefix = 0;                     ///< keys j < prefix are visible to every query despite the causal rule
  std::optional<Index> window_right{};  ///< right window wr >= 0: j <= p + wr; empty: none
  Index chunk = 0;                      ///< chunk size > 0; 0: none
  /// The documents' bounds (non-decreasing, >= 0; those >= T_k only add empty documents at the end); null: one
  /// document. Points into the options the visibility was made from.
  const std::vector<Index>* doc_bounds = nullptr;

  /// The aligned position p of query i.
  Index position(Index i) const;
  /// The keys query i sees.
  KeyRange keys(Index i) const;
  bool visible(Index i, Index j) const { return keys(i).contains(j); }
  /// The document query i belongs to (0 without documents), and the one key j belongs to.
  Index query_document(Index i) const;
  Index key_document(Index j) const;
  /// Which family hides key j from query i, in the order above ("causal", "padding", "window", "right window",
  /// "chunk", "document"); empty when j is visible.
  std::string hidden_by(Index i, Index j) const;
};

/// The document of key position j under bounds (the number of bounds <= j).
Index document_of(const std::vector<Index>& bounds, Index j);

class AdditiveMask;

/// Boolean visibility mask: visible(i,j) says whether query i may look at key j. Applied as a select, so
/// whatever sits in a masked score (even NaN or Inf) never reaches the weights or the output.
class BoolMask {
 public:
  using Array = Eigen::Array<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Wraps an explicit [T_q,T_k] visibility array; throws ShapeError when it is empty.
  explicit BoolMask(Array visible);
  /// The causal mask for T_q queries over T_k keys under the given alignment.
  static BoolMask causal(Index T_q, Index T_k, CausalAlignment a = kDefaultAlignment);
  /// The mask of a Visibility rule (causal, with key padding and a window).
  static BoolMask of(const Visibility& v);
  /// Every key visible to every query (no mask).
  static BoolMask full(Index T_q, Index T_k);

  Index rows() const { return visible_.rows(); }
  Index cols() const { return visible_.cols(); }
  bool visible(Index i, Index j) const { return visible_(i, j); }
  const Array& array() const { return visible_; }

  /// 0 where visible, -inf where not.
  AdditiveMask to_additive() const;

 private:
  Array visible_;
};

/// Additive mask: bias(i,j) is added to score (i,j) before softmax; 0 keeps it, -inf removes it. An Inf or
/// NaN already in a masked score survives the add (-inf + inf = NaN), which is why BoolMask exists.
class AdditiveMask {
 public:
  using Array = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  /// Wraps an explicit [T_q,T_k] bias array; throws ShapeError when it is empty.
  explicit AdditiveMask(Array bias);
  /// The causal mask (0 on visible cells, -inf on the rest).
  static AdditiveMask causal(Index T_q, Index T_k, CausalAlignment a = kDefaultAlignment);

  Index rows() const { return bias_.rows(); }
  Index cols() const { return bias_.cols(); }
  float bias(Index i, Index j) const { return bias_(i, j); }
  const Array& array() const { return bias_; }

  /// Visible wherever the bias is not -inf. Lossy for finite non-zero biases (their value is dropped).
  BoolMask to_bool() const;

 private:
  Array bias_;
};

}  // namespace attncheck
