// Runs one law with RapidCheck and keeps the minimal counterexample. RapidCheck accepts a shrink only when
// the shrunk case still fails, so the last failing evaluation is the minimal case it reports.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "attncheck/cancel.hpp"
#include "attncheck/format.hpp"
#include "attncheck/features.hpp"
#include "attncheck/law.hpp"
#include "laws/support.hpp"
#include "mix64.hpp"

// Declared in rapidcheck's private src/detail/ReproduceListener.h (built into librapidcheck.a, header not
// installed by Debian): the same encoding RC_PARAMS="reproduce=..." reads.
namespace rc::detail {
std::unordered_map<std::string, Reproduce> stringToReproduceMap(const std::string& str);
std::string reproduceMapToString(const std::unordered_map<std::string, Reproduce>& reproduceMap);
}  // namespace rc::detail

namespace attncheck {
namespace {

Violation call_failure(std::string message) {
  Violation v;
  v.message = std::move(message);
  v.quantity = "call";
  return v;
}

struct Failure {
  LawCase lcase;
  Violation violation;
};

std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop() is called from signal handlers");

class ProgressListener final : public rc::detail::TestListener {
 public:
  ProgressListener(Progress& p, const std::function<void(const Progress&)>& cb) : p_(p), cb_(cb) {}
  void onTestCaseFinished(const rc::detail::CaseDescription& d) override {
    if (d.result.type == rc::detail::CaseResult::Type::Failure) {
      p_.shrinking = true;
    } else if (!p_.shrinking) {
      ++p_.cases_done;
    }
    if (cb_) cb_(p_);
  }
  void onShrinkTried(const rc::detail::CaseDescription&, bool accepted) override {
    if (accepted) ++p_.shrink_steps;
    if (cb_) cb_(p_);
  }
  void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}

 private:
  Progress& p_;
  const std::function<void(const Progress&)>& cb_;
};

// The implementation as a law sees it, counting the calls the law makes (an outcome's own count includes the
// probing calls behind recovered weights).
class CountingImplementation final : public Implementation {
 public:
  explicit CountingImplementation(const Implementation& inner) : inner_(inner) {}
  const std::string& name() const override { return inner_.name(); }
  const std::string& description() const override { return inner_.description(); }
  const Capabilities& capabilities() const override { return inner_.capabilities(); }
  std::string unavailable() const override { return inner_.unavailable(); }
  Outcome forward(const Problem& p) const override {
    ++calls_;  // counted before the call, so a call that throws counts too
    Outcome o = inner_.forward(p);
    calls_ += o.calls - 1;
    return o;
  }
  Gradients backward(const Problem& p) const override {
    ++calls_;
    return inner_.backward(p);
  }
  long calls() const { return calls_; }

