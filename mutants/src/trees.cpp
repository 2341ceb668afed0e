// Tree kernels (speculative decoding's verification of a tree of draft tokens, ABI 4's attncheck_tree_mask): each
// builds the tree's mask wrong the way speculative-decoding trackers report it: the prefix hidden from the nodes,
// every earlier node seen (causal, not the tree), a node blind to itself, the walk up the tree stopped at the parent,
// the bitmask's bits read in the other order, every request's rows read with the first request's stride, the
// per-request offsets ignored, the mask of an earlier call of the same shape reused. Each rewrites the tree into the
// cells it would read and runs the reference on them; the control walks the parent pointers itself and attends over the
// keys it collects.
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

Capabilities tree_capabilities(bool parents = true, bool bitmask = true) {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::key_padding, Feature::lse});
  c.features.set(Feature::tree, parents);
  c.features.set(Feature::tree_bitmask, bitmask);
  return c;
}

// A tree kernel with a left window and ALiBi, which read each node's place (the prefix's length plus its depth).
Capabilities placing_capabilities() {
  Capabilities c = tree_capabilities();
  c.features.add({Feature::window, Feature::alibi});
  return c;
}

// A kernel that places each node at its index (key L - T_q + i of its entry, as a causal call over the entry's keys
// would), not at the prefix's length plus its depth, for the window (`window`) or ALiBi: the reference on the tree's
// cells cut by that window, or with that ALiBi written out as a bias.
ImplementationPtr placed_by_index(const char* name, const char* description, bool window) {
  return make_implementation(name, description, placing_capabilities(), [=](const Problem& p) {
    if (!p.tree || (window ? !p.window : p.alibi_slopes.empty())) return reference_implementation()->forward(p);
    const std::vector<Index> L = p.sequence_lengths();
    const Index B = p.q.shape().B, H = p.q.shape().H, T_q = p.tree->T_q, T_k = p.k.shape().T;
    const auto at_index = [&](Index b, Index i) { return L[std::size_t(b)] - T_q + i; };
    Problem r = p;
    if (window) {
      r.tree = bitmask_tree(B, T_q, L, false, [&](Index b, Index i, Index j) {
        return p.tree->sees(b, i, j, L[std::size_t(b)]) && j >= at_index(b, i) - *p.window;
      });
      r.window.reset();
    } else {
      ScoreBias bias{.B = B, .H = H, .T_q = T_q, .T_k = T_k, .values = {}};
      for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
          for (Index i = 0; i < T_q; ++i)
            for (Index j = 0; j < T_k; ++j)
              bias.values.push_back((p.bias ? (*p.bias)(b, h, i, j) : 0.0) +
                                    p.alibi_slopes[std::size_t(h)] * double(j - at_index(b, i)));
      r.bias = std::move(bias);
      r.alibi_slopes.clear();
    }
    return reference_implementation()->forward(r);
  });
}

// What a kernel reads for cell (i, j) of batch entry b, whose entry holds L keys (P = L - T_q of them the prefix).
using TreeCells = bool (*)(const Problem& p, Index b, Index i, Index j, Index L);

// A kernel that runs the reference with the tree replaced by the cells `read` says it sees.
ImplementationPtr recelled(const char* name, const char* description, TreeCells read,
                           Capabilities caps = tree_capabilities()) {
  return make_implementation(name, description, std::move(caps), [=](const Problem& p) {
    if (!p.tree) return reference_implementation()->forward(p);
    const std::vector<Index> L = p.sequence_lengths();
    Problem r = p;
    r.tree = bitmask_tree(p.tree->B, p.tree->T_q, L, false,
                          [&](Index b, Index i, Index j) { return read(p, b, i, j, L[std::size_t(b)]); });
    return reference_implementation()->forward(r);
  });
}

bool tree_sees(const Problem& p, Index b, Index i, Index j, Index L) { return p.tree->sees(b, i, j, L); }

// Node i's parent as a kernel reads it off the tree: given, or the latest earlier node its row shows.
Index parent_read(const Problem& p, Index b, Index i, Index L) {
  const TokenTree& t = *p.tree;
  if (t.form == TokenTree::Form::parents) return t.parent(b, i);
  for (Index n = i - 1; n >= 0; --n)
    if (t.sees(b, i, L - t.T_q + n, L)) return n;
  return -1;
}

