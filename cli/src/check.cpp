// `attncheck check`: replays the corpus, runs each law with RapidCheck, writes the reports and prints the
// summary table; `--replay FILE` re-checks one stored case; `attncheck list`.
#include "check.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <string_view>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include "attncheck/mutants.hpp"
#include "attncheck/reports.hpp"
#include "progress.hpp"

namespace attncheck::cli {
namespace fs = std::filesystem;
using reports::Json;
namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fs", s);
  return buf;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string lpad(const std::string& s, std::size_t width) {
  return s.size() < width ? std::string(width - s.size(), ' ') + s : s;
}

DType dtype_option(const std::string& name) {
  if (const auto t = parse_dtype(name)) return *t;
  throw UsageError("--dtype: expected float32, float64, float16 or bfloat16 but got \"" + name + "\"");
}

// Refuses a dtype `impl` does not declare, naming the ones it accepts; `after` says what that means for the run.
void check_dtype_declared(const Implementation& impl, DType dtype, const char* after) {
  if (impl.capabilities().supports(dtype)) return;
  std::string accepted;
  for (const DType t : impl.capabilities().dtypes) accepted += (accepted.empty() ? "" : ", ") + std::string(dtype_name(t));
  throw UsageError("--dtype: " + impl.name() + " accepts " + (accepted.empty() ? "no dtype" : accepted) + " but got " +
                   std::string(dtype_name(dtype)) + "; " + after);
}

std::vector<const Law*> select_laws(const CheckOptions& o, const Registry& reg) {
  if (reg.laws.empty()) throw std::logic_error("this build has no laws registered");
  std::vector<const Law*> out;
  if (o.properties.empty()) {
    for (const Law& l : reg.laws) out.push_back(&l);
    return out;
  }
  for (const std::string& name : o.properties) {
    const Law* law = find_law(reg, name);
    if (!law) {
      std::string names;
      for (const Law& l : reg.laws) names += (names.empty() ? "" : ", ") + l.name;
      throw UsageError("--property: unknown law \"" + name + "\"; expected one of: " + names);
    }
    if (std::find(out.begin(), out.end(), law) == out.end()) out.push_back(law);
  }
  return out;
}

// A name read from a file, shown as JSON (quoted, control characters escaped) and cut short.
std::string shown(const std::string& name) {
  std::string s = Json(name).dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// The largest head dimension (D or D_v) an implementation declares by value: its list, or a maximum (0: it
// declares none, any D is accepted). A maximum above kMaxDeclaredDraw is drawn up to that.
constexpr Index kMaxDeclaredDraw = 1024;
Index declared_top_head_dim(const Capabilities& caps) {
  Index top = 0;
  if (caps.lists_head_dims()) {
    for (const Index d : caps.head_dims) top = std::max(top, d);
    if (caps.declares(Feature::v_head_dim))
      for (const auto& [k, v] : caps.head_dim_pairs) top = std::max({top, k, v});
  } else if (caps.max_head_dim > 0) {
    top = std::min(caps.max_head_dim, kMaxDeclaredDraw);
  }
  return top;
}

// "64, 128, 192/128": the declared head dimensions (and D_k/D_v pairs) at most max_D, or above it with `above`.
std::string declared_head_dims(const Capabilities& caps, Index max_D, bool above) {
  std::string s;
  const auto add = [&](const std::string& d) { s += (s.empty() ? "" : ", ") + d; };
  for (const Index d : caps.head_dims)
    if ((d > max_D) == above && caps.supports_head_dim(d)) add(std::to_string(d));
  if (caps.declares(Feature::v_head_dim))
    for (const auto& [k, v] : caps.head_dim_pairs)
      if ((std::max(k, v) > max_D) == above) add(std::to_string(k) + "/" + std::to_string(v));
  return s;
}

}  // namespace

const Law* find_law(const Registry& reg, std::string_view name) {
  const auto it = std::find_if(reg.laws.begin(), reg.laws.end(), [&](const Law& l) { return l.name == name; });
  return it == reg.laws.end() ? nullptr : &*it;
}

const Law& law_named_in_file(const Registry& reg, const std::string& name, const std::string& where) {
  if (const Law* law = find_law(reg, name)) return *law;
  throw UsageError(where + " is " + shown(name) +
                   "; expected the name of a law of this build (`attncheck list` shows them)");
}

void check_name_in_file(const std::string& name, const std::string& where) {
  const bool printable = std::none_of(name.begin(), name.end(), [](char c) {
    return (static_cast<unsigned char>(c) < 0x20) || c == 0x7f;
  });
  if (name.empty() || name.size() > 4096 || !printable)
    throw UsageError(where + " is " + shown(name) +
                     "; expected a name of 1 to 4096 bytes on one line, without control characters");
}

Shard shard_option(const std::string& flag, bool environment) {
  Shard sh;
  std::string text = flag, source = "--shard";
  const char* total = environment ? std::getenv("GTEST_TOTAL_SHARDS") : nullptr;
  const char* index = environment ? std::getenv("GTEST_SHARD_INDEX") : nullptr;
  if (text.empty() && total && index && *total && *index) {
    text = std::string(index) + "/" + total;
    source = "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS";
  }
  // GoogleTest's protocol: a runner that understands sharding touches the status file whenever it is named.
  if (const char* status = environment ? std::getenv("GTEST_SHARD_STATUS_FILE") : nullptr; status && *status) {
    try {
      reports::touch_file(status, "the file a GoogleTest runner names for a sharded test to create");
    } catch (const reports::FileError& e) {
      throw UsageError(std::string("GTEST_SHARD_STATUS_FILE: ") + e.what());
    }
  }
  if (text.empty()) return sh;
  const auto slash = text.find('/');
  const auto number = [](const std::string& t, long& v) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) return false;
    v = std::stol(t);
    return true;
  };
  long i = 0, n = 0;
  if (slash == std::string::npos || !number(text.substr(0, slash), i) || !number(text.substr(slash + 1), n) || n < 1 ||
      i >= n)
    throw UsageError(source + ": expected I/N, shard I (from 0) of N shards with 0 <= I < N (e.g. 0/4), but got \"" +
                     text + "\"");
  sh.given = true;
  sh.index = int(i);
  sh.count = int(n);
  return sh;
}

