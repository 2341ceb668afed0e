// Trees of draft tokens' laws (speculative decoding verifies a tree of drafts in one call): tree-oracle (the call is
// attention over each node's prefix and ancestors), tree-bitmask (a packed bitmask is the tree it encodes, in either
// bit order), tree-path (a node's output is causal decoding over the prefix and its path), tree-siblings (relabelling
// sibling subtrees relabels the outputs), tree-chain (a chain tree is chunked prefill) and tree-fresh (no earlier
// call's mask reaches a call).
#include <algorithm>
#include <cmath>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace tree_law {

std::string needs_tree(const GenConfig& g) {
  if (!g.caps.declares(Feature::tree) && !g.caps.declares(Feature::tree_bitmask))
    return "needs trees of draft tokens (ATTNCHECK_CAP4_TREE, _TREE_BITMASK), which this implementation declares "
           "neither of";
  if (std::string why = pinned_past_materialised(g, "a tree"); !why.empty()) return why;
  if (!g.shape && double(g.min_T) * double(g.min_T) > double(1 << 18))
    return "a tree is checked up to 2^18 weights (B·H·T_q·T_k: its bound is materialised); every case here has "
           "T >= " +
           std::to_string(g.min_T);
  return "";
}

std::string needs_bitmask(const GenConfig& g) {
  if (!g.caps.declares(Feature::tree_bitmask))
    return "needs trees as packed bitmasks (ATTNCHECK_CAP4_TREE_BITMASK), which this implementation does not declare";
  return needs_tree(g);
}

// Every case has a tree (in a declared form); forward and backward calls alike. A left window and ALiBi read a
// node's place, the prefix's length plus its depth (the sequence the draft would continue); a right window, chunks
// and documents would read positions the core does not model in a tree, and it refuses them there.
ProblemOptions options(bool weights) {
  ProblemOptions po = weights ? ProblemOptions{} : outputs_only();
  po.require.add({Feature::tree, Feature::tree_bitmask});
  po.allow.remove({Feature::right_window, Feature::chunked_local, Feature::documents, Feature::query_documents});
  return po;
}
// The derived calls of path, siblings and chain move nodes and their keys: no family beyond causal and the left
// window (no padding: every entry's prefix is T_k - T_q), nothing per cell or per token, no pages. A path's call
// places its nodes where their depths put them, so a window and ALiBi read the same distances in both calls.
ProblemOptions moving_options() {
  ProblemOptions po = options(false).no_masks_beyond_causal();
  po.allow.remove({Feature::key_padding, Feature::paged});
  return po;
}
// Cases whose entries hold their nodes: never more queries than keys, and fewer only where they can be the last T_q
// keys' (bottom-right: a decode step over the prefix), so that every case has a tree.
GenConfig holding_nodes(const GenConfig& cfg) {
  GenConfig g = within_materialised(cfg);
  g.caps.q_longer = false;
  if (!g.caps.supports(CausalAlignment::BottomRight)) g.caps.q_shorter = false;
  return g;
}
rc::Gen<LawCase> gen(const GenConfig& cfg) { return gen_problem(holding_nodes(cfg), options(true)); }
rc::Gen<LawCase> gen_outputs(const GenConfig& cfg) { return gen_problem(holding_nodes(cfg), options(false)); }
rc::Gen<LawCase> gen_moving(const GenConfig& cfg) { return gen_problem(holding_nodes(cfg), moving_options()); }

