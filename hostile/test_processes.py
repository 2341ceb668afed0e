"""Processes: whatever a plug-in or exec: client starts ends with the run, however the run ends (a normal end,
SIGINT, SIGTERM, SIGKILL of attncheck), setsid() daemons and hosts deaf to SIGTERM included; a crashing,
hanging or garbling implementation is reported, never costs the run; one that cannot be started again is
given up on after a few tries instead of stalling the run. The `marker` fixture fails a test that leaves any
process behind."""
import json
import signal
import subprocess
import time

from conftest import ATTNCHECK, PYTHON, HERE, bad_plugin, processes_with, run

CLIENT = HERE.parent / "harness" / "tests" / "bad_client.py"


def test_setsid_daemon_ends_with_a_normal_run(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('setsid_child')}", "--property", "row-stochastic",
             "--cases", "5", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 0, r
    assert "all 1 laws held" in r.out, r


def kill_mid_call(tmp_path, marker, spec, sig, extra=()):
    """Starts a check of `spec` whose calls hang, waits until the implementation's processes are up and a
    call is hanging, sends `sig` to attncheck and returns its exit status."""
    p = subprocess.Popen([ATTNCHECK, "check", "--impl", spec, "--timeout", "600", "--no-corpus",
                          "--report-dir", str(tmp_path / "r"), *extra], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while len(processes_with(marker)) < 3 and time.monotonic() < deadline:  # attncheck, guard, worker
            time.sleep(0.05)
        assert len(processes_with(marker)) >= 3, "the implementation never started"
        time.sleep(1.0)  # the first cases answer at once; then a call hangs
        p.send_signal(sig)
        p.wait(timeout=20)
        return p.returncode
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigkill_of_attncheck_ends_a_setsid_daemon(tmp_path, marker):
    assert kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('setsid_child')}", signal.SIGKILL) == -signal.SIGKILL


# SIGINT and SIGTERM end the run with the reports of what it finished: exit 130.
def test_sigterm_of_attncheck_ends_a_setsid_daemon(tmp_path, marker):
    assert kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('setsid_child')}", signal.SIGTERM) == 130


def test_sigint_of_attncheck_ends_a_setsid_daemon(tmp_path, marker):
    assert kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('setsid_child')}", signal.SIGINT) == 130


def test_sigkill_of_attncheck_ends_a_host_deaf_to_sigterm(tmp_path, marker):
    rc = kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('ignore_term_hang')}", signal.SIGKILL)
    assert rc == -signal.SIGKILL


def test_sigterm_of_attncheck_ends_a_host_deaf_to_sigterm(tmp_path, marker):
    rc = kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('ignore_term_hang')}", signal.SIGTERM)
    assert rc == 130
    assert (tmp_path / "r" / "summary.json").exists(), "the interrupted run wrote its reports"


