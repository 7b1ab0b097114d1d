"""The page of a run (``report RUN --html``, ``check RUN --report-html``; issue 30): one
self-contained file within its size budget; its trend names the step a run was made to
fail at; its token layers are the file's own numbers (log ρ, δ, k3 KL recomputed here from
the parquet files), its states the clip rule applied by hand, its gradient shares add up
to ``answers``' own; and, in a real headless Chromium (Debian's ``chromium`` driven by
Playwright: the ``[browser]`` extra), a layer switched, a step picked and a slider moved
change what the DOM shows, with no console error, and the page's counterfactual clip
states at another ε are the Python fold's at that ε."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from .conftest import Cli

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_report", ROOT / "bench" / "run_report.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def page_data(html: str) -> dict[str, Any]:
    m = re.search(r"<script type=application/json id=page-data>(.*?)</script>", html, re.S)
    assert m is not None
    out: dict[str, Any] = json.loads(m.group(1))
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six steps of 32 answers (groups of 8, width 40); the reference 2 nats away from step
    4 on, so kl-mean fails first at step 4."""
    root = tmp_path_factory.mktemp("runs") / "exp1"
    return Path(bench.write_run(root, steps=6, answers=32, width=40, bad=4, seed=3))


@pytest.fixture(scope="module")
def page(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out = tmp_path_factory.mktemp("page") / "run.html"
    r = CliRunner().invoke(app, ["report", str(run_dir), "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    assert f"wrote {out}" in r.stderr
    return out


def test_the_page_is_one_file_with_the_first_failing_step(page: Path) -> None:
    html = page.read_text()
    assert "<link" not in html and " src=" not in html
    assert set(re.findall(r"https?://[^\s'\"<>\\]+", html)) <= {"http://www.w3.org/2000/svg"}
    d = page_data(html)
    t = d["trend"]
    assert t["passed"] is False and t["first_failing_step"] == 4
    kl = next(p for p in t["panels"] if p["key"] == "kl_mean")
    assert kl["first"]["kl-mean"]["fail"] == 4 and kl["fail"] == 1.0
    # the drift: k3 of d = ref − logp ≈ −2 is e^−2 + 2 − 1 at the bad steps
    by_step = {r["step"]: r["kl_mean"] for r in t["rows"]}
    assert by_step[3] < 0.05 and abs(by_step[4] - (np.exp(-2) + 1)) < 0.05
    assert [s["step"] for s in d["steps"]] == [1, 2, 3, 4, 5, 6]
    for s in d["steps"]:
        assert s["groups"] and any(g["zero_variance"] for g in s["groups"])


def test_layers_are_the_files_own_numbers(page: Path, run_dir: Path) -> None:
    d = page_data(page.read_text())
    st = d["steps"][3]
    t = pq.read_table(run_dir / "step_000004" / "rank000-mb000.parquet").to_pylist()
    eps = d["settings"]["clip_eps"]
    seen = 0
    for g in st["groups"]:
        rewards = [a["reward"] for a in g["answers"]]
        assert g["mean"] == pytest.approx(np.mean(rewards), abs=1e-3)
        # TRL's preset: the sample std (torch.std, ddof 1)
        assert g["std"] == pytest.approx(np.std(rewards, ddof=1), rel=1e-3, abs=1e-6)
        for a in g["answers"]:
            row = t[a["row"]]
            m = np.asarray(row["mask"], bool)
            names = ("logp", "old_logp", "ref_logp", "rollout_logp")
            lp, old, ref, ro = (np.asarray(row[k], np.float64)[m] for k in names)
            L = a["layers"]
            n = a["shown"]
            np.testing.assert_allclose(L["lr"], (lp - old)[:n], rtol=1e-3, atol=1e-7)
            np.testing.assert_allclose(L["gap"], (old - ro)[:n], rtol=1e-3, atol=1e-7)
            x = ref - lp
            np.testing.assert_allclose(L["kl"], (np.exp(x) - x - 1)[:n], rtol=1e-3, atol=1e-9)
            assert a["toks"] == [s for s, k in zip(row["tokens"], m, strict=True) if k][:n]
            # the PPO clip by hand: A > 0 and ρ > 1 + ε, or A < 0 and ρ < 1 − ε
            rho, adv = np.exp(lp - old)[:n], a["adv"]
            bits = np.asarray(L["state"])
            hi = bits & 2 > 0
            low = bits & 1 > 0
            np.testing.assert_array_equal(hi, (adv > 0) & (rho > 1 + eps))
            np.testing.assert_array_equal(low, (adv < 0) & (rho < 1 - eps))
            # truncated: the answer reached max_completion_length (40)
            assert a["finished"] == (len(lp) < 40)
            if a["adv"] != 0:
                assert sum(L["share"]) == pytest.approx(a["share"], rel=2e-3)
            seen += 1
    assert seen >= 8


def test_a_prompt_followed_across_steps(page: Path, run_dir: Path) -> None:
    """A prompt of a shown group at every step it comes back: its answers' rewards as the
    files hold them, advantages as the page's groups give them."""
    d = page_data(page.read_text())
    assert d["prompts"]
    for key, hist in d["prompts"].items():
        assert len(hist) >= 2
        for h in hist:
            t = pq.read_table(run_dir / f"step_{h['step']:06d}" / "rank000-mb000.parquet")
            rows = [r for r in t.to_pylist() if r["prompt"] == key]
            assert h["rewards"] == [r["reward"] for r in rows]
            assert len(h["advs"]) == len(rows)
            # δ = old − rollout over the answers' valid tokens, averaged per answer
            gaps = []
            for r in rows:
                m = np.asarray(r["mask"], bool)
                gaps.append(np.mean((np.asarray(r["old_logp"]) - np.asarray(r["rollout_logp"]))[m]))
            assert h["gap"] == pytest.approx(np.mean(gaps), rel=1e-3, abs=1e-9)


def test_gradient_shares_are_answers_own(cli: Cli, page: Path, run_dir: Path) -> None:
    """An answer's share on the page is ``answers --sort gradient``'s gradient_share."""
    d = page_data(page.read_text())
    doc = cli.json("answers", run_dir / "step_000002", "--sort", "gradient", "--top", "32")
    by_row = {r["row"]: r["gradient_share"] for r in doc["answers"]}
    shown = [a for g in d["steps"][1]["groups"] for a in g["answers"]]
    assert shown
    for a in shown:
        assert a["share"] == pytest.approx(by_row[a["row"]], rel=1e-3, abs=1e-12)
        assert a["carries"] == (a["adv"] != 0)


def test_check_run_writes_the_same_page(
    cli: Cli, run_dir: Path, page: Path, tmp_path: Path
) -> None:
    out = tmp_path / "c.html"
    r = cli("check", run_dir, "--report-html", out, "--format", "json")
    assert r.exit_code == 1 and json.loads(r.stdout)["run"]["first_failing_step"] == 4
    assert page_data(out.read_text()) == page_data(page.read_text())


def test_a_steps_report_has_the_same_explorer(cli: Cli, run_dir: Path, page: Path,
                                              tmp_path: Path) -> None:  # fmt: skip
    """``report STEP --html``: the step's report with the run page's explorer of that step."""
    out = tmp_path / "s.html"
    assert cli("report", run_dir / "step_000004", "--html", out).exit_code == 0
    html = out.read_text()
    assert "PASSED" in html or "FAILED" in html  # the step's own report is still there
    one = page_data(html)
    assert one["trend"] is None and len(one["steps"]) == 1
    run = page_data(page.read_text())["steps"][3]
    rows = [[a["row"] for a in g["answers"]] for g in one["steps"][0]["groups"]]
    assert rows[0] == [a["row"] for a in run["groups"][0]["answers"]]
    assert one["steps"][0]["groups"][0] == run["groups"][0]  # the same numbers, step alone


TIS = ("--correction", "trl-vllm", "--correction-param", "vllm_is_mode=token_truncate",
       "--correction-param", "vllm_is_clip_max=1.5")  # fmt: skip


@pytest.fixture(scope="module")
def tis_page(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page under TRL's vLLM IS correction, token_truncate at C_max 1.5."""
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    out = tmp_path_factory.mktemp("tis") / "tis.html"
    r = CliRunner().invoke(app, ["report", str(run_dir), "--html", str(out), *TIS])
    assert r.exit_code == 0, r.stderr
    return out


def test_a_capped_weight_is_the_tis_state(tis_page: Path) -> None:
    """tis-cap where exp(δ) > C_max, by hand from the page's own δ; the slider starts there."""
    d = page_data(tis_page.read_text())
    assert d["settings"]["is_cap"] == 1.5 and d["settings"]["correction"] == "trl-vllm"
    n = 0
    for st in d["steps"]:
        for g in st["groups"]:
            for a in g["answers"]:
                gap, bits = np.asarray(a["layers"]["gap"]), np.asarray(a["layers"]["state"])
                np.testing.assert_array_equal(bits & 32 > 0, np.exp(gap) > 1.5)
                n += int(np.sum(np.exp(gap) > 1.5))
    assert n > 0  # the synthetic sampler gap makes some


@pytest.fixture(scope="module")
def broken_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three steps, a NaN reward at step 2: check's integrity fails there, the page shows
    the other steps and says why not that one."""
    import pyarrow as pa
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    root = bench.write_run(tmp_path_factory.mktemp("nan") / "r", steps=3, answers=16, width=20)
    f = root / "step_000002" / "rank000-mb000.parquet"
    t = pq.read_table(f)
    reward = t.column("reward").to_numpy().copy()
    reward[3] = np.nan
    pq.write_table(t.set_column(t.schema.get_field_index("reward"), "reward", pa.array(reward)), f)
    out = root.parent / "nan.html"
    r = CliRunner().invoke(app, ["report", str(root), "--html", str(out)])
    assert r.exit_code == 0, r.stderr
    assert "step_000002: no groups shown" in r.stderr and "nan at row 3" in r.stderr
    return out


def test_a_step_that_cannot_be_read_is_said(broken_page: Path) -> None:
    d = page_data(broken_page.read_text())
    st = {s["step"]: s for s in d["steps"]}
    assert st[2]["groups"] == [] and "non-finite value nan at row 3" in st[2]["error"]
    assert st[1]["groups"] and st[3]["groups"]
    assert d["trend"]["first_failing_step"] == 2  # rewards-finite fails there
    rules = {r["rule"]: r for r in d["trend"]["rules"]}
    assert rules["rewards-finite"]["first"] == {"warn": 2, "fail": 2}


def test_the_size_budget_holds(tmp_path: Path) -> None:
    """Tokens carried: at most the page's budget over its steps, a step's share each (its
    worst group always, its answers cut to fit); bytes: ~60 a token, so 5 MB holds the
    default budget of 60,000 tokens."""
    from grpo_cli.commands.run_page import TOKEN_BUDGET, run_page
    from grpo_cli.settings import Settings
    from grpo_cli.views.html import CSS
    from grpo_cli.views.run_html import render_run_html

    root = bench.write_run(tmp_path / "r", steps=5, answers=64, width=64, seed=1)
    specs = [(k, str(root / f"step_{k:06d}")) for k in range(1, 6)]
    small = run_page(specs, Settings(), budget=1000)
    assert small["budget"]["per_step"] == 240  # STEP_FLOOR: 1000 // 5 is below it
    for st in small["steps"]:
        shown = sum(a["shown"] for g in st["groups"] for a in g["answers"])
        assert 0 < shown <= 240
    full = run_page(specs, Settings())
    total = sum(a["shown"] for st in full["steps"] for g in st["groups"] for a in g["answers"])
    assert total <= TOKEN_BUDGET
    size = len(render_run_html(full, CSS).encode())
    assert size / total < 80  # bytes a token: 60,000 tokens stay under 5 MB
    assert TOKEN_BUDGET * 80 < 5 * 2**20


def test_a_real_trl_run(cli: Cli, trl_run: Any, tmp_path: Path) -> None:
    """A run recorded from TRL's GRPOTrainer: the page's steps, groups and layers."""
    run = trl_run("iterations")
    out = tmp_path / "trl.html"
    r = cli("report", run.directory, "--html", out)
    assert r.exit_code == 0, r.stderr
    d = page_data(out.read_text())
    assert len(d["steps"]) >= 2 and d["trend"] is not None
    a = d["steps"][-1]["groups"][0]["answers"][0]
    assert a["layers"]["lr"] is not None and a["layers"]["kl"] is not None
    assert a["text"]  # the recorder's completion text
    assert d["settings"]["beta"] == pytest.approx(0.04)


def test_trls_entropy_mask_is_the_recorded_one(trl_run: Any) -> None:
    """TRL's top_entropy_quantile run: a token is entropy-masked where the recorded
    entropy_mask is 0, its entropy layer is the recorded entropy."""
    from grpo_cli.commands.run_page import run_page
    from grpo_cli.io.run import find_run
    from grpo_cli.trainers.presets import resolve_run_settings

    run = trl_run("masks")
    rec = find_run(run.directory)
    assert rec is not None
    settings, _ = resolve_run_settings(rec.trainer, rec.trainer_version, rec.config)
    assert [m.name for m, _ in settings.mask_rows] == ["trl/top_entropy_mask"]
    steps = sorted(p.name for p in run.directory.glob("step_*"))
    # the page of the steps (check RUN is left out: it stops on this run, see the report)
    d = run_page([(k + 1, str(run.directory / n)) for k, n in enumerate(steps)], settings,
                 config=rec.config)  # fmt: skip
    bit = next(s["bit"] for s in d["states"] if s["name"] == "entropy-masked")
    seen = whole = 0
    for st in d["steps"]:
        files = sorted((run.directory / st["name"]).glob("rank*-mb*.parquet"))
        rows = [row for f in files for row in pq.read_table(f).to_pylist()]
        for g in st["groups"]:
            # every answer of the group, the masked ones too, from the file
            rewards = [r["reward"] for r in rows if r["group"] == g["key"]]
            assert sorted(a["reward"] for a in g["answers"]) == sorted(rewards)
            assert g["zero_variance"] == (min(rewards) == max(rewards))
            for a in g["answers"]:
                row = rows[a["row"]]
                m = np.asarray(row["mask"], bool)
                if a.get("masked_whole"):  # mask_truncated_completions: shown, marked
                    assert not m.any() and not a["carries"] and a["layers"] is None
                    whole += 1
                    continue
                em = np.asarray(row["entropy_mask"], bool)[m][: a["shown"]]
                bits = np.asarray(a["layers"]["state"])
                np.testing.assert_array_equal(bits & bit > 0, ~em)
                ent = np.asarray(row["entropy"], np.float64)[m][: a["shown"]]
                np.testing.assert_allclose(a["layers"]["ent"], ent, rtol=1e-3, atol=1e-7)
                seen += int(np.sum(~em))
    assert seen > 0 and whole > 0


# ----------------------------------------------------------------- a real browser
def _browser() -> Any:
    """Playwright's sync API, with Debian's chromium to drive: a skip without either, a
    failure under GRPO_CLI_REQUIRE_BROWSER=1 (CI's run with the [browser] extra)."""
    strict = bool(os.environ.get("GRPO_CLI_REQUIRE_BROWSER"))
    try:
        import playwright.sync_api as sync
    except ImportError:
        if strict:
            pytest.fail("no playwright (pip install -e '.[browser]')")
        pytest.skip("no playwright (pip install -e '.[browser]')")
    if CHROMIUM is None:
        if strict:
            pytest.fail("no chromium (apt-get install chromium)")
        pytest.skip("no chromium (apt-get install chromium)")
    return sync


@pytest.fixture(scope="module")
def browser() -> Any:
    sync = _browser()
    with sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _open(browser: Any, path: Path, width: int = 1280) -> tuple[Any, list[str]]:
    """The page in a new tab at ``width`` px, opened on a step with a group; the console's
    errors and warnings, the page's exceptions and failed requests."""
    pg, problems = _open_any(browser, path, width)
    pg.wait_for_selector("#group .ans")
    return pg, problems


def _open_any(browser: Any, path: Path, width: int = 1280) -> tuple[Any, list[str]]:
    """:func:`_open` of a page that may open on a step with no group."""
    pg = browser.new_page(viewport={"width": width, "height": 900})
    problems: list[str] = []
    pg.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in (
        "error", "warning") else None)  # fmt: skip
    pg.on("pageerror", lambda e: problems.append(f"exception: {e}"))
    pg.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    pg.goto(path.resolve().as_uri())
    pg.wait_for_selector("#step-title")
    return pg, problems


def test_switch_a_layer_pick_a_step_move_a_slider(browser: Any, page: Path) -> None:
    pg, problems = _open(browser, page)
    d = page_data(page.read_text())
    # the page opens at the first failing step, its trend marked
    assert pg.input_value("#step-picker") == "3"
    assert "step 4" in pg.text_content("#step-title")
    assert pg.locator("#panels svg").count() >= 6
    assert pg.locator("#panels line.first-bad[data-rule='kl-mean'][data-step='4']").count() == 1
    assert pg.locator("#zero-var").count() + pg.locator(".gtabs button").count() > 1
    kl = pg.locator("#rules tr[data-rule='kl-mean'] td").all_text_contents()
    assert kl[:4] == ["FAIL", "kl-mean", "step 4", "step 4"]
    # switch a layer: the legend says which, the token colours follow it
    before = pg.eval_on_selector_all(
        "#group .toks span[data-t]", "s => s.map(x => x.style.background)"
    )
    pg.check("#layer-kl")
    assert "KL to ref" in pg.text_content("#legend")
    after = pg.eval_on_selector_all(
        "#group .toks span[data-t]", "s => s.map(x => x.style.background)"
    )
    assert before != after and len(after) == sum(
        a["shown"] for a in d["steps"][3]["groups"][0]["answers"]
    )
    pg.hover("#group .toks span[data-t='0']")
    assert "KL to ref" in pg.text_content("#hover")
    # pick a step
    pg.select_option("#step-picker", "1")
    assert pg.text_content("#step-title").startswith("step 2 ")
    rows = pg.eval_on_selector_all("#group .ans", "c => c.map(x => +x.dataset.row)")
    assert rows == [a["row"] for a in d["steps"][1]["groups"][0]["answers"]]
    # move a slider: ε down to 0.02 clips more of the shown tokens, outlined
    pg.check("#layer-state")
    pg.fill("#cf-eps", "0.02")
    flips = int(pg.get_attribute("#cf-out", "data-flips"))
    assert flips > 0 and pg.locator("#group .toks span.flip").count() == flips
    assert "change state" in pg.text_content("#cf-out")
    pg.click("#cf-reset")
    assert pg.locator("#group .toks span.flip").count() == 0
    # the same prompt across steps: a shown group whose prompt comes back
    k, g, key = next((k, j, g["answers"][0]["prompt_key"]) for k, st in enumerate(d["steps"])
                     for j, g in enumerate(st["groups"])
                     if g["answers"][0]["prompt_key"] in d["prompts"])  # fmt: skip
    pg.select_option("#step-picker", str(k))
    pg.click(f".gtabs button[data-group='{g}']")
    assert pg.locator("#prompt-table tr").count() == 1 + len(d["prompts"][key])
    assert problems == []
    pg.close()


def test_counterfactual_is_the_folds_state(browser: Any, cli: Cli, run_dir: Path, page: Path,
                                           tmp_path: Path) -> None:  # fmt: skip
    """The page's clip states recomputed at ε = 0.05 are those the Python fold gives a page
    made at ``--clip-eps 0.05`` (same tokens, same groups)."""
    other = tmp_path / "eps.html"
    r = cli("report", run_dir, "--html", other, "--clip-eps", "0.05")
    assert r.exit_code == 0, r.stderr
    want = page_data(other.read_text())
    pg, problems = _open(browser, page)
    d = page_data(page.read_text())
    checked = 0
    for k, st in enumerate(d["steps"]):
        pg.evaluate(f"window.grpoPage.pickStep({k})")
        got = pg.evaluate("window.grpoPage.counterfactual(0.05, undefined, undefined)")
        ref = {a["row"]: a for g in want["steps"][k]["groups"] for a in g["answers"]}
        for a, bits in zip(st["groups"][0]["answers"], got, strict=True):
            if a["row"] in ref:
                assert (np.asarray(bits) & 3).tolist() == (
                    np.asarray(ref[a["row"]]["layers"]["state"]) & 3
                ).tolist()
                checked += 1
    assert checked >= 8 and problems == []
    pg.close()


def test_the_is_cap_slider_is_the_folds_correction(
    browser: Any, page: Path, tis_page: Path
) -> None:
    """The page made without a correction, its IS cap moved to 1.5: the tis-cap states are
    those the fold gives under TRL's token_truncate correction at C_max 1.5."""
    want = page_data(tis_page.read_text())
    pg, problems = _open(browser, page)
    d = page_data(page.read_text())
    checked = 0
    for k, st in enumerate(d["steps"]):
        pg.evaluate(f"window.grpoPage.pickStep({k})")
        got = pg.evaluate("window.grpoPage.counterfactual(0.2, 1.5, undefined)")
        ref = {a["row"]: a for g in want["steps"][k]["groups"] for a in g["answers"]}
        for a, bits in zip(st["groups"][0]["answers"], got, strict=True):
            if a["row"] in ref:
                b = np.asarray(ref[a["row"]]["layers"]["state"])
                assert (np.asarray(bits) & 32).tolist() == (b & 32).tolist()
                checked += int(np.sum(b & 32 > 0))
    # and the slider: moving it to 1.5 flips exactly those tokens on the shown group
    pg.evaluate("window.grpoPage.pickStep(0)")
    pg.fill("#cf-cap", "1.5")
    shown = d["steps"][0]["groups"][0]["answers"]
    capped = sum(int(np.sum(np.exp(np.asarray(a["layers"]["gap"])) > 1.5)) for a in shown)
    assert pg.locator("#group .toks span.flip").count() == capped
    assert checked > 0 and problems == []
    pg.close()


def test_the_unreadable_step_in_chromium(browser: Any, broken_page: Path) -> None:
    pg, problems = _open_any(browser, broken_page)
    assert pg.input_value("#step-picker") == "1"  # the first failing step: 2
    assert "cannot be shown" in pg.text_content("#no-groups")
    pg.fill("#cf-eps", "0.05")
    pg.check("#layer-kl")
    pg.select_option("#step-picker", "2")
    assert pg.locator("#group .ans").count() > 0
    assert problems == []
    pg.close()


@pytest.mark.parametrize("width", [1280, 800])
def test_screenshots_of_each_view(browser: Any, page: Path, tmp_path: Path, width: int) -> None:
    """Each view at both widths (GRPO_CLI_SCREENSHOTS=DIR keeps them: docs/img/)."""
    out = Path(os.environ.get("GRPO_CLI_SCREENSHOTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    pg, problems = _open(browser, page, width)
    views = {
        "run": "#panels",
        "group": "#group",
        "tokens": "#group .ans",
        "counterfactual": "#counterfactuals",
    }
    pg.check("#layer-share")
    for name, sel in views.items():
        if name == "counterfactual":
            pg.check("#layer-state")
            pg.fill("#cf-eps", "0.05")
        box = pg.locator(sel).first
        box.scroll_into_view_if_needed()
        shot = out / f"run-{name}-{width}.png"
        pg.screenshot(path=str(shot), full_page=True, clip=_clip(pg, sel, width))
        assert shot.stat().st_size > 5000
    assert problems == []
    pg.close()


def _clip(pg: Any, sel: str, width: int) -> dict[str, float]:
    """The part of the page a view takes: from its section's heading to its end (at most
    900 px high)."""
    box = pg.evaluate(
        "s => { const h = document.querySelector(s).getBoundingClientRect(); "
        "return {y: h.top + window.scrollY, h: h.height}; }",
        sel,
    )
    y = max(0.0, box["y"] - 120)
    tall = 700.0 if sel == "#counterfactuals" else 160.0  # with the tokens it flips
    return {"x": 0, "y": y, "width": width, "height": min(900.0, box["h"] + tall)}
