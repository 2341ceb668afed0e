// Tags: what a case holds (extents, mask families, combinations, modifiers, paging, scores), for the
// distribution a run reports.
#include "parts.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numeric>

namespace attncheck {
using namespace generation;

namespace {

// The tags of a case's lengths, head dimensions, heads, key lengths and window.
void tag_extents(const Problem& p, std::vector<std::string>& tags) {
  const Shape& q = p.q.shape();
  const Index T = q.T;
  tags.push_back(T == 1 ? "T=1" : T < 16 ? "T=2..15" : T <= 64 ? "T=16..64" : "T>64");
  // Key lengths at a tile edge, where tiled kernels change trip counts or leave a ragged last tile.
  const Index T_k = p.k.shape().T;
  const auto pow2 = [](Index x) { return x > 0 && (x & (x - 1)) == 0; };
  if (T_k >= 2 && pow2(T_k)) tags.push_back("T_k=2^k");
  if (T_k >= 3 && (pow2(T_k - 1) || pow2(T_k + 1))) tags.push_back("T_k=2^k+-1");
  if (T_k >= 15 && (T_k % 16 <= 1 || T_k % 16 == 15)) tags.push_back("T_k=16m,16m+-1");
  if (T_k > 16) tags.push_back("T_k>16 (two key tiles of 16)");
  const Index D = q.D;
  const Index r = Index(std::lround(std::sqrt(double(D))));
  tags.push_back(pow2(D) ? "D=pow2" : "D=non-pow2");
  if (D % 2) tags.push_back("D=odd");
  if (r * r != D) tags.push_back("D=non-square");
  if (p.v_dim() != D) tags.push_back(p.v_dim() < D ? "D_v<D" : "D_v>D");  // V's own head dimension (MLA)
  if (p.k.shape().T != T) tags.push_back("T_q!=T_k");
  if (p.kv_heads() != q.H) tags.push_back(p.kv_heads() == 1 ? "H_kv=1<H (MQA)" : "1<H_kv<H (GQA)");
  if (!p.key_lengths.empty()) {
    // Each kind of length once per case: all padding, none, and some.
    const Index T_k = p.k.shape().T;
    bool zero = false, full = false, partial = false;
    for (const Index len : p.key_lengths) (len == 0 ? zero : len == T_k ? full : partial) = true;
    tags.push_back("padded");
    if (zero) tags.push_back("length=0");
    if (full) tags.push_back("length=T_k");
    if (partial) tags.push_back("length=partial");
  }
  if (p.window) {
    const Index w = *p.window, T_max = std::max(T, p.k.shape().T);
    tags.push_back(w == 0 ? "window=0" : w == 1 ? "window=1" : w >= T_max ? "window>=T" : "window=2..T-1");
  }
}

// The tags of the masks beyond causal.
void tag_masks(const Problem& p, std::vector<std::string>& tags) {
  const Index T = p.q.shape().T;
  if (!p.causal) tags.push_back("bidirectional");
  if (p.prefix_length > 0) tags.push_back(p.prefix_length >= T ? "prefix>=T" : "prefix");
  if (p.window_right) tags.push_back("window-right");
  if (p.chunk_size > 0) tags.push_back(p.chunk_size >= std::max(T, p.k.shape().T) ? "chunk>=T" : "chunked");
  if (p.block_mask) {
    const BlockMask& m = *p.block_mask;
    bool kinds[3] = {false, false, false};
    for (const std::uint8_t k : m.kinds) kinds[std::min<std::uint8_t>(k, 2)] = true;
    tags.push_back(std::string("block-mask:") + (kinds[0] ? "E" : "") + (kinds[1] ? "P" : "") + (kinds[2] ? "F" : ""));
    if (m.B > 1 || m.H > 1) tags.push_back("block-mask:per-" + std::string(m.B > 1 && m.H > 1 ? "batch-and-head" : m.B > 1 ? "batch" : "head"));
    if (m.block_q != m.block_k) tags.push_back("block-mask:block_q!=block_k");
  }
  if (p.dense_mask) tags.push_back(p.dense_mask->B > 1 || p.dense_mask->H > 1 ? "dense-mask:per-entry" : "dense-mask");
  if (!p.doc_bounds.empty()) {
    tags.push_back("documents");
    for (const auto& bounds : p.doc_bounds)
      if (std::adjacent_find(bounds.begin(), bounds.end()) != bounds.end() ||
          (!bounds.empty() && (bounds.front() == 0 || bounds.back() >= p.k.shape().T))) {
        tags.push_back("empty-document");
        break;
      }
    if (!p.q_doc_bounds.empty()) tags.push_back("query-documents");
  }
}

// Which features of the call came together: each pair of those on (a bug that needs two, or three, shows only
// where they meet), so a run's coverage says which combinations it reached.
void tag_combinations(const Problem& p, std::vector<std::string>& tags) {
  const Shape& q = p.q.shape();
  const Index T = q.T, T_k = p.k.shape().T, D = q.D;
  std::vector<std::string> on;
  if (T < T_k) on.push_back(p.alignment == CausalAlignment::BottomRight ? "T_q<T_k,bottom-right" : "T_q<T_k,top-left");
  if (T > T_k) on.push_back(p.alignment == CausalAlignment::BottomRight ? "T_q>T_k,bottom-right" : "T_q>T_k,top-left");
  if (p.kv_heads() != q.H) on.push_back("grouped");
  if (!p.key_lengths.empty()) on.push_back("padded");
  if (p.window) on.push_back("window");
  if (!p.doc_bounds.empty()) on.push_back(p.q_doc_bounds.empty() ? "documents" : "query-documents");
  if (p.chunk_size > 0) on.push_back("chunked");
  if (!p.causal) on.push_back("no-causal");
  if (p.prefix_length > 0) on.push_back("prefix");
  if (p.window_right) on.push_back("window-right");
  if (p.block_mask) on.push_back("block-mask");
  if (p.dense_mask) on.push_back("dense-mask");
  if (p.v_dim() != D) on.push_back("D_v");
  if (on.size() >= 2) tags.push_back("features-at-once=" + std::string(on.size() >= 3 ? "3+" : "2"));
  for (std::size_t a = 0; a < on.size(); ++a)
    for (std::size_t b = a + 1; b < on.size(); ++b) tags.push_back("with:" + on[a] + "+" + on[b]);
}

// The tags of the score modifiers, the paging, and a KV-cache call.
void tag_modifiers_and_paging(const Problem& p, std::vector<std::string>& tags) {
  const Index T = p.q.shape().T;
  if (p.softcap) tags.push_back("softcap");
  if (!p.alibi_slopes.empty()) tags.push_back("alibi");
  if (!p.sinks.empty()) tags.push_back("sinks");
  if (p.paged) {
    tags.push_back("paged=" + std::to_string(p.paged->page_size) + "," + page_layout_name(p.paged->layout));
    // Lengths ragged across pages: a partial last page (k·page ± 1 among them).
    bool ragged = false;
    for (const Index len : p.sequence_lengths()) ragged = ragged || len % p.paged->page_size != 0;
    if (ragged) tags.push_back("paged:partial-last-page");
    if (p.paged->fill != PageFill::zero) tags.push_back("paged:free-slots=" + page_fill_name(p.paged->fill));
  }
  // KV-cache calls: the new token(s) at the end of the cache.
  if (p.alignment == CausalAlignment::BottomRight && T < p.k.shape().T)
    tags.push_back(T == 1 ? "decode (T_q=1<T_k, bottom-right)" : "chunk (1<T_q<T_k, bottom-right)");
}

// A query that sees no key (bottom-right with T_q > T_k, all padding, ...): its weights must be 0, not uniform.
bool a_query_sees_nothing(const Problem& p) {
  const Shape& q = p.q.shape();
  const Index T = q.T;
  bool empty_row = false;
  for (Index b = 0; b < q.B && !empty_row; ++b)
    for (Index h = 0; h < (p.has_cell_masks() ? q.H : 1) && !empty_row; ++h)
      for (Index i = 0; i < T && !empty_row; ++i) empty_row = p.visibility(b, h).keys(i).empty();
  return empty_row;
}

// The bucket of the case's largest |score|.
std::string score_tag(const Problem& p) {
  const Shape& q = p.q.shape();
  const Index T = q.T, D = q.D;
  // Largest |score| = scale·max|q|·max|k|·D is an upper bound; use the real maximum per head instead.
  const double scale = p.scale ? *p.scale : 1 / std::sqrt(double(D));
  // 64 query rows at a time into one buffer: a long context's [T_q,T_k] scores would not fit in memory, and a
  // fresh block per step would cost a page fault per 4 KiB written.
  double smax = 0;
  if (double(q.B) * double(q.H) * double(T) * double(p.k.shape().T) > kMaterialisedWeights) {
    // A long context: the exact maximum would cost as much as a forward in double; the Cauchy-Schwarz bound
    // scale·max|q_i|·max|k_j| (row norms) buckets the case instead.
    for (Index b = 0; b < q.B; ++b)
      for (Index h = 0; h < q.H; ++h)
        smax = std::max(smax, p.q.head(b, h).rowwise().norm().maxCoeff() *
                                  p.k.head(b, kv_head(h, q.H, p.kv_heads())).rowwise().norm().maxCoeff() * scale);
    return smax > 1e4 ? "|score|>1e4" : smax > 10 ? "|score|=10..1e4" : "|score|<=10";
  }
  constexpr Index kRows = 64;
  Matrix<double> block(std::min(kRows, T), p.k.shape().T);
  for (Index b = 0; b < q.B; ++b)
    for (Index h = 0; h < q.H; ++h) {
      const auto k = p.k.head(b, kv_head(h, q.H, p.kv_heads()));
      for (Index i = 0; i < T; i += kRows) {
        const Index n = std::min(kRows, T - i);
        block.topRows(n).noalias() = p.q.head(b, h).middleRows(i, n) * k.transpose();
        smax = std::max(smax, block.topRows(n).cwiseAbs().maxCoeff() * scale);
      }
    }
  return smax > 1e4 ? "|score|>1e4" : smax > 10 ? "|score|=10..1e4" : "|score|<=10";
}

}  // namespace

std::vector<std::string> shape_tags(const Problem& p) {
  std::vector<std::string> tags;
  tag_extents(p, tags);
  tag_masks(p, tags);
  tag_combinations(p, tags);
  tag_modifiers_and_paging(p, tags);
  if (a_query_sees_nothing(p)) tags.push_back("a-query-sees-nothing");
  tags.push_back(score_tag(p));
  return tags;
}

}  // namespace attncheck
