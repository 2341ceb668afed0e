// Resolves plug-in specs to implementations and wraps them with the checks every plug-in call gets.
#include "attncheck/harness.hpp"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "attncheck/format.hpp"
#include "attncheck/law.hpp"
#include "attncheck/probe.hpp"
#include "c_plugin.hpp"
#include "descendants.hpp"
#include "subprocess.hpp"

namespace attncheck {
namespace {

class CheckedImplementation final : public Implementation {
 public:
  explicit CheckedImplementation(ImplementationPtr inner) : inner_(std::move(inner)) {}
  const std::string& name() const override { return inner_->name(); }
  const std::string& description() const override { return inner_->description(); }
  const Capabilities& capabilities() const override { return inner_->capabilities(); }
  std::string unavailable() const override { return inner_->unavailable(); }
  Outcome forward(const Problem& p) const override {
    Outcome o = inner_->forward(p);
    check_outcome_shape(p, o, name());
    // Non-finite values are left to the laws: each compares only the entries it reads, so a NaN or Inf is
    // reported by the law that reads it, at its own row (oracle-agreement for any output or weight), never by
    // whichever law happened to make the call. check_finite_outcome stays for callers outside the laws.
    return o;
  }
  // The gradient laws call the backward through this wrapper.
  Gradients backward(const Problem& p) const override {
    Gradients g = inner_->backward(p);
    check_gradients_shape(p, g, name(), capabilities());
    return g;
  }

 private:
  ImplementationPtr inner_;
};

bool all_finite(const Tensor<double>& t) { return t.values().allFinite(); }
double max_abs(const Tensor<double>& t) { return t.values().cwiseAbs().maxCoeff(); }

// Rows of queries that see no key are skipped: what a kernel returns there (zeros, or NaN as PyTorch does) is
// outside every law, which skip those rows too.
void throw_first_nonfinite(const Problem& p, const Tensor<double>& t, const char* what, const std::string& who,
                           const std::string& why) {
  const Shape& s = t.shape();
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h)
      for (Index i = 0; i < s.T; ++i) {
        if (p.visibility(b, h).keys(i).empty()) continue;
        for (Index c = 0; c < s.D; ++c)
          if (!std::isfinite(t(b, h, i, c)))
            throw ImplementationError(ImplementationError::Kind::nonfinite,
                                      who + ": " + what + "[" + std::to_string(b) + "," + std::to_string(h) + "," +
                                          std::to_string(i) + "," + std::to_string(c) + "] is " +
                                          std::to_string(t(b, h, i, c)) + " although " + why);
      }
}

bool is_executable(const std::string& p) { return !p.empty() && ::access(p.c_str(), X_OK) == 0; }

// Where attncheck finds what it ships beside itself: `relative` to the running program's folder (an
// installed tree that was moved), else the build tree's copy, else the configured install location. Empty
// when `usable` accepts none.
std::string first_existing(const std::string& relative, std::initializer_list<std::string> fixed,
                           const std::function<bool(const std::string&)>& usable) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::string beside = (self.parent_path() / relative).lexically_normal().string();
    if (usable(beside)) return beside;
  }
  for (const std::string& p : fixed)
    if (usable(p)) return p;
  return {};
}

}  // namespace

ImplementationPtr checked_implementation(ImplementationPtr impl) {
  return std::make_shared<CheckedImplementation>(std::move(impl));
}

void check_finite_outcome(const Problem& p, const Outcome& o, const std::string& impl_name) {
  if (!all_finite(p.q) || !all_finite(p.k) || !all_finite(p.v)) return;
  if (o.output.values().allFinite() && (!o.weights || o.weights->values().allFinite())) return;
  // |score| <= D·max|q|·max|k|·scale. Below the accumulation type's largest value (float for every dtype
  // but float64, as kernels accumulate), softmax is finite and every output is a convex combination of V
  // rows, so no correct kernel returns a NaN or Inf: any is a bug, not rounding.
  const Index D = p.q.shape().D;
  const double scale = p.scale.value_or(1 / std::sqrt(double(D)));
  // A kernel may form q·k before it scales (or the scale may be above 1): both must stay finite.
  const double product = double(D) * max_abs(p.q) * max_abs(p.k), bound = product * scale;
  // float16 kernels may keep QKᵀ in the dtype, where 65504 is the largest finite score.
  const double limit = p.dtype == DType::f64   ? std::numeric_limits<double>::max()
                       : p.dtype == DType::f16 ? max_finite(DType::f16)
                                               : std::numeric_limits<float>::max();
  if (!(std::max(product, bound) < limit / 2)) return;
  const std::string why = std::string("every input is finite and neither a product q·k (|q·k| <= ") +
                          format_number(product, 3) + ") nor a scaled score (|score| <= " + format_number(bound, 3) +
                          ") can overflow " +
                          (p.dtype == DType::f64 ? "float64" : p.dtype == DType::f16 ? "float16" : "float32");
  throw_first_nonfinite(p, o.output, "output", impl_name, why);
  if (o.weights) throw_first_nonfinite(p, *o.weights, "weights", impl_name, why);
}

