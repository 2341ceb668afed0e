// The C ABI loader: dlopen, the ABI version check (1 to 4; from 4, the table's own size), and forward and backward calls that detect output
// the plug-in did not write or wrote past (sentinel-filled buffers with a guard zone behind them).
#include "c_plugin.hpp"

#include "attncheck/features.hpp"

#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <stdexcept>
#include <vector>

#include "attncheck/layouts.hpp"
#include "attncheck/plugin.h"
#include "attncheck/spec_error.hpp"
#include "protocol.hpp"

namespace attncheck::detail {
namespace {

// Quiet NaNs with a payload no arithmetic produces: an element still holding it was never written.
template <class S>
S sentinel() {
  if constexpr (std::is_same_v<S, double>)
    return Eigen::numext::bit_cast<double>(std::uint64_t{0x7FFDA5A5A5A5A5A5});
  else if constexpr (std::is_same_v<S, float>)
    return Eigen::numext::bit_cast<float>(std::uint32_t{0x7FE5A5A5});
  else
    return Eigen::numext::bit_cast<S>(std::uint16_t{std::is_same_v<S, Eigen::half> ? 0x7E5Au : 0x7FE5u});
}

template <class S>
bool is_sentinel(const S& x) {
  return std::memcmp(&x, std::array{sentinel<S>()}.data(), sizeof(S)) == 0;
}

// Bytes behind each output buffer that must still hold the sentinel after the call: a plug-in that writes
// a row or a head too many lands here instead of in someone else's memory (at least this much; the rest of
// the last page too).
constexpr std::size_t kGuardBytes = 4096;
// Past the sentinels, this much address space that cannot be touched: a write farther past the end (an index
// off by a stride, an LSE written with the weights' strides) faults there, and the fault names the buffer,
// where it would have landed silently in another allocation. Address space only: nothing is committed.
constexpr std::size_t kFarGuardBytes = std::size_t{16} << 20;

// The far guards of the buffers live now, for the fault handler: a fixed table read with atomics, since a
// handler may neither lock nor allocate. A plug-in call is made from one thread at a time (a plug-in is not
// declared reentrant), so a handful of slots is plenty; a buffer that finds none keeps its sentinels only.
struct FarGuard {
  std::atomic<std::uintptr_t> begin{0}, end{0};
  char message[320] = {};  // written before `end` is published, read by the handler only after it
};
FarGuard g_far_guards[32];
struct sigaction g_previous_segv {};
std::once_flag g_segv_once;

// Writes the integer `x` in decimal to fd 2 (async-signal-safe).
void write_number(std::uintptr_t x) {
  char b[24];
  int n = sizeof b;
  do {
    b[--n] = char('0' + x % 10);
    x /= 10;
  } while (x && n > 0);
  [[maybe_unused]] const auto w = ::write(2, b + n, sizeof b - std::size_t(n));
}

// A fault in a far guard is a plug-in writing (or reading) far past one of its output buffers: say which on
// stderr, where attncheck quotes it with the crash. Either way the fault then takes its course: the previous
// handler (or the default action, death by SIGSEGV) runs when the instruction faults again.
void on_segv(int, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (FarGuard& g : g_far_guards) {
    const std::uintptr_t end = g.end.load(std::memory_order_acquire), begin = g.begin.load(std::memory_order_acquire);
    if (end == 0 || addr < begin || addr >= end) continue;
    static constexpr char kAt[] = " (at byte ", kRest[] = " of the inaccessible pages after its sentinel guard)\n";
    [[maybe_unused]] auto w = ::write(2, g.message, std::strlen(g.message));
    w = ::write(2, kAt, sizeof kAt - 1);
    write_number(addr - begin);
    w = ::write(2, kRest, sizeof kRest - 1);
    break;
  }
  ::sigaction(SIGSEGV, &g_previous_segv, nullptr);
}

// Mappings of the output buffers freed, kept for the next buffer of the same size. Mapped and unmapped anew for
// every call, unmapping (a TLB shootdown on a virtual machine) and faulting the pages in again took a quarter of
// the CPU of a C plug-in's law run (perf: the example plug-in's row-stochastic, 60 cases). A kept mapping's
// read-write pages stay committed and its far guard stays inaccessible; the next buffer refills every sentinel, as
// a fresh one would. At most kKeptMappings of them and kKeptBytes committed, so a long context's buffers are not
// held after it.
class KeptMappings {
 public:
  // A mapping of map_bytes whose first rw_bytes are readable and writable, or nullptr.
  void* take(std::size_t map_bytes, std::size_t rw_bytes) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < kept_.size(); ++i)
      if (kept_[i].map_bytes == map_bytes && kept_[i].rw_bytes == rw_bytes) {
        void* m = kept_[i].at;
        committed_ -= rw_bytes;
        kept_.erase(kept_.begin() + std::ptrdiff_t(i));
        return m;
      }
    return nullptr;
  }
  // Keeps the mapping, or says no (the caller unmaps it).
  bool keep(void* m, std::size_t map_bytes, std::size_t rw_bytes) {
    std::lock_guard lock(mutex_);
    if (kept_.size() >= kKeptMappings || committed_ + rw_bytes > kKeptBytes) return false;
    kept_.push_back({m, map_bytes, rw_bytes});
    committed_ += rw_bytes;
    return true;
  }

 private:
  static constexpr std::size_t kKeptMappings = 16, kKeptBytes = std::size_t{256} << 20;
  struct Kept {
    void* at;
    std::size_t map_bytes, rw_bytes;
  };
  std::mutex mutex_;
  std::vector<Kept> kept_;
  std::size_t committed_ = 0;
};
// Never destroyed: a buffer freed during exit (a call still running on another thread) must find it.
KeptMappings& kept_mappings() {
  static KeptMappings* const kept = new KeptMappings;
  return *kept;
}

// Memory for one output buffer of n elements: n elements, then sentinels to the end of the page (at least
// kGuardBytes of them), then kFarGuardBytes no one may touch. `what` ends the fault message ("plugin:x.so:
// wrote far past the end of its lse [1,2,3,1]").
template <class S>
class GuardedArray {
 public:
  GuardedArray(std::size_t n, const std::string& what) {
    const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
    rw_bytes_ = (n * sizeof(S) + kGuardBytes + page - 1) / page * page;
    map_bytes_ = rw_bytes_ + kFarGuardBytes;
    void* m = kept_mappings().take(map_bytes_, rw_bytes_);
    if (!m) {
      m = ::mmap(nullptr, map_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) throw std::bad_alloc();
      if (::mprotect(m, rw_bytes_, PROT_READ | PROT_WRITE) != 0) {
        ::munmap(m, map_bytes_);
        throw std::bad_alloc();
      }
    }
    data_ = static_cast<S*>(m);
    size_ = rw_bytes_ / sizeof(S);
    std::fill(data_, data_ + size_, sentinel<S>());
    std::call_once(g_segv_once, [] {
      struct sigaction sa {};
      sa.sa_sigaction = on_segv;
      sa.sa_flags = SA_SIGINFO;
      sigemptyset(&sa.sa_mask);
      ::sigaction(SIGSEGV, &sa, &g_previous_segv);
    });
    for (FarGuard& g : g_far_guards) {
      std::uintptr_t free_slot = 0;
      if (!g.end.compare_exchange_strong(free_slot, 1)) continue;  // claimed: 1 marks it busy until published
      std::snprintf(g.message, sizeof g.message, "%s", what.c_str());
      g.begin.store(reinterpret_cast<std::uintptr_t>(m) + rw_bytes_, std::memory_order_release);
      g.end.store(reinterpret_cast<std::uintptr_t>(m) + map_bytes_, std::memory_order_release);
      slot_ = &g;
      break;
    }
  }
  GuardedArray(const GuardedArray&) = delete;
  GuardedArray& operator=(const GuardedArray&) = delete;
  ~GuardedArray() {
    if (slot_) {
      slot_->begin.store(0, std::memory_order_release);
      slot_->end.store(0, std::memory_order_release);
    }
    if (!kept_mappings().keep(data_, map_bytes_, rw_bytes_)) ::munmap(data_, map_bytes_);
  }
  S* data() { return data_; }
  const S* data() const { return data_; }
  /// The elements and the sentinels after them.
  std::size_t size() const { return size_; }
  const S& operator[](std::size_t i) const { return data_[i]; }
  const S* begin() const { return data_; }

 private:
  S* data_ = nullptr;
  std::size_t size_ = 0, rw_bytes_ = 0, map_bytes_ = 0;
  FarGuard* slot_ = nullptr;
};