 private:
  const Implementation& inner_;
  mutable std::atomic<long> calls_{0};
};

std::string unquote(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

// The case with what impl declares about its arithmetic marked on its calls, whose bounds widen by it: Q rounded to
// ggml's Q8 blocks (Feature::q_dot_ggml_q8, QuantizedKV::q_dot_ggml_q8, tolerance.cpp step 12b), P cast to FP8 e4m3
// (Feature::p_fp8, QuantizedKV::p_fp8, step 12c). Empty when it
// declares nothing the case uses. A mark, not a draw: generated and stored cases get it alike, and no file keeps it.
std::optional<LawCase> with_declared_precision(const LawCase& c, const Implementation& impl) {
  const Capabilities& caps = impl.capabilities();
  const bool q8 = caps.declares(Feature::q_dot_ggml_q8), p8 = caps.declares(Feature::p_fp8);
  if (!(q8 || p8) || !(c.problem.quant || (c.variant && c.variant->quant))) return std::nullopt;
  LawCase d = c;
  for (Problem* p : {&d.problem, d.variant ? &*d.variant : nullptr})
    if (p && p->quant) {
      p->quant->q_dot_ggml_q8 = q8;
      p->quant->p_fp8 = p8;
    }
  return d;
}

// evaluate_case, telling whether the implementation timed out, or could not be (re)started for the call.
Verdict evaluate(const Law& law, const Implementation& impl, const LawCase& c, bool& timed_out,
                 bool* not_started = nullptr) {
  timed_out = false;
  if (not_started) *not_started = false;
  try {
    if (const std::optional<LawCase> d = with_declared_precision(c, impl)) return law.check(impl, *d);
    return law.check(impl, c);
  } catch (const Cancelled&) {
    return std::nullopt;  // the run is stopping (stop_requested()): the caller does not judge this case
  } catch (const ImplementationError& e) {
    timed_out = e.kind() == ImplementationError::Kind::timeout;
    if (not_started) *not_started = e.kind() == ImplementationError::Kind::unavailable;
    return call_failure(std::string(kind_name(e.kind())) + ": " + e.what());
  }
}

}  // namespace

void request_stop() {
  g_stop_requested.store(true);
  request_cancellation();  // the core's long loops give up too: a long case ends within a block of rows
}
bool stop_requested() { return g_stop_requested.load(); }

double margin(const Violation& v) {
  if (v.quantity == "call" || v.tolerance <= 0 || !std::isfinite(v.magnitude))
    return std::numeric_limits<double>::infinity();
  return v.magnitude / v.tolerance;
}

std::string margin_text(const Violation& v) {
  if (v.quantity == "call") return "failed call";
  if (!std::isfinite(v.magnitude)) return "non-finite";
  if (v.tolerance <= 0) return "exact law";
  return format_number(margin(v), 3) + "x the tolerance";
}

const Problem& failing_problem(const LawResult& r) {
  return r.violation && r.violation->call ? *r.violation->call : r.minimal_case->problem;
}

// law.explain on the violation of the case a run reports; an implementation that fails meanwhile leaves it as
// it was (the verdict is already made), and a call failure has nothing to explain.
static void explain(const Law& law, const Implementation& impl, const LawCase& c, Violation& v) {
  if (!law.explain || v.quantity == "call") return;
  try {
    const std::optional<LawCase> d = with_declared_precision(c, impl);
    law.explain(impl, d ? *d : c, v);
  } catch (const ImplementationError&) {
  }
}

std::optional<Violation> evaluate_case(const Law& law, const Implementation& impl, const LawCase& c) {
  bool timed_out = false;
  std::optional<Violation> v = evaluate(law, impl, c, timed_out).violation;
  if (v) explain(law, impl, c, *v);
  return v;
}

std::string why_not_applicable(const Law& law, const Implementation& impl, const GenConfig& g) {
  std::string why_not = law.not_applicable ? law.not_applicable(g) : std::string();
  if (why_not.empty() && !g.caps.supports(g.dtype))
    why_not = impl.name() + " does not accept " + std::string(dtype_name(g.dtype));
  return in_declaration_words(why_not, declared_by(impl.name()));  // as its author declares things
}

namespace {

// "1 case", "3 cases".
std::string cases_text(int n) { return std::to_string(n) + (n == 1 ? " case" : " cases"); }

// The most cases law checks in this run: the run's, at most the law's own limit.
int law_cases(const Law& law, const RunOptions& opts) {
  return law.max_cases > 0 ? std::min(opts.cases, law.max_cases) : opts.cases;
}

// A law's cases come in at most two passes (RunOptions::law_calls). The first checks this many cases: all of them
// without a calls allowance.
int first_pass_cases(const Law& law, const RunOptions& opts) {
  const int all = law_cases(law, opts);
  return opts.law_calls > 0 ? std::min(all, std::max(1, opts.first_cases)) : all;
}

// The cases of the second pass: as many as the allowance takes at the first pass's calls per case (n cases that
// made `calls` calls), rounded to the nearest case, up to the law's cases in all. A first pass that made no call
// (every case vacuous) takes all of them. Integer arithmetic: the same calls give the same count everywhere.
int second_pass_cases(const Law& law, const RunOptions& opts, int n, long calls) {
  const int all = law_cases(law, opts);
  if (opts.law_calls <= 0 || n >= all) return 0;
  if (calls <= 0) return all - n;
  const long fit = (2 * opts.law_calls * n + calls) / (2 * calls);
  return int(std::clamp<long>(fit, n, all)) - n;
}

// RapidCheck's parameters for a pass of n cases of one law: the run's size, and its seed for the first pass;
// the second draws from a seed mixed from it (splitmix64's finaliser), since the same seed would draw the first
// pass's first cases again.
rc::detail::TestParams test_params(const RunOptions& opts, int pass, int n) {
  rc::detail::TestParams params;
  std::uint64_t seed = opts.seed;
  if (pass > 0) seed = mix64(seed + 0x9e3779b97f4a7c15ULL * std::uint64_t(pass));
  params.seed = seed;
  params.maxSuccess = n;
  params.maxSize = opts.max_size;
  return params;
}

// Two passes' results as one: their cases and their tags.
rc::detail::SuccessResult merged(const rc::detail::SuccessResult& a, const rc::detail::SuccessResult& b) {
  rc::detail::SuccessResult m = a;
  m.numSuccess += b.numSuccess;
  for (const auto& [tags, n] : b.distribution) m.distribution[tags] += n;
  return m;
}

rc::detail::TestMetadata test_metadata(const Law& law) {
  rc::detail::TestMetadata md;
  md.id = law.name;
  md.description = law.summary;
  return md;
}

// What a held law found out about impl (Law::finding), or why it could not tell.
std::string finding_note(const Law& law, const Implementation& impl, const GenConfig& g) {
  try {
    return law.finding(impl, g);
  } catch (const ImplementationError& e) {
    return "could not tell: " + std::string(kind_name(e.kind())) + ": " + e.what();
  }
}

// One law's run: the property RapidCheck calls for every case, the state it keeps between cases (shrinking, the
// budgets, what was interrupted), and the result made from RapidCheck's (of one pass of cases, or two with
// RunOptions::law_calls). `known_held`, when given, holds the calls of each case drawn before any failure that was
// already checked and held (run_laws), in drawing order, so those are not checked again.
class LawRun {
 public:
  LawRun(const Law& law, const Implementation& impl, const RunOptions& opts, const std::vector<long>* known_held)
      : law_(law), impl_(impl), opts_(opts), known_held_(known_held), counted_(impl) {
    r_.law = law.name;
    r_.implementation = impl.name();
    r_.dtype = opts.gen.dtype;
    r_.seed = opts.seed;
    progress_.law = law.name;
    g_ = opts.gen;
    g_.caps = impl.capabilities();
  }

