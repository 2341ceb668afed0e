// What a person and a CI dashboard read: the files a run writes, the heatmap's future outlines, the bold
// offending entries, JUnit counts, and that nothing in a report depends on the clock.
#include <gtest/gtest.h>

#include <algorithm>

#include "attncheck/format.hpp"
#include "attncheck/reports.hpp"

namespace attncheck::reports {
namespace {

std::size_t count(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto pos = haystack.find(needle); pos != std::string::npos; pos = haystack.find(needle, pos + needle.size())) ++n;
  return n;
}

// The legend draws one sample outline; every other one is a future cell.
constexpr const char* kFutureOutline = "stroke=\"#d62728\" stroke-width=\"2\"";

Tensor<double> filled(Shape s, double x) {
  Tensor<double> t(s);
  t.values().setConstant(x);
  return t;
}

RunInfo a_run() {
  RunInfo run;
  run.implementation = "mutant:leaky";
  run.implementation_description = "a mask that leaks <&> on purpose";
  run.seed = 3;
  return run;
}

LawReport falsified_weights_law() {
  LawReport r;
  r.summary = "every weight on a future key is exactly 0";
  r.why = "exp(-inf) is 0";
  r.replay_file = "out/zero-future-weight.json";
  LawResult& res = r.result;
  res.law = "zero-future-weight";
  res.status = LawStatus::falsified;
  res.seed = 3;
  res.cases_run = 4;
  res.shrink_steps = 7;
  res.reproduce = "XYZ";
  LawCase c;
  c.problem.q = filled({1, 1, 3, 2}, 0.5);
  c.problem.k = c.problem.v = c.problem.q;
  res.minimal_case = c;
  Violation v;
  v.message = "weights[0,0,0,1] = 0.5 <but> must be 0 & stay 0";
  v.quantity = "weights";
  v.worst_index = {0, 0, 0, 1};
  v.magnitude = 0.5;
  v.weights = filled({1, 1, 3, 3}, 1.0 / 3);
  res.violation = v;
  return r;
}

LawReport held_law(std::string name) {
  LawReport r;
  r.result.law = std::move(name);
  r.result.status = LawStatus::held;
  r.result.cases_run = 100;
  return r;
}

TEST(WeightsSvg, outlinesExactlyTheFutureCells) {
  // Top-left, T=3: query i sees keys j <= i, so (0,1), (0,2), (1,2) are future.
  const std::string top_left = weights_svg(filled({1, 1, 3, 3}, 0.2), 0, 0, Visibility{3, 3, CausalAlignment::TopLeft}, {}, "t");
  EXPECT_EQ(count(top_left, kFutureOutline), 3u + 1u);
  // Bottom-right, T_q=2, T_k=3: query i sees j <= i + 1, so only (0,2) is future.
  const std::string bottom_right = weights_svg(filled({1, 1, 2, 3}, 0.2), 0, 0, Visibility{2, 3, CausalAlignment::BottomRight}, {}, "t");
  EXPECT_EQ(count(bottom_right, kFutureOutline), 1u + 1u);
  // Bottom-right, T_q=3, T_k=1: queries 0 and 1 see no key at all; only their one cell is outlined.
  const std::string no_key = weights_svg(filled({1, 1, 3, 1}, 0), 0, 0, Visibility{3, 1, CausalAlignment::BottomRight}, {}, "t");
  EXPECT_EQ(count(no_key, kFutureOutline), 2u + 1u);
  // Key padding and a window hide more than the future: T=4, keys 3.. padding, window 1 (query i sees
  // i-1..i), so row 0 hides 1,2,3; row 1 hides 2,3; row 2 hides 0,3; row 3 hides 0,1,3 (ten cells).
  const std::string padded =
      weights_svg(filled({1, 1, 4, 4}, 0.2), 0, 0, Visibility{4, 4, CausalAlignment::TopLeft, 3, 1}, {}, "t");
  EXPECT_EQ(count(padded, kFutureOutline), 10u + 1u);
  EXPECT_NE(padded.find("key it may not see: must be 0"), std::string::npos);
  EXPECT_TRUE(top_left.starts_with("<svg ") && top_left.ends_with("</svg>\n"));
}

TEST(WeightsSvg, marksTheWorstCellAndNonFiniteValues) {
  Tensor<double> w = filled({1, 2, 2, 2}, 0.5);
  w(0, 1, 0, 1) = std::numeric_limits<double>::quiet_NaN();
  const std::string s = weights_svg(w, 0, 1, Visibility{2, 2, CausalAlignment::TopLeft}, {0, 1, 0, 1}, "a <title>");
  EXPECT_EQ(count(s, "stroke=\"black\" stroke-width=\"3\""), 1u + 1u);  // the cell and its legend sample
  EXPECT_EQ(count(s, ">nan</text>"), 1u);  // format_number's spelling, as everywhere
  EXPECT_EQ(count(s, "a &lt;title&gt;"), 2u);  // escaped in <title> and in the heading
  // A leak too small for two decimals must not read as 0.
  Tensor<double> tiny = filled({1, 1, 2, 2}, 0);
  tiny(0, 0, 0, 1) = 1e-30;
  EXPECT_EQ(count(weights_svg(tiny, 0, 0, Visibility{2, 2, CausalAlignment::TopLeft}, {}, "t"), ">&gt;0</text>"), 1u);
}

TEST(LawMarkdown, boldsOnlyEntriesBeyondTheTolerance) {
  LawReport r = falsified_weights_law();
  Violation& v = *r.result.violation;
  v.quantity = "output";
  v.tolerance = 1e-3;
  v.expected = filled({1, 1, 3, 2}, 0.25);
  v.actual = v.expected;
  (*v.actual)(0, 0, 1, 0) = 0.25 + 1e-4;    // within the tolerance
  (*v.actual)(0, 0, 2, 1) = 0.30000000000000004;  // beyond it, printed with every digit
  v.worst_index = {0, 0, 2, 1};
  const std::string md = law_markdown(a_run(), r);
  EXPECT_EQ(count(md, "**0.30000000000000004** ◀ worst"), 1u) << md;
  EXPECT_EQ(count(md, "**0.2501**"), 0u) << md;
  EXPECT_NE(md.find(" 0.2501 |"), std::string::npos) << md;
  EXPECT_NE(md.find("1 of 6 entries"), std::string::npos) << md;
  EXPECT_NE(md.find("attncheck check --impl mutant:leaky --replay out/zero-future-weight.json"), std::string::npos);
  EXPECT_NE(md.find("exp(-inf) is 0"), std::string::npos) << "the law's why belongs in the report";
  EXPECT_NE(md.find("margin (magnitude / tolerance): 500x the tolerance"), std::string::npos) << md;
}

TEST(LawMarkdown, variantShowsWhatTheLawChanged) {
  LawReport r = falsified_weights_law();
  LawCase& c = *r.result.minimal_case;
  c.variant = c.problem;
  c.variant->v(0, 0, 2, 1) = 1e300;
  const std::string md = law_markdown(a_run(), r);
  EXPECT_NE(md.find("- `v[0,0,2,1]`: 0.5 → 1e+300"), std::string::npos) << md;
}

TEST(RenderRun, writesTheFilesFormatsAskForAndNoTimings) {
  std::vector<LawReport> laws = {held_law("row-stochastic"), falsified_weights_law(), held_law("determinism")};
  laws[2].result.status = LawStatus::not_applicable;
  laws[2].result.note = "needs two calls";

  const auto files = render_run(a_run(), laws, Formats{});
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"zero-future-weight.json", "zero-future-weight.md",
                                             "zero-future-weight-weights.svg", "zero-future-weight.html", "summary.md",
                                             "index.html", "junit.xml", "summary.json"}));

  laws[0].result.seconds = 12.5;  // the clock must not reach the files
  laws[1].result.seconds = 0.01;
  const auto again = render_run(a_run(), laws, Formats{});
  ASSERT_EQ(again.size(), files.size());
  for (std::size_t n = 0; n < files.size(); ++n) EXPECT_EQ(again[n].content, files[n].content) << files[n].name;

  const auto md_only = render_run(a_run(), laws, parse_formats("md"));
  EXPECT_TRUE(std::none_of(md_only.begin(), md_only.end(), [](const ReportFile& f) {
    return f.name.ends_with(".json") || f.name.ends_with(".xml");
  }));
}

