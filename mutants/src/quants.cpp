// Kernels that read quantised K and V caches (ABI 4's ATTNCHECK_CAP4_KV_*: FP8 e4m3fn and e5m2, int8, with scales per
// tensor, kv head or token) and get the dequantisation wrong, as serving stacks' trackers report it: a per-kv-head
// scale indexed by the query head or always head 0's, a scale applied twice or as a divisor, V's scale dropped or K's
// applied to V, e4m3fn decoded as e5m2 or with IEEE infinities, its subnormals flushed, int8 read unsigned, a zero
// point ignored or added, per-token scales read with their strides swapped or once per tile, the scales applied on the
// decode path only or assumed to be 1 on the ragged (padded) path. Each decodes the codes a plug-in gets (quant_codes
// of the case's values under its scales) with its bug, then runs the reference on what it decoded. And a control that
// keeps the codes and folds the scales into the scores and the output.
#include <array>
#include <cmath>
#include <cstring>
#include <functional>

#include "attncheck/generators.hpp"
#include "kernel_kit.hpp"
#include "parts.hpp"

namespace attncheck::zoo {
namespace {

// What these kernels declare: every format, granularity and zero points, grouped-query heads, key padding, the LSE.
Capabilities quant_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::kv_e4m3fn, Feature::kv_e5m2, Feature::kv_int8, Feature::kv_scale_per_head,
                  Feature::kv_scale_per_token, Feature::kv_zero_points, Feature::key_padding, Feature::lse});
  return c;
}

// What the ggml-block kernels declare: ggml's five block types (their mutants' cases have D a multiple of 32).
Capabilities ggml_capabilities() {
  Capabilities c = gqa_capabilities();
  c.features.add({Feature::kv_ggml_q8_0, Feature::kv_ggml_q4_0, Feature::kv_ggml_q4_1, Feature::kv_ggml_q5_0,
                  Feature::kv_ggml_q5_1, Feature::key_padding, Feature::lse});
  return c;
}

// One side of the cache as a plug-in gets it: its codes [B,H_kv,T_k,D] row-major, format and scales.
struct Side {
  QuantFormat format;
  const QuantScales* scales;
  std::vector<std::uint8_t> codes;
  Shape shape;
  bool is_k;
  std::uint8_t code(Index b, Index g, Index t, Index c) const {
    return codes[std::size_t(((b * shape.H + g) * shape.T + t) * shape.D + c)];
  }
  // The correct value of element (b, g, t, c).
  double value(Index b, Index g, Index t, Index c) const {
    return (quant_value(format, code(b, g, t, c)) - scales->zero_point(b, g, t)) * scales->scale(b, g, t, c) +
           scales->min(b, g, t, c);
  }
};

// What a kernel decodes element (b, g, t, c) of `side` as, read for query head h (whose kv head is g); `other` is the
// other side.
using Decode = std::function<double(const Problem& p, const Side& side, const Side& other, Index b, Index h, Index g,
                                    Index t, Index c)>;

double correct(const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
  return s.value(b, g, t, c);
}

// The element with its zero point but without its scale.
double unscaled(const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
  return quant_value(s.format, s.code(b, g, t, c)) - s.scales->zero_point(b, g, t);
}

// A kernel that decodes K and V per query head with `decode` (K's with k_decode, V's with v_decode), rounds what it
// decoded to the dtype, and runs the reference's dense attention on it (one kv head per query head).
ImplementationPtr quant_kernel(const char* name, const char* description, Decode k_decode, Decode v_decode,
                               Capabilities caps = quant_capabilities()) {
  return make_implementation(name, description, caps, [=](const Problem& p) {
    if (!p.quant) return reference_implementation()->forward(p);
    const QuantizedKV& qk = *p.quant;
    const Side k{qk.format, &qk.k, quant_codes(name, "k", qk.format, qk.k, p.k), p.k.shape(), true},
        v{qk.format, &qk.v, quant_codes(name, "v", qk.format, qk.v, p.v), p.v.shape(), false};
    const Index H = p.q.shape().H, group = H / p.k.shape().H;
    const auto decoded = [&](const Side& s, const Side& other, const Decode& d) {
      Tensor<double> out(Shape{s.shape.B, H, s.shape.T, s.shape.D});
      for (Index b = 0; b < s.shape.B; ++b)
        for (Index h = 0; h < H; ++h)
          for (Index t = 0; t < s.shape.T; ++t)
            for (Index c = 0; c < s.shape.D; ++c) {
              const double x = d(p, s, other, b, h, h / group, t, c);
              out(b, h, t, c) = std::isfinite(x) ? round_to(p.dtype, x) : x;
            }
      return out;
    };
    Problem r = p;
    r.quant.reset();
    r.k = decoded(k, v, k_decode);
    r.v = decoded(v, k, v_decode);
    return reference_implementation()->forward(r);
  });
}

// A kernel that takes a quantised Q (Feature::q_quant) and decodes element (b, h, i, c) of it with `decode` (its code's
// value as `value`, its scales `qs`, K's `ks`; g the kv head), K and V correctly, then runs the reference on what it
// decoded, rounded to the dtype.
using QDecode = double (*)(double value, const QuantScales& qs, const QuantScales& ks, Index b, Index h, Index g,
                           Index i);
ImplementationPtr q_kernel(const char* name, const char* description, QDecode decode) {
  Capabilities caps = quant_capabilities();
  caps.features.add(Feature::q_quant);
  return make_implementation(name, description, caps, [=](const Problem& p) {
    if (!p.quant || !p.quant->q) return reference_implementation()->forward(p);
    const QuantizedKV& qk = *p.quant;
    const std::vector<std::uint8_t> codes = quant_codes(name, "q", qk.format, *qk.q, p.q);
    const Shape& s = p.q.shape();
    const Index group = s.H / p.k.shape().H;
    Problem r = p;
    r.quant.reset();
    std::size_t n = 0;
    for (Index b = 0; b < s.B; ++b)
      for (Index h = 0; h < s.H; ++h)
        for (Index i = 0; i < s.T; ++i)
          for (Index c = 0; c < s.D; ++c, ++n)
            r.q(b, h, i, c) =
                round_to(p.dtype, decode(quant_value(qk.format, codes[n]), *qk.q, qk.k, b, h, h / group, i));
    return reference_implementation()->forward(r);
  });
}