  LawResult run() {
    if (not_run()) return r_;
    gen_ = law_.gen(g_);
    const rc::detail::TestMetadata md = test_metadata(law_);
    std::unordered_map<std::string, rc::detail::Reproduce> reproduce_map;
    if (!opts_.reproduce.empty()) {
      check_reproduce_string(opts_.reproduce, law_.name);
      reproduce_map = rc::detail::stringToReproduceMap(opts_.reproduce);
    }
    const int first = first_pass_cases(law_, opts_);
    progress_.cases_total = law_cases(law_, opts_);  // at most; the second pass, if any, sets the count
    ProgressListener listener(progress_, opts_.on_progress);
    rc::detail::TestResult result = rc::detail::checkTestable([this] { check_one_case(); }, md,
                                                              test_params(opts_, 0, first), listener, reproduce_map);
    // The second pass, when the first held in full and the calls it made leave room for more cases.
    if (result.is<rc::detail::SuccessResult>() && opts_.reproduce.empty() && !internal_ && unchecked_ == 0 &&
        interrupted_ == 0 && start_failure_.empty()) {
      const int more = second_pass_cases(law_, opts_, first, counted_.calls() + known_calls_);
      if (more > 0 && stop_requested()) {
        not_drawn_ = more;  // interrupted between the passes
      } else if (more > 0) {
        first_pass_ = result.get<rc::detail::SuccessResult>();
        progress_.cases_total = first + more;
        result = rc::detail::checkTestable([this] { check_one_case(); }, md, test_params(opts_, 1, more), listener,
                                           reproduce_map);
      }
    }
    if (result.is<rc::detail::FailureResult>() && last_failure_ && !stop_requested())
      explain(law_, counted_, last_failure_->lcase, last_failure_->violation);  // once, on the case reported
    r_.seconds = elapsed();
    r_.shrink_steps = progress_.shrink_steps;
    r_.calls = known_calls_ + counted_.calls();
    if (opts_.calls_spent) *opts_.calls_spent += counted_.calls();
    if (internal_) std::rethrow_exception(internal_);
    r_.note = sampled_;
    if (result.is<rc::detail::SuccessResult>())
      held(first_pass_ ? merged(*first_pass_, result.get<rc::detail::SuccessResult>())
                       : result.get<rc::detail::SuccessResult>());
    else if (result.is<rc::detail::FailureResult>())
      falsified(result.get<rc::detail::FailureResult>());
    else if (result.is<rc::detail::GaveUpResult>())
      throw std::logic_error("run_law: RapidCheck gave up on " + law_.name + ": " +
                             result.get<rc::detail::GaveUpResult>().description);
    else
      rapidcheck_error(result.get<rc::detail::Error>());
    return r_;
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

  // Whether the law is not run at all, r_ saying why: it does not apply, the implementation was given up on before
  // it, the run was interrupted, or the call budget is spent.
  bool not_run() {
    const std::string why_not = why_not_applicable(law_, impl_, g_);
    if (!why_not.empty()) {
      r_.status = LawStatus::not_applicable;
      r_.note = why_not;
      return true;
    }
    // An implementation given up on before this law (it could not be started): reported at once, no call made.
    if (const std::string gone = impl_.unavailable(); !gone.empty()) {
      r_.status = LawStatus::falsified;
      r_.violation = call_failure(std::string(kind_name(ImplementationError::Kind::unavailable)) + ": " + gone);
      r_.note = "not checked: the implementation could not be started";
      return true;
    }
    if (stop_requested()) {
      r_.status = LawStatus::not_checked;
      r_.note = "not checked: the run was interrupted";
      return true;
    }
    // The calls this law may spend: its share of the run's budget (run_laws), or all that is left of it.
    const long spent_before = opts_.calls_spent ? opts_.calls_spent->load() : 0;
    const long budget_left = opts_.max_calls > 0 ? std::max(0L, opts_.max_calls - spent_before) : 0;
    law_budget_ = opts_.law_share != 0 ? std::clamp(opts_.law_share, 0L, budget_left) : budget_left;
    budget_words_ = opts_.max_calls <= 0 ? std::string()
                    : opts_.law_share != 0
                        ? "its share of the call budget (" + std::to_string(law_budget_) + " of --max-calls " +
                              std::to_string(opts_.max_calls) + ")"
                        : "the call budget (" + std::to_string(opts_.max_calls) + " calls, --max-calls)";
    // A run whose call budget is spent checks no further law: not a law that held, one that was not checked.
    if (opts_.max_calls > 0 && law_budget_ == 0) {
      r_.status = LawStatus::not_checked;
      r_.note = "not checked: " + budget_words_ + " ran out before this law";
      return true;
    }
    return false;
  }

  bool shrink_budget_spent() const {
    return opts_.max_shrink_timeouts > 0 && shrink_timeouts_ >= opts_.max_shrink_timeouts;
  }
  bool calls_spent() const { return opts_.max_calls > 0 && counted_.calls() >= law_budget_; }
  bool shrink_time_spent() const {
    return opts_.shrink_seconds > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - shrink_start_).count() >=
               opts_.shrink_seconds;
  }
  // A case the run was asked to stop during: counted as interrupted (or, while shrinking, ends the shrinking).
  void interrupted() {
    if (shrinking_)
      interrupted_shrinking_ = true;
    else
      ++interrupted_;
  }