namespace {

// "B,H,T_q,T_k,D" (--shape) as five positive extents.
std::array<Index, 5> parse_shape(const std::string& text) {
  std::array<Index, 5> shape{};
  std::size_t n = 0, pos = 0;
  const auto bad = [&] {
    return UsageError("--shape: expected five positive integers B,H,T_q,T_k,D (e.g. 1,8,4096,4096,64) but got \"" +
                      text + "\"");
  };
  while (pos <= text.size()) {
    const std::size_t end = std::min(text.find(',', pos), text.size());
    const std::string part = text.substr(pos, end - pos);
    if (n == 5 || part.empty() || part.find_first_not_of("0123456789") != std::string::npos || part.size() > 9) throw bad();
    shape[n++] = std::stoll(part);
    if (shape[n - 1] < 1) throw bad();
    pos = end + 1;
  }
  if (n != 5) throw bad();
  // The ranges of --max-B, --max-H, --max-T and --max-D.
  static const char* const names[] = {"B", "H", "T_q", "T_k", "D"};
  for (std::size_t i = 0; i < 5; ++i) {
    const Index hi = i == 2 || i == 3 ? kMaxSeqLen : kMaxExtent;
    if (shape[i] > hi)
      throw UsageError("--shape " + text + ": " + names[i] + " = " + std::to_string(shape[i]) +
                       " is above the largest accepted, " + std::to_string(hi) + " (as --max-" +
                       (i == 2 || i == 3 ? "T" : names[i]) + ")");
  }
  return shape;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(1ull << 30));
  return buf;
}

