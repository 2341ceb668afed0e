"""Files are data: every file attncheck reads (a shard, a campaign file, a cell's summary, a corpus entry, the
GoogleTest status file) is checked to be a regular file under a size limit before it is read, so a FIFO, a
device or a huge file is a prompt exit 2, never a hang or an exhausted memory; names read from files are
validated before they become paths; what a shard says is checked before it becomes the merged verdict; `merge`
never writes into its own inputs; a campaign file starts no program unless the command line allows it, and is
validated whole before its first run; a corpus that cannot be written costs a warning, never the verdict."""
import json
import os
import time
from pathlib import Path

import pytest

from conftest import bad_plugin, run

# Long enough for a hang to show as one, short enough for the suite: every refusal here takes milliseconds.
PROMPT = 5


def prompt(args, cwd, env=None):
    """Runs attncheck and asserts it ended within PROMPT seconds (a FIFO would otherwise hang it)."""
    start = time.monotonic()
    r = run(args, cwd, timeout=60, env=env)
    assert time.monotonic() - start < PROMPT, ("not prompt", r)
    return r


def refused(r, *says):
    assert r.rc == 2, r
    for s in says:
        assert s in r.err, (s, r)
    assert "internal error" not in r.text, r


def tree(root):
    """Every path under root, relative, as a sorted list (what is on disk)."""
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


def not_data(path, kind):
    """Puts a file of the given hostile kind at `path`; returns what the message must say it is."""
    if kind == "fifo":
        os.mkfifo(path)
        return "it is a FIFO (named pipe), not a regular file"
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
        return "it is a character device, not a regular file"
    if kind == "folder":
        os.mkdir(path)
        return "it is a folder, not a regular file"
    if kind == "loop":
        os.symlink(path, path)
        return "a loop of symbolic links"
    assert kind.startswith("huge-")
    size = int(kind[5:])
    with open(path, "wb") as f:
        f.truncate(size)  # sparse: costs no disk
    return f"it is {size} bytes, above the limit of"


def make_shard(tmp_path, impl="mutant:mask-zero", name="shard"):
    d = tmp_path / name
    r = run(["check", "--impl", impl, "--property", "zero-future-weight,first-position", "--cases", "5",
             "--no-corpus", "--shard", "0/1", "--report-dir", d], tmp_path)
    assert r.rc in (0, 1), r
    return d


def forge(shard, change):
    doc = json.loads((shard / "shard.json").read_text())
    change(doc)
    (shard / "shard.json").write_text(json.dumps(doc))


def test_merge_refuses_a_forged_law_name_and_writes_nothing_outside_out(tmp_path, marker):
    shard = make_shard(tmp_path)

    def pwn(doc):
        law = doc["reports"][0]["law"]
        doc["laws"][doc["laws"].index(law)] = "../../PWNED"
        doc["reports"][0]["law"] = "../../PWNED"
    forge(shard, pwn)
    (tmp_path / "a" / "b").mkdir(parents=True)
    before = tree(tmp_path)
    r = prompt(["merge", "--out", tmp_path / "a" / "b" / "merged", shard], tmp_path)
    refused(r, str(shard / "shard.json"), '"laws[0]"', '"../../PWNED"', "expected the name of a law of this build")
    assert tree(tmp_path) == before, "merge wrote files"
    assert not [p for p in tmp_path.rglob("*PWNED*")]


@pytest.mark.parametrize("forgery,says", [
    (lambda r: r.update(violation=None, minimal_case=None),
     ['"status" is "falsified" but "violation" is null', "expected a falsified law to come with the violation"]),
    (lambda r: r.update(status="held"), ['"status" is "held" but it holds a violation', "expected \"violation\""]),
    (lambda r: r.update(status="held", violation=None, minimal_case=None, cases_run=10 ** 6),
     ['"cases_run" 1000000', "expected at most the run's 5 cases per law"]),
    (lambda r: r.update(timeouts=10 ** 6), ['"timeouts" is 1000000', "expected at most one timeout per call"]),
    (lambda r: r.update(implementation="reference"), ['"implementation" is "reference"', "expected the run's"]),
])
def test_merge_refuses_a_shard_whose_verdicts_do_not_add_up(tmp_path, marker, forgery, says):
    shard = make_shard(tmp_path)

    def change(doc):
        falsified = [r for r in doc["reports"] if r["status"] == "falsified"]
        assert falsified, doc["reports"]
        forgery(falsified[0])
    forge(shard, change)
    out = tmp_path / "merged"
    r = prompt(["merge", "--out", out, shard], tmp_path)
    refused(r, str(shard / "shard.json"), '"reports[', *says)
    assert not out.exists()


