"""pytest plugin: the `attncheck` fixture checks a Python attention function against attncheck's laws.

    def attention(q, k, v, scale=None):          # numpy arrays, as attncheck_plugin.serve() calls it
        ...

    def test_my_attention(attncheck):
        attncheck.check(attention, dtypes=("float32", "float64"))

A torch function says so, and gets torch tensors at the case's real dtype on the device named:

    def test_my_torch_attention(attncheck):
        attncheck.check(attention, dtypes=("float32", "bfloat16"), framework="torch", device="cuda",
                        backward="autograd")

`check` writes a small wrapper script that serves the function with attncheck_plugin.serve(), runs
`attncheck check --impl exec:'PYTHON WRAPPER' --dtype D1,D2` once for every dtype (one attncheck run and one
server process: torch is imported once), and fails the test with each falsified law, its minimal case (the shape
and every keyword that is not its default), the margin (|actual - expected| against the tolerance), the report
and the command that replays the case. A function defined at the top level of a module is imported by the server
from its file; a closure, a lambda, a functools.partial or a bound method is pickled with cloudpickle
(python3-cloudpickle) instead, so parametrized configurations need no wrapper each. The server is a process of
its own (fork and exec of the interpreter, never a fork of pytest), so a pytest process that has initialised CUDA
is no obstacle: CUDA starts afresh in the server. When every call at a dtype raises, the failure is one error
with the function's traceback, not a falsified law per law; the function's own output (its prints and
tracebacks, each distinct one once) is the test's captured stderr. A falsified oracle-agreement also comes as a
Python program of its own (.attncheck/repro/<key>/oracle-agreement-<dtype>.py and .npz: the case, the call, the
float64 expectation and the derived tolerances; no attncheck binary), which exits 1 while the bug is there.

What each test checked (the laws that held, those not applicable and why, those falsified) is the test's
"attncheck" report section, one user property per dtype (junit XML), and a terminal summary section.

Like Hypothesis's `.hypothesis/`, the plugin keeps a folder in the test's rootdir, `.attncheck/` (or
--attncheck-dir): the wrappers (serve/), the latest reports (reports/) and every failing case (corpus/, as
attncheck's corpus), which attncheck replays first on the next run. Replay commands name the attncheck binary
that ran, by its absolute path, and files in that folder, so they work from a shell as printed.

Enable it with `-p attncheck_pytest` or `pytest_plugins = ["attncheck_pytest"]` in a conftest.py (or install
the package, harness/python/pyproject.toml, which registers it). Options: --attncheck-cases N,
--attncheck-seed S, --attncheck-timeout SECONDS, --attncheck-progress auto|yes|no, --attncheck-bin PATH (default: $ATTNCHECK, else
`attncheck` on PATH) and --attncheck-dir DIR.
"""

import hashlib
import importlib.util
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sys


