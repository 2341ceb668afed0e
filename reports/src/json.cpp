// JSON encoding of counterexamples. nlohmann's serializer prints doubles with enough digits to parse back
// to the same value, so finite numbers round-trip; non-finite ones become strings (JSON has no Inf/NaN).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "attncheck/report_json.hpp"

namespace attncheck::reports {
namespace {

[[noreturn]] void fail(std::string_view what, const std::string& expected, const Json& got) {
  std::string shown = got.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  throw FormatError(std::string(what) + ": expected " + expected + " but got " + shown);
}

const Json& field(const Json& j, const char* key, std::string_view what) {
  if (!j.is_object()) fail(what, "an object", j);
  const auto it = j.find(key);
  if (it == j.end()) throw FormatError(std::string(what) + ": the field \"" + key + "\" is missing");
  return *it;
}

std::string sub(std::string_view what, std::string_view key) { return std::string(what) + "." + std::string(key); }

Index extent(const Json& j, std::string_view what) {
  if (!j.is_number_integer() || j.get<std::int64_t>() < 1) fail(what, "a positive integer extent", j);
  return static_cast<Index>(j.get<std::int64_t>());
}

Json problem_or_null(const std::optional<Problem>& p) { return p ? to_json(*p) : Json(nullptr); }
Json tensor_or_null(const std::optional<Tensor<double>>& t) { return t ? to_json(*t) : Json(nullptr); }

std::optional<Tensor<double>> optional_tensor(const Json& j, const char* key, std::string_view what) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  return tensor_from_json(*it, sub(what, key));
}

// Arrays on one line with ", " between elements, at any depth.
std::string one_line(const Json& j) {
  if (!j.is_array()) return j.dump(-1, ' ', false, Json::error_handler_t::replace);
  std::string out = "[";
  for (std::size_t n = 0; n < j.size(); ++n) out += (n ? ", " : "") + one_line(j[n]);
  return out + "]";
}

void dump_into(const Json& j, int indent, std::string& out) {
  const auto plain = [](const Json& e) { return !e.is_structured() || e.empty(); };
  const std::string pad(static_cast<std::size_t>(indent + 2), ' ');
  if (j.is_object() && !j.empty()) {
    out += "{\n";
    bool first = true;
    for (const auto& [key, value] : j.items()) {
      if (!first) out += ",\n";
      first = false;
      out += pad + Json(key).dump(-1, ' ', false, Json::error_handler_t::replace) + ": ";
      dump_into(value, indent + 2, out);
    }
    out += "\n" + std::string(static_cast<std::size_t>(indent), ' ') + "}";
  } else if (j.is_array() && !j.empty()) {
    bool all_plain = true;
    for (const auto& e : j) all_plain = all_plain && plain(e);
    // A small nested array (a tiny tensor) reads best on one line.
    if (!all_plain) {
      bool nested_plain = true;
      for (const auto& e : j) nested_plain = nested_plain && e.is_array();
      if (nested_plain && j.dump(-1, ' ', false, Json::error_handler_t::replace).size() <= 80) all_plain = true;
    }
    if (all_plain) {
      out += one_line(j);
      return;
    }
    out += "[\n";
    for (std::size_t n = 0; n < j.size(); ++n) {
      if (n) out += ",\n";
      out += pad;
      dump_into(j[n], indent + 2, out);
    }
    out += "\n" + std::string(static_cast<std::size_t>(indent), ' ') + "]";
  } else {
    out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

}  // namespace

Json number_to_json(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

double number_from_json(const Json& j, std::string_view what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  fail(what, "a number, \"inf\", \"-inf\" or \"nan\"", j);
}

DType dtype_field(std::string_view name) {
  if (const auto t = parse_dtype(name)) return *t;
  throw FormatError("dtype: expected float32, float64, float16 or bfloat16 but got \"" + std::string(name) + "\"");
}

std::string_view alignment_name(CausalAlignment a) {
  return a == CausalAlignment::BottomRight ? "bottom-right" : "top-left";
}

Json to_json(const Tensor<double>& t) {
  const Shape& s = t.shape();
  Json values = Json::array();
  for (Index b = 0; b < s.B; ++b) {
    Json head_b = Json::array();
    for (Index h = 0; h < s.H; ++h) {
      Json rows = Json::array();
      for (Index i = 0; i < s.T; ++i) {
        Json row = Json::array();
        for (Index d = 0; d < s.D; ++d) row.push_back(number_to_json(t(b, h, i, d)));
        rows.push_back(std::move(row));
      }
      head_b.push_back(std::move(rows));
    }
    values.push_back(std::move(head_b));
  }
  return Json{{"shape", {s.B, s.H, s.T, s.D}}, {"values", std::move(values)}};
}

Tensor<double> tensor_from_json(const Json& j, std::string_view what) {
  const Json& shape = field(j, "shape", what);
  if (!shape.is_array() || shape.size() != 4) fail(sub(what, "shape"), "[B,H,T,D]", shape);
  const Shape s{extent(shape[0], sub(what, "shape")), extent(shape[1], sub(what, "shape")),
                extent(shape[2], sub(what, "shape")), extent(shape[3], sub(what, "shape"))};
  const Json& values = field(j, "values", what);
  const std::string vw = sub(what, "values");
  const auto expect_len = [&](const Json& a, Index n, const char* level) {
    if (!a.is_array() || static_cast<Index>(a.size()) != n)
      fail(vw, "an array of " + std::to_string(n) + " (" + level + ") for shape " + to_string(s), a);
  };
  // The nesting is checked before the tensor is allocated: the shape alone may claim any size (the fuzzer's
  // [2^31,2^31,2^31,2^31] overflowed the element count), the values the file really holds cannot.
  expect_len(values, s.B, "B");
  for (Index b = 0; b < s.B; ++b) {
    expect_len(values[b], s.H, "H");
    for (Index h = 0; h < s.H; ++h) {
      expect_len(values[b][h], s.T, "T");
      for (Index i = 0; i < s.T; ++i) expect_len(values[b][h][i], s.D, "last extent");
    }
  }
  Tensor<double> t(s);
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i)
        for (Index d = 0; d < s.D; ++d) t(b, h, i, d) = number_from_json(values[b][h][i][d], vw);
  return t;
}

namespace {
// A dense mask as {"B", "H", "cells": one string of '0' and '1' per (b, h, query) row}: what a person reads.
Json dense_to_json(const DenseMask& m) {
  Json rows = Json::array();
  for (Index b = 0; b < m.B; ++b)
    for (Index h = 0; h < m.H; ++h)
      for (Index i = 0; i < m.T_q; ++i) {
        std::string r;
        for (Index j = 0; j < m.T_k; ++j) r += m.visible(b, h, i, j) ? '1' : '0';
        rows.push_back(r);
      }
  return Json{{"B", m.B}, {"H", m.H}, {"cells", rows}};
}

DenseMask dense_from_json(const Json& j, const std::string& what, Index B, Index H, Index T_q, Index T_k) {
  const std::string expected = "{\"B\": " + std::to_string(B) + " or 1, \"H\": " + std::to_string(H) +
                               " or 1, \"cells\": B·H·T_q = " + "rows of T_k = " + std::to_string(T_k) +
                               " characters '0' or '1'}";
  if (!j.is_object()) fail(what, expected, j);
  DenseMask m;
  const auto dim = [&](const char* key, Index full) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || (it->get<std::int64_t>() != 1 && it->get<std::int64_t>() != full))
      fail(what, expected, j);
    return Index(it->get<std::int64_t>());
  };
  m.B = dim("B", B);
  m.H = dim("H", H);
  m.T_q = T_q;
  m.T_k = T_k;
  const auto it = j.find("cells");
  if (it == j.end() || !it->is_array() || Index(it->size()) != m.B * m.H * T_q) fail(what, expected, j);
  for (const Json& row : *it) {
    if (!row.is_string() || Index(row.get<std::string>().size()) != T_k) fail(sub(what, "cells"), expected, row);
    for (const char c : row.get<std::string>()) {
      if (c != '0' && c != '1') fail(sub(what, "cells"), expected, row);
      m.cells.push_back(c == '1');
    }
  }
  return m;
}

// An index list as {"block_size", "rows": one array of entries per (b, kv head, query) row}: one list per kv head,
// its group the query heads over the kv heads.
Json index_list_to_json(const IndexList& l) {
  Json rows = Json::array();
  for (Index r = 0; r < l.B * l.H * l.T_q; ++r)
    rows.push_back(std::vector<std::int32_t>(l.indices.begin() + r * l.max_k, l.indices.begin() + (r + 1) * l.max_k));
  Json j{{"block_size", l.block_size}, {"rows", rows}};
  if (l.group == 1 && l.H > 1)
    j["per"] = "query_head";  // rows per query head (else per kv head: the same with H_kv = H)
  if (l.physical) j["space"] = "physical";         // crossing a paged call as the pool's slots
  if (l.counted) j["duplicates"] = "counted";      // a key listed n times weighs n times (else a row is a set)
  if (l.current_block) j["current_block"] = true;  // each query's own block selected besides the row
  return j;
}

// A tree as {"form": "parents", "parents": one array of T_q parents per batch entry} or {"form": "bitmask",
// "bit_order": "little" or "big", "offsets": B + 1 byte offsets, "bits": the bytes}.
Json tree_to_json(const TokenTree& t) {
  if (t.form == TokenTree::Form::bitmask)
    return Json{
        {"form", "bitmask"}, {"bit_order", t.big_endian ? "big" : "little"}, {"offsets", t.offsets}, {"bits", t.bits}};
  Json rows = Json::array();
  for (Index b = 0; b < t.B; ++b)
    rows.push_back(std::vector<std::int32_t>(t.parents.begin() + b * t.T_q, t.parents.begin() + (b + 1) * t.T_q));
  return Json{{"form", "parents"}, {"parents", rows}};
}

TokenTree tree_from_json(const Json& j, const std::string& what, Index B, Index T_q) {
  const std::string expected = "{\"form\": \"parents\", \"parents\": B = " + std::to_string(B) +
                               " arrays of T_q = " + std::to_string(T_q) +
                               " integers} or {\"form\": \"bitmask\", \"bit_order\": " +
                               "\"little\" or \"big\", \"offsets\": B + 1 integers, \"bits\": bytes}";
  if (!j.is_object() || !j.contains("form")) fail(what, expected, j);
  TokenTree t{.B = B, .T_q = T_q};
  if (j["form"] == "parents") {
    const auto rows = j.find("parents");
    if (rows == j.end() || !rows->is_array() || Index(rows->size()) != B) fail(what, expected, j);
    for (const Json& row : *rows) {
      if (!row.is_array() || Index(row.size()) != T_q) fail(sub(what, "parents"), expected, row);
      for (const Json& x : row) {
        if (!x.is_number_integer()) fail(sub(what, "parents"), expected, x);
        t.parents.push_back(std::int32_t(std::clamp<std::int64_t>(x.get<std::int64_t>(), -2, T_q)));
      }
    }
    return t;  // each parent's range is the core's to check
  }
  if (j["form"] != "bitmask") fail(sub(what, "form"), expected, j["form"]);
  t.form = TokenTree::Form::bitmask;
  const auto order = j.find("bit_order"), offsets = j.find("offsets"), bits = j.find("bits");
  if (order == j.end() || (*order != "little" && *order != "big") || offsets == j.end() || !offsets->is_array() ||
      Index(offsets->size()) != B + 1 || bits == j.end() || !bits->is_array())
    fail(what, expected, j);
  t.big_endian = *order == "big";
  for (const Json& x : *offsets) {
    if (!x.is_number_integer()) fail(sub(what, "offsets"), expected, x);
    t.offsets.push_back(x.get<std::int64_t>());
  }
  for (const Json& x : *bits) {
    if (!x.is_number_unsigned() || x.get<std::uint64_t>() > 255) fail(sub(what, "bits"), expected, x);
    t.bits.push_back(std::uint8_t(x.get<std::uint64_t>()));
  }
  return t;
}

IndexList index_list_from_json(const Json& j, const std::string& what, Index B, Index H, Index H_kv, Index T_q) {
  const std::string expected =
      "{\"block_size\": an integer >= 1, \"rows\": B·H_kv·T_q = " + std::to_string(B * H_kv * T_q) +
      " arrays (with \"per\": \"query_head\", B·H·T_q = " + std::to_string(B * H * T_q) +
      ") of the same length of integers >= -1}";
  if (!j.is_object()) fail(what, expected, j);
  const auto bs = j.find("block_size");
  const auto rows = j.find("rows");
  const auto per = j.find("per");
  if (per != j.end() && *per != "query_head" && *per != "kv_head") fail(sub(what, "per"), expected, *per);
  const auto space = j.find("space");
  if (space != j.end() && *space != "physical" && *space != "logical") fail(sub(what, "space"), expected, *space);
  const auto duplicates = j.find("duplicates");
  if (duplicates != j.end() && *duplicates != "counted" && *duplicates != "once")
    fail(sub(what, "duplicates"), "\"counted\" or \"once\"", *duplicates);
  const Index heads = per != j.end() && *per == "query_head" ? H : H_kv;
  if (bs == j.end() || !bs->is_number_integer() || bs->get<std::int64_t>() < 1 || rows == j.end() ||
      !rows->is_array() || Index(rows->size()) != B * heads * T_q)
    fail(what, expected, j);
  IndexList l{.block_size = bs->get<std::int64_t>(),
              .group = heads > 0 ? H / heads : 1,
              .B = B,
              .H = heads,
              .T_q = T_q,
              .max_k = rows->empty() ? 0 : Index((*rows)[0].is_array() ? (*rows)[0].size() : 0),
              .indices = {}};
  l.physical = space != j.end() && *space == "physical";
  l.counted = duplicates != j.end() && *duplicates == "counted";
  if (const auto cb = j.find("current_block"); cb != j.end()) {
    if (!cb->is_boolean()) fail(sub(what, "current_block"), "true or false", *cb);
    l.current_block = cb->get<bool>();
  }
  for (const Json& row : *rows) {
    if (!row.is_array() || Index(row.size()) != l.max_k) fail(sub(what, "rows"), expected, row);
    for (const Json& x : row) {
      if (!x.is_number_integer() || x.get<std::int64_t>() < -1 || x.get<std::int64_t>() > INT32_MAX)
        fail(sub(what, "rows"), expected, row);
      l.indices.push_back(std::int32_t(x.get<std::int64_t>()));
    }
  }
  return l;
}

// A block mask as {"block_q", "block_k", "B", "H", "kinds": one string of 'E' (empty), 'P' (partial) and 'F'
// (full) per (b, h, query block) row, "partial": its dense cells, when a block is partial}.
Json block_to_json(const BlockMask& m) {
  Json rows = Json::array();
  for (Index b = 0; b < m.B; ++b)
    for (Index h = 0; h < m.H; ++h)
      for (Index x = 0; x < m.q_blocks; ++x) {
        std::string r;
        for (Index y = 0; y < m.k_blocks; ++y) r += "EPF"[int(m.kind(b, h, x, y))];
        rows.push_back(r);
      }
  Json j{{"block_q", m.block_q}, {"block_k", m.block_k}, {"B", m.B}, {"H", m.H}, {"kinds", rows}};
  if (!m.partial.cells.empty()) j["partial"] = dense_to_json(m.partial);
  return j;
}

// Values [B|1, H|1, rows, cols] as {"B", "H", "values": B·H·rows rows of cols numbers}: a bias, a temperature
// (cols = T_q, rows = 1).
Json broadcast_rows_to_json(Index B, Index H, Index rows, Index cols, const std::vector<double>& values) {
  Json out = Json::array();
  for (Index r = 0; r < B * H * rows; ++r) {
    Json row = Json::array();
    for (Index j = 0; j < cols; ++j) row.push_back(number_to_json(values[std::size_t(r * cols + j)]));
    out.push_back(row);
  }
  return Json{{"B", B}, {"H", H}, {"values", out}};
}

// The inverse: B and H (each the call's or 1) into *B_out and *H_out, and the values; `expected` says what should
// have come. check_call (the one check of a call) then says whether each value is allowed.
std::vector<double> broadcast_rows_from_json(const Json& j, const std::string& what, const std::string& expected,
                                             Index B, Index H, Index rows, Index cols, Index* B_out, Index* H_out) {
  if (!j.is_object()) fail(what, expected, j);
  const auto dim = [&](const char* key, Index full) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || (it->get<std::int64_t>() != 1 && it->get<std::int64_t>() != full))
      fail(what, expected, j);
    return Index(it->get<std::int64_t>());
  };
  *B_out = dim("B", B);
  *H_out = dim("H", H);
  const auto it = j.find("values");
  if (it == j.end() || !it->is_array() || Index(it->size()) != *B_out * *H_out * rows) fail(what, expected, j);
  std::vector<double> values;
  for (const Json& row : *it) {
    if (!row.is_array() || Index(row.size()) != cols) fail(sub(what, "values"), expected, row);
    for (const Json& x : row) values.push_back(number_from_json(x, sub(what, "values")));
  }
  return values;
}