// e4m3fn's byte decoded as another format would: as e5m2, or IEEE-style with exponent 15 for infinities and NaNs.
double e4m3_as_ieee(std::uint8_t b) {
  if (((b >> 3) & 0xF) == 0xF) return (b & 7) == 0 ? (b & 0x80 ? -1.0 : 1.0) * HUGE_VAL : std::nan("");
  return quant_value(QuantFormat::e4m3fn, b);
}

Mutant both(const char* name, const char* description, Decode d, const char* bug, Shape minimal, const char* why,
            std::vector<std::string> killed_by, std::vector<Shape> also = {}) {
  return Mutant{.impl = quant_kernel(name, description, d, d),
                .bug = bug,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = std::move(killed_by),
                .also_minimal = std::move(also)};
}

// A ggml-block kernel decoding element (b, g, t, c) with `element`, given the block's start and the element's offset
// in it, K and V alike.
using BlockDecode = double (*)(const Side& s, Index b, Index g, Index t, Index k0, Index j);
Mutant ggml_mutant(const char* name, const char* description, BlockDecode element, const char* bug, Shape minimal,
                   const char* why) {
  const Decode d = [element](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
    return quant_blocked(s.format) ? element(s, b, g, t, c - c % kQuantBlock, c % kQuantBlock) : s.value(b, g, t, c);
  };
  return Mutant{.impl = quant_kernel(name, description, d, d, ggml_capabilities()),
                .bug = bug,
                .minimal_shape = minimal,
                .why_minimal = why,
                .killed_by = {"kv-quant-oracle"}};
}

// The element's q from its code (q8_0's int8, the others' n less 8 or 16 for the _0 kinds).
double q_of(const Side& s, Index b, Index g, Index t, Index c) { return quant_value(s.format, s.code(b, g, t, c)); }
bool nibbles(QuantFormat f) { return f != QuantFormat::ggml_q8_0; }

// How a kernel takes q for its dot with a block-quantised K: as it is, or rounded to ggml's Q8_0 blocks (Q8_1's sum
// with it) as ggml's CPU kernel does, or so with a bug.
enum class QDot { exact, ggml_q8, sum_without_d, next_block_d };
// How a kernel takes P = exp(s - m) for its product with V: as it is, or cast to FP8 e4m3 after scaling by 448 (the
// format's range; FlashAttention 3's FP8 forward) and descaled, or so with the descale forgotten.
enum class PFp8 { exact, e4m3, e4m3_descale_dropped };

// One block of 32 of a row of q as the dot takes it: its values and their sum (Q8_1's s).
struct GgmlQ {
  std::array<double, kQuantBlock> q{};
  double sum = 0;
};

// Row i of q (query head h, batch entry b) in blocks of 32, as `how` takes it. ggml's quantize_row_q8_1: d = amax/127,
// each code roundf(x·(1/d)), d stored as float16, and s = d·Σ code (float16 in ggml).
std::vector<GgmlQ> ggml_q_blocks(const Problem& p, Index b, Index h, Index i, QDot how) {
  const Index n = p.q.shape().D / kQuantBlock;
  std::vector<GgmlQ> out(static_cast<std::size_t>(n));
  std::vector<float> d16(static_cast<std::size_t>(n));
  std::vector<std::array<float, kQuantBlock>> codes(static_cast<std::size_t>(n));
  for (Index k = 0; k < n; ++k) {
    GgmlQ& o = out[std::size_t(k)];
    float amax = 0;
    for (Index c = 0; c < kQuantBlock; ++c) {
      o.q[std::size_t(c)] = round_to(p.dtype, p.q(b, h, i, k * kQuantBlock + c));
      amax = std::max(amax, std::abs(float(o.q[std::size_t(c)])));
    }
    const float d = amax / 127, id = d != 0 ? 1 / d : 0.0f;
    float code_sum = 0;
    for (Index c = 0; c < kQuantBlock; ++c)
      code_sum += codes[std::size_t(k)][std::size_t(c)] = std::round(float(o.q[std::size_t(c)]) * id);
    d16[std::size_t(k)] = float(Eigen::half(d));
    if (how == QDot::exact)
      for (const double x : o.q) o.sum += x;
    else  // (ggml stores d·Σ code as float16, which overflows past 65504; this kernel keeps it in float)
      o.sum = how == QDot::sum_without_d ? code_sum : d * code_sum;
  }
  if (how != QDot::exact)
    for (Index k = 0; k < n; ++k)
      for (Index c = 0; c < kQuantBlock; ++c)
        out[std::size_t(k)].q[std::size_t(c)] = double(codes[std::size_t(k)][std::size_t(c)] *
                                                       d16[std::size_t(how == QDot::next_block_d ? (k + 1) % n : k)]);
  return out;
}