class _Progress:
    """attncheck's progress line ([k/n] law: cases done; the time left) shown on the test's own terminal line while a
    check runs, then the line restored as pytest left it: with --attncheck-progress=yes, or auto on a terminal."""

    _LINE = re.compile(r"^\[\d+/\d+\] ")

    def __init__(self, config):
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        self.tw = getattr(reporter, "_tw", None)
        # pytest's capture holds fd 1 during a test: the terminal is reached with it suspended, as live logging does.
        self.capture = config.pluginmanager.get_plugin("capturemanager")
        wanted = config.getoption("--attncheck-progress")
        self.enabled = self.tw is not None and (wanted == "yes" or (wanted == "auto" and reporter.isatty))

    def run(self, argv, env):
        """The finished process (returncode, stdout, stderr), as subprocess.run gives it."""
        if not self.enabled:
            return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        import threading
        proc = subprocess.Popen(argv + ["--progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        out = []
        reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
        reader.start()
        err = []
        before = getattr(self.tw, "_current_line", "")  # what pytest wrote on this line: restored after
        shown = False
        for line in proc.stderr:
            if not self._LINE.match(line):
                err.append(line)
                continue
            width = max(20, self.tw.fullwidth - 1)
            self._write("\r\033[K" + ("attncheck " + line.rstrip("\n"))[:width])
            shown = True
        proc.wait()
        reader.join()
        if shown:
            self._write("\r\033[K" + before)
            if hasattr(self.tw, "_current_line"):  # what pytest measures to right-align "[100%]": the line as it was
                self.tw._current_line = before
        return subprocess.CompletedProcess(argv, proc.returncode, "".join(out), "".join(err))

    def _write(self, text):
        import contextlib
        with self.capture.global_and_fixture_disabled() if self.capture else contextlib.nullcontext():
            self.tw.write(text, flush=True)


def _missing_module(module, package, who="attncheck_pytest"):
    """The message for a module this interpreter lacks: which interpreter ran, and what to install."""
    debian = sys.executable in ("/usr/bin/python3", os.path.realpath("/usr/bin/python3"))
    return ("%s needs %s, which this Python cannot import: %s (Python %d.%d). Install it for this interpreter "
            "(Debian: apt-get install %s, which serves /usr/bin/python3)%s" % (
                who, module, sys.executable, sys.version_info[0], sys.version_info[1], package,
                "" if debian else ", or run the tests with /usr/bin/python3 -m pytest"))


try:
    import pytest
except ImportError:  # imported outside pytest, by an interpreter that has none
    raise ModuleNotFoundError(_missing_module("pytest", "python3-pytest"), name="pytest") from None


_PICKLED_WRAPPER = """# Generated by attncheck_pytest: serves {qualname}, pickled with cloudpickle in {pickle}, to attncheck.
# The pickle holds the function as the test run that wrote it had it; rerun the test after changing it.
import pickle
import sys

sys.path[:0] = [p for p in {path!r} if p not in sys.path]  # the test process's, for what it pickled by reference
with open({pickle!r}, "rb") as f:
    fn, kwargs = pickle.load(f)

import attncheck_plugin

if __name__ == "__main__":  # imported, it is the function and its declarations (a reproduction's)
    attncheck_plugin.serve(fn, **kwargs)
"""


_WRAPPER = """# Generated by attncheck_pytest: serves {qualname} from {file} to attncheck.
import importlib.util
import sys


def load(file, qualname):
    sys.path.insert(0, __import__("os").path.dirname(file))
    module_name = "_attncheck_" + __import__("os").path.splitext(__import__("os").path.basename(file))[0]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    fn = module
    for part in qualname.split("."):
        fn = getattr(fn, part)
    return fn


import attncheck_plugin

kwargs = {serve_kwargs!r}
for key, where in {functions!r}.items():  # serve() keywords that are functions (backward=)
    kwargs[key] = load(*where)
fn = load({file!r}, {qualname!r})
if __name__ == "__main__":  # imported, it is the function and its declarations (a reproduction's)
    attncheck_plugin.serve(fn, **kwargs)
"""


# A falsified oracle-agreement as a Python program of its own: the minimal case, the call as attncheck made it, the
# float64 expectation and the derived tolerance of each element.
_REPRO = """\"\"\"Reproduces attncheck's oracle-agreement failure of {qualname} at {dtype} ({nodeid}), with no attncheck:
the minimal case ({case}), called as attncheck called it, against the float64 expectation attncheck's oracle
computed and the tolerance it derived for each element, all kept in {npz_name}. Exits 1 while an element is off by
more than its tolerance, 0 once the function agrees:

    {python} {py}
\"\"\"
import importlib.util
import sys

import numpy as np

sys.path.insert(0, {client_dir!r})  # attncheck_plugin.py: the Python client's conversions, no attncheck binary
import attncheck_plugin as client

# The function and its declarations (framework, device, ...), exactly as the test served them.
spec = importlib.util.spec_from_file_location("_attncheck_served", {wrapper!r})
served = importlib.util.module_from_spec(spec)
spec.loader.exec_module(served)
fn, declared = served.fn, dict(served.kwargs)
for name in declared.pop("features", ()):  # serve(fn, features=(...)): each name declared True
    declared[name] = True

case = np.load({npz!r})
dtype = {dtype!r}
keywords = {keywords!r}
for name in ("key_lengths", "alibi_slopes", "sinks"):
    keywords[name] = case[name] if name in case.files else None
calls = client._framework(declared.get("framework", "numpy"), declared.get("device"))
if calls.check_device():
    sys.exit(calls.check_device())
takes = client._keywords(fn, "fn", [m for m in client.MODIFIER_KEYWORDS if declared.get(m)])
# The values as the wire brings them: float32, float64, float16, and bfloat16 as the float32 that holds it.
host = {{"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.float32}}[dtype]
# The additive bias [B|1, H|1, T_q, T_k], at the call's dtype as q, k and v (its values are exact there).
keywords["bias"] = case["bias"].astype(host) if "bias" in case.files else None
# The per-query temperature [B|1, H|1, T_q], in q's type as the client gives it.
keywords["temperature"] = case["temperature"].astype(host) if "temperature" in case.files else None


def call(q, k, v):
    \"\"\"fn's output and weights (None unless it returns them), rounded to the dtype as the wire carries them.\"\"\"
    (q, k, v), kw = calls.inputs([q.astype(host), k.astype(host), v.astype(host)], keywords, dtype, None)
    result = fn(q, k, v, **{{key: kw[key] for key in takes}})
    out, weights, _, problem = client._unpack_result(result, declared.get("returns_weights", False),
                                                     declared.get("lse", False), "fn", calls.array)
    if problem:
        sys.exit(problem)
    rounded = [None if a is None else client._decode(client._encode(a, dtype), dtype, a.shape).astype(np.float64)
               for a in (out, weights)]
    return rounded[0], rounded[1]


q, k, v = case["q"], case["k"], case["v"]
quantity = {quantity!r}
out, weights = call(q, k, v)
if quantity == "output":
    actual = out
elif weights is not None:
    actual = weights
else:  # the weights read from the output with one-hot values, as attncheck probes a function that returns none
    actual = np.zeros(case["expected"].shape)
    for j in range(k.shape[2]):
        one_hot = np.zeros(v.shape)
        one_hot[:, :, j, 0] = 1
        probed, _ = call(q, k, one_hot)
        actual[:, :, :, j] = probed[:, :, :, 0]
expected, tolerance = case["expected"], case["tolerances"]
off = np.abs(actual - expected)
bad = ~(off <= tolerance)  # NaN is off too
np.set_printoptions(precision=6, linewidth=120)
print("{qualname} at {dtype}, {case}")
print("%s (the function):\\n%s" % (quantity, actual))
print("expected (float64 oracle):\\n%s" % expected)
if bad.any():
    worst = np.unravel_index(np.nanargmax(np.where(bad, np.nan_to_num(off / np.maximum(tolerance, 1e-300), nan=np.inf),
                                                   -1)), bad.shape)
    print("FAILS: %d of %d elements off by more than their tolerance; the worst, %s%s, is %r where %r is expected "
          "(tolerance %g)" % (bad.sum(), bad.size, quantity, list(worst), actual[worst], expected[worst], tolerance[worst]))
    sys.exit(1)
print("agrees: every element within its tolerance")
"""


# Debian's package for each module a test of attention commonly imports (numpy for the client, torch for
# kernels), for the hint on a collection error.
_DEBIAN_PACKAGES = {"numpy": "python3-numpy", "torch": "python3-torch", "pytest": "python3-pytest"}
_GTEST_SHARDING = ("GTEST_TOTAL_SHARDS", "GTEST_SHARD_INDEX", "GTEST_SHARD_STATUS_FILE")
_OUTCOMES = pytest.StashKey()  # item.stash: the text of each check() this test made
_GITIGNORE = "# Created by attncheck_pytest: its wrappers, latest reports and failing cases (corpus/).\n*\n"


def pytest_addoption(parser):
    group = parser.getgroup("attncheck", "attncheck: laws of scaled causal attention")
    group.addoption("--attncheck-cases", type=int, default=None, help="cases per law (default: attncheck's 100)")
    group.addoption("--attncheck-seed", type=int, default=None, help="RapidCheck seed (default: attncheck's 1)")
    group.addoption("--attncheck-timeout", type=float, default=None,
                    help="seconds one call of the function may take (default: attncheck's)")
    group.addoption("--attncheck-bin", default=None,
                    help="the attncheck command (default: $ATTNCHECK, else attncheck on PATH)")
    group.addoption("--attncheck-progress", choices=("auto", "yes", "no"), default="auto",
                    help="show attncheck's progress (the law, the cases done, the time left) on the test's line "
                         "while a check runs (default auto: when the terminal is one)")
    group.addoption("--attncheck-dir", default=None,
                    help="where failing cases are kept and replayed first on the next run, with the wrappers "
                         "and latest reports (default: .attncheck in the rootdir)")


def pytest_configure(config):
    config.pluginmanager.register(_Summary(config), "attncheck-summary")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each check()'s outcome becomes the report section "attncheck" (shown with a failure, with -rP for a
    pass, and carried to the terminal summary, through xdist too), as Hypothesis adds its own."""
    outcome = yield
    report = outcome.get_result()
    texts = item.stash.get(_OUTCOMES, None)
    if report.when == "call" and texts:
        report.sections.append(("attncheck", "\n".join(texts)))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A test module that cannot import numpy or torch: say which interpreter ran and what to install."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    found = re.search(r"No module named '([A-Za-z0-9_]+)", str(report.longrepr))
    if found and found.group(1) in _DEBIAN_PACKAGES:
        module = found.group(1)
        report.sections.append(("attncheck", _missing_module(module, _DEBIAN_PACKAGES[module], "this test")))


class _Summary:
    """The terminal summary section: what each test's check() calls found, law by law."""

    def __init__(self, config):
        self._config = config
        self._outcomes = []  # (nodeid, outcome, text)

    def pytest_runtest_logreport(self, report):
        if report.when != "call":
            return
        for name, content in report.sections:
            if name == "attncheck":
                self._outcomes.append((report.nodeid, report.outcome, content))

    def pytest_terminal_summary(self, terminalreporter):
        if not self._outcomes:
            return
        # pytest's convention: a pass is quiet. Without -v, -rP or -rA each check is its count line (the laws that
        # held and those not applicable, with why, are the test's report section, which -rP shows); a failure
        # above already has its whole section.
        details = terminalreporter.verbosity > 0 or any(c in (self._config.option.reportchars or "") for c in "PA")
        terminalreporter.write_sep("=", "attncheck: the laws each test checked" +
                                   ("" if details else " (the laws by name: -v or -rP)"))
        for nodeid, outcome, text in self._outcomes:
            lines = text.splitlines()
            if outcome == "failed" or not details:
                lines = [line for line in lines if not line.startswith(" ")]
            terminalreporter.write_line("%s %s" % (nodeid, outcome.upper()))
            for line in lines:
                terminalreporter.write_line("  " + line)


def _command(config):
    """The absolute path of the attncheck binary, so that printed commands work from any shell."""
    command = config.getoption("--attncheck-bin") or os.environ.get("ATTNCHECK") or "attncheck"
    found = shutil.which(command)
    if not found:
        where = ("--attncheck-bin" if config.getoption("--attncheck-bin")
                 else "$ATTNCHECK" if os.environ.get("ATTNCHECK") else "PATH")
        pytest.fail("attncheck_pytest: cannot find the attncheck command %r (from %s); build it (cmake --build "
                    "build/default: build/default/cli/attncheck) or install it (cmake --install), then put it on "
                    "PATH, or pass --attncheck-bin PATH / set ATTNCHECK=PATH" % (command, where), pytrace=False)
    return os.path.abspath(found)


def _margin(violation):
    magnitude, tolerance = violation.get("magnitude"), violation.get("tolerance")
    if magnitude is None or tolerance is None:
        return None
    # summary.json writes a non-finite number as a string ("nan", "inf"), which JSON cannot hold.
    magnitude, tolerance = float(magnitude), float(tolerance)
    if tolerance:
        return "%.3g against a tolerance of %.3g (%.3g x the tolerance)" % (magnitude, tolerance,
                                                                            magnitude / tolerance)
    return "%.3g where the law is exact" % magnitude


def _qualname(fn):
    """A name for any callable: its qualified name, or a partial's function's with "partial" before it."""
    inner = getattr(fn, "func", None)
    if getattr(fn, "__qualname__", None):
        return fn.__qualname__
    return "partial-" + _qualname(inner) if inner is not None else type(fn).__name__


def _importable(fn):
    """(file, qualname) of a function another process can import by name, or None (a closure, a lambda, a partial,
    a bound method, a callable object: they are pickled instead)."""
    qualname = getattr(fn, "__qualname__", None)
    if not inspect.isfunction(fn) or not qualname or "<" in qualname:
        return None
    try:
        file = inspect.getsourcefile(fn)
    except TypeError:
        return None
    if file is None:
        return None
    module = sys.modules.get(fn.__module__)
    if getattr(module, qualname.split(".")[0], None) is None:
        return None
    return os.path.abspath(file), qualname


def _module_of(fn):
    inner = getattr(fn, "func", None)
    if inner is not None and not hasattr(fn, "__module__"):
        return _module_of(inner)
    name = getattr(fn, "__module__", None) or getattr(getattr(fn, "__func__", None), "__module__", None)
    return sys.modules.get(name) if name else None


def _findable(name):
    """Whether a fresh interpreter with this one's sys.path finds module `name` (not only sys.modules, which holds
    a test module pytest imported from a path that is on no sys.path with --import-mode=importlib)."""
    import importlib.machinery
    top = name.split(".")[0]
    return top in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(top, sys.path) is not None


def _pickle(fn, serve_kwargs, path):
    """Writes (fn, serve_kwargs) to `path` with cloudpickle. The modules of fn and of the functions among the
    keywords are pickled by value when a fresh interpreter could not import them (a test module, typically), else by
    reference, as cloudpickle does for installed packages (torch, numpy)."""
    try:
        import cloudpickle
    except ImportError:
        pytest.fail(_missing_module("cloudpickle", "python3-cloudpickle") + "; it is needed to serve %s, which is "
                    "not a function at the top level of a module (a closure, lambda, partial or method); a top-level "
                    "function needs no cloudpickle" % _qualname(fn), pytrace=False)
    by_value = []
    for f in [fn] + [v for v in serve_kwargs.values() if callable(v)]:
        module = _module_of(f)
        if module is not None and module.__name__ != "__main__" and module not in by_value \
                and not _findable(module.__name__):
            by_value.append(module)
    for module in by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        data = cloudpickle.dumps((fn, serve_kwargs))
    except Exception as e:
        pytest.fail("attncheck.check: cannot pickle %s for the server process (cloudpickle: %s: %s); define it at the "
                    "top level of a module, or keep what it captures picklable" % (_qualname(fn), type(e).__name__, e),
                    pytrace=False)
    finally:
        for module in by_value:
            cloudpickle.unregister_pickle_by_value(module)
    with open(path, "wb") as f:
        f.write(data)


def _shape(shape):
    s = "B=%d H=%d T=%d D=%d" % (shape["B"], shape["H"], shape["T"], shape["D"])
    if "T_k" in shape and shape["T_k"] != shape["T"]:
        s += " T_k=%d" % shape["T_k"]
    if "H_kv" in shape and shape["H_kv"] != shape["H"]:
        s += " H_kv=%d" % shape["H_kv"]  # grouped-query heads (serve(..., gqa=True))
    return s


def _number(x):
    return "%g" % float(x)  # summary and case JSON write a non-finite number as a string ("-inf")


def _case_keywords(problem):
    """Every keyword of the minimal case's call that is not its default, named as the function receives it
    (scale=, window=, key_lengths=, ...): the parameter that matters is often one of these, not the shape."""
    out = []
    if problem.get("scale") is not None:
        out.append("scale=" + _number(problem["scale"]))
    for key in ("key_lengths", "window", "prefix_length", "window_right", "chunk_size"):
        if problem.get(key) is not None and not (key in ("prefix_length", "chunk_size") and problem[key] == 0):
            out.append("%s=%s" % (key, json.dumps(problem[key]).replace(" ", "")))
    if problem.get("softcap") is not None:
        out.append("softcap=" + _number(problem["softcap"]))
    for key in ("alibi_slopes", "sinks"):
        if problem.get(key):
            out.append("%s=[%s]" % (key, ",".join(_number(x) for x in problem[key])))
    if problem.get("causal") is False:
        out.append("causal=False")
    if problem.get("doc_bounds"):
        out.append("documents (key bounds)=%s" % json.dumps(problem["doc_bounds"]).replace(" ", ""))
    if problem.get("q_doc_bounds"):
        out.append("documents (query bounds)=%s" % json.dumps(problem["q_doc_bounds"]).replace(" ", ""))
    for key in ("block_mask", "dense_mask", "bias", "temperature", "rope", "qk_norm"):
        if problem.get(key):
            out.append(key)
    if problem.get("dropout"):
        d = problem["dropout"]
        out.append("dropout (p=%s, seed=%s, offset=%s)" % (_number(d["p"]), d["seed"], d["offset"]))
    if problem.get("paged"):
        out.append("paged (page_size=%s, %s)" % (problem["paged"].get("page_size"), problem["paged"].get("layout")))
    if problem.get("layout"):
        out.append("layout=" + problem["layout"])
    return out


def _raised(stats):
    """{dtype: (calls, {message: (count, traceback)})} from the server's call counts (attncheck_plugin's $ATTNCHECK_
    PYTHON_STATS, a JSON line per server process: attncheck restarts one after a crash or a hang)."""
    out = {}
    try:
        with open(stats) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        for dtype, calls in doc.get("calls", {}).items():
            total, errors = out.get(dtype, (0, {}))
            for message, (count, text) in doc.get("failed", {}).get(dtype, {}).items():
                errors[message] = (errors.get(message, (0, text))[0] + count, errors.get(message, (0, text))[1])
            out[dtype] = (total + calls, errors)
    return out


def _json_array(doc):
    """A report's tensor ({"shape", "values"}, non-finite numbers written as strings) as a float64 array."""
    import numpy as np
    return np.array(doc["values"], dtype=object).astype(np.float64).reshape(doc["shape"])


# What a standalone reproduction does not rebuild from a report's case (the client builds them from the wire).
_NOT_REPRODUCED = ("paged", "doc_bounds", "q_doc_bounds", "block_mask", "dense_mask", "layout", "rope", "qk_norm",
                   "dropout")


def _write_reproduction(law, dtype, detail, impl, qualname, nodeid):
    """For a falsified oracle-agreement: <folder>/repro/<key>/oracle-agreement-<dtype>.py beside its .npz, or None
    (another law, or a case whose features the reproduction does not rebuild)."""
    import numpy as np
    violation, case = detail.get("violation") or {}, detail.get("case") or {}
    problem = case.get("problem") or {}
    if law != "oracle-agreement" or not problem or violation.get("quantity") not in ("output", "weights") \
            or "expected" not in violation or "tolerances" not in violation \
            or any(problem.get(key) for key in _NOT_REPRODUCED):
        return None
    wrapper = impl.split()[-1].strip("'")
    folder = os.path.join(os.path.dirname(os.path.dirname(wrapper)), "repro",
                          os.path.splitext(os.path.basename(wrapper))[0])
    os.makedirs(folder, exist_ok=True)
    base = os.path.join(folder, "%s-%s" % (law, dtype))
    arrays = {"q": _json_array(problem["q"]), "k": _json_array(problem["k"]), "v": _json_array(problem["v"]),
              "expected": _json_array(violation["expected"]), "tolerances": _json_array(violation["tolerances"])}
    if problem.get("key_lengths"):
        arrays["key_lengths"] = np.array(problem["key_lengths"], dtype=np.int64)
    for key in ("alibi_slopes", "sinks"):
        if problem.get(key):
            arrays[key] = np.array([float(x) for x in problem[key]], dtype=np.float64)
    if problem.get("bias"):  # {"B", "H", "values": its B·H·T_q rows of T_k}: the call's bias, which the case needs
        bias = problem["bias"]
        arrays["bias"] = np.array(bias["values"], dtype=object).astype(np.float64).reshape(
            bias["B"], bias["H"], arrays["q"].shape[2], arrays["k"].shape[2])
    if problem.get("temperature"):  # {"B", "H", "values": its B·H rows of T_q}: the call's temperature
        t = problem["temperature"]
        arrays["temperature"] = np.array(t["values"], dtype=object).astype(np.float64).reshape(
            t["B"], t["H"], arrays["q"].shape[2])
    np.savez(base + ".npz", **arrays)
    keywords = {"scale": None if problem.get("scale") is None else float(problem["scale"]),
                "alignment": problem.get("alignment", "top-left"), "dtype": dtype, "window": problem.get("window"),
                "softcap": None if problem.get("softcap") is None else float(problem["softcap"]),
                "causal": problem.get("causal", True), "paged": None, "prefix_length": problem.get("prefix_length", 0),
                "window_right": problem.get("window_right"), "chunk_size": problem.get("chunk_size", 0),
                "q_doc_ids": None, "k_doc_ids": None, "block_mask": None, "dense_mask": None, "bias": None,
                "temperature": None, "rope": None, "qk_norm": None, "dropout": None}
    with open(base + ".py", "w") as f:
        f.write(_REPRO.format(qualname=qualname, dtype=dtype, nodeid=nodeid, case=_minimal_case(detail.get("shape"), problem),
                              npz_name=os.path.basename(base + ".npz"), python=sys.executable, py=base + ".py",
                              client_dir=os.path.dirname(os.path.abspath(_client_file())), wrapper=wrapper,
                              npz=base + ".npz", keywords=keywords, quantity=violation["quantity"]))
    return base + ".py"


def _words(text):
    """attncheck's text in the words of serve() (attncheck_plugin.python_words): "(sinks=True)", not a C name."""
    import attncheck_plugin
    return attncheck_plugin.python_words(text) if text else text


def _client_file():
    import attncheck_plugin
    return attncheck_plugin.__file__


def _calls(n):
    return "the one call" if n == 1 else "every one of the %d calls" % n


def _every_call_raised(qualname, dtype, calls, errors):
    """The one error for a dtype at which the function never returned: no law was checked there, so no law is said
    to be falsified; the exception (the most frequent, with its traceback) is the finding."""
    message, (count, text) = max(errors.items(), key=lambda item: item[1][0])
    lines = ["ERROR at %s: %s of %s raised, so no law could be checked at %s: %s" % (
        dtype, _calls(calls), qualname, dtype, message.splitlines()[0])]
    if len(errors) > 1:
        lines.append("  (%d other exceptions as well: %s)" % (len(errors) - 1, "; ".join(
            m.splitlines()[0][:120] for m in errors if m != message)))
    lines.append("  its traceback:")
    lines += ["    " + line for line in text.rstrip().splitlines()]
    return "\n".join(lines)


def _minimal_case(shape, problem):
    """The minimal case's line: its shape, the alignment when T_q != T_k, and every keyword that is not its default."""
    words = [_shape(shape)] if shape else []
    if shape and shape.get("T_k", shape["T"]) != shape["T"] and problem.get("alignment"):
        words.append("alignment=" + problem["alignment"])  # the causal rule of T_q != T_k
    return " ".join(words + _case_keywords(problem))


def _key(nodeid, qualname):
    """A file name for one (test, function): readable, and unique through a hash of the whole."""
    readable = re.sub(r"[^A-Za-z0-9_.]+", "-", "%s-%s" % (nodeid.split("::")[-1], qualname)).strip("-.")[:48]
    return "%s-%s" % (readable, hashlib.sha1(("%s\0%s" % (nodeid, qualname)).encode()).hexdigest()[:10])


def _stable_folder(config):
    """The folder kept across sessions (created with a .gitignore, as pytest's own cache is)."""
    folder = config.getoption("--attncheck-dir") or os.path.join(str(config.rootpath), ".attncheck")
    folder = os.path.abspath(folder)
    os.makedirs(folder, exist_ok=True)
    gitignore = os.path.join(folder, ".gitignore")
    if not os.path.exists(gitignore):
        with open(gitignore, "w") as f:
            f.write(_GITIGNORE)
    return folder


def _corpus_entry(corpus, law, dtype, case):
    """The corpus file attncheck keeps for this failing case (<corpus>/<impl>/<law>-<hash>.json), or None."""
    for root, _, files in os.walk(corpus):
        for name in sorted(files):
            if not (name.startswith(law + "-") and name.endswith(".json")):
                continue
            path = os.path.join(root, name)
            try:
                with open(path) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            if doc.get("law") == law and doc.get("dtype") == dtype and doc.get("case") == case:
                return path
    return None


def _replayed_from_corpus(stdout, law):
    """Whether attncheck's table says this law was falsified by a stored case ("(corpus)" on its row)."""
    return any(line.split()[:1] == [law] and "(corpus)" in line for line in stdout.splitlines())


class AttncheckFixture:
    """What the `attncheck` fixture gives a test: check(fn, ...)."""

    def __init__(self, config, item):
        self._config = config
        self._item = item

    def check(self, fn, dtypes=("float32",), laws=None, cases=None, seed=None, timeout=None, **serve_kwargs):
        """Runs the laws (all, or those named in `laws`) on `fn` at each of `dtypes`; fails the test with every
        falsified law. `serve_kwargs` go to attncheck_plugin.serve (framework, device, features, returns_weights, alignments, max_T,
        nonfinite_safe, gqa, key_lengths, window, backward, empty_rows, lse, sinks, softcap, alibi, bidirectional,
        paged, page_sizes, page_layouts, documents, query_documents, chunked_local, prefix, right_window,
        block_mask, dense_mask, ...); `cases`, `seed`, `timeout` override the --attncheck-* options."""
        try:
            numpy = importlib.util.find_spec("numpy")
        except ImportError:
            numpy = None
        if numpy is None:  # the serving process is this interpreter too
            pytest.fail(_missing_module("numpy", "python3-numpy"), pytrace=False)
        qualname = _qualname(fn)
        serve_kwargs.setdefault("name", getattr(fn, "__name__", None) or qualname)
        serve_kwargs["dtypes"] = tuple(dtypes)
        binary = _command(self._config)
        # Everything lives in the stable folder, under a key of (test, function): the wrapper's path makes the
        # implementation's name, so it must not change between sessions for the corpus to be found again.
        folder = _stable_folder(self._config)
        key = _key(self._item.nodeid, qualname)
        wrapper = os.path.join(folder, "serve", key + ".py")
        corpus = os.path.join(folder, "corpus", key)
        os.makedirs(os.path.dirname(wrapper), exist_ok=True)
        where = _importable(fn)
        # Functions among the keywords (backward=) cross to the serving process the same way as fn.
        functions = {k: _importable(v) for k, v in serve_kwargs.items() if callable(v)}
        if where is None or None in functions.values():
            pickle = os.path.join(folder, "serve", key + ".pkl")
            _pickle(fn, serve_kwargs, pickle)
            text = _PICKLED_WRAPPER.format(qualname=qualname, pickle=pickle, path=[p for p in sys.path if p])
        else:
            for k in functions:
                del serve_kwargs[k]
            text = _WRAPPER.format(qualname=where[1], file=where[0], serve_kwargs=serve_kwargs, functions=functions)
        with open(wrapper, "w") as f:
            f.write(text)
        impl = "exec:%s %s" % (shlex.quote(sys.executable), shlex.quote(wrapper))
        cases = cases if cases is not None else self._config.getoption("--attncheck-cases")
        seed = seed if seed is not None else self._config.getoption("--attncheck-seed")
        timeout = timeout if timeout is not None else self._config.getoption("--attncheck-timeout")
        # One run for every dtype: one server process, whose imports (torch's seconds) are paid once. Each dtype's
        # reports go to reports/<key>/<dtype>/.
        reports = os.path.join(folder, "reports", key)
        report_dirs = {dtype: os.path.join(reports, dtype) for dtype in dtypes}
        argv = [binary, "check", "--impl", impl, "--dtype", ",".join(dtypes), "--force", "--corpus", corpus,
                "--report-dir", reports if len(dtypes) > 1 else report_dirs[dtypes[0]]]
        if cases is not None:
            argv += ["--cases", str(cases)]
        if seed is not None:
            argv += ["--seed", str(seed)]
        if timeout is not None:
            argv += ["--timeout", str(timeout)]
        for law in laws or ():
            argv += ["--property", law]
        # GoogleTest's sharding variables (Bazel sets them for a sharded test) are pytest's business here, not
        # attncheck's: a fixture's check runs every law it was asked for.
        env = {k: v for k, v in os.environ.items() if k not in _GTEST_SHARDING}
        # What the function raised (counted by the server), and what it printed: the server writes both here.
        stats = os.path.join(folder, "serve", key + ".calls.jsonl")
        output = os.path.join(folder, "serve", key + ".out")
        for path in (stats, output):
            if os.path.exists(path):
                os.remove(path)
        env["ATTNCHECK_PYTHON_STATS"], env["ATTNCHECK_PYTHON_OUTPUT"] = stats, output
        run = _Progress(self._config).run(argv, env)
        # The function's own output (its prints, its tracebacks, each distinct one once), then attncheck's: the
        # test's captured stderr, which pytest shows with a failure (and with -rP), as it does the test's own.
        if os.path.exists(output):
            with open(output, errors="replace") as f:
                sys.stderr.write(f.read())
        sys.stderr.write(run.stderr)
        if run.returncode not in (0, 1):
            pytest.fail("attncheck exited with %d (%s):\n%s%s" % (
                run.returncode, {2: "usage or configuration error", 4: "incomplete: a law was not checked",
                                 130: "interrupted"}.get(run.returncode, "internal error"),
                run.stderr, run.stdout), pytrace=False)
        raised = _raised(stats)
        failures = []
        for dtype in dtypes:
            with open(os.path.join(report_dirs[dtype], "summary.json")) as f:
                summary = json.load(f)
            calls, errors = raised.get(dtype, (0, {}))
            every_call_raised = calls and sum(count for count, _ in errors.values()) == calls
            self._record(qualname, dtype, summary, run.stdout, report_dirs[dtype], calls if every_call_raised else 0)
            if every_call_raised:
                failures.append(_every_call_raised(qualname, dtype, calls, errors))
            elif any(law["status"] == "falsified" for law in summary["laws"]):
                failures += self._falsified(summary, run.stdout, report_dirs[dtype], dtype, binary, impl, corpus,
                                            errors, qualname, self._item.nodeid)
        if failures:
            errored = sum(f.startswith("ERROR") for f in failures)
            pytest.fail("attncheck: %s by %s (the failing cases are kept in %s and replayed first on the next run)\n%s"
                        % (", ".join(what for what in (
                            "%d law%s falsified" % (len(failures) - errored, "" if len(failures) - errored == 1 else "s")
                            if len(failures) > errored else "",
                            "every call raised at %d dtype%s" % (errored, "" if errored == 1 else "s") if errored else "")
                            if what), qualname, corpus, "\n".join(failures)), pytrace=False)

    def _record(self, qualname, dtype, summary, stdout, report_dir, every_call_raised=0):
        """What this run found, law by law: the report section, the terminal summary and a user property. When
        every one of its calls raised (`every_call_raised` calls), no law was checked: so it says, and no more."""
        if every_call_raised:
            lines = ["%s at %s: ERROR, %s raised: no law was checked" % (
                qualname, dtype, _calls(every_call_raised)), "  reports: " + report_dir]
            self._item.stash.setdefault(_OUTCOMES, []).append("\n".join(lines))
            self._item.user_properties.append(("attncheck %s %s" % (qualname, dtype), lines[0]))
            return
        # summary.json's statuses, in the order and words they are said here
        words = {"held": "held", "n/a": "not applicable", "falsified": "falsified", "not checked": "not checked"}
        by_status = {status: [] for status in words}
        for law in summary["laws"]:
            by_status.setdefault(law["status"], []).append(law)
        counts = ", ".join("%d %s" % (len(laws), words.get(status, status))
                           for status, laws in by_status.items() if laws)
        generator = summary["generator"]
        cases = generator["cases"]
        if generator.get("law_calls") and cases > generator.get("first_cases", cases):
            cases = "up to %d" % cases  # a law whose cases make several calls checks fewer (--law-calls)
        lines = ["%s at %s (seed %s, %s cases per law): %s" % (qualname, dtype, summary["seed"], cases, counts)]
        if by_status["held"]:
            lines.append("  held: " + ", ".join(law["law"] for law in by_status["held"]))
            lines += ["    %s: %s" % (law["law"], _words(law["note"])) for law in by_status["held"] if law.get("note")]
        if by_status["n/a"]:
            lines.append("  not applicable:")
            reasons = {}  # laws that are n/a for the same reason share a line (the five gradient laws, often)
            for law in by_status["n/a"]:
                reasons.setdefault(_words(law.get("note")) or "(no reason given)", []).append(law["law"])
            lines += ["    %s: %s" % (", ".join(names), why) for why, names in reasons.items()]
        if by_status["falsified"]:
            lines.append("  falsified: " + ", ".join(
                law["law"] + (" (the stored case, replayed first)" if _replayed_from_corpus(stdout, law["law"]) else "")
                for law in by_status["falsified"]))
        lines.append("  reports: " + report_dir)
        text = "\n".join(lines)
        self._item.stash.setdefault(_OUTCOMES, []).append(text)
        self._item.user_properties.append(("attncheck %s %s" % (qualname, dtype), "\n".join(lines[1:])))

    @staticmethod
    def _falsified(summary, stdout, report_dir, dtype, binary, impl, corpus, errors, qualname, nodeid):
        out = []
        shown = set()  # each traceback once, under the first law it explains
        for law in summary["laws"]:
            if law["status"] != "falsified":
                continue
            name = law["law"]
            lines = ["%s (%s): %s" % (name, dtype, _words(law.get("message", "falsified")))]
            report = os.path.join(report_dir, law["report_json"]) if "report_json" in law else None
            detail = None
            if report and os.path.exists(report):
                with open(report) as f:
                    detail = json.load(f)
                problem = (detail.get("case") or {}).get("problem") or {}
                lines.append("  minimal case: %s" % _minimal_case(detail["shape"], problem))
                margin = _margin(detail.get("violation") or {})
                if margin:
                    lines.append("  margin: %s" % margin)
            entry = _corpus_entry(corpus, name, dtype, detail.get("case")) if detail and detail.get("case") else None
            if entry and _replayed_from_corpus(stdout, name):
                lines.append("  found again by the stored case, replayed before any new one")
            if "report_md" in law:
                lines.append("  report: %s" % os.path.join(report_dir, law["report_md"]))
            # The function raised in this law's failing call: its traceback, as the server printed it first.
            for message, (count, text) in errors.items():
                if message.splitlines()[0] in law.get("message", "") and message not in shown:
                    shown.add(message)
                    lines.append("  the function raised it (%d call%s); its traceback:" % (count, "" if count == 1 else "s"))
                    lines += ["    " + line for line in text.rstrip().splitlines()]
            # attncheck's own replay_command names a bare `attncheck`: rebuilt with the binary that ran.
            repro = _write_reproduction(name, dtype, detail, impl, qualname, nodeid) if detail else None
            if repro:
                lines.append("  reproduce in Python (no attncheck): %s %s" % (shlex.quote(sys.executable),
                                                                          shlex.quote(repro)))
            replay_file = entry or (report if detail and detail.get("case") else None)
            if replay_file:
                lines.append("  replay: %s check --impl %s --replay %s" % (
                    shlex.quote(binary), shlex.quote(impl), shlex.quote(replay_file)))
            out.append("\n".join(lines))
        return out


@pytest.fixture
def attncheck(request):
    """Checks Python attention functions against attncheck's laws: attncheck.check(fn, dtypes=...)."""
    _command(request.config)  # a missing attncheck command is the test's set-up failing (an ERROR), not a finding
    return AttncheckFixture(request.config, request.node)