// Bit c of the bits from byte `start`, in the tree's bit order (0 past the buffer: a read out of bounds).
bool bit_at(const TokenTree& t, Index start, Index c) {
  const Index byte = start + c / 8;
  if (byte < 0 || byte >= Index(t.bits.size())) return false;
  return ((t.bits[std::size_t(byte)] >> (t.big_endian ? 7 - c % 8 : c % 8)) & 1) != 0;
}

// The control: for each node, the prefix and the nodes met walking its parent pointers up to a root (a bitmask's
// cells read one by one), kept where every other rule allows them, attended to alone in double (attend_gathered).
// The window and ALiBi at each token's place in the sequence its path spells: a prefix key at its index, a node at
// the prefix's length plus the number of nodes on its path above it (counted on the walk, or a bitmask row's nodes).
Outcome walk_forward(const Problem& p) {
  if (!p.tree) return reference_implementation()->forward(p);
  const TokenTree& t = *p.tree;
  Problem rules = p;  // every other rule; the window and ALiBi applied here at the places
  rules.tree.reset();
  rules.window.reset();
  rules.alibi_slopes.clear();
  const std::vector<Index> lengths = p.sequence_lengths();
  const auto walk = [&](Index b, Index i) {  // the keys the tree shows node i, in key order
    const Index L = lengths[std::size_t(b)], P = L - t.T_q;
    std::vector<Index> keys;
    if (t.form == TokenTree::Form::parents) {
      for (Index j = 0; j < P; ++j) keys.push_back(j);
      std::vector<Index> path;
      for (Index n = i; n >= 0; n = t.parent(b, n)) path.push_back(P + n);
      keys.insert(keys.end(), path.rbegin(), path.rend());
    } else {
      for (Index j = 0; j < L; ++j)
        if (bit_at(t, t.offsets[std::size_t(b)], i * L + j)) keys.push_back(j);
    }
    return keys;
  };
  // Key j's place: a prefix key at j; a node's key at P + the nodes above it on its own path.
  const auto place = [&](Index b, Index j) {
    const Index P = lengths[std::size_t(b)] - t.T_q;
    if (j < P) return j;
    Index above = 0;
    for (const Index k : walk(b, j - P)) above += k >= P && k < j ? 1 : 0;
    return P + above;
  };
  return attend_gathered(
      p, rules,
      [&](Index b, Index, Index i) {
        const Index L = lengths[std::size_t(b)], here = place(b, L - t.T_q + i);
        std::vector<Index> keys;
        for (const Index j : walk(b, i))
          if (!p.window || place(b, j) >= here - *p.window) keys.push_back(j);
        return keys;
      },
      [&](Index b, Index h, Index i, Index j) {
        if (p.alibi_slopes.empty()) return 0.0;
        const Index here = place(b, lengths[std::size_t(b)] - t.T_q + i);
        return p.alibi_slopes[std::size_t(h)] * double(place(b, j) - here);
      });
}

}  // namespace

// The mask a CUDA graph captured for a batch shape: built on the first call of that shape (B, T_q and each entry's
// length) and reused by every later call of it until the shape changes, whatever tree the call brings.
ImplementationPtr stale_mask() {
  struct Captured {
    std::mutex m;
    std::vector<Index> shape;
    std::optional<TokenTree> cells;
  };
  const auto captured = std::make_shared<Captured>();
  return make_implementation(
      "mutant:tree-mask-stale", "the tree's mask built once per batch shape and reused while the shape holds",
      tree_capabilities(), [captured](const Problem& p) {
        if (!p.tree) return reference_implementation()->forward(p);
        const std::vector<Index> L = p.sequence_lengths();
        std::vector<Index> shape{p.tree->B, p.tree->T_q};
        shape.insert(shape.end(), L.begin(), L.end());
        Problem r = p;
        {
          const std::lock_guard<std::mutex> lock(captured->m);
          if (shape != captured->shape || !captured->cells) {
            captured->shape = shape;
            captured->cells = bitmask_tree(p.tree->B, p.tree->T_q, L, false, [&](Index b, Index i, Index j) {
              return p.tree->sees(b, i, j, L[std::size_t(b)]);
            });
          }
          r.tree = *captured->cells;
        }
        return reference_implementation()->forward(r);
      });
}

