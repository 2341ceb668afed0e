// attncheck-law: one implementation, the named laws (all by default), every dtype it accepts; a short text
// report per falsified law with the minimal case and the command that replays it.
#include "attncheck/law_main.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

#include "attncheck/allocator.hpp"
#include "attncheck/format.hpp"
#include "attncheck/harness.hpp"
#include "attncheck/law.hpp"
#include "attncheck/probe.hpp"

namespace attncheck {
namespace {

std::string index_string(const std::vector<Index>& ix) {
  std::string s = "[";
  for (std::size_t i = 0; i < ix.size(); ++i) s += (i ? "," : "") + std::to_string(ix[i]);
  return s + "]";
}

// A tensor small enough to read, head by head; larger ones are summarised by their shape.
void print_tensor(std::ostream& os, const char* name, const Tensor<double>& t) {
  const Shape& s = t.shape();
  os << "    " << name << " " << to_string(s);
  if (t.size() > 96) {
    os << " (" << t.size() << " values, not shown)\n";
    return;
  }
  os << "\n";
  for (Index b = 0; b < s.B; ++b)
    for (Index h = 0; h < s.H; ++h) {
      os << "      [" << b << "," << h << "]";
      for (Index i = 0; i < s.T; ++i) {
        os << (i ? "\n            " : " ");
        for (Index c = 0; c < s.D; ++c) os << (c ? " " : "") << format_number(t(b, h, i, c));
      }
      os << "\n";
    }
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

namespace {
int law_main_impl(int argc, char** argv, ImplementationPtr builtin);
}

int law_main(int argc, char** argv, ImplementationPtr builtin) {
  keep_freed_memory();
  guard_process_tree();  // nothing a plug-in starts outlives this program
  return law_main_impl(argc, argv, std::move(builtin));
}

namespace {
// What the command line asked for.
struct LawMainArgs {
  std::string spec, reproduce;
  std::vector<std::string> law_names, dtype_names;
  int cases = 100, max_T = 64;
  std::uint64_t seed = 0;
  double timeout = default_call_timeout();
  bool timeout_given = false, list = false, no_isolate = false, probe = false;
};

// Parses the command line into `a`; an exit code when the program ends here (--help, a parse error).
std::optional<int> parse_law_main(int argc, char** argv, LawMainArgs& a) {
  CLI::App app{"Checks the laws of scaled causal attention against one implementation"};
  app.add_option("--impl", a.spec, "plugin:PATH.so or exec:COMMAND");
  app.add_option("--law", a.law_names, "a law to check (repeatable; default: every law)");
  app.add_option("--dtype", a.dtype_names,
                 "float32, float64, float16 or bfloat16 (repeatable; default: every dtype the implementation accepts)");
  app.add_option("--cases", a.cases, "cases per law and dtype")->check(CLI::PositiveNumber);
  app.add_option("--seed", a.seed, "RapidCheck seed; the same seed replays the same run");
  app.add_option("--max-T", a.max_T, "usual upper bound on T")->check(CLI::PositiveNumber);
  auto* timeout_opt = app.add_option("--timeout", a.timeout, "seconds a plug-in may take per call, and to start")
                          ->check(CLI::PositiveNumber);
  app.add_option("--reproduce", a.reproduce, "RapidCheck reproduce string of one falsified law (from a report)");
  app.add_flag("--no-isolate", a.no_isolate, "load a plugin: shared library into this process (a crash ends the run)");
  app.add_flag("--probe", a.probe, "print the scale and causal alignment the implementation really uses");
  app.add_flag("--list", a.list, "print the law names, one per line, and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  a.timeout_given = timeout_opt->count() > 0;
  return std::nullopt;
}

// The laws named (every law when none is); empty after naming an unknown one on stderr.
std::optional<std::vector<const Law*>> selected_laws(const std::vector<std::string>& names) {
  std::vector<const Law*> selected;
  for (const auto& n : names) {
    const Law* l = find_law(n);
    if (!l) {
      std::cerr << "attncheck-law: unknown law '" << n << "' (attncheck-law --list prints the names)\n";
      return std::nullopt;
    }
    selected.push_back(l);
  }
  if (names.empty())
    for (const Law& l : laws()) selected.push_back(&l);
  return selected;
}

// The dtypes named; empty after naming an unknown one on stderr.
std::optional<std::vector<DType>> named_dtypes(const std::vector<std::string>& names) {
  std::vector<DType> dtypes;
  for (const auto& n : names) {
    const auto t = parse_dtype(n);
    if (!t) {
      std::cerr << "attncheck-law: unknown dtype '" << n << "' (expected float32, float64, float16 or bfloat16)\n";
      return std::nullopt;
    }
    dtypes.push_back(*t);
  }
  return dtypes;
}

// The implementation to check: the builtin, with the checks and the weight recovery a loaded plug-in gets, or
// the one --impl loads (null after naming a bad spec on stderr).
ImplementationPtr open_implementation(const LawMainArgs& a, ImplementationPtr builtin) {
  ImplementationPtr impl = builtin ? checked_implementation(builtin) : nullptr;
  if (impl && !impl->capabilities().returns_weights) impl = with_recovered_weights(impl);
  try {
    if (!a.spec.empty())
      impl = load_implementation(a.spec, HarnessOptions{.call_timeout_s = a.timeout,
                                                        .startup_timeout_s = a.timeout_given ? a.timeout
                                                                                             : default_startup_timeout(),
                                                        .isolate = !a.no_isolate});
  } catch (const SpecError& e) {
    std::cerr << "attncheck-law: " << e.what() << "\n";
    return nullptr;
  }
  return impl;
}

// The minimal case of a falsified law, tensors and all.
void describe_case(std::ostream& details, const LawCase& c, const std::optional<Violation>& violation) {
  const Problem& p = c.problem;
  const Shape q = p.q.shape();
  details << "  minimal case: B=" << q.B << " H=" << q.H << " T_q=" << q.T << " T_k=" << p.k.shape().T
          << " D=" << q.D << (p.v_dim() != q.D ? " D_v=" + std::to_string(p.v_dim()) : std::string()) << ", scale "
          << (p.scale ? format_number(*p.scale) : "default (1/sqrt(D))") << ", "
          << (p.alignment == CausalAlignment::TopLeft ? "top-left" : "bottom-right") << "\n";
  // The masks beyond causal, when the case has them (the document bounds: where each document ends).
  if (const std::string masks = mask_families_line(p); !masks.empty()) details << "    masks: " << masks << "\n";
  for (const auto& [k, val] : c.params) details << "    " << k << " = " << format_number(val) << "\n";
  print_tensor(details, "q", p.q);
  print_tensor(details, "k", p.k);
  print_tensor(details, "v", p.v);
  if (p.bias) {  // [B_b, H_b, T_q, T_k], printed as q is
    Tensor<double> bias(Shape{p.bias->B, p.bias->H, p.bias->T_q, p.bias->T_k});
    std::copy(p.bias->values.begin(), p.bias->values.end(), bias.data());
    print_tensor(details, "bias", bias);
  }
  if (p.rope) {  // its fields and each token's position
    const auto ids = [](const std::vector<Index>& xs) {
      std::string out;
      for (const Index x : xs) out += (out.empty() ? "" : ", ") + std::to_string(x);
      return out;
    };
    details << "    rope: " << (p.rope->variant == RopeVariant::half_split ? "half-split" : "interleaved")
            << ", rotary_dim " << p.rope->rotary_dim << ", base " << format_number(p.rope->base) << ", factor "
            << format_number(p.rope->factor) << "; q positions " << ids(p.rope->q_positions) << "; k positions "
            << ids(p.rope->k_positions) << "\n";
  }
  if (p.qk_norm) {  // its eps and each normalised side's weights
    const auto ws = [](const std::vector<double>& xs) {
      std::string out;
      for (const double x : xs) out += (out.empty() ? "" : ", ") + format_number(x);
      return out;
    };
    details << "    QK-norm: eps " << format_number(p.qk_norm->eps)
            << (p.qk_norm->eps_outside ? " (outside the root)" : " (inside the root)");
    if (!p.qk_norm->q_weight.empty()) details << "; q weights " << ws(p.qk_norm->q_weight);
    if (!p.qk_norm->k_weight.empty()) details << "; k weights " << ws(p.qk_norm->k_weight);
    details << "\n";
  }
  if (p.temperature) {  // [B_t, H_t, T_q], printed as a [B_t, H_t, T_q, 1] tensor
    Tensor<double> t(Shape{p.temperature->B, p.temperature->H, p.temperature->T_q, 1});
    std::copy(p.temperature->values.begin(), p.temperature->values.end(), t.data());
    print_tensor(details, "temperature", t);
  }
  if (p.dropout)
    details << "    dropout: p = " << format_number(p.dropout->p) << ", seed " << p.dropout->seed << ", offset "
            << p.dropout->offset << "\n";
  if (const auto& var = c.variant) {  // a relational law's second call
    details << "    and the call it is compared with:\n";
    print_tensor(details, "q'", var->q);
    print_tensor(details, "k'", var->k);
    print_tensor(details, "v'", var->v);
  }
  if (violation && violation->expected) print_tensor(details, "expected", *violation->expected);
  if (violation && violation->actual) print_tensor(details, "actual", *violation->actual);
}

// A falsified law's paragraph: what broke, the minimal case, and the command that replays it.
void describe_falsified(std::ostream& details, const LawMainArgs& a, const char* argv0, const Implementation& impl,
                        const Law& law, DType t, const LawResult& r) {
  details << "\n" << law.name << " falsified by " << impl.name() << " at " << dtype_name(t) << ":\n";
  if (r.violation) {
    const Violation& v = *r.violation;
    details << "  " << v.message << "\n";
    if (!v.worst_index.empty())
      details << "  worst " << v.quantity << index_string(v.worst_index)
              << ": |actual - expected| = " << format_number(v.magnitude) << ", allowed " << format_number(v.tolerance)
              << "\n";
  }
  if (r.minimal_case) describe_case(details, *r.minimal_case, r.violation);
  // This very program with the spec it was given: a runner of attncheck_add_laws(TARGET exe) has no spec, and its
  // implementation's name is not one.
  const std::string replay = shell_quote(argv0) + (a.spec.empty() ? "" : " --impl " + shell_quote(a.spec)) +
                             (a.no_isolate ? " --no-isolate" : "") + " --law " + law.name + " --dtype " +
                             std::string(dtype_name(t)) + " --seed " + std::to_string(a.seed) + " --max-T " +
                             std::to_string(a.max_T) + " --reproduce " + shell_quote(r.reproduce);
  details << "  replay: " << replay << "\n";
}

// One law at one dtype: its line on stdout, and its paragraph in `details` when falsified.
LawStatus run_one(const LawMainArgs& a, const char* argv0, const Implementation& impl, const Law& law, DType t,
                  std::ostream& details) {
  RunOptions ro;
  ro.cases = a.cases;
  ro.seed = a.seed;
  ro.gen.dtype = t;
  ro.gen.max_T = a.max_T;
  ro.reproduce = a.reproduce;
  const LawResult r = run_law(law, impl, ro);
  std::printf("%-28s %-9s ", law.name.c_str(), std::string(dtype_name(t)).c_str());
  if (r.status == LawStatus::held) {
    std::printf("held (%d cases, %.2f s)\n", r.cases_run, r.seconds);
  } else if (r.status == LawStatus::not_applicable) {
    std::printf("not applicable: %s\n", r.note.c_str());
  } else if (r.status == LawStatus::not_checked) {
    std::printf("NOT CHECKED: %s\n", r.note.c_str());
  } else {
    std::printf("FALSIFIED after %d cases (%d shrinks)\n", r.cases_run, r.shrink_steps);
    describe_falsified(details, a, argv0, impl, law, t, r);
  }
  std::fflush(stdout);
  return r.status;
}

int law_main_impl(int argc, char** argv, ImplementationPtr builtin) {
  LawMainArgs a;
  if (const std::optional<int> done = parse_law_main(argc, argv, a)) return *done;
  if (a.list) {
    for (const Law& l : laws()) std::cout << l.name << "\n";
    return 0;
  }
  if (a.spec.empty() && !builtin) {
    std::cerr << "attncheck-law: --impl is required (plugin:PATH.so or exec:COMMAND)\n";
    return 2;
  }
  const auto selected = selected_laws(a.law_names);
  if (!selected) return 2;
  auto dtypes = named_dtypes(a.dtype_names);
  if (!dtypes) return 2;
  const ImplementationPtr impl = open_implementation(a, builtin);
  if (!impl) return 2;
  const Capabilities& caps = impl->capabilities();
  std::cout << impl->name() << ": " << impl->description() << "\n";
  if (a.probe) std::cout << probe_conventions(*impl).summary << "\n";

  std::vector<std::string> not_checked;
  if (dtypes->empty())
    for (const DType t : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
      if (caps.supports(t))
        dtypes->push_back(t);
      else
        not_checked.push_back(std::string(dtype_name(t)));
    }
  int falsified = 0, incomplete = 0;
  std::ostringstream details;
  try {
    for (const DType t : *dtypes)
      for (const Law* law : *selected) {
        const LawStatus s = run_one(a, argv[0], *impl, *law, t, details);
        falsified += s == LawStatus::falsified;
        incomplete += s == LawStatus::not_checked;
      }
  } catch (const std::exception& e) {
    std::cerr << "attncheck-law: internal error: " << e.what() << "\n";
    return 3;
  }
  if (!not_checked.empty()) {
    std::cout << "not checked:";
    for (const auto& n : not_checked) std::cout << " " << n;
    std::cout << " (" << impl->name() << " does not accept them)\n";
  }
  std::cout << details.str();
  return falsified ? 1 : incomplete ? 4 : 0;  // attncheck check's exit codes: 4, an applicable law not checked
}

}  // namespace

}  // namespace attncheck
