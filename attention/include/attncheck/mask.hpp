// Visibility masks over [T_q,T_k] scores, as two distinct types: a boolean mask applied as a select, and an
// additive 0/-inf mask applied as an add. Both broadcast over batch and heads; converting is explicit.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attncheck/tensor.hpp"

namespace attncheck {

struct ScoreBias;  // attncheck/attention.hpp

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

/// An explicit per-cell mask over [T_q,T_k] for every (batch entry, head), B and H each either the call's or 1
/// (broadcast): key j visible to query i of (b,h) when the cell is not 0. A dense boolean mask, and the cells of
/// a block mask's partial blocks (attncheck/plugin.h's attncheck_dense_mask).
struct DenseMask {
  Index B = 1, H = 1, T_q = 0, T_k = 0;
  std::vector<std::uint8_t> cells;  ///< [B,H,T_q,T_k] row-major
  bool visible(Index b, Index h, Index i, Index j) const {
    return cells[std::size_t((((B == 1 ? 0 : b) * H + (H == 1 ? 0 : h)) * T_q + i) * T_k + j)] != 0;
  }
  bool operator==(const DenseMask&) const = default;
};

/// Selected keys (ABI 4's attncheck_index_list): for each batch entry, list head and query, up to max_k key indices, or
/// block indices with a block size (block n holds keys [n·block_size, (n+1)·block_size): NSA's selection, MoBA), -1
/// padding anywhere in a row. The list heads are the kv heads (each shared by its group of `group` query heads:
/// DeepSeek's DSA over one latent head, NSA's per-group selection) or the query heads (group 1). Set semantics: a key
/// listed twice is listed once. A query sees the keys its row lists and every other rule allows (an intersection).
struct IndexList {
  Index block_size = 1;
  Index group = 1;  ///< query heads per list head: H / H_kv for lists per kv head, 1 for lists per query head
  Index B = 1, H = 1, T_q = 0, max_k = 0;  ///< H the list heads (H_kv or the query heads)
  std::vector<std::int32_t> indices{};     ///< [B,H,T_q,max_k] row-major; -1 or a key (block) index < T_k's units
  /// How the entries cross to a paged implementation (Feature::index_list_physical): as the pool's slots
  /// (physical_indices in attncheck/paged.hpp: FlashMLA's sparse indices) rather than key positions. The entries here
  /// are key positions whatever it says; without pages it changes nothing.
  bool physical = false;
  /// Whether a key listed n times in a row weighs n·e^s rather than e^s (duplicates counted, as a gather kernel that
  /// attends over each entry it reads computes: the declaration Feature::index_list_counted). false: a row is a set.
  /// Visibility is the same either way; the count is a score modifier (HeadModifiers::counted: the score plus ln n).
  bool counted = false;
  /// Whether each query's own block (the block of its aligned position, that of the key the causal rule's diagonal
  /// falls on; its own key with key indices) is selected besides the row's entries, as MoBA always selects the
  /// current block (the declaration Feature::index_list_current_block). The causal rule still cuts inside it.
  bool current_block = false;
  /// How many times the row of (b, h, i) lists key j's unit.
  Index count(Index b, Index h, Index i, Index j) const {
    const std::int32_t* r = row(b, h, i);
    const Index unit = j / block_size;
    Index n = 0;
    for (Index e = 0; e < max_k; ++e) n += r[e] == unit ? 1 : 0;
    return n;
  }
  /// The row of query i of batch entry b and query head h.
  const std::int32_t* row(Index b, Index h, Index i) const {
    return indices.data() + std::size_t(((b * H + h / group) * T_q + i) * max_k);
  }
  /// Whether that row lists key j (its block).
  bool lists(Index b, Index h, Index i, Index j) const {
    const std::int32_t* r = row(b, h, i);
    const Index unit = j / block_size;
    for (Index n = 0; n < max_k; ++n)
      if (r[n] == unit) return true;
    return false;
  }
  bool operator==(const IndexList&) const = default;
};

/// A tree of draft tokens per batch entry (speculative decoding: EAGLE's and SGLang's top-k trees, Medusa; ABI 4's
/// attncheck_tree). The call's T_q queries are the tree's nodes and the last T_q of the entry's L keys (L = its key
/// length, T_k without padding): node n is query n and key P + n, P = L - T_q the prefix every node sees. Given
///  - as a parent array (Form::parents): node n's parent in [0, n), or -1 for a child of the prefix; node i sees
///    the prefix, its ancestors and itself;
///  - or as a packed bitmask (Form::bitmask: FlashInfer's packed_custom_mask with mask_indptr): entry b's T_q rows
///    of L cells each (its row stride), row-major, from byte offsets[b]; cell c is bit c % 8 of byte c / 8 (little,
///    FlashInfer's order) or bit 7 - c % 8 (big, numpy.packbits' default). A bitmask may hold any cells.
/// Keys past L are no node's and hidden. Intersected with every other rule, as every cell family is.
struct TokenTree {
  enum class Form : std::uint8_t { parents = 1, bitmask = 2 };
  Form form = Form::parents;
  bool big_endian = false;  ///< the bitmask's bit order: false little (bit 0 first), true big
  Index B = 1, T_q = 0;
  std::vector<std::int32_t> parents{};  ///< Form::parents: [B, T_q]
  std::vector<std::uint8_t> bits{};     ///< Form::bitmask: the packed cells
  std::vector<Index> offsets{};         ///< Form::bitmask: [B + 1] byte offsets, entry b's rows from offsets[b]
  /// Node n's parent in batch entry b (-1: a child of the prefix).
  Index parent(Index b, Index n) const { return parents[std::size_t(b * T_q + n)]; }
  /// Whether node `a` is node n or one of its ancestors (parent form).
  bool ancestor_or_self(Index b, Index a, Index n) const {
    for (; n >= a; n = parent(b, n))
      if (n == a) return true;
    return false;
  }
  /// Node n's depth in batch entry b, whose entry holds `length` keys: how many earlier nodes its row shows (its
  /// ancestors, for a tree; a bitmask's other cells counted alike). Its position for every rule that reads one
  /// (a window, ALiBi) is the prefix's length plus its depth.
  Index depth(Index b, Index n, Index length) const {
    Index d = 0;
    if (form == Form::parents) {
      for (Index m = parent(b, n); m >= 0; m = parent(b, m)) ++d;
      return d;
    }
    for (Index m = 0; m < n; ++m) d += sees(b, n, length - T_q + m, length) ? 1 : 0;
    return d;
  }
  /// Whether query i of batch entry b, whose entry holds `length` keys, sees key j by the tree.
  bool sees(Index b, Index i, Index j, Index length) const {
    if (j < 0 || j >= length) return false;
    if (form == Form::bitmask) {
      const Index c = i * length + j;
      const std::uint8_t byte = bits[std::size_t(offsets[std::size_t(b)] + c / 8)];
      return ((byte >> (big_endian ? 7 - c % 8 : c % 8)) & 1) != 0;
    }
    const Index P = length - T_q;
    return j < P || ancestor_or_self(b, j - P, i);
  }
  bool operator==(const TokenTree&) const = default;
};

/// The packed bitmask (Form::bitmask, in the given bit order) of B entries of T_q rows over `lengths` keys each (one
/// per batch entry) whose cell (b, i, j) is cell(b, i, j): each entry's rows from a byte boundary, as FlashInfer's
/// segment_packbits lays them out.
TokenTree bitmask_tree(Index B, Index T_q, const std::vector<Index>& lengths, bool big_endian,
                       const std::function<bool(Index b, Index i, Index j)>& cell);
/// The packed bitmask of a tree given by its parents (bitmask_tree of the cells it shows).
TokenTree packed_tree(const TokenTree& parents, const std::vector<Index>& lengths, bool big_endian);

/// The kinds of block of a BlockMask (the values of attncheck/plugin.h's ATTNCHECK_BLOCK_*).
enum class BlockKind : std::uint8_t { Empty = 0, Partial = 1, Full = 2 };

/// FlexAttention's BlockMask (attncheck/plugin.h's attncheck_block_mask): query block m holds queries
/// [m·block_q, (m+1)·block_q), key block n keys [n·block_k, (n+1)·block_k) (the last of each may be short); each
/// block of each (b,h) (B and H each the call's or 1: broadcast) is empty (every key hidden), full (every key
/// visible) or partial (the cells of `partial` say).
struct BlockMask {
  Index block_q = 1, block_k = 1;
  Index B = 1, H = 1, q_blocks = 0, k_blocks = 0;
  std::vector<std::uint8_t> kinds;  ///< [B,H,q_blocks,k_blocks] BlockKind values
  /// Read only inside partial blocks; may have no cells when no block is partial.
  DenseMask partial{};
  BlockKind kind(Index b, Index h, Index m, Index n) const {
    return BlockKind(
        kinds[std::size_t((((B == 1 ? 0 : b) * H + (H == 1 ? 0 : h)) * q_blocks + m) * k_blocks + n)]);
  }
  bool visible(Index b, Index h, Index i, Index j) const {
    const BlockKind k = kind(b, h, i / block_q, j / block_k);
    return k == BlockKind::Full || (k == BlockKind::Partial && partial.visible(b, h, i, j));
  }
  bool operator==(const BlockMask&) const = default;
};

/// The block encoding of `cells` with blocks of block_q x block_k: a block whose cells are all visible is full,
/// one with none visible is empty, any other is partial (its cells kept).
BlockMask block_encoding(const DenseMask& cells, Index block_q, Index block_k);
/// The dense mask a block mask stands for, [B,H,T_q,T_k] with its B and H.
DenseMask dense_of(const BlockMask& m, Index T_q, Index T_k);

/// Which keys each query of one batch entry may see: every mask family present must allow a key.
/// Query i sits at the aligned position p = i (top-left) or i + T_k - T_q (bottom-right); key j is visible when
///  - the causal rule allows it: j <= p, or j < prefix (prefix-LM: the prefix is bidirectional); no rule when
///    causal is false;
///  - it is real: j < key_length (key padding);
///  - it is inside the window: p - window <= j (left) and j <= p + window_right (right);
///  - it is in the query's chunk: floor(j / chunk) == floor(p / chunk) (chunked local attention, Llama 4);
///  - it is in the query's document: documents are contiguous runs of key positions, document d starting at
///    doc_bounds[d - 1] (0 for d = 0) and ending at doc_bounds[d] (T_k for the last), so a bound repeated is an
///    empty document; the query's document is the one holding key position clamp(p, 0, T_k - 1) (packed
///    sequences: causal inside a document through the causal rule). With query bounds of their own
///    (q_doc_bounds: FlashAttention varlen's cu_seqlens_q beside cu_seqlens_k), query i belongs to the document
///    d those bounds give it instead, and its aligned position is taken inside d: with d's queries [qs, qe) and
///    keys [ks, ke), p = ks + (i - qs), plus (ke - ks) - (qe - qs) under bottom-right alignment (each document
///    aligned on its own lengths, as FlashAttention aligns each sequence). Query bounds equal to the derived ones
///    give the same positions as none.
///    Every family (the causal rule, windows, chunks, ALiBi) then reads that p.
///  - the block mask and the dense mask, when given, allow it for this visibility's (batch, head).
/// Each family but the last cuts one contiguous range, so without a block or dense mask the visible keys are one
/// contiguous range, run(i), whose ends never move left as i grows; a block or dense mask may hide any key of the
/// run (then keys(i) is the span from the first visible key to the last, and visible() tells each key).
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
  /// The queries' document bounds (query indices, as many as doc_bounds; non-decreasing, those >= T_q only add
  /// empty documents at the end); null: each query's document follows from its aligned position. Read only with
  /// doc_bounds. Points into the options.
  const std::vector<Index>* q_doc_bounds = nullptr;
  /// A block mask and a dense mask, or null; point into the options. Read at (batch, head).
  const BlockMask* block = nullptr;
  const DenseMask* dense = nullptr;
  /// Selected keys, or null; points into the options. Read at (batch, head).
  const IndexList* index = nullptr;
  /// A tree of draft tokens, or null; points into the options. Read at batch, over the entry's key_length keys.
  const TokenTree* tree = nullptr;
  /// An additive bias that holds a -inf (AttentionOptions::bias), or null: a bias of -inf hides its cell exactly
  /// as a mask does, so every path, oracle and bound treats it as hidden and never adds -inf to a score. Null for
  /// a finite bias, whose cells are all visible. Points into the options; read at (batch, head).
  const ScoreBias* bias = nullptr;
  Index batch = 0, head = 0;
  /// With a tree and a rule that reads positions (a window, ALiBi): each node's depth in this batch entry
  /// (TokenTree::depth), shared by the copies of this visibility; null otherwise.
  std::shared_ptr<const std::vector<Index>> depths{};

