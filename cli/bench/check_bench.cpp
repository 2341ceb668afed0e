// What a default check costs: calls to the implementation and wall time, law by law, for the reference (which
// returns its weights), the same core as a black box (weights recovered by one-hot probing), and the numpy
// example over the exec: protocol, all in one run so that the figures compare (the targets: a black box
// in <= 10,000 calls, one that returns weights in <= 8,000, numpy in <= 3x the reference's time).
//
// Each benchmark is one whole default check (`attncheck check --impl X`: float32, seed 1, up to 100 cases per law
// and about 100 calls each (--law-calls), the default bounds), run once; counters: calls (all laws), and
// calls/<law> for the laws that make the most.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "attncheck/cli.hpp"
#include "attncheck/harness.hpp"
#include "attncheck/law.hpp"
#include "attncheck/mutants.hpp"
#include "attncheck/probe.hpp"

namespace {

using namespace attncheck;

// `impl` as a fused kernel that returns outputs only: the harness recovers its weights by probing, as it does
// for any plug-in without ATTNCHECK_CAP_RETURNS_WEIGHTS.
ImplementationPtr black_box(const ImplementationPtr& ref) {
  Capabilities caps = ref->capabilities();
  caps.returns_weights = false;
  caps.reentrant = false;
  return with_recovered_weights(make_implementation(
      ref->name() + "-black-box", "outputs only", caps,
      [ref](const Problem& p) {
        Problem q = p;
        q.want_weights = false;
        Outcome o = ref->forward(q);
        o.weights.reset();
        return o;
      },
      [ref](const Problem& p) { return ref->backward(p); }));
}
ImplementationPtr black_box_reference() { return black_box(reference_implementation()); }

// A default check of every law, laws one after the other (calls do not depend on --jobs).
void default_check(benchmark::State& state, const ImplementationPtr& impl) {
  std::vector<const Law*> all;
  for (const Law& l : laws()) all.push_back(&l);
  RunOptions ro;
  ro.cases = 100;
  ro.law_calls = 100;  // the default check's --law-calls
  ro.seed = 1;
  ro.max_size = 100;
  ro.gen.dtype = DType::f32;
  ro.gen.caps = impl->capabilities();
  std::vector<LawResult> results;
  for (auto _ : state) results = run_laws(all, *impl, ro, 1);
  long calls = 0, falsified = 0;
  for (const LawResult& r : results) {
    calls += r.calls;
    falsified += r.status == LawStatus::falsified;
    if (r.calls >= 500) state.counters["calls/" + r.law] = double(r.calls);
  }
  state.counters["calls"] = double(calls);
  state.counters["falsified"] = double(falsified);
}

void BM_reference(benchmark::State& state) { default_check(state, reference_implementation()); }
void BM_reference_black_box(benchmark::State& state) { default_check(state, black_box_reference()); }
void BM_numpy_exec(benchmark::State& state) {
  default_check(state, load_implementation("exec:/usr/bin/python3 " ATTNCHECK_SOURCE_DIR
                                           "/examples/python/numpy_attention.py"));
}

// A default check at two dtypes, float32 and float64, of one small causal attention in numpy or in torch
// (bench/two_dtypes.py), the way the pytest fixture runs it: one `attncheck check --dtype float32,float64`, one
// server process for both dtypes (torch imported once). The target: torch within 2x numpy, under 10 s.
void BM_two_dtypes(benchmark::State& state, const char* framework) {
  const std::string impl = std::string("exec:/usr/bin/python3 " ATTNCHECK_SOURCE_DIR "/cli/bench/two_dtypes.py ") +
                           framework;
  const std::string dir = (std::filesystem::temp_directory_path() / ("attncheck-bench-" + std::string(framework) +
                                                                      "-" + std::to_string(::getpid())))
                              .string();
  const char* argv[] = {"attncheck", "check",     "--impl", impl.c_str(), "--dtype", "float32,float64",
                        "--no-corpus", "--force", "--format", "json",     "--report-dir", dir.c_str()};
  const cli::Registry registry = cli::default_registry();
  int code = -1;
  for (auto _ : state) {
    std::ostringstream out, err;
    code = cli::run(static_cast<int>(std::size(argv)), argv, registry, out, err, false);
    if (code != cli::kAllHeld) state.SkipWithError(("the check did not hold: " + out.str() + err.str()).c_str());
  }
  std::filesystem::remove_all(dir);
  state.counters["exit"] = code;
}

// Every mutant of the zoo as a black box: the laws one after the other until one is falsified (a kill), at
// seed 1 and 100 cases. Counters: mutants, killed, and the calls the kills took.
// Every mutant of the zoo as a black box, under a default check's options but for --law-calls, which is the
// argument (0: every law checks 100 cases; 100: the default): the mutants killed, and the calls until each was (a
// check stops at the first law that kills). The label names the mutants no law killed, so that two arguments
// compare mutant by mutant.
void BM_zoo_black_box_kills(benchmark::State& state) {
  long mutants = 0, killed = 0, calls = 0;
  std::string survivors;
  for (auto _ : state)
    for (const Mutant& m : mutant_zoo()) {
      if (m.control) continue;
      ++mutants;
      const ImplementationPtr impl = black_box(m.impl);
      RunOptions ro;
      ro.cases = 100;
      ro.law_calls = state.range(0);
      ro.seed = 1;
      ro.gen.dtype = DType::f32;
      ro.gen.caps = impl->capabilities();
      bool dead = false;
      for (const Law& l : laws()) {
        const LawResult r = run_law(l, *impl, ro);
        calls += r.calls;
        if (r.status == LawStatus::falsified) {
          dead = true;
          break;
        }
      }
      killed += dead;
      if (!dead) survivors += (survivors.empty() ? "survived: " : ", ") + m.impl->name();
    }
  state.SetLabel(survivors.empty() ? "every mutant killed" : survivors);
  state.counters["mutants"] = double(mutants);
  state.counters["killed"] = double(killed);
  state.counters["calls"] = double(calls);
}

BENCHMARK(BM_reference)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_reference_black_box)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_numpy_exec)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_two_dtypes, numpy, "numpy")->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK_CAPTURE(BM_two_dtypes, torch, "torch")->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);
BENCHMARK(BM_zoo_black_box_kills)->Arg(0)->Arg(100)->Iterations(1)->UseRealTime()->Unit(benchmark::kSecond);

}  // namespace