  // Whether this case passes untried: the run is stopping, shrinking has ended (its timeouts, time or calls spent,
  // the implementation given up on), the call budget is spent, or the run is lost to attncheck's own error.
  bool skipped() {
    if (stop_requested()) {
      interrupted();
      return true;
    }
    if (shrinking_ && (shrink_budget_spent() || !counted_.unavailable().empty())) return true;
    if (shrinking_ && cut_short_.empty() && (shrink_time_spent() || calls_spent()))
      cut_short_ = calls_spent() ? "calls" : "time";
    if (shrinking_ && !cut_short_.empty()) return true;
    if (!shrinking_ && calls_spent()) {
      ++unchecked_;
      return true;
    }
    return bool(internal_);  // end the run (and its shrinking) quickly
  }

  // Draws the case. Drawing is attncheck's own work too: an exception from a generator (std::bad_alloc for a shape
  // that does not fit, a broken invariant) is an internal error, not a counterexample. RapidCheck's own control
  // flow (a discarded case, a generation failure) passes through untouched. Empty: the run was asked to stop while
  // a long case was drawn.
  std::optional<LawCase> draw() {
    try {
      return *gen_;
    } catch (const rc::detail::CaseResult&) {
      throw;
    } catch (const rc::GenerationFailure&) {
      throw;
    } catch (const Cancelled&) {
      interrupted();
      return std::nullopt;
    } catch (const std::exception& e) {
      if (!internal_)
        internal_ = std::make_exception_ptr(std::runtime_error(
            "generating a case of " + law_.name + ": " +
            (dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory (" + std::string(e.what()) + ")"
                                                     : std::string(e.what()))));
      throw;
    } catch (...) {
      if (!internal_) internal_ = std::current_exception();
      throw;
    }
  }

  // RapidCheck counts any exception as a failing case. attncheck's own errors (a broken oracle or statistic, a bad
  // parameter) are not counterexamples: the first one is kept and rethrown after the run, so callers report an
  // internal error instead of a falsified law.
  Verdict check(const LawCase& c, bool& timed_out, bool& not_started) {
    try {
      return evaluate(law_, counted_, c, timed_out, &not_started);
    } catch (const rc::detail::CaseResult&) {
      throw;
    } catch (...) {
      if (!internal_) internal_ = std::current_exception();
      throw;
    }
  }

  // The property: one case drawn and checked. Once a failure is clear (margin >= kClearMargin), a shrink that fails
  // by less is not taken (RapidCheck then tries the next candidate): among failing candidates the clear ones win,
  // when there are any. A failure on the outputs of a kernel with probed weights is shrunk with the outputs check
  // alone. A replayed case is checked in full, so its verdict never depends on this state.
  void check_one_case() {
    if (skipped()) return;
    std::optional<LawCase> drawn = draw();
    if (!drawn) return;
    LawCase& c = *drawn;
    for (const auto& t : c.tags) RC_TAG(t);
    const std::size_t n = drawn_++;
    if (known_held_ && !progress_.shrinking && n < known_held_->size()) {
      known_calls_ += (*known_held_)[n];
      return;
    }
    c.outputs_only = g_.caps.weights_probed && failed_on_ == "output";
    bool timed_out = false, not_started = false;
    Verdict verdict = check(c, timed_out, not_started);
    if (!verdict.note.empty()) sampled_ = std::move(verdict.note);
    // The call in flight when the run was asked to stop is not judged (the handler may have ended it).
    if (stop_requested()) {
      interrupted();
      return;
    }
    r_.timeouts += timed_out;
    shrink_timeouts_ += timed_out && shrinking_;
    std::optional<Violation>& v = verdict.violation;
    // A call the implementation could not be started for is no counterexample (nor a smaller one): the case
    // passes untried, and the law says so if nothing else failed.
    if (v && not_started) {
      if (start_failure_.empty()) start_failure_ = v->message;
      return;
    }
    if (!v) return;
    if (!shrinking_) shrink_start_ = std::chrono::steady_clock::now();
    shrinking_ = true;
    const bool clear = margin(*v) >= kClearMargin;
    if (have_clear_ && !clear) return;
    have_clear_ = have_clear_ || clear;
    failed_on_ = v->quantity;
    c.outputs_only = false;
    last_failure_ = Failure{c, *v};
    RC_FAIL(v->message);
  }

  void held(const rc::detail::SuccessResult& s) {
    r_.status = LawStatus::held;
    r_.cases_run = s.numSuccess - unchecked_ - interrupted_;
    interrupted_ += not_drawn_;
    for (const auto& [tags, n] : s.distribution)
      for (const auto& t : tags) r_.coverage[unquote(t)] += n;
    if (law_.finding && unchecked_ == 0 && interrupted_ == 0 && start_failure_.empty() && !stop_requested())
      r_.note = finding_note(law_, impl_, g_);
    if (!start_failure_.empty()) {  // nothing failed, but not every case could be checked
      r_.status = LawStatus::falsified;
      r_.violation = call_failure(start_failure_);
      r_.note = "not every case was checked: the implementation could not be started";
      return;
    }
    // Some cases left unchecked: the law is not checked, whatever the cases that were checked showed.
    if (interrupted_ > 0) {
      r_.status = LawStatus::not_checked;
      r_.note = "interrupted: held in the " + cases_text(r_.cases_run) + " checked before the run was stopped, " +
                std::to_string(interrupted_) + " not checked";
    } else if (unchecked_ > 0) {
      r_.status = LawStatus::not_checked;
      r_.note = budget_words_ + " ran out: held in the " + cases_text(r_.cases_run) + " checked, " +
                std::to_string(unchecked_) + " not checked";
    }
  }

