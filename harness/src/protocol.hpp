// The exec: wire protocol (harness/PROTOCOL.md): little-endian frames, the handshake, and the encoding of a
// Problem and of its result. Shared by the subprocess client and the plug-in host, so there is one protocol.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "attncheck/features.hpp"
#include "attncheck/implementation.hpp"

namespace attncheck::wire {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and this code copies arrays as they lie in memory");

/// The newest protocol version this build speaks (PROTOCOL.md, "Versions"); it also speaks every version from
/// kOldestProtocolVersion on, and the two sides use the lower of their two newest versions.
inline constexpr std::uint32_t kProtocolVersion = 4;
inline constexpr std::uint32_t kOldestProtocolVersion = 1;
/// Every frame starts with these four bytes, so a child that prints text is caught at once.
inline constexpr std::array<char, 4> kMagic{'A', 'T', 'N', 'C'};
/// magic, type (u32), payload length (u64).
inline constexpr std::size_t kHeaderSize = 16;

enum class FrameType : std::uint32_t {
  hello = 1,
  caps = 2,
  refuse = 3,
  forward = 4,
  result = 5,
  bye = 6,
  backward = 7,   ///< version 2: a forward call's inputs and options, then dO
  gradients = 8,  ///< version 2: the answer to a backward frame: dQ, dK, dV
};

/// The caps frame's declaration bits: version 2's extension (`flags2`) and version 3's `flags3` (the
/// ATTNCHECK_CAP3_* values) are the feature table's (attncheck/features.hpp); kFeatureFlags3 is every flags3 bit
/// that stands for a Capabilities bool. Other flags3 bits (ATTNCHECK_CAP3_DETERMINISTIC) are carried as declared.
inline constexpr std::uint32_t kFeatureFlags3 = [] {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures) bits |= f.flags3;
  return bits;
}();
inline constexpr std::uint32_t kFeatureFlags2 = [] {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures) bits |= f.flags2;
  return bits;
}();
/// Version 4's flags4 (the ATTNCHECK_CAP4_* values): every bit the feature table defines; any other is refused.
inline constexpr std::uint32_t kFeatureFlags4 = [] {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures) bits |= f.flags4;
  return bits;
}();
/// Version 4's second word, flags4b (the ATTNCHECK_CAP4B_* values), the same way.
inline constexpr std::uint32_t kFeatureFlags4b = [] {
  std::uint32_t bits = 0;
  for (const FeatureRow& f : kFeatures) bits |= f.flags4b;
  return bits;
}();

/// The caps frame's flags (every version): what the client's calls return and accept beyond the features.
enum CapsFlags : std::uint32_t {
  caps_returns_weights = 1,
  caps_custom_scale = 2,
  caps_cross_lengths = 4,
  caps_nonfinite_safe = 8,
};
/// The caps frame's cross-length regimes (version 3; 0: both).
enum CrossRegimes : std::uint32_t { regime_q_shorter = 1, regime_q_longer = 2 };
/// A result frame's flags, and a gradients frame's.
enum ResultFlags : std::uint32_t { result_weights = 1, result_lse = 2 };
enum GradientsFlags : std::uint32_t { gradients_d_sinks = 1, gradients_d_bias = 2 };

/// The bits of a forward (and backward) frame's flags field; PROTOCOL.md, "forward".
enum CallFlags : std::uint32_t {
  call_scale = 1,
  call_weights = 2,
  call_key_lengths = 4,    ///< version 2
  call_window = 8,         ///< version 2
  call_softcap = 16,       ///< version 3: an f64 softcap follows
  call_alibi = 32,         ///< version 3: H f64 ALiBi slopes follow
  call_sinks = 64,         ///< version 3: H f64 sink logits follow
  call_lse = 128,          ///< version 3: the LSE is wanted
  call_not_causal = 256,   ///< version 3: no causal rule
  call_paged = 512,        ///< version 3: the paging follows, and K and V come as page pools (with call_key_lengths)
  call_prefix = 1024,      ///< version 3: an i64 prefix length follows
  call_window_right = 2048,  ///< version 3: an i64 right window follows
  call_chunk = 4096,       ///< version 3: an i64 chunk size follows
  call_documents = 8192,   ///< version 3: B*T_q i32 query document ids, then B*T_k i32 key document ids follow
  call_block_mask = 16384,  ///< version 3: a block mask follows (its blocks, kinds and partial cells)
  call_dense_mask = 32768,  ///< version 3: a dense mask follows (its B and H, then its cells)
  call_layout = 65536,      ///< version 3: the u32 after the flags is the inputs' layout (InputLayout, 1-5)
  call_v_head_dim = 131072,  ///< version 3: an i64 D_v follows k's shape; v is [B,H_kv,T_k,D_v] (never with paging)
  call_bias = 262144,        ///< version 4: an additive bias follows the masks (its B and H, then its values)
  call_temperature = 524288,  ///< version 4: a per-query temperature follows the bias (its B and H, then f64 values)
  call_rope = 1048576,        ///< version 4: a rope follows the temperature (its fields, then q's and k's positions)
  call_qk_norm = 2097152,     ///< version 4: a QK-norm follows the rope (its fields, then q's and k's weights)
  call_dropout = 4194304,     ///< version 4: dropout follows the QK-norm (f64 p, u64 seed, u64 offset)
  /// version 4: a quantised K and V cache follows the dropout (its format and each side's scales), and K's and V's
  /// codes replace their values after q (PROTOCOL.md, "Quantised K and V")
  call_quant = 8388608,
  /// version 4, with call_quant: Q quantised too; its scales follow V's and its codes replace q's values
  call_quant_q = 16777216,
  /// version 4: an index list of selected keys follows the dropout (its block size, heads and width, then the
  /// entries; PROTOCOL.md, "Selected keys")
  call_index_list = 33554432,
  /// version 4: a tree of draft tokens follows the index list (its form and bit order, then its parents or its
  /// offsets and bits; PROTOCOL.md, "Trees of draft tokens")
  call_tree = 67108864,
};
/// Every call flag.
inline constexpr std::uint32_t kCallFlags = 0x7FFFFFFu;