// The parents of the case's tree: as given, or read off a bitmask (a node's parent is its latest earlier node whose
// key its row shows), then only if the bitmask is exactly that tree's (else empty: a bitmask need not be a tree).
std::vector<std::int32_t> parents_of(const Problem& p) {
  const TokenTree& t = *p.tree;
  if (t.form == TokenTree::Form::parents) return t.parents;
  const std::vector<Index> L = p.sequence_lengths();
  TokenTree parents{.form = TokenTree::Form::parents, .B = t.B, .T_q = t.T_q};
  for (Index b = 0; b < t.B; ++b)
    for (Index i = 0; i < t.T_q; ++i) {
      std::int32_t parent = -1;
      for (Index n = i - 1; n >= 0 && parent < 0; --n)
        if (t.sees(b, i, L[std::size_t(b)] - t.T_q + n, L[std::size_t(b)])) parent = std::int32_t(n);
      parents.parents.push_back(parent);
    }
  const TokenTree again = packed_tree(parents, L, t.big_endian);
  for (Index b = 0; b < t.B; ++b)
    for (Index i = 0; i < t.T_q; ++i)
      for (Index j = 0; j < L[std::size_t(b)]; ++j)
        if (again.sees(b, i, j, L[std::size_t(b)]) != t.sees(b, i, j, L[std::size_t(b)])) return {};
  return parents.parents;
}

// The case's tree replaced by `parents`, in the case's form (and bit order).
Problem with_parents(const Problem& p, std::vector<std::int32_t> parents) {
  Problem r = p;
  TokenTree t{.form = TokenTree::Form::parents, .B = p.tree->B, .T_q = p.tree->T_q, .parents = std::move(parents)};
  r.tree = p.tree->form == TokenTree::Form::parents ? std::move(t)
                                                    : packed_tree(t, p.sequence_lengths(), p.tree->big_endian);
  return r;
}

// Whether the derived calls that move nodes apply: each node's key sits where the causal rule lets every later
// node see it (bottom-right, or T_q == T_k), and the tree can be read as one.
bool nodes_movable(const Problem& p) {
  return p.tree && p.key_lengths.empty() &&
         (p.alignment == CausalAlignment::BottomRight || p.q.shape().T == p.k.shape().T);
}

// A row of the case (b, i) and the row of the derived call that computes the same thing.
struct RowPair {
  Index b, i, rb, ri;
};

// The case's rows `pairs` name agree with the derived call r's rows they map to, within both calls' derived bounds
// plus what their float64 oracles differ by there (outputs, and LSEs where the case asks for them).
std::optional<Violation> rows_agree(const char* law, const Implementation& impl, const Problem& p, const Problem& r,
                                    const std::vector<RowPair>& pairs, const std::string& what,
                                    const std::string& why) {
  const Outcome a = call(impl, p), o = call(impl, r);
  const OracleRun ra = run_oracle(p), rr = run_oracle(r);
  const Include seen = seen_rows(p);
  const Index H = p.q.shape().H;
  std::vector<std::uint8_t> mapped(std::size_t(p.q.shape().B * p.q.shape().T), 0);
  const auto include = [&](Index b, Index h, Index i, Index x) {
    return mapped[std::size_t(b * p.q.shape().T + i)] != 0 && seen(b, h, i, x);
  };
  Tensor<double> theirs = a.output, tol = ra.tol_out;
  for (const RowPair& m : pairs) {
    mapped[std::size_t(m.b * p.q.shape().T + m.i)] = 1;
    for (Index h = 0; h < H; ++h)
      for (Index x = 0; x < theirs.shape().D; ++x) {
        theirs(m.b, h, m.i, x) = o.output(m.rb, h, m.ri, x);
        tol(m.b, h, m.i, x) +=
            rr.tol_out(m.rb, h, m.ri, x) + std::abs(ra.out(m.b, h, m.i, x) - rr.out(m.rb, h, m.ri, x));
      }
  }
  std::optional<Violation> v = compare(law, "output", a.output, theirs, &tol, include);
  if (!v && p.want_lse && a.lse && o.lse) {
    Tensor<double> tl = lse_bound(p, ra), lt = *a.lse;
    const Tensor<double> tr = lse_bound(r, rr);
    for (const RowPair& m : pairs)
      for (Index h = 0; h < H; ++h) {
        lt(m.b, h, m.i, 0) = (*o.lse)(m.rb, h, m.ri, 0);
        const double gap = std::abs(ra.lse(m.b, h, m.i, 0) - rr.lse(m.rb, h, m.ri, 0));
        tl(m.b, h, m.i, 0) += tr(m.rb, h, m.ri, 0) + (std::isfinite(gap) ? gap : 0.0);
      }
    v = compare(law, "lse", *a.lse, lt, &tl, include);
  }
  if (v) {
    v->message += "; " + why + " (" + what + " vs. the case as drawn)";
    // The derived call is blamed only where the case's own value is within its oracle bound (then the derived one
    // is the wrong one); a tree call off its oracle is the case's fault, shown as drawn.
    const std::vector<Index>& at = v->worst_index;
    bool case_right = at.size() == 4;
    if (case_right && v->quantity == "output")
      case_right = std::abs(a.output(at[0], at[1], at[2], at[3]) - ra.out(at[0], at[1], at[2], at[3])) <=
                   ra.tol_out(at[0], at[1], at[2], at[3]);
    else if (case_right && v->quantity == "lse")
      case_right = std::abs((*a.lse)(at[0], at[1], at[2], 0) - ra.lse(at[0], at[1], at[2], 0)) <=
                   lse_bound(p, ra)(at[0], at[1], at[2], 0);
    if (case_right) {
      v->call = r;
      v->call_what = what;
    }
  }
  return v;
}

