"""The HTML report (``grpo-cli report``, ``check --format html``): one self-contained file
under 2 MB (its inline explorer: tests/test_run_html.py), rendered by a real headless
Chromium (Debian's ``chromium``) driven over the
DevTools protocol: the page loads with no console error, no exception and no failed
request, its summary holds the numbers, and its screenshot is a real page. The tokens'
colours carry each token's KL as computed here independently from the file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from .conftest import SAMPLE, Cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("GRPO_CLI_REQUIRE_EXTRAS"),
    reason="no chromium (apt-get install chromium)",
)


def _with_text(path: Path) -> Path:
    """The sample batch with a prompt, a completion and the tokens' strings per answer
    (characters HTML must escape among them)."""
    t = pq.read_table(SAMPLE / "batch.parquet")
    rng = np.random.default_rng(7)
    words = ["the", "answer", "is", "<b>", "&", "'", '"', "x", "=", "4", "\n"]
    toks = [[words[rng.integers(len(words))] + " " for _ in range(len(lp))]
            for lp in t.column("logp").to_pylist()]  # fmt: skip
    t = t.append_column("completion", pa.array(["".join(x) for x in toks]))
    t = t.append_column("prompt", pa.array([f"Solve <{g}>" for g in t.column("group").to_pylist()]))
    t = t.append_column("tokens", pa.array(toks))
    pq.write_table(t, path)
    return path


def test_report_is_one_self_contained_file(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    r = cli("report", SAMPLE / "batch.parquet", "--html", out)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "" and f"wrote {out}" in r.stderr
    html = out.read_text()
    assert out.stat().st_size < 2 * 2**20
    assert "<link" not in html and " src=" not in html
    # the explorer's data block and its script, both inline (tests/test_run_html.py)
    assert html.count("<script") == 2 and "<script type=application/json id=page-data>" in html
    # the only URL is SVG's namespace, which is never fetched
    assert set(re.findall(r"https?://[^\s'\"<>]+", html)) <= {"http://www.w3.org/2000/svg"}
    doc = cli.json("objective", SAMPLE / "batch.parquet")
    assert "-2.311e-4" in html and f"{doc['counts']['tokens']:,}" in html
    assert "PASSED" in html and "length-bias" in html


def test_tokens_are_coloured_by_their_own_kl(cli: Cli, tmp_path: Path) -> None:
    src = _with_text(tmp_path / "t.parquet")
    out = tmp_path / "t.html"
    assert cli("report", src, "--html", out, "--top", "3").exit_code == 0
    html = out.read_text()
    answers = cli.json("answers", src, "--top", "1")["answers"]
    row = pq.read_table(src).slice(answers[0]["row"], 1).to_pylist()[0]
    assert row["completion"].split()[0] in html
    assert "<b>" not in html.split("<body>")[1].replace("<b>", "", 0) or "&lt;b&gt;" in html
    # k3 = exp(d) − d − 1 with d = ref_logp − logp, from the file, token by token
    lp, ref, old = (np.asarray(row[k], dtype=np.float64) for k in ("logp", "ref_logp", "old_logp"))
    d = ref - lp
    k3 = np.exp(d) - d - 1
    first = html.index("<div class=toks>")
    spans = re.findall(r"title='KL ([^ ]+) · log ρ ([^']+)'", html[first:])[: len(lp)]
    assert len(spans) == len(lp)
    got_kl = np.array([float(a) for a, _ in spans])
    got_lr = np.array([float(b) for _, b in spans])
    np.testing.assert_allclose(got_kl, k3, rtol=1e-3, atol=1e-12)
    np.testing.assert_allclose(got_lr, lp - old, rtol=1e-3, atol=1e-12)


def test_report_of_several_steps_has_the_trend(cli: Cli, tmp_path: Path) -> None:
    for step in (1, 2, 3):
        assert cli("sample", tmp_path / f"step_{step}.parquet", "--groups", "4",
                   "--seed", str(step)).exit_code == 0  # fmt: skip
    out = tmp_path / "s.html"
    r = cli("report", *(tmp_path / f"step_{s}.parquet" for s in (1, 2, 3)), "--html", out)
    assert r.exit_code == 0, r.stderr
    assert "Trend over 3 steps" in out.read_text()
    one = tmp_path / "one.html"
    assert cli("report", tmp_path / "step_1.parquet", "--html", one).exit_code == 0
    assert "Trend over" not in one.read_text()


def test_check_writes_the_report_as_a_ci_artifact(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("check", SAMPLE / "broken" / "kl_spike.parquet", "--format", "html")
    assert r.exit_code == 1  # the verdict is check's
    html = (tmp_path / "grpo-cli-report.html").read_text()
    assert "FAILED" in html and "kl-max" in html
    r = cli("check", SAMPLE / "batch.parquet", "--format", "json", "--report-html", "c.html")
    assert r.exit_code == 0 and json.loads(r.stdout)["passed"] is True
    assert "PASSED" in (tmp_path / "c.html").read_text()


# ----------------------------------------------------------------- a real browser
class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4,
    messages separated by NUL), with every console message, exception and log entry
    kept."""

    def __init__(self, profile: Path) -> None:
        import fcntl

        assert CHROMIUM is not None

        def high(fd: int) -> int:  # above 4: the shell's 3<& and 4>& never clobber it
            new = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            os.close(fd)
            return new

        to_r, to_w = map(high, os.pipe())  # we write commands, Chromium reads fd 3
        from_r, from_w = map(high, os.pipe())  # Chromium writes fd 4, we read
        cmd = (f"exec {CHROMIUM} --headless --no-sandbox --disable-gpu --hide-scrollbars "
               f"--remote-debugging-pipe --user-data-dir={profile} --no-first-run "
               f"--window-size=1280,900 about:blank 3<&{to_r} 4>&{from_w}")  # fmt: skip
        # bash: dash refuses file descriptors above 9 in redirections
        self.log = open(os.environ.get("GRPO_CLI_CHROMIUM_LOG", os.devnull), "w")
        self.proc = subprocess.Popen(
            [shutil.which("bash") or "bash", "-c", cmd],
            pass_fds=(to_r, from_w),
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        os.close(to_r)
        os.close(from_w)
        self.w, self.r = os.fdopen(to_w, "wb"), os.fdopen(from_r, "rb")
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session: str | None = None

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if self.session:
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        self.w.flush()
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                assert "error" not in m, m
                result: dict[str, Any] = m["result"]
                return result
            self.events.append(m)

    def wait(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        for e in self.events:
            if e.get("method") == method:
                return e
        while time.monotonic() < end:
            m = self._read()
            self.events.append(m)
            if m.get("method") == method:
                return m
        raise TimeoutError(method)

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self.buf:
            chunk = os.read(self.r.fileno(), 1 << 16)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        out: dict[str, Any] = json.loads(raw)
        return out

    def close(self) -> None:
        try:
            self.session = None
            self.send("Browser.close")
        except (EOFError, OSError, AssertionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.w.close()
        self.r.close()
        self.log.close()


def _render(html: Path, profile: Path, shot: Path) -> tuple[list[dict[str, Any]], str]:
    """Load ``html`` in Chromium: the problems it reported and the summary's text; the
    screenshot is written to ``shot``."""
    import base64

    c = Chromium(profile)
    try:
        target = c.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        c.session = c.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            c.send(f"{domain}.enable")
        c.send("Emulation.setDeviceMetricsOverride",
               {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        c.send("Page.navigate", {"url": html.resolve().as_uri()})
        c.wait("Page.loadEventFired")
        text = c.send(
            "Runtime.evaluate",
            {"expression": "document.querySelector('#summary').innerText", "returnByValue": True},
        )["result"]["value"]
        png = c.send("Page.captureScreenshot", {"format": "png"})["data"]
        shot.write_bytes(base64.b64decode(png))
        problems = [
            e
            for e in c.events
            if e.get("method") in ("Runtime.exceptionThrown", "Network.loadingFailed")
            or (e.get("method") == "Runtime.consoleAPICalled"
                and e["params"]["type"] in ("error", "warning", "assert"))
            or (e.get("method") == "Log.entryAdded"
                and e["params"]["entry"]["level"] in ("error", "warning"))
        ]  # fmt: skip
        return problems, text
    finally:
        c.close()


@needs_chromium
def test_the_page_renders_in_chromium(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert cli("report", _with_text(tmp_path / "t.parquet"), "--html", out).exit_code == 0
    shot = Path(os.environ.get("GRPO_CLI_SCREENSHOT", tmp_path / "shot.png"))
    problems, summary = _render(out, tmp_path / "profile", shot)
    assert problems == []
    assert "PASSED" in summary and "J" in summary and "-2.311e-4" in summary
    from matplotlib import image

    px = image.imread(shot)
    assert px.shape[:2] == (900, 1280)
    # a page, not a blank: text, the badges' colours and the cards' grey
    assert len(np.unique(px.reshape(-1, px.shape[2])[:, :3].round(2), axis=0)) > 50


@needs_chromium
def test_a_broken_page_is_caught() -> None:
    """The browser harness sees a console error and a failed request (it can fail)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "bad.html"
        page.write_text("<div id=summary>x</div><img src='missing.png'>"
                        "<script>console.error('boom')</script>")  # fmt: skip
        problems, _ = _render(page, Path(d) / "profile", Path(d) / "s.png")
    kinds = {p["method"] for p in problems}
    assert "Runtime.consoleAPICalled" in kinds
    assert "Network.loadingFailed" in kinds or "Log.entryAdded" in kinds
