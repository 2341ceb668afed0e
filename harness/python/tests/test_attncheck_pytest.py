"""The pytest plugin itself, through pytester: a test using the `attncheck` fixture passes on a correct numpy
function and fails on a buggy one with the law, the minimal case, the margin, the report and the replay
command in its message; --attncheck-cases and --attncheck-seed reach attncheck. What each test checked is in
its outcome (report section, terminal summary, junit property); failing cases are kept in .attncheck/ and
replayed first; the printed replay command runs from a shell as printed; a missing module says which
interpreter ran and what to install."""
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]

FUNCTIONS = '''
import numpy as np


def correct(q, k, v, scale=None):
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    s = np.where(np.tril(np.ones((T_q, T_k), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def no_mask(q, k, v, scale=None):
    """The bug: every query sees every key, the future included."""
    D = q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def window_ignored(q, k, v, scale=None, window=None, **ignored):
    """The bug: declares a sliding window and attends causally without it."""
    return correct(q, k, v, scale)


def biased(q, k, v, scale=None, bias=None):
    """Correct with an additive bias [B|1, H|1, T_q, T_k] added to the scaled scores."""
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    if bias is not None:
        s = s + bias.astype(np.float64)
    s = np.where(np.tril(np.ones((T_q, T_k), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def bias_ignored(q, k, v, scale=None, bias=None):
    """The bug: declares an additive bias and attends without it."""
    return correct(q, k, v, scale)


def zero_backward(q, k, v, d_output, scale=None):
    """The bug: no gradient at all."""
    return np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)


def tempered(q, k, v, scale=None, temperature=None):
    """Correct with a per-query temperature [B|1, H|1, T_q] dividing each query's scaled scores."""
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    if temperature is not None:
        s = s / temperature.astype(np.float64)[..., None]
    s = np.where(np.tril(np.ones((T_q, T_k), dtype=bool)), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def temperature_ignored(q, k, v, scale=None, temperature=None):
    """The bug: declares a temperature and attends without it."""
    return correct(q, k, v, scale)
'''

TESTS = '''
from kernels import bias_ignored, correct, no_mask, temperature_ignored, window_ignored, zero_backward


def test_correct(attncheck):
    attncheck.check(correct, dtypes=("float64",))


def test_no_mask(attncheck, tmp_path):  # tmp_path: so that pytest's temporary folder exists, to be deleted
    attncheck.check(no_mask, dtypes=("float64",), laws=("causal-perturbation", "row-stochastic"))


def test_unmasked_oracle(attncheck):
    attncheck.check(no_mask, dtypes=("float64",), laws=("oracle-agreement",))


def test_window_ignored(attncheck):
    attncheck.check(window_ignored, dtypes=("float64",), laws=("oracle-agreement",), window=True)


def test_bias_ignored_oracle(attncheck):
    attncheck.check(bias_ignored, dtypes=("float64",), laws=("oracle-agreement",), bias=True)


def test_temperature_ignored_oracle(attncheck):
    attncheck.check(temperature_ignored, dtypes=("float64",), laws=("oracle-agreement",), temperature=True)


def test_zero_backward(attncheck):
    attncheck.check(correct, dtypes=("float64",), laws=("grad-oracle",), backward=zero_backward)
'''


def attncheck_binary():
    """The attncheck the plugin runs when given no --attncheck-bin, as an absolute path."""
    return os.path.abspath(shutil.which(os.environ.get("ATTNCHECK") or "attncheck"))


def run(pytester, *args):
    pytester.makepyfile(kernels=FUNCTIONS, test_kernels=TESTS)
    return pytester.runpytest_subprocess("-p", "attncheck_pytest", *args)


def test_passes_on_a_correct_function_and_fails_on_a_buggy_one_with_the_minimal_case(pytester):
    result = run(pytester, "--attncheck-cases", "30", "-k", "not backward and not window and not oracle")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by no_mask" in text
    # The law, its message, the minimal case (a future key needs T_k >= 2), the margin, report and replay.
    assert re.search(r"causal-perturbation \(float64\): causal-perturbation: ", text), text
    assert re.search(r"minimal case: B=1 H=1 T=[12] D=1( T_k=2 alignment=(top-left|bottom-right))?\n", text), text
    assert re.search(r"margin: \S+ (against a tolerance of|where the law is exact)", text), text
    assert re.search(r"report: \S+causal-perturbation\.md", text), text
    # The replay command names the binary that ran (absolute path) and the case kept in the rootdir's .attncheck.
    binary = attncheck_binary()
    assert re.search(r"replay: %s check --impl '?exec:.* --replay %s\S+causal-perturbation-[0-9a-f]{12}\.json"
                     % (re.escape(binary), re.escape(str(pytester.path / ".attncheck" / "corpus"))), text), text


def test_the_minimal_case_line_names_the_keyword_that_matters(pytester):
    result = run(pytester, "--attncheck-cases", "30", "-k", "window_ignored")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    # The shape alone (B=1 H=1 T=2 D=1) would hide the cause: the window, as the function receives it.
    assert re.search(r"minimal case: B=1 H=1 T=\d+ D=1( T_k=\d+ alignment=\S+)? window=\d+\n", text), text


def test_cases_and_seed_reach_attncheck_and_a_pass_is_quiet(pytester):
    result = run(pytester, "--attncheck-cases", "3", "--attncheck-seed", "7", "-k", "correct")
    result.assert_outcomes(passed=1)
    # Without -v or -rP a pass says its count line, not the laws by name.
    text = result.stdout.str()
    assert re.search(r"\n  correct at float64 \(seed 7, 3 cases per law\): \d+ held, \d+ not applicable", text), text
    assert "held: " not in text and "not applicable:" not in text, text
    summaries = list((pytester.path / ".attncheck").rglob("summary.json"))
    assert len(summaries) == 1, summaries
    with open(summaries[0]) as f:
        summary = json.load(f)
    assert summary["seed"] == 7
    assert summary["generator"]["cases"] == 3


def test_a_missing_attncheck_command_is_one_error_at_set_up_not_a_failed_test(pytester):
    result = run(pytester, "--attncheck-bin", str(pytester.path / "no-such-attncheck"), "-k", "correct")
    result.assert_outcomes(errors=1)
    assert "cannot find the attncheck command" in result.stdout.str(), result.stdout.str()


def test_googletest_sharding_variables_do_not_shard_the_fixtures_check(pytester, monkeypatch):
    # Bazel sets these for a sharded test target; they are pytest's to act on, and attncheck's check inside the
    # fixture still runs every law (unsharded, it would have checked every 4th law and said nothing).
    monkeypatch.setenv("GTEST_TOTAL_SHARDS", "4")
    monkeypatch.setenv("GTEST_SHARD_INDEX", "3")
    result = run(pytester, "--attncheck-cases", "2", "-k", "correct")
    result.assert_outcomes(passed=1)
    summaries = list((pytester.path / ".attncheck").rglob("summary.json"))
    assert len(summaries) == 1, summaries
    with open(summaries[0]) as f:
        summary = json.load(f)
    assert "shard" not in summary, summary
    listed = subprocess.run([attncheck_binary(), "list"], capture_output=True, text=True, check=True).stdout
    laws = [line.split()[0] for line in listed.splitlines() if line.split()[1:2] == ["law"]]
    assert [law["law"] for law in summary["laws"]] == laws, summary["laws"]


