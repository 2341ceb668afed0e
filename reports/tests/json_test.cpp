// A stored counterexample must replay exactly: every double survives the JSON round trip bit for bit,
// non-finite values included, and a malformed file is refused with a message naming what was expected.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attncheck/report_json.hpp"

namespace attncheck::reports {
namespace {

using Lim = std::numeric_limits<double>;

// Values where a lossy encoding shows: non-finite ones, signed zero, the subnormal and normal extremes, and
// decimals whose shortest form is not their exact binary value.
const std::vector<double> kAwkward = {0.0,          -0.0,          1.0 / 3.0,     0.1,         -2.5e-310,
                                      Lim::denorm_min(), Lim::min(), Lim::max(),   Lim::lowest(), 1e300,
                                      Lim::infinity(), -Lim::infinity(), Lim::quiet_NaN(), 65504.0, -1e-45};

Tensor<double> awkward_tensor(Shape s, std::size_t offset) {
  Tensor<double> t(s);
  for (Index n = 0; n < t.size(); ++n) t.data()[n] = kAwkward[(static_cast<std::size_t>(n) + offset) % kAwkward.size()];
  return t;
}

// Bitwise equality, except that any NaN equals any NaN (the encoding keeps neither sign nor payload).
void expect_same_values(const Tensor<double>& a, const Tensor<double>& b) {
  ASSERT_EQ(a.shape(), b.shape());
  for (Index n = 0; n < a.size(); ++n) {
    const double x = a.data()[n], y = b.data()[n];
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(y)) << "entry " << n;
    } else {
      EXPECT_EQ(std::bit_cast<std::uint64_t>(x), std::bit_cast<std::uint64_t>(y)) << "entry " << n << ": " << x << " vs " << y;
    }
  }
}

Problem awkward_problem(std::size_t offset) {
  Problem p;
  p.dtype = DType::f64;
  p.q = awkward_tensor({1, 2, 3, 4}, offset);
  p.k = awkward_tensor({1, 2, 5, 4}, offset + 1);
  p.v = awkward_tensor({1, 2, 5, 4}, offset + 2);
  p.scale = 0.125;
  p.alignment = CausalAlignment::BottomRight;
  p.want_weights = false;
  return p;
}

TEST(ReportJson, lawCaseRoundTripsEveryDoubleIncludingNonFinite) {
  LawCase c;
  c.problem = awkward_problem(0);
  c.variant = awkward_problem(3);
  c.variant->alignment = CausalAlignment::TopLeft;
  c.variant->scale.reset();
  c.params = {{"t", 2}, {"huge", Lim::infinity()}, {"tiny", -Lim::denorm_min()}};
  c.tags = {"T=2..15", "regime=\"quoted\""};

  const std::string text = dump_pretty(to_json(c));
  const LawCase back = law_case_from_json(Json::parse(text), "case");

  expect_same_values(c.problem.q, back.problem.q);
  expect_same_values(c.problem.k, back.problem.k);
  expect_same_values(c.problem.v, back.problem.v);
  ASSERT_TRUE(back.variant.has_value());
  expect_same_values(c.variant->q, back.variant->q);
  EXPECT_EQ(back.problem.dtype, DType::f64);
  EXPECT_EQ(back.problem.scale, 0.125);
  EXPECT_EQ(back.problem.alignment, CausalAlignment::BottomRight);
  EXPECT_FALSE(back.problem.want_weights);
  EXPECT_EQ(back.variant->alignment, CausalAlignment::TopLeft);
  EXPECT_FALSE(back.variant->scale.has_value());
  EXPECT_EQ(back.params.at("t"), 2);
  EXPECT_EQ(back.params.at("huge"), Lim::infinity());
  EXPECT_EQ(std::bit_cast<std::uint64_t>(back.params.at("tiny")), std::bit_cast<std::uint64_t>(-Lim::denorm_min()));
  EXPECT_EQ(back.tags, c.tags);
}