// The control's kernel: the codes kept (decoded from a table of their bits), K's scale in the scores, V's on the
// products, q taken for a ggml block's dot as `how` says. Paged (Feature::paged_quant): K's and V's codes and scales
// read from the pools a plug-in gets, through the table (keys past a sequence's length are never seen).
Outcome folded_forward(const Problem& given, QDot how, PFp8 p_fp8 = PFp8::exact) {
  if (!given.quant) return reference_implementation()->forward(given);
  Problem paged_read;
  if (given.paged) {
    paged_read = given;
    const PagedKV pk = given.paged_kv();
    const std::vector<Index> lengths = given.sequence_lengths();
    QuantizedKV& q = *paged_read.quant;
    for (const auto& [s, x] : {std::pair{&q.k, &paged_read.k}, {&q.v, &paged_read.v}})
      *x = unpage_quant(q.format, page_quant(q.format, *s, *x, lengths, pk), pk, x->shape().B, x->shape().T, lengths,
                        *s);
  }
  const Problem& p = given.paged ? paged_read : given;
  const QuantizedKV& qk = *p.quant;
  const std::vector<std::uint8_t> kc = quant_codes("control", "k", qk.format, qk.k, p.k),
                                  vc = quant_codes("control", "v", qk.format, qk.v, p.v),
                                  qc = qk.q ? quant_codes("control", "q", qk.format, *qk.q, p.q)
                                            : std::vector<std::uint8_t>{};
  return visit_dtype(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    using A = Acc<S>;
    const Shape qs = p.q.shape(), ks = p.k.shape(), vs = p.v.shape();
    const Index group = qs.H / ks.H;
    const A scale = A(p.scale ? *p.scale : 1 / std::sqrt(double(qs.D)));
    // A table of each byte's value, built from the bits (not the core's decoder): e5m2 as float16's top
    // byte, e4m3fn from its fields, int8 as a signed byte; then minus the zero point, held in A.
    const auto table_value = [&](std::uint8_t b) -> A {
      switch (qk.format) {
        case QuantFormat::e5m2:
          return A(float(Eigen::numext::bit_cast<Eigen::half>(std::uint16_t(b << 8))));
        case QuantFormat::int8:
        case QuantFormat::ggml_q8_0:
          return A(std::int8_t(b));
        case QuantFormat::ggml_q4_0:
          return A(int(b) - 8);
        case QuantFormat::ggml_q5_0:
          return A(int(b) - 16);
        case QuantFormat::ggml_q4_1:
        case QuantFormat::ggml_q5_1:
          return A(b);
        case QuantFormat::e4m3fn: {
          const int e = (b >> 3) & 0xF, m = b & 7;
          const A mag = e == 0 ? A(std::ldexp(float(m), -9)) : A(std::ldexp(float(8 + m), e - 10));
          return b & 0x80 ? -mag : mag;
        }
      }
      return A(0);
    };
    Outcome o;
    o.output = Tensor<double>(p.output_shape());
    Tensor<double> w(Shape{qs.B, qs.H, qs.T, ks.T}), lse(Shape{qs.B, qs.H, qs.T, 1});
    for (Index b = 0; b < qs.B; ++b)
      for (Index h = 0; h < qs.H; ++h) {
        const Index g = h / group;
        const Visibility vis = p.visibility(b, h);
        for (Index i = 0; i < qs.T; ++i) {
          std::vector<A> s(std::size_t(ks.T), -std::numeric_limits<A>::infinity());
          // The row's visible keys, and q's ggml blocks, once a row (not once a key and column).
          const KeyRange run = vis.run(i);
          std::vector<char> seen(std::size_t(ks.T), 0);
          for (Index j = run.begin; j < run.end; ++j) seen[std::size_t(j)] = vis.cells_allow(i, j);
          const std::vector<GgmlQ> qb =
              quant_blocked(qk.format) ? ggml_q_blocks(p, b, h, i, how) : std::vector<GgmlQ>{};
          A m = -std::numeric_limits<A>::infinity();
          for (Index j = 0; j < ks.T; ++j) {
            if (!seen[std::size_t(j)]) continue;
            const auto kq = [&](Index c) {
              return table_value(kc[std::size_t(((b * ks.H + g) * ks.T + j) * ks.D + c)]);
            };
            if (quant_blocked(qk.format)) {  // ggml's way: d·Σ q·n + m·Σ q per block
              A dot = 0;
              for (Index k0 = 0; k0 < qs.D; k0 += kQuantBlock) {
                const GgmlQ& blk = qb[std::size_t(k0 / kQuantBlock)];
                A qn = 0;
                for (Index c = k0; c < k0 + kQuantBlock; ++c) qn += A(blk.q[std::size_t(c - k0)]) * kq(c);
                dot += A(qk.k.scale(b, g, j, k0)) * qn + A(qk.k.min(b, g, j, k0)) * A(blk.sum);
              }
              s[std::size_t(j)] = dot * scale;
            } else if (qk.q) {  // Q's codes too: both scales with the softmax's
              A dot = 0;
              for (Index c = 0; c < qs.D; ++c)
                dot += table_value(qc[std::size_t(((b * qs.H + h) * qs.T + i) * qs.D + c)]) *
                       (kq(c) - A(qk.k.zero_point(b, g, j)));
              s[std::size_t(j)] = dot * (A(qk.q->scale(b, h, i)) * A(qk.k.scale(b, g, j)) * scale);
            } else {
              A dot = 0;
              for (Index c = 0; c < qs.D; ++c) dot += A(S(p.q(b, h, i, c))) * (kq(c) - A(qk.k.zero_point(b, g, j)));
              s[std::size_t(j)] = dot * (A(qk.k.scale(b, g, j)) * scale);  // K's scale with the softmax's
            }
            m = std::max(m, s[std::size_t(j)]);
          }
          A l = 0;
          for (Index j = 0; j < ks.T; ++j)
            if (seen[std::size_t(j)]) l += std::exp(s[std::size_t(j)] - m);
          lse(b, h, i, 0) = l > 0 ? double(m) + std::log(double(l)) : -HUGE_VAL;
          std::vector<A> p_row(std::size_t(ks.T), A(0));  // P as the product with V takes it
          for (Index j = 0; j < ks.T; ++j) {
            if (!seen[std::size_t(j)]) continue;
            const A e = std::exp(s[std::size_t(j)] - m);
            const A p8 = p_fp8 == PFp8::exact
                             ? e
                             : A(quant_value(QuantFormat::e4m3fn, quant_nearest(QuantFormat::e4m3fn, double(e) * 448)));
            p_row[std::size_t(j)] = p_fp8 == PFp8::e4m3 ? p8 / A(448) : p8;
          }
          for (Index c = 0; c < vs.D; ++c) {
            A acc = 0;
            for (Index j = 0; j < ks.T; ++j)
              if (seen[std::size_t(j)])
                acc +=
                    p_row[std::size_t(j)] *
                    (A(qk.v.scale(b, g, j, c)) * (table_value(vc[std::size_t(((b * vs.H + g) * vs.T + j) * vs.D + c)]) -
                                                  A(qk.v.zero_point(b, g, j))) +
                     A(qk.v.min(b, g, j, c)));
            o.output(b, h, i, c) = l > 0 ? double(S(acc / l)) : 0.0;
          }
          for (Index j = 0; j < ks.T; ++j)
            w(b, h, i, j) = seen[std::size_t(j)] && l > 0 ? double(S(std::exp(s[std::size_t(j)] - m) / l)) : 0.0;
        }
      }
    if (p.want_weights) o.weights = w;
    if (p.want_lse) o.lse = lse;
    return o;
  });
}

