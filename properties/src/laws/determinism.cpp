// Law 11, determinism (exact): the same call twice (N times under --stress) is bit-identical; and law 47,
// grad-determinism, the same for the backward.
#include <future>
#include <thread>

#include "registry.hpp"
#include "support.hpp"

namespace attncheck::law_kit {
namespace {
namespace determinism_law {

const char* kWhy =
    "The same call twice gives bit-identical outputs and weights. A kernel that keeps state between calls, "
    "reads uninitialised memory or depends on thread timing breaks it; such bugs also make every other "
    "counterexample impossible to replay. Under --stress N each case's call is made N times, the repeats at once "
    "on several threads when the implementation is reentrant (so a race inside it, or between its calls, has the "
    "chance to show). Exact: no tolerance.";

const char* kGradWhy =
    "The same backward call twice gives bit-identical dQ, dK and dV (and the sinks' gradients). A backward that accumulates dK and dV with "
    "atomics in whatever order its thread blocks finish (FlashAttention's deterministic=False), keeps state between "
    "calls or reads uninitialised memory breaks it, and training runs stop being reproducible. FlashAttention's "
    "own test repeats the backward 50 times; --stress N does so here, concurrently for a reentrant implementation. "
    "Exact: no tolerance (rows that see no key under the nan convention are NaN both times and compare equal).";

// The calls a case makes: its "repeats" (a stored case from before --stress has none: twice).
int repeats_of(const LawCase& c, const char* law) {
  return c.params.count("repeats") ? int(int_param(c, law, "repeats", 2, 100000)) : 2;
}

template <class Gen>
rc::Gen<LawCase> with_repeats(const GenConfig& cfg, Gen gen) {
  const int n = std::max(2, cfg.stress);
  return rc::gen::map(gen(cfg), [n](LawCase c) {
    c.params["repeats"] = double(n);
    return c;
  });
}

// f() called `n` times: the first alone, the others at once on up to 8 threads when the implementation is
// reentrant, else one after the other.
template <class F>
auto repeated(const Implementation& impl, int n, F f) -> std::vector<decltype(f())> {
  std::vector<decltype(f())> r;
  r.push_back(f());
  if (!impl.capabilities().reentrant || n <= 2) {
    for (int k = 1; k < n; ++k) r.push_back(f());
    return r;
  }
  for (int done = 1; done < n;) {
    const int batch = std::min(n - done, 8);
    std::vector<std::future<decltype(f())>> running;
    for (int k = 0; k < batch; ++k) running.push_back(std::async(std::launch::async, f));
    for (auto& x : running) r.push_back(x.get());
    done += batch;
  }
  return r;
}

std::string nth(const char* what, int k, int n) {
  return std::string(" on identical ") + what + std::to_string(k + 1) + " of " + std::to_string(n);
}

std::optional<Violation> check(const Implementation& impl, const LawCase& c) {
  const Problem first = outputs_first(impl, c.problem);  // weights only once the outputs pass
  const int n = repeats_of(c, "determinism");
  std::vector<Outcome> o = repeated(impl, n, [&] { return call(impl, first); });
  for (int k = 1; k < n; ++k)
    if (auto v = compare("determinism", "output", o[0].output, o[std::size_t(k)].output, nullptr, {})) {
      v->message += nth("call ", k, n);
      v->weights = o[std::size_t(k)].weights;
      return v;
    }
  for (int k = 0; k < 2; ++k) o[std::size_t(k)].weights = weights_of(impl, c, o[std::size_t(k)]);
  if (o[0].weights && o[1].weights)
    if (auto v = compare("determinism", "weights", *o[0].weights, *o[1].weights, nullptr, {})) {
      v->message += " on the second identical call";
      v->weights = o[1].weights;
      return v;
    }
  return std::nullopt;
}

std::optional<Violation> check_gradients(const Implementation& impl, const LawCase& c) {
  const int n = repeats_of(c, "grad-determinism");
  const std::vector<Gradients> g = repeated(impl, n, [&] { return call_backward(impl, c.problem); });
  for (int k = 1; k < n; ++k) {  // exactly (no tolerance)
    const Gradients &a = g[0], &b = g[std::size_t(k)];
    std::optional<Violation> v;
    for (const auto& [name, x, y] : {std::tuple{"dQ", &a.dq, &b.dq}, std::tuple{"dK", &a.dk, &b.dk},
                                     std::tuple{"dV", &a.dv, &b.dv}})
      if (!v) v = compare("grad-determinism", name, *x, *y, nullptr, {});
    if (!v) v = compare_gradients("grad-determinism", a, b, nullptr, {});  // what is left: the sinks' gradients
    if (v) {
      v->message += nth("backward call ", k, n);
      return v;
    }
  }
  return std::nullopt;
}

}  // namespace determinism_law
}  // namespace

Law determinism() {
  using namespace determinism_law;
  return {"determinism", "the same call twice (N times under --stress) is bit-identical", kWhy,
          LawDoc{"11", "the same call twice (N times under `--stress N`) is bit-identical", "exact"},
          always_applies,
          [](const GenConfig& cfg) { return with_repeats(cfg, gen_plain); }, check, 0};
}

Law grad_determinism() {
  using namespace determinism_law;
  Law l{"grad-determinism", "the same backward call twice (N times under --stress) gives bit-identical dQ, dK, dV (and d_sinks)",
        kGradWhy,
        LawDoc{"47",
               "the same backward call twice (N times under `--stress N`, at once on threads for a reentrant implementation) gives bit-identical dQ, dK, dV (and the sinks' gradients)",
               "exact (bit-identical)"},
        needs_backward, [](const GenConfig& cfg) { return with_repeats(cfg, gen_gradients); },
        check_gradients, 0};
  l.needs_backward = true;
  return l;
}

}  // namespace attncheck::law_kit
