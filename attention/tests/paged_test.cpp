// Paged K and V on hand-made layouts: scatter_pages puts key t of sequence b exactly at
// block_table[b][t / page_size], slot t % page_size, in either layout, and fills everything else; gather_pages
// reads the dense tensor back through the table alone; a bad layout is refused naming what came.
#include <gtest/gtest.h>

#include <cmath>

#include "attncheck/paged.hpp"

namespace attncheck {
namespace {

// Dense [B,H_kv,T,D] with every element distinct: 1000·b + 100·g + 10·t + d + 1.
Tensor<double> numbered(Index B, Index H, Index T, Index D) {
  Tensor<double> t(Shape{B, H, T, D});
  for (Index b = 0; b < B; ++b)
    for (Index g = 0; g < H; ++g)
      for (Index i = 0; i < T; ++i)
        for (Index d = 0; d < D; ++d) t(b, g, i, d) = double(1000 * b + 100 * g + 10 * i + d + 1);
  return t;
}

// Two sequences of lengths 5 and 3 in pages of 2: sequence 0 uses pages 4, 0, 2; sequence 1 pages 1, 3;
// page 5 is spare. The table has 4 columns; entries past each sequence's pages are junk.
PagedKV layout(PageLayout l) {
  PagedKV pk;
  pk.page_size = 2;
  pk.layout = l;
  pk.num_pages = 6;
  pk.max_pages = 4;
  pk.block_table = {4, 0, 2, -7, 1, 3, 99, 2147483647};
  pk.fill = PageFill::nan;
  return pk;
}

TEST(Paged, scatterPutsEachKeyAtItsPageAndSlotInBothLayouts) {
  const Tensor<double> dense = numbered(2, 2, 5, 3);
  const std::vector<Index> lengths{5, 3};
  for (const PageLayout l : {PageLayout::token_major, PageLayout::head_major}) {
    const PagedKV pk = layout(l);
    const Tensor<double> pool = scatter_pages(dense, lengths, pk);
    EXPECT_EQ(pool.shape(), (Shape{6, 2, 2, 3}));  // 6 pages of 2 slots, 2 heads, D = 3 (either order)
    // Written out: (page, slot) of each live key, from the table above.
    const Index where[2][5][2] = {{{4, 0}, {4, 1}, {0, 0}, {0, 1}, {2, 0}}, {{1, 0}, {1, 1}, {3, 0}, {-1, -1}, {-1, -1}}};
    int live = 0;
    for (Index b = 0; b < 2; ++b)
      for (Index t = 0; t < lengths[std::size_t(b)]; ++t)
        for (Index g = 0; g < 2; ++g)
          for (Index d = 0; d < 3; ++d) {
            const auto [page, slot] = where[b][t];
            const Index at = l == PageLayout::token_major ? ((page * 2 + slot) * 2 + g) * 3 + d
                                                          : ((page * 2 + g) * 2 + slot) * 3 + d;
            EXPECT_EQ(pool.data()[at], dense(b, g, t, d)) << page_layout_name(l) << " b" << b << " t" << t;
            ++live;
          }
    // Everything else is the fill: 6 pages · 2 slots · 2 heads · 3 = 72 elements, 8 live keys · 6 of them.
    int filled = 0;
    for (Index n = 0; n < pool.size(); ++n) filled += std::isnan(pool.data()[n]);
    EXPECT_EQ(live, 48);
    EXPECT_EQ(filled, 72 - 48);
  }
}

TEST(Paged, gatherReadsTheDenseTensorBackThroughTheTable) {
  const Tensor<double> dense = numbered(2, 2, 5, 3);
  const std::vector<Index> lengths{5, 3};
  for (const PageLayout l : {PageLayout::token_major, PageLayout::head_major}) {
    const PagedKV pk = layout(l);
    const Tensor<double> back = gather_pages(scatter_pages(dense, lengths, pk), pk, 2, 2, 5, 3, lengths);
    for (Index b = 0; b < 2; ++b)
      for (Index g = 0; g < 2; ++g)
        for (Index t = 0; t < 5; ++t)
          for (Index d = 0; d < 3; ++d)
            EXPECT_EQ(back(b, g, t, d), t < lengths[std::size_t(b)] ? dense(b, g, t, d) : 0.0) << b << g << t << d;
  }
}

TEST(Paged, aSharedPageMustGetTheSameKeysFromBothSequences) {
  Tensor<double> dense = numbered(2, 1, 4, 1);
  PagedKV pk;
  pk.page_size = 2;
  pk.num_pages = 3;
  pk.max_pages = 2;
  pk.block_table = {0, 1, 0, 2};  // both sequences start in page 0
  EXPECT_THROW(scatter_pages(dense, {4, 4}, pk), std::invalid_argument);
  for (Index t = 0; t < 2; ++t) dense(1, 0, t, 0) = dense(0, 0, t, 0);
  const Tensor<double> pool = scatter_pages(dense, {4, 4}, pk);
  EXPECT_EQ(pool.data()[1], dense(0, 0, 1, 0));
}

TEST(Paged, aBadLayoutIsRefusedNamingWhatCame) {
  const Tensor<double> dense = numbered(2, 1, 5, 1);
  const auto message = [&](PagedKV pk, std::vector<Index> lengths) {
    try {
      scatter_pages(dense, lengths, pk);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PagedKV pk = layout(PageLayout::token_major);
  EXPECT_NE(message(pk, {5, 3, 1}).find("expected 2 sequence lengths, got 3"), std::string::npos);
  PagedKV narrow = pk;
  narrow.max_pages = 2;
  narrow.block_table.resize(4);
  EXPECT_NE(message(narrow, {5, 3}).find("needs 3 pages of 2, the table has 2 columns"), std::string::npos);
  PagedKV out = pk;
  out.block_table[1] = 6;
  EXPECT_NE(message(out, {5, 3}).find("block_table[0][1] = 6 is not a page of the pool [0, 6)"), std::string::npos);
  // Entries past a sequence's pages are never read, so junk there is no error.
  EXPECT_EQ(message(pk, {5, 3}), "no error");
}

}  // namespace
}  // namespace attncheck