template <class S>
attncheck_tensor_in in_tensor(const Tensor<S>& t) {
  const Shape& s = t.shape();
  return {t.data(), {s.B, s.H, s.T, s.D}, {s.H * s.T * s.D, s.T * s.D, s.D, 1}};
}

// A sentinel-filled buffer for a tensor of `shape`, with the guard zones behind it; `who` and `what` name the
// plug-in and the buffer for a fault in the far guard.
template <class S>
struct OutBuffer {
  OutBuffer(const Shape& s, const std::string& who, const char* what)
      : shape(s),
        data(std::size_t(s.numel()), who + ": wrote far past the end of its " + what + " " + to_string(s)) {}
  attncheck_tensor_out view() {
    return {data.data(),
            {shape.B, shape.H, shape.T, shape.D},
            {shape.H * shape.T * shape.D, shape.T * shape.D, shape.D, 1}};
  }
  // Throws ImplementationError(wrong_size) when the plug-in wrote past the end or left an element unwritten.
  // `hint` ends the message (what the shape should have been, for a plug-in that got it wrong).
  Tensor<double> take(const std::string& who, const char* what, const std::string& hint = "") const {
    const std::size_t n = std::size_t(shape.numel());
    for (std::size_t i = n; i < data.size(); ++i)
      if (!is_sentinel(data[i]))
        throw ImplementationError(ImplementationError::Kind::wrong_size,
                                  who + ": wrote past the end of its " + what + " " + to_string(shape) + " (element " +
                                      std::to_string(i) + " of a buffer of " + std::to_string(n) + ")" + hint);
    std::size_t unwritten = 0, first = n;
    for (std::size_t i = 0; i < n; ++i)
      if (is_sentinel(data[i])) {
        ++unwritten;
        first = std::min(first, i);
      }
    if (unwritten > 0) {
      const Index d = Index(first) % shape.D, i = Index(first) / shape.D % shape.T,
                  h = Index(first) / (shape.D * shape.T) % shape.H, b = Index(first) / (shape.D * shape.T * shape.H);
      throw ImplementationError(ImplementationError::Kind::wrong_size,
                                who + ": returned OK but left " + std::to_string(unwritten) + " of " +
                                    std::to_string(n) + " elements of its " + what + " " + to_string(shape) +
                                    " unwritten (the first at [" + std::to_string(b) + "," + std::to_string(h) + "," +
                                    std::to_string(i) + "," + std::to_string(d) + "])" + hint);
    }
    Tensor<S> t(shape);
    std::copy(data.begin(), data.begin() + std::ptrdiff_t(n), t.data());
    return t.template cast<double>();
  }
  Shape shape;
  GuardedArray<S> data;
};

std::string status_name(std::int32_t st) { return st == ATTNCHECK_ERROR ? "ATTNCHECK_ERROR" : "ATTNCHECK_UNSUPPORTED"; }

std::string hex(std::uint32_t x) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", x);
  return b;
}

// The capability bits each ABI version may set, and the names of the ABI-2 ones (for a clear refusal).
constexpr std::uint32_t kAbi1Flags = ATTNCHECK_CAP_RETURNS_WEIGHTS | ATTNCHECK_CAP_CUSTOM_SCALE |
                                     ATTNCHECK_CAP_CROSS_LENGTHS | ATTNCHECK_CAP_NONFINITE_SAFE;
constexpr std::uint32_t kAbi2Flags = kAbi1Flags | ATTNCHECK_CAP_GQA | ATTNCHECK_CAP_KEY_LENGTHS | ATTNCHECK_CAP_WINDOW;
constexpr std::pair<std::uint32_t, const char*> kAbi2FlagNames[] = {{ATTNCHECK_CAP_GQA, "ATTNCHECK_CAP_GQA"},
                                                                    {ATTNCHECK_CAP_KEY_LENGTHS, "ATTNCHECK_CAP_KEY_LENGTHS"},
                                                                    {ATTNCHECK_CAP_WINDOW, "ATTNCHECK_CAP_WINDOW"}};
// The core's block kinds are the header's values, so kinds cross the ABI as they lie in memory.
static_assert(std::uint8_t(BlockKind::Empty) == ATTNCHECK_BLOCK_EMPTY &&
                  std::uint8_t(BlockKind::Partial) == ATTNCHECK_BLOCK_PARTIAL &&
                  std::uint8_t(BlockKind::Full) == ATTNCHECK_BLOCK_FULL,
              "BlockKind must have the values of attncheck/plugin.h's ATTNCHECK_BLOCK_*");

// A problem's block and dense masks as the ABI passes them, pointing into the problem (which outlives the call):
// row-major strides, 0 over a broadcast batch (B = 1) or head (H = 1) extent. Null when the problem has none.
struct CellMasks {
  attncheck_block_mask block{};
  attncheck_dense_mask dense{};
  const attncheck_block_mask* block_ptr = nullptr;
  const attncheck_dense_mask* dense_ptr = nullptr;
  CellMasks() = default;
  CellMasks(const CellMasks&) = delete;  // the pointers point into this object
};

// Strides of [B, H, rows, cols] row-major bytes, a stride 0 for an extent of 1 that broadcasts.
void cell_strides(Index B, Index H, Index rows, Index cols, std::int64_t (&s)[4]) {
  s[0] = B == 1 ? 0 : H * rows * cols;
  s[1] = H == 1 ? 0 : rows * cols;
  s[2] = cols;
  s[3] = 1;
}

// A problem's bias as the ABI passes it: its values at the call's dtype (exact: the problem's are of that dtype),
// row-major strides with 0 over a broadcast extent. Null when the problem has none.
template <class S>
struct BiasArg {
  std::vector<S> values;
  attncheck_bias abi{};
  const attncheck_bias* ptr = nullptr;
  explicit BiasArg(const Problem& p) {
    if (!p.bias) return;
    const ScoreBias& b = *p.bias;
    values.reserve(b.values.size());
    for (const double x : b.values) values.push_back(static_cast<S>(x));
    abi.data = values.data();
    const std::int64_t shape[4] = {b.B, b.H, b.T_q, b.T_k};
    std::copy(shape, shape + 4, abi.shape);
    cell_strides(b.B, b.H, b.T_q, b.T_k, abi.strides);
    ptr = &abi;
  }
  BiasArg(const BiasArg&) = delete;  // ptr points into this object
};

// A problem's rope as the ABI passes it (its positions are the problem's own int64s). Null when it has none.
struct RopeArg {
  attncheck_rope abi{};
  const attncheck_rope* ptr = nullptr;
  explicit RopeArg(const Problem& p) {
    static_assert(sizeof(Index) == sizeof(std::int64_t), "positions passed as int64_t");
    if (!p.rope) return;
    const Rope& r = *p.rope;
    abi.variant = r.variant == RopeVariant::half_split ? ATTNCHECK_ROPE_HALF_SPLIT : ATTNCHECK_ROPE_INTERLEAVED;
    abi.scaling = r.scaling == RopeScaling::ntk      ? ATTNCHECK_ROPE_SCALING_NTK
                  : r.scaling == RopeScaling::llama3 ? ATTNCHECK_ROPE_SCALING_LLAMA3
                  : r.factor == 1                    ? ATTNCHECK_ROPE_SCALING_NONE
                                                     : ATTNCHECK_ROPE_SCALING_LINEAR;
    abi.rotary_dim = r.rotary_dim;
    abi.base = r.base;
    abi.scaling_params[0] = r.factor;
    if (r.scaling == RopeScaling::llama3) {
      abi.scaling_params[1] = r.low_freq_factor;
      abi.scaling_params[2] = r.high_freq_factor;
      abi.scaling_params[3] = r.original_max_position;
    }
    abi.q_positions = reinterpret_cast<const std::int64_t*>(r.q_positions.data());
    abi.k_positions = reinterpret_cast<const std::int64_t*>(r.k_positions.data());
    ptr = &abi;
  }
  RopeArg(const RopeArg&) = delete;  // ptr points into this object
};

// A problem's QK-norm as the ABI passes it (its weights are the problem's own doubles). Null when it has none.
struct QkNormArg {
  attncheck_qk_norm abi{};
  const attncheck_qk_norm* ptr = nullptr;
  explicit QkNormArg(const Problem& p) {
    if (!p.qk_norm) return;
    const QkNorm& n = *p.qk_norm;
    abi.q_weight = n.q_weight.empty() ? nullptr : n.q_weight.data();
    abi.k_weight = n.k_weight.empty() ? nullptr : n.k_weight.data();
    abi.eps = n.eps;
    abi.eps_placement = n.eps_outside ? ATTNCHECK_NORM_EPS_OUTSIDE : ATTNCHECK_NORM_EPS_IN_SQRT;
    ptr = &abi;
  }
  QkNormArg(const QkNormArg&) = delete;  // ptr points into this object
};