// A paged quantised kernel (Feature::paged_quant): it gets K's and V's pools as a plug-in does (page_quant: codes and
// scales at each key's page and slot), walks each sequence's keys through the table, and decodes element c of key t
// for query head h (kv head g) with the scale (and zero point) at the index `scale_index` gives in the pool's scales;
// then runs the reference on what it decoded (one kv head per query head), rounded to the dtype. An index outside the
// scales is a crash (a segfault on a device).
using PoolScaleIndex = std::size_t (*)(const QuantPool& pool, const PagedKV& pk, Index h, Index g, Index page,
                                       Index slot);
ImplementationPtr paged_quant_kernel(const char* name, const char* description, PoolScaleIndex scale_index,
                                     bool identity_scales = false) {
  Capabilities caps = quant_capabilities();
  caps.features.add({Feature::paged, Feature::paged_quant});
  caps.page_sizes = {1, 8, 16, 64, 256};
  caps.page_layouts = 3;
  return make_implementation(name, description, caps, [=](const Problem& p) {
    if (!p.quant || !p.paged) return reference_implementation()->forward(p);
    const QuantizedKV& qk = *p.quant;
    const PagedKV pk = p.paged_kv();
    const std::vector<Index> lengths = p.sequence_lengths();
    Problem r = p;
    r.quant.reset();
    r.paged.reset();
    const Index H = p.q.shape().H, group = H / p.k.shape().H;
    for (const auto& [s, x] : {std::pair{&qk.k, &r.k}, {&qk.v, &r.v}}) {
      const QuantPool pool = page_quant(qk.format, *s, *x, lengths, pk);
      const Shape sh = x->shape();
      *x = Tensor<double>(Shape{sh.B, H, sh.T, sh.D});
      const std::size_t n = pool.scales.scales.size();
      for (Index b = 0; b < sh.B; ++b)
        for (Index h = 0; h < H; ++h)
          for (Index t = 0; t < sh.T; ++t) {
            const Index g = h / group;
            if (t >= lengths[std::size_t(b)]) {
              for (Index c = 0; c < sh.D; ++c) (*x)(b, h, t, c) = 0;
              continue;
            }
            const Index page = pk.block_table[std::size_t(b * pk.max_pages + t / pk.page_size)],
                        slot = t % pk.page_size;
            const std::size_t at = scale_index(pool, pk, h, g, page, slot);
            if (at >= n)
              throw ImplementationError(ImplementationError::Kind::crash,
                                        std::string(name) + ": scale " + std::to_string(at) + " of " +
                                            std::to_string(n) + " read (a segfault on a device)");
            const double scale = identity_scales ? 1.0 : pool.scales.scales[at],
                         zp = pool.scales.zero_points.empty() ? 0.0 : pool.scales.zero_points[at];
            const std::uint8_t* row = pool.bytes.data() + pool.row(pk, page, slot, g);
            for (Index c = 0; c < sh.D; ++c) {
              const double y = (quant_value(qk.format, row[c]) - zp) * scale;
              (*x)(b, h, t, c) = std::isfinite(y) ? round_to(p.dtype, y) : y;
            }
          }
    }
    return reference_implementation()->forward(r);
  });
}

std::size_t pool_scale_right(const QuantPool& pool, const PagedKV& pk, Index, Index g, Index page, Index slot) {
  return pool.scale_at(pk, page, slot, g);
}

}  // namespace

