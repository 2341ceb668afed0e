"""The CI recipes in this folder, run here as far as this machine allows: each YAML parses and is wired as its
comments say (shards as many as the shard count, uploads and the merge after a falsifying shard, the merge
sequenced after the shards); each shard's script runs with the scheduler's variables set, one index after the
other, against a mutant that falsifies laws (every shard's step still succeeds) and against a plug-in that does
not exist (the step fails); the merge's verdict and laws equal a single run's; the shared corpus the shards wrote
is replayed by the next run's shards."""
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
FALSIFIED = "mutant:mask-zero"


@pytest.fixture
def env(tmp_path):
    """attncheck on PATH, as the recipes call it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(os.environ["ATTNCHECK"], bin_dir / "attncheck")
    return dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]))


def sh(script, env, cwd, shell="bash"):
    return subprocess.run([shell, "-c", script], env=env, cwd=cwd, capture_output=True, text=True)


def statuses(summary_json):
    with open(summary_json) as f:
        return {law["law"]: law["status"] for law in json.load(f)["laws"]}


def single_run(impl, env, tmp_path):
    """What one unsharded run of `impl` says: its exit code and each law's status."""
    out = tmp_path / ("single-" + re.sub(r"\W", "-", impl))
    run = subprocess.run(["attncheck", "check", "--impl", impl, "--report-dir", str(out), "--no-corpus"], env=env,
                         capture_output=True, text=True)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    return run.returncode, statuses(out / "summary.json")


def load(name):
    with open(os.path.join(HERE, name)) as f:
        return list(yaml.safe_load_all(f))


def test_github_actions_workflow(env, tmp_path):
    (wf,) = load("github-actions.yml")
    shards_job, merge_job = wf["jobs"]["shards"], wf["jobs"]["merge"]
    matrix = shards_job["strategy"]["matrix"]["shard"]
    assert matrix == list(range(int(wf["env"]["SHARDS"]))), "the matrix lists every shard, 0 .. SHARDS-1"
    assert shards_job["strategy"]["fail-fast"] is False
    step = {s.get("name") or s.get("uses"): s for s in shards_job["steps"]}
    assert step["actions/upload-artifact@v4"]["if"] == "always()", "a falsifying shard still uploads"
    assert merge_job["needs"] == "shards" and merge_job["if"] == "always()", "the merge runs after every shard"
    merge_steps = {s.get("name") or s.get("uses"): s for s in merge_job["steps"]}
    check, merge = step["check shard"]["run"], merge_steps["merge"]["run"]

    def run_workflow(impl, work, cache):
        """The shard steps one matrix entry after the other (the cache restored into each), the artifacts as
        download-artifact lays them out, then the merge step; the cache it saves."""
        e = dict(env, IMPL=impl, SHARDS=str(wf["env"]["SHARDS"]))
        outputs = []
        for shard in matrix:
            job = work / ("job-%d" % shard)
            job.mkdir(parents=True)
            if cache.exists():
                shutil.copytree(cache, job / "corpus")
            r = sh(check.replace("${{ matrix.shard }}", str(shard)), e, job)
            outputs.append(r)
            if r.returncode != 0:
                return outputs, None
            artifact = work / "merge" / "artifacts" / ("shard-%d" % shard)
            for part in ("shard-%d" % shard, "corpus-%d" % shard):
                shutil.copytree(job / part, artifact / part)
        m = sh(merge, e, work / "merge")
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(work / "merge" / "corpus", cache)
        return outputs, m

    cache = tmp_path / "cache"
    for impl in ("reference", FALSIFIED):
        code, laws = single_run(impl, env, tmp_path)
        outputs, m = run_workflow(impl, tmp_path / ("run-" + impl.replace(":", "-")), cache)
        assert [r.returncode for r in outputs] == [0] * len(matrix), [r.stdout + r.stderr for r in outputs]
        assert m.returncode == code, m.stdout + m.stderr
        assert statuses(tmp_path / ("run-" + impl.replace(":", "-")) / "merge" / "report" / "summary.json") == laws
    assert any(cache.rglob("*.json")), "the merge saved the failing cases for the next run"
    again, m = run_workflow(FALSIFIED, tmp_path / "again", cache)
    assert m.returncode == 1
    assert any("(corpus)" in r.stdout for r in again), "the next run's shards replay the shared corpus first"
    broken, m = run_workflow("plugin:" + str(tmp_path / "no-such.so"), tmp_path / "broken", cache)
    assert broken[0].returncode != 0 and m is None, "a shard that cannot run fails its step"


