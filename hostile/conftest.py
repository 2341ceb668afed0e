"""Fixtures of the hostile suite: the attncheck binary, the misbehaving plug-ins, a scratch folder, and a
check that no process a test started is still alive when it ends."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ATTNCHECK = os.environ.get("ATTNCHECK", "")
PYTHON = os.environ.get("HOSTILE_PYTHON", "/usr/bin/python3")
HERE = Path(__file__).resolve().parent


def bad_plugin(mode):
    """The path of examples/bad_plugins/bad_plugin.c built with BAD_<MODE>."""
    p = Path(os.environ["BAD_PLUGINS"]) / f"libbad_plugin_{mode}.so"
    assert p.exists(), f"{p} is not built"
    return p


class Run:
    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    @property
    def text(self):
        return self.out + self.err

    def __repr__(self):
        return f"exit {self.rc}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def run(args, cwd, timeout=120, env=None, input=None):
    """Runs attncheck ARGS in `cwd`; stdout and stderr decoded leniently (the point is what came out)."""
    assert ATTNCHECK, "ATTNCHECK is not set (run through ctest)"
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([ATTNCHECK, *map(str, args)], cwd=cwd, capture_output=True, timeout=timeout, env=e,
                       input=input)
    return Run(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def processes_with(marker):
    """PIDs of live processes whose command line or environment holds `marker` (zombies excluded)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            stat = (d / "stat").read_text()
            if stat[stat.rindex(")") + 2] == "Z":
                continue
            blob = (d / "cmdline").read_bytes() + b"\0" + (d / "environ").read_bytes()
        except (OSError, ValueError):
            continue
        if marker.encode() in blob:
            found.append(int(d.name))
    return found


def wait_until_gone(marker, seconds=5):
    """Waits up to `seconds` for every process carrying `marker` to end; returns the survivors, killed."""
    deadline = time.monotonic() + seconds
    while True:
        alive = processes_with(marker)
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return alive


@pytest.fixture
def marker(request):
    """A unique string in the environment of everything a test starts: the process table is searched for it
    afterwards, and whatever still carries it fails the test (and is killed)."""
    m = f"ATTNCHECK_HOSTILE_MARKER={request.node.name}-{os.getpid()}-{time.monotonic_ns()}"
    key, value = m.split("=", 1)
    os.environ[key] = value
    yield value
    del os.environ[key]
    survivors = wait_until_gone(value)
    assert not survivors, f"processes outlived the test: {survivors}"