def test_a_backward_function_crosses_as_a_keyword_and_its_gradients_are_checked(pytester):
    result = run(pytester, "--attncheck-cases", "10", "-k", "backward")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by correct" in text, text
    assert re.search(r"grad-oracle \(float64\): grad-oracle: d[qkv]\S* is 0 but should be ", text), text


def summary_of(pytester):
    """The laws of the single summary.json the plugin's run left in .attncheck (attncheck's own record)."""
    summaries = list((pytester.path / ".attncheck").rglob("summary.json"))
    assert len(summaries) == 1, summaries
    with open(summaries[0]) as f:
        return json.load(f)["laws"]


def test_a_passing_test_lists_the_laws_that_held_and_those_not_applicable_with_why(pytester):
    result = run(pytester, "--attncheck-cases", "3", "-k", "correct", "-rP",
                 "--junitxml=%s" % (pytester.path / "junit.xml"))
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    laws = summary_of(pytester)
    held = [law["law"] for law in laws if law["status"] == "held"]
    na = [law for law in laws if law["status"] == "n/a"]
    assert held and na, laws  # the correct numpy function declares no GQA, padding or backward: some are n/a
    # The terminal summary section: every law that held by name, every n/a law with attncheck's reason.
    summary = text[text.index("attncheck: the laws each test checked"):]
    assert "test_kernels.py::test_correct PASSED" in summary, summary
    assert "correct at float64 (seed 1, 3 cases per law): %d held, %d not applicable" % (len(held), len(na)) in summary
    assert "held: " + ", ".join(held) + "\n" in summary, summary
    # Laws n/a for the same reason share a line: "    law, law: why".
    block = summary[summary.index("  not applicable:\n"):].split("\n")[1:]
    listed = {}
    for line in block[:next(n for n, line in enumerate(block) if not line.startswith("      "))]:
        names, why = line.strip().split(": ", 1)
        listed.update({name: why for name in names.split(", ")})
    # ... in the words of serve(), the interface the function came through: "(key_lengths=True)", not the C names.
    import attncheck_plugin
    assert listed == {law["law"]: attncheck_plugin.python_words(law["note"]) for law in na}, summary
    assert "ATTNCHECK_CAP" not in summary and "Capabilities::" not in summary, summary
    assert "(key_lengths=True)" in summary and "(alibi=True, sinks=True)" in summary, summary
    # The same text is the test's report section "attncheck" (-rP shows it for a pass) ...
    assert re.search(r"-+ attncheck -+\ncorrect at float64 ", text), text
    # ... and a junit property, for CI dashboards.
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "junit.xml").iter("property")}
    assert "held: " + ", ".join(held) in props["attncheck correct float64"], props
    assert "%s: %s" % (na[-1]["law"], attncheck_plugin.python_words(na[-1]["note"])) in props["attncheck correct float64"], props


def test_quiet_keeps_one_line_per_check(pytester):
    result = run(pytester, "--attncheck-cases", "3", "-k", "correct", "-q")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    assert re.search(r"correct at float64 \(seed 1, 3 cases per law\): \d+ held, \d+ not applicable", text), text
    assert "held: " not in text, text


def test_a_failing_case_is_kept_in_the_rootdir_and_replayed_first_on_the_next_run(pytester):
    first = run(pytester, "--attncheck-cases", "30", "-k", "no_mask")
    first.assert_outcomes(failed=1)
    kept = sorted((pytester.path / ".attncheck" / "corpus").rglob("causal-perturbation-*.json"))
    assert len(kept) == 1, kept
    assert "the failing cases are kept in %s and replayed first on the next run" % kept[0].parent.parent \
        in first.stdout.str(), first.stdout.str()
    assert "--replay %s\n" % kept[0] in first.stdout.str(), first.stdout.str()
    assert "found again by the stored case" not in first.stdout.str(), first.stdout.str()
    assert "falsified: causal-perturbation\n" in first.stdout.str(), first.stdout.str()
    # Next session (pytest's tmp_path is another folder by then): the kept case is replayed before any new one.
    second = run(pytester, "--attncheck-cases", "30", "-k", "no_mask")
    second.assert_outcomes(failed=1)
    text = second.stdout.str()
    assert "causal-perturbation (float64): causal-perturbation: " in text, text
    assert "found again by the stored case, replayed before any new one" in text, text
    assert "falsified: causal-perturbation (the stored case, replayed first)" in text, text
    assert sorted((pytester.path / ".attncheck" / "corpus").rglob("causal-perturbation-*.json")) == kept