Json bias_to_json(const ScoreBias& bias) {
  return broadcast_rows_to_json(bias.B, bias.H, bias.T_q, bias.T_k, bias.values);
}

ScoreBias bias_from_json(const Json& j, const std::string& what, Index B, Index H, Index T_q, Index T_k) {
  const std::string expected = "{\"B\": " + std::to_string(B) + " or 1, \"H\": " + std::to_string(H) +
                               " or 1, \"values\": B·H·T_q rows of T_k = " + std::to_string(T_k) + " numbers}";
  ScoreBias bias{.T_q = T_q, .T_k = T_k};
  bias.values = broadcast_rows_from_json(j, what, expected, B, H, T_q, T_k, &bias.B, &bias.H);
  return bias;
}

// A rope: its variant, rotary_dim, base, factor, and B rows of q's and of k's position ids.
Json rope_to_json(const Rope& r, Index B) {
  const auto rows = [&](const std::vector<Index>& p) {
    Json out = Json::array();
    const std::size_t T = B > 0 ? p.size() / std::size_t(B) : 0;
    for (Index b = 0; b < B; ++b) out.push_back(Json(std::vector<Index>(p.begin() + b * T, p.begin() + (b + 1) * T)));
    return out;
  };
  Json j{{"variant", r.variant == RopeVariant::half_split ? "half-split" : "interleaved"},
         {"rotary_dim", r.rotary_dim},
         {"base", number_to_json(r.base)},
         {"factor", number_to_json(r.factor)},
         {"q_positions", rows(r.q_positions)},
         {"k_positions", rows(r.k_positions)}};
  if (r.scaling == RopeScaling::ntk) j["scaling"] = "ntk";
  if (r.scaling == RopeScaling::llama3) {
    j["scaling"] = "llama3";
    j["low_freq_factor"] = number_to_json(r.low_freq_factor);
    j["high_freq_factor"] = number_to_json(r.high_freq_factor);
    j["original_max_position"] = number_to_json(r.original_max_position);
  }
  return j;
}

