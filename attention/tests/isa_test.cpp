// The instruction-set copies of the core's hot loops (attncheck/isa.hpp): the best one this CPU runs is chosen,
// a name this build or CPU lacks is refused with the choices, and every copy this CPU runs computes the streamed
// forward and the streaming oracle within the derived bound of the float64 oracle. (ctest also runs the whole of
// attention_test once per copy, under ATTNCHECK_ISA: attention/CMakeLists.txt.)
#include "attncheck/isa.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "attncheck/attention.hpp"
#include "attncheck/error.hpp"
#include "attncheck/tolerance.hpp"
#include "wave.hpp"

namespace attncheck {
namespace {

using test::wave;

// Puts the copy chosen at the start back when a test that selects another ends.
struct RestoreIsa {
  std::string was = active_isa();
  ~RestoreIsa() { select_isa(was); }
};

TEST(Isa, genericFirstAndTheBestSupportedChosen) {
  const std::vector<std::string> all = compiled_isas();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), "generic");
  EXPECT_TRUE(isa_supported("generic"));
  if (const char* env = std::getenv("ATTNCHECK_ISA"); env && *env) {
    EXPECT_EQ(active_isa(), env);
    return;
  }
  std::string best;
  for (const std::string& name : all)
    if (isa_supported(name)) best = name;
  EXPECT_EQ(active_isa(), best);
#if defined(__x86_64__) && defined(ATTNCHECK_SANITIZED)
  // The sanitizer build has one copy, compiled for this machine (cmake/attncheckIsa.cmake).
  EXPECT_EQ(all, (std::vector<std::string>{"generic"}));
#elif defined(__x86_64__)
  // A build for x86-64 has the AVX2 and AVX-512 copies (the compilers CI uses all target them).
  EXPECT_EQ(all, (std::vector<std::string>{"generic", "x86-64-v3", "x86-64-v4"}));
#endif
}

TEST(Isa, aNameThisBuildLacksIsRefusedWithTheChoices) {
  const RestoreIsa restore;
  try {
    select_isa("avx1024");
    FAIL() << "select_isa accepted an instruction set no build has";
  } catch (const ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("select_isa: instruction set \"avx1024\" is not one this build has; expected one of: generic"),
              std::string::npos)
        << m;
  }
  EXPECT_FALSE(isa_supported("avx1024"));
  EXPECT_EQ(active_isa(), restore.was);  // a refused choice changes nothing
}

template <class S>
void everyCopyMeetsTheBound() {
  const RestoreIsa restore;
  // Across a query block (64) and a key tile (128), with GQA, padding and a window: the tiles' edges.
  const Shape qs{2, 4, 200, 24}, ks{2, 2, 200, 24};
  const auto q = wave<S>(qs, 0.3, 3.0), k = wave<S>(ks, 1.1, 3.0), v = wave<S>(ks, 2.0, 1.0);
  const AttentionOptions opts{.key_lengths = {200, 130}, .window = Index{150}};
  Tensor<double> w64({1, 1, 1, 1});
  const Tensor<double> ref = oracle(q, k, v, opts, &w64);  // materialised: not one of the copies
  const auto q64 = q.template cast<double>(), k64 = k.template cast<double>(), v64 = v.template cast<double>();
  for (const std::string& isa : compiled_isas()) {
    if (!isa_supported(isa)) continue;
    select_isa(isa);
    const Tensor<S> out = attention(q, k, v, opts);
    RowStats stats;
    const Tensor<double> streamed_oracle = streaming_oracle(q, k, v, opts, &stats);
    for (Index b = 0; b < qs.B; ++b) {
      const BoolMask mask = BoolMask::of(visibility(opts, b, qs.T, ks.T));
      for (Index h = 0; h < qs.H; ++h) {
        const Index g = kv_head(h, qs.H, ks.H);
        const auto tol = head_tolerance(dtype_of<S>(), q64.head(b, h), k64.head(b, g), v64.head(b, g), mask,
                                        1 / std::sqrt(double(qs.D)), ref.head(b, h), w64.head(b, h));
        const Matrix<double> diff =
            (out.head(b, h).template cast<double>() - Matrix<double>(ref.head(b, h))).cwiseAbs();
        ASSERT_TRUE((diff.array() <= tol.output.array()).all())
            << isa << " " << dtype_name(dtype_of<S>()) << " head (" << b << "," << h << "): worst excess "
            << (diff.array() - tol.output.array()).maxCoeff();
        // The streaming oracle is a float64 kernel: within float64's derived bound of the materialised one.
        const auto tol64 = head_tolerance(DType::f64, q64.head(b, h), k64.head(b, g), v64.head(b, g), mask,
                                          1 / std::sqrt(double(qs.D)), ref.head(b, h), w64.head(b, h));
        const Matrix<double> gap = (streamed_oracle.head(b, h) - ref.head(b, h)).cwiseAbs();
        ASSERT_TRUE((gap.array() <= tol64.output.array()).all())
            << isa << " streaming oracle, head (" << b << "," << h << ")";
      }
    }
  }
}

TEST(Isa, everyCopyMeetsTheBoundFloat32) { everyCopyMeetsTheBound<float>(); }
TEST(Isa, everyCopyMeetsTheBoundFloat64) { everyCopyMeetsTheBound<double>(); }
TEST(Isa, everyCopyMeetsTheBoundFloat16) { everyCopyMeetsTheBound<Eigen::half>(); }
TEST(Isa, everyCopyMeetsTheBoundBfloat16) { everyCopyMeetsTheBound<Eigen::bfloat16>(); }

}  // namespace
}  // namespace attncheck
