// Trees of draft tokens (speculative decoding), drawn for the laws that require them: each node's parent keyed by the
// coordinates of its batch entry and of its query, so a shrunk shape keeps the other nodes' parents where it can.
#include "parts.hpp"

namespace attncheck {
using namespace generation;

rc::Gen<TreeDraw> gen_tree(const GenConfig& cfg, const ProblemOptions& opts) {
  const FeatureSet declared = declared_features(cfg.caps);
  const bool parents = opts.must_use(Feature::tree, declared), bits = opts.must_use(Feature::tree_bitmask, declared);
  if (!parents && !bits) return rc::gen::just(TreeDraw{});
  return rc::gen::exec([=] {
    TreeDraw d;
    d.on = true;
    d.pattern = *choice_shrinking_to_each_earlier({1, 1, 4});  // roots, chain, branching
    if (parents && bits)
      d.form = *weighted_choice<int>({{2, 0}, {1, 1}, {1, 2}});
    else if (bits)
      d.form = *weighted_choice<int>({{1, 1}, {1, 2}});
    // Not shrunk: the parents follow from it and each node's coordinates.
    d.seed = *rc::gen::noShrink(rc::gen::inRange<std::uint64_t>(0, std::uint64_t(1) << 32));
    return d;
  });
}

void TreeDraw::apply(Problem& p, const CaseShape& s, const Capabilities& caps) const {
  p.tree.reset();
  const Shape qs = p.q.shape(), ks = p.k.shape();
  // Up to 2^18 weights, as the laws' bounds are materialised; every entry must hold its T_q nodes.
  if (!on || qs.T > ks.T || double(qs.B) * double(qs.H) * double(qs.T) * double(ks.T) > double(1 << 18)) return;
  if (qs.T < ks.T && caps.supports(CausalAlignment::BottomRight)) p.alignment = CausalAlignment::BottomRight;
  for (Index& L : p.key_lengths) L = std::max(L, qs.T);
  TokenTree t{.form = TokenTree::Form::parents, .B = qs.B, .T_q = qs.T};
  const auto id = [](const std::vector<Index>& ids, Index n) { return ids.empty() ? n : ids[std::size_t(n)]; };
  // Branching: node n's parent is drawn as a query coordinate below its own (or none) and is the latest node at or
  // before it, so deleting a node reattaches its children to the node before it rather than redrawing them.
  for (Index b = 0; b < qs.B; ++b)
    for (Index n = 0; n < qs.T; ++n) {
      const Index me = id(s.q_ids, n);
      const Index target = Index(coordinate_hash(seed, {id(s.b_ids, b), me}) % std::uint64_t(me + 1)) - 1;
      Index parent = pattern == roots ? -1 : n - 1;
      if (pattern == branching)
        while (parent >= 0 && id(s.q_ids, parent) > target) --parent;
      t.parents.push_back(std::int32_t(parent));
    }
  p.tree = form == 0 ? std::move(t) : packed_tree(t, p.sequence_lengths(), form == 2);
}

}  // namespace attncheck
