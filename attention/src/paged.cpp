#include "attncheck/paged.hpp"

#include <Eigen/Core>
#include <algorithm>
#include <limits>
#include <stdexcept>

#include "attncheck/dtype.hpp"

namespace attncheck {

std::string page_layout_name(PageLayout l) { return l == PageLayout::token_major ? "token-major" : "head-major"; }

std::string page_fill_name(PageFill f) {
  switch (f) {
    case PageFill::zero: return "zero";
    case PageFill::nan: return "nan";
    case PageFill::pos_inf: return "inf";
    case PageFill::neg_inf: return "-inf";
    case PageFill::huge: return "1e30";
  }
  return "?";
}

Shape PagedKV::pool_shape(Index H_kv, Index D) const {
  return layout == PageLayout::token_major ? Shape{num_pages, page_size, H_kv, D} : Shape{num_pages, H_kv, page_size, D};
}

Index PagedKV::pool_offset(Index page, Index slot, Index g, Index d, Index H_kv, Index D) const {
  return layout == PageLayout::token_major ? ((page * page_size + slot) * H_kv + g) * D + d
                                           : ((page * H_kv + g) * page_size + slot) * D + d;
}

void check_paged(const PagedKV& pk, Index B, const std::vector<Index>& lengths) {
  const auto fail = [](const std::string& m) { throw std::invalid_argument("paged K and V: " + m); };
  if (pk.page_size <= 0) fail("page_size must be > 0, got " + std::to_string(pk.page_size));
  if (pk.num_pages < 0) fail("num_pages must be >= 0, got " + std::to_string(pk.num_pages));
  if (Index(lengths.size()) != B)
    fail("expected " + std::to_string(B) + " sequence lengths, got " + std::to_string(lengths.size()));
  if (Index(pk.block_table.size()) != B * pk.max_pages)
    fail("the block table must hold B*max_pages = " + std::to_string(B * pk.max_pages) + " entries, got " +
         std::to_string(pk.block_table.size()));
  for (Index b = 0; b < B; ++b) {
    const Index used = pk.pages_used(lengths[std::size_t(b)]);
    if (used > pk.max_pages)
      fail("sequence " + std::to_string(b) + " of length " + std::to_string(lengths[std::size_t(b)]) + " needs " +
           std::to_string(used) + " pages of " + std::to_string(pk.page_size) + ", the table has " +
           std::to_string(pk.max_pages) + " columns");
    for (Index i = 0; i < used; ++i) {
      const Index page = pk.block_table[std::size_t(b * pk.max_pages + i)];
      if (page < 0 || page >= pk.num_pages)
        fail("block_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(page) +
             " is not a page of the pool [0, " + std::to_string(pk.num_pages) + ")");
    }
  }
}

namespace {
template <class S> S fill_value(PageFill f) {
  switch (f) {
    case PageFill::zero: return S(0);
    case PageFill::nan: return S(std::numeric_limits<double>::quiet_NaN());
    case PageFill::pos_inf: return S(std::numeric_limits<double>::infinity());
    case PageFill::neg_inf: return S(-std::numeric_limits<double>::infinity());
    case PageFill::huge: return S(1e30);
  }
  return S(0);
}
// Bit equality, NaN included: a shared page's two writers must agree exactly.
template <class S> bool same_bits(S a, S b) { return (a == b) || (a != a && b != b); }
}  // namespace

template <class S> Tensor<S> scatter_pages(const Tensor<S>& dense, const std::vector<Index>& lengths, const PagedKV& pk) {
  const Shape& s = dense.shape();
  check_paged(pk, s.B, lengths);
  Tensor<S> pool(pk.pool_shape(s.H, s.D));
  pool.values().setConstant(fill_value<S>(pk.fill));
  // Which pool slots a live key has written, to tell a shared page's second writer from the first.
  std::vector<char> written(std::size_t(pk.num_pages * pk.page_size), 0);
  for (Index b = 0; b < s.B; ++b) {
    const Index len = lengths[std::size_t(b)];
    if (len < 0 || len > s.T)
      throw std::invalid_argument("paged K and V: sequence " + std::to_string(b) + " has length " +
                                  std::to_string(len) + ", expected 0.." + std::to_string(s.T));
    for (Index t = 0; t < len; ++t) {
      const Index page = pk.block_table[std::size_t(b * pk.max_pages + t / pk.page_size)], slot = t % pk.page_size;
      char& w = written[std::size_t(page * pk.page_size + slot)];
      for (Index g = 0; g < s.H; ++g)
        for (Index d = 0; d < s.D; ++d) {
          S& dst = pool.data()[pk.pool_offset(page, slot, g, d, s.H, s.D)];
          if (w && !same_bits(dst, dense(b, g, t, d)))
            throw std::invalid_argument("paged K and V: page " + std::to_string(page) + " is shared, but key " +
                                        std::to_string(t) + " of sequence " + std::to_string(b) +
                                        " differs from the key another sequence wrote there");
          dst = dense(b, g, t, d);
        }
      w = 1;
    }
  }
  return pool;
}

template <class S>
Tensor<S> gather_pages(const Tensor<S>& pool, const PagedKV& pk, Index B, Index H_kv, Index T, Index D,
                       const std::vector<Index>& lengths) {
  check_paged(pk, B, lengths);
  if (!(pool.shape() == pk.pool_shape(H_kv, D)))
    throw std::invalid_argument("paged K and V: expected a pool " + to_string(pk.pool_shape(H_kv, D)) + ", got " +
                                to_string(pool.shape()));
  Tensor<S> dense(Shape{B, H_kv, T, D});
  dense.values().setZero();
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < std::min(lengths[std::size_t(b)], T); ++t) {
      const Index page = pk.block_table[std::size_t(b * pk.max_pages + t / pk.page_size)], slot = t % pk.page_size;
      for (Index g = 0; g < H_kv; ++g)
        for (Index d = 0; d < D; ++d) dense(b, g, t, d) = pool.data()[pk.pool_offset(page, slot, g, d, H_kv, D)];
    }
  return dense;
}