/// The document ids of a problem with documents (p.doc_bounds): k[b*T_k + j] = document_of(doc_bounds[b], j) and
/// q[b*T_q + i] = p.visibility(b).query_document(i), what the C ABI's k_doc_ids and q_doc_ids and a frame with
/// call_documents carry. Throws std::logic_error when an id does not fit an int32.
struct DocIds {
  std::vector<std::int32_t> q, k;
};
DocIds doc_ids(const Problem& p);
/// The doc_bounds that k ids [B*T_k] (row-major) stand for: a bound at j for each step of the id from j-1 to j
/// (a step of n+1 is n empty documents), and k[b*T_k] bounds at 0. Throws ProtocolError (naming `what`, the
/// entry, what was expected and what came) for a negative id, one below the id before it, or one above T_k.
std::vector<std::vector<Index>> doc_bounds_from_ids(const std::vector<std::int32_t>& k, Index B, Index T_k,
                                                    const std::string& what);

/// The Capabilities bools of version 3's flags3 bits (the C ABI's ATTNCHECK_CAP3_* too), and back: every row of
/// the feature table with a flags3 bit (a row that requires another is declared only with it).
void set_abi3_bools(Capabilities& caps, std::uint32_t flags3);
std::uint32_t abi3_bits(const Capabilities& caps);
/// The same for version 2's flags2 bits (GQA, key lengths, window, backward).
void set_flags2_bools(Capabilities& caps, std::uint32_t flags2);
std::uint32_t flags2_bits(const Capabilities& caps);
/// The same for version 4's flags4 and flags4b bits (ABI 4's ATTNCHECK_CAP4_* and ATTNCHECK_CAP4B_*), after the older
/// words (a row may require one of theirs); flags4b 0 where the table or the frame does not reach it.
void set_flags4_bools(Capabilities& caps, std::uint32_t flags4, std::uint32_t flags4b);
std::uint32_t flags4_bits(const Capabilities& caps);
std::uint32_t flags4b_bits(const Capabilities& caps);

/// Status codes of a result frame (the C ABI's ATTNCHECK_OK/ERROR/UNSUPPORTED, plus one the host reports).
enum Status : std::int32_t { ok = 0, error = 1, unsupported = 2, wrong_size = 3 };

/// A frame or payload that does not follow the protocol.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Appends little-endian fields to a byte string.
class Writer {
 public:
  void u32(std::uint32_t x) { raw(&x, 4); }
  void i32(std::int32_t x) { raw(&x, 4); }
  void u64(std::uint64_t x) { raw(&x, 8); }
  void i64(std::int64_t x) { raw(&x, 8); }
  void f64(double x) { raw(&x, 8); }
  void f32(float x) { raw(&x, 4); }
  void str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, std::size_t n) { buf_.append(static_cast<const char*>(p), n); }
  std::string& bytes() { return buf_; }

 private:
  std::string buf_;
};

/// Reads little-endian fields from a payload; throws ProtocolError naming `what` when it runs short.
class Reader {
 public:
  Reader(std::string_view payload, std::string what) : p_(payload), what_(std::move(what)) {}
  std::uint32_t u32() { return take<std::uint32_t>(); }
  std::int32_t i32() { return take<std::int32_t>(); }
  std::uint64_t u64() { return take<std::uint64_t>(); }
  std::int64_t i64() { return take<std::int64_t>(); }
  double f64() { return take<double>(); }
  float f32() { return take<float>(); }
  std::string str();
  std::string_view raw(std::size_t n);
  std::size_t left() const { return p_.size() - pos_; }