// Refuses bounds whose largest case cannot be held in this machine's memory, before a law runs: otherwise
// the first such case ends the run in std::bad_alloc (or the kernel's OOM killer). The estimate is a floor:
// q and the output [B,H,T_q,D], k and v [B,H,T_k,D] (a case may draw H_kv = H), as doubles, once. A law's
// second problem, the dtype's copies, the oracle and a materialised case's [T_q,T_k] weights come on top.
void check_fits_in_memory(const GenConfig& g, const Capabilities& caps, const std::string& what) {
  double B, H, T_q, T_k, D;
  if (g.shape) {
    B = double((*g.shape)[0]), H = double((*g.shape)[1]), T_q = double((*g.shape)[2]), T_k = double((*g.shape)[3]),
    D = double((*g.shape)[4]);
  } else {
    const double T = double(std::min<Index>(std::max({g.max_T, g.max_T_tail, g.long_lengths.empty() ? Index{0} : g.long_lengths.back()}),
                                            caps.max_T > 0 ? caps.max_T : kMaxSeqLen));
    B = double(g.max_B), H = double(g.max_H), T_q = T, T_k = T, D = double(g.max_D);
  }
  const double need = 8.0 * (2 * B * H * T_q * D + 2 * B * H * T_k * D);
  // Paged K and V: a pool holds whole pages of the declared size however few keys a case has, so the largest
  // declared page size sets it: B·ceil(T_k / page) pages and up to 3 spare ones of [page, H_kv, D], for K and
  // for V, held in the frame, by the child and at the call's dtype (as doubles, 4 copies: a floor).
  double pool_need = 0;
  Index page_size = 0;
  if (caps.declares(Feature::paged) && !caps.page_sizes.empty()) {
    page_size = *std::max_element(caps.page_sizes.begin(), caps.page_sizes.end());
    const double H_kv = g.max_H_kv > 0 && !g.shape ? std::min(H, double(g.max_H_kv)) : H;
    const double pool_pages = B * std::ceil(T_k / double(page_size)) + 3;
    pool_need = 4 * 2 * 8.0 * pool_pages * double(page_size) * H_kv * D;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;  // unknown: let the run try
  double have = double(pages) * double(page);
  if (rlimit lim{}; ::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    have = std::min(have, double(lim.rlim_cur));  // ulimit -v: the address space this process may have
  if (need + pool_need <= have) return;
  if (need <= have)  // the case fits; its pages do not
    throw UsageError(what + ": the implementation declares pages of " + std::to_string(page_size) +
                     " keys (its largest page size), and at B <= " + std::to_string(Index(B)) + ", H_kv <= " +
                     std::to_string(Index(g.max_H_kv > 0 && !g.shape ? std::min(H, double(g.max_H_kv)) : H)) +
                     ", T_k <= " + std::to_string(Index(T_k)) + ", D <= " + std::to_string(Index(D)) +
                     ", a case's K and V page pools need at least " + gib(pool_need) +
                     " (whole pages however few keys a case has, as doubles, in the frame, the child and the "
                     "call), but this machine allows " + gib(have) +
                     "; declare smaller page sizes (expected pools that fit in memory), or choose a smaller " +
                     (g.shape ? "--shape" : "--max-B, --max-Hkv or --max-D"));
  char shape[160];
  std::snprintf(shape, sizeof shape, "B=%.0f H=%.0f T_q=%.0f T_k=%.0f D=%.0f", B, H, T_q, T_k, D);
  throw UsageError(what + ": " + (g.shape ? "every case has the shape " : "the largest case these bounds allow has ") +
                   shape + ", which needs at least " + gib(need) +
                   " (q, k, v and the output as doubles, before any copy), but this machine has " + gib(have) +
                   " of memory; choose a smaller " + (g.shape ? "--shape" : "--max-B, --max-H, --max-T or --max-D"));
}

// Why the stored case `s` cannot be replayed on `impl` ("" when it can): a capability the case needs and the
// implementation does not declare, or a law that does not apply to it. The generators never draw such a
// call; calling it anyway would blame the implementation for attncheck's choice.
std::string replay_refusal(const Law& law, const Implementation& impl, const reports::StoredCounterexample& s) {
  const Capabilities& caps = impl.capabilities();
  std::vector<std::string> needs = needs_outside(s.lcase.problem, caps);
  if (s.lcase.variant)
    for (std::string& n : needs_outside(*s.lcase.variant, caps))
      if (std::find(needs.begin(), needs.end(), n) == needs.end()) needs.push_back(std::move(n));
  if (!needs.empty()) {
    std::string list;
    for (const std::string& n : needs) list += (list.empty() ? "" : ", ") + n;
    return "the stored case needs " + list + ", which " + impl.name() + " does not declare (it declares " +
           describe_capabilities(caps) + ")";
  }
  GenConfig g = s.gen;
  g.dtype = s.dtype;
  g.caps = caps;
  if (law.not_applicable)
    if (const std::string why = law.not_applicable(g); !why.empty())
      return "the law " + law.name + " does not apply to " + impl.name() + ": " + why;
  return "";
}

// The counterexample's geometry on one line: "B=1 H=1 T_q=1 T_k=17 D=1 (bottom-right)".
// The call's other settings that are not their defaults (the cause is often one of them, not the shape): an
// explicit scale, key lengths, the window, softcap, ALiBi slopes, sinks, paging and the memory layout.
std::string call_keywords_line(const Problem& p) {
  std::string s;
  const auto add = [&](const std::string& what) { s += (s.empty() ? "" : "; ") + what; };
  const auto list = [](const auto& values, auto&& text) {
    std::string out = "{";
    for (std::size_t n = 0; n < values.size(); ++n) out += (n ? ", " : "") + text(values[n]);
    return out + "}";
  };
  const auto number = [](double x) { return format_number(x, 6); };
  if (p.scale) add("scale " + number(*p.scale));
  if (!p.key_lengths.empty()) add("key lengths " + list(p.key_lengths, [](Index x) { return std::to_string(x); }));
  if (p.window) add("window " + std::to_string(*p.window));
  if (p.softcap) add("softcap " + number(*p.softcap));
  if (!p.alibi_slopes.empty()) add("ALiBi slopes " + list(p.alibi_slopes, number));
  if (!p.sinks.empty()) add("sinks " + list(p.sinks, number));
  if (p.bias)
    add("bias [" + std::to_string(p.bias->B) + "," + std::to_string(p.bias->H) + "," + std::to_string(p.bias->T_q) +
        "," + std::to_string(p.bias->T_k) + "] " + list(p.bias->values, number));
  if (p.rope)
    add(std::string("rope ") + (p.rope->variant == RopeVariant::half_split ? "half-split" : "interleaved") +
        ", rotary_dim " + std::to_string(p.rope->rotary_dim) + ", base " + number(p.rope->base) +
        (p.rope->factor != 1 ? ", factor " + number(p.rope->factor) : std::string()) + ", q positions " +
        list(p.rope->q_positions, [](Index x) { return std::to_string(x); }) + ", k positions " +
        list(p.rope->k_positions, [](Index x) { return std::to_string(x); }));
  if (p.qk_norm)
    add(std::string("QK-norm of ") +
        (p.qk_norm->q_weight.empty()   ? "k"
         : p.qk_norm->k_weight.empty() ? "q"
                                       : "q and k") +
        ", eps " + number(p.qk_norm->eps) + (p.qk_norm->eps_outside ? " outside the root" : "") +
        (p.qk_norm->q_weight.empty() ? std::string() : ", q weights " + list(p.qk_norm->q_weight, number)) +
        (p.qk_norm->k_weight.empty() ? std::string() : ", k weights " + list(p.qk_norm->k_weight, number)));
  if (p.temperature)
    add("temperature [" + std::to_string(p.temperature->B) + "," + std::to_string(p.temperature->H) + "," +
        std::to_string(p.temperature->T_q) + "] " + list(p.temperature->values, number));
  if (p.dropout)
    add("dropout p = " + number(p.dropout->p) + ", seed " + std::to_string(p.dropout->seed) + ", offset " +
        std::to_string(p.dropout->offset));
  if (p.paged)
    add("paged: pages of " + std::to_string(p.paged->page_size) + ", " + page_layout_name(p.paged->layout));
  if (p.layout != InputLayout::contiguous) add("layout " + input_layout_name(p.layout));
  return s;
}

std::string shape_line(const Problem& p) {
  const Shape& q = p.q.shape();
  std::string s = "B=" + std::to_string(q.B) + " H=" + std::to_string(q.H);
  const std::string dims = " D=" + std::to_string(q.D) + (p.v_dim() != q.D ? " D_v=" + std::to_string(p.v_dim()) : "");
  if (p.k.shape().T == q.T)
    s += " T=" + std::to_string(q.T) + dims;
  else
    s += " T_q=" + std::to_string(q.T) + " T_k=" + std::to_string(p.k.shape().T) + dims +
         (p.alignment == CausalAlignment::TopLeft ? " (top-left)" : " (bottom-right)");
  if (const std::string masks = mask_families_line(p); !masks.empty()) s += "; " + masks;
  if (const std::string keywords = call_keywords_line(p); !keywords.empty()) s += "; " + keywords;
  return s;
}

bool same_bounds(const GenConfig& a, const GenConfig& b) {
  return a.dtype == b.dtype && a.max_B == b.max_B && a.max_H == b.max_H && a.max_H_kv == b.max_H_kv &&
         a.min_T == b.min_T && a.max_T == b.max_T && a.max_T_tail == b.max_T_tail && a.max_D == b.max_D &&
         a.shape == b.shape && a.long_lengths == b.long_lengths && a.long_max_T_q == b.long_max_T_q;
}

// Replays the stored counterexamples of this law first, as Hypothesis's example database does: a fixed bug
// stays fixed only if the case that showed it is tried again.
std::optional<reports::LawReport> replay_corpus(const Law& law, const Implementation& impl, const GenConfig& gen,
                                                const reports::Corpus& corpus, std::ostream& err) {
  const Capabilities& caps = impl.capabilities();
  GenConfig g = gen;
  g.caps = caps;
  if ((law.not_applicable && !law.not_applicable(g).empty()) || !caps.supports(gen.dtype)) return std::nullopt;
  for (const fs::path& file : corpus.entries(law.name)) {
    try {
      const reports::StoredCounterexample s = reports::read_counterexample(file);
      if (s.law != law.name || s.dtype != gen.dtype) continue;
      if (!s.reproduce.empty()) {
        try {
          check_reproduce_string(s.reproduce, law.name);
        } catch (const std::invalid_argument& e) {
          throw reports::FormatError(std::string("\"reproduce\": ") + e.what());
        }
      }
      if (const std::string why = replay_refusal(law, impl, s); !why.empty()) {
        err << "attncheck: warning: skipping corpus entry " << file.string() << ": " << why << "\n";
        continue;
      }
      auto v = evaluate_case(law, impl, s.lcase);
      if (!v) continue;
      reports::LawReport r;
      r.result.law = law.name;
      r.result.implementation = impl.name();
      r.result.dtype = gen.dtype;
      r.result.status = LawStatus::falsified;
      r.result.seed = s.seed;
      r.result.cases_run = s.cases_run;
      r.result.shrink_steps = s.shrink_steps;
      r.result.calls = s.calls;  // the figures of the run that found it, so a rerun writes the same report
      // The string replays RapidCheck's choices only under the bounds it was recorded with.
      if (same_bounds(s.gen, gen)) r.result.reproduce = s.reproduce;
      r.result.minimal_case = s.lcase;
      r.result.violation = std::move(v);
      r.found_by = file.string();
      return r;
    } catch (const std::exception& e) {
      err << "attncheck: warning: skipping corpus entry " << file.string() << ": " << e.what() << "\n";
    }
  }
  return std::nullopt;
}

RunOptions run_options(int cases, std::uint64_t seed, int max_size, const GenConfig& gen, const std::string& reproduce) {
  RunOptions ro;
  ro.cases = cases;
  ro.seed = seed;
  ro.max_size = max_size;
  ro.gen = gen;
  ro.reproduce = reproduce;
  return ro;
}

void print_violation(const Violation& v, std::ostream& out) {
  out << "  " << v.message << "\n";
  if (!v.worst_index.empty()) {
    out << "  worst " << v.quantity << " [";
    for (std::size_t n = 0; n < v.worst_index.size(); ++n) out << (n ? "," : "") << v.worst_index[n];
    out << "]";
    const auto at = [&](const std::optional<Tensor<double>>& t) -> std::optional<std::string> {
      const auto& w = v.worst_index;
      if (!t || w.size() != 4) return std::nullopt;
      const Shape& s = t->shape();
      if (w[0] >= s.B || w[1] >= s.H || w[2] >= s.T || w[3] >= s.D) return std::nullopt;
      return reports::number_to_json((*t)(w[0], w[1], w[2], w[3])).dump();
    };
    const auto expected = at(v.expected), actual = at(v.actual);
    if (expected && actual) out << ": expected " << *expected << ", actual " << *actual;
    else if (actual) out << ": " << *actual;
    out << "\n";
  }
  out << "  magnitude " << reports::number_to_json(v.magnitude).dump();
  if (v.tolerance > 0) out << ", tolerance " << reports::number_to_json(v.tolerance).dump();
  else if (v.quantity != "call") out << ", exact law (no tolerance)";
  out << "\n";
  if (v.call) out << "  failing call: " << v.call_what << " (q " << to_string(v.call->q.shape()) << ", k "
                  << to_string(v.call->k.shape()) << ")\n";
}

bool same_violation(const Violation& a, const Violation& b) {
  return a.message == b.message && a.worst_index == b.worst_index &&
         reports::number_to_json(a.magnitude) == reports::number_to_json(b.magnitude);
}

int run_replay(const CheckOptions& o, const Registry& reg, std::ostream& out) {
  reports::StoredCounterexample s;
  try {
    s = reports::read_counterexample(o.replay);
  } catch (const std::exception& e) {
    throw UsageError(std::string("--replay: ") + e.what());
  }
  const Law* found = find_law(reg, s.law);
  if (!found)
    throw UsageError("--replay: " + o.replay + " is a counterexample to the law \"" + s.law +
                     "\", which this build does not have (`attncheck list` shows the laws)");
  const Law& law = *found;
  // A data file never starts a program: a counterexample from a CI artifact or a colleague names its
  // implementation, but only the command line may run a plug-in or a command.
  if (o.impl.empty() && (s.implementation.starts_with("exec:") || s.implementation.starts_with("plugin:")))
    throw UsageError("--replay: " + o.replay + " was recorded for " + s.implementation +
                     ", which attncheck does not start because a file names it; to replay the case on it, name it "
                     "on the command line: attncheck check --impl " + reports::shell_quote(s.implementation) + " --replay " +
                     reports::shell_quote(o.replay));
  if (!s.reproduce.empty()) {
    try {
      check_reproduce_string(s.reproduce, law.name);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--replay: " + o.replay + ": \"reproduce\": " + e.what());
    }
  }
  const ImplementationPtr impl = resolve_implementation(o.impl.empty() ? s.implementation : o.impl, reg, {.call_timeout_s = o.timeout});
  if (const std::string why = replay_refusal(law, *impl, s); !why.empty())
    throw UsageError("--replay: " + o.replay + ": " + why);
  if (!s.reproduce.empty()) check_fits_in_memory(s.gen, impl->capabilities(), "--replay: " + o.replay + ": \"generator\"");
  out << "replaying " << law.name << " on " << impl->name() << " with the case stored in " << o.replay << " ("
      << dtype_name(s.lcase.problem.dtype) << ", " << shape_line(s.lcase.problem) << ")\n";

  std::optional<Violation> v;
  try {
    v = evaluate_case(law, *impl, s.lcase);
  } catch (const std::invalid_argument& e) {  // the law refused the stored case (a parameter out of range)
    throw UsageError("--replay: " + o.replay + ": " + e.what());
  }
  if (v) {
    out << "falsified again";
    if (s.violation) out << (same_violation(*v, *s.violation) ? " (the same violation as recorded)" : " (differently from the record)");
    out << ":\n";
    print_violation(*v, out);
  } else {
    out << "holds now: the stored case no longer breaks the law\n";
  }

  bool regenerated_fails = false;
  if (!s.reproduce.empty()) {
    const RunOptions ro = run_options(s.cases, s.seed, s.max_size, s.gen, s.reproduce);
    const LawResult r = run_law(law, *impl, ro);
    regenerated_fails = r.status == LawStatus::falsified;
    const bool same_case = r.minimal_case && reports::to_json(*r.minimal_case) == reports::to_json(s.lcase);
    if (regenerated_fails)
      out << "the reproduce string regenerates " << (same_case ? "the same case" : "a different case (the generators changed since?)")
          << " and it falsifies the law\n";
    else
      out << "the reproduce string's case does not falsify the law\n";
  }
  return (v || regenerated_fails) ? kFalsified : kAllHeld;
}

}  // namespace

