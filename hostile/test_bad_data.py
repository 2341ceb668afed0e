"""Bad data and bad flags: every refusal is exit 2 with a message naming the
field or flag, the value and what was expected; nothing is written, nothing is started, nothing is called."""
import json
import os
import time
from pathlib import Path

import pytest

from conftest import bad_plugin, run

CORPUS = Path(__file__).resolve().parent.parent / "fuzz" / "corpus" / "counterexample"
MASK_ZERO = CORPUS / "mutant-mask-zero_zero-future-weight.json"  # zero-future-weight on mutant:mask-zero
GQA = CORPUS / "mutant-gqa-kv-modulo_gqa-equivalence.json"  # 2 kv heads for 4 query heads


def spoiled(tmp_path, name, change, base=MASK_ZERO):
    doc = json.loads(base.read_text())
    change(doc)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def refused(r, *says):
    assert r.rc == 2, r
    for s in says:
        assert s in r.err, (s, r)
    assert "internal error" not in r.text, r
    assert "falsified" not in r.out.lower(), r


def nothing_written(tmp_path, *allowed):
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in allowed)
    assert left == [], left


def test_garbage_reproduce_flag_is_exit_2(tmp_path, marker):
    r = run(["check", "--impl", "reference", "--property", "row-stochastic", "--reproduce", "!!!"], tmp_path)
    refused(r, "--reproduce", '"!!!"', "not a RapidCheck reproduce string")
    nothing_written(tmp_path)


def test_garbage_reproduce_in_replay_file_is_exit_2(tmp_path, marker):
    f = spoiled(tmp_path, "LAW.json", lambda d: d.update(reproduce="!!!"))
    refused(run(["check", "--replay", f], tmp_path), str(f), '"reproduce"', "not a RapidCheck reproduce string")
    nothing_written(tmp_path, "LAW.json")


