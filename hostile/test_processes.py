"""Processes: whatever a plug-in or exec: client starts ends with the run, however the run ends (a normal end,
SIGINT, SIGTERM, SIGKILL of attncheck), setsid() daemons and hosts deaf to SIGTERM included; a crashing,
hanging or garbling implementation is reported, never costs the run; one that cannot be started again is
given up on after a few tries instead of stalling the run. The `marker` fixture fails a test that leaves any
process behind."""
import json
import os
import re
import resource
import signal
import subprocess
import time

from conftest import ATTNCHECK, PYTHON, HERE, Run, bad_plugin, processes_with, run

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


# The daemon's kernel answers every call: 100,000 cases a law keep the run going when the signal comes (a default
# check of it ends in about a second).
LONG_RUN = ("--cases", "100000")


def test_sigkill_of_attncheck_ends_a_setsid_daemon(tmp_path, marker):
    assert kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('setsid_child')}", signal.SIGKILL,
                         LONG_RUN) == -signal.SIGKILL


# SIGINT and SIGTERM end the run with the reports of what it finished: exit 130.
def test_sigterm_of_attncheck_ends_a_setsid_daemon(tmp_path, marker):
    assert kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('setsid_child')}", signal.SIGTERM, LONG_RUN) == 130


def test_sigint_of_attncheck_ends_a_setsid_daemon(tmp_path, marker):
    assert kill_mid_call(tmp_path, marker, f"plugin:{bad_plugin('setsid_child')}", signal.SIGINT, LONG_RUN) == 130


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
    # zero-future-weight is not checked either: it never started, or (on two cores, where every law's first 20
    # cases are checked before any law's second pass) it held in those and the rest never came.
    assert re.search(r"\nzero-future-weight +not checked ", out), out
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


def sanitized():
    """True for a sanitizer build, which reserves terabytes of address space: no RLIMIT_AS there."""
    return b"__asan_init" in open(ATTNCHECK, "rb").read()


def address_space_limit(gib):
    """A preexec_fn limiting the run's address space to `gib` GiB (ulimit -v), or None under a sanitizer."""
    if sanitized():
        return None
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))