def test_the_printed_replay_command_runs_from_a_shell_as_printed(pytester, tmp_path):
    # attncheck reached through a folder with a space, not on PATH; pytest's own tmp folder deleted afterwards.
    bin_dir = tmp_path / "my tools"
    bin_dir.mkdir()
    (bin_dir / "attncheck").symlink_to(attncheck_binary())
    basetemp = tmp_path / "basetemp"
    result = run(pytester, "--attncheck-cases", "30", "-k", "no_mask", "--basetemp=%s" % basetemp,
                 "--attncheck-bin=%s" % (bin_dir / "attncheck"))
    result.assert_outcomes(failed=1)
    commands = re.findall(r"^  replay: (.*)$", result.stdout.str(), re.M)
    assert len(commands) == 1, result.stdout.str()  # causal-perturbation (no_mask's rows still sum to 1)
    shutil.rmtree(basetemp)
    env = {key: value for key, value in os.environ.items() if key not in ("ATTNCHECK", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    assert shutil.which("attncheck", path=env["PATH"]) is None
    for command in commands:
        assert str(basetemp) not in command and "'%s/attncheck'" % bin_dir in command, command
        replay = subprocess.run(command, shell=True, cwd="/", env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        assert replay.returncode == 1, (command, replay.stdout)
        assert "falsified again (the same violation as recorded)" in replay.stdout, (command, replay.stdout)


NO_NUMPY = """
import sys


class NoNumpy:
    # As if this interpreter had no numpy: `import numpy` fails as it would then.
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError("No module named 'numpy'", name="numpy")


sys.meta_path.insert(0, NoNumpy())
"""

PURE_TEST = """
from pure import attention


def test_pure(attncheck):
    attncheck.check(attention)
"""


def test_a_missing_numpy_says_which_interpreter_ran_and_what_to_install(pytester):
    pytester.makeconftest(NO_NUMPY)
    pytester.makepyfile(pure="def attention(q, k, v):\n    return v\n", test_pure=PURE_TEST,
                        test_imports_numpy="import numpy\n")
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--continue-on-collection-errors")
    result.assert_outcomes(failed=1, errors=1)
    text = result.stdout.str()
    # The fixture, before it starts attncheck; and a test module that imports numpy, on its collection error.
    assert "attncheck_pytest needs numpy, which this Python cannot import: %s" % sys.executable in text, text
    assert "this test needs numpy, which this Python cannot import: %s" % sys.executable in text, text
    assert text.count("apt-get install python3-numpy") == 2, text


@pytest.fixture
def python_without_site(tmp_path):
    """An interpreter not called python3, without site-packages (-S): no numpy, no pytest."""
    python = tmp_path / "bare-python"
    python.symlink_to(sys.executable)
    return str(python)


CLIENT = """import attncheck_plugin


def attention(q, k, v):
    return v


attncheck_plugin.serve(attention)
"""


def test_the_exec_client_without_numpy_says_which_interpreter_ran_and_what_to_install(python_without_site):
    client = os.path.join(os.path.dirname(python_without_site), "client.py")
    with open(client, "w") as f:
        f.write(CLIENT)
    run = subprocess.run([attncheck_binary(), "check", "--impl", "exec:%s -S %s" % (python_without_site, client),
                          "--no-corpus", "--report-dir", os.path.join(os.path.dirname(python_without_site), "r")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert run.returncode == 2, run.stdout
    assert "attncheck_plugin needs numpy, which this Python cannot import: %s" % python_without_site in run.stdout
    assert "apt-get install python3-numpy" in run.stdout, run.stdout
    assert "or run the client with /usr/bin/python3" in run.stdout, run.stdout


def test_the_plugin_without_pytest_says_which_interpreter_ran_and_what_to_install(python_without_site):
    run = subprocess.run([python_without_site, "-S", "-c", "import attncheck_pytest"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))))
    assert run.returncode == 1, run.stdout
    assert "attncheck_pytest needs pytest, which this Python cannot import: %s" % python_without_site in run.stdout
    assert "apt-get install python3-pytest" in run.stdout, run.stdout


DECLARED = '''
import numpy as np


def only_d4_shorter_queries(q, k, v, scale=None, alignment="top-left"):
    """Correct for D = 4 and T_q <= T_k only (what the test declares); anything else would be a finding."""
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    if D != 4 or T_q > T_k:
        raise ValueError("undeclared call: D = %d, T_q = %d, T_k = %d" % (D, T_q, T_k))
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    shift = T_k - T_q if alignment == "bottom-right" else 0
    s = np.where(np.tril(np.ones((T_q, T_k), dtype=bool), k=shift), s, -np.inf)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def test_declared(attncheck):
    attncheck.check(only_d4_shorter_queries, dtypes=("float64",), alignments=("top-left", "bottom-right"),
                    cross_lengths="T_q<=T_k", head_dims=[4])
'''


def test_the_fixture_passes_protocol_version_3_declarations_through(pytester):
    # Declared head dimensions and cross-length regime reach attncheck: no law calls the function outside them
    # (it raises there), so the test passes; without the declarations it fails.
    pytester.makepyfile(test_declared=DECLARED)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "20", "-rP")
    result.assert_outcomes(passed=1)
    undeclared = DECLARED.replace('cross_lengths="T_q<=T_k", head_dims=[4]', "")
    assert undeclared != DECLARED
    pytester.makepyfile(test_declared=undeclared)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "20")
    result.assert_outcomes(failed=1)
    assert "undeclared call" in result.stdout.str()


MODIFIED = '''
import numpy as np


def modified(q, k, v, scale=None, alignment="top-left", softcap=None, alibi_slopes=None, sinks=None, causal=True):
    """Softcap, ALiBi, sinks, causal or not, in float64; returns (out, lse [B,H,T_q]) for lse=True."""
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    pos = np.arange(T_q)[:, None] + (T_k - T_q if alignment == "bottom-right" else 0)
    j = np.arange(T_k)[None, :]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_slopes[:, None, None] * (j - pos)
    s = np.where(j <= pos if causal else True, s, -np.inf)
    sink = np.broadcast_to((sinks if sinks is not None else np.full(q.shape[1], -np.inf))[None, :, None, None],
                           s.shape[:3] + (1,))
    top = np.maximum(s.max(axis=-1, keepdims=True), sink)
    top = np.where(np.isfinite(top), top, 0)  # a row with no key and no sink: all weights 0, LSE -inf
    e, e_sink = np.exp(s - top), np.exp(sink - top)
    total = e.sum(axis=-1, keepdims=True) + e_sink
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, e / total, 0.0) @ v, np.where(total > 0, top + np.log(total), -np.inf)[..., 0]


def uncapped(q, k, v, scale=None, alignment="top-left", softcap=None):
    """The bug: declares softcapping and ignores it."""
    return modified(q, k, v, scale=scale, alignment=alignment)[0]
'''

MODIFIED_TESTS = '''
from modified import modified, uncapped


def test_modified(attncheck):
    attncheck.check(modified, dtypes=("float64",), alignments=("top-left", "bottom-right"), empty_rows="zero",
                    lse=True, sinks=True, softcap=True, alibi=True, bidirectional=True)


def test_declared_without_its_parameter(attncheck):
    attncheck.check(uncapped, dtypes=("float64",), alibi=True)


def test_ignores_its_softcap(attncheck):
    # softcap-bound sees an ignored cap only in a row that spreads further than the cap allows: it kills this in
    # 3 to 14 cases (seeds 1-12 at the default 100); 40 cases leave room over the run's 10.
    attncheck.check(uncapped, dtypes=("float64",), laws=("softcap-bound",), softcap=True, cases=40)
'''


def test_version_3_modifier_declarations_reach_the_client(pytester):
    # lse=, sinks=, softcap=, alibi=, bidirectional= go through check() to serve(): the wrapper carries them, and
    # serve() checks each against the function's signature (alibi=True needs an `alibi_slopes` parameter).
    pytester.makepyfile(modified=MODIFIED, test_modified=MODIFIED_TESTS)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "10")
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    assert "TypeError: serve: alibi=True but fn uncapped has no `alibi_slopes` parameter" in text, text
    # Declared, the softcap reaches the laws: a function that ignores it is falsified.
    assert "attncheck: 1 law falsified by uncapped" in text, text
    assert re.search(r"softcap-bound \(float64\): softcap-bound: ", text), text
    wrappers = list((pytester.path / ".attncheck" / "serve").glob("test_modified-modified-*.py"))
    assert len(wrappers) == 1, wrappers
    source = wrappers[0].read_text()
    for keyword in ("'lse': True", "'sinks': True", "'softcap': True", "'alibi': True", "'bidirectional': True"):
        assert keyword in source, source


PAGED = '''
import numpy as np


def attend(q, k, v, scale, key_lengths):
    """Causal attention (top-left), key padding, float64."""
    T_q, T_k, D = q.shape[2], k.shape[2], q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    seen = np.broadcast_to(np.tril(np.ones((T_q, T_k), dtype=bool)), (q.shape[0], T_q, T_k))
    if key_lengths is not None:
        seen = seen & (np.arange(T_k)[None, None, :] < key_lengths[:, None, None])
    seen = seen[:, None]
    with np.errstate(all="ignore"):
        s = np.where(seen, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ v


def paged(q, k, v, scale=None, key_lengths=None, paged=None):
    """Reads a paged call's K and V back through the block table."""
    if paged is not None:
        k, v = paged.gather()
    return attend(q, k, v, scale, key_lengths)


def in_order(q, k, v, scale=None, key_lengths=None, paged=None):
    """The bug: takes sequence b's pages to be pages b * max_pages, b * max_pages + 1, ... of the pool, ignoring
    the table."""
    if paged is not None:
        B, ps = q.shape[0], paged.page_size
        dense = []
        for pool in (paged.k_pages, paged.v_pages):
            out = np.zeros((B, pool.shape[2], paged.T_k, pool.shape[3]))
            for b in range(B):
                for t in range(int(paged.seq_lens[b])):
                    out[b, :, t] = pool[(b * paged.max_pages + t // ps) % paged.num_pages, t % ps]
            dense.append(out)
        k, v = dense
    return attend(q, k, v, scale, key_lengths)
'''

