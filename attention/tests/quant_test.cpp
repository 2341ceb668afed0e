// Quantised K and V in the core: each format's bytes decode to the values its definition gives (e5m2 checked against
// float16's top byte, e4m3fn against its fields and its published limits), the nearest code rounds ties to even and
// saturates, a cache's codes round-trip through its scales, bad scales and caches are named, and float16 and bfloat16
// kernels that dequantise in their own way are within tolerance.cpp step 12's bound (which is not vacuous).
#include "attncheck/quant.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "attncheck/attention.hpp"
#include "attncheck/error.hpp"
#include "attncheck/tolerance.hpp"

namespace attncheck {
namespace {

TEST(Quant, e5m2IsTheTopByteOfAFloat16) {
  for (int b = 0; b < 256; ++b) {
    const double want = double(Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(b << 8)));
    const double got = quant_value(QuantFormat::e5m2, std::uint8_t(b));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << b;
    else
      EXPECT_EQ(got, want) << b;
  }
  EXPECT_EQ(quant_max(QuantFormat::e5m2), 57344);
}

TEST(Quant, e4m3fnHasItsPublishedValues) {
  // OCP 8-bit floating point (v1.0), E4M3: max normal S.1111.110 = 448, min normal S.0001.000 = 2^-6, min subnormal
  // S.0000.001 = 2^-9, NaN S.1111.111, no infinities.
  EXPECT_EQ(quant_value(QuantFormat::e4m3fn, 0x7E), 448);
  EXPECT_EQ(quant_value(QuantFormat::e4m3fn, 0xFE), -448);
  EXPECT_EQ(quant_value(QuantFormat::e4m3fn, 0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(quant_value(QuantFormat::e4m3fn, 0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(quant_value(QuantFormat::e4m3fn, 0x38), 1.0);
  EXPECT_EQ(quant_value(QuantFormat::e4m3fn, 0x78), 256.0);  // exponent 15 is finite in the "fn" variant
  EXPECT_TRUE(std::isnan(quant_value(QuantFormat::e4m3fn, 0x7F)));
  EXPECT_TRUE(std::isnan(quant_value(QuantFormat::e4m3fn, 0xFF)));
  // Codes 0x00-0x7E increase strictly, each a float with at most 4 significant bits.
  for (int b = 1; b < 0x7F; ++b) {
    const double x = quant_value(QuantFormat::e4m3fn, std::uint8_t(b));
    EXPECT_GT(x, quant_value(QuantFormat::e4m3fn, std::uint8_t(b - 1))) << b;
    int e = 0;
    EXPECT_EQ(std::ldexp(std::frexp(x, &e), 4), std::trunc(std::ldexp(std::frexp(x, &e), 4))) << b;
    EXPECT_EQ(quant_value(QuantFormat::e4m3fn, std::uint8_t(b | 0x80)), -x);
  }
  EXPECT_EQ(quant_max(QuantFormat::e4m3fn), 448);
  EXPECT_EQ(quant_value(QuantFormat::int8, 0xFF), -1);
  EXPECT_EQ(quant_value(QuantFormat::int8, 0x80), -128);
}

TEST(Quant, theNearestCodeRoundsTiesToEvenAndSaturates) {
  EXPECT_EQ(quant_nearest(QuantFormat::e4m3fn, 1.0625), 0x38);  // between 1 (0x38) and 1.125 (0x39): even
  EXPECT_EQ(quant_nearest(QuantFormat::e4m3fn, 1.1875), 0x3A);  // between 1.125 and 1.25 (0x3A): even
  EXPECT_EQ(quant_nearest(QuantFormat::e4m3fn, 1.07), 0x39);
  EXPECT_EQ(quant_nearest(QuantFormat::e4m3fn, 1e6), 0x7E);  // saturating, never the NaN
  EXPECT_EQ(quant_nearest(QuantFormat::e4m3fn, -1e6), 0xFE);
  EXPECT_EQ(quant_nearest(QuantFormat::e5m2, 1e9), 0x7B);  // never infinity
  EXPECT_EQ(quant_nearest(QuantFormat::int8, 2.5), 2);
  EXPECT_EQ(quant_nearest(QuantFormat::int8, -3.5), std::uint8_t(std::int8_t(-4)));
  EXPECT_EQ(quant_nearest(QuantFormat::e4m3fn, -0.0), 0x00);
  EXPECT_FALSE(quant_exact(QuantFormat::e4m3fn, 1.1).has_value());
  EXPECT_EQ(quant_exact(QuantFormat::e5m2, 57344), std::optional<std::uint8_t>(0x7B));
  EXPECT_THROW(quant_nearest(QuantFormat::e5m2, std::nan("")), ValueError);
}

TEST(Quant, aCacheRoundTripsThroughItsScales) {
  const Shape s{2, 2, 3, 4};
  Tensor<double> x(s);
  for (Index n = 0; n < x.size(); ++n) x.values()[n] = std::sin(1.3 * double(n)) * 5;
  for (const QuantFormat f : {QuantFormat::e4m3fn, QuantFormat::e5m2, QuantFormat::int8})
    for (const QuantGranularity g :
         {QuantGranularity::tensor, QuantGranularity::kv_head, QuantGranularity::token_head}) {
      QuantScales sc = quant_extents(g, s);
      for (Index i = 0; i < sc.B * sc.H * sc.T; ++i) {
        sc.scales.push_back(double(float(0.03 + 0.01 * double(i))));
        if (f == QuantFormat::int8) sc.zero_points.push_back(double(i % 5) - 2);
      }
      check_quant_scales("test", "k", f, sc, s);
      const Tensor<double> y = quantize_dequantize(f, sc, x);
      const std::vector<std::uint8_t> codes = quant_codes("test", "k", f, sc, y);
      EXPECT_EQ(dequantize(f, sc, s, codes.data()).values(), y.values());
      // Stored to the nearest code: within half a step of x where not saturated (e4m3's 3 mantissa bits: 2^-4).
      if (f != QuantFormat::int8) {
        for (Index n = 0; n < x.size(); ++n)
          EXPECT_LE(std::abs(y.values()[n] - x.values()[n]), std::abs(x.values()[n]) / 8 + 0.04 * std::ldexp(1.0, -9));
      }
      // x itself is not a cache of these scales: its first element is named.
      EXPECT_THROW(
          {
            try {
              quant_codes("test", "v", f, sc, x);
            } catch (const ValueError& e) {
              EXPECT_NE(std::string(e.what()).find("the quantised v's element ["), std::string::npos) << e.what();
              throw;
            }
          },
          ValueError);
    }
}

// A quantised cache in pages: each live key's row and per-token scale sit at its page and slot (checked against
// scatter_pages of the code values and of the scales as a [B,H_kv,T,1] tensor), free slots hold the fill, and
// unpage_quant reads back the cache, keys past a sequence's length as 0, in every format, granularity and layout.
TEST(Quant, aPagedCacheRoundTripsThroughItsPool) {
  const Shape s{2, 2, 5, 32};
  Tensor<double> x(s);
  for (Index n = 0; n < x.size(); ++n) x.values()[n] = std::sin(1.3 * double(n)) * 5;
  const std::vector<Index> lengths{5, 3};
  for (const PageLayout l : {PageLayout::token_major, PageLayout::head_major})
    for (const QuantFormat f : kQuantFormats)
      for (const QuantGranularity g : {QuantGranularity::tensor, QuantGranularity::kv_head,
                                       QuantGranularity::token_head, QuantGranularity::block32}) {
        if (quant_blocked(f) != (g == QuantGranularity::block32)) continue;
        SCOPED_TRACE(std::string(quant_format_name(f)) + " " + std::string(quant_granularity_name(g)) + " " +
                     page_layout_name(l));
        QuantScales sc = quant_extents(g, s);
        for (Index i = 0; i < sc.B * sc.H * sc.T * sc.C; ++i) {
          sc.scales.push_back(double(float(quant_blocked(f) ? 0.25 + 0.125 * double(i % 3) : 0.03 + 0.01 * double(i))));
          if (f == QuantFormat::int8) sc.zero_points.push_back(double(i % 5) - 2);
          if (quant_has_min(f)) sc.mins.push_back(-0.5 * double(i % 4));
        }
        const Tensor<double> y = quantize_dequantize(f, sc, x);
        PagedKV pk;  // sequence 0 in pages 4, 0, 2; sequence 1 in 1, 3; page 5 spare; junk past each row's pages
        pk.page_size = 2;
        pk.layout = l;
        pk.num_pages = 6;
        pk.max_pages = 4;
        pk.block_table = {4, 0, 2, -7, 1, 3, 99, 2147483647};
        pk.fill = PageFill::nan;
        const QuantPool pool = page_quant(f, sc, y, lengths, pk);
        EXPECT_EQ(pool.shape, pk.pool_shape(2, 32));
        // Key 4 of sequence 0 is page 2's slot 0, key 2 of sequence 1 page 3's slot 0; page 3's slot 1 is free.
        const std::size_t rb = std::size_t(pool.row_bytes);
        const std::vector<std::uint8_t> codes = quant_codes("test", "k", f, sc, y);
        if (!quant_blocked(f)) {
          EXPECT_EQ(
              std::memcmp(pool.bytes.data() + pool.row(pk, 2, 0, 1), codes.data() + ((0 * 2 + 1) * 5 + 4) * 32, rb), 0);
          EXPECT_EQ(
              std::memcmp(pool.bytes.data() + pool.row(pk, 3, 0, 0), codes.data() + ((1 * 2 + 0) * 5 + 2) * 32, rb), 0);
          if (g == QuantGranularity::token_head) {
            EXPECT_EQ(pool.scales.scales[pool.scale_at(pk, 2, 0, 1)], sc.scale(0, 1, 4));
            EXPECT_EQ(pool.scales.scales[pool.scale_at(pk, 3, 0, 0)], sc.scale(1, 0, 2));
            EXPECT_TRUE(std::isnan(pool.scales.scales[pool.scale_at(pk, 3, 1, 1)]));
          }
        }
        EXPECT_EQ(pool.bytes[pool.row(pk, 3, 1, 1)], 0xFF);  // a free slot: NaN in FP8, a NaN d in ggml's blocks
        EXPECT_EQ(pool.bytes[pool.row(pk, 5, 0, 0)], 0xFF);  // the spare page
        QuantScales back;
        const Tensor<double> z = unpage_quant(f, pool, pk, 2, 5, lengths, back);
        EXPECT_EQ(back.granularity, g);
        for (Index b = 0; b < 2; ++b)
          for (Index h = 0; h < 2; ++h)
            for (Index t = 0; t < 5; ++t)
              for (Index c = 0; c < 32; ++c) {
                const bool live = t < lengths[std::size_t(b)];
                ASSERT_EQ(z(b, h, t, c), live ? y(b, h, t, c) : 0.0) << b << h << t << c;
                if (live) ASSERT_EQ(back.scale(b, h, t, c), sc.scale(b, h, t, c));
              }
        check_quant_scales("test", "k", f, back, s);
      }
}

// ggml's blocks as ggml lays them out (ggml-common.h's block_q8_0 ... block_q5_1, dequantize_row_q*): hand-made blocks
// decode to what ggml's dequantisation gives, and a cache packs and unpacks to itself in every format.
TEST(Quant, ggmlBlocksDecodeAsGgmlDoes) {
  const Shape one{1, 1, 1, 32};
  QuantScales s;
  // Q4_0: d = 0.5 (float16 0x3800); byte 0 = 0x9F holds element 0 (low nibble 15: 15 - 8 = 7) and element 16 (9: 1).
  std::vector<std::uint8_t> q4(18, 0x88);
  q4[0] = 0x00, q4[1] = 0x38, q4[2] = 0x9F;
  Tensor<double> x =
      dequantize(QuantFormat::ggml_q4_0, s, one, unpack_blocks(QuantFormat::ggml_q4_0, one, q4.data(), s).data());
  EXPECT_EQ(x(0, 0, 0, 0), 3.5);
  EXPECT_EQ(x(0, 0, 0, 16), 0.5);
  EXPECT_EQ(x(0, 0, 0, 1), 0.0);
  // Q5_0: qh's bit 0 (element 0) and bit 17 (element 17) set; qs[0] low nibble 3, qs[1] high nibble 2.
  std::vector<std::uint8_t> q5(22, 0);
  q5[0] = 0x00, q5[1] = 0x3C;  // d = 1
  q5[2] = 0x01, q5[4] = 0x02;  // qh = 1 | 1 << 17
  q5[6] = 0x03, q5[7] = 0x20;
  x = dequantize(QuantFormat::ggml_q5_0, s, one, unpack_blocks(QuantFormat::ggml_q5_0, one, q5.data(), s).data());
  EXPECT_EQ(x(0, 0, 0, 0), 19 - 16);
  EXPECT_EQ(x(0, 0, 0, 17), 18 - 16);
  EXPECT_EQ(x(0, 0, 0, 1), -16);
  // Q4_1: d = 0.25, m = -1; nibble 4 is 0.
  std::vector<std::uint8_t> q41(20, 0x44);
  q41[0] = 0x00, q41[1] = 0x34, q41[2] = 0x00, q41[3] = 0xBC;
  x = dequantize(QuantFormat::ggml_q4_1, s, one, unpack_blocks(QuantFormat::ggml_q4_1, one, q41.data(), s).data());
  EXPECT_EQ(x(0, 0, 0, 5), 0.0);
  // Q8_0: an int8 times d.
  std::vector<std::uint8_t> q8(34, 0);
  q8[0] = 0x00, q8[1] = 0xC0, q8[2] = 0xFF;  // d = -2 (ggml's Q4_0 and Q8_0 writers keep the sign of the largest value)
  x = dequantize(QuantFormat::ggml_q8_0, s, one, unpack_blocks(QuantFormat::ggml_q8_0, one, q8.data(), s).data());
  EXPECT_EQ(x(0, 0, 0, 0), 2.0);
  // Every format: a cache of two rows of two blocks packs and unpacks to its codes and scales.
  const Shape sh{1, 2, 1, 64};
  Tensor<double> v(sh);
  for (Index n = 0; n < v.size(); ++n) v.values()[n] = std::sin(0.9 * double(n)) * 3;
  for (const QuantFormat f : {QuantFormat::ggml_q8_0, QuantFormat::ggml_q4_0, QuantFormat::ggml_q4_1,
                              QuantFormat::ggml_q5_0, QuantFormat::ggml_q5_1}) {
    QuantScales sc = quant_extents(QuantGranularity::block32, sh);
    for (Index i = 0; i < 4; ++i) {
      sc.scales.push_back(double(Eigen::half(i % 2 ? -0.1875f : 0.0625f * float(i + 1))));
      if (quant_has_min(f)) sc.mins.push_back(double(Eigen::half(-1.5f + float(i))));
    }
    check_quant_scales("test", "k", f, sc, sh);
    const Tensor<double> y = quantize_dequantize(f, sc, v);
    const std::vector<std::uint8_t> codes = quant_codes("test", "k", f, sc, y);
    QuantScales back;
    EXPECT_EQ(unpack_blocks(f, sh, pack_blocks(f, sc, sh, codes).data(), back), codes) << quant_format_name(f);
    EXPECT_EQ(back, sc) << quant_format_name(f);
  }
  // D not a multiple of 32, or another granularity, is refused.
  QuantScales bad = quant_extents(QuantGranularity::tensor, sh);
  bad.scales = {1.0};
  EXPECT_THROW(check_quant_scales("test", "k", QuantFormat::ggml_q4_0, bad, sh), ValueError);
  EXPECT_THROW(check_quant_scales("test", "k", QuantFormat::ggml_q4_0, quant_extents(QuantGranularity::block32, one),
                                  Shape{1, 1, 1, 40}),
               ShapeError);
}

TEST(Quant, badScalesAreNamed) {
  const Shape s{1, 2, 3, 4};
  const auto what = [&](QuantFormat f, QuantScales sc) {
    try {
      check_quant_scales("call", "k", f, sc, s);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  QuantScales per_head = quant_extents(QuantGranularity::kv_head, s);
  per_head.scales = {0.5, 0.25};
  EXPECT_EQ(what(QuantFormat::e4m3fn, per_head), "");
  QuantScales wrong = per_head;
  wrong.H = 1;
  EXPECT_NE(what(QuantFormat::e4m3fn, wrong).find("kv_head scales are [1,1,1], expected [1,2,1]"), std::string::npos);
  QuantScales not_float = per_head;
  not_float.scales[1] = 0.1;  // not a float32
  EXPECT_NE(what(QuantFormat::e4m3fn, not_float).find("scale 1 is 0.1: a scale is a finite float32 greater than 0"),
            std::string::npos);
  QuantScales zp = per_head;
  zp.zero_points = {1, 2};
  EXPECT_NE(what(QuantFormat::e4m3fn, zp).find("only int8 has zero points"), std::string::npos);
  zp.zero_points = {1, 200};
  EXPECT_NE(what(QuantFormat::int8, zp).find("zero point 1 is 200"), std::string::npos);
}

// Kernels that dequantise in their own way: codes·scale in the dtype (the reference's cast of the exact value rounds
// once, this twice: the scale into the dtype, then the product), and one that keeps the codes and folds K's scale into
// the softmax scale and V's into the output. Each is within step 12's bound of the oracle on the dequantised values,
// at float16 and bfloat16, with values down to e4m3's subnormals; and the bound is not vacuous.
template <class S>
void dequantising_kernels_are_within_the_bound(DType dtype) {
  const Shape s{1, 1, 12, 8};
  const double k_scale = double(float(0.0173)), v_scale = double(float(0.311));
  QuantizedKV qkv{.format = QuantFormat::e4m3fn,
                  .k = quant_extents(QuantGranularity::tensor, s),
                  .v = quant_extents(QuantGranularity::tensor, s)};
  qkv.k.scales = {k_scale};
  qkv.v.scales = {v_scale};
  std::vector<std::uint8_t> kc, vc;
  for (Index n = 0; n < s.numel(); ++n) {
    kc.push_back(std::uint8_t((n * 37 + 11) % 0x7F) | (n % 3 ? 0 : 0x80));  // every magnitude, subnormals included
    vc.push_back(std::uint8_t((n * 53 + 5) % 0x7F) | (n % 2 ? 0x80 : 0));
  }
  const Tensor<double> k = dequantize(qkv.format, qkv.k, s, kc.data()), v = dequantize(qkv.format, qkv.v, s, vc.data());
  Tensor<double> q(s);
  for (Index n = 0; n < q.size(); ++n) q.values()[n] = double(S(std::cos(0.7 * double(n)) * 0.5));
  AttentionOptions o;
  o.quant = qkv;
  Tensor<double> want_w(Shape{});
  const Tensor<double> want = oracle(q, k, v, o, &want_w);
  const double scale = 1 / std::sqrt(8.0);
  const HeadTolerance tol =
      head_tolerance(dtype, q.head(0, 0), k.head(0, 0), v.head(0, 0), BoolMask::causal(12, 12), scale, want.head(0, 0),
                     want_w.head(0, 0), 2.0, head_modifiers(o, 0, 0, 12, 12));
  // Kernel 1: k̂ = S(S(code)·S(scale)), then the core's attention at S.
  Tensor<S> qs = q.cast<S>(), k1(s), v1(s), k2(s), v2(s);
  for (Index n = 0; n < s.numel(); ++n) {
    k1.values()[n] = S(S(quant_value(qkv.format, kc[std::size_t(n)])) * S(k_scale));
    v1.values()[n] = S(S(quant_value(qkv.format, vc[std::size_t(n)])) * S(v_scale));
    k2.values()[n] = S(quant_value(qkv.format, kc[std::size_t(n)]));  // exact: 4 significant bits
    v2.values()[n] = S(quant_value(qkv.format, vc[std::size_t(n)]));
  }
  const Tensor<S> o1 = attention<S>(qs, k1, v1, {});
  // Kernel 2: the codes as they are, K's scale in the softmax scale, V's on the output.
  AttentionOptions folded;
  folded.scale = double(float(scale) * float(k_scale));
  const Tensor<S> o2 = attention<S>(qs, k2, v2, folded);
  double worst = 0;
  bool unscaled_outside = false;  // a kernel that forgets V's scale
  for (Index i = 0; i < 12; ++i)
    for (Index c = 0; c < 8; ++c) {
      const double e1 = std::abs(double(o1(0, 0, i, c)) - want(0, 0, i, c));
      const double e2 = std::abs(double(S(float(o2(0, 0, i, c)) * float(v_scale))) - want(0, 0, i, c));
      EXPECT_LE(e1, tol.output(i, c)) << i << "," << c;
      EXPECT_LE(e2, tol.output(i, c)) << i << "," << c;
      worst = std::max({worst, e1, e2});
      unscaled_outside |= std::abs(double(o2(0, 0, i, c)) - want(0, 0, i, c)) > tol.output(i, c);
    }
  EXPECT_GT(worst, 0.0);
  EXPECT_TRUE(unscaled_outside);  // not vacuous: a kernel that forgets V's scale is outside
}

TEST(Quant, kernelsDequantisingInTheirOwnWayAreWithinTheBound) {
  dequantising_kernels_are_within_the_bound<Eigen::half>(DType::f16);
  dequantising_kernels_are_within_the_bound<Eigen::bfloat16>(DType::bf16);
  dequantising_kernels_are_within_the_bound<float>(DType::f32);
}

}  // namespace
}  // namespace attncheck