 private:
  template <class T>
  T take() {
    T x;
    const auto s = raw(sizeof(T));
    std::memcpy(&x, s.data(), sizeof(T));
    return x;
  }
  std::string_view p_;
  std::size_t pos_ = 0;
  std::string what_;
};

/// A whole frame: header then payload.
std::string frame(FrameType type, std::string_view payload);
/// Parses a 16-byte header; throws ProtocolError (quoting the bytes) when the magic is wrong.
std::pair<FrameType, std::uint64_t> parse_header(std::string_view header);
std::string_view frame_type_name(FrameType t);

std::uint32_t dtype_code(DType t);
DType dtype_from_code(std::uint32_t code);  ///< throws ProtocolError for an unknown code
std::uint32_t alignment_code(CausalAlignment a);
CausalAlignment alignment_from_code(std::uint32_t code);
std::size_t element_size(DType t);

/// What the child declares in its caps frame. From version 2 it carries the GQA, key-length, window and
/// backward capabilities and the empty-rows convention; a version-1 caps frame leaves them off.
struct Handshake {
  std::uint32_t version = 0;  ///< the version both sides speak from now on
  Capabilities caps;
  std::string name, description;
};

/// The hello frame: u32 1 (what a version-1 client checks), then u32 kProtocolVersion (from version 2).
std::string encode_hello();
/// The newest version the sender of a hello speaks: its second field, or its first when there is none.
std::uint32_t decode_hello(std::string_view payload);
std::string encode_caps(const Handshake& h);
/// Reads the version first, and nothing more when it is outside [kOldestProtocolVersion, kProtocolVersion].
Handshake decode_caps(std::string_view payload);
std::string encode_refuse(std::string_view message);

/// A forward frame. Without key lengths and a window (version 2's fields) it is also a version-1 frame; without
/// the modifiers, LSE, causal = false, the masks beyond causal and paging (version 3's) a version-2 one. The caller sends each only to a
/// child that declared it; the LSE-wanted flag follows p.want_lse. A paged problem (p.paged) travels as its
/// block table and its K and V pools (paged_pools at p.dtype, bit for bit), with every sequence's length.
std::string encode_forward(const Problem& p);
/// A paged frame decodes to a problem whose plan holds the table as it came (PagedPlan::block_table), whose
/// dense k and v are the pools read back through it (0 past each sequence's length), and whose fill is what
/// every free slot of both pools holds when that is one of PageFill's values (else zero); its key lengths are
/// empty when every sequence has T_k keys.
Problem decode_forward(std::string_view payload);
/// A backward frame (version 2): the forward call's fields, then *p.d_output.
std::string encode_backward(const Problem& p);
Problem decode_backward(std::string_view payload);  ///< with d_output set

/// A decoded result frame. Shapes are as the child sent them, unchecked, so a wrong size can be reported.
struct Result {
  std::int32_t status = ok;
  std::string message;
  std::array<std::int64_t, 4> out_shape{};
  std::string_view out_bytes;
  bool has_weights = false;
  std::array<std::int64_t, 4> w_shape{};
  std::string_view w_bytes;
  bool has_lse = false;  ///< version 3: [B,H,T_q,1] float64, whatever the dtype
  std::array<std::int64_t, 4> lse_shape{};
  std::string_view lse_bytes;
};

std::string encode_result(const Outcome& o, DType dtype);
/// A result (or, for a backward, gradients) frame that carries only a failure status and its message.
std::string encode_failure(std::int32_t status, std::string_view message, FrameType type = FrameType::result);
Result decode_result(std::string_view payload, DType dtype);

/// A decoded gradients frame; shapes as the child sent them, unchecked.
struct GradientsResult {
  std::int32_t status = ok;
  std::string message;
  std::array<std::array<std::int64_t, 4>, 3> shapes{};  ///< dq, dk, dv
  std::array<std::string_view, 3> bytes;
  std::optional<std::vector<double>> d_sinks;  ///< version 3: as many as the child sent
  /// Version 4: dBias, its shape as the child sent it and its bytes at the call's dtype.
  std::optional<std::array<std::int64_t, 4>> d_bias_shape;
  std::string_view d_bias_bytes;
};

std::string encode_gradients(const Gradients& g, DType dtype);
GradientsResult decode_gradients(std::string_view payload, DType dtype);

/// Native little-endian bytes of a tensor at `dtype` (exact: its values are representable at dtype).
std::string to_bytes(const Tensor<double>& t, DType dtype);
/// The tensor of `shape` held in `bytes` at `dtype`, widened to double (exact).
Tensor<double> from_bytes(std::string_view bytes, const Shape& shape, DType dtype);

/// "[1,2,3,4]" for a raw shape.
std::string shape_string(const std::array<std::int64_t, 4>& s);

}  // namespace attncheck::wire