// --- tree-oracle ----------------------------------------------------------------------------------------------------

const char* kOracleWhy =
    "Speculative decoding verifies a tree of draft tokens in one call: the call's T_q queries are the tree's nodes, "
    "each also the last T_q keys of its batch entry, and node i may see the committed prefix, its ancestors and "
    "itself, never a sibling or a cousin (given by a parent array, or as FlashInfer's packed bitmask). Every other "
    "rule (the causal rule, padding, masks) still hides what it hides. So the call is attention over exactly those "
    "keys: its output, weights and LSE agree with the float64 oracle, which applies the tree as one more mask, "
    "within the derived bound (attention/src/tolerance.cpp), a key the tree hides weighing exactly 0. A window and "
    "ALiBi read a node's place, the prefix's length plus its depth, as decoding its path would. A kernel that "
    "hides the prefix, lets a node see every earlier node (causal, not the tree), stops one ancestor short, reads the "
    "bitmask's bits in the other order or another request's row stride breaks it.";

Verdict check_oracle(const Implementation& impl, const LawCase& c) {
  if (!c.problem.tree) return std::nullopt;
  return agrees_with_oracle("tree-oracle", impl, c, "the oracle saw each node's prefix and ancestors only");
}

// --- tree-bitmask ---------------------------------------------------------------------------------------------------

const char* kBitmaskWhy =
    "A packed bitmask is only an encoding: the same cells packed least significant bit first (FlashInfer's "
    "\"little\") or most significant first (numpy.packbits' default), or given as the parents of the tree they "
    "encode, make the same mask. So the call with the case's tree as a bitmask in the other bit order (a tree "
    "given by parents: as a little-endian bitmask) computes the same attention, within both calls' derived bounds "
    "(their float64 oracles agree exactly). A kernel that reads one bit order whatever the call says, or whose "
    "bitmask path differs from its parent path, breaks it.";

Verdict check_bitmask(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.tree) return std::nullopt;
  const std::vector<std::int32_t> parents = parents_of(p);
  if (parents.empty()) return std::nullopt;  // a bitmask that is no tree: its cells would need repacking as they are
  const bool big = p.tree->form == TokenTree::Form::bitmask && !p.tree->big_endian;
  Problem r = p;
  r.tree =
      packed_tree(TokenTree{.form = TokenTree::Form::parents, .B = p.tree->B, .T_q = p.tree->T_q, .parents = parents},
                  p.sequence_lengths(), big);
  return calls_agree("tree-bitmask", impl, p, r,
                     std::string("the same tree as a ") + (big ? "big" : "little") + "-endian bitmask",
                     "a bitmask's bit order and a tree's encoding change no cell");
}