// A gradient law's case keeps its upstream gradient dO (with the variant's), so --replay and the corpus call
// the backward with exactly the stored dO; a case without one reads back without one.
TEST(ReportJson, gradientCaseRoundTripsItsUpstreamGradient) {
  LawCase c;
  c.problem = awkward_problem(0);
  c.problem.d_output = awkward_tensor({1, 2, 3, 4}, 5);
  c.variant = awkward_problem(1);
  c.variant->d_output = awkward_tensor({1, 2, 3, 4}, 7);
  const LawCase back = law_case_from_json(Json::parse(dump_pretty(to_json(c))), "case");
  ASSERT_TRUE(back.problem.d_output.has_value());
  expect_same_values(*c.problem.d_output, *back.problem.d_output);
  ASSERT_TRUE(back.variant && back.variant->d_output);
  expect_same_values(*c.variant->d_output, *back.variant->d_output);
  EXPECT_FALSE(law_case_from_json(Json::parse(dump_pretty(to_json(LawCase{.problem = awkward_problem(0), .variant = {}, .params = {}, .tags = {}}))), "case")
                   .problem.d_output.has_value());
}

TEST(ReportJson, modifiersRoundTripAndBadOnesAreRefused) {
  LawCase c;
  c.problem = awkward_problem(0);
  c.problem.softcap = 1.0 / 3.0;
  c.problem.alibi_slopes = {0.5, 0.1};
  c.problem.sinks = {-Lim::infinity(), 2.5};
  c.problem.causal = false;
  c.problem.want_lse = true;
  const LawCase back = law_case_from_json(Json::parse(dump_pretty(to_json(c))), "case");
  EXPECT_EQ(back.problem.softcap, c.problem.softcap);
  EXPECT_EQ(back.problem.alibi_slopes, c.problem.alibi_slopes);
  EXPECT_EQ(back.problem.sinks, c.problem.sinks);
  EXPECT_FALSE(back.problem.causal);
  EXPECT_TRUE(back.problem.want_lse);
  // A problem without them writes none of the keys (old files and hashes read as before).
  const Json plain = to_json(awkward_problem(0));
  for (const char* key : {"softcap", "alibi_slopes", "sinks", "causal", "want_lse"}) EXPECT_FALSE(plain.contains(key)) << key;
  Json bad = to_json(c.problem);
  bad["sinks"] = Json::array({1.0});
  EXPECT_THROW(problem_from_json(bad, "p"), FormatError);
  bad = to_json(c.problem);
  bad["softcap"] = -1.0;
  EXPECT_THROW(problem_from_json(bad, "p"), FormatError);
}