std::vector<Mutant> quant_mutants() {
  std::vector<Mutant> z;
  const Decode ok = correct;
  z.push_back(both(
      "mutant:kv-scale-query-head", "per-kv-head scales indexed by the query head",
      [](const Problem&, const Side& s, const Side& other, Index b, Index h, Index g, Index t, Index c) {
        const QuantScales& sc = *s.scales;
        if (sc.granularity == QuantGranularity::tensor) return s.value(b, g, t, c);
        // The flat index of (b, h, t) instead of (b, g, t), into one buffer holding this side's scales and then the
        // other side's (as a caller allocates them together): past this side's end, the other's are read.
        const std::size_t at = std::size_t(((sc.B == 1 ? 0 : b) * sc.H + h) * sc.T + (sc.T == 1 ? 0 : t));
        const QuantScales& os = *other.scales;
        const bool past = at >= sc.scales.size();
        const std::size_t j = past ? (at - sc.scales.size()) % os.scales.size() : at;
        const std::vector<double>& scales = past ? os.scales : sc.scales;
        const std::vector<double>& zps = past ? os.zero_points : sc.zero_points;
        return (quant_value(s.format, s.code(b, g, t, c)) - (zps.empty() ? 0.0 : zps[j])) * scales[j];
      },
      "a per-kv-head (or per-token-head) scale read at the query head's index instead of its kv head's, in a buffer "
      "holding K's scales and then V's: right without grouped queries, and past K's own scales it reads V's",
      {1, 2, 1, 1}, "query head 1 of 2 over one kv head reads the scale after kv head 0's", {"kv-quant-oracle"}));
  z.push_back(Mutant{
      .impl = quant_kernel(
          "mutant:kv-k-scale-twice", "K's scale applied twice",
          [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
            return s.value(b, g, t, c) * s.scales->scale(b, g, t);
          },
          ok),
      .bug = "K's scale applied twice (dequantised in the cache read and again folded into the softmax scale): every "
             "score times the scale again",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key: its LSE is the score",
      .killed_by = {"kv-quant-oracle", "kv-quant-k-scale"}});
  z.push_back(
      Mutant{.impl = quant_kernel("mutant:kv-v-scale-dropped", "V's scale dropped", ok, unscaled),
             .bug = "V's scale never applied (the descale forgotten on the P·V side): the output off by V's scale",
             .minimal_shape = {1, 1, 1, 1},
             .why_minimal = "one query over one key: the output is v",
             .killed_by = {"kv-quant-oracle"}});
  z.push_back(Mutant{
      .impl = quant_kernel("mutant:kv-k-scale-on-v", "V dequantised with K's scale", ok,
                           [](const Problem&, const Side& s, const Side& k, Index b, Index, Index g, Index t, Index c) {
                             return (quant_value(s.format, s.code(b, g, t, c)) - k.scales->zero_point(b, g, t)) *
                                    k.scales->scale(b, g, t);
                           }),
      .bug = "V dequantised with K's scale (and zero point): a copy-paste of the K path",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key: the output is v",
      .killed_by = {"kv-quant-oracle"}});
  z.push_back(both("mutant:kv-e4m3-as-e5m2", "e4m3fn codes decoded as e5m2",
                   [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
                     const QuantFormat f = s.format == QuantFormat::e4m3fn ? QuantFormat::e5m2 : s.format;
                     return (quant_value(f, s.code(b, g, t, c)) - s.scales->zero_point(b, g, t)) *
                            s.scales->scale(b, g, t);
                   },
                   "FP8 e4m3fn codes decoded as e5m2 (the wrong torch.float8 dtype for the view): every value wrong",
                   {1, 1, 1, 1}, "one query over one key: the output is v", {"kv-quant-oracle"}));
  z.push_back(both(
      "mutant:kv-e4m3-with-infinities", "e4m3fn decoded IEEE-style",
      [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
        const std::uint8_t code = s.code(b, g, t, c);
        const double x = s.format == QuantFormat::e4m3fn ? e4m3_as_ieee(code) : quant_value(s.format, code);
        return (x - s.scales->zero_point(b, g, t)) * s.scales->scale(b, g, t);
      },
      "e4m3fn decoded as if it had IEEE infinities (exponent 15 for inf and NaN, e4m3 rather than e4m3fn): codes of "
      "256 to 448, which a cache scaled to its amax writes, become inf or NaN",
      {1, 1, 1, 1}, "one query over one key whose v is 256 or more codes", {"kv-quant-oracle"}));
  z.push_back(
      both("mutant:kv-fp8-subnormals-flushed", "FP8 subnormal codes read as 0",
           [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
             const std::uint8_t code = s.code(b, g, t, c);
             const int man_bits = s.format == QuantFormat::e4m3fn ? 3 : 2;
             const bool sub = s.format != QuantFormat::int8 && ((code & 0x7F) >> man_bits) == 0;
             return sub ? 0.0 : s.value(b, g, t, c);
           },
           "FP8 subnormal codes (exponent field 0) decoded as 0, as a flush-to-zero conversion does: small values of a "
           "cache scaled to a large amax vanish",
           {1, 1, 1, 1}, "one query over one key with a subnormal code in v", {"kv-quant-oracle"}));
  z.push_back(both("mutant:kv-int8-unsigned", "int8 codes read as uint8",
                   [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
                     const std::uint8_t code = s.code(b, g, t, c);
                     const double x = s.format == QuantFormat::int8 ? double(code) : quant_value(s.format, code);
                     return (x - s.scales->zero_point(b, g, t)) * s.scales->scale(b, g, t);
                   },
                   "int8 codes read as unsigned bytes (a uint8 tensor view): every negative value off by 256 steps",
                   {1, 1, 1, 1}, "one query over one key with a negative code in v", {"kv-quant-oracle"}));
  z.push_back(both("mutant:kv-zero-point-ignored", "int8 zero points ignored",
                   [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
                     return quant_value(s.format, s.code(b, g, t, c)) * s.scales->scale(b, g, t);
                   },
                   "an asymmetric int8 cache's zero point ignored (read as symmetric): every value off by z·scale",
                   {1, 1, 1, 1}, "one query over one key with a nonzero zero point", {"kv-quant-oracle"}));
  z.push_back(both(
      "mutant:kv-zero-point-added", "int8 zero points added",
      [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
        return (quant_value(s.format, s.code(b, g, t, c)) + s.scales->zero_point(b, g, t)) * s.scales->scale(b, g, t);
      },
      "an int8 zero point added instead of subtracted (the quantiser's convention x/s + z read back as (q + z)·s)",
      {1, 1, 1, 1}, "one query over one key with a nonzero zero point", {"kv-quant-oracle"}));
  z.push_back(both(
      "mutant:kv-scale-as-divisor", "codes divided by the scale",
      [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
        return (quant_value(s.format, s.code(b, g, t, c)) - s.scales->zero_point(b, g, t)) / s.scales->scale(b, g, t);
      },
      "the scale taken for its reciprocal (a quantisation scale used as the dequantisation descale): codes divided "
      "by it",
      {1, 1, 1, 1}, "one query over one key: the output is v", {"kv-quant-oracle"}));
  z.push_back(both(
      "mutant:kv-token-scales-transposed", "per-token scales read as [B,T_k,H_kv]",
      [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
        const QuantScales& sc = *s.scales;
        double scale = sc.scale(b, g, t), zp = sc.zero_point(b, g, t);
        if (sc.granularity == QuantGranularity::token_head) {  // the flat index of [b][t][g] read as [b][g][t]
          const Index flat = (b * sc.T + t) * sc.H + g;
          scale = sc.scales[std::size_t(flat)];
          if (!sc.zero_points.empty()) zp = sc.zero_points[std::size_t(flat)];
        }
        return (quant_value(s.format, s.code(b, g, t, c)) - zp) * scale;
      },
      "per-token-head scales laid out [B,H_kv,T_k] read as [B,T_k,H_kv] (the strides of a token-major cache): right "
      "for one kv head or one token only",
      {1, 2, 1, 1},
      "two kv heads over two keys (the second one's scales there, even where only key 0 is seen): key 0 "
      "of kv head 1 reads kv head 0's second scale",
      {"kv-quant-oracle"}));
  z.push_back(both(
      "mutant:kv-token-scale-per-tile", "per-token scales read once per tile of 4 keys",
      [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
        const Index at = s.scales->granularity == QuantGranularity::token_head ? t - t % 4 : t;
        return (quant_value(s.format, s.code(b, g, t, c)) - s.scales->zero_point(b, g, at)) * s.scales->scale(b, g, at);
      },
      "a per-token scale loaded once per tile of 4 keys (a paged kernel reading the page's first token's scale): "
      "right for the first key of each tile",
      {1, 1, 1, 1}, "one query over two keys (bottom-right: it sees both): key 1 takes key 0's scale",
      {"kv-quant-oracle"}, {Shape{1, 1, 2, 1}}));
  z.push_back(both(
      "mutant:kv-head0-scale", "every kv head with head 0's scale",
      [](const Problem&, const Side& s, const Side&, Index b, Index, Index g, Index t, Index c) {
        return (quant_value(s.format, s.code(b, g, t, c)) - s.scales->zero_point(b, 0, t)) * s.scales->scale(b, 0, t);
      },
      "per-head descales dropped to one (head 0's for every kv head), as a path written for per-tensor scales does",
      {1, 2, 1, 1}, "two heads over one key each: head 1's v takes head 0's scale", {"kv-quant-oracle"}));
  // ggml's blocks.
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-nibbles-swapped", "a block's low and high nibbles swapped",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        const Index from = nibbles(s.format) ? k0 + (j + 16) % kQuantBlock : k0 + j;
        return q_of(s, b, g, t, from) * s.scales->scale(b, g, t, k0) + s.scales->min(b, g, t, k0);
      },
      "element j of a 4- or 5-bit block read from the high nibble of byte j and element j + 16 from its low one (the "
      "packing of qs read the other way round): the block's two halves trade places",
      {1, 1, 1, 32}, "one block of 32 (D = 32 is the smallest head dimension ggml's blocks have)"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-neighbour-block-scale", "the next block's scale",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        const Index next = (k0 + kQuantBlock) % (s.shape.D);  // the row's next block (the first one after the last)
        return q_of(s, b, g, t, k0 + j) * s.scales->scale(b, g, t, next) + s.scales->min(b, g, t, next);
      },
      "each block's d (and m) read from the block after it in the row (an off-by-one block pointer): right with one "
      "block per row, wrong past D = 32",
      {1, 1, 1, 64}, "two blocks (D = 64): with one, the next block is itself"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-offset-forgotten", "Q4_0 and Q5_0 read unsigned",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        const double bias = s.format == QuantFormat::ggml_q4_0 ? 8 : s.format == QuantFormat::ggml_q5_0 ? 16 : 0;
        return (q_of(s, b, g, t, k0 + j) + bias) * s.scales->scale(b, g, t, k0) + s.scales->min(b, g, t, k0);
      },
      "Q4_0's nibble (Q5_0's five bits) taken as the value without its offset of 8 (16): every value off by 8·d",
      {1, 1, 1, 32}, "one block of 32"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-fifth-bit-lost", "Q5's fifth bit dropped",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        const bool five = s.format == QuantFormat::ggml_q5_0 || s.format == QuantFormat::ggml_q5_1;
        const double n = double(s.code(b, g, t, k0 + j) & (five ? 0x0F : 0xFF)),
                     bias = s.format == QuantFormat::ggml_q5_0 ? 16 : 0;
        return five ? (n - bias) * s.scales->scale(b, g, t, k0) + s.scales->min(b, g, t, k0) : s.value(b, g, t, k0 + j);
      },
      "Q5_0 and Q5_1 read as their nibbles alone (qh, the fifth bits, never read): values past 15 lose 16 steps",
      {1, 1, 1, 32}, "one block of 32"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-fifth-bit-of-low-half", "Q5's high half takes the low half's fifth bits",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        const bool five = s.format == QuantFormat::ggml_q5_0 || s.format == QuantFormat::ggml_q5_1;
        if (!five || j < 16) return s.value(b, g, t, k0 + j);
        const int n = (s.code(b, g, t, k0 + j) & 0x0F) | (s.code(b, g, t, k0 + j - 16) & 0x10);  // qh >> (j - 16)
        return (double(n) - (s.format == QuantFormat::ggml_q5_0 ? 16 : 0)) * s.scales->scale(b, g, t, k0) +
               s.scales->min(b, g, t, k0);
      },
      "the fifth bit of element j + 16 read as bit j of qh, the one element j has (qh >> j for both halves): the high "
      "half's values past 15 wrong",
      {1, 1, 1, 32}, "one block of 32"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-min-ignored", "Q4_1 and Q5_1's minimum dropped",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        return q_of(s, b, g, t, k0 + j) * s.scales->scale(b, g, t, k0);
      },
      "Q4_1's and Q5_1's m never added (the block read as Q4_0's layout without the offset): every value off by m",
      {1, 1, 1, 32}, "one block of 32"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-scale-as-bf16", "a block's d read as bfloat16",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        const auto as_bf16 = [](double x) {
          return double(
              Eigen::numext::bit_cast<Eigen::bfloat16>(Eigen::numext::bit_cast<std::uint16_t>(Eigen::half(float(x)))));
        };
        return q_of(s, b, g, t, k0 + j) * as_bf16(s.scales->scale(b, g, t, k0)) + as_bf16(s.scales->min(b, g, t, k0));
      },
      "the blocks' float16 d and m read as bfloat16 (ggml_half taken for ggml_bf16): scales off by orders of "
      "magnitude",
      {1, 1, 1, 32}, "one block of 32"));
  z.push_back(ggml_mutant(
      "mutant:kv-ggml-scale-sign-dropped", "|d| for a block's d",
      [](const Side& s, Index b, Index g, Index t, Index k0, Index j) {
        return q_of(s, b, g, t, k0 + j) * std::abs(s.scales->scale(b, g, t, k0)) + s.scales->min(b, g, t, k0);
      },
      "a block's d taken as its magnitude (a kernel that assumes scales are positive): ggml's Q4_0 and Q5_0 writers "
      "give d the sign opposite to the block's largest value, so most blocks flip",
      {1, 1, 1, 32}, "one block of 32"));
  // Kernels right on one path and reading the codes unscaled on another: `unscaled_when` says which calls.
  const auto path_switch = [](const char* name, const char* description, bool (*unscaled_when)(const Problem&)) {
    const ImplementationPtr right = quant_kernel(name, description, correct, correct),
                            wrong = quant_kernel(name, description, unscaled, unscaled);
    return make_implementation(name, description, quant_capabilities(),
                               [=](const Problem& p) { return (unscaled_when(p) ? wrong : right)->forward(p); });
  };
  z.push_back(Mutant{
      .impl = path_switch("mutant:kv-scales-decode-only", "scales applied on the decode path only",
                          [](const Problem& p) { return p.q.shape().T != 1; }),
      .bug = "the scales applied on the decode path (one query) only: a prefill over a quantised cache reads the codes "
             "unscaled",
      .minimal_shape = {1, 1, 2, 1},
      .why_minimal = "two queries over one key: one query is the decode path",
      .killed_by = {"kv-quant-oracle"}});
  z.push_back(Mutant{
      .impl = path_switch("mutant:kv-ragged-identity-scales", "scales assumed 1 on the ragged path",
                          [](const Problem& p) { return !p.key_lengths.empty(); }),
      .bug = "identity scales assumed on the ragged (padded) path, as FlashInfer's ragged wrapper ignored k and v "
             "scales: a batch with key lengths reads the codes unscaled",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key with key lengths given",
      .killed_by = {"kv-quant-oracle"}});
  {
    Capabilities caps = quant_capabilities();
    caps.features.add(Feature::q_quant);
    caps.features.add({Feature::kv_ggml_q8_0, Feature::kv_ggml_q4_0, Feature::kv_ggml_q4_1, Feature::kv_ggml_q5_0,
                       Feature::kv_ggml_q5_1, Feature::paged, Feature::paged_quant});
    caps.page_sizes = {1, 8, 16, 64, 256};
    caps.page_layouts = 3;
    z.push_back(Mutant{
        .impl = make_implementation("control:kv-quant-folded",
                                    "correct; codes kept, K's scale in the scores, V's on the products", caps,
                                    [](const Problem& p) { return folded_forward(p, QDot::exact); }),
        .bug = "control: the codes kept as they are (decoded from a table of their bits), K's scale multiplied into "
               "each score with the softmax scale (ggml's blocks: d·Σq·n + m·Σq per block, as ggml's dot does) and "
               "V's into each weight·value product, in float: another order of "
               "the same dequantisation, which tolerance.cpp's step 12 bounds",
        .control = true,
        .minimal_shape = {},
        .why_minimal = "a control: no case should fail",
        .killed_by = {},
    });
  }
  // A quantised Q (FlashAttention 3's FP8 Q with its q descale), decoded wrong.
  z.push_back(Mutant{
      .impl = q_kernel("mutant:q-descale-dropped", "Q's codes read without their descale",
                       [](double x, const QuantScales&, const QuantScales&, Index, Index, Index, Index) { return x; }),
      .bug = "an FP8-Q fast path without its descale: Q's codes are read as values, every score off by Q's scale",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key: its LSE is its score",
      .killed_by = {"kv-quant-oracle"}});
  z.push_back(Mutant{.impl = q_kernel("mutant:q-descale-twice", "Q's descale applied twice",
                                      [](double x, const QuantScales& qs, const QuantScales&, Index b, Index h, Index,
                                         Index i) { return x * qs.scale(b, h, i) * qs.scale(b, h, i); }),
                     .bug = "Q's descale applied in the dequantisation and again folded into the softmax scale",
                     .minimal_shape = {1, 1, 1, 1},
                     .why_minimal = "one query over one key: its LSE is its score",
                     .killed_by = {"kv-quant-oracle"}});
  z.push_back(Mutant{
      .impl = q_kernel("mutant:q-descale-per-kv-head", "Q's per-head descale read at its kv head",
                       [](double x, const QuantScales& qs, const QuantScales&, Index b, Index, Index g, Index i) {
                         return x * qs.scale(b, g, i);
                       }),
      .bug = "Q's per-head descale indexed by the kv head (FlashAttention 3's q_descale is [B, H_kv]), where the "
             "caller's scales are per query head: every head of a group takes its first head's",
      .minimal_shape = {1, 2, 1, 1},
      .why_minimal = "two query heads sharing one kv head, Q scaled per head, one key",
      .killed_by = {"kv-quant-oracle"}});
  z.push_back(Mutant{.impl = q_kernel("mutant:q-descale-from-k", "Q decoded with K's descale",
                                      [](double x, const QuantScales&, const QuantScales& ks, Index b, Index, Index g,
                                         Index i) { return x * ks.scale(b, g, std::min<Index>(i, ks.T - 1)); }),
                     .bug = "the q and k descales swapped: Q's codes scaled by K's scale (K's by its own here)",
                     .minimal_shape = {1, 1, 1, 1},
                     .why_minimal = "one query over one key: its LSE is its score",
                     .killed_by = {"kv-quant-oracle"}});
  // P cast to FP8 e4m3 for P·V, declared (Feature::p_fp8; FlashAttention 3's FP8 forward).
  Capabilities p8 = quant_capabilities();
  p8.features.add({Feature::p_fp8, Feature::q_quant});
  z.push_back(Mutant{
      .impl = make_implementation("control:kv-quant-p-fp8", "correct; P cast to FP8 e4m3 for P·V, declared", p8,
                                  [](const Problem& p) { return folded_forward(p, QDot::exact, PFp8::e4m3); }),
      .bug = "control: the quantised control with P = exp(s - m) scaled by 448, cast to FP8 e4m3 and descaled before "
             "its product with V (the row sum from P in float), declared (ATTNCHECK_CAP4_P_FP8): exact bounds would "
             "call it wrong, tolerance.cpp's step 12c holds it",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {}});
  z.push_back(Mutant{
      .impl = make_implementation(
          "mutant:kv-p-fp8-descale-dropped", "P's FP8 scale of 448 never divided out", p8,
          [](const Problem& p) { return folded_forward(p, QDot::exact, PFp8::e4m3_descale_dropped); }),
      .bug = "P scaled by 448 into FP8 e4m3's range for P·V and the descale forgotten: every output 448 times too "
             "large, which the declared FP8 rounding does not excuse",
      .minimal_shape = {1, 1, 1, 1},
      .why_minimal = "one query over one key: the output is V's row times 448",
      .killed_by = {"kv-quant-oracle"}});
  // ggml's own compute precision, declared (Feature::q_dot_ggml_q8): q rounded to Q8_0 (Q8_1) blocks for the dot.
  Capabilities q8 = ggml_capabilities();
  q8.features.add(Feature::q_dot_ggml_q8);
  const auto q8_kernel = [&q8](const char* name, const char* description, QDot how) {
    return make_implementation(name, description, q8, [how](const Problem& p) { return folded_forward(p, how); });
  };
  z.push_back(Mutant{
      .impl = q8_kernel("control:kv-quant-ggml-q8", "correct; q rounded to ggml's Q8_0/Q8_1 blocks, declared",
                        QDot::ggml_q8),
      .bug =
          "control: ggml's CPU dot with a block-quantised K, each row of q rounded to Q8_0 blocks (Q8_1 and its sum, "
          "kept in float where ggml's float16 overflows, for Q4_1 and Q5_1) with d = amax/127 stored as float16, "
          "declared "
          "(ATTNCHECK_CAP4_Q_DOT_GGML_Q8): exact bounds would call it wrong by far, tolerance.cpp's step 12b holds it",
      .control = true,
      .minimal_shape = {},
      .why_minimal = "a control: no case should fail",
      .killed_by = {}});
  z.push_back(
      Mutant{.impl = q8_kernel("mutant:kv-ggml-q8-sum-without-d", "Q8_1's sum kept without its d", QDot::sum_without_d),
             .bug = "Q8_1's s written as the codes' sum without its d: the m·s term of a Q4_1 or Q5_1 dot is off by "
                    "m·Σcode·(1 - d), which the declared Q8 rounding does not excuse",
             .minimal_shape = {1, 1, 1, 32},
             .why_minimal = "one query over one key (its LSE is its score) with D = 32, one block",
             .killed_by = {"kv-quant-oracle"}});
  z.push_back(Mutant{
      .impl = q8_kernel("mutant:kv-ggml-q8-next-block-d", "q's codes scaled by the next block's d", QDot::next_block_d),
      .bug = "each block of q's codes scaled by the next block's d (wrapping at the end): with one block of 32 it is "
             "its own, past D = 32 the dot takes a neighbour's scale",
      .minimal_shape = {1, 1, 1, 64},
      .why_minimal = "one query over one key (its LSE is its score) with D = 64, two blocks of q (or three, D = 96, "
                     "where the values a two-block row shrinks to give both blocks the same d, and the swap no effect)",
      .killed_by = {"kv-quant-oracle"},
      .also_minimal = {{1, 1, 1, 96}}});
  // Paged quantised pools (Feature::paged_quant): the scales that live with each key's page and slot, read wrongly.
  const auto paged_mutant = [](const char* name, const char* description, PoolScaleIndex at, bool identity,
                               const char* bug, Shape minimal, const char* why, std::vector<Shape> also = {}) {
    return Mutant{.impl = paged_quant_kernel(name, description, at, identity),
                  .bug = bug,
                  .minimal_shape = minimal,
                  .why_minimal = why,
                  .killed_by = {"kv-quant-oracle"},
                  .also_minimal = std::move(also)};
  };
  z.push_back(paged_mutant(
      "mutant:kv-paged-scale-page-first-token", "a per-token scale read at its page's first slot",
      [](const QuantPool& pool, const PagedKV& pk, Index, Index g, Index page, Index slot) {
        return pool.scales.granularity == QuantGranularity::token_head ? pool.scale_at(pk, page, 0, g)
                                                                       : pool.scale_at(pk, page, slot, g);
      },
      false,
      "a paged kernel loading one per-token scale per page (its first token's), as if the scales were per page: "
      "right for pages of one key",
      {1, 1, 1, 1}, "one query over two keys in one page (bottom-right: it sees both): key 1 takes key 0's scale",
      {Shape{1, 1, 2, 1}}));
  z.push_back(paged_mutant(
      "mutant:kv-paged-scale-query-head", "the paged scales read at the query head, not its kv head",
      [](const QuantPool& pool, const PagedKV& pk, Index h, Index, Index page, Index slot) {
        // The offset as its author wrote it, with the query head where the kv head belongs.
        const QuantScales& s = pool.scales;
        const bool tm = pk.layout == PageLayout::token_major;
        const Index H_kv = tm ? pool.shape.T : pool.shape.H;
        switch (s.granularity) {
          case QuantGranularity::kv_head:
            return std::size_t(h);
          case QuantGranularity::token_head:
            return std::size_t(tm ? (page * pk.page_size + slot) * H_kv + h : (page * H_kv + h) * pk.page_size + slot);
          default:
            return std::size_t(0);
        }
      },
      false,
      "the paged path's per-head and per-token scales indexed with the query head (a multi-head kernel's offset "
      "reused under grouped-query heads): right without grouping",
      {1, 2, 1, 1},
      "two query heads over one kv head and one key: head 1 reads past its kv head's scales (another slot's, a free "
      "one's, or past the end)"));
  z.push_back(paged_mutant(
      "mutant:kv-paged-scales-ignored", "the k and v scales ignored on the paged path", pool_scale_right, true,
      "the paged path never applies the k and v scales (FlashInfer's ragged and paged wrappers ignoring k_scale and "
      "v_scale: an output several times too large), the dense path does",
      {1, 1, 1, 1}, "one query over one key, paged: the output is v's code, not v"));
  return z;
}

}  // namespace attncheck::zoo