PAGED_TESTS = '''
from paged_attention import in_order, paged


def test_paged(attncheck):
    attncheck.check(paged, dtypes=("float64",), laws=("paged-dense", "poisoned-slots", "oracle-agreement"),
                    paged=True, page_sizes=(1, 4), page_layouts=("token-major",))


def test_in_order(attncheck):
    attncheck.check(in_order, dtypes=("float64",), laws=("paged-dense",), paged=True, page_sizes=(1, 4),
                    page_layouts=("token-major",))
'''


def test_paged_declarations_reach_the_client(pytester):
    # paged=, page_sizes=, page_layouts= go through check() to serve(): the paged laws apply, and a function that
    # reads the pools without the block table is falsified.
    pytester.makepyfile(paged_attention=PAGED, test_paged=PAGED_TESTS)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "10", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by in_order" in text, text
    assert re.search(r"paged-dense \(float64\): paged-dense: ", text), text
    assert re.search(r"held: .*paged-dense", text), text
    wrappers = list((pytester.path / ".attncheck" / "serve").glob("test_paged-paged-*.py"))
    assert len(wrappers) == 1, wrappers
    source = wrappers[0].read_text()
    for keyword in ("'paged': True", "'page_sizes': (1, 4)", "'page_layouts': ('token-major',)"):
        assert keyword in source, source


PACKED = '''
import numpy as np


def attend(q, k, v, scale, seen):
    """Attention in float64 over the boolean mask seen [B, T_q, T_k]."""
    D = q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    seen = seen[:, None]
    with np.errstate(all="ignore"):
        s = np.where(seen, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ v


def mask(q, k, causal, q_doc_ids, k_doc_ids, chunk_size, prefix_length, window_right, documents=True):
    """Top-left: query i sits at position i."""
    B, T_q, T_k = q.shape[0], q.shape[2], k.shape[2]
    checks = [(q_doc_ids, (B, T_q)), (k_doc_ids, (B, T_k))]
    for ids, shape in checks:
        assert ids is None or (ids.dtype == np.int32 and ids.shape == shape), (ids, shape)
    assert isinstance(chunk_size, int) and isinstance(prefix_length, int), (chunk_size, prefix_length)
    p, j = np.arange(T_q)[:, None], np.arange(T_k)[None, :]
    seen = np.ones((B, T_q, T_k), dtype=bool)
    if causal:
        seen &= (j <= p) | (j < prefix_length)
    if window_right is not None:
        seen &= j <= p + window_right
    if chunk_size > 0:
        seen &= j // chunk_size == p // chunk_size
    if documents and q_doc_ids is not None:
        seen &= q_doc_ids[:, :, None] == k_doc_ids[:, None, :]
    return seen


def packed(q, k, v, scale=None, causal=True, q_doc_ids=None, k_doc_ids=None, chunk_size=0, prefix_length=0,
           window_right=None):
    return attend(q, k, v, scale, mask(q, k, causal, q_doc_ids, k_doc_ids, chunk_size, prefix_length, window_right))


def one_document(q, k, v, scale=None, causal=True, q_doc_ids=None, k_doc_ids=None, chunk_size=0, prefix_length=0,
                 window_right=None):
    """The bug: attends across document boundaries (the ids ignored)."""
    return attend(q, k, v, scale, mask(q, k, causal, q_doc_ids, k_doc_ids, chunk_size, prefix_length, window_right,
                                       documents=False))
'''

PACKED_TESTS = '''
from packed_attention import one_document, packed

MASKS = dict(documents=True, chunked_local=True, prefix=True, right_window=True, bidirectional=True)


def test_packed(attncheck):
    attncheck.check(packed, dtypes=("float64",), laws=("oracle-agreement", "row-stochastic"), **MASKS)


def test_one_document(attncheck):
    attncheck.check(one_document, dtypes=("float64",), laws=("oracle-agreement",), **MASKS)


def test_aligned_on_the_call(attncheck):
    # Right while a query's document follows from its position; with query bounds of its own a document is
    # aligned on its own lengths, which packed() does not do.
    attncheck.check(packed, dtypes=("float64",), laws=("oracle-agreement",), query_documents=True, **MASKS)
'''


def test_mask_declarations_reach_the_client(pytester):
    # documents=, chunked_local=, prefix=, right_window= go through check() to serve(): the function gets the ids
    # (int32 [B,T_q] and [B,T_k]) and the fields, and one that ignores the documents is falsified.
    pytester.makepyfile(packed_attention=PACKED, test_packed=PACKED_TESTS)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "40", "-rP")
    result.assert_outcomes(passed=1, failed=2)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by one_document" in text, text
    assert "attncheck: 1 law falsified by packed" in text, text  # query_documents=True reached it
    assert re.search(r"oracle-agreement \(float64\): oracle-agreement: ", text), text
    wrappers = list((pytester.path / ".attncheck" / "serve").glob("test_packed-packed-*.py"))
    assert len(wrappers) == 1, wrappers
    source = wrappers[0].read_text()
    for keyword in ("'documents': True", "'chunked_local': True", "'prefix': True", "'right_window': True"):
        assert keyword in source, source


def test_serve_refuses_a_mask_declaration_without_its_keyword(tmp_path):
    # documents=True needs q_doc_ids and k_doc_ids in the function's signature (as paged=True needs `paged`).
    import attncheck_plugin

    def no_ids(q, k, v, chunk_size=0):
        return q

    with pytest.raises(TypeError, match="documents=True but fn no_ids has no `q_doc_ids` parameter"):
        attncheck_plugin.serve(no_ids, documents=True)
    with pytest.raises(TypeError, match="right_window=True but fn no_ids has no `window_right` parameter"):
        attncheck_plugin.serve(no_ids, right_window=True)
    with pytest.raises(ValueError, match="query_documents=True needs documents=True"):
        attncheck_plugin.serve(no_ids, query_documents=True)


STRIDED = '''
import numpy as np
from numpy.lib.stride_tricks import as_strided

from kernels import correct


def contiguous_reads(q, k, v, scale=None):
    """The bug: each input's memory read as contiguous [B,H,T,D], whatever its strides (a C kernel handed .ctypes)."""
    def as_contiguous(x):
        B, H, T, D = x.shape
        return as_strided(x, x.shape, tuple(n * x.itemsize for n in (H * T * D, T * D, D, 1)))
    return correct(as_contiguous(q), as_contiguous(k), as_contiguous(v), scale)


def test_strided(attncheck):
    attncheck.check(correct, dtypes=("float64",), laws=("layout-invariance",), strided=True)


def test_contiguous_reads(attncheck):
    attncheck.check(contiguous_reads, dtypes=("float64",), laws=("layout-invariance",), strided=True)
'''