def test_sigint_ends_the_run_with_the_reports_of_what_finished(tmp_path, marker):
    # 100,000 cases: minutes of work, so the law is still under way at the signal. (After a stop RapidCheck still
    # runs through the cases left, each returning at once: about 1 us apiece, but many times that under ASan, so
    # a million would make the sanitizer build's exit slower than this test waits.)
    p = subprocess.Popen([ATTNCHECK, "check", "--impl", "reference", "--cases", "100000", "--no-corpus",
                          "--property", "row-stochastic,zero-future-weight", "--report-dir", str(tmp_path / "r")],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "r" / ".attncheck-lock"
    deadline = time.monotonic() + 20
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # row-stochastic is under way
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    assert "interrupted: held in the" in out and "cases checked before the run was stopped" in out, out
    assert "not checked: the run was interrupted" in out, out  # zero-future-weight never started
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    # Neither law was checked in full: neither is held (nor "not applicable"), and the run did not pass.
    assert [law["status"] for law in summary["laws"]] == ["not checked", "not checked"], summary
    assert summary["status"] == "incomplete", summary


def test_an_interrupted_rerun_keeps_the_reports_of_the_laws_it_did_not_finish(tmp_path):
    # A complete run of a mutant writes a report per falsified law; a rerun interrupted early must not lose them.
    laws = "zero-future-weight,first-position,convex-hull,row-stochastic,oracle-agreement"
    common = ["check", "--impl", "mutant:mask-zero", "--property", laws, "--no-corpus", "--report-dir", str(tmp_path / "r")]
    first = run(common + ["--cases", "30"], cwd=tmp_path)
    assert first.rc == 1, first
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").glob("*.json") if p.name != "summary.json"}
    assert len(before) >= 3, before.keys()
    # The rerun starts with a law that runs long (row-stochastic holds on this mutant), then is interrupted.
    p = subprocess.Popen([ATTNCHECK, *common[:3], "--property", "row-stochastic," + laws, "--cases", "100000",
                          *common[5:]], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not (tmp_path / "r" / ".attncheck-lock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    after = {p.name: p.read_bytes() for p in (tmp_path / "r").glob("*.json") if p.name != "summary.json"}
    assert after == before, (sorted(before), sorted(after), out)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    kept = [law for law in summary["laws"] if "is kept" in law.get("note", "")]
    assert {law["law"] + ".json" for law in kept} == set(before), summary
    assert all(law["status"] == "not checked" for law in kept), summary


def test_a_host_deaf_to_sigterm_that_hangs_is_timed_out_and_ended(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('ignore_term_hang')}", "--property", "row-stochastic",
             "--timeout", "1", "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "timeout: " in r.out and "no answer within 1 s" in r.out, r
    assert (tmp_path / "r" / "row-stochastic.json").exists()


def test_crash_then_hang_at_start_up_is_given_up_after_three_starts(tmp_path, marker):
    # The first worker crashes at T >= 2; every restarted one hangs while loading. With --timeout 2 each
    # start waits 2 s, and after three failed starts in a row the laws left are reported without a call.
    state = tmp_path / "state"
    r = run(["check", "--impl", f"plugin:{bad_plugin('crash_then_hang_startup')}", "--timeout", "2",
             "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path, timeout=150, env={"BAD_STATE_FILE": str(state)})
    assert r.rc == 1, r
    assert "could not be started: 3 starts in a row failed" in r.out, r
    assert "no answer within 2 s before finishing the handshake" in r.out, r
    assert "not checked: the implementation could not be started" in r.out, r
    assert (tmp_path / "r" / "summary.json").exists()


def test_exec_client_that_crashes_then_hangs_at_start_up_is_given_up(tmp_path, marker):
    state = tmp_path / "state"
    spec = f"exec:{PYTHON} {CLIENT} crashthenhang {state}"
    r = run(["check", "--impl", spec, "--dtype", "float64", "--timeout", "2", "--no-corpus",
             "--report-dir", tmp_path / "r"], tmp_path, timeout=150)
    assert r.rc == 1, r
    assert "could not be started: 3 starts in a row failed" in r.out, r


def test_crashing_plugin_is_a_falsified_law_with_its_signal(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('crash')}", "--property", "oracle-agreement", "--cases", "20",
             "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "crash: " in r.out and "killed by signal 11" in r.out, r


def test_hanging_plugin_is_a_timeout_and_the_run_goes_on(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('hang')}", "--property", "oracle-agreement",
             "--property", "row-stochastic", "--timeout", "0.5", "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "2 of 2 laws falsified" in r.out and "no answer within 0.5 s" in r.out, r


def test_wild_write_past_the_output_is_caught(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('wrong_size')}", "--property", "oracle-agreement",
             "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "wrote past the end" in r.out, r


def test_garbage_instead_of_a_handshake_is_refused(tmp_path, marker):
    r = run(["check", "--impl", "exec:/bin/echo garbage that is no frame", "--no-corpus",
             "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 2, r
    assert "exec protocol" in r.err, r
    assert not (tmp_path / "r" / "summary.json").exists()