  /// The aligned position p of query i: where the causal rule (and chunks, documents) place it. (Inline but for
  /// documents with query bounds: kernels and rules ask it for every cell.)
  Index position(Index i) const {
    if (q_doc_bounds && doc_bounds) return document_position(i);
    return alignment == CausalAlignment::TopLeft ? i : i + T_k - T_q;
  }
  /// position(i) for documents with query bounds of their own.
  Index document_position(Index i) const;
  /// Where query i sits for the rules that read a distance (a window, ALiBi): its aligned position, or in a tree
  /// the entry's prefix length plus its depth (a draft token's place in the sequence it would continue).
  Index place(Index i) const {
    if (!depths) return position(i);
    return (key_length < 0 ? T_k : key_length) - T_q + (*depths)[std::size_t(i)];
  }
  /// Where key j sits for those rules: j, or a node's key the place of its node.
  Index key_place(Index j) const {
    if (!depths) return j;
    const Index P = (key_length < 0 ? T_k : key_length) - T_q;
    return j < P || j >= P + T_q ? j : P + (*depths)[std::size_t(j - P)];
  }
  /// The run the contiguous families leave query i: every visible key lies in it, and every key of it is visible
  /// unless a block or dense mask hides it.
  KeyRange run(Index i) const;
  /// Whether a block or dense mask applies (then the visible keys of a row may have gaps).
  bool has_cells() const {
    return block != nullptr || dense != nullptr || bias != nullptr || index != nullptr || tree != nullptr;
  }
  /// Whether the block and dense masks and the bias's -inf cells allow key j to query i (true without them).
  bool cells_allow(Index i, Index j) const {
    return (!block || block->visible(batch, head, i, j)) && (!dense || dense->visible(batch, head, i, j)) &&
           (!bias || !bias_hides(i, j)) && (!index || index_selects(i, j)) &&
           (!tree || tree->sees(batch, i, j, key_length < 0 ? T_k : key_length)) &&
           (!depths || !window || key_place(j) >= place(i) - *window);  // a tree's window, on the nodes' places
  }
  /// Whether the bias is -inf at cell (i, j) of this visibility's (batch, head).
  bool bias_hides(Index i, Index j) const;
  /// Whether the index list selects key j for query i: its row lists j's unit, or (IndexList::current_block) j lies
  /// in the block of query i's aligned position.
  bool index_selects(Index i, Index j) const;
  bool visible(Index i, Index j) const { return run(i).contains(j) && cells_allow(i, j); }
  /// The span of the keys query i sees: from the first visible key to one past the last (empty when it sees
  /// none); exactly the keys it sees without a block or dense mask.
  KeyRange keys(Index i) const;
  /// How many keys query i sees.
  Index count(Index i) const;
  /// Calls f(begin, end) for each maximal run of visible keys of query i inside [j0, j1), in order.
  template <class F> void for_each_run(Index i, Index j0, Index j1, F&& f) const {
    const KeyRange r = run(i);
    const Index a = std::max(r.begin, j0), e = std::min(r.end, j1);
    if (!has_cells()) {
      if (a < e) f(a, e);
      return;
    }
    for (Index j = a; j < e;) {
      while (j < e && !cells_allow(i, j)) ++j;
      const Index s = j;
      while (j < e && cells_allow(i, j)) ++j;
      if (s < j) f(s, j);
    }
  }
  /// The document query i belongs to (0 without documents), and the one key j belongs to.
  Index query_document(Index i) const;
  Index key_document(Index j) const;
  /// Which family hides key j from query i, in the order above ("causal", "padding", "window", "right window",
  /// "chunk", "document", "block mask", "dense mask", "bias", "index list", "tree"); empty when j is visible.
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