def test_strided_declarations_give_the_function_numpy_views_in_other_layouts(pytester):
    # strided=True goes through check() to serve(): the function gets q, k, v as views (padded with NaN gaps,
    # [B,T,H,D], broadcast, interleaved, one array), and one that reads their memory as contiguous is falsified.
    pytester.makepyfile(kernels=FUNCTIONS, test_strided=STRIDED)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "40", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by contiguous_reads" in text, text
    assert re.search(r"layout-invariance \(float64\): layout-invariance: ", text), text


CELL_MASKS = '''
import numpy as np


def attend(q, k, v, scale, seen):
    """Attention in float64 over the boolean mask seen [B or 1, H or 1, T_q, T_k]."""
    D = q.shape[3]
    s = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) * (scale or 1 / np.sqrt(D))
    with np.errstate(all="ignore"):
        s = np.where(seen, s, -np.inf)
        top = s.max(axis=-1, keepdims=True)
        e = np.where(seen, np.exp(s - np.where(np.isfinite(top), top, 0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0) @ v


def mask(q, k, block_mask, dense_mask, use_dense=True):
    """Top-left causal, then the block mask and the dense mask."""
    B, H, T_q, T_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    if dense_mask is not None:
        assert dense_mask.dtype == bool and dense_mask.ndim == 4 and dense_mask.shape[2:] == (T_q, T_k), dense_mask.shape
        assert dense_mask.shape[0] in (1, B) and dense_mask.shape[1] in (1, H), dense_mask.shape
    if block_mask is not None:
        nq, nk = -(-T_q // block_mask.block_q), -(-T_k // block_mask.block_k)
        assert block_mask.kinds.dtype == np.uint8 and block_mask.kinds.shape[2:] == (nq, nk), block_mask
        assert block_mask.partial is None or block_mask.partial.dtype == bool, block_mask
    seen = np.tril(np.ones((T_q, T_k), dtype=bool))[None, None]
    if block_mask is not None:
        seen = seen & block_mask.to_dense()
    if use_dense and dense_mask is not None:
        seen = seen & dense_mask
    return seen


def masked(q, k, v, scale=None, block_mask=None, dense_mask=None):
    return attend(q, k, v, scale, mask(q, k, block_mask, dense_mask))


def no_dense(q, k, v, scale=None, block_mask=None, dense_mask=None):
    """The bug: the dense mask ignored."""
    return attend(q, k, v, scale, mask(q, k, block_mask, dense_mask, use_dense=False))
'''

CELL_MASKS_TESTS = '''
from cell_masks import masked, no_dense


def test_masked(attncheck):
    attncheck.check(masked, dtypes=("float64",), laws=("oracle-agreement", "mask-encodings"), block_mask=True,
                    dense_mask=True)


def test_no_dense(attncheck):
    attncheck.check(no_dense, dtypes=("float64",), laws=("oracle-agreement",), block_mask=True, dense_mask=True)
'''


def test_block_and_dense_mask_declarations_reach_the_client(pytester):
    # block_mask= and dense_mask= go through check() to serve(): the function gets a BlockMask (uint8 kinds, bool
    # partial cells, to_dense()) and a bool array [B|1, H|1, T_q, T_k], and one that ignores the dense mask is
    # falsified.
    pytester.makepyfile(cell_masks=CELL_MASKS, test_cell_masks=CELL_MASKS_TESTS)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "40", "-rP")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by no_dense" in text, text
    wrappers = list((pytester.path / ".attncheck" / "serve").glob("test_masked-masked-*.py"))
    assert len(wrappers) == 1, wrappers
    source = wrappers[0].read_text()
    for keyword in ("'block_mask': True", "'dense_mask': True"):
        assert keyword in source, source


def test_block_mask_to_dense_follows_the_kinds_and_the_partial_cells():
    # Blocks of 2 x 3 over T_q = 3, T_k = 4 (the last block of each short): kinds [1, 2, 2, 2] per head, partial
    # cells [2, 1, 3, 4] per batch entry; the dense mask is [2, 2, 3, 4], True where FULL or PARTIAL and the cell.
    import numpy as np
    import attncheck_plugin

    E, P, F = attncheck_plugin.BlockMask.EMPTY, attncheck_plugin.BlockMask.PARTIAL, attncheck_plugin.BlockMask.FULL
    kinds = np.array([[[[F, P], [E, P]], [[P, E], [F, F]]]], dtype=np.uint8)
    partial = np.arange(2 * 3 * 4).reshape(2, 1, 3, 4) % 3 == 0
    dense = attncheck_plugin.BlockMask(2, 3, kinds, partial, 3, 4).to_dense()
    assert dense.shape == (2, 2, 3, 4) and dense.dtype == bool
    for b in range(2):
        for h in range(2):
            for i in range(3):
                for j in range(4):
                    kind = kinds[0, h, i // 2, j // 3]
                    assert dense[b, h, i, j] == (kind == F or (kind == P and partial[b, 0, i, j])), (b, h, i, j)
    # Without partial cells (no block partial) only the kinds say.
    full = attncheck_plugin.block_mask_to_dense(attncheck_plugin.BlockMask(4, 4, np.full((1, 1, 1, 1), F, np.uint8),
                                                                           None, 3, 4))
    assert full.shape == (1, 1, 3, 4) and full.all()


def test_serve_refuses_a_block_or_dense_mask_declaration_without_its_keyword():
    import attncheck_plugin

    def no_block_mask(q, k, v, dense_mask=None):
        return q

    def no_dense_mask(q, k, v, block_mask=None):
        return q

    with pytest.raises(TypeError, match="block_mask=True but fn no_block_mask has no `block_mask` parameter"):
        attncheck_plugin.serve(no_block_mask, block_mask=True, dense_mask=True)
    with pytest.raises(TypeError, match="dense_mask=True but fn no_dense_mask has no `dense_mask` parameter"):
        attncheck_plugin.serve(no_dense_mask, block_mask=True, dense_mask=True)


BATCH = '''
import numpy as np


def per_row(q, k, v, scale=None, alignment="top-left"):
    """Each row on its own, in float64, keys in order: its bits cannot depend on the batch or the query count."""
    B, H, T_q, D = q.shape
    T_k = k.shape[2]
    out = np.zeros(q.shape)
    for b in range(B):
        for h in range(H):
            for i in range(T_q):
                last = i if alignment == "top-left" else i + T_k - T_q
                if last < 0:
                    continue
                s = np.array([float(np.dot(q[b, h, i], k[b, h, j])) for j in range(last + 1)]) * (scale or 1 / np.sqrt(D))
                w = np.exp(s - s.max())
                out[b, h, i] = sum(w[j] * v[b, h, j] for j in range(last + 1)) / w.sum()
    return out


def by_batch(q, k, v, scale=None, alignment="top-left"):
    """The bug under the claim: one sequence is computed in float32 (a "latency" path), a batch in float64."""
    out = per_row(q, k, v, scale, alignment)
    return out.astype(np.float32).astype(np.float64) if q.shape[0] == 1 else out


def test_per_row(attncheck):
    attncheck.check(per_row, dtypes=("float64",), laws=("batch-invariance",), alignments=("top-left", "bottom-right"),
                    batch_invariant=True)


def test_by_batch(attncheck):
    attncheck.check(by_batch, dtypes=("float64",), laws=("batch-invariance",),
                    alignments=("top-left", "bottom-right"), batch_invariant=True)
'''


def test_a_batch_invariance_claim_reaches_attncheck_and_is_held_bit_for_bit(pytester):
    # batch_invariant=True sets ATTNCHECK_CAP3_BATCH_INVARIANT: the law then applies; without it, it is n/a.
    pytester.makepyfile(test_batch=BATCH)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "20", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "batch-invariance" in out and "must be bit-identical" in out and "in a batch of 2" in out


INSTALLED = '''
def test_the_fixture_is_there(attncheck):
    assert hasattr(attncheck, "check")
'''


def test_the_installed_package_and_p_attncheck_pytest_load_the_plugin_once(tmp_path):
    """The documented install (a venv from /usr/bin/python3 seeing Debian's packages, pip install of
    harness/python) registers the plugin by its entry point; `-p attncheck_pytest` on top of it must not stop
    pytest with "Plugin already registered"."""
    python = "/usr/bin/python3"  # scripts/setup.sh installs python3-venv, python3-setuptools and python3-wheel
    package = tmp_path / "package"  # a copy: pip writes build/ and *.egg-info beside the sources
    shutil.copytree(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), package,
                    ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    made = subprocess.run([python, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True)
    assert made.returncode == 0, "python3 -m venv failed (apt-get install python3-venv): " + made.stdout + made.stderr
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-deps", "--no-index",
                              str(package)], capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stdout + install.stderr
    (tmp_path / "test_installed.py").write_text(INSTALLED)
    for extra in ([], ["-p", "attncheck_pytest"]):
        run = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", *extra,
                              str(tmp_path / "test_installed.py")], capture_output=True, text=True, cwd=tmp_path,
                             env=env)
        assert "already registered" not in run.stdout + run.stderr, run.stdout + run.stderr
        assert run.returncode == 0, (extra, run.stdout + run.stderr)