// The inverse; check_call then says whether each field and position is allowed.
Rope rope_from_json(const Json& j, const std::string& what, Index B, Index T_q, Index T_k) {
  const std::string expected =
      "{\"variant\": \"half-split\" or \"interleaved\", \"rotary_dim\": an even integer, "
      "\"base\", \"factor\": numbers, optionally \"scaling\": \"ntk\" or \"llama3\" (with \"low_freq_factor\", "
      "\"high_freq_factor\", \"original_max_position\": numbers), \"q_positions\": B = " +
      std::to_string(B) + " rows of T_q = " + std::to_string(T_q) +
      " integers, \"k_positions\": B rows of T_k = " + std::to_string(T_k) + "}";
  if (!j.is_object()) fail(what, expected, j);
  Rope r;
  const auto v = j.find("variant");
  if (v == j.end() || !v->is_string() || (*v != "half-split" && *v != "interleaved"))
    fail(sub(what, "variant"), expected, j);
  r.variant = *v == "half-split" ? RopeVariant::half_split : RopeVariant::interleaved;
  const auto d = j.find("rotary_dim");
  if (d == j.end() || !d->is_number_integer()) fail(sub(what, "rotary_dim"), expected, j);
  r.rotary_dim = Index(d->get<std::int64_t>());
  for (const auto& [key, field] : {std::pair{"base", &r.base}, {"factor", &r.factor}}) {
    const auto it = j.find(key);
    if (it == j.end()) fail(sub(what, key), expected, j);
    *field = number_from_json(*it, sub(what, key));
  }
  const auto rows = [&](const char* key, Index T) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_array() || Index(it->size()) != B) fail(sub(what, key), expected, j);
    std::vector<Index> out;
    for (const Json& row : *it) {
      if (!row.is_array() || Index(row.size()) != T) fail(sub(what, key), expected, row);
      for (const Json& x : row) {
        if (!x.is_number_integer()) fail(sub(what, key), expected, x);
        out.push_back(Index(x.get<std::int64_t>()));
      }
    }
    return out;
  };
  r.q_positions = rows("q_positions", T_q);
  r.k_positions = rows("k_positions", T_k);
  if (const auto sc = j.find("scaling"); sc != j.end()) {
    if (!sc->is_string() || (*sc != "ntk" && *sc != "llama3")) fail(sub(what, "scaling"), expected, *sc);
    r.scaling = *sc == "ntk" ? RopeScaling::ntk : RopeScaling::llama3;
    if (r.scaling == RopeScaling::llama3)
      for (const auto& [key, field] : {std::pair{"low_freq_factor", &r.low_freq_factor},
                                       {"high_freq_factor", &r.high_freq_factor},
                                       {"original_max_position", &r.original_max_position}}) {
        const auto it = j.find(key);
        if (it == j.end()) fail(sub(what, key), expected, j);
        *field = number_from_json(*it, sub(what, key));
      }
  }
  return r;
}