def test_slurm_array_and_merge(env, tmp_path):
    shards = open(os.path.join(HERE, "slurm-shards.sbatch")).read()
    first, last = map(int, re.search(r"^#SBATCH --array=(\d+)-(\d+)$", shards, re.M).groups())
    count = last - first + 1
    for impl in ("reference", FALSIFIED):
        out = tmp_path / impl.replace(":", "-")
        e = dict(env, IMPL=impl, OUT=str(out), SLURM_ARRAY_TASK_COUNT=str(count))
        for task in range(first, last + 1):
            r = subprocess.run(["bash", os.path.join(HERE, "slurm-shards.sbatch")],
                               env=dict(e, SLURM_ARRAY_TASK_ID=str(task)), capture_output=True, text=True)
            assert r.returncode == 0, r.stdout + r.stderr
        m = subprocess.run(["bash", os.path.join(HERE, "slurm-merge.sbatch")], env=e, capture_output=True, text=True)
        code, laws = single_run(impl, env, tmp_path)
        assert m.returncode == code, m.stdout + m.stderr
        assert statuses(out / "report" / "summary.json") == laws
    bad = subprocess.run(["bash", os.path.join(HERE, "slurm-shards.sbatch")], capture_output=True, text=True,
                         env=dict(env, IMPL="plugin:/no/such.so", OUT=str(tmp_path / "bad"), SLURM_ARRAY_TASK_ID="0",
                                  SLURM_ARRAY_TASK_COUNT="2"))
    assert bad.returncode == 2, bad.stdout + bad.stderr

    # The submission sequences the merge after the whole array, whatever each task's exit (afterany).
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "sbatch").write_text('#!/bin/sh\necho "$@" >> "$SBATCH_LOG"\necho "4242;cluster"\n')
    (fake / "sbatch").chmod(0o755)
    log = tmp_path / "sbatch.log"
    s = subprocess.run(["bash", os.path.join(HERE, "slurm-submit.sh")], capture_output=True, text=True,
                       env=dict(env, PATH="%s:%s" % (fake, env["PATH"]), SBATCH_LOG=str(log), IMPL=FALSIFIED,
                                OUT=str(tmp_path / "submitted")))
    assert s.returncode == 0, s.stdout + s.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and calls[0].endswith("slurm-shards.sbatch"), calls
    assert "--dependency=afterany:4242" in calls[1] and calls[1].endswith("slurm-merge.sbatch"), calls


def test_kubernetes_indexed_job_and_merge(env, tmp_path):
    (job,) = load("k8s-shards.yaml")
    (merge_job,) = load("k8s-merge.yaml")
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    variables = {v["name"]: v["value"] for v in container["env"]}
    assert spec["completionMode"] == "Indexed" and spec["completions"] == int(variables["SHARDS"])
    assert pod["restartPolicy"] == "Never", "podFailurePolicy needs it"
    (rule,) = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and sorted(rule["onExitCodes"]["values"]) == [2, 4]
    assert container["command"][:2] == ["sh", "-c"], "JOB_COMPLETION_INDEX expands only in a shell"
    assert merge_job["spec"]["backoffLimit"] == 0
    shard_script = container["command"][2]
    (merge_container,) = merge_job["spec"]["template"]["spec"]["containers"]
    merge_script = merge_container["command"][2]
    for impl in ("reference", FALSIFIED):
        shared = tmp_path / impl.replace(":", "-")
        shared.mkdir()
        e = dict(env, **dict(variables, IMPL=impl))
        for index in range(spec["completions"]):
            r = sh(shard_script.replace("/shared", str(shared)), dict(e, JOB_COMPLETION_INDEX=str(index)), shared,
                   shell="sh")
            assert r.returncode == 0, r.stdout + r.stderr  # exit 1 of attncheck is not a pod failure
        m = sh(merge_script.replace("/shared", str(shared)), e, shared, shell="sh")
        code, laws = single_run(impl, env, tmp_path)
        assert m.returncode == code, m.stdout + m.stderr
        assert statuses(shared / "report" / "summary.json") == laws
    bad = sh(shard_script.replace("/shared", str(tmp_path / "bad")),
             dict(env, **dict(variables, IMPL="plugin:/no/such.so", JOB_COMPLETION_INDEX="0")), tmp_path, shell="sh")
    assert bad.returncode == 2, "a configuration error fails the pod, and the Job at once: " + bad.stdout + bad.stderr