TEST(Html, indexIsSelfContainedAndLinksEveryFalsifiedLaw) {
  std::vector<LawReport> laws = {held_law("row-stochastic"), falsified_weights_law()};
  const auto files = render_run(a_run(), laws, Formats{});
  const auto find = [&](const std::string& name) {
    const auto it = std::find_if(files.begin(), files.end(), [&](const ReportFile& f) { return f.name == name; });
    return it == files.end() ? std::string() : it->content;
  };
  const std::string index = find("index.html"), page = find("zero-future-weight.html");
  ASSERT_FALSE(index.empty());
  ASSERT_FALSE(page.empty());
  for (const std::string& html : {index, page}) {
    EXPECT_TRUE(html.starts_with("<!DOCTYPE html>\n"));
    EXPECT_EQ(count(html, "<script"), 0u);
    EXPECT_EQ(count(html, "default-src 'none'"), 1u) << "nothing may be fetched";
    EXPECT_EQ(count(html, "<svg "), 1u) << "the heatmap, inline";
    EXPECT_EQ(count(html, "<img"), 0u);
  }
  EXPECT_NE(index.find("<a href=\"zero-future-weight.html\">"), std::string::npos) << index;
  EXPECT_NE(index.find("<td><code>row-stochastic</code></td><td class=\"held\">held</td>"), std::string::npos) << index;
  EXPECT_NE(page.find("<a href=\"index.html\">"), std::string::npos);
  // The description's markup characters are text, not markup.
  EXPECT_NE(page.find("a mask that leaks &lt;&amp;&gt; on purpose"), std::string::npos) << page;
}