// A problem's dropout as the ABI passes it. Null when it has none.
struct DropoutArg {
  attncheck_dropout abi{};
  const attncheck_dropout* ptr = nullptr;
  explicit DropoutArg(const Problem& p) {
    if (!p.dropout) return;
    abi.p = p.dropout->p;
    abi.seed = p.dropout->seed;
    abi.offset = p.dropout->offset;
    ptr = &abi;
  }
  DropoutArg(const DropoutArg&) = delete;  // ptr points into this object
};

// A problem's index list as the ABI passes it: its entries contiguous [B, H_kv, T_q, max_k], or null without one.
struct IndexListArg {
  attncheck_index_list abi{};
  const attncheck_index_list* ptr = nullptr;
  std::vector<std::int32_t> slots;  // a paged call's physical entries
  explicit IndexListArg(const Problem& p) {
    if (!p.index_list) return;
    const IndexList& l = *p.index_list;
    const bool physical = l.physical && p.paged;
    if (physical) slots = physical_indices(l, p.paged_kv(), p.sequence_lengths());
    abi.space = physical ? ATTNCHECK_INDEX_PHYSICAL : ATTNCHECK_INDEX_LOGICAL;
    abi.per = l.H == p.k.shape().H ? ATTNCHECK_INDEX_PER_KV_HEAD : ATTNCHECK_INDEX_PER_QUERY_HEAD;
    abi.block_size = l.block_size;
    abi.max_k = l.max_k;
    abi.indices = physical ? slots.data() : l.indices.data();
    abi.shape[0] = l.B, abi.shape[1] = l.H, abi.shape[2] = l.T_q, abi.shape[3] = l.max_k;
    abi.strides[0] = l.H * l.T_q * l.max_k, abi.strides[1] = l.T_q * l.max_k, abi.strides[2] = l.max_k,
    abi.strides[3] = 1;
    ptr = &abi;
  }
  IndexListArg(const IndexListArg&) = delete;  // ptr points into this object
};

// A problem's tree as the ABI passes it (its parents or its bits and offsets, each entry's prefix length), or null
// without one.
struct TreeArg {
  attncheck_tree_mask abi{};
  const attncheck_tree_mask* ptr = nullptr;
  std::vector<std::int64_t> prefix, offsets;
  explicit TreeArg(const Problem& p) {
    if (!p.tree) return;
    const TokenTree& t = *p.tree;
    for (Index b = 0; b < t.B; ++b)
      prefix.push_back((p.key_lengths.empty() ? p.k.shape().T : p.key_lengths[std::size_t(b)]) - t.T_q);
    abi.nodes = t.T_q;
    abi.prefix_lengths = prefix.data();
    if (t.form == TokenTree::Form::parents) {
      abi.form = ATTNCHECK_TREE_PARENTS;
      abi.parents = t.parents.data();
    } else {
      abi.form = ATTNCHECK_TREE_BITMASK;
      abi.bit_order = t.big_endian ? ATTNCHECK_BITS_MSB_FIRST : ATTNCHECK_BITS_LSB_FIRST;
      offsets.assign(t.offsets.begin(), t.offsets.end());
      abi.bits = t.bits.data();
      abi.offsets = offsets.data();
    }
    ptr = &abi;
  }
  TreeArg(const TreeArg&) = delete;  // ptr points into this object
};

// A problem's quantised K and V as the ABI passes them: each side's codes (quant_codes of its dequantised values),
// scales as float32 and zero points as int8, contiguous; in a paged call K's and V's are the pools' (page_quant: the
// codes and the scales at each key's page and slot, over the pool's axes). Null when it has none.
struct QuantArg {
  struct Side {
    std::vector<std::uint8_t> codes;
    std::vector<float> scales;
    std::vector<std::int8_t> zero_points;
  } k, v, q;
  attncheck_quant_kv abi{};
  const attncheck_quant_kv* ptr = nullptr;
  QuantArg(const Problem& p, const char* who) {
    if (!p.quant) return;
    const QuantizedKV& qk = *p.quant;
    const bool blocked = quant_blocked(qk.format);
    // One side from its bytes, row-major over sh's first three axes: rows of sh.D codes, or of ggml's D/32 blocks.
    const auto put = [&](Side& side, attncheck_quant_tensor& t, const QuantScales& s, const Shape& sh,
                         std::vector<std::uint8_t> bytes) {
      side.codes = std::move(bytes);
      t.format = std::uint32_t(qk.format);
      t.granularity = std::uint32_t(s.granularity);
      t.shape[0] = sh.B, t.shape[1] = sh.H, t.shape[2] = sh.T, t.shape[3] = sh.D;
      const Index elem = blocked ? Index(quant_block_bytes(qk.format)) : 1, row = blocked ? sh.D / kQuantBlock * elem : sh.D;
      t.codes = side.codes.data();
      t.strides[0] = sh.H * sh.T * row, t.strides[1] = sh.T * row, t.strides[2] = row, t.strides[3] = elem;
      if (blocked) return;  // ggml's blocks hold their scales
      side.scales.assign(s.scales.begin(), s.scales.end());
      for (const double z : s.zero_points) side.zero_points.push_back(std::int8_t(z));
      t.scales = side.scales.data();
      t.scale_shape[0] = s.B, t.scale_shape[1] = s.H, t.scale_shape[2] = s.T;
      t.scale_strides[0] = s.B == 1 ? 0 : s.H * s.T, t.scale_strides[1] = s.H == 1 ? 0 : s.T,
      t.scale_strides[2] = s.T == 1 ? 0 : 1;
      t.zero_points = side.zero_points.empty() ? nullptr : side.zero_points.data();
    };
    const auto fill = [&](Side& side, attncheck_quant_tensor& t, const QuantScales& s, const Tensor<double>& x,
                          const char* name) {
      if (p.paged && name[0] != 'q') {  // K's and V's pools
        QuantPool pool = page_quant(qk.format, s, x, p.sequence_lengths(), p.paged_kv());
        put(side, t, pool.scales, pool.shape, std::move(pool.bytes));
        return;
      }
      std::vector<std::uint8_t> codes = quant_codes(who, name, qk.format, s, x);
      if (blocked) codes = pack_blocks(qk.format, s, x.shape(), codes);
      put(side, t, s, x.shape(), std::move(codes));
    };
    fill(k, abi.k, qk.k, p.k, "k");
    fill(v, abi.v, qk.v, p.v, "v");
    if (qk.q) fill(q, abi.q, *qk.q, p.q, "q");
    ptr = &abi;
  }
  QuantArg(const QuantArg&) = delete;  // ptr points into this object
};

void fill_cell_masks(const Problem& p, CellMasks& c) {
  if (p.block_mask) {
    const BlockMask& m = *p.block_mask;
    c.block.block_q = m.block_q;
    c.block.block_k = m.block_k;
    c.block.num_q_blocks = m.q_blocks;
    c.block.num_k_blocks = m.k_blocks;
    c.block.kinds = m.kinds.data();
    cell_strides(m.B, m.H, m.q_blocks, m.k_blocks, c.block.kind_strides);
    // NULL when no block is partial (the cells are then never read, and a problem may carry none).
    c.block.partial = m.partial.cells.empty() ? nullptr : m.partial.cells.data();
    if (c.block.partial) cell_strides(m.partial.B, m.partial.H, m.partial.T_q, m.partial.T_k, c.block.partial_strides);
    c.block_ptr = &c.block;
  }
  if (p.dense_mask) {
    const DenseMask& d = *p.dense_mask;
    c.dense.data = d.cells.data();
    cell_strides(d.B, d.H, d.T_q, d.T_k, c.dense.strides);
    c.dense_ptr = &c.dense;
  }
}

