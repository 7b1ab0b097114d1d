"""What a person reads: the one-screen views fit 24 lines at 80 columns, every number
shown keeps 3 significant digits of the value ``--json`` gives, nothing is cut, notes
are printed once (on stderr), and README's example outputs are what the commands print.
Rendered tables are pinned at a fixed width (CliRunner with COLUMNS)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from grpo_cli.check.rules import RULES
from grpo_cli.cli import app

from .conftest import SAMPLE

ROOT = Path(__file__).resolve().parent.parent
BROKEN = sorted((SAMPLE / "broken").glob("*.parquet"))


def run(*args: str | Path, width: int = 80) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": str(width)})


def npz(path: Path, logp: np.ndarray, *, old: np.ndarray | None, ref: np.ndarray) -> Path:
    """A padded npz of 4 answers in 2 groups of 2 (no old_logp when ``old`` is None)."""
    arrays = {"logp": logp, "ref_logp": ref, "rewards": np.array([[1.0, 0.0], [0.0, 1.0]])}
    if old is not None:
        arrays["old_logp"] = old
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def lines(text: str) -> list[str]:
    return text.rstrip("\n").splitlines()


def close(shown: str, value: float, sig: int = 3) -> bool:
    """``shown`` (as printed: ``-2.311e-4``, ``0.102%``, ``25,438``) is ``value`` to
    ``sig`` significant digits."""
    x = float(shown.replace(",", "").rstrip("%")) / (100 if shown.endswith("%") else 1)
    return bool(abs(x - value) <= 0.5 * 10 ** (1 - sig) * abs(value) + 1e-300)


def field(text: str, name: str) -> str:
    """The value printed after ``name`` on its line (the first block that has it)."""
    for line in lines(text):
        if name in line:
            rest = line.split(name, 1)[1].split()
            return rest[0]
    raise AssertionError(f"{name!r} not in:\n{text}")


# ---------------------------------------------------------------- one screen
@pytest.mark.parametrize("command", ["objective", "check", "explain"])
@pytest.mark.parametrize("path", [SAMPLE / "batch.parquet", SAMPLE / "batch.npz", *BROKEN],
                         ids=lambda p: p.name if isinstance(p, Path) else p)  # fmt: skip
def test_one_screen_at_80_columns(command: str, path: Path) -> None:
    r = run(command, path)
    if r.exit_code == 2:  # an input objective refuses (NaN inside the mask...): one line
        assert command != "check" and r.stdout == ""
        return
    assert r.exit_code in (0, 1), r.stderr
    out = lines(r.stdout)
    assert len(out) <= 24, r.stdout
    assert max(len(line) for line in out) <= 80
    assert not re.search(r"\S…", r.stdout), r.stdout  # nothing cut by an ellipsis
    assert "note:" not in r.stdout


def test_the_numbers_on_the_screen_are_the_json_numbers() -> None:
    doc = json.loads(run("objective", SAMPLE / "batch.parquet", "--json").stdout)
    text = run("objective", SAMPLE / "batch.parquet").stdout
    assert close(field(text, "J "), doc["objective"], 4)
    assert close(field(text, "loss = −J"), doc["loss"], 4)
    assert close(field(text, "policy term"), doc["policy_term"], 4)
    assert close(field(text, "KL term (β·KL)"), doc["kl_term"], 4)
    assert close(field(text, "clip region (tokens)"), doc["clip_fraction"]["region"])
    line = next(x for x in lines(text) if "ratio ρ p99 · max" in x).split()
    assert close(line[-3], doc["ratio"]["p99"], 4) and close(line[-1], doc["ratio"]["max"], 4)
    kl = next(x for x in lines(text) if "KL k3 mean · max" in x).split()
    assert close(kl[-3], doc["kl"]["mean"], 4) and close(kl[-1], doc["kl"]["max"], 4)
    assert f"{doc['counts']['tokens']:,}" in text
    zero = doc["groups"]["zero_variance_groups"]
    assert f"zero-variance groups       {zero} (40.6%)" in text


def test_the_same_layout_side_by_side_at_120_columns() -> None:
    wide = lines(run("objective", SAMPLE / "batch.parquet", width=120).stdout)
    assert any("J " in x and "clip region" in x and "groups" in x for x in wide)
    assert max(len(x) for x in wide) <= 120
    narrow = lines(run("objective", SAMPLE / "batch.parquet", width=80).stdout)
    assert any("J " in x and "clip region" in x for x in narrow)  # two blocks at 80
    stacked = lines(run("objective", SAMPLE / "batch.parquet", width=50).stdout)
    assert max(len(x) for x in stacked) <= 50 and not any("J " in x and "clip" in x
                                                           for x in stacked)  # fmt: skip


def test_full_prints_every_table() -> None:
    r = run("objective", SAMPLE / "batch.parquet", "--full")
    for title in ("GRPO objective", "Clip fractions", "Importance ratio and KL per token",
                  "Ratio histogram", "Counts", "Sampler vs trainer"):  # fmt: skip
        assert title in r.stdout
    assert "on-policy (no old_logp)" not in r.stdout  # no double negative
    assert "ratio from" in r.stdout and "logp − old_logp" in r.stdout
    full = run("check", SAMPLE / "batch.parquet", "--full").stdout
    assert (
        full.count("threshold ") == len(RULES)
        and "every valid token's log-probs are finite" in full
    )


def test_notes_once_on_stderr(tmp_path: Path) -> None:
    logp = -np.random.default_rng(0).exponential(0.5, (4, 4))
    path = npz(tmp_path / "b.npz", logp, old=None, ref=logp + 0.01)  # on-policy: a note
    for cmd in ("objective", "explain", "check"):
        r = run(cmd, path)
        assert "note:" not in r.stdout and "old_logp" not in r.stdout.split("·")[0], r.stdout
        notes = [x for x in r.stderr.splitlines() if x.startswith("grpo-cli: note:")]
        assert len(notes) == len(set(notes))
    r = run("objective", path)
    assert r.stderr.count("old_logp") == 1 and "on-policy" in r.stdout


# ---------------------------------------------------------------- numbers that fit
def test_trend_at_80_columns_shows_j_as_numbers(tmp_path: Path) -> None:
    for s in (1, 2, 3):
        assert run("sample", tmp_path / f"step_{s}.parquet", "--groups", "8", "--seed",
                   str(s), "--extras").exit_code == 0  # fmt: skip
    files = [tmp_path / f"step_{s}.parquet" for s in (1, 2, 3)]
    doc = json.loads(run("trend", *files, "--json").stdout)
    text = run("trend", *files).stdout
    assert max(len(x) for x in lines(text)) <= 80 and not re.search(r"\S…", text)
    rows = [x.split() for x in lines(text) if re.match(r"\s*[123]\s", x)]
    assert len(rows) == 3
    for row, step in zip(rows, doc["steps"], strict=True):
        assert close(row[1], step["objective"]) and close(row[4], step["kl_mean"])
    spark = next(x for x in lines(text) if x.startswith("J "))
    assert "→" in spark and close(spark.split()[-1], doc["steps"][-1]["objective"])


def test_advantages_lists_a_group_in_full_or_says_how_many_more(tmp_path: Path) -> None:
    path = tmp_path / "g.parquet"
    groups = ["big"] * 20 + ["small"] * 8
    rewards = [float(i % 3) for i in range(28)]
    pq.write_table(pa.table({"group": groups, "reward": rewards}), path)
    text = run("advantages", path).stdout
    assert max(len(x) for x in lines(text)) <= 80
    table = text.split("Totals")[0]
    small = table.split("small")[1]
    assert len(re.findall(r"[+-]\d\.\d\d", small)) == 8
    big = table.split("big")[1].split("small")[0]
    assert len(re.findall(r"[+-]\d\.\d\d", big)) == 16 and "(+4 more)" in big


def test_check_thresholds_are_never_broken() -> None:
    text = run("check", SAMPLE / "broken" / "kl_spike.parquet").stdout
    assert "FAIL  kl-max  value 84.52  threshold warn > 10, fail > 50" in text
    full = run("check", SAMPLE / "batch.parquet", "--full").stdout
    heads = [x for x in lines(full) if re.match(r"(PASS|WARN|FAIL|SKIP) ", x)]
    assert len(heads) == len(RULES)
    for h in heads:
        assert "threshold " in h and not h.rstrip().endswith((">", ","))
    assert "threshold warn > 1e-4, fail > 1e-3" in full


def test_logged_metric_names_are_never_cut(tmp_path: Path) -> None:
    doc = json.loads(run("objective", SAMPLE / "batch.parquet", "--preset", "trl",
                         "--json").stdout)  # fmt: skip
    logged = {f"train/{k}": v for k, v in doc["trainer_metrics"]["metrics"].items()}
    logged["clip_ratio/region_mean_of_a_longer_name"] = 0.5
    path = tmp_path / "logged.json"
    path.write_text(json.dumps(logged))
    got = json.loads(run("objective", SAMPLE / "batch.parquet", "--preset", "trl", "--logged",
                         path, "--json").stdout)  # fmt: skip
    names = {m["metric"] for m in got["logged"]["metrics"]}
    assert "clip_ratio/region_mean_of_a_longer_name" in names
    for extra in ([], ["--full"]):
        text = run("objective", SAMPLE / "batch.parquet", "--preset", "trl", "--logged",
                   path, *extra).stdout  # fmt: skip
        assert max(len(x) for x in lines(text)) <= 80 and not re.search(r"\S…", text)
        shown = [x.split()[0] for x in lines(text) if x.split() and x.split()[0] in names]
        assert len(shown) >= 4  # every row of the block names its metric whole
    full = run("objective", SAMPLE / "batch.parquet", "--preset", "trl", "--logged", path,
               "--full").stdout  # fmt: skip
    for name in doc["trainer_metrics"]["metrics"]:
        assert name in full


def test_answers_never_wrap_file_or_group_names(tmp_path: Path) -> None:
    for s in (1, 2):
        assert run("sample", tmp_path / f"step_{s}.parquet", "--groups", "8",
                   "--seed", str(s)).exit_code == 0  # fmt: skip
    doc = json.loads(run("answers", tmp_path, "--top", "5", "--json").stdout)
    text = run("answers", tmp_path, "--top", "5").stdout
    assert max(len(x) for x in lines(text)) <= 80
    rows = [x for x in lines(text) if ".parquet" in x and "Top" not in x]
    assert len(rows) == 5
    for line, a in zip(rows, doc["answers"], strict=True):
        assert a["source"] in line and str(a["group"]) in line and str(a["row"]) in line
    one = run("answers", SAMPLE / "batch.parquet", "--top", "3").stdout
    assert "(of " in one and "batch.parquet)" in one  # one file: named once, in the title


def test_compare_weights_are_relative_to_a_median_answer() -> None:
    doc = json.loads(run("objective", SAMPLE / "batch.parquet", "--json").stdout)
    text = run("objective", SAMPLE / "batch.parquet", "--compare").stdout
    row = [x for x in lines(text) if x.strip().startswith("token-sum ")][-1]  # the weights
    values = row.split()[1:]
    lengths = {w["length"]: w["tokens"] for w in doc["length_weights"]}
    for v, key in zip(values, ("min", "p25", "p50", "p75", "max"), strict=True):
        assert close(v, lengths[key] / lengths["p50"])
    smtm = [x for x in lines(text) if re.match(r"\s*seq-mean-token-mean\s+\d", x)][-1]
    assert smtm.split()[1:] == ["1"] * 5


def test_explain_says_on_policy_only_when_it_is(tmp_path: Path) -> None:
    doc = json.loads(run("explain", SAMPLE / "batch.parquet", "--json").stdout)
    near = next(f for f in doc["findings"] if f["id"] == "near-zero-loss")
    assert "on-policy the ratio is 1" not in near["message"]  # the sample clips tokens
    logp = -np.random.default_rng(1).exponential(0.5, (4, 5))
    path = npz(tmp_path / "on.npz", logp, old=logp, ref=logp + 0.01)
    doc = json.loads(run("explain", path, "--json").stdout)
    near = next(f for f in doc["findings"] if f["id"] == "near-zero-loss")
    assert "on-policy the ratio is 1" in near["message"]


def test_github_format_says_when_every_rule_passes() -> None:
    r = run("check", SAMPLE / "batch.parquet", "--format", "github")
    assert r.exit_code == 0
    assert lines(r.stdout) == [
        # every rule but three opt-in or input-less ones (on-policy-exact,
        # zero-variance-advantage, logged-metrics) passes
        f"::notice title=grpo-cli check::passed ({len(RULES) - 3} pass, 3 skip): "
        + str(SAMPLE / "batch.parquet")
    ]


# ---------------------------------------------------------------- one number style
def test_num_and_pct_by_hand() -> None:
    from grpo_cli.views.format import NONE, num, pct, span

    # the fewest characters that keep the significant digits; a compact exponent
    assert num(-0.0002311050556) == "-2.311e-4" and num(-0.0002311050556, 10) == "-2.311050556e-4"
    assert num(163.456) == "163.5" and num(1262.4) == "1262" and num(12624.0) == "1.262e4"
    assert num(0.04) == "0.04" and num(0.001) == "1e-3" and num(1e-8, 6) == "1e-8"
    assert num(25438) == "25,438" and num(np.int64(-7)) == "-7" and num(0.0) == "0"
    assert num(float("nan")) == "nan" and num(-float("inf")) == "-inf" and num(True) == "true"
    assert pct(0.001022) == "0.102%" and pct(0.40625) == "40.6%" and pct(0) == "0%"
    assert pct(0.4807) == "48.1%" and pct(1.0) == "100%"
    assert num(None) == pct(None) == NONE == "—"
    assert span(8, 8) == "8" and span(6, 785) == "6–785"


def _every_view(tmp_path: Path) -> dict[str, str]:
    """What every view prints of the sample batch: each table (one screen and --full),
    the CI formats (the GitHub summary too), the HTML report."""
    batch, spike = SAMPLE / "batch.parquet", SAMPLE / "broken" / "kl_spike.parquet"
    out = {
        "objective": run("objective", batch).stdout,
        "objective --full": run("objective", batch, "--full", "--compare", "--gradient").stdout,
        "check --full": run("check", batch, "--full").stdout,
        "check spike --full": run("check", spike, "--full").stdout,
        "explain --full": run("explain", spike, "--full").stdout,
        "advantages": run("advantages", batch).stdout,
        "kl": run("kl", batch).stdout,
        "answers": run("answers", batch, "--top", "5").stdout,
        "junit": run("check", spike, "--format", "junit").stdout,
    }
    summary = tmp_path / "summary.md"
    r = CliRunner().invoke(app, ["check", str(batch), "--format", "github"],
                           env={"GITHUB_STEP_SUMMARY": str(summary)})  # fmt: skip
    out["github"] = r.stdout + summary.read_text()
    html = tmp_path / "report.html"
    run("report", batch, "--html", html)
    # the explorer's data block is JSON for its script (Python's float repr), not text a
    # view wrote: the numbers it shows are formatted by the page
    data = re.compile(r"<script type=application/json id=page-data>.*?</script>", re.S)
    text = html.read_text()
    assert len(data.findall(text)) == 1
    out["html"] = data.sub("", text)
    return out


def _messages(*paths: Path) -> str:
    """Every rule's and finding's message of ``paths``: text the records carry (their JSON
    too), written where they are computed, not by a view."""
    texts = []
    for path in paths:
        check = json.loads(run("check", path, "--format", "json").stdout)
        explain = json.loads(run("explain", path, "--json").stdout)
        texts += [x["message"] for x in check["results"]]
        texts += [x["message"] for x in explain["findings"]]
    return "\n".join(texts)


def test_every_view_writes_numbers_one_way(tmp_path: Path) -> None:
    views = _every_view(tmp_path)
    messages = _messages(SAMPLE / "batch.parquet", SAMPLE / "broken" / "kl_spike.parquet")
    # printf's exponent of two digits (1e-04) and shares to 2 decimals (0.04%, 40.62%)
    printf = re.compile(r"[-\d.]*\de[-+]?0\d|(?<![\d.])(?:\d{2}\.\d{2}|0\.0\d)%")
    for name, text in views.items():
        assert text.strip(), name
        found = set(printf.findall(text)) - set(printf.findall(messages))
        assert not found, (name, found)  # the views write 1e-4 and 0.0432%, 40.6%
    # an absent value is one glyph in every view, never a hyphen
    assert "value —  threshold —" in views["check --full"]
    assert "value -" not in views["check --full"]
    assert "| — | — |" in views["github"] and "| - |" not in views["github"]


def test_the_same_number_reads_the_same_on_the_screen_and_in_full() -> None:
    doc = json.loads(run("objective", SAMPLE / "batch.parquet", "--json").stdout)
    screen = run("objective", SAMPLE / "batch.parquet").stdout
    full = run("objective", SAMPLE / "batch.parquet", "--full").stdout
    # --full gives J to 10 significant digits, in the one screen's style
    shown = field(full, "objective J")
    assert close(shown, doc["objective"], 10) and "e-" in shown
    assert field(screen, "J ").split("e")[1] == shown.split("e")[1]  # one exponent style
    # a share is written once: the screen's clip region is --full's region row
    assert field(screen, "clip region (tokens)") == field(full, "region (low or high)")
    zero = doc["groups"]["frac_zero_variance_groups"]
    assert f"answers with zero group std            {100 * zero:.3g}%" in full
    # the group size range is one glyph (an en dash) wherever it is shown
    assert not re.search(r"group size +\d+-\d", full)


# ---------------------------------------------------------------- README and docs
def test_readme_outputs_are_what_the_commands_print() -> None:
    """Every example block of README.md and the docs pages is what its command prints, and
    every example is shown somewhere."""
    spec = importlib.util.spec_from_file_location("readme_outputs", ROOT / "docs" /
                                                  "readme_outputs.py")  # fmt: skip
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    new = mod.outputs()
    shown: set[str] = set()
    for page in mod.pages():
        text = page.read_text()
        shown |= {m.group("name") for m in mod.BLOCK.finditer(text)}
        _, changed = mod.update(text, new)
        assert changed == [], f"{page}: run python docs/readme_outputs.py ({', '.join(changed)})"
    assert shown == set(mod.EXAMPLES)
    assert "objective" in {m.group("name") for m in mod.BLOCK.finditer(mod.README.read_text())}