def run_limited(args, cwd, gib, timeout=120):
    p = subprocess.run([ATTNCHECK, *map(str, args)], cwd=cwd, capture_output=True, timeout=timeout,
                       preexec_fn=address_space_limit(gib))
    return Run(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


# Its own limits are its own failures: what a declaration or a flag asks for that attncheck cannot hold is
# refused (or capped) before a law runs, never an exit 3 halfway through.
def test_pages_too_large_to_hold_are_refused_before_a_law_runs(tmp_path, marker):
    # Pages of 2^20 keys (within the ABI's range): at the default bounds a pool needs far more than any machine.
    r = run_limited(["check", "--impl", f"plugin:{bad_plugin('huge_pages')}", "--no-corpus",
                     "--report-dir", tmp_path / "r"], tmp_path, gib=4, timeout=60)
    assert r.rc == 2, r
    assert "the implementation declares pages of 1048576 keys" in r.err, r
    assert "declare smaller page sizes" in r.err and "--max-B, --max-Hkv or --max-D" in r.err, r
    assert "FALSIFIED" not in r.out and "held" not in r.out, r
    assert not (tmp_path / "r" / "summary.json").exists()


def test_jobs_beyond_the_cores_are_capped_not_an_internal_error(tmp_path, marker):
    # 1024 workers' stacks alone are 8 GiB of address space; under a 2 GiB limit they cannot all start.
    r = run_limited(["check", "--impl", "reference", "--jobs", "1024", "--cases", "5", "--no-corpus",
                     "--property", "row-stochastic,zero-future-weight", "--report-dir", tmp_path / "r"],
                    tmp_path, gib=2)
    assert r.rc == 0, r
    assert f"--jobs 1024 capped at {os.cpu_count()}, this machine's cores" in r.out, r
    assert "all 2 laws held" in r.out, r
    assert (tmp_path / "r" / "summary.json").exists()


def test_sigint_inside_a_long_case_ends_the_run_within_two_seconds(tmp_path, marker):
    # --long's gradient cases take many seconds each (T_k up to 65537): the interrupt must not wait for the
    # case to end (it took 15 s once, inside the core's streamed backward and the oracle's).
    p = subprocess.Popen([ATTNCHECK, "check", "--impl", "reference", "--long", "--no-corpus",
                          "--property", "grad-oracle", "--report-dir", str(tmp_path / "r")],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = tmp_path / "r" / ".attncheck-lock"
        deadline = time.monotonic() + 30
        while not lock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(5)  # well inside the law's long cases (the first takes about 4 s)
        assert p.poll() is None, "the run ended before the interrupt"
        p.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, (out, err)
    assert took < 2, f"the run took {took:.1f} s to end after SIGINT"
    assert "interrupted" in out, out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert [law["law"] for law in summary["laws"]] == ["grad-oracle"], summary
    assert summary["laws"][0]["status"] != "falsified", summary


# Output buffers are guarded far past their ends: a write there is a failed call that names the buffer.
def test_a_write_far_past_the_lse_buffer_is_a_crash_naming_it(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('lse_far')}", "--property", "lse-oracle", "--cases", "10",
             "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "crash: " in r.out and "wrote far past the end of its lse [" in r.out, r
    assert (tmp_path / "r" / "summary.json").exists()


# What a declaration or an answer says must be a value the ABI or the protocol defines.
def test_a_negative_max_t_is_refused_from_a_plugin(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('negative_max_t')}", "--no-corpus",
             "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 2, r
    assert "max_T is -1 (expected 0 for no limit" in r.err, r
    assert not (tmp_path / "r" / "summary.json").exists()


def test_a_negative_max_t_is_refused_by_the_python_client(tmp_path, marker):
    r = run(["check", "--impl", f"exec:{PYTHON} {CLIENT} negmaxt", "--no-corpus", "--report-dir", tmp_path / "r"],
            tmp_path)
    assert r.rc == 2, r
    assert "serve: max_T is -1 (expected 0 for no limit" in r.err, r
    assert not (tmp_path / "r" / "summary.json").exists()


def test_an_unknown_status_from_a_plugin_is_an_abi_error(tmp_path, marker):
    r = run(["check", "--impl", f"plugin:{bad_plugin('unknown_status')}", "--property", "row-stochastic",
             "--cases", "5", "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "ABI error: its forward returned status 7 (expected ATTNCHECK_OK 0, ATTNCHECK_ERROR 1 or" in r.out, r


def test_an_unknown_status_or_flag_from_an_exec_client_is_a_protocol_error(tmp_path, marker):
    for mode, said in (("badstatus", "result frame: status 9 (expected 0 ok, 1 error, 2 unsupported or 3 wrong size)"),
                       ("badflags", "result frame: flags 0x4 (expected a combination of 1 weights and 2 LSE)")):
        r = run(["check", "--impl", f"exec:{PYTHON} {CLIENT} {mode}", "--property", "row-stochastic", "--cases", "5",
                 "--dtype", "float64", "--no-corpus", "--report-dir", tmp_path / mode], tmp_path)
        assert r.rc == 1, r
        assert "protocol error: " in r.out and said in r.out, r


def test_a_reply_with_more_values_than_its_shapes_is_a_protocol_error(tmp_path, marker):
    # The exec side of a write past a buffer: values beyond the shapes a reply announces are never read as data.
    r = run(["check", "--impl", f"exec:{PYTHON} {CLIENT} extravalues", "--property", "row-stochastic", "--cases", "5",
             "--dtype", "float64", "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "protocol error: " in r.out and "result frame: 8 bytes left over" in r.out, r


def test_a_call_answered_twice_is_a_protocol_error_not_a_counterexample(tmp_path, marker):
    r = run(["check", "--impl", f"exec:{PYTHON} {CLIENT} twice", "--property", "row-stochastic,zero-future-weight",
             "--cases", "20", "--dtype", "float64", "--no-corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for law in summary["laws"]:
        assert law["status"] == "falsified", summary
    # Every falsification is the protocol error, never a law's own comparison of a stale answer.
    assert r.out.count("protocol error: ") >= 2, r
    assert "wrong size" not in r.out and "should be" not in r.out and "but was" not in r.out, r
    assert "answer nobody asked for" in r.out or "sent more than one frame" in r.out, r


def test_sigint_while_an_exec_client_starts_exits_130(tmp_path, marker):
    p = subprocess.Popen([ATTNCHECK, "check", "--impl", f"exec:{PYTHON} {CLIENT} slowstart", "--no-corpus",
                          "--report-dir", str(tmp_path / "r")], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while len(processes_with(marker)) < 3 and time.monotonic() < deadline:  # attncheck, guard, client
            time.sleep(0.05)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, (out, err)
    assert "interrupted while starting the implementation" in err, err
    assert not (tmp_path / "r" / "summary.json").exists()


def test_a_handshake_timeout_promises_no_later_call(tmp_path, marker):
    r = run(["check", "--impl", f"exec:{PYTHON} {CLIENT} slowstart", "--timeout", "1", "--no-corpus",
             "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 2, r
    assert "no answer within 1 s before finishing the handshake; the process was killed" in r.err, r
    assert "later call" not in r.err, r
    assert not (tmp_path / "r" / "summary.json").exists()
