// The exec: protocol's frames (harness/PROTOCOL.md is the specification): the reader and writer, a frame's header,
// the codes of dtypes and alignments, and the handshake (hello, caps, refuse). A call and its answer are
// call_codec.cpp's.
#include "protocol.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>

namespace attncheck::wire {

std::string Reader::str() {
  const std::uint32_t n = u32();
  return std::string(raw(n));
}

std::string_view Reader::raw(std::size_t n) {
  if (n > left())
    throw ProtocolError(what_ + ": needs " + std::to_string(n) + " more bytes at offset " + std::to_string(pos_) +
                        " but only " + std::to_string(left()) + " are left");
  const auto s = p_.substr(pos_, n);
  pos_ += n;
  return s;
}

std::string frame(FrameType type, std::string_view payload) {
  Writer w;
  w.raw(kMagic.data(), kMagic.size());
  w.u32(static_cast<std::uint32_t>(type));
  w.u64(payload.size());
  w.raw(payload.data(), payload.size());
  return std::move(w.bytes());
}

namespace {
std::string printable(std::string_view bytes) {
  std::string s;
  for (const unsigned char c : bytes) s += std::isprint(c) ? char(c) : '.';
  return s;
}
}  // namespace

std::pair<FrameType, std::uint64_t> parse_header(std::string_view header) {
  if (header.size() != kHeaderSize || header.substr(0, 4) != std::string_view(kMagic.data(), 4))
    throw ProtocolError("expected a frame starting with \"ATNC\" but got \"" + printable(header) +
                        "\" (does the program print to stdout? its stdout belongs to the protocol)");
  Reader r(header.substr(4), "frame header");
  const std::uint32_t type = r.u32();
  const std::uint64_t length = r.u64();
  if (type < 1 || type > 8) throw ProtocolError("unknown frame type " + std::to_string(type));
  return {FrameType(type), length};
}

std::string_view frame_type_name(FrameType t) {
  switch (t) {
    case FrameType::hello:
      return "hello";
    case FrameType::caps:
      return "caps";
    case FrameType::refuse:
      return "refuse";
    case FrameType::forward:
      return "forward";
    case FrameType::result:
      return "result";
    case FrameType::bye:
      return "bye";
    case FrameType::backward:
      return "backward";
    case FrameType::gradients:
      return "gradients";
  }
  return "?";
}

std::uint32_t dtype_code(DType t) {
  switch (t) {
    case DType::f32:
      return 1;
    case DType::f64:
      return 2;
    case DType::f16:
      return 4;
    case DType::bf16:
      return 8;
  }
  return 0;
}

DType dtype_from_code(std::uint32_t code) {
  switch (code) {
    case 1:
      return DType::f32;
    case 2:
      return DType::f64;
    case 4:
      return DType::f16;
    case 8:
      return DType::bf16;
  }
  throw ProtocolError("unknown dtype code " + std::to_string(code) + " (expected 1, 2, 4 or 8)");
}

std::uint32_t alignment_code(CausalAlignment a) { return a == CausalAlignment::BottomRight ? 2 : 1; }

CausalAlignment alignment_from_code(std::uint32_t code) {
  if (code == 1) return CausalAlignment::TopLeft;
  if (code == 2) return CausalAlignment::BottomRight;
  throw ProtocolError("unknown alignment code " + std::to_string(code) + " (expected 1 or 2)");
}

std::size_t element_size(DType t) {
  switch (t) {
    case DType::f64:
      return 8;
    case DType::f32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
  }
  return 4;
}

void set_abi3_bools(Capabilities& caps, std::uint32_t flags3) {
  for (const FeatureRow& f : kFeatures)
    if (f.flags3)
      caps.features.set(f.id,
                        (flags3 & f.flags3) && (!f.requires_feature || (flags3 & feature(*f.requires_feature).flags3)));
}

std::uint32_t abi3_bits(const Capabilities& caps) {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures)
    if (caps.declares(f.id)) bits |= f.flags3;
  return bits;
}

void set_flags2_bools(Capabilities& caps, std::uint32_t flags2) {
  for (const FeatureRow& f : kFeatures)
    if (f.flags2) caps.features.set(f.id, flags2 & f.flags2);
}

