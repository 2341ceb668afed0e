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
#include "attncheck/law.hpp"
#include "laws/support.hpp"

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

// evaluate_case, telling whether the implementation timed out, or could not be (re)started for the call.
Verdict evaluate(const Law& law, const Implementation& impl, const LawCase& c, bool& timed_out,
                 bool* not_started = nullptr) {
  timed_out = false;
  if (not_started) *not_started = false;
  try {
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
    law.explain(impl, c, v);
  } catch (const ImplementationError&) {
  }
}

std::optional<Violation> evaluate_case(const Law& law, const Implementation& impl, const LawCase& c) {
  bool timed_out = false;
  std::optional<Violation> v = evaluate(law, impl, c, timed_out).violation;
  if (v) explain(law, impl, c, *v);
  return v;
}

namespace {

// "1 case", "3 cases".
std::string cases_text(int n) { return std::to_string(n) + (n == 1 ? " case" : " cases"); }

// Why a law cannot be checked against impl under these bounds ("" when it can).
std::string why_not_applicable(const Law& law, const Implementation& impl, const GenConfig& g) {
  std::string why_not = law.not_applicable ? law.not_applicable(g) : std::string();
  if (why_not.empty() && !g.caps.supports(g.dtype))
    why_not = impl.name() + " does not accept " + std::string(dtype_name(g.dtype));
  return why_not;
}

// RapidCheck's parameters for one law: the run's seed and size, its cases (at most the law's own limit).
rc::detail::TestParams test_params(const Law& law, const RunOptions& opts) {
  rc::detail::TestParams params;
  params.seed = opts.seed;
  params.maxSuccess = law.max_cases > 0 ? std::min(opts.cases, law.max_cases) : opts.cases;
  params.maxSize = opts.max_size;
  return params;
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

// run_law; `known_held[n]`, when given, says that the n-th case drawn before any failure was already checked
// and held, so it is not checked again; `known_calls` are the calls those checks made.
LawResult run_law_impl(const Law& law, const Implementation& impl, const RunOptions& opts,
                       const std::vector<bool>* known_held, long known_calls = 0) {
  LawResult r;
  r.law = law.name;
  r.implementation = impl.name();
  r.dtype = opts.gen.dtype;
  r.seed = opts.seed;
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };

  GenConfig g = opts.gen;
  g.caps = impl.capabilities();
  const std::string why_not = why_not_applicable(law, impl, g);
  if (!why_not.empty()) {
    r.status = LawStatus::not_applicable;
    r.note = why_not;
    return r;
  }

  // An implementation given up on before this law (it could not be started): reported at once, no call made.
  if (const std::string gone = impl.unavailable(); !gone.empty()) {
    r.status = LawStatus::falsified;
    r.violation = call_failure(std::string(kind_name(ImplementationError::Kind::unavailable)) + ": " + gone);
    r.note = "not checked: the implementation could not be started";
    return r;
  }

  if (stop_requested()) {
    r.status = LawStatus::not_checked;
    r.note = "not checked: the run was interrupted";
    return r;
  }
  // The calls this law may spend: its share of the run's budget (run_laws), or all that is left of it.
  const long spent_before = opts.calls_spent ? opts.calls_spent->load() : 0;
  const long budget_left = opts.max_calls > 0 ? std::max(0L, opts.max_calls - spent_before) : 0;
  const long law_budget = opts.law_share != 0 ? std::clamp(opts.law_share, 0L, budget_left) : budget_left;
  const std::string budget_words =
      opts.max_calls <= 0 ? std::string()
      : opts.law_share != 0 ? "its share of the call budget (" + std::to_string(law_budget) + " of --max-calls " +
                                 std::to_string(opts.max_calls) + ")"
                           : "the call budget (" + std::to_string(opts.max_calls) + " calls, --max-calls)";
  // A run whose call budget is spent checks no further law: not a law that held, one that was not checked.
  if (opts.max_calls > 0 && law_budget == 0) {
    r.status = LawStatus::not_checked;
    r.note = "not checked: " + budget_words + " ran out before this law";
    return r;
  }

  const rc::Gen<LawCase> gen = law.gen(g);
  const CountingImplementation counted(impl);
  // Shrinking state. Once a failure is clear (margin >= kClearMargin), a shrink that fails by less is not
  // taken (RapidCheck then tries the next candidate): among failing candidates the clear ones win, when there
  // are any. A failure on the outputs of a kernel with probed weights is shrunk with the outputs check alone.
  // A replayed case is checked in full, so its verdict never depends on this state.
  bool have_clear = false;
  std::string failed_on;
  // RapidCheck counts any exception as a failing case. attncheck's own errors (a broken oracle or
  // statistic, a bad parameter) are not counterexamples: keep the first one and rethrow it after the run, so
  // callers report an internal error instead of a falsified law.
  std::exception_ptr internal;
  std::string sampled;  // what the last long-context case checked by sampling, for the note
  Progress progress{.law = law.name};
  std::size_t drawn = 0;
  // Every call after the first failure tries a shrink candidate. Once max_shrink_timeouts of them have
  // timed out, the rest pass untried, so RapidCheck ends with the smallest hanging case found so far.
  bool shrinking = false;
  int shrink_timeouts = 0;
  const auto shrink_budget_spent = [&] {
    return opts.max_shrink_timeouts > 0 && shrink_timeouts >= opts.max_shrink_timeouts;
  };
  // The time and call budgets: shrinking started at `shrink_start`; calls spent by earlier laws of the run.
  std::chrono::steady_clock::time_point shrink_start;
  const auto calls_spent = [&] { return opts.max_calls > 0 && counted.calls() >= law_budget; };
  const auto shrink_time_spent = [&] {
    return opts.shrink_seconds > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - shrink_start).count() >= opts.shrink_seconds;
  };
  std::string cut_short;  // why shrinking stopped before RapidCheck ran out of candidates
  std::string start_failure;  // the first call that failed because the implementation could not be started
  int unchecked = 0;      // cases passed untried because the call budget was spent
  int interrupted = 0;    // cases passed untried because the run was asked to stop
  bool interrupted_shrinking = false;
  std::optional<Failure> last_failure;  // the latest failing case: after shrinking, the smallest
  // Shrinking also ends, with the smallest failing case so far, once the implementation is given up.
  const auto property = [&] {
    if (stop_requested()) {
      if (shrinking) interrupted_shrinking = true;
      else ++interrupted;
      return;
    }
    if (shrinking && (shrink_budget_spent() || !counted.unavailable().empty())) return;
    if (shrinking && cut_short.empty() && (shrink_time_spent() || calls_spent()))
      cut_short = calls_spent() ? "calls" : "time";
    if (shrinking && !cut_short.empty()) return;
    if (!shrinking && calls_spent()) {
      ++unchecked;
      return;
    }
    if (internal) return;  // the run is lost to attncheck's own error: end it (and its shrinking) quickly
    // Drawing the case is attncheck's own work too: an exception from a generator (std::bad_alloc for a
    // shape that does not fit, a broken invariant) is an internal error, not a counterexample. RapidCheck's
    // own control flow (a discarded case, a generation failure) passes through untouched.
    LawCase c;
    try {
      c = *gen;
    } catch (const rc::detail::CaseResult&) {
      throw;
    } catch (const rc::GenerationFailure&) {
      throw;
    } catch (const Cancelled&) {  // the run was asked to stop while a long case was drawn
      if (shrinking) interrupted_shrinking = true;
      else ++interrupted;
      return;
    } catch (const std::exception& e) {
      if (!internal)
        internal = std::make_exception_ptr(std::runtime_error(
            "generating a case of " + law.name + ": " +
            (dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory (" + std::string(e.what()) + ")"
                                                     : std::string(e.what()))));
      throw;
    } catch (...) {
      if (!internal) internal = std::current_exception();
      throw;
    }
    for (const auto& t : c.tags) RC_TAG(t);
    const std::size_t n = drawn++;
    if (known_held && !progress.shrinking && n < known_held->size() && (*known_held)[n]) return;
    c.outputs_only = g.caps.weights_probed && failed_on == "output";
    std::optional<Violation> v;
    bool timed_out = false, not_started = false;
    try {
      Verdict verdict = evaluate(law, counted, c, timed_out, &not_started);
      v = std::move(verdict.violation);
      if (!verdict.note.empty()) sampled = std::move(verdict.note);
    } catch (const rc::detail::CaseResult&) {
      throw;
    } catch (...) {
      if (!internal) internal = std::current_exception();
      throw;
    }
    // The call in flight when the run was asked to stop is not judged (the handler may have ended it).
    if (stop_requested()) {
      if (shrinking) interrupted_shrinking = true;
      else ++interrupted;
      return;
    }
    r.timeouts += timed_out;
    shrink_timeouts += timed_out && shrinking;
    // A call the implementation could not be started for is no counterexample (nor a smaller one): the case
    // passes untried, and the law says so if nothing else failed.
    if (v && not_started) {
      if (start_failure.empty()) start_failure = v->message;
      return;
    }
    if (v) {
      if (!shrinking) shrink_start = std::chrono::steady_clock::now();
      shrinking = true;
      const bool clear = margin(*v) >= kClearMargin;
      if (have_clear && !clear) return;
      have_clear = have_clear || clear;
      failed_on = v->quantity;
      c.outputs_only = false;
      last_failure = Failure{c, *v};
      RC_FAIL(v->message);
    }
  };