# framework="torch": the function gets torch tensors at the case's real dtype, on the device named; closures,
# lambdas and partials cross to the server pickled; every call raising is one error with its traceback; the
# function's output is the test's captured stderr; several dtypes are one attncheck run and one server process.
TORCH_KERNELS = '''
import os
import sys

import torch

# Each import of this module leaves a line here, with the program that imported it (pytest, or a server's wrapper
# in .attncheck/serve/): one server for every dtype of a check.
with open(os.environ["IMPORTS_LOG"], "a") as f:
    f.write("imported by %s\\n" % sys.argv[0])

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def masked(q, k, v, scale, upcast):
    """Causal top-left attention; with `upcast`, in float32 (the usual design) and back to q's dtype."""
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    T_q, T_k = s.shape[-2:]
    s = s.masked_fill(~torch.ones(T_q, T_k, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return (torch.softmax(s, -1) @ v).to(dtype)


def exact_dtype(q, k, v, dtype, scale=None):
    """Refuses any tensor that is not of the case's dtype: it holds only if every call brings exactly that."""
    for x in (q, k, v):
        if not isinstance(x, torch.Tensor) or x.dtype != TORCH_DTYPES[dtype] or x.device.type != "cpu":
            raise TypeError("expected a cpu tensor of %s, got %r" % (dtype, getattr(x, "dtype", type(x))))
    return masked(q, k, v, scale, upcast=True)


def no_half_kernel(q, k, v, scale=None):
    """Computes in the dtype it gets, and has no float16 kernel: every float16 call raises."""
    print("no_half_kernel called with", q.dtype)
    if q.dtype == torch.float16:
        raise NotImplementedError("no float16 kernel for this tile")
    return masked(q, k, v, scale, upcast=True)


def tiled(q, k, v, scale=None, tile=16):
    """A causal mask that lets each query see one key too many once T exceeds the tile (a bug at tile 1)."""
    dtype = q.dtype
    q, k, v = q.float(), k.float(), v.float()
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    T_q, T_k = s.shape[-2:]
    seen = torch.ones(T_q, T_k, dtype=torch.bool).tril(1 if T_k > tile else 0)
    return (torch.softmax(s.masked_fill(~seen, float("-inf")), -1) @ v).to(dtype)


def dropout_global_rng(q, k, v, scale=None, dropout=None):
    """The bug: torch.nn.functional.dropout on the weights draws from torch's global generator, which the call's seed
    and offset never reach: every call (the backward's recomputation, a probe) draws another mask."""
    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    w = torch.softmax(s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf")), -1)
    if dropout is not None:
        w = torch.nn.functional.dropout(w, dropout.p)
    return (w @ v.float()).to(q.dtype)


def everything(q, k, v, scale=None, key_lengths=None, sinks=None, paged=None, dense_mask=None, block_mask=None):
    """One reference for the call families whose arrays become tensors: strided views, paged pools (gather),
    key lengths, sinks (float64 tensors), dense and block masks (to_dense)."""
    if paged is not None:
        k, v = paged.gather()
    dtype = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    B, H, T_q, T_k = s.shape
    seen = torch.ones(T_q, T_k, dtype=torch.bool).tril().expand(B, H, T_q, T_k)
    if key_lengths is not None:
        assert key_lengths.dtype == torch.int64, key_lengths.dtype
        seen = seen & (torch.arange(T_k)[None, None, None, :] < key_lengths[:, None, None, None])
    for mask in (dense_mask, None if block_mask is None else block_mask.to_dense()):
        if mask is not None:
            assert mask.dtype == torch.bool, mask.dtype
            seen = seen & mask
    s = s.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        assert sinks.dtype == torch.float64, sinks.dtype
        s = torch.cat([s, sinks[None, :, None, None].expand(B, H, T_q, 1)], dim=-1)
    w = torch.softmax(s, -1)[..., :T_k]
    return (w @ v).to(dtype)
'''

