"""The pytest plugin itself, through pytester: a test using the `attncheck` fixture passes on a correct numpy
function and fails on a buggy one with the law, the minimal case, the margin, the report and the replay
command in its message; --attncheck-cases and --attncheck-seed reach attncheck."""
import json
import re

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


def zero_backward(q, k, v, d_output, scale=None):
    """The bug: no gradient at all."""
    return np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
'''

TESTS = '''
from kernels import correct, no_mask, zero_backward


def test_correct(attncheck):
    attncheck.check(correct, dtypes=("float64",))


def test_no_mask(attncheck):
    attncheck.check(no_mask, dtypes=("float64",), laws=("causal-perturbation", "row-stochastic"))


def test_zero_backward(attncheck):
    attncheck.check(correct, dtypes=("float64",), laws=("grad-oracle",), backward=zero_backward)
'''


def run(pytester, *args):
    pytester.makepyfile(kernels=FUNCTIONS, test_kernels=TESTS)
    return pytester.runpytest_subprocess("-p", "attncheck_pytest", *args)


def test_passes_on_a_correct_function_and_fails_on_a_buggy_one_with_the_minimal_case(pytester):
    result = run(pytester, "--attncheck-cases", "30", "-k", "not backward")
    result.assert_outcomes(passed=1, failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by no_mask" in text
    # The law, its message, the minimal case (a future key needs T_k >= 2), the margin, report and replay.
    assert re.search(r"causal-perturbation \(float64\): causal-perturbation: ", text), text
    assert re.search(r"minimal case: B=1 H=1 T=[12] D=1( T_k=2)?\n", text), text
    assert re.search(r"margin: \S+ (against a tolerance of|where the law is exact)", text), text
    assert re.search(r"report: \S+causal-perturbation\.md", text), text
    assert re.search(r"replay: attncheck check --impl '?exec:.* --replay \S+causal-perturbation\.json", text), text


def test_cases_and_seed_reach_attncheck(pytester):
    result = run(pytester, "--attncheck-cases", "3", "--attncheck-seed", "7", "-k", "correct")
    result.assert_outcomes(passed=1)
    summaries = list(pytester.path.rglob("summary.json"))
    assert len(summaries) == 1, summaries
    with open(summaries[0]) as f:
        summary = json.load(f)
    assert summary["seed"] == 7
    assert summary["generator"]["cases"] == 3


def test_a_backward_function_crosses_as_a_keyword_and_its_gradients_are_checked(pytester):
    result = run(pytester, "--attncheck-cases", "10", "-k", "backward")
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "attncheck: 1 law falsified by correct" in text, text
    assert re.search(r"grad-oracle \(float64\): grad-oracle: d[qkv]\S* is 0 but should be ", text), text