TEST(Html, markdownSubsetBecomesHtml) {
  const std::string h = markdown_to_html(
      "# Title `a|b`\n\n> a **bold** q[0,1] and *it*\n\n| x | y |\n|---|---:|\n| `p\\|q` | 1 |\n\n"
      "- one [link](r.md)\n  more\n\n![pic](p.svg)\n\n![missing](m.svg)\n",
      {{"p.svg", "<svg>P</svg>\n"}});
  EXPECT_NE(h.find("<h1 id=\"title-a-b\">Title <code>a|b</code></h1>"), std::string::npos) << h;
  EXPECT_NE(h.find("<blockquote>a <strong>bold</strong> q[0,1] and <em>it</em></blockquote>"), std::string::npos) << h;
  EXPECT_NE(h.find("<th>x</th><th class=\"num\">y</th>"), std::string::npos) << h;
  EXPECT_NE(h.find("<td><code>p|q</code></td><td class=\"num\">1</td>"), std::string::npos) << h;
  EXPECT_NE(h.find("<li>one <a href=\"r.html\">link</a><br>more</li>"), std::string::npos) << h;
  EXPECT_NE(h.find("<figure>\n<svg>P</svg>\n</figure>"), std::string::npos) << h;
  EXPECT_NE(h.find("<img src=\"m.svg\" alt=\"missing\">"), std::string::npos) << h;
}

// Text from a plug-in becomes text every format carries: valid UTF-8 kept (a 2-, 3- and 4-byte sequence),
// everything else as \xHH: bytes that are no UTF-8 (0xFF, a lone continuation byte, an overlong form, a
// surrogate, a truncated sequence), and the controls that drive a terminal (ESC, DEL, the C1 CSI U+009B).
TEST(Text, printableTextKeepsUtf8AndEscapesEverythingElse) {
  EXPECT_EQ(attncheck::printable_text("ok \u00e9 \u221e \U0001F600\n\tend"), "ok \u00e9 \u221e \U0001F600\n\tend");
  EXPECT_EQ(attncheck::printable_text("a\xff b\x80 c\xc0\xaf d\xed\xa0\x80 e\xe2\x88"),
            "a\\xFF b\\x80 c\\xC0\\xAF d\\xED\\xA0\\x80 e\\xE2\\x88");
  EXPECT_EQ(attncheck::printable_text("\x1b[31mred\x7f \xc2\x9b" "2J \xc2\xa0"), "\\x1B[31mred\\x7F \\xC2\\x9B2J \xc2\xa0");
}

