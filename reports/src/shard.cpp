// shard.json: one shard of a sharded run, complete enough that `attncheck merge` renders the whole run's
// reports from the shards alone, as the single run would have written them.
#include <cstdint>
#include <limits>

#include "attncheck/reports.hpp"

namespace attncheck::reports {
namespace {

constexpr const char* kFormat = "attncheck-shard/1";

[[noreturn]] void fail(const std::string& what, const std::string& expected, const Json& got) {
  std::string shown = got.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  throw FormatError(what + ": expected " + expected + " but got " + shown);
}

const Json& field(const Json& j, const char* key, const std::string& what) {
  if (!j.is_object()) fail(what, "an object", j);
  const auto it = j.find(key);
  if (it == j.end()) throw FormatError(what + ": the field \"" + key + "\" is missing");
  return *it;
}

std::string text(const Json& j, const char* key, const std::string& what) {
  const Json& x = field(j, key, what);
  if (!x.is_string()) fail(what + "." + key, "a string", x);
  return x.get<std::string>();
}

std::int64_t integer(const Json& j, const char* key, const std::string& what, std::int64_t lo, std::int64_t hi) {
  const Json& x = field(j, key, what);
  if (!x.is_number_integer() || x.get<std::int64_t>() < lo || x.get<std::int64_t>() > hi)
    fail(what + "." + key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", x);
  return x.get<std::int64_t>();
}

bool flag(const Json& j, const char* key, const std::string& what) {
  const Json& x = field(j, key, what);
  if (!x.is_boolean()) fail(what + "." + key, "true or false", x);
  return x.get<bool>();
}

constexpr std::int64_t kBig = std::int64_t{1} << 52;

Json run_json(const RunInfo& r) {
  Json g{{"max_B", r.gen.max_B},   {"max_H", r.gen.max_H},           {"max_H_kv", r.gen.max_H_kv},
         {"min_T", r.gen.min_T},   {"max_T", r.gen.max_T},           {"max_T_tail", r.gen.max_T_tail},
         {"max_D", r.gen.max_D},   {"shape", r.gen.shape ? Json(*r.gen.shape) : Json(nullptr)}};
  if (!r.gen.long_lengths.empty()) g["long_lengths"] = r.gen.long_lengths;  // --long
  if (r.gen.long_max_T_q > 0) g["long_max_T_q"] = r.gen.long_max_T_q;     // --long on a zoo kernel
  return Json{{"implementation", r.implementation},
              {"description", r.implementation_description},
              {"dtype", dtype_name(r.dtype)},
              {"seed", std::to_string(r.seed)},
              {"cases", r.cases},
              {"law_calls", r.law_calls},
              {"max_size", r.max_size},
              {"program", r.program},
              {"generator", std::move(g)}};
}

RunInfo run_from_json(const Json& j, const std::string& what) {
  RunInfo r;
  r.implementation = text(j, "implementation", what);
  r.implementation_description = text(j, "description", what);
  r.dtype = dtype_field(text(j, "dtype", what));
  const std::string seed = text(j, "seed", what);  // a string: a 64-bit seed does not fit a JSON double
  try {
    std::size_t used = 0;
    r.seed = std::stoull(seed, &used);
    if (used != seed.size() || seed.empty() || seed[0] == '-') throw std::invalid_argument(seed);
  } catch (const std::exception&) {
    fail(what + ".seed", "an unsigned 64-bit integer in a string", field(j, "seed", what));
  }
  r.cases = int(integer(j, "cases", what, 1, 10'000'000));
  r.law_calls = integer(j, "law_calls", what, 0, kBig);
  r.max_size = int(integer(j, "max_size", what, 0, 1'000'000));
  r.program = text(j, "program", what);
  const std::string gw = what + ".generator";
  const Json& g = field(j, "generator", what);
  r.gen.max_B = integer(g, "max_B", gw, 1, kBig);
  r.gen.max_H = integer(g, "max_H", gw, 1, kBig);
  r.gen.max_H_kv = integer(g, "max_H_kv", gw, 0, kBig);
  r.gen.min_T = integer(g, "min_T", gw, 1, kBig);
  r.gen.max_T = integer(g, "max_T", gw, 1, kBig);
  r.gen.max_T_tail = integer(g, "max_T_tail", gw, 1, kBig);
  r.gen.max_D = integer(g, "max_D", gw, 1, kBig);
  if (const auto ll = g.find("long_lengths"); ll != g.end()) {
    if (!ll->is_array()) fail(gw + ".long_lengths", "an array of lengths (--long)", *ll);
    for (const Json& x : *ll) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < 1) fail(gw + ".long_lengths", "positive lengths", *ll);
      r.gen.long_lengths.push_back(Index(x.get<std::int64_t>()));
    }
  }
  if (g.contains("long_max_T_q")) r.gen.long_max_T_q = integer(g, "long_max_T_q", gw, 1, kBig);
  const Json& shape = field(g, "shape", gw);
  if (!shape.is_null()) {
    if (!shape.is_array() || shape.size() != 5) fail(gw + ".shape", "null or [B,H,T_q,T_k,D]", shape);
    std::array<Index, 5> s{};
    for (std::size_t n = 0; n < 5; ++n) {
      if (!shape[n].is_number_integer() || shape[n].get<std::int64_t>() < 1) fail(gw + ".shape", "positive extents", shape);
      s[n] = Index(shape[n].get<std::int64_t>());
    }
    r.gen.shape = s;
  }
  return r;
}

LawStatus status_from(const std::string& s, const std::string& what, const Json& got) {
  if (s == "held") return LawStatus::held;
  if (s == "falsified") return LawStatus::falsified;
  if (s == "n/a") return LawStatus::not_applicable;
  if (s == "not checked") return LawStatus::not_checked;
  fail(what, "\"held\", \"falsified\", \"n/a\" or \"not checked\"", got);
}

std::string status_text(LawStatus s) { return std::string(status_name(s)); }

Json report_json(const LawReport& r) {
  const LawResult& res = r.result;
  Json coverage = Json::object();
  for (const auto& [tag, n] : res.coverage) coverage[tag] = n;
  return Json{{"law", res.law},
              {"implementation", res.implementation},
              {"dtype", dtype_name(res.dtype)},
              {"seed", std::to_string(res.seed)},
              {"status", status_text(res.status)},
              {"cases_run", res.cases_run},
              {"shrink_steps", res.shrink_steps},
              {"calls", res.calls},
              {"timeouts", res.timeouts},
              {"seconds", number_to_json(res.seconds)},
              {"reproduce", res.reproduce},
              {"minimal_case", res.minimal_case ? to_json(*res.minimal_case) : Json(nullptr)},
              {"violation", res.violation ? to_json(*res.violation) : Json(nullptr)},
              {"coverage", std::move(coverage)},
              {"note", res.note},
              {"summary", r.summary},
              {"why", r.why},
              {"found_by", r.found_by},
              {"replay_file", r.replay_file}};
}

LawReport report_from_json(const Json& j, const std::string& what) {
  LawReport r;
  LawResult& res = r.result;
  res.law = text(j, "law", what);
  res.implementation = text(j, "implementation", what);
  res.dtype = dtype_field(text(j, "dtype", what));
  const std::string seed = text(j, "seed", what);
  try {
    res.seed = std::stoull(seed);
  } catch (const std::exception&) {
    fail(what + ".seed", "an unsigned 64-bit integer in a string", field(j, "seed", what));
  }
  res.status = status_from(text(j, "status", what), what + ".status", field(j, "status", what));
  res.cases_run = int(integer(j, "cases_run", what, 0, std::numeric_limits<int>::max()));
  res.shrink_steps = int(integer(j, "shrink_steps", what, 0, std::numeric_limits<int>::max()));
  res.calls = long(integer(j, "calls", what, 0, kBig));
  res.timeouts = int(integer(j, "timeouts", what, 0, std::numeric_limits<int>::max()));
  res.seconds = number_from_json(field(j, "seconds", what), what + ".seconds");
  res.reproduce = text(j, "reproduce", what);
  if (const Json& c = field(j, "minimal_case", what); !c.is_null()) res.minimal_case = law_case_from_json(c, what + ".minimal_case");
  if (const Json& v = field(j, "violation", what); !v.is_null()) res.violation = violation_from_json(v, what + ".violation");
  const Json& coverage = field(j, "coverage", what);
  if (!coverage.is_object()) fail(what + ".coverage", "an object of tag counts", coverage);
  for (const auto& [tag, n] : coverage.items()) {
    if (!n.is_number_integer() || n.get<std::int64_t>() < 0) fail(what + ".coverage." + tag, "a count", n);
    res.coverage[tag] = int(n.get<std::int64_t>());
  }
  res.note = text(j, "note", what);
  r.summary = text(j, "summary", what);
  r.why = text(j, "why", what);
  r.found_by = text(j, "found_by", what);
  r.replay_file = text(j, "replay_file", what);
  return r;
}

}  // namespace