// A QK-norm: its eps, whether it sits outside the root, and each normalised side's D weights.
Json qk_norm_to_json(const QkNorm& n) {
  Json j{{"eps", number_to_json(n.eps)}, {"eps_outside", n.eps_outside}};
  for (const auto& [key, w] : {std::pair{"q_weight", &n.q_weight}, {"k_weight", &n.k_weight}})
    if (!w->empty()) {
      Json row = Json::array();
      for (const double x : *w) row.push_back(number_to_json(x));
      j[key] = row;
    }
  return j;
}

// The inverse; check_call then says whether eps and each weight are allowed, and the weights' count.
QkNorm qk_norm_from_json(const Json& j, const std::string& what) {
  const std::string expected =
      "{\"eps\": a number, \"eps_outside\": true or false, \"q_weight\" and/or \"k_weight\": D numbers}";
  if (!j.is_object()) fail(what, expected, j);
  QkNorm n;
  const auto eps = j.find("eps");
  if (eps == j.end()) fail(sub(what, "eps"), expected, j);
  n.eps = number_from_json(*eps, sub(what, "eps"));
  const auto outside = j.find("eps_outside");
  if (outside == j.end() || !outside->is_boolean()) fail(sub(what, "eps_outside"), expected, j);
  n.eps_outside = outside->get<bool>();
  for (const auto& [key, w] : {std::pair{"q_weight", &n.q_weight}, {"k_weight", &n.k_weight}})
    if (const auto it = j.find(key); it != j.end()) {
      if (!it->is_array()) fail(sub(what, key), expected, *it);
      for (const Json& x : *it) w->push_back(number_from_json(x, sub(what, key)));
    }
  return n;
}

// A dropout: its p, seed and offset (the mask is the implementation's to draw; a case never holds one).
Json dropout_to_json(const Dropout& d) {
  return Json{{"p", number_to_json(d.p)}, {"seed", d.seed}, {"offset", d.offset}};
}

// The inverse; check_call then says whether p is allowed.
Dropout dropout_from_json(const Json& j, const std::string& what) {
  const std::string expected = "{\"p\": a number in [0, 1), \"seed\" and \"offset\": integers in [0, 2^64)}";
  if (!j.is_object()) fail(what, expected, j);
  Dropout d;
  const auto p = j.find("p");
  if (p == j.end()) fail(sub(what, "p"), expected, j);
  d.p = number_from_json(*p, sub(what, "p"));
  for (const auto& [key, field] : {std::pair{"seed", &d.seed}, {"offset", &d.offset}}) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_unsigned()) fail(sub(what, key), expected, it == j.end() ? j : *it);
    *field = it->get<std::uint64_t>();
  }
  return d;
}