// Every ATTNCHECK_CAP3_* bit.
constexpr std::uint32_t kAbi3Flags = 0x3FFFFu;
// The feature table's C ABI bits are those of attncheck/plugin.h, a frozen header: checked here, where both are seen.
struct AbiBit {
  Feature feature;
  std::uint32_t bit;
  std::string_view macro;
};
#define ATTNCHECK_ABI_BIT(f, m) AbiBit{Feature::f, m, #m}
constexpr bool abi_bits_match() {
  constexpr AbiBit abi[] = {ATTNCHECK_ABI_BIT(gqa, ATTNCHECK_CAP_GQA),
                            ATTNCHECK_ABI_BIT(key_padding, ATTNCHECK_CAP_KEY_LENGTHS),
                            ATTNCHECK_ABI_BIT(window, ATTNCHECK_CAP_WINDOW)};
  constexpr AbiBit abi3[] = {ATTNCHECK_ABI_BIT(lse, ATTNCHECK_CAP3_LSE),
                             ATTNCHECK_ABI_BIT(sinks, ATTNCHECK_CAP3_SINKS),
                             ATTNCHECK_ABI_BIT(softcap, ATTNCHECK_CAP3_SOFTCAP),
                             ATTNCHECK_ABI_BIT(alibi, ATTNCHECK_CAP3_ALIBI),
                             ATTNCHECK_ABI_BIT(paged, ATTNCHECK_CAP3_PAGED),
                             ATTNCHECK_ABI_BIT(documents, ATTNCHECK_CAP3_DOCUMENTS),
                             ATTNCHECK_ABI_BIT(chunked_local, ATTNCHECK_CAP3_CHUNKED_LOCAL),
                             ATTNCHECK_ABI_BIT(prefix, ATTNCHECK_CAP3_PREFIX),
                             ATTNCHECK_ABI_BIT(bidirectional, ATTNCHECK_CAP3_BIDIRECTIONAL),
                             ATTNCHECK_ABI_BIT(right_window, ATTNCHECK_CAP3_RIGHT_WINDOW),
                             ATTNCHECK_ABI_BIT(block_mask, ATTNCHECK_CAP3_BLOCK_MASK),
                             ATTNCHECK_ABI_BIT(dense_mask, ATTNCHECK_CAP3_DENSE_MASK),
                             ATTNCHECK_ABI_BIT(v_head_dim, ATTNCHECK_CAP3_V_HEAD_DIM),
                             ATTNCHECK_ABI_BIT(strided, ATTNCHECK_CAP3_STRIDED),
                             ATTNCHECK_ABI_BIT(layout_invariant, ATTNCHECK_CAP3_LAYOUT_INVARIANT),
                             ATTNCHECK_ABI_BIT(batch_invariant, ATTNCHECK_CAP3_BATCH_INVARIANT),
                             ATTNCHECK_ABI_BIT(query_documents, ATTNCHECK_CAP3_QUERY_DOCUMENTS)};
  std::size_t abi_rows = 0, abi3_rows = 0;
  for (const AbiBit& a : abi)
    if (feature(a.feature).abi_flag != a.bit || feature(a.feature).c_name != a.macro) return false;
  constexpr AbiBit abi4[] = {ATTNCHECK_ABI_BIT(bias, ATTNCHECK_CAP4_BIAS),
                             ATTNCHECK_ABI_BIT(bias_grad, ATTNCHECK_CAP4_BIAS_GRAD),
                             ATTNCHECK_ABI_BIT(temperature, ATTNCHECK_CAP4_TEMPERATURE),
                             ATTNCHECK_ABI_BIT(rope, ATTNCHECK_CAP4_ROPE),
                             ATTNCHECK_ABI_BIT(rope_interleaved, ATTNCHECK_CAP4_ROPE_INTERLEAVED),
                             ATTNCHECK_ABI_BIT(qk_norm, ATTNCHECK_CAP4_QK_NORM),
                             ATTNCHECK_ABI_BIT(qk_norm_eps_outside, ATTNCHECK_CAP4_QK_NORM_EPS_OUTSIDE),
                             ATTNCHECK_ABI_BIT(dropout, ATTNCHECK_CAP4_DROPOUT),
                             ATTNCHECK_ABI_BIT(rope_ntk, ATTNCHECK_CAP4_ROPE_NTK),
                             ATTNCHECK_ABI_BIT(rope_llama3, ATTNCHECK_CAP4_ROPE_LLAMA3),
                             ATTNCHECK_ABI_BIT(kv_e4m3fn, ATTNCHECK_CAP4_KV_E4M3FN),
                             ATTNCHECK_ABI_BIT(kv_e5m2, ATTNCHECK_CAP4_KV_E5M2),
                             ATTNCHECK_ABI_BIT(kv_int8, ATTNCHECK_CAP4_KV_INT8),
                             ATTNCHECK_ABI_BIT(kv_scale_per_head, ATTNCHECK_CAP4_KV_SCALE_PER_HEAD),
                             ATTNCHECK_ABI_BIT(kv_scale_per_token, ATTNCHECK_CAP4_KV_SCALE_PER_TOKEN),
                             ATTNCHECK_ABI_BIT(kv_zero_points, ATTNCHECK_CAP4_KV_ZERO_POINTS),
                             ATTNCHECK_ABI_BIT(kv_ggml_q8_0, ATTNCHECK_CAP4_KV_GGML_Q8_0),
                             ATTNCHECK_ABI_BIT(kv_ggml_q4_0, ATTNCHECK_CAP4_KV_GGML_Q4_0),
                             ATTNCHECK_ABI_BIT(kv_ggml_q4_1, ATTNCHECK_CAP4_KV_GGML_Q4_1),
                             ATTNCHECK_ABI_BIT(kv_ggml_q5_0, ATTNCHECK_CAP4_KV_GGML_Q5_0),
                             ATTNCHECK_ABI_BIT(kv_ggml_q5_1, ATTNCHECK_CAP4_KV_GGML_Q5_1),
                             ATTNCHECK_ABI_BIT(q_dot_ggml_q8, ATTNCHECK_CAP4_Q_DOT_GGML_Q8),
                             ATTNCHECK_ABI_BIT(q_quant, ATTNCHECK_CAP4_Q_QUANT),
                             ATTNCHECK_ABI_BIT(p_fp8, ATTNCHECK_CAP4_P_FP8),
                             ATTNCHECK_ABI_BIT(paged_quant, ATTNCHECK_CAP4_PAGED_QUANT),
                             ATTNCHECK_ABI_BIT(index_list, ATTNCHECK_CAP4_INDEX_LIST),
                             ATTNCHECK_ABI_BIT(index_list_blocks, ATTNCHECK_CAP4_INDEX_LIST_BLOCKS),
                             ATTNCHECK_ABI_BIT(tree, ATTNCHECK_CAP4_TREE),
                             ATTNCHECK_ABI_BIT(tree_bitmask, ATTNCHECK_CAP4_TREE_BITMASK),
                             ATTNCHECK_ABI_BIT(index_list_physical, ATTNCHECK_CAP4_INDEX_LIST_PHYSICAL),
                             ATTNCHECK_ABI_BIT(index_list_per_query_head, ATTNCHECK_CAP4_INDEX_LIST_PER_QUERY_HEAD)};
  constexpr AbiBit abi4b[] = {ATTNCHECK_ABI_BIT(index_list_counted, ATTNCHECK_CAP4B_INDEX_LIST_COUNTED),
                              ATTNCHECK_ABI_BIT(index_list_current_block, ATTNCHECK_CAP4B_INDEX_LIST_CURRENT_BLOCK)};
  for (const AbiBit& a : abi3)
    if (feature(a.feature).flags3 != a.bit || feature(a.feature).c_name != a.macro) return false;
  for (const AbiBit& a : abi4)
    if (feature(a.feature).flags4 != a.bit || feature(a.feature).c_name != a.macro) return false;
  for (const AbiBit& a : abi4b)
    if (feature(a.feature).flags4b != a.bit || feature(a.feature).c_name != a.macro) return false;
  std::size_t abi4_rows = 0, abi4b_rows = 0;
  for (const FeatureRow& r : kFeatures) {
    abi_rows += r.abi_flag ? 1 : 0;
    abi3_rows += r.flags3 ? 1 : 0;
    abi4_rows += r.flags4 ? 1 : 0;
    abi4b_rows += r.flags4b ? 1 : 0;
  }
  return abi_rows == std::size(abi) && abi3_rows == std::size(abi3) && abi4_rows == std::size(abi4) &&
         abi4b_rows == std::size(abi4b) &&
         (wire::kFeatureFlags3 | ATTNCHECK_CAP3_DETERMINISTIC) == kAbi3Flags;
}
#undef ATTNCHECK_ABI_BIT
static_assert(abi_bits_match(), "a row of kFeatures (attncheck/features.hpp) differs from attncheck/plugin.h");
// The largest head dimension (the CLI's --max-D bound) and page size (the longest sequence) a table may declare.
constexpr std::int64_t kMaxExtent = std::int64_t{1} << 16, kMaxSeqLen = std::int64_t{1} << 20;