// --- tree-path ------------------------------------------------------------------------------------------------------

const char* kPathWhy =
    "A node of the tree stands for one candidate continuation: the prefix, then its ancestors from the root down, "
    "then itself. Verifying it in the tree must give what decoding that continuation would: a plain causal call "
    "over the prefix and the path's keys, with the path's queries as its last rows (the rows before them are the "
    "prefix's, not compared). So the deepest node of the last batch entry and each of its ancestors agree with "
    "that call's rows, within both calls' derived bounds plus what their float64 oracles differ by (nothing). In that "
    "call a node sits at the prefix's length plus its depth, so a window and ALiBi, which read positions, read a "
    "node's depth in the tree, not its index. A kernel that hides the prefix, lets a node see a sibling or an earlier "
    "node off its path, stops one ancestor short, or places a node at its index for the window or ALiBi breaks it.";

Verdict check_path(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!nodes_movable(p)) return std::nullopt;
  const std::vector<std::int32_t> parents = parents_of(p);
  if (parents.empty()) return std::nullopt;
  const Shape qs = p.q.shape(), ks = p.k.shape();
  const Index b = qs.B - 1, T_q = qs.T, P = ks.T - T_q;
  const auto parent = [&](Index n) { return Index(parents[std::size_t(b * T_q + n)]); };
  Index deepest = 0, most = -1;
  for (Index n = 0; n < T_q; ++n) {
    Index d = 0;
    for (Index a = parent(n); a >= 0; a = parent(a)) ++d;
    if (d >= most) most = d, deepest = n;
  }
  std::vector<Index> path;  // root first
  for (Index a = deepest; a >= 0; a = parent(a)) path.insert(path.begin(), a);
  const Index T = P + Index(path.size());
  Problem r = p;
  r.tree.reset();
  r.alignment = kDefaultAlignment;
  r.q = Tensor<double>(Shape{1, qs.H, T, qs.D});
  r.k = Tensor<double>(Shape{1, ks.H, T, ks.D});
  r.v = Tensor<double>(Shape{1, ks.H, T, p.v.shape().D});
  for (Index t = 0; t < T; ++t) {
    const Index node = t < P ? deepest : path[std::size_t(t - P)], key = t < P ? t : P + node;
    for (Index h = 0; h < qs.H; ++h)
      for (Index x = 0; x < qs.D; ++x) r.q(0, h, t, x) = p.q(b, h, node, x);
    for (Index g = 0; g < ks.H; ++g) {
      for (Index x = 0; x < ks.D; ++x) r.k(0, g, t, x) = p.k(b, g, key, x);
      for (Index x = 0; x < p.v.shape().D; ++x) r.v(0, g, t, x) = p.v(b, g, key, x);
    }
  }
  if (r.d_output) r.d_output.reset();
  std::vector<RowPair> pairs;
  for (std::size_t n = 0; n < path.size(); ++n) pairs.push_back({b, path[n], 0, P + Index(n)});
  std::string nodes;
  for (const Index n : path) nodes += (nodes.empty() ? "" : ", ") + std::to_string(n);
  return rows_agree("tree-path", impl, p, r, pairs,
                    "causal decoding of batch entry " + std::to_string(b) + "'s prefix of " + std::to_string(P) +
                        " keys and the path of nodes " + nodes + " (" + std::to_string(T) + " keys, no tree)",
                    "a node's output is the decoding of its prefix and path");
}

// --- tree-siblings --------------------------------------------------------------------------------------------------

const char* kSiblingsWhy =
    "Which of two siblings comes first in the call is a labelling, not a meaning: relabelling the nodes in another "
    "order that still puts every parent before its children (here: depth first, each node's children and the roots "
    "taken last to first), and moving each node's query and key with it, gives every node the same prefix and the "
    "same ancestors. So each node's output moves with it, within both calls' derived bounds plus what their float64 "
    "oracles differ by (nothing). A kernel that lets a node see every earlier node (causal, not the tree), or reads a "
    "node's ancestors by its index, breaks it.";