// A quantised cache: its format and each side's granularity, scales and zero points (k and v hold the dequantised
// values; the codes follow from them and are checked by check_call).
Json quant_to_json(const QuantizedKV& q) {
  const auto side = [](const QuantScales& s) {
    Json j{{"granularity", std::string(quant_granularity_name(s.granularity))}, {"scales", Json::array()}};
    for (const double x : s.scales) j["scales"].push_back(number_to_json(x));
    if (!s.zero_points.empty()) {
      j["zero_points"] = Json::array();
      for (const double z : s.zero_points) j["zero_points"].push_back(number_to_json(z));
    }
    if (!s.mins.empty()) {
      j["mins"] = Json::array();
      for (const double m : s.mins) j["mins"].push_back(number_to_json(m));
    }
    return j;
  };
  Json j{{"format", std::string(quant_format_name(q.format))}, {"k", side(q.k)}, {"v", side(q.v)}};
  if (q.q) j["q"] = side(*q.q);
  return j;
}

// The inverse, for caches of shapes k and v; check_call then checks the scales and the values.
QuantizedKV quant_from_json(const Json& j, const std::string& what, const Shape& k, const Shape& v,
                            const Shape& q_shape) {
  const std::string expected =
      "{\"format\": \"e4m3fn\", \"e5m2\", \"int8\", \"q8_0\", \"q4_0\", \"q4_1\", \"q5_0\" or \"q5_1\", \"k\" and "
      "\"v\": "
      "{\"granularity\": \"tensor\", \"kv_head\", \"token_head\" or \"block32\", \"scales\": [numbers], "
      "\"zero_points\" (int8): [integers], \"mins\" (q4_1, q5_1): [numbers]}, and \"q\" (a quantised Q, FP8 or "
      "int8) as \"k\" without zero points or mins}";
  if (!j.is_object()) fail(what, expected, j);
  QuantizedKV q;
  const Json& f = field(j, "format", what);
  const std::optional<QuantFormat> format = f.is_string() ? parse_quant_format(f.get<std::string>()) : std::nullopt;
  if (!format) fail(sub(what, "format"), expected, f);
  q.format = *format;
  const auto side = [&](const char* key, const Shape& cache) {
    const std::string w = sub(what, key);
    const Json& s = field(j, key, what);
    if (!s.is_object()) fail(w, expected, s);
    const Json& g = field(s, "granularity", w);
    const std::optional<QuantGranularity> gr =
        g.is_string() ? parse_quant_granularity(g.get<std::string>()) : std::nullopt;
    if (!gr) fail(sub(w, "granularity"), expected, g);
    QuantScales out = quant_extents(*gr, cache);
    const Json& sc = field(s, "scales", w);
    if (!sc.is_array()) fail(sub(w, "scales"), expected, sc);
    for (const Json& x : sc) out.scales.push_back(number_from_json(x, sub(w, "scales")));
    if (const auto z = s.find("zero_points"); z != s.end()) {
      if (!z->is_array()) fail(sub(w, "zero_points"), expected, *z);
      for (const Json& x : *z) out.zero_points.push_back(number_from_json(x, sub(w, "zero_points")));
    }
    if (const auto m = s.find("mins"); m != s.end()) {
      if (!m->is_array()) fail(sub(w, "mins"), expected, *m);
      for (const Json& x : *m) out.mins.push_back(number_from_json(x, sub(w, "mins")));
    }
    return out;
  };
  q.k = side("k", k);
  q.v = side("v", v);
  if (j.contains("q")) q.q = side("q", q_shape);
  return q;
}

// A temperature as B·H rows of T_q numbers.
Json temperature_to_json(const QueryTemperature& t) { return broadcast_rows_to_json(t.B, t.H, 1, t.T_q, t.values); }

QueryTemperature temperature_from_json(const Json& j, const std::string& what, Index B, Index H, Index T_q) {
  const std::string expected = "{\"B\": " + std::to_string(B) + " or 1, \"H\": " + std::to_string(H) +
                               " or 1, \"values\": B·H rows of T_q = " + std::to_string(T_q) + " numbers}";
  QueryTemperature t{.T_q = T_q};
  t.values = broadcast_rows_from_json(j, what, expected, B, H, 1, T_q, &t.B, &t.H);
  return t;
}

BlockMask block_from_json(const Json& j, const std::string& what, Index B, Index H, Index T_q, Index T_k) {
  const std::string expected = "{\"block_q\", \"block_k\": integers >= 1, \"B\": " + std::to_string(B) +
                               " or 1, \"H\": " + std::to_string(H) +
                               " or 1, \"kinds\": B·H·ceil(T_q/block_q) rows of ceil(T_k/block_k) characters E, P or "
                               "F, \"partial\": a dense mask when a block is P}";
  if (!j.is_object()) fail(what, expected, j);
  BlockMask m;
  const auto integer = [&](const char* key, Index min) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<std::int64_t>() < min) fail(what, expected, j);
    return Index(it->get<std::int64_t>());
  };
  m.block_q = integer("block_q", 1);
  m.block_k = integer("block_k", 1);
  m.B = integer("B", 1);
  m.H = integer("H", 1);
  if ((m.B != 1 && m.B != B) || (m.H != 1 && m.H != H)) fail(what, expected, j);
  m.q_blocks = (T_q + m.block_q - 1) / m.block_q;
  m.k_blocks = (T_k + m.block_k - 1) / m.block_k;
  const auto it = j.find("kinds");
  if (it == j.end() || !it->is_array() || Index(it->size()) != m.B * m.H * m.q_blocks) fail(what, expected, j);
  bool partial = false;
  for (const Json& row : *it) {
    if (!row.is_string() || Index(row.get<std::string>().size()) != m.k_blocks) fail(sub(what, "kinds"), expected, row);
    for (const char c : row.get<std::string>()) {
      if (c != 'E' && c != 'P' && c != 'F') fail(sub(what, "kinds"), expected, row);
      m.kinds.push_back(std::uint8_t(c == 'E' ? BlockKind::Empty : c == 'P' ? BlockKind::Partial : BlockKind::Full));
      partial |= c == 'P';
    }
  }
  if (const auto pt = j.find("partial"); pt != j.end()) m.partial = dense_from_json(*pt, sub(what, "partial"), B, H, T_q, T_k);
  else if (partial) fail(what, expected + " (a block is P but there is no \"partial\")", j);
  return m;
}
}  // namespace