class CPlugin final : public Implementation {
 public:
  // `v2` is the same table as `table` when its version is 2 or more, else null; `v3` from 3 on, `v4` from 4 on.
  CPlugin(std::string name, const attncheck_plugin_v1* table, const attncheck_plugin_v2* v2,
          const attncheck_plugin_v3* v3, const attncheck_plugin_v4* v4)
      : name_(std::move(name)), table_(table), v2_(v2) {
    description_ = printable_text(std::string(table->name) +
                                  (table->description ? std::string(": ") + table->description : ""));
    caps_ = declared_capabilities(table, v2, v3, v4);
  }
  const std::string& name() const override { return name_; }
  const std::string& description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }

  Outcome forward(const Problem& p) const override {
    check_within_capabilities(p, caps_, name_, false);
    return visit_dtype(p.dtype, [&](auto tag) {
      using S = decltype(tag);
      const Tensor<S> q = p.q.template cast<S>(), k = p.k.template cast<S>(), v = p.v.template cast<S>();
      const Shape qs = q.shape();
      OutBuffer<S> out(p.output_shape(), name_, "output"),
          w(Shape{qs.B, qs.H, qs.T, k.shape().T}, name_, "weights");  // output [B,H,T_q,D_v]
      const bool want_w = p.want_weights && caps_.returns_weights;
      attncheck_tensor_out w_view = w.view();
      // The LSE, [B,H,T_q] doubles (held as [B,H,T_q,1]), only from a plug-in that declares it.
      const bool want_lse = p.want_lse && caps_.declares(Feature::lse);
      OutBuffer<double> lse(Shape{qs.B, qs.H, qs.T, 1}, name_, "lse");
      attncheck_lse_out lse_view{lse.data.data(), {qs.B, qs.H, qs.T}, {qs.H * qs.T, qs.T, 1}};
      // A paged call always carries every sequence's length (T_k each without key padding).
      const std::vector<Index> seq = p.paged ? p.sequence_lengths() : p.key_lengths;
      const std::vector<std::int64_t> lengths(seq.begin(), seq.end());
      const wire::DocIds docs = wire::doc_ids(p);
      CellMasks cells;
      fill_cell_masks(p, cells);
      // Laid out as the problem says (a plug-in that declares strides); `laid` outlives the call.
      std::optional<LaidOutInputs<S>> laid;
      if (p.layout != InputLayout::contiguous) laid = lay_out(q, k, v, p.layout);
      attncheck_call call = make_call(p, q, k, v, lengths, docs, cells, laid ? &*laid : nullptr);
      const BiasArg<S> bias(p);  // outlives the call
      call.bias = bias.ptr;
      const RopeArg rope(p);
      call.rope = rope.ptr;
      const QkNormArg qk_norm(p);
      call.qk_norm = qk_norm.ptr;
      const DropoutArg dropout(p);
      call.dropout = dropout.ptr;
      const IndexListArg index_list(p);
      call.index_list = index_list.ptr;
      const TreeArg tree(p);
      call.tree = tree.ptr;
      // Quantised: K and V only as their codes and scales; k.data and v.data NULL, their shapes as they are.
      const QuantArg quant(p, name_.c_str());
      if (quant.ptr) {
        call.quant = quant.ptr;
        call.k.data = nullptr;
        call.v.data = nullptr;
        if (quant.ptr->q.codes) call.q.data = nullptr;
      }
      call.output = out.view();
      call.weights = want_w ? &w_view : nullptr;
      call.lse = want_lse ? &lse_view : nullptr;
      // Paged: K and V only as the pools at the call's dtype and the block table; k.data and v.data NULL, their
      // shapes still [B,H_kv,T_k,D]. `pools` outlives the call.
      std::optional<PagedPools<S>> pools;
      attncheck_paged_kv paged{};
      if (p.paged) {
        pools = paged_pools(p, k, v);
        const PagedKV& pk = pools->layout;
        paged.layout = pk.layout == PageLayout::token_major ? ATTNCHECK_PAGED_TOKEN_MAJOR : ATTNCHECK_PAGED_HEAD_MAJOR;
        paged.num_pages = pk.num_pages;
        paged.page_size = pk.page_size;
        paged.k_pages = in_tensor(pools->k);
        paged.v_pages = in_tensor(pools->v);
        paged.block_table = pk.block_table.data();
        paged.max_pages = pk.max_pages;
        paged.block_table_stride = pk.max_pages;
        if (quant.ptr) paged.k_pages.data = paged.v_pages.data = nullptr;  // the pools are quant->k's and quant->v's
        call.k.data = nullptr;
        call.v.data = nullptr;
        call.paged = &paged;
      }
      char message[1024] = {};
      check_status(table_->forward(&call, message, sizeof message), message, "forward");
      Outcome o;
      o.output = out.take(name_, "output");
      if (want_w) o.weights = w.take(name_, "weights");
      if (want_lse) o.lse = lse.take(name_, "lse", " (call->lse is [B,H,T_q] doubles, with its strides)");
      return o;
    });
  }

  Gradients backward(const Problem& p) const override {
    if (!caps_.declares(Feature::backward)) return Implementation::backward(p);
    if (!p.d_output) throw std::logic_error(name_ + ": a backward call needs Problem::d_output");
    if (p.paged) throw std::logic_error(name_ + ": a paged backward call (paged calls are forward only)");
    check_within_capabilities(p, caps_, name_, true);
    return visit_dtype(p.dtype, [&](auto tag) {
      using S = decltype(tag);
      const Tensor<S> q = p.q.template cast<S>(), k = p.k.template cast<S>(), v = p.v.template cast<S>(),
                      d_out = p.d_output->template cast<S>();
      OutBuffer<S> scratch(p.output_shape(), name_, "forward call's output (a scratch buffer in a backward call)"),
          dq(q.shape(), name_, "dq"), dk(k.shape(), name_, "dk"), dv(v.shape(), name_, "dv");
      const std::vector<std::int64_t> lengths(p.key_lengths.begin(), p.key_lengths.end());
      const wire::DocIds docs = wire::doc_ids(p);
      CellMasks cells;
      fill_cell_masks(p, cells);
      std::optional<LaidOutInputs<S>> laid;
      if (p.layout != InputLayout::contiguous) laid = lay_out(q, k, v, p.layout);
      attncheck_call call = make_call(p, q, k, v, lengths, docs, cells, laid ? &*laid : nullptr);
      const BiasArg<S> bias(p);  // outlives the call
      call.bias = bias.ptr;
      const RopeArg rope(p);
      call.rope = rope.ptr;
      const QkNormArg qk_norm(p);
      call.qk_norm = qk_norm.ptr;
      const DropoutArg dropout(p);
      call.dropout = dropout.ptr;
      const IndexListArg index_list(p);
      call.index_list = index_list.ptr;
      const TreeArg tree(p);
      call.tree = tree.ptr;
      call.output = scratch.view();
      call.weights = nullptr;
      // d_sinks: H doubles when the call has sinks (a sentinel-filled buffer with a guard, as every output).
      const std::size_t H = std::size_t(q.shape().H);
      GuardedArray<double> d_sinks(p.sinks.empty() ? 0 : H, name_ + ": wrote far past the end of its d_sinks (" +
                                                               std::to_string(H) + " doubles, one per query head)");
      // d_bias: the bias's shape, for a plug-in that declares ATTNCHECK_CAP4_BIAS_GRAD (else data is NULL).
      std::optional<OutBuffer<S>> d_bias;
      if (p.bias && caps_.declares(Feature::bias_grad))
        d_bias.emplace(Shape{p.bias->B, p.bias->H, p.bias->T_q, p.bias->T_k}, name_, "d_bias");
      const attncheck_backward_call bcall{&call,
                                          in_tensor(d_out),
                                          dq.view(),
                                          dk.view(),
                                          dv.view(),
                                          p.sinks.empty() ? nullptr : d_sinks.data(),
                                          d_bias ? d_bias->view() : attncheck_tensor_out{}};
      char message[1024] = {};
      check_status(v2_->backward(&bcall, message, sizeof message), message, "backward");
      // dK and dV have k's shape: a plug-in that writes one per query head writes past them.
      const std::string group = "; a kv head's gradient sums over the " + std::to_string(q.shape().H / k.shape().H) +
                                " query heads of its group)";
      Gradients g;
      g.dq = dq.take(name_, "dq");
      g.dk = dk.take(name_, "dk", " (dk has k's shape [B,H_kv,T_k,D]" + group);
      g.dv = dv.take(name_, "dv", " (dv has v's shape [B,H_kv,T_k,D_v]" + group);
      if (!p.sinks.empty()) g.dsinks = take_d_sinks(d_sinks, H);
      if (d_bias)
        g.dbias = d_bias->take(name_, "d_bias",
                               " (d_bias has the bias's shape [B or 1, H or 1, T_q, T_k]: dS summed over the axes the "
                               "bias broadcasts over)");
      return g;
    });
  }

 private:
  // The call's inputs and options; `lengths`, `docs` (wire::doc_ids(p)) and `cells` (fill_cell_masks) must outlive
  // the call.
  template <class S>
  attncheck_call make_call(const Problem& p, const Tensor<S>& q, const Tensor<S>& k, const Tensor<S>& v,
                           const std::vector<std::int64_t>& lengths, const wire::DocIds& docs,
                           const CellMasks& cells, const LaidOutInputs<S>* laid = nullptr) const {
    attncheck_call call{};
    call.dtype = wire::dtype_code(p.dtype);
    call.alignment = wire::alignment_code(p.alignment);
    call.has_scale = p.scale ? 1 : 0;
    call.scale = p.scale.value_or(0.0);
    call.q = in_tensor(q);
    call.k = in_tensor(k);
    call.v = in_tensor(v);
    if (laid) {  // another layout (Problem::layout): the same values through other strides and buffers
      const auto view = [](const StridedView<S>& x) {
        attncheck_tensor_in t{x.data, {}, {}};
        for (int n = 0; n < 4; ++n) {
          t.shape[n] = x.shape[std::size_t(n)];
          t.strides[n] = x.strides[std::size_t(n)];
        }
        return t;
      };
      call.q = view(laid->q);
      call.k = view(laid->k);
      call.v = view(laid->v);
    }
    call.key_lengths = lengths.empty() ? nullptr : lengths.data();
    call.window = p.window ? std::int64_t(*p.window) : -1;
    // ABI 3's neutral values (the rest are 0 or NULL from the value-initialisation above), and the modifiers
    // a plug-in declared (check_within_capabilities refused any it did not). `p` outlives the call.
    call.causal = p.causal ? 1 : 0;
    // Masks beyond causal: neutral (0, -1, 0, NULL) unless the problem has them, which only a plug-in that declares
    // them gets. Document ids: k_doc_ids[b*T_k + j] = document_of(doc_bounds[b], j), q_doc_ids[b*T_q + i] the
    // document of query i (the one of key clamp(p, 0, T_k - 1)).
    call.prefix_length = p.prefix_length;
    call.window_right = p.window_right ? std::int64_t(*p.window_right) : -1;
    call.chunk_size = p.chunk_size;
    call.q_doc_ids = docs.q.empty() ? nullptr : docs.q.data();
    call.k_doc_ids = docs.k.empty() ? nullptr : docs.k.data();
    call.block_mask = cells.block_ptr;
    call.dense_mask = cells.dense_ptr;
    call.softcap = p.softcap.value_or(0.0);
    call.alibi_slopes = p.alibi_slopes.empty() ? nullptr : p.alibi_slopes.data();
    call.sinks = p.sinks.empty() ? nullptr : p.sinks.data();
    if (p.temperature) {  // ABI 4: the problem's own doubles, [B|1, H|1, T_q] row-major, 0 over a broadcast extent
      const QueryTemperature& t = *p.temperature;
      call.temperature = t.values.data();
      call.temperature_strides[0] = t.B == 1 ? 0 : t.H * t.T_q;
      call.temperature_strides[1] = t.H == 1 ? 0 : t.T_q;
      call.temperature_strides[2] = 1;
    }
    return call;
  }

  // The H gradients the backward wrote into `buf` (H entries, then the guard zone); throws
  // ImplementationError(wrong_size) for one left unwritten or a write past them.
  std::vector<double> take_d_sinks(const GuardedArray<double>& buf, std::size_t H) const {
    for (std::size_t i = H; i < buf.size(); ++i)
      if (!is_sentinel(buf[i]))
        throw ImplementationError(ImplementationError::Kind::wrong_size,
                                  name_ + ": wrote past the end of its d_sinks (element " + std::to_string(i) +
                                      " of " + std::to_string(H) + ": one per query head)");
    for (std::size_t h = 0; h < H; ++h)
      if (is_sentinel(buf[h]))
        throw ImplementationError(ImplementationError::Kind::wrong_size,
                                  name_ + ": returned OK but left d_sinks[" + std::to_string(h) + "] of " +
                                      std::to_string(H) + " unwritten (backward_call->d_sinks has one entry per "
                                      "query head when the call has sinks)");
    return {buf.begin(), buf.begin() + H};
  }

  // `fn` is "forward" or "backward". A status outside plugin.h's is no answer at all: whatever the plug-in
  // meant (a value of another ABI, garbage from a missing return), its outputs cannot be trusted.
  void check_status(std::int32_t st, char (&message)[1024], const char* fn) const {
    message[sizeof message - 1] = '\0';
    if (st != ATTNCHECK_OK && st != ATTNCHECK_ERROR && st != ATTNCHECK_UNSUPPORTED)
      throw ImplementationError(ImplementationError::Kind::protocol,
                                name_ + ": ABI error: its " + fn + " returned status " + std::to_string(st) +
                                    " (expected ATTNCHECK_OK 0, ATTNCHECK_ERROR 1 or ATTNCHECK_UNSUPPORTED 2)" +
                                    (message[0] ? std::string("; its message: ") + message : std::string()));
    if (st != ATTNCHECK_OK)
      throw ImplementationError(ImplementationError::Kind::error_status,
                                name_ + " returned status " + std::to_string(st) + " (" + status_name(st) +
                                    "): " + (message[0] ? message : "(no message)"));
  }

  std::string name_, description_;
  const attncheck_plugin_v1* table_;
  const attncheck_plugin_v2* v2_;
  Capabilities caps_;
};