  void falsified(const rc::detail::FailureResult& f) {
    r_.status = LawStatus::falsified;
    r_.cases_run = (first_pass_ ? first_pass_->numSuccess : 0) + f.numSuccess + 1;
    r_.reproduce = rc::detail::reproduceMapToString({{law_.name, f.reproduce}});
    if (shrink_budget_spent())
      r_.note = "shrinking stopped after " + std::to_string(shrink_timeouts_) +
                " shrink candidates timed out (each costs a call timeout): a smaller case may hang too";
    else if (interrupted_shrinking_)
      r_.note = "shrinking interrupted: the smallest failing case found before the run was stopped";
    else if (!impl_.unavailable().empty())
      r_.note = "shrinking stopped: the implementation could not be started again";
    else if (cut_short_ == "time")
      r_.note = "shrinking cut short after " + format_number(opts_.shrink_seconds, 3) +
                " s (--shrink-time): the smallest failing case found by then; --shrink-time 0 shrinks on";
    else if (cut_short_ == "calls")
      r_.note = "shrinking cut short: " + budget_words_ + " ran out; the smallest failing case found by then";
    if (last_failure_) {
      r_.minimal_case = last_failure_->lcase;
      r_.violation = last_failure_->violation;
    } else {
      r_.violation = call_failure(f.description);
    }
  }

  void rapidcheck_error(const rc::detail::Error& e) {
    if (opts_.reproduce.empty())
      throw std::logic_error("run_law: RapidCheck error in " + law_.name + ": " + e.description);
    // Replaying a stored reproduce string whose case no longer fails: the bug is fixed, the law held there.
    r_.status = LawStatus::held;
    r_.cases_run = 1;
    r_.note = "the reproduced case no longer fails (" + e.description + ")";
  }

  const Law& law_;
  const Implementation& impl_;
  const RunOptions& opts_;
  const std::vector<long>* known_held_;
  long known_calls_ = 0;  // the calls of the known held cases passed so far
  const CountingImplementation counted_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  LawResult r_;
  GenConfig g_;
  rc::Gen<LawCase> gen_ = rc::gen::just(LawCase{});
  long law_budget_ = 0;          // the calls this law may spend (with --max-calls)
  std::string budget_words_;     // that budget, in words
  Progress progress_;
  std::size_t drawn_ = 0;        // cases drawn so far
  std::optional<rc::detail::SuccessResult> first_pass_;  // the first pass, when a second one ran
  // Shrinking state: whether a failure was found, whether a clear one was, on what quantity, and since when.
  bool shrinking_ = false, have_clear_ = false;
  std::string failed_on_;
  std::chrono::steady_clock::time_point shrink_start_;
  // Every call after the first failure tries a shrink candidate. Once max_shrink_timeouts of them have timed out,
  // the rest pass untried, so RapidCheck ends with the smallest hanging case found so far.
  int shrink_timeouts_ = 0;
  std::string cut_short_;      // why shrinking stopped before RapidCheck ran out of candidates ("time", "calls")
  std::string start_failure_;  // the first call that failed because the implementation could not be started
  int unchecked_ = 0;          // cases passed untried because the call budget was spent
  int interrupted_ = 0;        // cases passed untried because the run was asked to stop
  int not_drawn_ = 0;          // a second pass's cases, not drawn because the run was asked to stop before it
  bool interrupted_shrinking_ = false;
  std::exception_ptr internal_;        // attncheck's own first error, rethrown after the run
  std::string sampled_;                // what the last long-context case checked by sampling, for the note
  std::optional<Failure> last_failure_;  // the latest failing case: after shrinking, the smallest
};

LawResult run_law_impl(const Law& law, const Implementation& impl, const RunOptions& opts,
                       const std::vector<long>* known_held) {
  return LawRun(law, impl, opts, known_held).run();
}

// One drawn case waiting for, or done with, its check in run_laws.
struct Job {
  std::size_t law = 0, index = 0;
  LawCase lcase;
};
struct Checked {
  bool ran = false;     // checked at all (not skipped because the run was asked to stop)
  bool failed = false;  // falsified, or attncheck's own error: either way the law is re-run alone
  std::string note;
  double seconds = 0;
  long calls = 0;  // implementation calls the check made
};

}  // namespace

LawResult run_law(const Law& law, const Implementation& impl, const RunOptions& opts) {
  return run_law_impl(law, impl, opts, nullptr);
}

namespace {

// A result for `law` on `impl` with the run's dtype and seed, and nothing else yet.
LawResult blank_result(const Law& law, const Implementation& impl, const RunOptions& opts) {
  LawResult r;
  r.law = law.name;
  r.implementation = impl.name();
  r.dtype = opts.gen.dtype;
  r.seed = opts.seed;
  return r;
}

// One law after the other. A call budget is shared out: each law may spend what is left divided by the applicable
// laws left (itself included), so what one law leaves unspent passes on, and no law spends the others' share.
std::vector<LawResult> run_serially(const std::vector<const Law*>& laws, const Implementation& impl,
                                    const RunOptions& opts,
                                    const std::function<void(std::size_t, const LawResult&)>& done) {
  std::vector<LawResult> out;
  GenConfig g = opts.gen;
  g.caps = impl.capabilities();
  std::size_t applicable_left = 0;
  if (opts.max_calls > 0)
    for (const Law* law : laws) applicable_left += why_not_applicable(*law, impl, g).empty();
  for (const Law* law : laws) {
    RunOptions lo = opts;
    if (opts.max_calls > 0 && why_not_applicable(*law, impl, g).empty()) {
      const long spent = opts.calls_spent ? opts.calls_spent->load() : 0;
      lo.law_share = std::max(0L, opts.max_calls - spent) / long(applicable_left--);
      if (lo.law_share == 0) lo.law_share = -1;  // less than one call each: none for this law
    }
    out.push_back(run_law(*law, impl, lo));
    if (done) done(out.size() - 1, out.back());
  }
  return out;
}

// The parallel path's checks: `jobs` workers check the cases the calling thread draws and queues, at most 2·jobs
// ahead (each case may hold long-context tensors). What each check found is kept per law, in drawing order.
class CheckPool {
 public:
  CheckPool(const std::vector<const Law*>& laws, const Implementation& impl, int jobs)
      : laws_(laws), impl_(impl), jobs_(jobs), checked_(laws.size()), failed_(laws.size(), 0) {
    for (int t = 0; t < jobs; ++t) {
      try {
        pool_.emplace_back([this] { work(); });
      } catch (const std::system_error&) {  // the system's limit on threads (or their stacks): fewer, same reports
        if (pool_.empty()) throw;
        break;
      }
    }
  }
  // Joins the workers on every way out, an exception from a generator included.
  ~CheckPool() { close(); }
  CheckPool(const CheckPool&) = delete;
  CheckPool& operator=(const CheckPool&) = delete;

