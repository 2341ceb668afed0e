// Paged K and V (ABI 3, attncheck/plugin.h's attncheck_paged_kv): a pool of fixed-size pages and, per
// sequence, a block table of page indices, as serving engines store the KV cache (vLLM's PagedAttention,
// FlashInfer, FlashAttention's paged_kv_block_size). Key t of sequence b lives in page
// block_table[b·max_pages + t / page_size], slot t % page_size. Everything else in the pool (slots past a
// sequence's length, pages no sequence references) and every table entry past a sequence's last page holds
// anything at all, out-of-range page numbers included, and must never be read.
//
// The core attends to dense [B,H_kv,T_k,D] K and V; a paged call is the same problem laid out differently, so
// the reference scatters dense K and V into a pool and a paged kernel's answer is checked against the dense
// oracle. gather_pages() is the inverse a correct paged kernel computes, read only through the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attncheck/mask.hpp"
#include "attncheck/tensor.hpp"

namespace attncheck {

/// The order of a page's elements (ATTNCHECK_PAGED_TOKEN_MAJOR / _HEAD_MAJOR).
enum class PageLayout {
  token_major,  ///< a pool [num_pages, page_size, H_kv, D] (vLLM, FlashInfer's NHD)
  head_major,   ///< a pool [num_pages, H_kv, page_size, D] (FlashInfer's HND)
};

/// What the pool holds where no live key sits (slots past a sequence's length, unreferenced pages).
enum class PageFill { zero, nan, pos_inf, neg_inf, huge /* 1e30: Inf in float16 */ };

/// "token-major" / "head-major"; "zero", "nan", "inf", "-inf", "1e30".
std::string page_layout_name(PageLayout l);
std::string page_fill_name(PageFill f);

/// A paged layout: the pool's geometry and the block table, explicit.
struct PagedKV {
  Index page_size = 16;
  PageLayout layout = PageLayout::token_major;
  Index num_pages = 0;
  Index max_pages = 0;                    ///< the table's width (its row stride)
  std::vector<std::int32_t> block_table;  ///< [B, max_pages], row-major; entries past a sequence's pages: anything
  PageFill fill = PageFill::zero;

  /// Pages sequence b uses: ceil(length / page_size).
  Index pages_used(Index length) const { return (length + page_size - 1) / page_size; }
  /// The pool's shape for kv heads H_kv and head dim D, in the layout's order (as a 4-axis Shape: B the page).
  Shape pool_shape(Index H_kv, Index D) const;
  /// Offset of element (page, slot, g, d) in a contiguous pool of that shape.
  Index pool_offset(Index page, Index slot, Index g, Index d, Index H_kv, Index D) const;
};

/// Checks a layout against B sequences of the given lengths: page_size > 0, a table of B·max_pages entries,
/// max_pages >= every sequence's pages, every referenced page in [0, num_pages). Throws std::invalid_argument
/// naming what was expected and what came.
void check_paged(const PagedKV& pk, Index B, const std::vector<Index>& lengths);

/// An index list's entries (key positions) as the pool's slots (page·page_size + slot: DeepSeek's FlashMLA sparse
/// indices) where sequences of `lengths` keys lie as pk lays them out; -1 for padding and for a key past its
/// sequence's length (it has no slot, and no rule lets a query see it). Key indices only (block_size 1).
std::vector<std::int32_t> physical_indices(const IndexList& l, const PagedKV& pk, const std::vector<Index>& lengths);
/// The inverse: slots back to key positions, -1 kept. Throws std::invalid_argument naming an entry whose slot holds
/// no key of its sequence (a page its table does not list for it, or a slot past its length).
std::vector<std::int32_t> logical_indices(const IndexList& l, const PagedKV& pk, const std::vector<Index>& lengths);

/// Dense [B,H_kv,T,D] laid out in pages: every live key (t < lengths[b]) written to its page and slot, every
/// other element of the pool set to pk.fill. A page two sequences both reference (a shared prefix) must get
/// the same keys from both: std::invalid_argument otherwise.
template <class S> Tensor<S> scatter_pages(const Tensor<S>& dense, const std::vector<Index>& lengths, const PagedKV& pk);

/// The inverse, read only through the table: dense [B,H_kv,T,D] from a pool, keys t >= lengths[b] set to 0.
template <class S>
Tensor<S> gather_pages(const Tensor<S>& pool, const PagedKV& pk, Index B, Index H_kv, Index T, Index D,
                       const std::vector<Index>& lengths);

}  // namespace attncheck