// flags4b, where the table's own size reaches it (a table compiled before it declares none of its bits).
std::uint32_t flags4b_of(const attncheck_plugin_v1* table) {
  std::uint32_t size = 0, b = 0;
  std::memcpy(&size, reinterpret_cast<const char*>(table) + offsetof(attncheck_plugin_v4, table_size), sizeof size);
  if (size >= offsetof(attncheck_plugin_v4, flags4b) + sizeof b)
    std::memcpy(&b, reinterpret_cast<const char*>(table) + offsetof(attncheck_plugin_v4, flags4b), sizeof b);
  return b;
}

// ABI 4: the table's own size, read first and never read past (a field it does not reach is neutral), then
// flags4: the ATTNCHECK_CAP4_* bits of the feature table's rows (docs/abi4.md designs them), and no other; then
// flags4b the same way.
void validate_v4(const std::string& name, const attncheck_plugin_v1* table) {
  std::uint32_t size = 0;
  std::memcpy(&size, reinterpret_cast<const char*>(table) + offsetof(attncheck_plugin_v4, table_size), sizeof size);
  const std::string v3_hint =
      "; declare the table as attncheck_plugin_v4 and set both fields with ATTNCHECK_PLUGIN_V4_HEADER, or, if it is "
      "an attncheck_plugin_v3, set its abi_version to ATTNCHECK_PLUGIN_ABI_V3 (3)";
  if (size % 8 != 0 || size < ATTNCHECK_PLUGIN_V4_MIN_SIZE || size > 4096)
    throw SpecError(name + ": the plug-in's table has ABI version 4 but its table_size is " + std::to_string(size) +
                    " (expected a multiple of 8 from " + std::to_string(ATTNCHECK_PLUGIN_V4_MIN_SIZE) +
                    " to 4096: the sizeof of the attncheck_plugin_v4 it was compiled with)" + v3_hint);
  const auto* v4 = reinterpret_cast<const attncheck_plugin_v4*>(table);
  if (v4->flags4 & ~wire::kFeatureFlags4)
    throw SpecError(name + ": the plug-in's flags4 are " + hex(v4->flags4) +
                    (wire::kFeatureFlags4 ? " (expected ATTNCHECK_CAP4_* bits within " + hex(wire::kFeatureFlags4)
                                          : std::string(" (expected 0: this attncheck knows no ATTNCHECK_CAP4_* bit yet")) +
                    "; build the plug-in against this attncheck's attncheck/plugin.h)" + v3_hint);
  const std::uint32_t b = flags4b_of(table);
  if (b & ~wire::kFeatureFlags4b)
    throw SpecError(name + ": the plug-in's flags4b are " + hex(b) + " (expected ATTNCHECK_CAP4B_* bits within " +
                    hex(wire::kFeatureFlags4b) + "; build the plug-in against this attncheck's attncheck/plugin.h)");
}