Verdict check_siblings(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!nodes_movable(p)) return std::nullopt;
  const std::vector<std::int32_t> parents = parents_of(p);
  if (parents.empty()) return std::nullopt;
  const Shape qs = p.q.shape(), ks = p.k.shape();
  const Index T_q = qs.T, P = ks.T - T_q;
  std::vector<std::int32_t> relabelled(parents.size());
  std::vector<RowPair> pairs;
  Problem r = p;
  bool moved = false;
  for (Index b = 0; b < qs.B; ++b) {
    // Depth first from the prefix, children last to first: label[n] is node n's place in that order.
    std::vector<Index> label(std::size_t(T_q), -1), stack;
    for (Index n = 0; n < T_q; ++n)
      if (parents[std::size_t(b * T_q + n)] < 0) stack.push_back(n);  // roots: the last pushed is visited first
    Index next = 0;
    while (!stack.empty()) {
      const Index n = stack.back();
      stack.pop_back();
      label[std::size_t(n)] = next++;
      for (Index m = 0; m < T_q; ++m)
        if (parents[std::size_t(b * T_q + m)] == n) stack.push_back(m);
    }
    for (Index n = 0; n < T_q; ++n) {
      const Index to = label[std::size_t(n)], par = parents[std::size_t(b * T_q + n)];
      moved = moved || to != n;
      relabelled[std::size_t(b * T_q + to)] = par < 0 ? -1 : std::int32_t(label[std::size_t(par)]);
      pairs.push_back({b, n, b, to});
      for (Index h = 0; h < qs.H; ++h)
        for (Index x = 0; x < qs.D; ++x) r.q(b, h, to, x) = p.q(b, h, n, x);
      for (Index g = 0; g < ks.H; ++g) {
        for (Index x = 0; x < ks.D; ++x) r.k(b, g, P + to, x) = p.k(b, g, P + n, x);
        for (Index x = 0; x < p.v.shape().D; ++x) r.v(b, g, P + to, x) = p.v(b, g, P + n, x);
      }
    }
  }
  if (!moved) return std::nullopt;  // no node has a sibling: the order is the only one
  r.tree = with_parents(p, relabelled).tree;
  if (r.d_output) r.d_output.reset();
  return rows_agree("tree-siblings", impl, p, r, pairs,
                    "the nodes relabelled depth first, children and roots last to first, with their queries and keys",
                    "relabelling sibling subtrees relabels the outputs");
}

// --- tree-chain -----------------------------------------------------------------------------------------------------

const char* kChainWhy =
    "A tree in which each node is the child of the one before it is a chain: node i sees the prefix and nodes 0..i, "
    "which is what the causal rule shows the last T_q queries over T_k keys (chunked prefill, bottom-right). So the "
    "call with the chain tree equals the call without a tree, within both calls' derived bounds (their float64 "
    "oracles agree exactly). A kernel whose tree path differs from its causal path (a scale, an offset, the prefix or "
    "the diagonal left out on one path only) breaks it.";

Verdict check_chain(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.tree || !p.key_lengths.empty()) return std::nullopt;
  std::vector<std::int32_t> chain;
  for (Index b = 0; b < p.tree->B; ++b)
    for (Index n = 0; n < p.tree->T_q; ++n) chain.push_back(std::int32_t(n - 1));
  Problem none = p;
  none.tree.reset();
  return calls_agree("tree-chain", impl, with_parents(p, chain), none, "the case without a tree",
                     "a chain tree is chunked prefill");
}

// --- tree-fresh -----------------------------------------------------------------------------------------------------

