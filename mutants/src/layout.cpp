// Mutants whose mistake is outside the arithmetic: the memory layout the kernel assumes, and state that
// outlives a call.
#include <limits>
#include <memory>
#include <type_traits>

#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// The kernel is written for [B,T,H,D] (a projection's output before the transpose to heads) and is handed
// contiguous [B,H,T,D]. Same element count, so nothing complains; element (b,h,i,d) of its view is read at
// ((b*T + i)*H + h)*D + d, and the output is written back the same way.
ImplementationPtr bthd_layout() {
  return make_implementation(
      "mutant:layout-bthd", "reads and writes [B,H,T,D] memory as if it were [B,T,H,D]", zoo_capabilities(),
      [](const Problem& p) {
        return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr, auto* w) {
          using S = typename std::decay_t<decltype(q)>::Scalar;
          using A = Acc<S>;
          const Index B = q.shape().B, H = q.shape().H, T_q = q.shape().T, T_k = k.shape().T, D = q.shape().D;
          const auto bthd = [&](Index T, Index b, Index h, Index i, Index d) { return ((b * T + i) * H + h) * D + d; };
          const auto head = [&](const auto& t, Index T, Index b, Index h) {
            Matrix<A> m(T, D);
            for (Index i = 0; i < T; ++i)
              for (Index d = 0; d < D; ++d) m(i, d) = static_cast<A>(t.data()[bthd(T, b, h, i, d)]);
            return m;
          };
          Tensor<S> out(q.shape());
          if (w) *w = Tensor<S>(Shape{B, H, T_q, T_k});
          HeadCtx c{.B = B,
                    .H = H,
                    .T_q = T_q,
                    .T_k = T_k,
                    .D = D,
                    .dtype = pr.dtype,
                    .scale = pr.scale,
                    .alignment = pr.alignment};
          for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h) {
              const Matrix<A> Q = head(q, T_q, b, h), K = head(k, T_k, b, h), V = head(v, T_k, b, h);
              const Matrix<A> W = softmax_rows<A>(causal_select<A>(scores(Q, K, c.resolved_scale()), c));
              const Matrix<A> O = mix_visible(W, V, c);
              for (Index i = 0; i < T_q; ++i)
                for (Index d = 0; d < D; ++d) out.data()[bthd(T_q, b, h, i, d)] = static_cast<S>(O(i, d));
              if (w) w->head(b, h) = W.template cast<S>();
            }
          return out;
        });
      });
}

// A kernel object that keeps its output accumulator between calls to save the allocation: resize() keeps
// the old contents, and the author forgot the fill with zeros. Deterministic given the call sequence, but
// the same call returns different outputs the second time.
class CachedAccumulator {
 public:
  template <class S>
  Tensor<S> operator()(const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v, const Problem& p, Tensor<S>* w) {
    using A = Acc<S>;
    std::vector<A>& acc = buffer<A>();
    const Shape& s = q.shape();
    acc.resize(static_cast<size_t>(s.numel()));  // keeps the last call's sums: no fill(0)
    Index head_index = 0;
    return per_head(q, k, v, p, w, [&](const Matrix<A>& Q, const Matrix<A>& K, const Matrix<A>& V, const HeadCtx& c) {
      HeadOut<A> r;
      r.weights = softmax_rows<A>(causal_select<A>(scores(Q, K, c.resolved_scale()), c));
      A* o = acc.data() + head_index++ * c.T_q * c.D;  // [T_q,D] slice of this head
      for (Index i = 0; i < c.T_q; ++i)
        for (Index j = 0; j < c.T_k; ++j)
          if (c.visible(i, j))
            for (Index d = 0; d < c.D; ++d) o[i * c.D + d] += r.weights(i, j) * V(j, d);
      r.output = Eigen::Map<const Matrix<A>>(o, c.T_q, c.D);
      return r;
    });
  }

 private:
  template <class A>
  std::vector<A>& buffer() {
    if constexpr (std::is_same_v<A, double>)
      return acc_d_;
    else
      return acc_f_;
  }
  std::vector<float> acc_f_;
  std::vector<double> acc_d_;
};

ImplementationPtr cached_accumulator() {
  auto kernel = std::make_shared<CachedAccumulator>();
  return make_implementation("mutant:stale-accumulator", "keeps its output accumulator between calls, unzeroed",
                             zoo_capabilities(), [kernel](const Problem& p) {
                               return run_typed(p, [&](const auto& q, const auto& k, const auto& v, const Problem& pr,
                                                       auto* w) { return (*kernel)(q, k, v, pr, w); });
                             });
}

}  // namespace

std::vector<Mutant> layout_mutants() {
  std::vector<Mutant> z;
  z.push_back(Mutant{
      .impl = bthd_layout(),
      .bug = "wrong layout hidden by equal sizes: [B,H,T,D] memory read and written as [B,T,H,D]",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "the layouts coincide unless H >= 2 and some T >= 2: H = 2, T_q = 1, T_k = 2 (top-left) already "
                     "reads head 0's future key 1 as head 1's key 0",
      .killed_by = {"batch-head-independence", "oracle-agreement"},
  });
  z.push_back(Mutant{
      .impl = cached_accumulator(),
      .bug = "state kept between calls: the output accumulator is resized but never zeroed, so a repeated "
             "call adds onto the previous result",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query, one key and v0 != 0: the second identical call returns v0 more than the first",
      .killed_by = {"determinism"},
  });
  return z;
}

}  // namespace attncheck::zoo