// Refuses a table that claims what its version cannot carry, or whose ABI-2 tail is not what an ABI-2
// table holds (most likely an attncheck_plugin_v1 that says ATTNCHECK_PLUGIN_ABI_VERSION).
void validate_table(const std::string& name, std::uint32_t version, const attncheck_plugin_v1* table) {
  if (version == ATTNCHECK_PLUGIN_ABI_V1 && (table->flags & ~kAbi1Flags)) {
    std::string which;
    for (const auto& [bit, bit_name] : kAbi2FlagNames)
      if (table->flags & bit) which += std::string(which.empty() ? "" : ", ") + bit_name + " (" + hex(bit) + ")";
    throw SpecError(name + ": the plug-in's table has ABI version 1 but its flags are " + hex(table->flags) +
                    (which.empty() ? "" : ", with " + which + ", which only an ABI-2 table can carry") +
                    " (expected flags within " + hex(kAbi1Flags) +
                    " for ABI 1; declare an attncheck_plugin_v2 with abi_version ATTNCHECK_PLUGIN_ABI_V2 to "
                    "use the ABI-2 capabilities)");
  }
  if (version == ATTNCHECK_PLUGIN_ABI_V1) return;
  if (table->flags & ~kAbi2Flags)
    throw SpecError(name + ": the plug-in's flags are " + hex(table->flags) + " (expected a combination of "
                    "ATTNCHECK_CAP_* bits, within " + hex(kAbi2Flags) + ")");
  const auto* v2 = reinterpret_cast<const attncheck_plugin_v2*>(table);
  const std::string v1_hint =
      "; if the table is declared as an older attncheck_plugin_vN, set its abi_version to that N "
      "(ATTNCHECK_PLUGIN_ABI_V1 or _V2), not the version of the table it is not (" + std::to_string(version) + ")";
  const std::uint32_t max_empty_rows = version == ATTNCHECK_PLUGIN_ABI_V2 ? ATTNCHECK_EMPTY_ROWS_NAN
                                                                         : ATTNCHECK_EMPTY_ROWS_ANY;
  if (v2->empty_rows > max_empty_rows)
    throw SpecError(name + ": the plug-in's empty_rows is " + std::to_string(v2->empty_rows) +
                    " (expected 0 ATTNCHECK_EMPTY_ROWS_UNSPECIFIED, 1 ATTNCHECK_EMPTY_ROWS_ZERO or 2 "
                    "ATTNCHECK_EMPTY_ROWS_NAN" +
                    (version == ATTNCHECK_PLUGIN_ABI_V2 ? std::string(
                                                              "; 3 ATTNCHECK_EMPTY_ROWS_ANY needs an ABI-3 table")
                                                        : std::string(", or 3 ATTNCHECK_EMPTY_ROWS_ANY")) +
                    ")" + (version == ATTNCHECK_PLUGIN_ABI_V2 ? v1_hint : std::string()));
  if (v2->reserved != 0)
    throw SpecError(name + ": the plug-in's reserved field is " + std::to_string(v2->reserved) + " (expected 0)" +
                    v1_hint);
  Dl_info info{};
  if (v2->backward && ::dladdr(reinterpret_cast<void*>(v2->backward), &info) == 0)
    throw SpecError(name + ": the plug-in's backward pointer does not point into any loaded library" + v1_hint);
  if (version < ATTNCHECK_PLUGIN_ABI_V3) return;
  if (version >= ATTNCHECK_PLUGIN_ABI_V4) validate_v4(name, table);
  // ABI 3: the declarations. Anything outside them is refused with what was expected: a table whose tail is
  // not an ABI-3 tail (an ABI-2 table that says version 3) fails here too.
  const auto* v3 = reinterpret_cast<const attncheck_plugin_v3*>(table);
  const std::string v2_hint =
      version == ATTNCHECK_PLUGIN_ABI_V3
          ? "; if the table is declared as attncheck_plugin_v2, set its abi_version to ATTNCHECK_PLUGIN_ABI_V2 (2)"
          : "";
  const auto refuse = [&](const std::string& what) { throw SpecError(name + ": the plug-in's " + what + v2_hint); };
  if (v3->flags3 & ~kAbi3Flags)
    refuse("flags3 are " + hex(v3->flags3) + " (expected a combination of ATTNCHECK_CAP3_* bits, within " +
           hex(kAbi3Flags) + ")");
  if ((v3->flags3 & ATTNCHECK_CAP3_QUERY_DOCUMENTS) && !(v3->flags3 & ATTNCHECK_CAP3_DOCUMENTS))
    refuse("flags3 declare ATTNCHECK_CAP3_QUERY_DOCUMENTS without ATTNCHECK_CAP3_DOCUMENTS (query document ids "
           "come only with key document ids)");
  if (v3->cross_lengths & ~(ATTNCHECK_CROSS_Q_LE_K | ATTNCHECK_CROSS_Q_GE_K))
    refuse("cross_lengths is " + hex(v3->cross_lengths) +
           " (expected 0 for both, or ATTNCHECK_CROSS_Q_LE_K and/or ATTNCHECK_CROSS_Q_GE_K)");
  if (v3->head_dim_multiple < 0 || v3->head_dim_multiple > kMaxExtent)
    refuse("head_dim_multiple is " + std::to_string(v3->head_dim_multiple) + " (expected 0 or 1 for any D, or a "
           "multiple in [2, " + std::to_string(kMaxExtent) + "])");
  if (v3->max_head_dim < 0)
    refuse("max_head_dim is " + std::to_string(v3->max_head_dim) + " (expected 0 for no limit, or a positive D)");
  if (v3->num_head_dims > 4096 || (v3->num_head_dims > 0 && !v3->head_dims))
    refuse("head_dims list has " + std::to_string(v3->num_head_dims) + " entries" +
           (v3->head_dims ? "" : " but head_dims is NULL") + " (expected at most 4096, and a pointer to them)");
  for (std::size_t n = 0; n < v3->num_head_dims; ++n) {
    const attncheck_head_dim& d = v3->head_dims[n];
    if (d.k < 1 || d.k > kMaxExtent || d.v < 0 || d.v > kMaxExtent)
      refuse("head_dims[" + std::to_string(n) + "] is {" + std::to_string(d.k) + ", " + std::to_string(d.v) +
             "} (expected D_k in [1, " + std::to_string(kMaxExtent) + "] and D_v 0 (the same) or in that range)");
    if (d.v != 0 && d.v != d.k && !(v3->flags3 & ATTNCHECK_CAP3_V_HEAD_DIM))
      refuse("head_dims[" + std::to_string(n) + "] has D_v = " + std::to_string(d.v) + " != D_k = " +
             std::to_string(d.k) + " but its flags3 lack ATTNCHECK_CAP3_V_HEAD_DIM");
  }
  if (v3->num_page_sizes > 4096 || (v3->num_page_sizes > 0 && !v3->page_sizes))
    refuse("page_sizes list has " + std::to_string(v3->num_page_sizes) + " entries" +
           (v3->page_sizes ? "" : " but page_sizes is NULL") + " (expected at most 4096, and a pointer to them)");
  for (std::size_t n = 0; n < v3->num_page_sizes; ++n)
    if (v3->page_sizes[n] < 1 || v3->page_sizes[n] > kMaxSeqLen)
      refuse("page_sizes[" + std::to_string(n) + "] is " + std::to_string(v3->page_sizes[n]) + " (expected in [1, " +
             std::to_string(kMaxSeqLen) + "])");
  if (v3->page_layouts & ~(ATTNCHECK_PAGED_TOKEN_MAJOR | ATTNCHECK_PAGED_HEAD_MAJOR))
    refuse("page_layouts is " + hex(v3->page_layouts) + " (expected ATTNCHECK_PAGED_* bits)");
  if ((v3->flags3 & ATTNCHECK_CAP3_PAGED) && (v3->num_page_sizes == 0 || v3->page_layouts == 0))
    refuse("flags3 declare ATTNCHECK_CAP3_PAGED but its page_sizes list has " + std::to_string(v3->num_page_sizes) +
           " entries and its page_layouts are " + hex(v3->page_layouts) +
           " (expected at least one page size and ATTNCHECK_PAGED_TOKEN_MAJOR and/or ATTNCHECK_PAGED_HEAD_MAJOR)");
  if (v3->reserved3 != 0) refuse("reserved3 field is " + std::to_string(v3->reserved3) + " (expected 0)");
}

}  // namespace