std::uint32_t flags2_bits(const Capabilities& caps) {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures)
    if (caps.declares(f.id)) bits |= f.flags2;
  return bits;
}

// (After the older words: a row that requires one of theirs, paged_quant paged, reads it from caps.)
void set_flags4_bools(Capabilities& caps, std::uint32_t flags4, std::uint32_t flags4b) {
  const auto bit = [&](const FeatureRow& f) { return (flags4 & f.flags4) != 0 || (flags4b & f.flags4b) != 0; };
  const auto has = [&](Feature r) {
    return feature(r).flags4 || feature(r).flags4b ? bit(feature(r)) : caps.declares(r);
  };
  for (const FeatureRow& f : kFeatures)
    if (f.flags4 || f.flags4b) caps.features.set(f.id, bit(f) && (!f.requires_feature || has(*f.requires_feature)));
}

std::uint32_t flags4_bits(const Capabilities& caps) {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures)
    if (caps.declares(f.id)) bits |= f.flags4;
  return bits;
}

std::uint32_t flags4b_bits(const Capabilities& caps) {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures)
    if (caps.declares(f.id)) bits |= f.flags4b;
  return bits;
}

std::string encode_hello() {
  Writer w;
  // Version 1 first: a version-1 client stops unless this field is 1. The newest version follows.
  w.u32(kOldestProtocolVersion);
  w.u32(kProtocolVersion);
  return frame(FrameType::hello, w.bytes());
}

std::uint32_t decode_hello(std::string_view payload) {
  Reader r(payload, "hello frame");
  const std::uint32_t first = r.u32();
  // A version-1 attncheck sends only the first field.
  return r.left() >= 4 ? r.u32() : first;
}

std::string encode_caps(const Handshake& h) {
  Writer w;
  w.u32(h.version);
  std::uint32_t dtypes = 0, alignments = 0;
  for (const auto t : h.caps.dtypes) dtypes |= dtype_code(t);
  for (const auto a : h.caps.alignments) alignments |= alignment_code(a);
  w.u32(dtypes);
  w.u32(alignments);
  w.u32((h.caps.returns_weights ? caps_returns_weights : 0u) | (h.caps.custom_scale ? caps_custom_scale : 0u) |
        (h.caps.cross_lengths ? caps_cross_lengths : 0u) | (h.caps.nonfinite_safe ? caps_nonfinite_safe : 0u));
  w.i64(h.caps.max_T);
  w.str(h.name);
  w.str(h.description);
  if (h.version >= 2) {
    w.u32(flags2_bits(h.caps));
    const std::optional<EmptyRows> e = h.caps.empty_rows;
    // A version-2 peer knows no "any": to it such rows are unspecified (either convention accepted).
    w.u32(!e ? 0u : *e == EmptyRows::zero ? 1u : *e == EmptyRows::nan ? 2u : h.version >= 3 ? 3u : 0u);
  }
  if (h.version >= 3) {
    // The bools win over abi3_flags for the bits they stand for: an implementation built in C++ sets only them.
    w.u32((h.caps.abi3_flags & ~kFeatureFlags3) | abi3_bits(h.caps));
    w.u32(!h.caps.cross_lengths || (h.caps.q_shorter && h.caps.q_longer) ? 0u
                                                                          : (h.caps.q_shorter ? regime_q_shorter : 0u) |
                                                                                (h.caps.q_longer ? regime_q_longer : 0u));
    w.i64(h.caps.head_dim_multiple);
    w.i64(h.caps.max_head_dim);
    w.u32(std::uint32_t(h.caps.head_dims.size() + h.caps.head_dim_pairs.size()));
    for (const Index d : h.caps.head_dims) {
      w.i64(d);
      w.i64(0);
    }
    for (const auto& [k, v] : h.caps.head_dim_pairs) {
      w.i64(k);
      w.i64(v);
    }
    w.u32(h.caps.page_layouts);
    w.u32(std::uint32_t(h.caps.page_sizes.size()));
    for (const Index s : h.caps.page_sizes) w.i64(s);
  }
  if (h.version >= 4) {
    w.u32(flags4_bits(h.caps));
    w.u32(flags4b_bits(h.caps));
  }
  return frame(FrameType::caps, w.bytes());
}