  /// Queues case `c` of law `l` (its n-th), waiting while the queue is full.
  void push(std::size_t l, LawCase c) {
    std::unique_lock lock(mu_);
    space_.wait(lock, [&] { return queue_.size() < 2 * std::size_t(jobs_); });
    checked_[l].emplace_back();
    queue_.push_back(Job{l, checked_[l].size() - 1, std::move(c)});
    ready_.notify_one();
  }
  /// Waits until every case queued so far is checked.
  void wait_idle() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && busy_ == 0; });
  }
  /// Lets the workers finish the queue, and joins them.
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    ready_.notify_all();
    for (auto& t : pool_)
      if (t.joinable()) t.join();
  }
  /// After close(): what each case of law l showed, and whether one failed.
  const std::deque<Checked>& checked(std::size_t l) const { return checked_[l]; }
  bool failed(std::size_t l) const { return failed_[l] != 0; }

 private:
  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        ready_.wait(lock, [&] { return closed_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
        space_.notify_one();
        if (failed_[job.law] || stop_requested()) {  // re-run alone anyway, or not at all
          if (queue_.empty() && busy_ == 0) idle_.notify_all();
          continue;
        }
        ++busy_;
      }
      Checked c = check(job);
      std::lock_guard lock(mu_);
      if (c.failed) failed_[job.law] = 1;
      checked_[job.law][job.index] = std::move(c);
      if (--busy_ == 0 && queue_.empty()) idle_.notify_all();
    }
  }
  Checked check(const Job& job) const {
    Checked c;
    c.ran = true;
    const auto start = std::chrono::steady_clock::now();
    const CountingImplementation counted(impl_);
    try {
      bool timed_out = false;  // a failure is re-run alone, where its report is made: nothing to explain here
      Verdict verdict = evaluate(*laws_[job.law], counted, job.lcase, timed_out);
      c.failed = verdict.violation.has_value();
      c.note = std::move(verdict.note);
    } catch (...) {
      c.failed = true;  // re-run alone, where the error surfaces as it would serially
    }
    c.calls = counted.calls();
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return c;
  }

  const std::vector<const Law*>& laws_;
  const Implementation& impl_;
  const int jobs_;
  std::mutex mu_;
  std::condition_variable ready_, space_, idle_;
  std::deque<Job> queue_;
  int busy_ = 0;  // workers checking a case
  bool closed_ = false;
  std::vector<std::deque<Checked>> checked_;
  std::vector<char> failed_;
  std::vector<std::thread> pool_;
};

// Draws the n cases of a pass of law l with RapidCheck (on the calling thread) and queues them for the pool, the
// progress counting them against `planned` (the law's cases at most, in the first pass of two); what
// RapidCheck concluded of the draws. An error of attncheck's own while drawing fails the draw (the law is then re-run
// alone, where it becomes an internal error), and is not shrunk.
rc::detail::TestResult draw_law(CheckPool& pool, std::size_t l, const Law& law, const GenConfig& g,
                                const RunOptions& opts, int pass, int n, int planned, Progress& progress) {
  const rc::Gen<LawCase> gen = law.gen(g);
  bool gen_error = false;
  const auto property = [&] {
    if (gen_error || stop_requested()) return;  // no shrinking of attncheck's own failure; or asked to stop
    LawCase c;
    try {
      c = *gen;
    } catch (const rc::detail::CaseResult&) {
      throw;
    } catch (const rc::GenerationFailure&) {
      throw;
    } catch (...) {
      gen_error = true;
      throw;
    }
    for (const auto& t : c.tags) RC_TAG(t);
    pool.push(l, std::move(c));
  };
  const rc::detail::TestParams params = test_params(opts, pass, n);
  if (pass == 0) progress = Progress{.law = law.name};
  progress.cases_total = planned;
  ProgressListener listener(progress, opts.on_progress);
  const std::unordered_map<std::string, rc::detail::Reproduce> no_reproduce;
  return rc::detail::checkTestable(property, test_metadata(law), params, listener, no_reproduce);
}