const char* kFreshWhy =
    "A call's tree is its own: nothing of an earlier call's mask may reach it. A kernel that builds its mask once per "
    "batch shape and reuses it (a CUDA graph's static mask buffer refreshed only when the shape changes, a mask cache "
    "keyed on the sizes alone) applies the previous request's tree to this one, and a check that makes one call per "
    "case never sees it unless two cases happen to share a shape. So this law makes that call itself: first the "
    "case's inputs with another tree of the same shape (every node a root where the case's tree has an edge, else a "
    "chain), then the case, whose output and LSE must agree with the float64 oracle within the derived bound, as "
    "tree-oracle's do. The earlier call is part of the case, so a failure replays from the case alone.";

Verdict check_fresh(const Implementation& impl, const LawCase& c) {
  const Problem& p = c.problem;
  if (!p.tree) return std::nullopt;
  const std::vector<std::int32_t> parents = parents_of(p);
  const bool edges = std::any_of(parents.begin(), parents.end(), [](std::int32_t x) { return x >= 0; });
  std::vector<std::int32_t> other;
  for (Index b = 0; b < p.tree->B; ++b)
    for (Index n = 0; n < p.tree->T_q; ++n) other.push_back(edges ? -1 : std::int32_t(n - 1));
  call(impl, with_parents(p, std::move(other)));  // its result is not this law's: what it leaves behind is
  return agrees_with_oracle("tree-fresh", impl, c,
                            std::string("the call came right after one with the same inputs and ") +
                                (edges ? "every node a root" : "a chain") + ": the mask of an earlier call reached it");
}

}  // namespace tree_law
}  // namespace

Law tree_fresh() {
  using namespace tree_law;
  return {"tree-fresh",
          "a call's tree is its own: a call right after one with another tree of the same shape agrees with the oracle",
          kFreshWhy,
          LawDoc{"77",
                 "the case's inputs with another tree of the same shape first, then the case: its outputs and LSE "
                 "against the float64 oracle",
                 "derived (`attention/src/tolerance.cpp`)"},
          needs_tree,
          gen_outputs,
          check_fresh,
          0};
}

Law tree_oracle() {
  using namespace tree_law;
  return {"tree-oracle",
          "a call with a tree of draft tokens agrees with the oracle over each node's prefix and ancestors",
          kOracleWhy,
          LawDoc{"71",
                 "outputs, weights and LSE of a call with a tree agree with the float64 oracle over each node's "
                 "prefix, ancestors and itself",
                 "derived (`attention/src/tolerance.cpp`), or FlashAttention's rule"},
          needs_tree,
          gen,
          check_oracle,
          0};
}

Law tree_bitmask() {
  using namespace tree_law;
  return {
      "tree-bitmask",
      "a tree's packed bitmask in either bit order, and its parents, give the same result",
      kBitmaskWhy,
      LawDoc{"72", "the tree as a bitmask in the other bit order (or as one, from parents): the same outputs and LSE",
             "both calls' derived bounds"},
      needs_bitmask,
      gen_outputs,
      check_bitmask,
      0};
}

Law tree_path() {
  using namespace tree_law;
  return {"tree-path",
          "a node's output equals causal decoding over the prefix and its path",
          kPathWhy,
          LawDoc{"73", "the deepest node and its ancestors: the rows of a causal call over the prefix and the path",
                 "both calls' derived bounds"},
          needs_tree,
          gen_moving,
          check_path,
          0};
}

Law tree_siblings() {
  using namespace tree_law;
  return {"tree-siblings",
          "relabelling sibling subtrees relabels the outputs",
          kSiblingsWhy,
          LawDoc{"74", "nodes relabelled depth first, children last to first: each node's output moves with it",
                 "both calls' derived bounds"},
          needs_tree,
          gen_moving,
          check_siblings,
          0};
}

Law tree_chain() {
  using namespace tree_law;
  return {"tree-chain",
          "a chain tree equals the call without a tree (chunked prefill)",
          kChainWhy,
          LawDoc{"75", "each node the child of the one before: the outputs and LSE of the call without a tree",
                 "both calls' derived bounds"},
          needs_tree,
          gen_moving,
          check_chain,
          0};
}

}  // namespace attncheck::law_kit