std::vector<Mutant> tree_mutants() {
  std::vector<Mutant> z;
  z.push_back(zoo_entry(recelled("mutant:tree-prefix-hidden", "tree nodes see the tree only, not the prefix",
                                 [](const Problem& p, Index b, Index i, Index j, Index L) {
                                   return j >= L - p.tree->T_q && tree_sees(p, b, i, j, L);
                                 }),
                        "the tree's mask built over the draft tokens alone (a custom mask sized [T_q, T_q] and placed "
                        "at the end of the keys): the committed prefix is hidden from every node",
                        {1, 1, 1, 1}, "one node over two keys: it should see the prefix key too", {"tree-oracle"}));
  z.push_back(
      zoo_entry(recelled("mutant:tree-causal-not-tree", "every earlier node seen: causal, not the tree",
                         [](const Problem& p, Index, Index i, Index j, Index L) { return j <= L - p.tree->T_q + i; }),
                "the tree ignored for a causal mask over the drafts (each node sees every earlier node, its "
                "siblings' subtrees included): right for a chain",
                {1, 1, 2, 1}, "two root nodes: the second should not see the first", {"tree-oracle"}));
  z.push_back(
      zoo_entry(recelled("mutant:tree-self-hidden", "a node does not see itself",
                         [](const Problem& p, Index b, Index i, Index j, Index L) {
                           return j != L - p.tree->T_q + i && tree_sees(p, b, i, j, L);
                         }),
                "the diagonal left out of the tree's mask (ancestors only, strictly): a node never sees its own "
                "key",
                {1, 1, 1, 1}, "one node over its own key alone: it sees nothing", {"tree-oracle"}));
  z.push_back(zoo_entry(recelled("mutant:tree-parent-only", "a node sees its parent, not its grandparents",
                                 [](const Problem& p, Index b, Index i, Index j, Index L) {
                                   const Index P = L - p.tree->T_q;
                                   return j < P || j == P + i || j == P + parent_read(p, b, i, L);
                                 }),
                        "the walk up the tree stopped after one step (the parent pointer followed once): right for "
                        "depths 0 and 1",
                        {1, 1, 3, 1}, "a chain of three nodes: the third should see the first", {"tree-oracle"}));
  z.push_back(
      zoo_entry(recelled(
                    "mutant:tree-bits-reversed", "the bitmask's bits read in the other order within each byte",
                    [](const Problem& p, Index b, Index i, Index j, Index L) {
                      const TokenTree& t = *p.tree;
                      if (t.form != TokenTree::Form::bitmask) return tree_sees(p, b, i, j, L);
                      TokenTree flipped = t;
                      flipped.big_endian = !t.big_endian;
                      return flipped.sees(b, i, j, L);
                    },
                    tree_capabilities(false, true)),
                "a packed mask unpacked in the wrong bit order (numpy.packbits' default big against FlashInfer's "
                "little): cell c read at bit 7 - c",
                {1, 1, 1, 1}, "one node over its own key: its one cell read at bit 7", {"tree-oracle"}));
  z.push_back(zoo_entry(recelled(
                            "mutant:tree-bit-order-ignored", "the bitmask read least significant bit first, always",
                            [](const Problem& p, Index b, Index i, Index j, Index L) {
                              const TokenTree& t = *p.tree;
                              if (t.form != TokenTree::Form::bitmask) return tree_sees(p, b, i, j, L);
                              TokenTree little = t;
                              little.big_endian = false;
                              return little.sees(b, i, j, L);
                            },
                            tree_capabilities(false, true)),
                        "the call's bit order never read: every bitmask unpacked in FlashInfer's order (a mask "
                        "packed by numpy.packbits' default arrives reversed within each byte): right for little",
                        {1, 1, 1, 1}, "one node over its own key, packed big-endian: its cell read at bit 0",
                        {"tree-oracle", "tree-bitmask"}));
  z.push_back(zoo_entry(recelled(
                            "mutant:tree-stride-first-request", "every request's rows read with the first one's stride",
                            [](const Problem& p, Index b, Index i, Index j, Index L) {
                              const TokenTree& t = *p.tree;
                              if (t.form != TokenTree::Form::bitmask) return tree_sees(p, b, i, j, L);
                              const Index L0 = p.sequence_lengths()[0];
                              return j < L0 && bit_at(t, t.offsets[std::size_t(b)], i * L0 + j);
                            },
                            tree_capabilities(false, true)),
                        "the row stride of the packed mask taken from request 0's key length for every request (a "
                        "ragged batch read as if uniform): right when every request is as long",
                        {2, 1, 1, 1},
                        "two requests, the second one key longer: its node reads its own key past the first's stride "
                        "(or, two nodes each, the second request's second row read at the first's stride)",
                        {"tree-oracle"}, {Shape{2, 1, 2, 1}}));
  z.push_back(
      zoo_entry(recelled(
                    "mutant:tree-offsets-ignored", "requests' bits read back to back, the offsets ignored",
                    [](const Problem& p, Index b, Index i, Index j, Index L) {
                      const TokenTree& t = *p.tree;
                      if (t.form != TokenTree::Form::bitmask) return tree_sees(p, b, i, j, L);
                      Index before = 0;  // bits of the requests before b, unpadded
                      for (Index e = 0; e < b; ++e) before += t.T_q * p.sequence_lengths()[std::size_t(e)];
                      return bit_at(t, t.offsets[0], before + i * L + j);
                    },
                    tree_capabilities(false, true)),
                "mask_indptr ignored: each request's cells read where they would lie unpadded, after the bits of "
                "the requests before it (segment_packbits starts each at a byte)",
                {2, 1, 1, 1}, "two requests whose first holds a bit count not a multiple of 8", {"tree-oracle"}));
  z.push_back(zoo_entry(placed_by_index("mutant:tree-window-by-index", "the window cut at each node's index", true),
                        "a tree's window measured from each node's index in the call, not its depth: a node at depth "
                        "d of a tree over P keys sits at P + d in the sequence it continues, but the kernel puts it at "
                        "its own key's index, so a node past its siblings loses the oldest keys its path still holds",
                        {1, 1, 2, 1},
                        "two nodes, both roots, over one prefix key: the second sits at depth 0 but at index 1, and "
                        "a window of 1 then hides the prefix from it",
                        {"tree-oracle", "tree-path"}));
  z.push_back(zoo_entry(placed_by_index("mutant:tree-alibi-by-index", "ALiBi at each node's index", false),
                        "ALiBi's distance measured from each node's index in the call, not its depth: a node's "
                        "distance to the prefix grows with its siblings, so the tree's nodes weigh the prefix as "
                        "decoding their paths never would",
                        {1, 1, 2, 1},
                        "two nodes, both roots, over one prefix key: the second is one key from the prefix by depth, "
                        "two by index",
                        {"tree-oracle", "tree-path"}));
  z.push_back(zoo_entry(stale_mask(),
                        "a stale tree mask: the mask built for the first call of a batch shape reused by every later "
                        "call of that shape (a CUDA graph's static buffer refreshed only when the shape changes), so "
                        "a request verifies the previous request's tree",
                        {1, 1, 2, 1},
                        "two nodes over two keys: one tree lets node 1 see node 0, the other does not (a single "
                        "node has one tree only)",
                        {"tree-fresh"}));
  z.push_back(Mutant{
      .impl = make_implementation(
          "control:tree-walk", "correct; each node's prefix and the nodes met walking its parent pointers, in double",
          placing_capabilities(), walk_forward),
      .bug = "control: each node's keys collected by walking its parent pointers to a root (a bitmask's cells read "
             "bit by bit), those every other rule allows kept, the window and ALiBi applied at each token's place "
             "counted on the walk (the prefix, then one per node on the path), and attended to alone in double: a "
             "tree kernel's way, which the oracle's mask and places must match",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {}});
  return z;
}

}  // namespace attncheck::zoo