// Interrupted: a law with some cases checked, none failing, held in those; any other was not checked.
LawResult interrupted_result(const Law& law, const Implementation& impl, const RunOptions& opts,
                             const std::deque<Checked>& checked, bool failed, int planned) {
  LawResult r = blank_result(law, impl, opts);
  r.status = LawStatus::not_checked;
  r.note = "not checked: the run was interrupted";
  const long ran = std::count_if(checked.begin(), checked.end(), [](const Checked& c) { return c.ran; });
  if (ran > 0 && !failed) {
    r.cases_run = int(ran);
    for (const Checked& c : checked) {
      r.seconds += c.seconds;
      r.calls += c.calls;
    }
    r.note = "interrupted: held in the " + cases_text(int(ran)) + " checked before the run was stopped, " +
             std::to_string(planned - ran) + " not checked";
  }
  return r;
}

// A law every case of which was drawn, checked on the pool and held.
LawResult held_result(const Law& law, const Implementation& impl, const RunOptions& opts,
                      const rc::detail::SuccessResult& s, const std::deque<Checked>& checked) {
  LawResult r = blank_result(law, impl, opts);
  r.status = LawStatus::held;
  r.cases_run = s.numSuccess;
  for (const auto& [tags, n] : s.distribution)
    for (const auto& t : tags) r.coverage[unquote(t)] += n;
  for (const Checked& c : checked) {
    r.seconds += c.seconds;
    r.calls += c.calls;
    if (!c.note.empty()) r.note = c.note;
  }
  if (law.finding) {
    GenConfig g = opts.gen;
    g.caps = impl.capabilities();
    r.note = finding_note(law, impl, g);
  }
  return r;
}

}  // namespace

std::vector<LawResult> run_laws(const std::vector<const Law*>& laws, const Implementation& impl,
                                const RunOptions& opts, int jobs,
                                const std::function<void(std::size_t, const LawResult&)>& done) {
  if (jobs <= 1 || !impl.capabilities().reentrant || !opts.reproduce.empty() || opts.max_calls > 0)
    return run_serially(laws, impl, opts, done);
  GenConfig g = opts.gen;
  g.caps = impl.capabilities();
  // Each law's passes (RunOptions::law_calls): what RapidCheck concluded of each pass's draws, and the cases
  // planned. The second passes are drawn once every first pass is checked, from the calls it made: the counts are
  // those a serial run takes.
  std::vector<std::optional<rc::detail::TestResult>> drawn(laws.size()), drawn_more(laws.size());
  std::vector<int> planned(laws.size(), 0);
  std::vector<Progress> progress(laws.size());
  CheckPool pool(laws, impl, jobs);
  for (std::size_t l = 0; l < laws.size(); ++l)
    if (why_not_applicable(*laws[l], impl, g).empty()) {  // otherwise run_law says so below, without a case
      planned[l] = first_pass_cases(*laws[l], opts);
      drawn[l] = draw_law(pool, l, *laws[l], g, opts, 0, planned[l], law_cases(*laws[l], opts), progress[l]);
    }
  if (opts.law_calls > 0) {
    pool.wait_idle();
    for (std::size_t l = 0; l < laws.size(); ++l) {
      if (!drawn[l] || !drawn[l]->is<rc::detail::SuccessResult>() || pool.failed(l)) continue;
      long calls = 0;
      for (const Checked& c : pool.checked(l)) calls += c.calls;
      const int more = second_pass_cases(*laws[l], opts, planned[l], calls);
      planned[l] += more;  // interrupted: planned, not drawn, so not checked
      if (more > 0 && !stop_requested())
        drawn_more[l] = draw_law(pool, l, *laws[l], g, opts, 1, more, planned[l], progress[l]);
    }
  }
  pool.close();

  std::vector<LawResult> out;
  for (std::size_t l = 0; l < laws.size(); ++l) {
    const Law& law = *laws[l];
    const std::deque<Checked>& checked = pool.checked(l);
    const auto success = [](const std::optional<rc::detail::TestResult>& r) {
      return r && r->is<rc::detail::SuccessResult>();
    };
    const bool all_drawn = success(drawn[l]) && (!drawn_more[l] || success(drawn_more[l]));
    // Interrupted: a law every case of which was drawn and checked keeps its result.
    const long ran = std::count_if(checked.begin(), checked.end(), [](const Checked& c) { return c.ran; });
    if (stop_requested() && drawn[l] && (!all_drawn || pool.failed(l) || ran < long(planned[l]))) {
      out.push_back(interrupted_result(law, impl, opts, checked, pool.failed(l), planned[l]));
    } else if (!all_drawn || pool.failed(l)) {  // not applicable, or something to shrink or report: alone
      std::vector<long> held;
      for (const Checked& c : checked) {
        if (c.failed) break;
        held.push_back(c.calls);
      }
      out.push_back(run_law_impl(law, impl, opts, &held));
    } else {
      const auto& first = drawn[l]->get<rc::detail::SuccessResult>();
      out.push_back(held_result(law, impl, opts,
                                drawn_more[l] ? merged(first, drawn_more[l]->get<rc::detail::SuccessResult>()) : first,
                                checked));
    }
  }
  if (done)
    for (std::size_t k = 0; k < out.size(); ++k) done(k, out[k]);
  return out;
}