Json to_json(const ShardDocument& d) {
  Json reports = Json::array();
  for (const LawReport& r : d.reports) reports.push_back(report_json(r));
  return Json{{"format", kFormat},
              {"shard", {d.index, d.count}},
              {"run", run_json(d.run)},
              {"formats", {{"md", d.formats.md}, {"json", d.formats.json}, {"junit", d.formats.junit}, {"html", d.formats.html}}},
              {"laws", d.laws},
              {"reports", std::move(reports)}};
}

ShardDocument shard_from_json(const Json& j, const std::string& what) {
  ShardDocument d;
  if (text(j, "format", what) != kFormat)
    fail(what + ".format", std::string("\"") + kFormat + "\"", field(j, "format", what));
  const Json& shard = field(j, "shard", what);
  if (!shard.is_array() || shard.size() != 2 || !shard[0].is_number_integer() || !shard[1].is_number_integer() ||
      shard[1].get<std::int64_t>() < 1 || shard[0].get<std::int64_t>() < 0 ||
      shard[0].get<std::int64_t>() >= shard[1].get<std::int64_t>() || shard[1].get<std::int64_t>() > 1'000'000)
    fail(what + ".shard", "[index, count] with 0 <= index < count", shard);
  d.index = int(shard[0].get<std::int64_t>());
  d.count = int(shard[1].get<std::int64_t>());
  d.run = run_from_json(field(j, "run", what), what + ".run");
  const Json& f = field(j, "formats", what);
  d.formats = {flag(f, "md", what + ".formats"), flag(f, "json", what + ".formats"), flag(f, "junit", what + ".formats"),
               flag(f, "html", what + ".formats")};
  const Json& laws = field(j, "laws", what);
  if (!laws.is_array()) fail(what + ".laws", "an array of law names", laws);
  for (const Json& l : laws) {
    if (!l.is_string()) fail(what + ".laws", "law names", l);
    d.laws.push_back(l.get<std::string>());
  }
  const Json& reports = field(j, "reports", what);
  if (!reports.is_array()) fail(what + ".reports", "an array of law reports", reports);
  for (std::size_t n = 0; n < reports.size(); ++n)
    d.reports.push_back(report_from_json(reports[n], what + ".reports[" + std::to_string(n) + "]"));
  return d;
}

}  // namespace attncheck::reports