Capabilities declared_capabilities(const attncheck_plugin_v1* table, const attncheck_plugin_v2* v2,
                                   const attncheck_plugin_v3* v3, const attncheck_plugin_v4* v4) {
  Capabilities caps;
  caps.dtypes.clear();
  for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    if (table->dtypes & wire::dtype_code(t)) caps.dtypes.push_back(t);
  caps.alignments.clear();
  if (table->alignments & ATTNCHECK_ALIGN_TOP_LEFT || table->alignments == 0)
    caps.alignments.push_back(CausalAlignment::TopLeft);
  if (table->alignments & ATTNCHECK_ALIGN_BOTTOM_RIGHT) caps.alignments.push_back(CausalAlignment::BottomRight);
  caps.returns_weights = table->flags & ATTNCHECK_CAP_RETURNS_WEIGHTS;
  caps.custom_scale = table->flags & ATTNCHECK_CAP_CUSTOM_SCALE;
  caps.cross_lengths = table->flags & ATTNCHECK_CAP_CROSS_LENGTHS;
  caps.nonfinite_safe = table->flags & ATTNCHECK_CAP_NONFINITE_SAFE;
  if (table->max_T > 0) caps.max_T = table->max_T;
  // An ABI-1 table cannot set the ABI-2 bits (the loader refused it), so these stay off for it.
  for (const FeatureRow& f : kFeatures)
    if (f.abi_flag) caps.features.set(f.id, table->flags & f.abi_flag);
  caps.features.set(Feature::backward, v2 && v2->backward);
  if (v2 && v2->empty_rows != ATTNCHECK_EMPTY_ROWS_UNSPECIFIED)
    caps.empty_rows = v2->empty_rows == ATTNCHECK_EMPTY_ROWS_NAN   ? EmptyRows::nan
                      : v2->empty_rows == ATTNCHECK_EMPTY_ROWS_ANY ? EmptyRows::any
                                                                   : EmptyRows::zero;
  if (v3) {  // the declarations (validate_table checked every value)
    caps.abi3_flags = v3->flags3;
    wire::set_abi3_bools(caps, v3->flags3);  // the LSE, sinks, softcap, ALiBi, paged, the mask families
    if (v3->cross_lengths != 0) {
      caps.q_shorter = v3->cross_lengths & ATTNCHECK_CROSS_Q_LE_K;
      caps.q_longer = v3->cross_lengths & ATTNCHECK_CROSS_Q_GE_K;
    }
    caps.head_dim_multiple = std::max<Index>(v3->head_dim_multiple, 1);
    caps.max_head_dim = v3->max_head_dim;
    for (std::size_t n = 0; n < v3->num_head_dims; ++n) {
      const attncheck_head_dim& d = v3->head_dims[n];
      if (d.v == 0 || d.v == d.k)
        caps.head_dims.push_back(d.k);
      else
        caps.head_dim_pairs.emplace_back(d.k, d.v);
    }
    for (std::size_t n = 0; n < v3->num_page_sizes; ++n) caps.page_sizes.push_back(v3->page_sizes[n]);
    caps.page_layouts = v3->page_layouts;
  }
  // validate_v4 checked the size reaches flags4, and the bits of both words
  if (v4) wire::set_flags4_bools(caps, v4->flags4, flags4b_of(table));
  return caps;
}

std::string as_file_path(const std::string& path) { return path.find('/') == std::string::npos ? "./" + path : path; }

ImplementationPtr load_c_plugin(const std::string& path, const std::string& name) {
  const std::string file = as_file_path(path);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    throw SpecError(name + ": no such file " + file + " (expected a shared library built against attncheck/plugin.h)");
  // RTLD_NOW: an unresolved symbol is reported here, as a load error, not as a crash in the middle of a law.
  void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw SpecError(name + ": cannot load " + file + ": " + ::dlerror());
  // The handle is never closed: a plug-in may leave threads or atexit handlers that point into its code.
  using Entry = const attncheck_plugin_v1* (*)();
  void* sym = ::dlsym(handle, ATTNCHECK_PLUGIN_ENTRY_NAME);
  if (!sym)
    throw SpecError(name + ": " + file +
                    " has no symbol " ATTNCHECK_PLUGIN_ENTRY_NAME
                    "; a plug-in exports `ATTNCHECK_PLUGIN_EXPORT const attncheck_plugin_v1* attncheck_plugin(void)` "
                    "(see attncheck/plugin.h)");
  const attncheck_plugin_v1* table = reinterpret_cast<Entry>(sym)();
  if (!table) throw SpecError(name + ": " ATTNCHECK_PLUGIN_ENTRY_NAME "() returned NULL (expected its table)");
  // The version is the first field of every version of the table, so it can be read before trusting the rest.
  std::uint32_t version = 0;
  std::memcpy(&version, table, sizeof version);
  if (version < ATTNCHECK_PLUGIN_ABI_V1 || version > ATTNCHECK_PLUGIN_ABI_V4)
    throw SpecError(name + ": the plug-in has ABI version " + std::to_string(version) +
                    " but this attncheck loads ABI version 1, 2, 3 or 4; rebuild it against this attncheck's "
                    "attncheck/plugin.h");
  if (!table->forward) throw SpecError(name + ": the plug-in's table has no forward function");
  if (table->dtypes == 0 || (table->dtypes & ~0xFu))
    throw SpecError(name + ": the plug-in's dtypes are " + std::to_string(table->dtypes) +
                    " (expected a non-empty combination of ATTNCHECK_DTYPE_* bits)");
  if (table->alignments & ~0x3u)
    throw SpecError(name + ": the plug-in's alignments are " + std::to_string(table->alignments) +
                    " (expected a combination of ATTNCHECK_ALIGN_* bits)");
  if (!table->name) throw SpecError(name + ": the plug-in's table has no name");
  if (table->max_T < 0)
    throw SpecError(name + ": the plug-in's max_T is " + std::to_string(table->max_T) +
                    " (expected 0 for no limit, or the largest T_q and T_k it accepts)");
  validate_table(name, version, table);
  return std::make_shared<CPlugin>(
      name, table, version >= ATTNCHECK_PLUGIN_ABI_V2 ? reinterpret_cast<const attncheck_plugin_v2*>(table) : nullptr,
      version >= ATTNCHECK_PLUGIN_ABI_V3 ? reinterpret_cast<const attncheck_plugin_v3*>(table) : nullptr,
      version >= ATTNCHECK_PLUGIN_ABI_V4 ? reinterpret_cast<const attncheck_plugin_v4*>(table) : nullptr);
}


void check_within_capabilities(const Problem& p, const Capabilities& caps, const std::string& name,
                               bool backward_call) {
  // The one capability check (needs_outside), less what a call may ask of anyone (the LSE: an implementation
  // that does not declare it returns none).
  std::string needs;
  for (const Need& n : call_needs(p, caps, !backward_call))
    if (!n.feature) {
      needs += (needs.empty() ? "" : ", ") + n.words;
    } else if (const FeatureRow& f = feature(*n.feature); !f.ignored_when_undeclared) {  // how it is declared
      needs += (needs.empty() ? "" : ", ") + n.words + " (" + std::string(f.c_name) + " in a C plug-in's table, " +
               std::string(f.name) + "=True in an exec client's serve())";
    }
  if (!needs.empty())
    throw std::logic_error(name + ": this call needs " + needs +
                           ", which the implementation does not declare (a law or a test sent a call outside its "
                           "capabilities; it declares " + describe_capabilities(caps) + ")");
  // What the codecs need of the call's fields (one entry per batch entry or query head, masks of the call's shape:
  // the plug-in reads them through the strides we derive) is the one check of a call's fields.
  if (p.layout != InputLayout::contiguous && p.paged)
    throw std::logic_error(name + ": a paged call with a layout (paged K and V come as pools)");
  try {
    check_call(name.c_str(), p);
  } catch (const std::invalid_argument& e) {  // ShapeError, ValueError
    throw std::logic_error(std::string("this call's fields do not fit it: ") + e.what());
  }
}

}  // namespace attncheck::detail