Json to_json(const Problem& p) {
  Json j{{"dtype", dtype_name(p.dtype)},
         {"alignment", alignment_name(p.alignment)},
         {"scale", p.scale ? number_to_json(*p.scale) : Json(nullptr)},
         {"want_weights", p.want_weights}};
  // Written only when used, so a problem without them reads as it always did.
  if (!p.key_lengths.empty()) j["key_lengths"] = p.key_lengths;
  if (p.window) j["window"] = *p.window;
  if (p.softcap) j["softcap"] = number_to_json(*p.softcap);
  if (!p.alibi_slopes.empty()) {
    Json a = Json::array();
    for (const double x : p.alibi_slopes) a.push_back(number_to_json(x));
    j["alibi_slopes"] = a;
  }
  if (!p.sinks.empty()) {
    Json a = Json::array();
    for (const double x : p.sinks) a.push_back(number_to_json(x));
    j["sinks"] = a;
  }
  if (!p.causal) j["causal"] = false;
  if (p.prefix_length != 0) j["prefix_length"] = p.prefix_length;
  if (p.window_right) j["window_right"] = *p.window_right;
  if (p.chunk_size != 0) j["chunk_size"] = p.chunk_size;
  if (!p.doc_bounds.empty()) j["doc_bounds"] = p.doc_bounds;
  if (!p.q_doc_bounds.empty()) j["q_doc_bounds"] = p.q_doc_bounds;
  if (p.block_mask) j["block_mask"] = block_to_json(*p.block_mask);
  if (p.dense_mask) j["dense_mask"] = dense_to_json(*p.dense_mask);
  if (p.index_list) j["index_list"] = index_list_to_json(*p.index_list);
  if (p.tree) j["tree"] = tree_to_json(*p.tree);
  if (p.bias) j["bias"] = bias_to_json(*p.bias);
  if (p.temperature) j["temperature"] = temperature_to_json(*p.temperature);
  if (p.rope) j["rope"] = rope_to_json(*p.rope, p.q.shape().B);
  if (p.qk_norm) j["qk_norm"] = qk_norm_to_json(*p.qk_norm);
  if (p.dropout) j["dropout"] = dropout_to_json(*p.dropout);
  if (p.quant) j["quant"] = quant_to_json(*p.quant);
  if (p.want_lse) j["want_lse"] = true;
  if (p.layout != InputLayout::contiguous) j["layout"] = input_layout_name(p.layout);
  if (p.paged) {
    const PagedPlan& pl = *p.paged;
    const PagedKV pk = p.paged_kv();
    // The plan is what a replay reads; num_pages and block_table are what it derives, for the person reading.
    j["paged"] = Json{{"page_size", pl.page_size},         {"layout", page_layout_name(pl.layout)},
                      {"order", page_order_name(pl.order)}, {"shuffle_seed", pl.shuffle_seed},
                      {"spare_pages", pl.spare_pages},      {"spare_columns", pl.spare_columns},
                      {"junk_entries", pl.junk_entries},    {"fill", page_fill_name(pl.fill)},
                      {"shared_pages", pl.shared_pages},    {"num_pages", pk.num_pages},
                      {"max_pages", pk.max_pages},          {"block_table", pk.block_table}};
  }
  j["q"] = to_json(p.q);
  j["k"] = to_json(p.k);
  j["v"] = to_json(p.v);
  if (p.d_output) j["d_output"] = to_json(*p.d_output);
  return j;
}