TORCH_TESTS = '''
import functools

import pytest

from torch_kernels import dropout_global_rng, everything, exact_dtype, masked, no_half_kernel, tiled


def test_exact_dtype(attncheck):
    attncheck.check(exact_dtype, dtypes=("bfloat16", "float16", "float32"), framework="torch", device="cpu",
                    laws=("oracle-agreement", "row-stochastic", "grad-oracle", "grad-causality"),
                    backward="autograd")


def test_no_half_kernel(attncheck):
    attncheck.check(no_half_kernel, dtypes=("float32", "float16"), framework="torch",
                    laws=("oracle-agreement", "causal-perturbation", "row-stochastic"))


@pytest.mark.parametrize("tile", [1, 64])
def test_tiled(attncheck, tile):
    attncheck.check(functools.partial(tiled, tile=tile), dtypes=("float32",), framework="torch",
                    laws=("causal-perturbation", "oracle-agreement"))


def test_lambda_and_closure(attncheck):
    attncheck.check(lambda q, k, v, scale=None: masked(q, k, v, scale, upcast=True), dtypes=("float32",),
                    framework="torch", laws=("oracle-agreement",))
    bias = 0.0

    def closure(q, k, v, scale=None):
        return masked(q, k, v, scale, upcast=True) + bias
    attncheck.check(closure, dtypes=("float32",), framework="torch", laws=("oracle-agreement",))


def test_everything(attncheck):
    attncheck.check(everything, dtypes=("float32",), framework="torch", key_lengths=True, sinks=True, paged=True,
                    page_sizes=(1, 4), dense_mask=True, block_mask=True, strided=True, empty_rows="any",
                    laws=("oracle-agreement", "paged-dense", "mask-encodings", "layout-invariance", "sink-mass"))


def test_dropout_global_rng(attncheck):
    attncheck.check(dropout_global_rng, dtypes=("float32",), framework="torch", backward="autograd", dropout=True,
                    laws=("dropout-as-its-mask", "dropout-mask-determinism", "dropout-keep-rate", "grad-dropout-mask"))


def test_device_that_is_not_there(attncheck):
    attncheck.check(exact_dtype, dtypes=("float32",), framework="torch", device="cuda:7",
                    laws=("oracle-agreement",))
'''


# Imported once, here: pytester restores sys.modules after each test, and torch cannot be imported twice.
try:
    import torch
except ImportError:
    torch = None
try:
    import cloudpickle
except ImportError:
    cloudpickle = None


@pytest.fixture
def torch_run(pytester, monkeypatch):
    if torch is None:
        pytest.skip("PyTorch is not installed (Debian: apt-get install python3-torch)")
    if cloudpickle is None:
        pytest.skip("cloudpickle is not installed (Debian: apt-get install python3-cloudpickle)")
    log = pytester.path / "imports.log"
    monkeypatch.setenv("IMPORTS_LOG", str(log))
    pytester.makepyfile(torch_kernels=TORCH_KERNELS, test_torch_kernels=TORCH_TESTS)

    def run_torch(*args):
        if log.exists():
            log.unlink()
        result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-cases", "10", *args)
        servers = [line for line in (log.read_text().splitlines() if log.exists() else []) if "/serve/" in line]
        return result, result.stdout.str(), len(servers)
    return run_torch


def test_a_torch_function_gets_tensors_of_the_real_dtype_in_one_server_for_every_dtype(torch_run):
    result, text, imports = torch_run("-k", "exact_dtype", "-rP")
    result.assert_outcomes(passed=1)
    # Every law held at each dtype: no call brought anything but a cpu tensor of exactly that dtype, the backward's
    # (torch.autograd through the function) included.
    for dtype in ("bfloat16", "float16", "float32"):
        assert re.search(r"exact_dtype at %s \(seed 1, 10 cases per law\): 4 held\n" % dtype, text), text
    assert imports == 1, "one server process (one import of the function's module) for three dtypes"


def test_every_call_raising_is_one_error_with_the_functions_traceback_and_its_output(torch_run):
    result, text, _ = torch_run("-k", "no_half_kernel")
    result.assert_outcomes(failed=1)
    # float16: one error, not three falsified laws; float32 held.
    assert re.search(r"ERROR at float16: every one of the \d+ calls of no_half_kernel raised, so no law could be "
                     r"checked at float16: NotImplementedError: no float16 kernel for this tile\n", text), text
    assert "falsified" not in text.split("Captured stderr")[0].replace("0 laws falsified", ""), text
    assert re.search(r"no_half_kernel at float32 \(seed 1, 10 cases per law\): 3 held", text), text
    # The traceback starts in the function's own file, at the line that raised.
    assert re.search(r'File "\S+torch_kernels.py", line \d+, in no_half_kernel\n\s+raise NotImplementedError', text), text
    assert "attncheck_plugin.py" not in text.split("its traceback:")[1].split("Captured")[0], text
    # The function's prints are the test's captured stderr; the traceback there is printed once, then counted.
    captured = text.split("Captured stderr call")[1]
    assert "no_half_kernel called with torch.float16" in captured, text
    assert captured.count("Traceback (most recent call last)") == 1, captured
    assert re.search(r"no_half_kernel raised NotImplementedError: no float16 kernel for this tile \d+ times at "
                     r"float16", captured), captured