// A line that starts like an image but is none (text a plug-in printed, say) is a paragraph: fuzz_report_writers
// found the converter looping forever on it.
TEST(Html, aLineThatLooksLikeAnImageButIsNoneIsAParagraph) {
  const std::string h = markdown_to_html("> crash\n![ not an image\nits stderr\n![ and again", {});
  EXPECT_NE(h.find("<p>![ not an image\nits stderr</p>"), std::string::npos) << h;
  EXPECT_NE(h.find("<p>![ and again</p>"), std::string::npos) << h;
}

// Each verdict cell carries its class (its colour in the page's style); other cells keep their alignment.
TEST(Html, verdictCellsCarryTheirClass) {
  const std::string h = markdown_to_html("| law | result | calls |\n|---|---|---:|\n| `a` | **falsified** | 3 |\n"
                                         "| `b` | held | 1 |\n| `c` | n/a | 0 |\n| `d` | **not checked** | 0 |\n"
                                         "| `e` | [✗](e.html) B=1 H=1 T=1 D=1 | ✓ |\n",
                                         {});
  for (const char* cls : {"falsified", "held", "na", "unchecked"})
    EXPECT_NE(h.find("<td class=\"" + std::string(cls) + "\">"), std::string::npos) << cls << "\n" << h;
  EXPECT_NE(h.find("<td class=\"falsified\"><a href=\"e.html\">"), std::string::npos) << h;
  EXPECT_NE(h.find("<td class=\"num\">3</td>"), std::string::npos) << h;
  EXPECT_EQ(h.find("<td class=\"held\">`b`"), std::string::npos) << h;
}

// The laws that do not apply are not rows of the summary's table but one list, by reason.
TEST(Summary, lawsNotApplicableAreListedByReasonNotRows) {
  std::vector<LawReport> laws = {held_law("row-stochastic"), held_law("gqa-head-sharing"),
                                 held_law("gqa-equivalence")};
  for (int n : {1, 2}) {
    laws[n].result.status = LawStatus::not_applicable;
    laws[n].result.note = "needs grouped-query attention";
  }
  const std::string md = summary_markdown(a_run(), laws, Formats{}, ".md");
  EXPECT_NE(md.find("| `row-stochastic` | held |"), std::string::npos) << md;
  EXPECT_EQ(md.find("| `gqa-head-sharing` |"), std::string::npos) << md;
  EXPECT_NE(md.find("Not applicable to this implementation (2 laws), by reason:\n\n- `gqa-head-sharing`, "
                    "`gqa-equivalence`: needs grouped-query attention\n"),
            std::string::npos)
      << md;
}

TEST(Junit, countsFailuresAndSkipsAndEscapesMessages) {
  std::vector<LawReport> laws = {held_law("row-stochastic"), falsified_weights_law(), held_law("determinism")};
  laws[2].result.status = LawStatus::not_applicable;
  laws[2].result.note = "n/a <here>";
  const std::string x = junit_xml(a_run(), laws);
  EXPECT_EQ(count(x, "tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""), 2u) << x;
  EXPECT_EQ(count(x, "<testcase "), 3u);
  EXPECT_NE(x.find("message=\"weights[0,0,0,1] = 0.5 &lt;but&gt; must be 0 &amp; stay 0\""), std::string::npos) << x;
  EXPECT_EQ(x.find("<but>"), std::string::npos);
}

TEST(Formats, parsesSubsetsAndRefusesUnknownItems) {
  const Formats f = parse_formats("junit,md");
  EXPECT_TRUE(f.md && f.junit && !f.json);
  EXPECT_TRUE(parse_formats("md,html").html);
  EXPECT_THROW(parse_formats("md,pdf"), std::invalid_argument);
  EXPECT_THROW(parse_formats(""), std::invalid_argument);
  EXPECT_THROW(parse_formats("md,"), std::invalid_argument);
}

}  // namespace
}  // namespace attncheck::reports