// The laws table of docs/laws.md, from the registry: number, name (marked (bwd) for a gradient law), what must
// hold and the tolerance, a `|` in a cell escaped.
std::string laws_markdown_table(const std::vector<Law>& laws) {
  const auto cell = [](const std::string& text) {
    std::string out;
    for (const char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
    return out;
  };
  std::string table = "| # | law | what must hold | tolerance |\n|---|---|---|---|\n";
  for (const Law& l : laws)
    table += "| " + cell(l.doc.number) + " | `" + l.name + "`" + (l.needs_backward ? " (bwd)" : "") + " | " +
             cell(l.doc.holds) + " | " + cell(l.doc.tolerance) + " |\n";
  return table;
}

int run_list(const Registry& reg, std::ostream& out, bool markdown) {
  if (markdown) {
    out << laws_markdown_table(reg.laws);
    return kAllHeld;
  }
  std::size_t width = 0;
  for (const Law& l : reg.laws) width = std::max(width, l.name.size());
  for (const auto& p : reg.builtins) width = std::max(width, p->name().size());
  width += 2;
  // Gradient laws are marked: they need a backward pass, and are not applicable without one.
  for (const Law& l : reg.laws)
    out << pad(l.name, width) << (l.needs_backward ? "law (bwd)  " : "law        ") << l.summary << "\n";
  for (const auto& p : reg.builtins) {
    const std::string& n = p->name();
    const std::string kind = n.starts_with("mutant:") ? "mutant" : n.starts_with("control:") ? "control" : "reference";
    out << pad(n, width) << pad(kind, 11) << p->description() << "\n";
  }
  return kAllHeld;
}

namespace {

// A check run, planned before any law runs: the laws (this shard's), the implementation, the generators' bounds and
// what the header says about them.
struct CheckPlan {
  DType dtype = DType::f32;
  reports::Formats formats;
  std::vector<const Law*> selected;
  std::vector<std::string> run_law_names;  // every law of the run, this shard's and the others'
  Shard shard;
  ImplementationPtr impl;
  CheckOptions bounds;  // the options, with the long-context defaults for the bounds not given
  reports::RunInfo run;
  std::string long_note, head_dim_note, jobs_note;  // the header's lines beyond the first two
  int jobs = 1;
  fs::path report_dir;
  std::optional<reports::Corpus> corpus;
};

// The laws --property selects, this shard's share of them (every N-th from its index on: N shards check together
// exactly the laws, and with the same seed the cases, one run would), and every law of the run.
void select_plan_laws(CheckPlan& plan, const CheckOptions& o, const Registry& reg) {
  if (!o.reproduce.empty() && o.properties.size() != 1)
    throw UsageError("--reproduce: expected exactly one --property LAW, the law whose reproduce string it is");
  plan.selected = select_laws(o, reg);
  // GoogleTest's variables shard a run of the laws, not the re-check of one law's case (--reproduce).
  plan.shard = shard_option(o.shard, o.shard_from_environment && o.reproduce.empty());
  for (const Law* l : plan.selected) plan.run_law_names.push_back(l->name);
  if (plan.shard.given) {
    if (!o.reproduce.empty()) throw UsageError("--shard: --reproduce re-checks one law's case; it cannot be sharded");
    std::vector<const Law*> mine;
    for (std::size_t k = 0; k < plan.selected.size(); ++k)
      if (int(k % std::size_t(plan.shard.count)) == plan.shard.index) mine.push_back(plan.selected[k]);
    plan.selected = std::move(mine);
  }
  if (!o.reproduce.empty()) {
    try {
      check_reproduce_string(o.reproduce, plan.selected.front()->name);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--reproduce: ") + e.what());
    }
  }
}

// A long-context run: every case longer than kLongContextT (by --min-T or a pinned shape), or --long, gets the
// long defaults for the bounds not given; the header says which.
void long_context_bounds(CheckPlan& plan, const CheckOptions& o) {
  plan.bounds = o;
  const std::optional<std::array<Index, 5>> pinned = o.shape.empty() ? std::nullopt : std::optional(parse_shape(o.shape));
  const bool long_run = o.long_mode || (pinned ? std::min((*pinned)[2], (*pinned)[3]) : o.min_T) > kLongContextT;
  if (o.long_mode) {
    if (pinned) throw UsageError("--long and --shape: --long draws its own shapes; give one of them");
    if (o.given.max_T || o.given.min_T)
      throw UsageError("--long draws T from 2^15 - 1, 2^15 + 1, 2^16 - 1 and 2^16 + 1; it takes no --max-T or --min-T");
  }
  if (!long_run) return;
  const int cases = o.long_mode ? kLongCases : kLongContextCases;
  if (!o.given.cases) plan.bounds.cases = cases;
  if (!o.given.max_B) plan.bounds.max_B = kLongContextMaxB;
  if (!o.given.max_H) plan.bounds.max_H = kLongContextMaxH;
  if (!o.given.max_D) plan.bounds.max_D = kLongContextMaxD;
  const std::string defaults = "unless given, --cases " + std::to_string(cases) + " --max-B " +
                               std::to_string(kLongContextMaxB) + " --max-H " + std::to_string(kLongContextMaxH) +
                               " --max-D " + std::to_string(kLongContextMaxD) + "\n";
  plan.long_note = o.long_mode ? "  --long: keys of 32767, 32769, 65535 or 65537 (decode steps, chunks, square); " +
                                     defaults
                               : "  long context (every T > " + std::to_string(kLongContextT) + "): " + defaults;
}

// The lengths the generators draw: --max-T bounds every T (most cases at T <= 64, a tail up to --max-T); --long's
// key lengths within the implementation's max_T, and for a zoo kernel no square call.
void plan_lengths(CheckPlan& plan, const CheckOptions& o) {
  GenConfig& gen = plan.run.gen;
  const Capabilities& caps = plan.impl->capabilities();
  gen.max_T = std::min<Index>(GenConfig{}.max_T, o.max_T);
  gen.max_T_tail = o.max_T;
  if (o.min_T > o.max_T)
    throw UsageError("--min-T: expected at most --max-T (" + std::to_string(o.max_T) + ") but got " +
                     std::to_string(o.min_T));
  gen.min_T = o.min_T;
  if (!o.long_mode) return;
  for (const Index len : kLongLengths)
    if (caps.max_T <= 0 || len <= caps.max_T) gen.long_lengths.push_back(len);
  if (gen.long_lengths.empty())
    throw UsageError("--long: " + plan.impl->name() + " declares max_T " + std::to_string(caps.max_T) +
                     " but --long needs sequences of at least 32767");
  // A zoo kernel holds each head's [T_q,T_k] weights: no square call of 2^16 (32 GiB), as in the kill tests.
  if (find_mutant(plan.impl->name())) {
    gen.long_max_T_q = kZooLongMaxQueries;
    plan.long_note += "  --long on a zoo kernel (it holds [T_q,T_k] weights): at most " +
                      std::to_string(gen.long_max_T_q) + " queries a call (decode steps and chunks, no square calls)\n";
  }
}

// Declared means drawn: an implementation that names its head dimensions (a list, D_k/D_v pairs, or a maximum) is
// called at every one of them, whatever --max-D's default; an explicit --max-D that cuts some says so.
void plan_head_dims(CheckPlan& plan, const CheckOptions& o) {
  GenConfig& gen = plan.run.gen;
  const Capabilities& caps = plan.impl->capabilities();
  gen.max_D = plan.bounds.max_D;
  if (!o.long_mode && !o.given.max_D && o.shape.empty()) gen.max_D = std::max(gen.max_D, declared_top_head_dim(caps));
  if (caps.lists_head_dims()) {
    const std::string drawn = declared_head_dims(caps, gen.max_D, false);
    const std::string cut = declared_head_dims(caps, gen.max_D, true);
    plan.head_dim_note = "  head dimensions drawn: " + (drawn.empty() ? std::string("none") : drawn) + " (declared)" +
                         (cut.empty() ? std::string()
                                      : "; not drawn, above --max-D " + std::to_string(gen.max_D) + ": " + cut) +
                         "\n";
  } else if (caps.max_head_dim > 0 && gen.max_D < std::min(caps.max_head_dim, kMaxDeclaredDraw)) {
    plan.head_dim_note = "  head dimensions drawn up to " + std::to_string(gen.max_D) + " of the declared " +
                         std::to_string(caps.max_head_dim) + " (--max-D)\n";
  }
}

// Contradictions: a bound given on the command line that the pinned shape breaks, more kv heads than heads, a
// pinned shape or bounds outside what the implementation declares (every call would be one it never accepts), a
// case that cannot fit in memory.
void check_plan_bounds(const CheckPlan& plan, const CheckOptions& o) {
  const GenConfig& gen = plan.run.gen;
  const Capabilities& declared = plan.impl->capabilities();
  if (gen.shape) {
    const auto& sh = *gen.shape;
    const auto clash = [&](bool given, const char* flag, Index bound, const char* axis, Index x, bool above) {
      if (given && (above ? x > bound : x < bound))
        throw UsageError("--shape " + o.shape + " has " + axis + " = " + std::to_string(x) + (above ? " above " : " below ") +
                         flag + " " + std::to_string(bound) + "; give one of them, or make them agree");
    };
    clash(o.given.max_B, "--max-B", o.max_B, "B", sh[0], true);
    clash(o.given.max_H, "--max-H", o.max_H, "H", sh[1], true);
    clash(o.given.max_T, "--max-T", o.max_T, "T_q", sh[2], true);
    clash(o.given.max_T, "--max-T", o.max_T, "T_k", sh[3], true);
    clash(o.given.min_T, "--min-T", o.min_T, "T_q", sh[2], false);
    clash(o.given.min_T, "--min-T", o.min_T, "T_k", sh[3], false);
    clash(o.given.max_D, "--max-D", o.max_D, "D", sh[4], true);
  }
  if (o.given.max_H_kv && o.given.max_H && o.max_H_kv > o.max_H)
    throw UsageError("--max-Hkv " + std::to_string(o.max_H_kv) + " is above --max-H " + std::to_string(o.max_H) +
                     "; K and V have at most as many heads as Q");
  if (gen.shape) {
    const auto& sh = *gen.shape;
    if (!declared.supports_lengths(sh[2], sh[3]) || !declared.supports_head_dim(sh[4]))
      throw UsageError("--shape " + o.shape + ": " + plan.impl->name() + " does not accept T_q = " +
                       std::to_string(sh[2]) + ", T_k = " + std::to_string(sh[3]) + ", D = " + std::to_string(sh[4]) +
                       " (it declares " + describe_capabilities(declared) + ")");
  } else if (declared.head_dims_up_to(gen.max_D).empty()) {
    throw UsageError("--max-D " + std::to_string(gen.max_D) + ": " + plan.impl->name() +
                     " accepts no head dimension up to it (it declares " + describe_capabilities(declared) +
                     "); raise --max-D");
  }
  check_fits_in_memory(gen, declared, gen.shape ? "--shape " + o.shape : std::string("the bounds"));
}

// Everything a run decides before its first law: nothing is written, and every flag that contradicts another or
// the implementation is refused here.
CheckPlan plan_check(const CheckOptions& o, const Registry& reg, ImplementationPtr impl = nullptr) {
  if (o.impl.empty())
    throw UsageError("check: --impl is required: reference, mutant:NAME or control:NAME (`attncheck list` shows them), "
                     "plugin:PATH.so or exec:COMMAND");
  CheckPlan plan;
  plan.dtype = dtype_option(o.dtype);
  try {
    plan.formats = reports::parse_formats(o.format);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  select_plan_laws(plan, o, reg);
  plan.impl = impl ? std::move(impl) : resolve_implementation(o.impl, reg, {.call_timeout_s = o.timeout});
  check_dtype_declared(*plan.impl, plan.dtype, "no law could be checked");
  long_context_bounds(plan, o);
  reports::RunInfo& run = plan.run;
  run.implementation = plan.impl->name();
  run.implementation_description = plan.impl->description();
  run.dtype = run.gen.dtype = plan.dtype;
  run.seed = o.seed;
  run.cases = plan.bounds.cases;
  run.law_calls = o.law_calls < 0 ? run.cases : o.law_calls;
  if (plan.shard.given) run.shard = std::array<int, 2>{plan.shard.index, plan.shard.count};
  run.gen.max_B = plan.bounds.max_B;
  run.gen.max_H = plan.bounds.max_H;
  run.gen.max_H_kv = plan.bounds.max_H_kv;
  plan_lengths(plan, o);
  plan_head_dims(plan, o);
  run.gen.stress = o.stress;
  if (!o.shape.empty()) run.gen.shape = parse_shape(o.shape);
  check_plan_bounds(plan, o);
  const std::string slug = reports::slug(run.implementation);
  plan.report_dir = o.report_dir.empty() ? fs::path(kDefaultReportRoot) / slug : fs::path(o.report_dir);
  const fs::path corpus_root = !o.corpus.empty()       ? fs::path(o.corpus)
                               : o.report_dir.empty() ? fs::path(kDefaultReportRoot) / "corpus"
                                                      : fs::path(o.report_dir) / "corpus";
  if (!o.no_corpus) plan.corpus.emplace(corpus_root / slug);
  // Workers beyond the cores would only wait for one (the reports are the same with any number), and each costs a
  // thread and two queued cases: --jobs is capped at the cores, and the header says so.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  plan.jobs = o.jobs > 0 ? std::min(o.jobs, cores) : cores;
  if (o.jobs > cores)
    plan.jobs_note = "  --jobs " + std::to_string(o.jobs) + " capped at " + std::to_string(cores) + ", this machine's cores\n";
  return plan;
}

void print_header(const CheckPlan& plan, std::ostream& out) {
  const reports::RunInfo& run = plan.run;
  std::string lengths;
  if (run.gen.long_lengths.empty()) {
    lengths = ", T <= " + std::to_string(run.gen.max_T) + " (tail to " + std::to_string(run.gen.max_T_tail) + ")";
  } else {
    for (const Index x : run.gen.long_lengths) lengths += (lengths.empty() ? ", T_k in {" : ", ") + std::to_string(x);
    lengths += "}";
  }
  out << "attncheck check: " << run.implementation << " (" << run.implementation_description << ")\n"
      << "  dtype " << dtype_name(plan.dtype) << ", seed " << run.seed << ", " << reports::cases_per_law(run)
      << ", B <= " << run.gen.max_B << ", H <= " << run.gen.max_H
      << (run.gen.max_H_kv > 0 ? ", H_kv <= " + std::to_string(run.gen.max_H_kv) : std::string()) << lengths
      << ", D <= " << run.gen.max_D << (run.gen.min_T > 1 ? ", T >= " + std::to_string(run.gen.min_T) : std::string())
      << (run.gen.shape ? ", shape pinned to " + reports::shape_option(*run.gen.shape) : std::string())
      << (run.gen.stress > 1 ? ", stress " + std::to_string(run.gen.stress) : std::string()) << "\n"
      << plan.long_note << plan.head_dim_note
      << (plan.shard.given ? "  shard " + std::to_string(plan.shard.index) + "/" + std::to_string(plan.shard.count) +
                                 ": " + std::to_string(plan.selected.size()) + " of the run's " +
                                 std::to_string(plan.run_law_names.size()) +
                                 " laws (merge the shards' folders with `attncheck merge`)\n"
                           : std::string())
      << plan.jobs_note << std::flush;
}

// The results table. It streams: each law's row prints, in law order, as soon as it and every law above it are
// done (a corpus replay is done before any law runs), so a long run shows what it found as it goes.
class ResultsTable {
 public:
  ResultsTable(const std::vector<const Law*>& laws, std::ostream& out) : out_(out), done_(laws.size()) {
    for (const Law* l : laws) width_ = std::max(width_, l->name.size());
    width_ += 2;
    out_ << "\n" << pad("law", width_) << pad("result", 11) << lpad("cases", 7) << lpad("shrinks", 9)
         << lpad("calls", 9) << lpad("time", 9) << "\n" << std::flush;
  }
  /// Law n is done: `r`, in `seconds` (a corpus replay's own time), from the corpus or not.
  void done(std::size_t n, const LawResult& r, double seconds, bool from_corpus) {
    done_[n] = Row{r, seconds, from_corpus};
    for (; printed_ < done_.size() && done_[printed_]; ++printed_) {
      const Row& row = *done_[printed_];
      const std::string status =
          row.r.status == LawStatus::falsified ? "FALSIFIED" : std::string(status_name(row.r.status));
      out_ << pad(row.r.law, width_) << pad(status, 11) << lpad(std::to_string(row.r.cases_run), 7)
           << lpad(std::to_string(row.r.shrink_steps), 9) << lpad(std::to_string(row.r.calls), 9)
           << lpad(seconds_text(row.seconds), 9);
      if (row.from_corpus) out_ << "  (corpus)";
      if (!row.r.note.empty()) out_ << "  " << row.r.note;  // why not applicable, or what a held law found
      out_ << "\n";
    }
    out_ << std::flush;
  }

 private:
  static std::string seconds_text(double s) { return seconds(s); }
  struct Row {
    LawResult r;
    double seconds;
    bool from_corpus;
  };
  std::ostream& out_;
  std::vector<std::optional<Row>> done_;
  std::size_t width_ = 4, printed_ = 0;
};

// First the corpus, law by law; then every law it did not falsify, `--jobs` cases at a time. The reports of every
// selected law, in the run's order.
std::vector<reports::LawReport> run_plan(const CheckPlan& plan, const CheckOptions& o, std::ostream& out,
                                         std::ostream& err, bool err_is_terminal) {
  ProgressLine progress(err, o.progress || err_is_terminal, err_is_terminal);
  const std::size_t n_laws = plan.selected.size();
  std::vector<std::optional<reports::LawReport>> replayed(n_laws);
  std::vector<double> times(n_laws, 0.0);
  std::vector<const Law*> pending;
  std::vector<std::size_t> pending_index;  // pending[k] is selected[pending_index[k]]
  for (std::size_t n = 0; n < n_laws; ++n) {
    if (plan.corpus && o.reproduce.empty()) {
      const auto start = std::chrono::steady_clock::now();
      replayed[n] = replay_corpus(*plan.selected[n], *plan.impl, plan.run.gen, *plan.corpus, err);
      times[n] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (replayed[n]) continue;
    pending.push_back(plan.selected[n]);
    pending_index.push_back(n);
  }
  RunOptions ro = run_options(plan.bounds.cases, o.seed, plan.run.max_size, plan.run.gen, o.reproduce);
  ro.shrink_seconds = o.shrink_time;
  ro.max_calls = o.max_calls;
  ro.law_calls = plan.run.law_calls;
  ro.calls_spent = std::make_shared<std::atomic<long>>(0);
  ResultsTable table(plan.selected, out);
  for (std::size_t n = 0; n < n_laws; ++n)  // the rows of the corpus replays at the top, before any law runs
    if (replayed[n]) table.done(n, replayed[n]->result, times[n], true);
  // The progress counts the laws that will check cases: an n/a law reports none.
  GenConfig declared = plan.run.gen;
  declared.caps = plan.impl->capabilities();
  progress.set_applicable(static_cast<int>(std::count_if(pending.begin(), pending.end(), [&](const Law* law) {
    return why_not_applicable(*law, *plan.impl, declared).empty();
  })));
  std::string current;
  ro.on_progress = [&](const Progress& p) {
    if (p.law != current) {
      if (!current.empty()) progress.end();
      progress.begin(p.law);
      current = p.law;
    }
    progress.update(p);
  };
  const auto on_done = [&](std::size_t pending_k, const LawResult& r) {
    if (!current.empty()) progress.end();  // the progress line goes before the row is printed
    current.clear();
    const std::size_t n = pending_index[pending_k];
    table.done(n, r, times[n] + r.seconds, false);
  };
  std::vector<LawResult> ran = run_laws(pending, *plan.impl, ro, plan.jobs, on_done);
  if (!current.empty()) progress.end();
  std::vector<reports::LawReport> results;
  for (std::size_t n = 0, next = 0; n < n_laws; ++n) {
    std::optional<reports::LawReport> rep = std::move(replayed[n]);
    if (!rep) {
      rep.emplace();
      rep->result = std::move(ran[next++]);
    }
    rep->summary = plan.selected[n]->summary;
    rep->why = plan.selected[n]->why;
    results.push_back(std::move(*rep));
  }
  out << "\n";
  return results;
}

// Each falsified law's smallest case, as the corpus stores it (saved once the reports are); and where its replay
// file is.
std::vector<std::pair<fs::path, Json>> corpus_entries(const CheckPlan& plan, std::vector<reports::LawReport>& results) {
  std::vector<std::pair<fs::path, Json>> entries;
  for (reports::LawReport& rep : results) {
    if (rep.result.status != LawStatus::falsified || !rep.result.minimal_case) continue;
    const std::string& law = rep.result.law;
    const fs::path entry = plan.corpus ? plan.corpus->path_for(law, *rep.result.minimal_case) : fs::path();
    if (plan.corpus && rep.found_by.empty()) {
      reports::LawReport self = rep;
      self.replay_file = entry.string();
      entries.emplace_back(entry, reports::law_document(plan.run, self));
    }
    rep.replay_file =
        plan.formats.json ? (plan.report_dir / reports::law_file(law, ".json")).string() : entry.string();
  }
  return entries;
}

// Writes the reports; then, only then, the corpus entries: a run whose reports were refused writes nothing at all.
reports::PublishResult publish(const CheckPlan& plan, const CheckOptions& o, reports::ReportFolder& folder,
                               std::vector<reports::LawReport>& results, std::ostream& out, std::ostream& err) {
  const std::vector<std::pair<fs::path, Json>> entries = corpus_entries(plan, results);
  reports::PublishResult published;
  try {
    // A law this run did not check keeps the report an earlier run of this implementation wrote for it (the
    // folder holds no other implementation's: ReportFolder refused it), so an interrupted rerun loses nothing.
    std::vector<reports::ReportFile> kept;
    for (reports::LawReport& r : results) {
      if (r.result.status != LawStatus::not_checked) continue;
      std::vector<reports::ReportFile> earlier = reports::law_files_in(plan.report_dir, r.result.law);
      if (earlier.empty()) continue;
      r.result.note += "; the report an earlier run wrote for this law is kept (" + earlier.front().name + ")";
      for (reports::ReportFile& f : earlier) kept.push_back(std::move(f));
    }
    std::vector<reports::ReportFile> files = reports::render_run(plan.run, results, plan.formats);
    for (reports::ReportFile& f : kept) files.push_back(std::move(f));
    if (plan.shard.given)
      files.push_back({"shard.json", reports::dump_pretty(reports::to_json(reports::ShardDocument{
                                         plan.run, plan.formats, plan.shard.index, plan.shard.count,
                                         plan.run_law_names, results}))});
    published = folder.publish(files, o.force);
  } catch (const reports::ReportExists& e) {
    out << "reports not written\n" << std::flush;
    throw;
  }
  // A corpus that cannot take the entry (read-only, full) costs the next run its replay, not this run its verdict.
  for (const auto& [entry, doc] : entries) {
    try {
      plan.corpus->save(entry, doc);
    } catch (const reports::FileError& e) {
      err << "attncheck: warning: the corpus entry was not saved: " << e.what()
          << "; the verdict and the reports stand, but later runs will not replay this case from the corpus\n";
    }
  }
  return published;
}

// Each falsified law: its message, margin, smallest case, report and replay command.
void print_falsified(const CheckPlan& plan, const CheckOptions& o, const std::vector<reports::LawReport>& results,
                     std::ostream& out) {
  for (const auto& r : results) {
    if (r.result.status != LawStatus::falsified) continue;
    std::string message = r.result.violation ? r.result.violation->message : std::string("falsified");
    if (message.starts_with(r.result.law + ": ")) message.erase(0, r.result.law.size() + 2);  // said once is enough
    out << "  " << r.result.law << ": " << message << "\n";
    if (r.result.violation) {
      out << "    margin: " << margin_text(*r.result.violation);
      if (r.result.minimal_case) out << "; minimal case " << shape_line(r.result.minimal_case->problem);
      out << "\n";
    }
    if (plan.formats.md) out << "    report: " << (plan.report_dir / reports::law_file(r.result.law, ".md")).string() << "\n";
    // On the terminal the command starts as this one was typed, so that it works pasted into the same shell.
    reports::RunInfo typed = plan.run;
    if (o.program != "attncheck") typed.program = reports::shell_quote(o.program);
    if (const auto cmd = reports::replay_command(typed, r); !cmd.empty()) out << "    replay: " << cmd << "\n";
  }
}

// The verdict line and what follows it; the exit code.
int print_verdict(const CheckPlan& plan, const CheckOptions& o, const std::vector<reports::LawReport>& results,
                  const reports::PublishResult& published, std::ostream& out) {
  int falsified = 0, na = 0;
  std::vector<std::string> unchecked;  // applicable laws not checked in full
  for (const reports::LawReport& r : results) {
    falsified += r.result.status == LawStatus::falsified;
    na += r.result.status == LawStatus::not_applicable;
    if (r.result.status == LawStatus::not_checked) unchecked.push_back(r.result.law);
  }
  const int applicable = static_cast<int>(results.size()) - na;
  const int not_checked = static_cast<int>(unchecked.size());
  const bool interrupted = stop_requested();
  if (interrupted) out << "interrupted: the reports hold the laws that finished (the others say \"not checked\")\n";
  out << plan.run.implementation << ": "
      << (plan.shard.given ? "shard " + std::to_string(plan.shard.index) + "/" + std::to_string(plan.shard.count) + ": "
                           : "");
  if (falsified) {
    out << falsified << " of " << applicable << " laws falsified";
    if (not_checked) out << ", " << not_checked << " not checked";
  } else if (not_checked) {
    out << "INCOMPLETE: " << not_checked << " of " << applicable << " laws not checked, "
        << applicable - not_checked << " held";
  } else {
    out << "all " << applicable << " laws held";
  }
  if (na) out << " (" << na << " not applicable)";
  out << "; seed " << plan.run.seed << ". Reports in " << plan.report_dir.string() << "/"
      << (published.written.empty() ? " (unchanged)" : "") << "\n";
  if (plan.formats.html) out << "  browse: " << (plan.report_dir / "index.html").string() << "\n";
  print_falsified(plan, o, results, out);
  if (not_checked) {
    std::string names;
    for (const std::string& n : unchecked) names += (names.empty() ? "" : ", ") + n;
    out << "  not checked: " << names << "\n";
    if (!falsified && !interrupted)
      out << "  a run passes only what it checked: raise --max-calls (or drop it)"
          << (o.accept_incomplete ? "; --accept-incomplete: exit 0" : ", or pass --accept-incomplete to exit 0") << "\n";
  }
  if (interrupted) return kInterrupted;
  if (falsified) return kFalsified;
  return not_checked && !o.accept_incomplete ? kIncomplete : kAllHeld;
}

// One run: one dtype, with `impl` when it is already loaded (several dtypes share it).
int run_one(const CheckOptions& o, const Registry& reg, std::ostream& out, std::ostream& err, bool err_is_terminal,
            ImplementationPtr impl = nullptr) {
  const CheckPlan plan = plan_check(o, reg, std::move(impl));
  // The report folder is checked and locked before the first law runs: a folder that cannot be written, is in use
  // by another run, or holds another implementation's report fails now, not after every law ran.
  reports::ReportFolder folder(plan.report_dir, plan.run.implementation, o.force);
  print_header(plan, out);
  std::vector<reports::LawReport> results = run_plan(plan, o, out, err, err_is_terminal);
  const reports::PublishResult published = publish(plan, o, folder, results, out, err);
  return print_verdict(plan, o, results, published, out);
}

// Several dtypes: the implementation is loaded once (a Python client imports torch once), every dtype is checked
// against what it declares before the first run, and then each dtype is a run of its own into
// <report-dir>/<dtype>/, sharing the corpus root. The exit code is the worst: falsified, then incomplete.
int run_dtypes(const CheckOptions& o, const Registry& reg, std::ostream& out, std::ostream& err, bool err_is_terminal) {
  for (std::size_t i = 0; i < o.dtypes.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (o.dtypes[i] == o.dtypes[j])
        throw UsageError("--dtype: expected each dtype once but got " + o.dtypes[i] + " twice");
  if (o.impl.empty()) return run_one(o, reg, out, err, err_is_terminal);  // plan_check says what --impl takes
  const ImplementationPtr impl = resolve_implementation(o.impl, reg, {.call_timeout_s = o.timeout});
  for (const std::string& name : o.dtypes) check_dtype_declared(*impl, dtype_option(name), "no law was checked at any dtype");
  const fs::path root = o.report_dir.empty() ? fs::path(kDefaultReportRoot) / reports::slug(impl->name())
                                             : fs::path(o.report_dir);
  std::vector<std::pair<std::string, int>> verdicts;
  for (const std::string& name : o.dtypes) {
    CheckOptions one = o;
    one.dtype = name;
    one.dtypes.clear();
    one.report_dir = (root / name).string();
    // The corpus stays where one run's would be: its entries name their dtype.
    if (one.corpus.empty())
      one.corpus = (o.report_dir.empty() ? fs::path(kDefaultReportRoot) / "corpus" : root / "corpus").string();
    if (!verdicts.empty()) out << "\n";
    const int code = run_one(one, reg, out, err, err_is_terminal, impl);
    if (code != kAllHeld && code != kFalsified && code != kIncomplete) return code;  // interrupted, say: stop here
    verdicts.emplace_back(name, code);
  }
  int worst = kAllHeld;
  std::string line;
  for (const auto& [name, code] : verdicts) {
    line += (line.empty() ? " " : ", ") + name + " " +
            (code == kFalsified ? "falsified" : code == kIncomplete ? "incomplete" : "held");
    if (code == kFalsified || (code == kIncomplete && worst == kAllHeld)) worst = code;
  }
  out << "\n" << impl->name() << " at " << verdicts.size() << " dtypes:" << line << "\n";
  return worst;
}

}  // namespace

int run_check(const CheckOptions& o, const Registry& reg, std::ostream& out, std::ostream& err, bool err_is_terminal) {
  if (!o.replay.empty()) return run_replay(o, reg, out);
  if (o.dtypes.size() > 1) return run_dtypes(o, reg, out, err, err_is_terminal);
  return run_one(o, reg, out, err, err_is_terminal);
}

}  // namespace attncheck::cli