// An additive bias round-trips bit for bit, broadcast extents included; a bias of the wrong extent or with a
// non-finite value is refused naming the field.
TEST(ReportJson, aBiasRoundTripsAndABadOneIsRefused) {
  Problem p = awkward_problem(0);  // B 1, H 2, T_q 3, T_k 5
  p.bias = ScoreBias{.B = 1, .H = 2, .T_q = 3, .T_k = 5};
  for (int n = 0; n < 30; ++n) p.bias->values.push_back(std::ldexp(double(n % 7) - 3.3, n % 5 - 2));
  Problem back = problem_from_json(Json::parse(dump_pretty(to_json(p))), "p");
  ASSERT_TRUE(back.bias.has_value());
  EXPECT_EQ(*back.bias, *p.bias);
  p.bias = ScoreBias{.B = 1, .H = 1, .T_q = 3, .T_k = 5, .values = std::vector<double>(15, -0.75)};
  back = problem_from_json(to_json(p), "p");
  EXPECT_EQ(*back.bias, *p.bias);
  EXPECT_FALSE(to_json(awkward_problem(0)).contains("bias"));  // none written without one: old hashes stay
  const auto refused = [&](Json j) {
    try {
      problem_from_json(j, "p");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  Json bad = to_json(p);
  bad["bias"]["H"] = 3;
  EXPECT_NE(refused(bad).find("p.bias"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["bias"]["values"][1] = Json::array({1.0, 2.0});
  EXPECT_NE(refused(bad).find("p.bias.values"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["bias"]["values"][2][4] = "inf";
  EXPECT_NE(refused(bad).find("bias value 14 is inf"), std::string::npos) << refused(bad);
}

// A temperature round-trips bit for bit, broadcast extents included; one of the wrong extent, or one that is not
// > 0, is refused naming the field.
TEST(ReportJson, aTemperatureRoundTripsAndABadOneIsRefused) {
  Problem p = awkward_problem(0);  // B 1, H 2, T_q 3
  p.temperature = QueryTemperature{.B = 1, .H = 2, .T_q = 3, .values = {0.5, 1.0 / 3, 2.75, 1e-3, 7.0, 1.0}};
  Problem back = problem_from_json(Json::parse(dump_pretty(to_json(p))), "p");
  ASSERT_TRUE(back.temperature.has_value());
  EXPECT_EQ(*back.temperature, *p.temperature);
  EXPECT_FALSE(to_json(awkward_problem(0)).contains("temperature"));  // none written without one: old hashes stay
  const auto refused = [&](Json j) {
    try {
      problem_from_json(j, "p");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  Json bad = to_json(p);
  bad["temperature"]["B"] = 2;
  EXPECT_NE(refused(bad).find("p.temperature"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["temperature"]["values"][1] = Json::array({1.0, 2.0});
  EXPECT_NE(refused(bad).find("p.temperature.values"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["temperature"]["values"][1][0] = 0.0;
  EXPECT_NE(refused(bad).find("temperature value 3 is 0"), std::string::npos) << refused(bad);
}

// A rope round-trips (its variant, rotary_dim, base, factor and positions); one with a bad field or position is
// refused naming the field.
TEST(ReportJson, aRopeRoundTripsAndABadOneIsRefused) {
  Problem p = awkward_problem(0);  // B 1, H 2, T_q 3, T_k 5
  p.rope = Rope{.variant = RopeVariant::interleaved,
                .rotary_dim = 2,
                .base = 5e5,
                .factor = 1.0 / 3,
                .q_positions = {40002, 40003, 40004},
                .k_positions = {0, 1, 40000, 40001, 40002}};
  Problem back = problem_from_json(Json::parse(dump_pretty(to_json(p))), "p");
  ASSERT_TRUE(back.rope.has_value());
  EXPECT_EQ(*back.rope, *p.rope);
  EXPECT_FALSE(to_json(awkward_problem(0)).contains("rope"));  // none written without one: old hashes stay
  const auto refused = [&](Json j) {
    try {
      problem_from_json(j, "p");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  Json bad = to_json(p);
  bad["rope"]["variant"] = "neox";
  EXPECT_NE(refused(bad).find("p.rope.variant"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["rope"]["k_positions"][0] = Json::array({1, 2});
  EXPECT_NE(refused(bad).find("p.rope.k_positions"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["rope"]["rotary_dim"] = 3;
  EXPECT_NE(refused(bad).find("rope rotary_dim is 3"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["rope"]["q_positions"][0][1] = -4;
  EXPECT_NE(refused(bad).find("rope q_positions[1] is -4"), std::string::npos) << refused(bad);
}

// A QK-norm round-trips (either side, eps and its placement); one with a bad field or weight count is refused.
TEST(ReportJson, aQkNormRoundTripsAndABadOneIsRefused) {
  Problem p = awkward_problem(0);
  const Index D = p.q.shape().D;
  p.qk_norm = QkNorm{.k_weight = std::vector<double>(std::size_t(D), 0.625), .eps = 1e-3, .eps_outside = true};
  Problem back = problem_from_json(Json::parse(dump_pretty(to_json(p))), "p");
  ASSERT_TRUE(back.qk_norm.has_value());
  EXPECT_EQ(*back.qk_norm, *p.qk_norm);
  EXPECT_FALSE(to_json(awkward_problem(0)).contains("qk_norm"));  // none written without one: old hashes stay
  const auto refused = [&](Json j) {
    try {
      problem_from_json(j, "p");
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string("read");
  };
  Json bad = to_json(p);
  bad["qk_norm"]["eps_outside"] = "yes";
  EXPECT_NE(refused(bad).find("p.qk_norm.eps_outside"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["qk_norm"]["k_weight"].push_back(1.0);
  EXPECT_NE(refused(bad).find("qk_norm k_weight has"), std::string::npos) << refused(bad);
  bad = to_json(p);
  bad["qk_norm"]["eps"] = 0.0;
  EXPECT_NE(refused(bad).find("qk_norm eps is 0"), std::string::npos) << refused(bad);
}

// A paged problem stores its plan (the table is derived from it, and written too for the person reading); a bad
// plan is refused naming the field and what was expected.
TEST(ReportJson, pagedPlanRoundTripsAndABadOneIsRefusedNamingTheField) {
  LawCase c;
  c.problem = awkward_problem(0);
  PagedPlan plan;
  plan.page_size = 8;
  plan.layout = PageLayout::head_major;
  plan.order = PagedPlan::Order::shuffled;
  plan.shuffle_seed = 123456789;
  plan.spare_pages = 2;
  plan.spare_columns = 1;
  plan.junk_entries = true;
  plan.fill = PageFill::neg_inf;
  plan.shared_pages = 1;
  c.problem.paged = plan;
  const Json j = to_json(c);
  const LawCase back = law_case_from_json(Json::parse(dump_pretty(j)), "case");
  ASSERT_TRUE(back.problem.paged);
  EXPECT_TRUE(*back.problem.paged == plan);
  EXPECT_EQ(j["problem"]["paged"]["block_table"].get<std::vector<std::int32_t>>(), c.problem.paged_kv().block_table);
  EXPECT_FALSE(to_json(awkward_problem(0)).contains("paged"));
  const auto refused = [&](const char* key, Json value, const std::string& expected) {
    Json bad = to_json(c.problem);
    bad["paged"][key] = value;
    try {
      problem_from_json(bad, "p");
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << key << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("p.paged.") + key), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << key << " = " << value.dump() << " was accepted";
  };
  refused("page_size", 0, "an integer in [1, ");
  refused("layout", "diagonal", "one of \"token-major\", \"head-major\"");
  refused("fill", 3, "one of \"zero\"");
  refused("junk_entries", "yes", "true or false");
}

TEST(ReportJson, nonFiniteNumbersAreSpelledAsDocumentedStrings) {
  EXPECT_EQ(number_to_json(Lim::infinity()), "inf");
  EXPECT_EQ(number_to_json(-Lim::infinity()), "-inf");
  EXPECT_EQ(number_to_json(Lim::quiet_NaN()), "nan");
  EXPECT_TRUE(number_to_json(-0.0).is_number());
  EXPECT_TRUE(std::signbit(number_from_json(Json::parse(number_to_json(-0.0).dump()), "x")));
  EXPECT_THROW(number_from_json("Infinity", "x"), FormatError);
  EXPECT_THROW(number_from_json(nullptr, "x"), FormatError);
}

TEST(ReportJson, violationRoundTripsWithTensorsAndSeries) {
  Violation v;
  v.message = "weights[0,0,0,1] = 0.5 but must be 0";
  v.quantity = "weights";
  v.worst_index = {0, 1, 2, 3};
  v.magnitude = 0.5;
  v.tolerance = Lim::denorm_min();
  v.actual = awkward_tensor({1, 2, 3, 4}, 5);
  v.tolerances = awkward_tensor({1, 2, 3, 4}, 6);
  v.series = {{2, 1.0000001, 0.75, 1.5}, {4, Lim::quiet_NaN(), 3, Lim::infinity()}};
  const Violation back = violation_from_json(Json::parse(dump_pretty(to_json(v))), "violation");
  EXPECT_EQ(back.message, v.message);
  EXPECT_EQ(back.worst_index, v.worst_index);
  EXPECT_EQ(back.magnitude, 0.5);
  EXPECT_EQ(back.tolerance, Lim::denorm_min());
  EXPECT_FALSE(back.expected.has_value());
  ASSERT_TRUE(back.actual.has_value());
  expect_same_values(*v.actual, *back.actual);
  ASSERT_TRUE(back.tolerances.has_value());
  expect_same_values(*v.tolerances, *back.tolerances);
  EXPECT_FALSE(back.weights.has_value());
  ASSERT_EQ(back.series.size(), 2u);
  EXPECT_EQ(back.series[0].variance, 1.0000001);
  EXPECT_EQ(back.series[0].low, 0.75);
  EXPECT_EQ(back.series[0].high, 1.5);
  EXPECT_TRUE(std::isnan(back.series[1].variance));
  EXPECT_EQ(back.series[1].high, Lim::infinity());
}

// A failure found through a derived call (a decode step) stores that call with the violation; a position deleted
// while shrinking stores the ids of the others with the case. Files without either (written before) read as
// they always did, and a case without deleted positions hashes as it did.
TEST(ReportJson, derivedCallAndPositionsRoundTripAndOldFilesStillRead) {
  Violation v;
  v.message = "decode-consistency: output[0,0,2,0] is 1 in the full forward but 0 when query 2 is called alone";
  v.quantity = "output";
  v.magnitude = 1;
  v.tolerance = 1e-6;
  Problem call = awkward_problem(3);
  call.alignment = CausalAlignment::BottomRight;
  v.call = call;
  v.call_what = "decode step: query 2 alone over keys 0..2, bottom-right";
  const Json j = to_json(v);
  ASSERT_TRUE(j.contains("call"));
  EXPECT_FALSE(j.contains("exact"));
  const Violation back = violation_from_json(Json::parse(dump_pretty(j)), "violation");
  ASSERT_TRUE(back.call.has_value());
  EXPECT_EQ(back.call_what, v.call_what);
  EXPECT_EQ(back.call->alignment, CausalAlignment::BottomRight);
  expect_same_values(call.q, back.call->q);
  Json old = j;
  old.erase("call");
  EXPECT_FALSE(violation_from_json(old, "violation").call.has_value());

  LawCase c;
  c.problem = awkward_problem(0);
  const std::string hash_before = case_hash(c);
  EXPECT_FALSE(to_json(c).contains("positions"));
  c.positions = {0, 2, 3};  // T_q = 3: position 1 was deleted
  const LawCase cb = law_case_from_json(Json::parse(dump_pretty(to_json(c))), "case");
  EXPECT_EQ(cb.positions, c.positions);
  c.positions.clear();
  EXPECT_EQ(case_hash(c), hash_before);
  Json wrong = to_json(c);
  wrong["positions"] = Json::array({0, 1});  // not T_q ids
  EXPECT_THROW(law_case_from_json(wrong, "case"), FormatError);
}

// An exact law's violation says so ("exact": true) instead of leaving a tolerance of 0 to be read as one.
TEST(ReportJson, exactViolationIsMarkedExact) {
  Violation v;
  v.message = "first-position: output[0,0,0,0] is 1 but position 0 sees only key 0, so it must equal v[0,0,0,0] = 2";
  v.quantity = "output";
  v.magnitude = 1;
  EXPECT_EQ(to_json(v).value("exact", false), true);
  v.quantity = "call";
  EXPECT_FALSE(to_json(v).contains("exact"));
}

TEST(ReportJson, seriesWithoutABandReadsAsAPoint) {
  // Reports written before the sweep recorded its band hold [D, variance] pairs.
  Json j = to_json(Violation{});
  j["series"] = Json::array({Json::array({2.0, 2.5})});
  const Violation back = violation_from_json(j, "violation");
  ASSERT_EQ(back.series.size(), 1u);
  EXPECT_EQ(back.series[0].D, 2.0);
  EXPECT_EQ(back.series[0].low, 2.5);
  EXPECT_EQ(back.series[0].high, 2.5);
  j["series"] = Json::array({Json::array({2.0, 2.5, 1.0})});
  EXPECT_THROW(violation_from_json(j, "violation"), FormatError);
}

TEST(ReportJson, malformedTensorIsRefusedNamingTheShape) {
  Json j = to_json(awkward_tensor({1, 1, 2, 2}, 0));
  j["values"][0][0][1].erase(1);  // one row one value short
  try {
    tensor_from_json(j, "case.problem.q");
    FAIL() << "a short row was accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("case.problem.q.values"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1,1,2,2]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tensor_from_json(Json{{"shape", {1, 0, 1, 1}}, {"values", Json::array()}}, "t"), FormatError);
  EXPECT_THROW(dtype_field("float8"), FormatError);
}

// The shape alone must not decide what is allocated: a file may claim any size (an element count of 2^124
// overflows), but holds only the values it holds. Refused before allocating, naming what was expected.
TEST(ReportJson, aShapeLargerThanItsValuesIsRefusedBeforeAllocating) {
  const std::int64_t huge = std::int64_t{1} << 31;
  try {
    tensor_from_json(Json{{"shape", {huge, huge, huge, huge}}, {"values", Json::array({1.0})}}, "t");
    FAIL() << "a [2^31,2^31,2^31,2^31] tensor with one value was accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("an array of 2147483648 (B)"), std::string::npos) << e.what();
  }
}

TEST(ReportJson, caseHashNamesTheCaseNotTheRun) {
  LawCase a;
  a.problem = awkward_problem(0);
  LawCase b = a;
  EXPECT_EQ(case_hash(a), case_hash(b));
  b.problem.q(0, 0, 0, 0) = 42;
  EXPECT_NE(case_hash(a), case_hash(b));
  EXPECT_EQ(case_hash(a).size(), 16u);
}

TEST(ReportJson, smallArraysPrintOnOneLine) {
  const std::string text = dump_pretty(Json{{"worst_index", {0, 1, 2, 3}}});
  EXPECT_NE(text.find("\"worst_index\": [0, 1, 2, 3]"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace attncheck::reports