#define ATTNCHECK_PAGED_INSTANTIATE(S)                                                                         \
  template Tensor<S> scatter_pages<S>(const Tensor<S>&, const std::vector<Index>&, const PagedKV&);           \
  template Tensor<S> gather_pages<S>(const Tensor<S>&, const PagedKV&, Index, Index, Index, Index,           \
                                     const std::vector<Index>&);
ATTNCHECK_PAGED_INSTANTIATE(float)
ATTNCHECK_PAGED_INSTANTIATE(double)
ATTNCHECK_PAGED_INSTANTIATE(Eigen::half)
ATTNCHECK_PAGED_INSTANTIATE(Eigen::bfloat16)
#undef ATTNCHECK_PAGED_INSTANTIATE

std::vector<std::int32_t> physical_indices(const IndexList& l, const PagedKV& pk, const std::vector<Index>& lengths) {
  std::vector<std::int32_t> out = l.indices;
  for (std::size_t n = 0; n < out.size(); ++n) {
    const Index b = Index(n) / std::max<Index>(1, l.H * l.T_q * l.max_k), j = out[n];
    if (j < 0) continue;
    out[n] = j >= lengths[std::size_t(b)]
                 ? -1
                 : std::int32_t(pk.block_table[std::size_t(b * pk.max_pages + j / pk.page_size)] * pk.page_size +
                                j % pk.page_size);
  }
  return out;
}

std::vector<std::int32_t> logical_indices(const IndexList& l, const PagedKV& pk, const std::vector<Index>& lengths) {
  std::vector<std::int32_t> out = l.indices;
  for (std::size_t n = 0; n < out.size(); ++n) {
    const Index b = Index(n) / std::max<Index>(1, l.H * l.T_q * l.max_k), s = out[n];
    if (s < 0) continue;
    const Index page = s / pk.page_size, slot = s % pk.page_size, L = lengths[std::size_t(b)];
    Index j = -1;
    for (Index m = 0; m < pk.pages_used(L) && j < 0; ++m)
      if (pk.block_table[std::size_t(b * pk.max_pages + m)] == page && m * pk.page_size + slot < L)
        j = m * pk.page_size + slot;
    if (j < 0)
      throw std::invalid_argument("index list entry " + std::to_string(n) + " is slot " + std::to_string(s) +
                                  " (page " + std::to_string(page) + ", slot " + std::to_string(slot) +
                                  "), which holds no key of batch entry " + std::to_string(b) +
                                  "; expected -1 or the slot of one of its " + std::to_string(L) + " keys");
    out[n] = std::int32_t(j);
  }
  return out;
}

}  // namespace attncheck
