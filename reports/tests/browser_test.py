#!/usr/bin/env python3
"""Renders the HTML reports of runs with failures in headless Chromium and checks them as a reader sees them.

For each implementation: `attncheck check` writes its reports; every page (index.html and each LAW.html) is
loaded, and must log no console error (a blocked fetch, a script error or a parse problem all log one), and
every <img> and top-level <svg> must decode to a non-zero size. index.html is saved as a screenshot.

Chromium is driven over its DevTools protocol on a pipe (--remote-debugging-pipe: commands on fd 3,
replies on fd 4, NUL-separated JSON), so only the standard library is needed.

An argument campaign:FILE runs `attncheck campaign FILE` instead, and checks its overview page (a table of
laws x runs whose every link resolves to a page that renders cleanly too).

usage: browser_test.py ATTNCHECK_BIN OUT_DIR IMPL|campaign:FILE...
"""
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

TIMEOUT_S = 60

# Every flag that keeps a headless Chromium off the network and out of the user's profile.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-pipe", "--hide-scrollbars", "--window-size=1280,900",
]

# What the test measures in the page (the pages themselves hold no script).
MEASURE = """JSON.stringify({
  title: document.title,
  tables: document.querySelectorAll('table').length,
  links: Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href')),
  images: Array.from(document.querySelectorAll('img, svg'))
    .filter(e => !(e.parentElement && e.parentElement.closest('svg')))
    .map(e => { const r = e.getBoundingClientRect();
                return {tag: e.tagName, width: r.width, height: r.height,
                        decoded: e.tagName !== 'IMG' || (e.complete && e.naturalWidth > 0)}; })
})"""


class Browser:
    def __init__(self, chromium, profile):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def wire_fds():
            # Copies above 10 first, so neither end is overwritten by the other's dup2 whatever their numbers.
            high_r, high_w = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     preexec_fn=wire_fds, close_fds=False)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def send(self, method, params=None, session=True):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self.receive()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def receive(self):
        deadline = time.monotonic() + TIMEOUT_S
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_child], [], [], left)[0]:
                raise TimeoutError("no reply from chromium within %d s" % TIMEOUT_S)
            chunk = os.read(self.from_child, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe (exit code %s)" % self.proc.poll())
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_for(self, method):
        for n, event in enumerate(self.events):
            if event.get("method") == method:
                del self.events[n]
                return event
        while True:
            event = self.receive()
            if event.get("method") == method:
                return event
            self.events.append(event)

    def close(self):
        try:
            self.send("Browser.close", session=False)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def errors_in(events):
    """Console errors, uncaught exceptions and browser log errors (blocked loads, policy violations)."""
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + params["exceptionDetails"].get("text", ""))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            out.append("log: " + params["entry"].get("text", ""))
    return out


def check_page(browser, path, screenshot=None):
    """Loads one page; returns a list of problems (empty when it renders cleanly)."""
    browser.events.clear()
    browser.send("Page.navigate", {"url": "file://" + os.path.abspath(path)})
    browser.wait_for("Page.loadEventFired")
    measured = json.loads(browser.send("Runtime.evaluate", {"expression": MEASURE, "returnByValue": True})
                          ["result"]["value"])
    problems = errors_in(browser.events)
    if not measured["title"]:
        problems.append("the page has no title")
    if measured["tables"] == 0:
        problems.append("the page has no table")
    for n, image in enumerate(measured["images"]):
        if not (image["width"] > 0 and image["height"] > 0 and image["decoded"]):
            problems.append("%s #%d has size %gx%g (decoded: %s)" % (image["tag"], n, image["width"],
                                                                     image["height"], image["decoded"]))
    if screenshot:
        size = browser.send("Page.getLayoutMetrics")["cssContentSize"]
        shot = browser.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
    return problems, measured