void check_reproduce_string(const std::string& reproduce, const std::string& law) {
  // Real strings are about 100 characters (a few more per shrink step); anything this long is not one.
  constexpr std::size_t kMaxLength = 1 << 16;
  const auto shown = [&] { return "\"" + (reproduce.size() > 40 ? reproduce.substr(0, 37) + "..." : reproduce) + "\""; };
  if (reproduce.size() > kMaxLength)
    throw std::invalid_argument("the reproduce string is " + std::to_string(reproduce.size()) +
                                " characters long; expected at most " + std::to_string(kMaxLength) +
                                " (the string a report's \"reproduce\" field holds)");
  std::unordered_map<std::string, rc::detail::Reproduce> map;
  try {
    map = rc::detail::stringToReproduceMap(reproduce);
  } catch (const std::exception& e) {  // RapidCheck's ParseException / SerializationException, or a huge length
    throw std::invalid_argument("the reproduce string " + shown() + " is not a RapidCheck reproduce string (" +
                                e.what() + "); expected the string a report's \"reproduce\" field holds");
  }
  const auto it = map.find(law);
  if (it == map.end()) {
    std::string held;
    for (const auto& [name, r] : map) held += (held.empty() ? "" : ", ") + name;
    throw std::invalid_argument("the reproduce string " + shown() + " is for " +
                                (held.empty() ? std::string("no law") : "the law " + held) + ", not " + law);
  }
  if (it->second.size < 0 || it->second.size > kMaxRcSize)
    throw std::invalid_argument("the reproduce string " + shown() + " asks for RapidCheck size " +
                                std::to_string(it->second.size) + "; expected 0 to " + std::to_string(kMaxRcSize));
}

RunOptions options_from_rc_params(const std::string& law) {
  const auto& cfg = rc::detail::configuration();
  RunOptions o;
  o.seed = cfg.testParams.seed;
  o.cases = cfg.testParams.maxSuccess;
  o.max_size = cfg.testParams.maxSize;
  if (const auto it = cfg.reproduce.find(law); it != cfg.reproduce.end())
    o.reproduce = rc::detail::reproduceMapToString({{law, it->second}});
  return o;
}

std::string_view status_name(LawStatus s) {
  switch (s) {
    case LawStatus::held: return "held";
    case LawStatus::falsified: return "falsified";
    case LawStatus::not_applicable: return "n/a";
    case LawStatus::not_checked: return "not checked";
  }
  return "?";
}

std::string describe(const LawResult& r) {
  std::string s = r.law + " on " + r.implementation + " (" + std::string(dtype_name(r.dtype)) + ", seed " +
                  std::to_string(r.seed) + "): ";
  switch (r.status) {
    case LawStatus::held:
      return s + "held in " + std::to_string(r.cases_run) + " cases (" + std::to_string(r.calls) + " calls)" +
             (r.note.empty() ? "" : "; " + r.note) + "\n";
    case LawStatus::not_applicable: return s + "not applicable: " + r.note + "\n";
    case LawStatus::not_checked: return s + "NOT CHECKED: " + r.note + "\n";
    case LawStatus::falsified: break;
  }
  s += "FALSIFIED after " + std::to_string(r.cases_run) + " cases and " + std::to_string(r.shrink_steps) +
       " shrink steps (" + std::to_string(r.calls) + " calls)\n";
  if (r.violation) s += "  " + r.violation->message + "\n  margin: " + margin_text(*r.violation) + "\n";
  // "B=1 H=1 T=1 T_k=33 D=1 (bottom-right) key_lengths=..."
  const auto shape_line = [](const Problem& p) {
    const Shape& q = p.q.shape();
    std::string s = "B=" + std::to_string(q.B) + " H=" + std::to_string(q.H) + " T=" + std::to_string(q.T) +
         (p.k.shape().T != q.T ? " T_k=" + std::to_string(p.k.shape().T) : std::string()) +
         " D=" + std::to_string(q.D) + (p.v_dim() != q.D ? " D_v=" + std::to_string(p.v_dim()) : std::string()) +
         (p.k.shape().T != q.T
              ? (p.alignment == CausalAlignment::TopLeft ? " (top-left)" : " (bottom-right)")
              : "");
    if (!p.key_lengths.empty()) {
      s += " key_lengths=";
      for (std::size_t b = 0; b < p.key_lengths.size(); ++b) s += (b ? "," : "") + std::to_string(p.key_lengths[b]);
    }
    if (p.window) s += " window=" + std::to_string(*p.window);
    return s;
  };
  if (r.violation && r.violation->call)
    s += "  failing call: " + shape_line(*r.violation->call) +
         (r.violation->call_what.empty() ? std::string() : " (" + r.violation->call_what + ")") + "\n";
  if (r.minimal_case) {
    const Problem& p = r.minimal_case->problem;
    s += std::string(r.violation && r.violation->call ? "  from the case: " : "  minimal case: ") + shape_line(p) + "\n";
  }
  if (!r.reproduce.empty()) s += "  replay: RC_PARAMS=\"reproduce=" + r.reproduce + "\"\n";
  return s;
}

}  // namespace attncheck