namespace {
// $ATTNCHECK_CALL_TIMEOUT when it holds a positive finite number of seconds.
std::optional<double> env_call_timeout() {
  if (const char* env = std::getenv("ATTNCHECK_CALL_TIMEOUT"); env && *env) {
    char* end = nullptr;
    const double s = std::strtod(env, &end);
    if (*end == '\0' && s > 0 && std::isfinite(s)) return s;
  }
  return std::nullopt;
}
}  // namespace

double default_call_timeout() { return env_call_timeout().value_or(10); }

double default_startup_timeout() { return env_call_timeout().value_or(60); }

std::string plugin_host_path() {
  if (const char* env = std::getenv("ATTNCHECK_PLUGIN_HOST"); env && *env) {
    if (!is_executable(env))
      throw SpecError(std::string("ATTNCHECK_PLUGIN_HOST is ") + env + ", which is not an executable file");
    return env;
  }
  const std::string found = first_existing("attncheck-plugin-host", {ATTNCHECK_PLUGIN_HOST_BUILD, ATTNCHECK_PLUGIN_HOST_INSTALL},
                                           is_executable);
  if (!found.empty()) return found;
  throw SpecError("cannot find attncheck-plugin-host (looked beside this program, in " ATTNCHECK_PLUGIN_HOST_BUILD
                  " and " ATTNCHECK_PLUGIN_HOST_INSTALL
                  "); set ATTNCHECK_PLUGIN_HOST to its path, or pass "
                  "--no-isolate to load the plug-in in-process");
}

std::string python_client_dir() {
  const auto has_client = [](const std::string& dir) {
    return ::access((dir + "/attncheck_plugin.py").c_str(), R_OK) == 0;
  };
  return first_existing("../" ATTNCHECK_PYTHON_INSTALL_RELATIVE, {ATTNCHECK_PYTHON_BUILD, ATTNCHECK_PYTHON_INSTALL},
                        has_client);
}

namespace {
void end_tree_and_die(int sig) {
  detail::end_descendants();  // async-signal-safe
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

void stop_gracefully(int sig) {
  request_stop();             // the run ends soon and writes what it finished
  detail::end_descendants();  // a call in flight fails at once instead of at its timeout
  struct sigaction again {};
  again.sa_handler = end_tree_and_die;  // a second signal ends it all now
  ::sigaction(sig, &again, nullptr);
}
}  // namespace

void guard_process_tree(bool interruptible) {
  static bool guarded = false;
  if (guarded) return;
  guarded = true;
  detail::become_subreaper();
  std::atexit([] { detail::end_descendants(); });
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // ignored by whoever started us (nohup, a background job): stays so
    struct sigaction sa {};
    sa.sa_handler = interruptible && sig != SIGHUP ? stop_gracefully : end_tree_and_die;
    ::sigaction(sig, &sa, nullptr);
  }
}

ImplementationPtr load_implementation(const std::string& spec, const HarnessOptions& opts) {
  ImplementationPtr raw;
  if (spec.rfind("plugin:", 0) == 0) {
    const std::string path = spec.substr(7);
    if (path.empty()) throw SpecError("plugin: needs a path, e.g. plugin:./libmyattention.so");
    const std::string file = detail::as_file_path(path);
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0)
      throw SpecError(spec + ": no such file " + file +
                      " (expected a shared library built against attncheck/plugin.h)");
    raw = opts.isolate ? detail::start_subprocess(spec, {plugin_host_path(), file}, opts)
                       : detail::load_c_plugin(path, spec);
  } else if (spec.rfind("exec:", 0) == 0) {
    const std::string command = spec.substr(5);
    if (command.empty()) throw SpecError("exec: needs a command, e.g. exec:'/usr/bin/python3 my_attention.py'");
    // Through the plug-in host's --exec mode: it ends the command's whole process group when attncheck dies,
    // which a plain /bin/sh child (killed alone by PR_SET_PDEATHSIG) would not.
    raw = detail::start_subprocess(spec, {plugin_host_path(), "--exec", command}, opts);
  } else {
    throw SpecError("unknown implementation spec '" + spec + "' (expected plugin:PATH.so or exec:COMMAND)");
  }
  ImplementationPtr impl = checked_implementation(std::move(raw));
  if (opts.probe_weights && !impl->capabilities().returns_weights) impl = with_recovered_weights(std::move(impl));
  return impl;
}

}  // namespace attncheck