Problem problem_from_json(const Json& j, std::string_view what) {
  Problem p;
  const Json& dtype = field(j, "dtype", what);
  if (!dtype.is_string()) fail(sub(what, "dtype"), "a dtype name", dtype);
  p.dtype = dtype_field(dtype.get<std::string>());
  const Json& align = field(j, "alignment", what);
  if (align == "top-left") p.alignment = CausalAlignment::TopLeft;
  else if (align == "bottom-right") p.alignment = CausalAlignment::BottomRight;
  else fail(sub(what, "alignment"), "\"top-left\" or \"bottom-right\"", align);
  const Json& scale = field(j, "scale", what);
  if (!scale.is_null()) p.scale = number_from_json(scale, sub(what, "scale"));
  const Json& want = field(j, "want_weights", what);
  if (!want.is_boolean()) fail(sub(what, "want_weights"), "true or false", want);
  p.want_weights = want.get<bool>();
  p.q = tensor_from_json(field(j, "q", what), sub(what, "q"));
  p.k = tensor_from_json(field(j, "k", what), sub(what, "k"));
  p.v = tensor_from_json(field(j, "v", what), sub(what, "v"));
  const Shape q = p.q.shape(), k = p.k.shape();
  // Here the fields' JSON types; what their values must be (ranges, counts, order) is check_call's, below.
  const auto integer = [&](const Json& x, const char* key) {
    if (!x.is_number_integer()) fail(sub(what, key), "an integer", x);
    return Index(x.get<std::int64_t>());
  };
  if (const auto it = j.find("key_lengths"); it != j.end()) {
    if (!it->is_array()) fail(sub(what, "key_lengths"), "an array of B = " + std::to_string(q.B) + " lengths", *it);
    for (const Json& len : *it) p.key_lengths.push_back(integer(len, "key_lengths"));
  }
  if (const auto it = j.find("window"); it != j.end()) p.window = integer(*it, "window");
  if (const auto it = j.find("softcap"); it != j.end()) p.softcap = number_from_json(*it, sub(what, "softcap"));
  // One number per query head (number_from_json reads "-inf" and the other non-finite spellings).
  const auto per_head = [&](const char* key, std::vector<double>& out) {
    const auto it = j.find(key);
    if (it == j.end()) return;
    if (!it->is_array()) fail(sub(what, key), "an array of H = " + std::to_string(q.H) + " numbers", *it);
    for (const Json& x : *it) out.push_back(number_from_json(x, sub(what, key)));
  };
  per_head("alibi_slopes", p.alibi_slopes);
  per_head("sinks", p.sinks);
  if (const auto it = j.find("causal"); it != j.end()) {
    if (!it->is_boolean()) fail(sub(what, "causal"), "true or false", *it);
    p.causal = it->get<bool>();
  }
  // Masks beyond causal: integers, and the document bounds one array of integers per batch entry.
  const auto count = [&](const char* key) -> std::optional<Index> {
    const auto it = j.find(key);
    return it == j.end() ? std::nullopt : std::optional<Index>(integer(*it, key));
  };
  p.prefix_length = count("prefix_length").value_or(0);
  p.window_right = count("window_right");
  p.chunk_size = count("chunk_size").value_or(0);
  const auto bounds_of = [&](const char* key, const char* positions) {
    std::vector<std::vector<Index>> all;
    const auto it = j.find(key);
    if (it == j.end()) return all;
    const std::string expected = "an array of B = " + std::to_string(q.B) + " arrays of non-decreasing " + positions +
                                 " >= 0 (where each document ends)";
    if (!it->is_array()) fail(sub(what, key), expected, *it);
    for (const Json& row : *it) {
      if (!row.is_array()) fail(sub(what, key), expected, row);
      std::vector<Index> bounds;
      for (const Json& x : row) bounds.push_back(integer(x, key));
      all.push_back(std::move(bounds));
    }
    return all;
  };
  p.doc_bounds = bounds_of("doc_bounds", "key positions");
  p.q_doc_bounds = bounds_of("q_doc_bounds", "query indices");
  if (const auto it = j.find("block_mask"); it != j.end())
    p.block_mask = block_from_json(*it, sub(what, "block_mask"), q.B, q.H, q.T, k.T);
  if (const auto it = j.find("dense_mask"); it != j.end())
    p.dense_mask = dense_from_json(*it, sub(what, "dense_mask"), q.B, q.H, q.T, k.T);
  if (const auto it = j.find("index_list"); it != j.end())
    p.index_list = index_list_from_json(*it, sub(what, "index_list"), q.B, q.H, k.H, q.T);
  if (const auto it = j.find("tree"); it != j.end()) p.tree = tree_from_json(*it, sub(what, "tree"), q.B, q.T);
  if (const auto it = j.find("bias"); it != j.end()) p.bias = bias_from_json(*it, sub(what, "bias"), q.B, q.H, q.T, k.T);
  if (const auto it = j.find("temperature"); it != j.end())
    p.temperature = temperature_from_json(*it, sub(what, "temperature"), q.B, q.H, q.T);
  if (const auto it = j.find("rope"); it != j.end()) p.rope = rope_from_json(*it, sub(what, "rope"), q.B, q.T, k.T);
  if (const auto it = j.find("qk_norm"); it != j.end()) p.qk_norm = qk_norm_from_json(*it, sub(what, "qk_norm"));
  if (const auto it = j.find("dropout"); it != j.end()) p.dropout = dropout_from_json(*it, sub(what, "dropout"));
  if (const auto it = j.find("quant"); it != j.end())
    p.quant = quant_from_json(*it, sub(what, "quant"), p.k.shape(), p.v.shape(), p.q.shape());
  if (const auto it = j.find("want_lse"); it != j.end()) {
    if (!it->is_boolean()) fail(sub(what, "want_lse"), "true or false", *it);
    p.want_lse = it->get<bool>();
  }
  if (const auto it = j.find("layout"); it != j.end()) {
    const char* expected = "\"token-major\", \"padded\", \"kv-broadcast\", \"kv-interleaved\" or \"v-is-k\"";
    if (!it->is_string()) fail(sub(what, "layout"), expected, *it);
    bool known = false;
    for (const InputLayout l : {InputLayout::contiguous, InputLayout::token_major, InputLayout::padded,
                                InputLayout::kv_broadcast, InputLayout::kv_interleaved, InputLayout::v_is_k})
      if (input_layout_name(l) == it->get<std::string>()) {
        p.layout = l;
        known = true;
      }
    if (!known) fail(sub(what, "layout"), expected, *it);
  }
  if (const auto it = j.find("paged"); it != j.end()) {
    const std::string pw = sub(what, "paged");
    if (!it->is_object()) fail(pw, "an object (page_size, layout, order, ...)", *it);
    PagedPlan pl;
    const auto bounded = [&](const char* key, Index lo, Index hi) {
      const Json& x = field(*it, key, pw);
      if (!x.is_number_integer() || x.get<std::int64_t>() < lo || x.get<std::int64_t>() > hi)
        fail(sub(pw, key), "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", x);
      return Index(x.get<std::int64_t>());
    };
    const auto name = [&](const char* key, std::initializer_list<const char*> names) {
      const Json& x = field(*it, key, pw);
      std::string expected;
      int index = 0;
      for (const char* n : names) {
        if (x.is_string() && x.get<std::string>() == n) return index;
        expected += (expected.empty() ? "\"" : ", \"") + std::string(n) + "\"";
        ++index;
      }
      fail(sub(pw, key), "one of " + expected, x);
    };
    pl.page_size = bounded("page_size", 1, Index{1} << 20);
    pl.layout = name("layout", {"token-major", "head-major"}) == 0 ? PageLayout::token_major : PageLayout::head_major;
    pl.order = PagedPlan::Order(name("order", {"contiguous", "reversed", "shuffled"}));
    pl.shuffle_seed = std::uint64_t(bounded("shuffle_seed", 0, Index{1} << 52));
    pl.spare_pages = bounded("spare_pages", 0, Index{1} << 16);
    pl.spare_columns = bounded("spare_columns", 0, Index{1} << 16);
    const Json& junk = field(*it, "junk_entries", pw);
    if (!junk.is_boolean()) fail(sub(pw, "junk_entries"), "true or false", junk);
    pl.junk_entries = junk.get<bool>();
    pl.fill = PageFill(name("fill", {"zero", "nan", "inf", "-inf", "1e30"}));
    pl.shared_pages = bounded("shared_pages", 0, Index{1} << 20);
    p.paged = pl;
  }
  if (const auto it = j.find("d_output"); it != j.end() && !it->is_null())
    p.d_output = tensor_from_json(*it, sub(what, "d_output"));
  try {
    check_call(std::string(what).c_str(), p);
  } catch (const std::invalid_argument& e) {  // ShapeError, ValueError
    throw FormatError(e.what());
  }
  return p;
}