def test_partials_lambdas_and_closures_are_checked(torch_run):
    result, text, _ = torch_run("-k", "tiled or lambda_and_closure")
    # Each parametrized configuration is its own function: tile 1 lets a future key in, tile 64 does not (T <= 64).
    result.assert_outcomes(passed=2, failed=1)
    assert re.search(r"test_tiled\[1\] FAILED", text), text
    assert "attncheck: 2 laws falsified by partial-tiled" in text, text
    # The reproduction of a pickled partial runs on its own, and fails while the bug is there.
    repro = re.search(r"reproduce in Python \(no attncheck\): \S+ (\S+\.py)\n", text).group(1)
    run = subprocess.run([sys.executable, repro], capture_output=True, text=True, cwd="/",
                         env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNCHECK")})
    assert run.returncode == 1 and "FAILS" in run.stdout, (run.returncode, run.stdout, run.stderr)
    assert re.search(r"test_tiled\[64\] PASSED", text), text
    assert re.search(r"<lambda> at float32 .*: 1 held", text), text
    assert re.search(r"test_lambda_and_closure.<locals>.closure at float32 .*: 1 held", text), text


def test_strided_paged_masked_and_sink_calls_reach_a_torch_function_as_tensors(torch_run):
    result, text, _ = torch_run("-k", "everything", "-rP")
    result.assert_outcomes(passed=1)
    assert re.search(r"everything at float32 \(seed 1, 10 cases per law\): 5 held\n", text), text


def test_dropout_from_torchs_global_generator_is_caught_on_one_query_over_one_key(torch_run):
    result, text, _ = torch_run("-k", "dropout_global_rng")
    result.assert_outcomes(failed=1)
    # Its mask is another on every call: the probe that recovers its weights, the backward's recomputation, the call
    # with other values all draw their own. Each law that reads a mask twice sees it on a case of one cell.
    for law in ("dropout-as-its-mask", "dropout-mask-determinism", "grad-dropout-mask"):
        assert re.search(r"%s \(float32\): .*\n  minimal case: B=1 H=1 T=1 D=1 dropout \(p=" % law, text), text
    assert "falsified: dropout-as-its-mask, dropout-mask-determinism, grad-dropout-mask" in text, text


def test_a_device_torch_cannot_reach_is_a_refusal_that_names_it(torch_run):
    if torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    result, text, _ = torch_run("-k", "device_that_is_not_there")
    result.assert_outcomes(failed=1)
    assert re.search(r"serve\(framework=\"torch\", device='cuda:7'\): torch cannot make a tensor there: \w+", text), text


def test_a_falsified_oracle_agreement_comes_with_a_python_reproduction_that_runs_on_its_own(pytester, tmp_path):
    result = run(pytester, "--attncheck-cases", "30", "-k", "unmasked_oracle")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    found = re.search(r"reproduce in Python \(no attncheck\): (\S+) (\S+/repro/\S+/oracle-agreement-float64\.py)\n",
                      text)
    assert found, text
    assert found.group(1) == sys.executable
    repro = found.group(2)
    assert os.path.exists(repro[:-3] + ".npz"), repro
    # From elsewhere, with no attncheck binary reachable and no PYTHONPATH: the inputs, the call, the float64
    # expectation; exit 1 while the bug is there.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNCHECK")}
    env["PATH"] = "/usr/bin:/bin"
    bug = subprocess.run([sys.executable, repro], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert bug.returncode == 1, (bug.stdout, bug.stderr)
    assert "expected (float64 oracle)" in bug.stdout and "FAILS:" in bug.stdout, bug.stdout
    # The function fixed in its file: the same program exits 0.
    kernels = pytester.path / "kernels.py"
    kernels.write_text(kernels.read_text().replace(
        "def no_mask(q, k, v, scale=None):", "def no_mask(q, k, v, scale=None):\n    return correct(q, k, v, scale)"))
    fixed = subprocess.run([sys.executable, repro], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert fixed.returncode == 0 and "agrees" in fixed.stdout, (fixed.stdout, fixed.stderr)


def test_a_reproduction_carries_the_cases_bias(pytester, tmp_path):
    # A function that ignores its bias fails only where the case has one: the reproduction must call it with that
    # bias (without it, the function would agree with an expectation computed with it, or the program would lie).
    result = run(pytester, "--attncheck-cases", "30", "-k", "bias_ignored")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert re.search(r"minimal case: B=1 H=1 T=\d+ D=1.* bias\n", text), text
    repro = re.search(r"reproduce in Python \(no attncheck\): \S+ (\S+/oracle-agreement-float64\.py)\n", text)
    assert repro, text
    import numpy as np
    with np.load(repro.group(1)[:-3] + ".npz") as case:
        assert case["bias"].ndim == 4 and case["bias"].shape[2:] == (case["q"].shape[2], case["k"].shape[2])
        assert np.any(case["bias"] != 0), case["bias"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNCHECK")}
    bug = subprocess.run([sys.executable, repro.group(1)], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert bug.returncode == 1 and "FAILS:" in bug.stdout, (bug.stdout, bug.stderr)
    kernels = pytester.path / "kernels.py"
    kernels.write_text(kernels.read_text().replace(
        "    return correct(q, k, v, scale)\n\n\ndef zero_backward",
        "    return biased(q, k, v, scale, bias)\n\n\ndef zero_backward"))
    fixed = subprocess.run([sys.executable, repro.group(1)], capture_output=True, text=True, cwd=str(tmp_path),
                           env=env)
    assert fixed.returncode == 0 and "agrees" in fixed.stdout, (fixed.stdout, fixed.stderr)


def test_a_reproduction_carries_the_cases_temperature(pytester, tmp_path):
    # A function that ignores its temperature fails only where the case has one: the reproduction must call it with
    # that temperature, or it would agree with an expectation computed with it.
    result = run(pytester, "--attncheck-cases", "30", "-k", "temperature_ignored")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert re.search(r"minimal case: B=1 H=1 T=\d+ D=1.* temperature\n", text), text
    repro = re.search(r"reproduce in Python \(no attncheck\): \S+ (\S+/oracle-agreement-float64\.py)\n", text)
    assert repro, text
    import numpy as np
    with np.load(repro.group(1)[:-3] + ".npz") as case:
        assert case["temperature"].ndim == 3 and case["temperature"].shape[2] == case["q"].shape[2]
        assert np.any(case["temperature"] != 1), case["temperature"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNCHECK")}
    bug = subprocess.run([sys.executable, repro.group(1)], capture_output=True, text=True, cwd=str(tmp_path), env=env)
    assert bug.returncode == 1 and "FAILS:" in bug.stdout, (bug.stdout, bug.stderr)
    kernels = pytester.path / "kernels.py"
    kernels.write_text(kernels.read_text().replace(
        "    \"\"\"The bug: declares a temperature and attends without it.\"\"\"\n    return correct(q, k, v, scale)",
        "    return tempered(q, k, v, scale, temperature)"))
    fixed = subprocess.run([sys.executable, repro.group(1)], capture_output=True, text=True, cwd=str(tmp_path),
                           env=env)
    assert fixed.returncode == 0 and "agrees" in fixed.stdout, (fixed.stdout, fixed.stderr)


def test_features_declares_by_name_what_the_keywords_declare_one_by_one(tmp_path):
    """serve(fn, features=(...)) is serve(fn, name=True, ...); a name that is no feature is refused, naming the
    families; a feature also set False is refused."""
    import attncheck_plugin
    seen = {}

    def fake(fn, **declared):
        seen.update(declared)
    real, attncheck_plugin.serve_declared = attncheck_plugin.serve_declared, fake
    try:
        attncheck_plugin.serve(len, features=("gqa", "window", "lse"), dtypes=("float64",))
        assert seen == {"gqa": True, "window": True, "lse": True, "dtypes": ("float64",)}, seen
        with pytest.raises(ValueError, match=r"features names 'windows', which is no feature \(expected names among "
                                             r"heads and lengths: gqa, key_lengths, v_head_dim; masks beyond causal"):
            attncheck_plugin.serve(len, features=("windows",))
        with pytest.raises(ValueError, match=r"'lse' is in features but lse=False as well"):
            attncheck_plugin.serve(len, features=("lse",), lse=False)
    finally:
        attncheck_plugin.serve_declared = real


SLOW = '''
import time

from kernels import correct


def slow(q, k, v, scale=None):
    time.sleep(0.05)  # a slow function: a law's 100 calls take 5 seconds
    return correct(q, k, v, scale)


def test_slow(attncheck):
    attncheck.check(slow, dtypes=("float64",), laws=("row-stochastic",))
'''


def test_progress_shows_the_law_the_cases_and_the_time_left_on_the_tests_line(pytester):
    pytester.makepyfile(kernels=FUNCTIONS, test_slow=SLOW)
    result = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-progress=yes")
    result.assert_outcomes(passed=1)
    text = result.stdout.str()
    # Drawn over the test's line while the check runs (the laws it applies, cases done, the time left), then the
    # line as pytest left it, with its outcome.
    # (pytester's text has the carriage returns as line ends.)
    assert re.search(r"test_slow\.py [\r\n]\x1b\[Kattncheck \[1/1\] row-stochastic: \d+/100 cases", text), repr(text)
    assert re.search(r"\x1b\[Kattncheck \[1/1\] row-stochastic: \d+/100 cases; about \d+ s left[\r\n]", text), repr(text)
    assert re.search(r"[\r\n]\x1b\[Ktest_slow\.py \.\s+\[100%\]\n", text), repr(text)
    # Off: nothing drawn.
    quiet = pytester.runpytest_subprocess("-p", "attncheck_pytest", "--attncheck-progress=no")
    quiet.assert_outcomes(passed=1)
    assert "\x1b[K" not in quiet.stdout.str(), repr(quiet.stdout.str())