Handshake decode_caps(std::string_view payload) {
  Reader r(payload, "caps frame");
  Handshake h;
  h.version = r.u32();
  if (h.version < kOldestProtocolVersion || h.version > kProtocolVersion) return h;  // the caller names both
  const std::uint32_t dtypes = r.u32(), alignments = r.u32(), flags = r.u32();
  const std::int64_t max_T = r.i64();
  h.name = r.str();
  h.description = r.str();
  if (dtypes == 0 || (dtypes & ~0xFu))
    throw ProtocolError("caps frame: dtypes bits are " + std::to_string(dtypes) +
                        " (expected a non-empty combination of 1=f32, 2=f64, 4=f16, 8=bf16)");
  if (alignments & ~0x3u)
    throw ProtocolError("caps frame: alignment bits are " + std::to_string(alignments) +
                        " (expected a combination of 1=top-left, 2=bottom-right)");
  h.caps.dtypes.clear();
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    if (dtypes & dtype_code(t)) h.caps.dtypes.push_back(t);
  h.caps.alignments.clear();
  if (alignments & alignment_code(CausalAlignment::TopLeft) || alignments == 0)
    h.caps.alignments.push_back(CausalAlignment::TopLeft);
  if (alignments & alignment_code(CausalAlignment::BottomRight)) h.caps.alignments.push_back(CausalAlignment::BottomRight);
  h.caps.returns_weights = flags & caps_returns_weights;
  h.caps.custom_scale = flags & caps_custom_scale;
  h.caps.cross_lengths = flags & caps_cross_lengths;
  h.caps.nonfinite_safe = flags & caps_nonfinite_safe;
  if (max_T < 0) throw ProtocolError("caps frame: max_T is " + std::to_string(max_T) + " (expected >= 0)");
  if (max_T > 0) h.caps.max_T = max_T;
  if (h.version >= 2) {
    const std::uint32_t flags2 = r.u32(), empty_rows = r.u32();
    if (flags2 & ~kFeatureFlags2)
      throw ProtocolError("caps frame: flags2 bits are " + std::to_string(flags2) +
                          " (expected a combination of 1=gqa, 2=key lengths, 4=window, 8=backward)");
    if (empty_rows > (h.version >= 3 ? 3u : 2u))
      throw ProtocolError("caps frame: empty_rows is " + std::to_string(empty_rows) +
                          (h.version >= 3 ? " (expected 0 unspecified, 1 zero, 2 nan or 3 any)"
                                          : " (expected 0 unspecified, 1 zero or 2 nan; 3 any needs version 3)"));
    set_flags2_bools(h.caps, flags2);
    if (empty_rows != 0)
      h.caps.empty_rows = empty_rows == 1 ? EmptyRows::zero : empty_rows == 2 ? EmptyRows::nan : EmptyRows::any;
  }
  if (h.version >= 3) {
    constexpr std::int64_t kMaxExtent = std::int64_t{1} << 16, kMaxSeqLen = std::int64_t{1} << 20;
    constexpr std::uint32_t kMaxList = 4096;
    h.caps.abi3_flags = r.u32();
    const std::uint32_t regimes = r.u32();
    const std::int64_t multiple = r.i64(), max_D = r.i64();
    if (h.caps.abi3_flags & ~0x3FFFFu)
      throw ProtocolError("caps frame: flags3 bits are " + std::to_string(h.caps.abi3_flags) +
                          " (expected ATTNCHECK_CAP3_* bits, within 0x3ffff)");
    if ((h.caps.abi3_flags & feature(Feature::query_documents).flags3) &&
        !(h.caps.abi3_flags & feature(Feature::documents).flags3))
      throw ProtocolError("caps frame: flags3 declare query documents (0x20000) without documents (0x20): query "
                          "document ids come only with key document ids");
    set_abi3_bools(h.caps, h.caps.abi3_flags);
    if (regimes > 3)
      throw ProtocolError("caps frame: cross-length regimes are " + std::to_string(regimes) +
                          " (expected 0 both, or 1 T_q < T_k and/or 2 T_q > T_k)");
    if (regimes != 0) {
      h.caps.q_shorter = regimes & regime_q_shorter;
      h.caps.q_longer = regimes & regime_q_longer;
    }
    if (multiple < 0 || multiple > kMaxExtent)
      throw ProtocolError("caps frame: head-dim multiple is " + std::to_string(multiple) + " (expected 0 or 1 for "
                          "any, or in [2, " + std::to_string(kMaxExtent) + "])");
    if (max_D < 0)
      throw ProtocolError("caps frame: max head dim is " + std::to_string(max_D) + " (expected >= 0, 0 no limit)");
    h.caps.head_dim_multiple = std::max<std::int64_t>(multiple, 1);
    h.caps.max_head_dim = max_D;
    const std::uint32_t n_dims = r.u32();
    if (n_dims > kMaxList)
      throw ProtocolError("caps frame: " + std::to_string(n_dims) + " head dims (expected at most 4096)");
    for (std::uint32_t n = 0; n < n_dims; ++n) {
      const std::int64_t k = r.i64(), v = r.i64();
      if (k < 1 || k > kMaxExtent || v < 0 || v > kMaxExtent)
        throw ProtocolError("caps frame: head dim " + std::to_string(n) + " is (" + std::to_string(k) + ", " +
                            std::to_string(v) + ") (expected D_k in [1, 65536], D_v 0 for the same or in that range)");
      if (v == 0 || v == k)
        h.caps.head_dims.push_back(k);
      else
        h.caps.head_dim_pairs.emplace_back(k, v);
    }
    h.caps.page_layouts = r.u32();
    if (h.caps.page_layouts > 3)
      throw ProtocolError("caps frame: page layouts are " + std::to_string(h.caps.page_layouts) +
                          " (expected 1 token-major and/or 2 head-major)");
    const std::uint32_t n_pages = r.u32();
    if (n_pages > kMaxList)
      throw ProtocolError("caps frame: " + std::to_string(n_pages) + " page sizes (expected at most 4096)");
    for (std::uint32_t n = 0; n < n_pages; ++n) {
      const std::int64_t s = r.i64();
      if (s < 1 || s > kMaxSeqLen)
        throw ProtocolError("caps frame: page size " + std::to_string(s) + " (expected in [1, 2^20])");
      h.caps.page_sizes.push_back(s);
    }
    if (h.caps.declares(Feature::paged) && (h.caps.page_layouts == 0 || h.caps.page_sizes.empty()))
      throw ProtocolError("caps frame: flags3 declare paged K and V (0x10) but page layouts are " +
                          std::to_string(h.caps.page_layouts) + " and " + std::to_string(n_pages) +
                          " page sizes came (expected at least one layout, 1 token-major and/or 2 head-major, and "
                          "at least one page size)");
  }
  if (h.version >= 4) {
    const std::uint32_t flags4 = r.u32();
    if (flags4 & ~kFeatureFlags4)
      throw ProtocolError("caps frame: flags4 bits are " + std::to_string(flags4) + " (expected ATTNCHECK_CAP4_* bits" +
                          (kFeatureFlags4 ? ", within " + std::to_string(kFeatureFlags4) : std::string(": none yet")) +
                          ")");
    // flags4b: a version-4 child built before it ends the frame at flags4, declaring none of its bits.
    const std::uint32_t flags4b = r.left() >= 4 ? r.u32() : 0;
    if (flags4b & ~kFeatureFlags4b)
      throw ProtocolError("caps frame: flags4b bits are " + std::to_string(flags4b) +
                          " (expected ATTNCHECK_CAP4B_* bits, within " + std::to_string(kFeatureFlags4b) + ")");
    set_flags4_bools(h.caps, flags4, flags4b);
  }
  return h;
}

std::string encode_refuse(std::string_view message) {
  Writer w;
  w.str(message);
  return frame(FrameType::refuse, w.bytes());
}

}  // namespace attncheck::wire