  const rc::detail::TestParams params = test_params(law, opts);
  const rc::detail::TestMetadata md = test_metadata(law);
  std::unordered_map<std::string, rc::detail::Reproduce> reproduce_map;
  if (!opts.reproduce.empty()) {
    check_reproduce_string(opts.reproduce, law.name);
    reproduce_map = rc::detail::stringToReproduceMap(opts.reproduce);
  }

  progress.cases_total = params.maxSuccess;
  ProgressListener listener(progress, opts.on_progress);
  const rc::detail::TestResult result = rc::detail::checkTestable(property, md, params, listener, reproduce_map);
  if (result.is<rc::detail::FailureResult>() && last_failure && !stop_requested())
    explain(law, counted, last_failure->lcase, last_failure->violation);  // once, on the case reported
  r.seconds = elapsed();
  r.shrink_steps = progress.shrink_steps;
  r.calls = known_calls + counted.calls();
  if (opts.calls_spent) *opts.calls_spent += counted.calls();
  if (internal) std::rethrow_exception(internal);
  r.note = sampled;

  if (result.is<rc::detail::SuccessResult>()) {
    const auto& s = result.get<rc::detail::SuccessResult>();
    r.status = LawStatus::held;
    r.cases_run = s.numSuccess - unchecked - interrupted;
    for (const auto& [tags, n] : s.distribution)
      for (const auto& t : tags) r.coverage[unquote(t)] += n;
    if (law.finding && unchecked == 0 && interrupted == 0 && start_failure.empty() && !stop_requested())
      r.note = finding_note(law, impl, g);
    if (!start_failure.empty()) {  // nothing failed, but not every case could be checked
      r.status = LawStatus::falsified;
      r.violation = call_failure(start_failure);
      r.note = "not every case was checked: the implementation could not be started";
      return r;
    }
    // Some cases left unchecked: the law is not checked, whatever the cases that were checked showed.
    if (interrupted > 0) {
      r.status = LawStatus::not_checked;
      r.note = "interrupted: held in the " + cases_text(r.cases_run) + " checked before the run was "
               "stopped, " + std::to_string(interrupted) + " not checked";
    } else if (unchecked > 0) {
      r.status = LawStatus::not_checked;
      r.note = budget_words + " ran out: held in the " + cases_text(r.cases_run) + " checked, " +
               std::to_string(unchecked) + " not checked";
    }
  } else if (result.is<rc::detail::FailureResult>()) {
    const auto& f = result.get<rc::detail::FailureResult>();
    r.status = LawStatus::falsified;
    r.cases_run = f.numSuccess + 1;
    r.reproduce = rc::detail::reproduceMapToString({{law.name, f.reproduce}});
    if (shrink_budget_spent())
      r.note = "shrinking stopped after " + std::to_string(shrink_timeouts) +
               " shrink candidates timed out (each costs a call timeout): a smaller case may hang too";
    else if (interrupted_shrinking)
      r.note = "shrinking interrupted: the smallest failing case found before the run was stopped";
    else if (!impl.unavailable().empty())
      r.note = "shrinking stopped: the implementation could not be started again";
    else if (cut_short == "time")
      r.note = "shrinking cut short after " + format_number(opts.shrink_seconds, 3) +
               " s (--shrink-time): the smallest failing case found by then; --shrink-time 0 shrinks on";
    else if (cut_short == "calls")
      r.note = "shrinking cut short: " + budget_words + " ran out; the smallest failing case found by then";
    if (last_failure) {
      r.minimal_case = last_failure->lcase;
      r.violation = last_failure->violation;
    } else {
      r.violation = call_failure(f.description);
    }
  } else if (result.is<rc::detail::GaveUpResult>()) {
    throw std::logic_error("run_law: RapidCheck gave up on " + law.name + ": " +
                           result.get<rc::detail::GaveUpResult>().description);
  } else if (!opts.reproduce.empty()) {
    // Replaying a stored reproduce string whose case no longer fails: the bug is fixed, the law held there.
    r.status = LawStatus::held;
    r.cases_run = 1;
    r.note = "the reproduced case no longer fails (" + result.get<rc::detail::Error>().description + ")";
  } else {
    throw std::logic_error("run_law: RapidCheck error in " + law.name + ": " +
                           result.get<rc::detail::Error>().description);
  }
  return r;
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

std::vector<LawResult> run_laws(const std::vector<const Law*>& laws, const Implementation& impl,
                                const RunOptions& opts, int jobs,
                                const std::function<void(std::size_t, const LawResult&)>& done) {
  std::vector<LawResult> out;
  if (jobs <= 1 || !impl.capabilities().reentrant || !opts.reproduce.empty() || opts.max_calls > 0) {
    // A call budget is shared out: each law may spend what is left divided by the applicable laws left
    // (itself included), so what one law leaves unspent passes on, and no law spends the others' share.
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

  // The checks run on `jobs` workers; the calling thread draws every case with RapidCheck and queues it,
  // at most 2·jobs ahead (each case may hold long-context tensors).
  std::mutex mu;
  std::condition_variable ready, space;
  std::deque<Job> queue;
  bool closed = false;
  std::vector<std::deque<Checked>> checked(laws.size());
  std::vector<char> failed(laws.size(), 0);
  const auto worker = [&] {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu);
        ready.wait(lock, [&] { return closed || !queue.empty(); });
        if (queue.empty()) return;
        job = std::move(queue.front());
        queue.pop_front();
        space.notify_one();
        if (failed[job.law] || stop_requested()) continue;  // re-run alone anyway, or not at all
      }
      Checked c;
      c.ran = true;
      const auto start = std::chrono::steady_clock::now();
      const CountingImplementation counted(impl);
      try {
        bool timed_out = false;  // a failure is re-run alone, where its report is made: nothing to explain here
        Verdict verdict = evaluate(*laws[job.law], counted, job.lcase, timed_out);
        c.failed = verdict.violation.has_value();
        c.note = std::move(verdict.note);
      } catch (...) {
        c.failed = true;  // re-run alone, where the error surfaces as it would serially
      }
      c.calls = counted.calls();
      c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::lock_guard lock(mu);
      checked[job.law][job.index] = std::move(c);
      if (checked[job.law][job.index].failed) failed[job.law] = 1;
    }
  };
  std::vector<std::thread> pool;
  const auto close_and_join = [&] {
    {
      std::lock_guard lock(mu);
      closed = true;
    }
    ready.notify_all();
    for (auto& t : pool)
      if (t.joinable()) t.join();
  };
  // Joins the workers on every way out, an exception from a generator included.
  struct Joiner {
    const decltype(close_and_join)& f;
    ~Joiner() { f(); }
  } joiner{close_and_join};
  for (int t = 0; t < jobs; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {  // the system's limit on threads (or their stacks): fewer workers, same reports
      if (pool.empty()) throw;
      break;
    }
  }

  std::vector<std::optional<rc::detail::TestResult>> drawn(laws.size());
  std::vector<Progress> progress(laws.size());
  for (std::size_t l = 0; l < laws.size(); ++l) {
    const Law& law = *laws[l];
    GenConfig g = opts.gen;
    g.caps = impl.capabilities();
    if (!why_not_applicable(law, impl, g).empty()) continue;  // run_law says so below, without a case
    const rc::Gen<LawCase> gen = law.gen(g);
    std::size_t n = 0;
    bool gen_error = false;  // attncheck's own: the law is re-run alone below, where it becomes an internal error
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
      std::unique_lock lock(mu);
      space.wait(lock, [&] { return queue.size() < 2 * std::size_t(jobs); });
      checked[l].emplace_back();
      queue.push_back(Job{l, n++, std::move(c)});
      ready.notify_one();
    };
    const rc::detail::TestParams params = test_params(law, opts);
    const rc::detail::TestMetadata md = test_metadata(law);
    progress[l] = Progress{.law = law.name, .cases_total = params.maxSuccess};
    ProgressListener listener(progress[l], opts.on_progress);
    const std::unordered_map<std::string, rc::detail::Reproduce> no_reproduce;
    drawn[l] = rc::detail::checkTestable(property, md, params, listener, no_reproduce);
  }
  close_and_join();

  for (std::size_t l = 0; l < laws.size(); ++l) {
    const Law& law = *laws[l];
    const bool all_drawn = drawn[l] && drawn[l]->is<rc::detail::SuccessResult>();
    // Interrupted: a law every case of which was drawn and checked keeps its result; one with some cases
    // checked, none failing, held in those; any other was not checked.
    const long ran = std::count_if(checked[l].begin(), checked[l].end(), [](const Checked& c) { return c.ran; });
    if (stop_requested() && drawn[l] &&
        (!all_drawn || failed[l] || ran < long(test_params(law, opts).maxSuccess))) {
      LawResult r;
      r.law = law.name;
      r.implementation = impl.name();
      r.dtype = opts.gen.dtype;
      r.seed = opts.seed;
      r.status = LawStatus::not_checked;
      r.note = "not checked: the run was interrupted";
      if (ran > 0 && !failed[l]) {
        r.cases_run = int(ran);
        for (const Checked& c : checked[l]) {
          r.seconds += c.seconds;
          r.calls += c.calls;
        }
        r.note = "interrupted: held in the " + cases_text(int(ran)) + " checked before the run was stopped, " +
                 std::to_string(test_params(law, opts).maxSuccess - ran) + " not checked";
      }
      out.push_back(std::move(r));
      continue;
    }
    if (!drawn[l] || !all_drawn || failed[l]) {  // not applicable, or something to shrink or report: alone
      std::vector<bool> held;
      long held_calls = 0;
      for (const Checked& c : checked[l]) {
        if (c.failed) break;
        held.push_back(true);
        held_calls += c.calls;
      }
      out.push_back(run_law_impl(law, impl, opts, &held, held_calls));
      continue;
    }
    LawResult r;
    r.law = law.name;
    r.implementation = impl.name();
    r.dtype = opts.gen.dtype;
    r.seed = opts.seed;
    r.status = LawStatus::held;
    const auto& s = drawn[l]->get<rc::detail::SuccessResult>();
    r.cases_run = s.numSuccess;
    for (const auto& [tags, n] : s.distribution)
      for (const auto& t : tags) r.coverage[unquote(t)] += n;
    for (const Checked& c : checked[l]) {
      r.seconds += c.seconds;
      r.calls += c.calls;
      if (!c.note.empty()) r.note = c.note;
    }
    if (law.finding) {
      GenConfig g = opts.gen;
      g.caps = impl.capabilities();
      r.note = finding_note(law, impl, g);
    }
    out.push_back(std::move(r));
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