@pytest.mark.parametrize("how", ["itself", "parent", "symlink"])
def test_merge_into_one_of_its_inputs_is_refused_and_the_shard_is_kept(tmp_path, marker, how):
    shards = tmp_path / "shards"
    shards.mkdir()
    shard = make_shard(shards)
    before = {p: p.read_bytes() for p in shard.iterdir() if p.is_file()}
    out = {"itself": shard, "parent": shards, "symlink": tmp_path / "link"}[how]
    if how == "symlink":
        out.symlink_to(shard)
    r = prompt(["merge", "--out", out, shard], tmp_path)
    refused(r, f"--out {out}", "holds the shard folder" if how == "parent" else "is the shard folder", str(shard),
            "expected a folder apart from every shard")
    assert {p: p.read_bytes() for p in shard.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in shards.iterdir()) == ["shard"]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", f"huge-{256 * 2 ** 20 + 1}"])
def test_merge_refuses_a_shard_json_that_is_not_data_promptly(tmp_path, marker, kind):
    shard = tmp_path / "shard"
    shard.mkdir()
    says = not_data(shard / "shard.json", kind)
    out = tmp_path / "merged"
    r = prompt(["merge", "--out", out, shard], tmp_path)
    refused(r, str(shard / "shard.json"), says, "expected the shard.json that `attncheck check --shard I/N` writes")
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", f"huge-{16 * 2 ** 20 + 1}"])
def test_campaign_file_that_is_not_data_is_refused_promptly(tmp_path, marker, kind):
    says = not_data(tmp_path / "c.json", kind)
    r = prompt(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r"], tmp_path)
    refused(r, str(tmp_path / "c.json"), says, "expected a campaign file (JSON)")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", f"huge-{16 * 2 ** 20 + 1}"])
def test_overview_of_a_cell_summary_that_is_not_data_is_refused_promptly(tmp_path, marker, kind):
    (tmp_path / "c.json").write_text(json.dumps({"implementations": ["reference"]}))
    cell = tmp_path / "r" / "reference-float32-seed1"
    cell.mkdir(parents=True)
    says = not_data(cell / "summary.json", kind)
    r = prompt(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r", "--overview-only"], tmp_path)
    refused(r, str(cell / "summary.json"), says, "expected the summary.json that `attncheck check` writes")
    assert not (tmp_path / "r" / "overview.md").exists()


def test_overview_refuses_a_forged_law_name_in_a_cell_summary(tmp_path, marker):
    (tmp_path / "c.json").write_text(json.dumps({"implementations": ["mutant:mask-zero"]}))
    cell = tmp_path / "r" / "mutant-mask-zero-float32-seed1"
    cell.mkdir(parents=True)
    (cell / "summary.json").write_text(json.dumps({"laws": [{"law": "../../../PWNED", "status": "falsified"}]}))
    r = prompt(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r", "--overview-only"], tmp_path)
    refused(r, str(cell / "summary.json"), '"laws[0].law"', '"../../../PWNED"', "expected the name of a law")
    assert not (tmp_path / "r" / "overview.md").exists()


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "loop", f"huge-{256 * 2 ** 20 + 1}"])
def test_corpus_entry_that_is_not_data_is_skipped_promptly_with_a_warning(tmp_path, marker, kind):
    # A corpus is a cache of earlier finds: an entry that cannot be read is skipped, named, and the law is
    # checked by generation as if it were not there (docs/cli.md).
    entry = tmp_path / "corpus" / "mutant-mask-zero" / "zero-future-weight-0123456789ab.json"
    entry.parent.mkdir(parents=True)
    says = not_data(entry, kind)
    r = prompt(["check", "--impl", "mutant:mask-zero", "--property", "zero-future-weight", "--cases", "5",
                "--corpus", tmp_path / "corpus", "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert f"warning: skipping corpus entry {entry}: cannot read {entry}: {says}" in r.err, r
    assert "(corpus)" not in r.out and "internal error" not in r.text, r


@pytest.mark.parametrize("kind", ["fifo", "folder", "dev-zero"])
def test_gtest_shard_status_file_that_is_not_a_file_is_refused_promptly(tmp_path, marker, kind):
    status = tmp_path / "status"
    says = not_data(status, kind)
    r = prompt(["check", "--impl", "reference", "--property", "row-stochastic", "--cases", "2", "--no-corpus",
                "--report-dir", tmp_path / "r"], tmp_path, env={"GTEST_SHARD_STATUS_FILE": str(status)})
    refused(r, "GTEST_SHARD_STATUS_FILE", str(status), says)
    assert not (tmp_path / "r").exists()


def test_gtest_shard_status_file_is_created_and_not_truncated(tmp_path, marker):
    status = tmp_path / "status"
    r = prompt(["check", "--impl", "reference", "--property", "row-stochastic", "--cases", "2", "--no-corpus",
                "--report-dir", tmp_path / "r"], tmp_path, env={"GTEST_SHARD_STATUS_FILE": str(status)})
    assert r.rc == 0, r
    assert status.is_file()
    status.write_text("kept")
    r = prompt(["check", "--impl", "reference", "--property", "row-stochastic", "--cases", "2", "--no-corpus",
                "--report-dir", tmp_path / "r"], tmp_path, env={"GTEST_SHARD_STATUS_FILE": str(status)})
    assert r.rc == 0 and status.read_text() == "kept", r


def test_overview_with_a_file_as_report_dir_is_exit_2(tmp_path, marker):
    (tmp_path / "c.json").write_text(json.dumps({"implementations": ["reference"]}))
    (tmp_path / "r").write_text("not a folder")
    for extra in (["--overview-only"], []):
        r = prompt(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r", *extra], tmp_path)
        refused(r, f"--report-dir {tmp_path / 'r'} exists and is not a folder", "expected a folder")
        assert "[1/" not in r.out, r
        assert (tmp_path / "r").read_text() == "not a folder"


def test_a_corpus_that_is_a_loop_of_links_costs_a_warning_not_the_verdict(tmp_path, marker):
    loop = tmp_path / "corpus"
    loop.symlink_to(loop)
    r = prompt(["check", "--impl", "mutant:mask-zero", "--property", "zero-future-weight", "--cases", "5",
                "--corpus", loop, "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "mutant:mask-zero: 1 of 1 laws falsified" in r.out, r
    assert "warning: the corpus entry was not saved" in r.err and str(loop) in r.err, r
    assert "internal error" not in r.text, r
    assert (tmp_path / "r" / "zero-future-weight.json").exists()


def test_an_unwritable_corpus_costs_a_warning_not_the_verdict(tmp_path, marker):
    # /proc takes no new folders, even from root (the suite may run as root, whom chmod does not stop).
    corpus = "/proc/attncheck-cannot-write-here"
    r = prompt(["check", "--impl", "mutant:mask-zero", "--property", "zero-future-weight", "--cases", "5",
                "--corpus", corpus, "--report-dir", tmp_path / "r"], tmp_path)
    assert r.rc == 1, r
    assert "mutant:mask-zero: 1 of 1 laws falsified" in r.out and "zero-future-weight: " in r.out, r
    assert f"warning: the corpus entry was not saved: cannot create the corpus folder {corpus}" in r.err, r
    assert "later runs will not replay this case" in r.err, r
    assert (tmp_path / "r" / "zero-future-weight.json").exists()


def test_campaign_file_starts_no_program_without_allow_programs(tmp_path, marker):
    pwned = tmp_path / "pwned"
    exec_spec = f"exec:touch {pwned}; true"
    plugin_spec = f"plugin:{bad_plugin('crash')}"
    (tmp_path / "c.json").write_text(json.dumps({"implementations": ["reference", exec_spec, plugin_spec],
                                                 "options": {"cases": 1, "properties": ["row-stochastic"]}}))
    r = prompt(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r"], tmp_path)
    refused(r, json.dumps(exec_spec), json.dumps(plugin_spec), "--allow-programs", "nothing was run")
    time.sleep(0.2)
    assert not pwned.exists()
    assert not (tmp_path / "r").exists() and "[1/" not in r.out, r
    # Said on the command line, the programs run (this one is no attncheck client: it ends before the handshake).
    (tmp_path / "c.json").write_text(json.dumps({"implementations": [exec_spec],
                                                 "options": {"cases": 1, "properties": ["row-stochastic"]}}))
    r = run(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r", "--allow-programs", "--no-corpus"],
            tmp_path)
    assert r.rc == 2 and "before finishing the handshake" in r.err, r
    assert pwned.exists()


@pytest.mark.parametrize("campaign,says", [
    ({"implementations": ["reference", "mutant:no-such-kernel"]},
     ['"implementations" holds "mutant:no-such-kernel"', "expected reference, mutant:NAME"]),
    ({"implementations": ["reference", "reference"]}, ['implementations: "reference" is listed twice', "expected each once"]),
    ({"implementations": ["reference"], "dtypes": ["float32", "float32"]}, ['dtypes: "float32" is listed twice']),
    ({"implementations": ["reference"], "seeds": [3, 3]}, ["seeds: 3 is listed twice"]),
    ({"implementations": ["reference", "exec:true x", "exec:true-x"]},
     ['"exec:true x" and "exec:true-x" would share the report folder exec-true-x', "expected implementations whose"]),
    ({"implementations": ["reference"], "options": {"properties": ["row-stochastic", "no-such-law"]}},
     ['"options.properties[1]" is "no-such-law"', "expected the name of a law of this build"]),
    ({"implementations": ["reference", "bad\nname"]}, ['"implementations[1]" is "bad\\nname"', "on one line"]),
])
def test_campaign_is_validated_whole_before_its_first_run(tmp_path, marker, campaign, says):
    (tmp_path / "c.json").write_text(json.dumps(dict(campaign, options=campaign.get("options", {"cases": 1}))))
    r = prompt(["campaign", tmp_path / "c.json", "--report-dir", tmp_path / "r", "--allow-programs"], tmp_path)
    refused(r, str(tmp_path / "c.json"), *says)
    assert "[1/" not in r.out, r  # no run started
    assert not (tmp_path / "r").exists()