def test_corpus_entry_with_garbage_reproduce_is_skipped(tmp_path, marker):
    entry = tmp_path / "corpus" / "mutant-mask-zero" / "zero-future-weight-0123456789ab.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps(dict(json.loads(MASK_ZERO.read_text()), reproduce="!!!")))
    r = run(["check", "--impl", "mutant:mask-zero", "--property", "zero-future-weight", "--cases", "5",
             "--corpus", tmp_path / "corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r  # found again by generation, not from the skipped entry
    assert "warning: skipping corpus entry " + str(entry) in r.err, r
    assert "not a RapidCheck reproduce string" in r.err, r
    assert "internal error" not in r.text, r
    assert "(corpus)" not in r.out, r


def test_replay_of_a_gqa_case_onto_a_plugin_without_gqa_is_exit_2(tmp_path, marker):
    # bad_plugin crash declares no GQA and crashes on any call: a call would show as a crash.
    r = run(["check", "--impl", f"plugin:{bad_plugin('crash')}", "--replay", GQA], tmp_path)
    refused(r, str(GQA), "grouped-query attention (2 kv heads for 4 query heads)", "does not declare",
            "no grouped-query attention")
    assert "crash" not in r.err.lower().replace("libbad_plugin_crash", ""), r
    nothing_written(tmp_path)


def test_replay_file_never_starts_the_program_it_names(tmp_path, marker):
    pwned = tmp_path / "pwned"
    f = spoiled(tmp_path, "LAW.json", lambda d: d.update(implementation=f"exec:touch {pwned}; true"))
    r = run(["check", "--replay", f], tmp_path)
    refused(r, f"exec:touch {pwned}; true", f"attncheck check --impl 'exec:touch {pwned}; true' --replay {f}")
    time.sleep(0.2)
    assert not pwned.exists()
    p = spoiled(tmp_path, "PLUGIN.json", lambda d: d.update(implementation=f"plugin:{bad_plugin('crash')}"))
    refused(run(["check", "--replay", p], tmp_path), f"plugin:{bad_plugin('crash')}", "--impl")
    nothing_written(tmp_path, "LAW.json", "PLUGIN.json")


def test_replay_file_may_name_a_builtin(tmp_path, marker):
    r = run(["check", "--replay", MASK_ZERO], tmp_path)
    assert r.rc == 1, r
    assert "falsified again" in r.out, r
    nothing_written(tmp_path)


@pytest.mark.parametrize("field,value,says", [
    ("max_T_tail", 2 ** 40, "1048576"), ("max_B", 2 ** 31 - 1, "65536"), ("max_H", -1, "65536"),
    ("max_D", 2 ** 31 - 1, "65536"), ("min_T", 0, "1048576"), ("max_T", -64, "1048576"), ("cases", 0, "10000000"),
    ("max_size", 10 ** 9, "10000"), ("max_H_kv", -2, "65536")])
def test_replay_generator_bounds_are_range_checked(tmp_path, marker, field, value, says):
    f = spoiled(tmp_path, "LAW.json", lambda d: d["generator"].update({field: value}))
    start = time.monotonic()
    refused(run(["check", "--replay", f], tmp_path), f'"generator.{field}"', str(value), says)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("scale", ["nan", "inf", "-inf", 0, -1])
def test_replay_scale_must_be_positive_and_finite(tmp_path, marker, scale):
    f = spoiled(tmp_path, "LAW.json", lambda d: d["case"]["problem"].update(scale=scale))
    refused(run(["check", "--replay", f], tmp_path), "case.problem: scale must be finite and positive")


def test_replay_file_over_the_size_limit_is_refused_unread(tmp_path, marker):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(256 * 2 ** 20 + 1)  # sparse: costs no disk
    start = time.monotonic()
    refused(run(["check", "--replay", big], tmp_path), str(big), "268435456 bytes (256 MiB)")
    assert time.monotonic() - start < 2


def test_shape_that_cannot_fit_in_memory_is_refused_up_front(tmp_path, marker):
    start = time.monotonic()
    r = run(["check", "--impl", "reference", "--shape", "65536,65536,1,1,16", "--cases", "1"], tmp_path)
    refused(r, "--shape 65536,65536,1,1,16", "GiB", "this machine has")
    r = run(["check", "--impl", "reference", "--shape", "999999999,999999999,999999999,999999999,999999999"],
            tmp_path)
    refused(r, "B = 999999999", "65536")
    assert time.monotonic() - start < 5
    nothing_written(tmp_path)


@pytest.mark.parametrize("args,says", [
    (["--timeout", "nan"], ["--timeout", "nan"]), (["--timeout", "inf"], ["--timeout", "inf"]),
    (["--timeout", "0"], ["--timeout", "0"]), (["--timeout", "-1"], ["--timeout", "-1"]),
    (["--seed", "-1"], ["--seed", "-1", "18446744073709551615"]),
    (["--seed", "18446744073709551616"], ["--seed", "18446744073709551616"]),
    (["--shape", "1,1,100,100,8", "--max-T", "10"], ["--shape", "--max-T 10"]),
    (["--max-Hkv", "3", "--max-H", "2"], ["--max-Hkv 3", "--max-H 2"])])
def test_bad_and_contradictory_flags_are_refused(tmp_path, marker, args, says):
    r = run(["check", "--impl", "reference", "--cases", "1", *args], tmp_path)
    refused(r, *says)
    assert len(r.err) < 300, r  # short: no 309-digit bound
    nothing_written(tmp_path)


@pytest.mark.parametrize("extra", [["--property", "zero-future-weight"], ["--reproduce", "ABC"],
                                   ["--shape", "1,1,2,2,1"], ["--max-T", "8"]])
def test_replay_with_flags_it_would_ignore_is_refused(tmp_path, marker, extra):
    refused(run(["check", "--replay", MASK_ZERO, *extra], tmp_path), "--replay", extra[0])
    nothing_written(tmp_path)