Json to_json(const LawCase& c) {
  Json params = Json::object();
  for (const auto& [key, value] : c.params) params[key] = number_to_json(value);
  Json j{{"problem", to_json(c.problem)},
         {"variant", problem_or_null(c.variant)},
         {"params", std::move(params)},
         {"tags", c.tags}};
  // Written only when a position was deleted while shrinking, so a case without it reads (and hashes) as it
  // always did.
  if (!c.positions.empty()) j["positions"] = c.positions;
  return j;
}

LawCase law_case_from_json(const Json& j, std::string_view what) {
  LawCase c;
  c.problem = problem_from_json(field(j, "problem", what), sub(what, "problem"));
  if (const auto it = j.find("variant"); it != j.end() && !it->is_null())
    c.variant = problem_from_json(*it, sub(what, "variant"));
  if (const auto it = j.find("params"); it != j.end()) {
    if (!it->is_object()) fail(sub(what, "params"), "an object of numbers", *it);
    for (const auto& [key, value] : it->items()) c.params[key] = number_from_json(value, sub(what, "params." + key));
  }
  if (const auto it = j.find("tags"); it != j.end()) {
    if (!it->is_array()) fail(sub(what, "tags"), "an array of strings", *it);
    for (const auto& t : *it) {
      if (!t.is_string()) fail(sub(what, "tags"), "a string", t);
      c.tags.push_back(t.get<std::string>());
    }
  }
  if (const auto it = j.find("positions"); it != j.end() && !it->is_null()) {
    const Index T = c.problem.q.shape().T;
    if (!it->is_array() || Index(it->size()) != T)
      fail(sub(what, "positions"), "an array of T_q = " + std::to_string(T) + " distinct ids", *it);
    for (const Json& id : *it) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0) fail(sub(what, "positions"), "an integer >= 0", id);
      c.positions.push_back(Index(id.get<std::int64_t>()));
    }
  }
  return c;
}

Json to_json(const Violation& v) {
  Json series = Json::array();
  for (const auto& pt : v.series)
    series.push_back(Json::array({number_to_json(pt.D), number_to_json(pt.variance), number_to_json(pt.low),
                                  number_to_json(pt.high)}));
  Json j{{"message", v.message},
         {"quantity", v.quantity},
         {"worst_index", v.worst_index},
         {"magnitude", number_to_json(v.magnitude)},
         {"tolerance", number_to_json(v.tolerance)},
         {"margin", number_to_json(margin(v))},  // derived (magnitude / tolerance); not read back
         {"expected", tensor_or_null(v.expected)},
         {"actual", tensor_or_null(v.actual)},
         {"tolerances", tensor_or_null(v.tolerances)},
         {"weights", tensor_or_null(v.weights)},
         {"series", std::move(series)}};
  // Written only when they hold something, so a violation without them reads as it always did. "exact": the
  // law (or the entry) allows no difference at all, so the tolerance 0 above is no tolerance but exactness.
  if (v.quantity != "call" && v.tolerance <= 0) j["exact"] = true;
  if (v.call) j["call"] = Json{{"what", v.call_what}, {"problem", to_json(*v.call)}};
  return j;
}

Violation violation_from_json(const Json& j, std::string_view what) {
  Violation v;
  const Json& message = field(j, "message", what);
  if (!message.is_string()) fail(sub(what, "message"), "a string", message);
  v.message = message.get<std::string>();
  if (const auto it = j.find("quantity"); it != j.end() && it->is_string()) v.quantity = it->get<std::string>();
  if (const auto it = j.find("worst_index"); it != j.end()) {
    if (!it->is_array()) fail(sub(what, "worst_index"), "an array of indices", *it);
    for (const auto& i : *it) {
      if (!i.is_number_integer()) fail(sub(what, "worst_index"), "an integer", i);
      v.worst_index.push_back(static_cast<Index>(i.get<std::int64_t>()));
    }
  }
  if (const auto it = j.find("magnitude"); it != j.end()) v.magnitude = number_from_json(*it, sub(what, "magnitude"));
  if (const auto it = j.find("tolerance"); it != j.end()) v.tolerance = number_from_json(*it, sub(what, "tolerance"));
  v.expected = optional_tensor(j, "expected", what);
  v.actual = optional_tensor(j, "actual", what);
  v.tolerances = optional_tensor(j, "tolerances", what);
  v.weights = optional_tensor(j, "weights", what);
  if (const auto it = j.find("series"); it != j.end()) {
    if (!it->is_array()) fail(sub(what, "series"), "an array of [D, variance, low, high] points", *it);
    for (const auto& pt : *it) {
      // Reports written before the band was recorded hold [D, variance]: their band is the point itself.
      if (!pt.is_array() || (pt.size() != 2 && pt.size() != 4))
        fail(sub(what, "series"), "a [D, variance, low, high] point", pt);
      const auto at = [&](std::size_t n) { return number_from_json(pt[n], sub(what, "series")); };
      const double var = at(1);
      v.series.push_back(VariancePoint{at(0), var, pt.size() == 4 ? at(2) : var, pt.size() == 4 ? at(3) : var});
    }
  }
  if (const auto it = j.find("call"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) fail(sub(what, "call"), "an object with \"what\" and \"problem\"", *it);
    v.call = problem_from_json(field(*it, "problem", sub(what, "call")), sub(what, "call.problem"));
    if (const auto w = it->find("what"); w != it->end()) {
      if (!w->is_string()) fail(sub(what, "call.what"), "a string", *w);
      v.call_what = w->get<std::string>();
    }
  }
  return v;
}

std::string dump_pretty(const Json& j) {
  std::string out;
  dump_into(j, 0, out);
  out += "\n";
  return out;
}

std::string case_hash(const LawCase& c) {
  std::uint64_t h = 14695981039346656037ull;  // FNV-1a 64 offset basis
  for (const unsigned char ch : to_json(c).dump(-1, ' ', false, Json::error_handler_t::replace)) {
    h ^= ch;
    h *= 1099511628211ull;  // FNV-1a 64 prime
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace attncheck::reports