def check_campaign(browser, attncheck, campaign, out_dir):
    """Runs a campaign; its overview must render cleanly, link every run, and each falsified cell's link must
    lead to a law page that renders cleanly too."""
    failures = []
    report = os.path.join(out_dir, "campaign")
    run = subprocess.run([attncheck, "campaign", campaign, "--report-dir", report, "--no-corpus", "--force"],
                         capture_output=True, text=True)
    if run.returncode != 1:
        return [f"campaign {campaign}: exited {run.returncode}, expected 1 (a mutant falsified)\n" + run.stdout + run.stderr]
    problems, measured = check_page(browser, os.path.join(report, "index.html"),
                                    os.path.join(out_dir, "campaign.png"))
    failures += ["campaign index.html: " + p for p in problems]
    links = [l for l in measured["links"] if l]
    runs = [l for l in links if l.endswith("/index.html")]
    cells = [l for l in links if not l.endswith("/index.html")]
    print(f"campaign index.html: {len(runs)} runs, {len(cells)} falsified cells, {len(problems)} problems")
    if len(runs) < 2 or not cells:
        failures.append(f"campaign index.html links {len(runs)} runs and {len(cells)} falsified cells")
    for link in runs[:1] + cells[:3]:
        target = os.path.join(report, link)
        if not os.path.exists(target):
            failures.append(f"campaign index.html links {link}, which does not exist")
            continue
        problems, _ = check_page(browser, target)
        failures += [f"campaign {link}: {p}" for p in problems]
    return failures


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    attncheck, out_dir, impls = sys.argv[1], sys.argv[2], sys.argv[3:]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("browser_test: chromium is not installed; scripts/setup.sh installs Debian's chromium package")
    os.makedirs(out_dir, exist_ok=True)
    failures = []
    with tempfile.TemporaryDirectory(prefix="attncheck-chromium-") as profile:
        browser = Browser(chromium, profile)
        try:
            target = browser.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
            browser.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                           session=False)["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                browser.send(domain + ".enable")
            # Negative control: a page with a missing image and a console error must be caught, or the checks
            # below prove nothing.
            broken = os.path.join(out_dir, "broken-control.html")
            with open(broken, "w") as f:
                f.write("<!DOCTYPE html><title>broken</title><table></table><img src=\"no-such-picture.png\">"
                        "<script>console.error('planted error')</script>")
            planted, _ = check_page(browser, broken)
            if not any("planted error" in p for p in planted) or not any("IMG" in p for p in planted):
                failures.append("the negative control went unnoticed: " + repr(planted))
            for impl in impls:
                if impl.startswith("campaign:"):
                    failures += check_campaign(browser, attncheck, impl[len("campaign:"):], out_dir)
                    continue
                report = os.path.join(out_dir, impl.replace(":", "-"))
                run = subprocess.run([attncheck, "check", "--impl", impl, "--report-dir", report, "--no-corpus",
                                      "--force"], capture_output=True, text=True)
                if run.returncode != 1:
                    failures.append(f"{impl}: attncheck check exited {run.returncode}, expected 1 (falsified)\n"
                                    + run.stdout + run.stderr)
                    continue
                pages = ["index.html"] + sorted(p for p in os.listdir(report)
                                                if p.endswith(".html") and p != "index.html")
                for page in pages:
                    shot = os.path.join(out_dir, impl.replace(":", "-") + ".png") if page == "index.html" else None
                    problems, measured = check_page(browser, os.path.join(report, page), shot)
                    svgs = sum(1 for i in measured["images"] if i["tag"] == "svg")
                    print(f"{impl} {page}: {svgs} pictures, {len(problems)} problems")
                    if page == "index.html" and svgs == 0:
                        problems.append("the index of a run with failures shows no picture")
                    failures += [f"{impl} {page}: {p}" for p in problems]
                if len(pages) < 2:
                    failures.append(f"{impl}: no law page was written beside index.html")
        finally:
            browser.close()
    for f in failures:
        print("FAIL " + f)
    print("screenshots in " + out_dir)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
