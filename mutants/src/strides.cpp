// Kernels that read q, k and v through strides (ATTNCHECK_CAP3_STRIDED), with the address arithmetic
// strided kernels get wrong, and two controls. Each reads every element of its inputs through its own address rule
// from the buffers Problem::layout lays out (attncheck/layouts.hpp: gaps and the rest of a broadcast buffer hold
// NaN), then attends as the reference does: the address rule is its only bug. Two controls read through the strides,
// one returning its weights and one whose weights are probed.
#include <functional>
#include <optional>

#include "attncheck/layouts.hpp"
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// The address of element (b,h,t,d) of a view as a kernel computes it.
using Address = std::function<Index(const StridedView<double>&, Index, Index, Index, Index)>;

// The problem as a kernel reading p's laid-out inputs through `address` sees it (contiguous again).
Problem read_as(const Problem& p, const Address& address) {
  const LaidOutInputs<double> in = lay_out(p.q, p.k, p.v, p.layout);
  Problem read = p;
  read.layout = InputLayout::contiguous;
  read.q = read_through(in.q, address);
  read.k = read_through(in.k, address);
  read.v = read_through(in.v, address);
  return read;
}

// A forward that reads through `address`; with a `backward` address, a backward too, reading through that one
// (a backward kernel has address arithmetic of its own).
ImplementationPtr strided_impl(const char* name, const char* description, Address address,
                               std::optional<Address> backward = std::nullopt, bool returns_weights = true) {
  Capabilities caps = gqa_capabilities();
  caps.features.add({Feature::strided, Feature::layout_invariant});  // each reads values exactly, whatever the strides
  caps.returns_weights = returns_weights;
  BackwardFn bwd;
  if (backward)
    bwd = [b = *backward](const Problem& p) { return reference_implementation()->backward(read_as(p, b)); };
  return make_implementation(
      name, description, caps,
      [address](const Problem& p) { return reference_implementation()->forward(read_as(p, address)); }, bwd);
}

Index by_strides(const StridedView<double>& v, Index b, Index h, Index t, Index d) {
  return b * v.strides[0] + h * v.strides[1] + t * v.strides[2] + d * v.strides[3];
}

Index as_contiguous(const StridedView<double>& v, Index b, Index h, Index t, Index d) {
  return ((b * v.shape[1] + h) * v.shape[2] + t) * v.shape[3] + d;  // the strides unread
}

}  // namespace

std::vector<Mutant> stride_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = strided_impl("mutant:strides-assumed-contiguous", "every input read as contiguous [B,H,T,D]",
                           as_contiguous),
      .bug = "the strides ignored: every tensor read as contiguous [B,H,T,D], right for a contiguous call only",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys: key 1 lies a padded row (D + 3) or an interleaved K,V row (2 D) "
                     "further than D; as small, two queries over one key with the padded layout's gap, or two "
                     "query heads over one kv head, the second a padded head away",
      .killed_by = {"layout-invariance"},
      .also_minimal = {{1, 1, 2, 1}, {1, 2, 1, 1}},
  });
  z.push_back(Mutant{
      .impl = strided_impl("mutant:row-stride-from-d", "the row stride taken as D",
                           [](const StridedView<double>& v, Index b, Index h, Index t, Index d) {
                             return b * v.strides[0] + h * v.strides[1] + t * v.shape[3] + d;  // strides[2]
                           }),
      .bug = "the row (token) stride taken as D instead of strides[2]: right while rows are packed, wrong for "
             "padded rows, interleaved K and V, or [B,T,H,D] with several heads",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys, the second key a padded or interleaved row away; as small, two "
                     "queries over one key with padded rows (either alignment)",
      .killed_by = {"layout-invariance"},
      .also_minimal = {{1, 1, 2, 1}},
  });
  z.push_back(Mutant{
      .impl = strided_impl("mutant:backward-strides-ignored",
                           "forward through the strides; the backward reads every input as contiguous [B,H,T,D]",
                           by_strides, as_contiguous),
      .bug = "the backward kernel's own address arithmetic ignores the strides the forward honours: the outputs "
             "are right in every layout, dQ, dK and dV only for contiguous inputs",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over two keys: key 1 lies a padded row (D + 3) or an interleaved K,V row further "
                     "than D, so the backward reads a gap (NaN) or another key; as small, two queries over one key "
                     "with the padded layout's gap, or two query heads over one kv head, the second a padded head "
                     "away",
      .killed_by = {"layout-invariance"},
      .also_minimal = {{1, 1, 2, 1}, {1, 2, 1, 1}},
  });
  // A kernel that returns no weights, as a flash kernel never materialises them: they are recovered by one-hot V
  // probes (with_recovered_weights, as attncheck does for such a plug-in), which never go through a layout whose V
  // the probe cannot reach (V-is-K: V is K's memory).
  z.push_back(Mutant{
      .impl = with_recovered_weights(strided_impl("control:strided-probed-weights",
                                                  "every input read through its strides; no weights (probed)",
                                                  by_strides, by_strides, false)),
      .bug = "none: a layout-invariant strided kernel that returns no weights, so the laws probe them through "
             "one-hot values (V-is-K included, where the probe must not write into K's memory)",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  z.push_back(Mutant{
      .impl = strided_impl("control:strided-reads", "every input read through its strides, forward and backward",
                           by_strides, by_strides),
      .bug = "none: every element read at b·s0 + h·s1 + t·s2 + d·s3, in the forward and in the backward",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {},
  });
  return z;
}

}  // namespace attncheck::zoo
