"""Report folders: the same command twice gives the same result; a folder is checked and locked before the
first law runs (a file, an unwritable path, another run's lock, another implementation's report all fail at
once with exit 2); a run killed at any moment leaves the old report or the new one, never a mix, and what
it left half-written is cleaned up by the next run."""
import json
import random
import signal
import subprocess
import time

from conftest import ATTNCHECK, bad_plugin, run


def test_same_command_twice_exits_1_both_times_on_a_falsified_implementation(tmp_path, marker):
    first = run(["check", "--impl", "mutant:mask-zero"], tmp_path)
    second = run(["check", "--impl", "mutant:mask-zero"], tmp_path)
    assert first.rc == 1 and second.rc == 1, (first, second)
    assert "(unchanged)" in second.out, second
    report = json.loads((tmp_path / "attncheck-reports/mutant-mask-zero/zero-future-weight.json").read_text())
    assert report["calls"] > 0  # the corpus replay of the second run keeps the figures of the first


def test_same_command_twice_exits_0_both_times_on_a_correct_implementation(tmp_path, marker):
    for _ in range(2):
        r = run(["check", "--impl", "reference", "--cases", "10"], tmp_path)
        assert r.rc == 0, r


def test_rerun_after_a_fix_replaces_its_own_report_without_force(tmp_path, marker):
    # The same implementation name, first buggy then fixed: a user re-checking a plug-in after a fix.
    lib = tmp_path / "libmine.so"
    lib.symlink_to(bad_plugin("wrong_size"))
    args = ["check", "--impl", f"plugin:{lib}", "--property", "oracle-agreement", "--cases", "10", "--no-corpus",
            "--report-dir", tmp_path / "r"]
    assert run(args, tmp_path).rc == 1
    lib.unlink()
    lib.symlink_to(bad_plugin("error"))  # correct at D % 4 == 0 only: a different report, same implementation
    r = run(args, tmp_path)
    assert r.rc == 1 and "already holds" not in r.err, r


def test_another_implementations_report_is_refused_before_any_law_runs(tmp_path, marker):
    assert run(["check", "--impl", "mutant:mask-zero", "--report-dir", tmp_path / "r", "--cases", "5"], tmp_path).rc == 1
    r = run(["check", "--impl", "reference", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 2, r
    assert "already holds the report of mutant:mask-zero" in r.err and "--force" in r.err, r
    assert "row-stochastic" not in r.out, r  # no law ran
    assert run(["check", "--impl", "reference", "--report-dir", tmp_path / "r", "--cases", "5", "--force"],
               tmp_path).rc == 0
    assert (tmp_path / "r" / "corpus" / "mutant-mask-zero").is_dir()  # the corpus inside is carried over
    assert not (tmp_path / "r" / "zero-future-weight.json").exists()  # the old report's files are gone


def test_a_file_in_place_of_the_report_folder_is_refused_before_any_law_runs(tmp_path, marker):
    (tmp_path / "r").write_text("not a folder")
    r = run(["check", "--impl", "reference", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 2, r
    assert "is not a folder" in r.err and "row-stochastic" not in r.out, r
    assert (tmp_path / "r").read_text() == "not a folder"


def test_an_unwritable_report_folder_is_refused_before_any_law_runs(tmp_path, marker):
    r = run(["check", "--impl", "reference", "--report-dir", "/proc/attncheck-cannot-write-here"], tmp_path)
    assert r.rc == 2, r
    assert "cannot use /proc/attncheck-cannot-write-here as the report folder" in r.err, r
    assert "row-stochastic" not in r.out, r


def test_a_second_run_into_a_held_folder_fails_at_once_naming_the_first(tmp_path, marker):
    spec = f"plugin:{bad_plugin('hang')}"
    first = subprocess.Popen([ATTNCHECK, "check", "--impl", spec, "--timeout", "600", "--no-corpus",
                              "--report-dir", str(tmp_path / "r")], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        lock = tmp_path / "r" / ".attncheck-lock"
        deadline = time.monotonic() + 20
        while not (lock.exists() and str(first.pid) in lock.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = run(["check", "--impl", "reference", "--report-dir", tmp_path / "r"], tmp_path)
        assert r.rc == 2, r
        assert f"is in use by attncheck (pid {first.pid}, checking {spec})" in r.err, r
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=20)


def test_a_run_killed_at_any_moment_leaves_one_whole_report(tmp_path, marker):
    # Two implementations take turns writing one folder (--force) and are killed at random moments: after
    # each kill every report file there belongs to one run, and the next run cleans up what was left.
    folder = tmp_path / "r"
    rng = random.Random(20)
    impls = ["mutant:mask-zero", "mutant:look-ahead"]
    laws = "zero-future-weight,row-stochastic,oracle-agreement,causal-perturbation"
    for n in range(24):
        impl = impls[n % 2]
        p = subprocess.Popen([ATTNCHECK, "check", "--impl", impl, "--property", laws, "--report-dir", str(folder),
                              "--force", "--no-corpus"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, 0.12))
        p.kill()
        p.wait()
        if not (folder / "summary.json").exists():
            continue
        owner = json.loads((folder / "summary.json").read_text())["implementation"]
        for f in folder.glob("*.json"):
            assert json.loads(f.read_text())["implementation"] == owner, f"{f} mixes runs (after kill {n})"
    r = run(["check", "--impl", impls[0], "--property", laws, "--report-dir", folder, "--force", "--no-corpus"],
            tmp_path)
    assert r.rc == 1, r
    leftovers = [f.name for f in folder.iterdir() if ".tmp-" in f.name]
    leftovers += [f.name for f in tmp_path.iterdir() if ".staging-" in f.name]
    assert not leftovers, leftovers


def test_two_runs_sharing_one_corpus_at_once_lose_no_entry(tmp_path, marker):
    # A shared corpus (a directory on a shared disk, or a CI artifact) is written by several runs at once: its
    # entries are content-addressed (<law>-<case hash>.json) and written atomically, so two runs at once leave
    # exactly the entries the two runs leave one after the other, each whole. (A case both seeds found is kept
    # as whichever run wrote it first: each entry equals one of the two.)
    def args(seed, corpus, reports):
        return ["check", "--impl", "mutant:mask-zero", "--cases", "30", "--seed", str(seed), "--corpus", corpus,
                "--report-dir", reports]

    candidates = {}
    for seed in (1, 2):
        alone = tmp_path / f"alone-{seed}"
        r = run(args(seed, alone, tmp_path / f"r-alone-{seed}"), tmp_path)
        assert r.rc == 1, r
        for f in (alone / "mutant-mask-zero").iterdir():
            # The entry names its own path in its replay command: as it would be in the shared folder.
            text = f.read_bytes().replace(str(alone).encode(), str(tmp_path / "shared").encode())
            candidates.setdefault(f.name, []).append(text)
    assert len(candidates) >= 10, sorted(candidates)
    procs = [subprocess.Popen([ATTNCHECK, *map(str, args(seed, tmp_path / "shared", tmp_path / f"r-{seed}"))],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for seed in (1, 2)]
    assert [p.wait(timeout=120) for p in procs] == [1, 1]
    shared = {f.name: f.read_bytes() for f in (tmp_path / "shared" / "mutant-mask-zero").iterdir()}
    assert sorted(shared) == sorted(candidates)
    for name, text in shared.items():
        assert text in candidates[name], name
        json.loads(text)
