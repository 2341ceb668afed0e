// The proof that the laws work: every mutant of the zoo is falsified by the laws expected to catch it, at a
// fixed seed and on every seed of a sweep, at every dtype, and the smallest shrunk counterexample is the
// mutant's minimal case; no law ever fails on a control.
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <map>

#include "attncheck/law.hpp"
#include "attncheck/mutants.hpp"

namespace attncheck {
namespace {

constexpr std::uint64_t kSeed = 1;  // the fixed seed of the kill matrix
constexpr int kSweepSeeds = 20;     // seeds kSeed+1 .. kSeed+20
constexpr int kSweepCases = 100;    // per law and seed: the default budget, as at the fixed seed
// Controls must pass every law, so each of their runs costs the whole budget: a lighter sweep for them.
constexpr int kControlSeeds = 10;  // seeds kSeed+1 .. kSeed+10
constexpr int kControlCases = 25;  // per law and seed

// The k side of each mutant's minimal case (Mutant::minimal_shape is q's [B,H,T_q,D]): T_k, and the alignment
// when T_q != T_k makes it matter. The reasons are the mutants' why_minimal.
struct MinimalK {
  Index T_k;
  CausalAlignment alignment = CausalAlignment::TopLeft;
};
const std::map<std::string, MinimalK> kMinimalK = {
    {"mutant:mask-zero", {2}},
    {"mutant:anti-causal", {2}},
    {"mutant:diagonal-masked", {1}},
    {"mutant:look-ahead", {2}},
    {"mutant:mask-minus-1e4", {2}},
    {"mutant:mask-lowest", {1, CausalAlignment::BottomRight}},
    {"mutant:additive-nan-leak", {2}},
    {"mutant:alignment-ignored", {2, CausalAlignment::BottomRight}},
    {"mutant:mask-head0-only", {2}},
    {"mutant:mask-batch0-only", {2}},
    {"mutant:softmax-query-axis", {2, CausalAlignment::BottomRight}},
    {"mutant:mask-after-softmax", {2}},
    {"mutant:no-max-subtraction", {1}},
    {"mutant:first-row-skipped", {1}},
    {"mutant:scale-forgotten", {2, CausalAlignment::BottomRight}},
    {"mutant:scale-one-over-d", {2, CausalAlignment::BottomRight}},
    {"mutant:scale-rows-for-cols", {2, CausalAlignment::BottomRight}},
    {"mutant:layout-bthd", {2}},
    {"mutant:stale-accumulator", {1}},
    {"mutant:grad-ds-unmasked", {2}},
    {"mutant:grad-delta-rowsum-do", {1}},
    {"mutant:grad-dq-unscaled", {2, CausalAlignment::BottomRight}},
    {"mutant:grad-dk-unscaled", {2, CausalAlignment::BottomRight}},
    {"mutant:grad-dv-unnormalised", {2, CausalAlignment::BottomRight}},
    {"mutant:grad-dk-from-p", {1}},
    {"mutant:grad-lse-wrong-row", {1}},
    {"mutant:grad-kv-one-head", {1}},
};

LawResult run(const Law& law, const Mutant& m, std::uint64_t seed, int cases, DType dtype = DType::f32) {
  RunOptions o;
  o.seed = seed;
  o.cases = cases;
  o.gen.dtype = dtype;
  return run_law(law, *m.impl, o);
}

std::string case_line(const LawResult& r) {
  if (!r.minimal_case) return r.law + " (no case kept)";
  const Problem& p = r.minimal_case->problem;
  return r.law + ": q " + to_string(p.q.shape()) + ", k " + to_string(p.k.shape()) +
         (p.alignment == CausalAlignment::TopLeft ? ", top-left" : ", bottom-right") +
         " (RC_PARAMS=\"reproduce=" + r.reproduce + "\"): " + (r.violation ? r.violation->message : "");
}

// The laws in the order a sweep tries them: the mutant's own first, then the rest.
std::vector<const Law*> laws_for(const Mutant& m) {
  std::vector<const Law*> order;
  for (const std::string& name : m.killed_by)
    if (const Law* l = find_law(name)) order.push_back(l);  // an unknown name fails EveryExpectedLawExists...
  for (const Law& l : laws())
    if (std::find(order.begin(), order.end(), &l) == order.end()) order.push_back(&l);
  return order;
}

// The first law (in laws_for order) that falsifies m at this seed, or nullopt.
std::optional<LawResult> first_kill(const Mutant& m, std::uint64_t seed, int cases, DType dtype) {
  for (const Law* l : laws_for(m)) {
    LawResult r = run(*l, m, seed, cases, dtype);
    if (r.status == LawStatus::falsified) return r;
  }
  return std::nullopt;
}

std::vector<std::string> names(bool controls) {
  std::vector<std::string> n;
  for (const Mutant& m : mutant_zoo())
    if (m.control == controls) n.push_back(m.impl->name());
  return n;
}

std::string param_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param.substr(info.param.find(':') + 1);
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

class Mutants : public testing::TestWithParam<std::string> {
 protected:
  const Mutant& mutant() const { return *find_mutant(GetParam()); }
};

TEST_P(Mutants, EveryExpectedLawExistsAndTheMinimalKIsKnown) {
  ASSERT_NE(find_mutant(GetParam()), nullptr);
  for (const std::string& l : mutant().killed_by) EXPECT_NE(find_law(l), nullptr) << "no law named " << l;
  EXPECT_TRUE(kMinimalK.count(GetParam())) << "add the mutant's minimal T_k to kMinimalK";
}

// At the fixed seed and the default budget (100 cases): each expected law falsifies the mutant, and the
// smallest shrunk counterexample over all laws (fewest q elements, then fewest k elements) is the minimal case.
TEST_P(Mutants, KilledByItsLawsAndShrunkToTheMinimalCase) {
  const Mutant& m = mutant();
  ASSERT_FALSE(laws().empty());
  std::vector<LawResult> results;
  for (const Law& l : laws()) results.push_back(run(l, m, kSeed, RunOptions{}.cases));
  const LawResult* smallest = nullptr;
  const auto size = [](const LawResult& r) {
    return std::pair{r.minimal_case->problem.q.shape().numel(), r.minimal_case->problem.k.shape().numel()};
  };
  for (const LawResult& r : results) {
    if (std::find(m.killed_by.begin(), m.killed_by.end(), r.law) != m.killed_by.end()) {
      EXPECT_EQ(r.status, LawStatus::falsified)
          << r.law << " did not kill " << m.impl->name() << " at seed " << kSeed << " in " << r.cases_run << " cases";
    }
    if (r.status == LawStatus::falsified) {
      ASSERT_TRUE(r.minimal_case) << r.law;
      if (!smallest || size(r) < size(*smallest)) smallest = &r;
    }
  }
  ASSERT_NE(smallest, nullptr) << m.impl->name() << " survived every law";
  const Problem& p = smallest->minimal_case->problem;
  const MinimalK want = kMinimalK.at(m.impl->name());
  std::string all;
  for (const LawResult& r : results)
    if (r.status == LawStatus::falsified) all += "\n  " + case_line(r);
  EXPECT_EQ(to_string(p.q.shape()), to_string(m.minimal_shape))
      << "smallest: " << case_line(*smallest) << "\nwhy minimal: " << m.why_minimal << "\nall:" << all;
  EXPECT_EQ(p.k.shape().T, want.T_k) << "smallest: " << case_line(*smallest) << "\nall:" << all;
  if (p.k.shape().T != p.q.shape().T) {
    EXPECT_EQ(p.alignment, want.alignment) << case_line(*smallest);
  }
}

// Over kSweepSeeds other seeds with kSweepCases cases per law, some law kills the mutant on every seed.
TEST_P(Mutants, KilledOnEverySeedOfTheSweep) {
  const Mutant& m = mutant();
  int killed = 0;
  std::string missed;
  for (std::uint64_t seed = kSeed + 1; seed <= kSeed + kSweepSeeds; ++seed) {
    if (first_kill(m, seed, kSweepCases, DType::f32))
      ++killed;
    else
      missed += " " + std::to_string(seed);
  }
  RecordProperty("kill_rate", std::to_string(killed) + "/" + std::to_string(kSweepSeeds));
  EXPECT_EQ(killed, kSweepSeeds) << m.impl->name() << " killed on " << killed << "/" << kSweepSeeds
                                 << " seeds; survived seeds:" << missed;
}

// The mutants are written for every dtype; at the fixed seed some law kills each one in float64, float16 and
// bfloat16 too.
TEST_P(Mutants, KilledAtEveryOtherDtype) {
  for (DType t : {DType::f64, DType::f16, DType::bf16})
    EXPECT_TRUE(first_kill(mutant(), kSeed, RunOptions{}.cases, t))
        << mutant().impl->name() << " survived every law at " << dtype_name(t);
}

INSTANTIATE_TEST_SUITE_P(Zoo, Mutants, testing::ValuesIn(names(false)), param_name);

// grad-finite-difference applies in float64 only, so the float32 kill matrix cannot show it: at float64 and the
// fixed seed it falsifies every backward mutant whose gradient is not the forward's derivative.
TEST(GradientMutants, FiniteDifferencesKillThemAtFloat64) {
  const Law* fd = find_law("grad-finite-difference");
  ASSERT_NE(fd, nullptr);
  for (const char* name : {"mutant:grad-ds-unmasked", "mutant:grad-delta-rowsum-do", "mutant:grad-dq-unscaled",
                           "mutant:grad-dk-unscaled", "mutant:grad-dv-unnormalised", "mutant:grad-dk-from-p",
                           "mutant:grad-lse-wrong-row", "mutant:grad-kv-one-head"}) {
    const LawResult r = run(*fd, *find_mutant(name), kSeed, RunOptions{}.cases, DType::f64);
    EXPECT_EQ(r.status, LawStatus::falsified) << name << ": " << r.note;
    if (r.status == LawStatus::falsified) std::cout << name << ": " << case_line(r) << "\n";
  }
}

class Controls : public testing::TestWithParam<std::string> {};

// A correct implementation written differently: every law holds, at every dtype, at the fixed seed with the
// default budget.
TEST_P(Controls, NoLawFailsAtAnyDtype) {
  const Mutant& m = *find_mutant(GetParam());
  ASSERT_FALSE(laws().empty());
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16})
    for (const Law& l : laws()) {
      const LawResult r = run(l, m, kSeed, RunOptions{}.cases, t);
      EXPECT_NE(r.status, LawStatus::falsified) << "false alarm at " << dtype_name(t) << ": " << case_line(r);
    }
}

// And on kControlSeeds more seeds in float32 (kControlCases cases per law), so a control's pass is not one
// seed's luck.
TEST_P(Controls, NoLawFailsOnOtherSeeds) {
  const Mutant& m = *find_mutant(GetParam());
  for (std::uint64_t seed = kSeed + 1; seed <= kSeed + kControlSeeds; ++seed)
    for (const Law& l : laws()) {
      const LawResult r = run(l, m, seed, kControlCases);
      EXPECT_NE(r.status, LawStatus::falsified) << "false alarm at seed " << seed << ": " << case_line(r);
    }
}

INSTANTIATE_TEST_SUITE_P(Zoo, Controls, testing::ValuesIn(names(true)), param_name);

}  // namespace
}  // namespace attncheck
