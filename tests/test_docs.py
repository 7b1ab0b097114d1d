"""The documentation site: its reference tables come from the code (a table changed in the
code changes the page), every page is in the nav, README stays short and points into it."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from .conftest import Cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "reference.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ref = _reference()


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _nav_pages(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return []


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def _row(table: str, first_cell: str) -> list[str]:
    for line in table.splitlines():
        cells = _cells(line)
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in the table")


# ------------------------------------------------------------------ generated tables
def test_every_generated_table_is_used_and_every_marker_known() -> None:
    used = {m.group("name") for p in _pages() for m in ref.MARKER.finditer(p.read_text())}
    assert used == set(ref.TABLES)
    with pytest.raises(ref.DocsError, match="no generated table 'nope'"):
        ref.expand("a\n<!-- generated: nope -->\n", "docs/x.md")


def test_check_rules_table_is_the_rule_table() -> None:
    from grpo_cli.check.rules import INTEGRITY, RULES

    table = ref.check_rules()
    names = re.findall(r"^\| `([\w-]+)`", table, re.M)
    assert names == list(RULES)  # every rule, in check's order
    for rid, (_, cfg) in RULES.items():
        cells = _row(table, f"`{rid}`" + (" (integrity)" if rid in INTEGRITY else ""))
        for key in ("warn", "fail"):
            value = getattr(cfg, key)
            if value is not None:
                assert f"{key} > {value:g}" in cells[1]
        for k, v in cfg.params.items():
            assert f"`{k}` {v:g}" in cells[1]


def test_a_threshold_changed_in_the_code_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.check import rules

    fn, cfg = rules.RULES["kl-mean"]
    changed = dict(rules.RULES)
    changed["kl-mean"] = (fn, dataclasses.replace(cfg, warn=0.07, fail=0.7))
    monkeypatch.setattr(rules, "RULES", changed)
    page = ref.expand((DOCS / "checks.md").read_text())
    assert "| `kl-mean` | warn > 0.07, fail > 0.7 |" in page
    # a new rule without its words stops the build, naming it
    changed["kl-new"] = (fn, cfg)
    with pytest.raises(ref.DocsError, match="no words for kl-new"):
        ref.expand((DOCS / "checks.md").read_text())


def test_trend_rules_table_reads_falling_shares_as_below() -> None:
    from grpo_cli.commands.trend import TREND_RULES

    table = ref.trend_rules()
    for rid, (_, cfg) in TREND_RULES.items():
        assert cfg.warn is not None and cfg.fail is not None
        op = "<" if cfg.warn > cfg.fail else ">"
        assert _row(table, f"`{rid}`")[1] == f"warn {op} {cfg.warn:g}, fail {op} {cfg.fail:g}"
    assert _row(table, "`entropy-drop`")[1].startswith("warn <")


def test_presets_table_is_the_presets(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.settings import Settings
    from grpo_cli.trainers import presets

    table = ref.presets()
    assert re.findall(r"^\| `([\w@.-]+)`", table, re.M) == list(presets.PRESETS)
    verl = _row(table, "`verl`")
    s = presets.PRESETS["verl"]
    assert verl[1] == s.mirrors
    assert f"beta {s.beta:g}" in verl[2] and f"dual_clip {s.dual_clip:g}" in verl[2]
    assert "beta" not in _row(table, "`deepseekmath`")[2]  # the defaults: nothing differs
    # a preset's setting changed in the code changes the page
    changed = dict(presets.PRESETS)
    changed["verl"] = dataclasses.replace(s, beta=0.123)
    monkeypatch.setattr(presets, "PRESETS", changed)
    assert "beta 0.123" in _row(ref.presets(), "`verl`")[2]
    changed["new-preset"] = Settings(preset="new-preset", beta=0.5)
    with pytest.raises(ref.DocsError, match="no words for new-preset"):
        ref.presets()


def test_releases_table_has_every_change_point() -> None:
    from grpo_cli.trainers import TRAINERS

    table = ref.releases()
    for t in TRAINERS.values():
        for r in t.releases:
            cells = _row(table, f"`{t.name}@{r.first}`")
            assert cells[2] == r.checked
            assert r.changes[0].split(":")[0] in cells[4]


def test_the_brief_release_table_names_the_change_points() -> None:
    """The hand-written summary of docs/releases.md lists every change point, no other."""
    from grpo_cli.trainers import TRAINERS

    text = (DOCS / "releases.md").read_text()
    label = {"trl": "TRL", "verl": "verl", "openrlhf": "OpenRLHF"}
    for name, t in TRAINERS.items():
        if name not in label:
            continue
        row = _row(text, label[name])[1]
        listed = re.findall(r"(?:^|, )(\d+\.\d+\.\d+(?:\.post\d+)?)", row)
        assert listed == [r.first for r in t.releases], name


def test_losses_table_is_the_registry() -> None:
    from grpo_cli.commands.losses import registry_entries

    table = ref.losses()
    for e in registry_entries():
        assert f"| `{e.name}` | {e.trainer or 'all'} |" in table
        for n, *_ in e.params:
            assert f"`{n}` =" in table


def test_the_config_value_table_names_every_registry_row() -> None:
    """docs/losses.md's hand-written tables (each row's trainer config value, its proof)
    name every loss, correction and mask of the registry, and no other."""
    from grpo_cli.commands.losses import registry_entries

    text = (DOCS / "losses.md").read_text().split("## The trainers' config values")[1]
    text = text.split("\n## ")[0]
    named = set(re.findall(r"^\| `(\w[\w/-]*)`", text, re.M))  # not the header's --loss
    for cell in re.findall(r"^\| `[\w/-]+`, `([\w/-]+)`", text, re.M):
        named.add(cell)
    entries = {e.name for e in registry_entries()}
    assert named == entries


def test_cli_reference_is_every_commands_help() -> None:
    page = ref.cli()
    names = ref.command_names()
    assert "objective" in names and "check" in names
    headings = re.findall(r"^## `grpo-cli ?([\w-]*)`", page, re.M)
    assert headings == ["", *names]
    objective = page.split("## `grpo-cli objective`")[1].split("\n## ")[0]
    for option in ("--preset", "--agg", "--beta", "--json", "--workers"):
        assert option in objective


def test_gate_metrics_table_is_the_gates_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.integrations import _gate

    table = ref.gate_metrics()
    assert re.findall(r"^\| `(grpo_cli/\w+)`", table, re.M) == list(_gate.KEYS)
    assert _row(table, "`grpo_cli/ratio_p99`")[1] == _gate.KEYS["grpo_cli/ratio_p99"]
    monkeypatch.setattr(_gate, "KEYS", {**_gate.KEYS, "grpo_cli/new_key": "a new number"})
    page = ref.expand((DOCS / "recording.md").read_text())
    assert "| `grpo_cli/new_key` | a new number |" in page


def test_json_limits_table_is_bounded_py(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.io import bounded

    table = ref.json_limits()
    assert _row(table, "nesting")[1] == f"{bounded.MAX_DEPTH} levels (`MAX_DEPTH`)"
    line = _row(table, "a JSONL / NeMo-RL line")[1]
    assert line == f"{bounded.MAX_LINE / 2**20:g} MiB (`MAX_LINE`)"
    monkeypatch.setattr(bounded, "MAX_LINE", 3 << 19)
    page = ref.expand((DOCS / "formats.md").read_text())
    assert "| a JSONL / NeMo-RL line | 1.5 MiB (`MAX_LINE`) |" in page


def test_histograms_table_is_the_bins_of_the_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_cli.fold import parts

    table = ref.histograms()
    lo, hi, n = parts.LOG_RATIO_BINS
    assert f"{n:,} bins of width 1e-4 on [−20, 20)" in _row(table, "ratio ρ")[1]
    assert (hi - lo) / n == pytest.approx(1e-4, rel=1e-12)  # what the page says
    # half a bin of log-ratio is a relative error e^(w/2) - 1 of the ratio
    assert "≈ 5.0e-5" in _row(table, "ratio ρ")[2]
    assert _row(table, "per-answer mean KL")[2] == "absolute 5e-5"
    monkeypatch.setattr(parts, "ENTROPY_BINS", (0.0, 10.0, 50_000))
    page = ref.expand((DOCS / "scale.md").read_text())
    assert "| per-token entropy | 50,000 bins of width 2e-4 on [0, 10) | absolute 1e-4 |" in page


def test_every_key_of_objective_json_is_on_its_page(cli: Cli) -> None:
    """docs/commands/objective.md's key table (hand-written: what each key means) names every
    key `objective --json` writes, and no key it does not."""
    doc = cli.json("objective", ROOT / "sample_data" / "batch.parquet", "--gradient")
    page = (DOCS / "commands" / "objective.md").read_text()
    table = page.split("`objective --json`:")[1].split("\n\n## ")[0]
    listed = {
        k for c in re.findall(r"^\| ([^|]+) \|", table, re.M) for k in re.findall(r"`(\w+)`", c)
    }
    assert listed and listed <= set(doc), sorted(listed - set(doc))
    named = set(re.findall(r"`(\w+)`", page.split("`objective --json`:")[0] + table))
    assert set(doc) <= named, sorted(set(doc) - named)


def test_conventions_tables_name_the_codes_options_and_aggregations() -> None:
    """docs/conventions.md's hand-written tables: the `--agg` rows are the aggregations of
    the code, in its order; every option of the options table is one `objective` takes."""
    from grpo_cli.core import AGGREGATIONS

    page = (DOCS / "conventions.md").read_text()
    agg = page.split("| `--agg` | formula | used by |")[1].split("\n\n")[0]
    assert re.findall(r"^\| `([\w-]+)` \|", agg, re.M) == list(AGGREGATIONS)
    options = page.split("| option | values | meaning |")[1].split("\n\n")[0]
    named = {o for c in re.findall(r"^\| ([^|]+) \|", options, re.M)
             for o in re.findall(r"`(--[\w-]+)`", c)}  # fmt: skip
    objective = ref.cli().split("## `grpo-cli objective`")[1].split("\n## ")[0]
    assert len(named) > 20
    missing = sorted(o for o in named if not re.search(rf"{o}(?![\w-])", objective))
    assert not missing, missing


def test_trainer_metrics_table_names_each_trainers_metrics() -> None:
    """docs/commands/objective.md's trainer-metrics rows: each trainer's checked release and
    the metric names its newest release preset computes (the registry's), in order."""
    from grpo_cli.trainers import TRAINERS

    page = (DOCS / "commands" / "objective.md").read_text()
    table = page.split("| trainer | names | as the trainer computes them |")[1].split("\n\n")[0]
    rows = {r[0].split(" ")[0]: r for r in (_cells(line) for line in table.splitlines()[1:])}
    for name, label in (("trl", "TRL"), ("verl", "verl"), ("openrlhf", "OpenRLHF")):
        release = TRAINERS[name].releases[-1]
        cells = rows[label]
        assert cells[0].startswith(f"{label} {release.checked} ("), cells[0]
        assert re.findall(r"`([\w/]+)`", cells[1]) == list(release.metric_names), name


# ------------------------------------------------------------------ the site
def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav))
    assert {p.relative_to(DOCS).as_posix() for p in _pages()} == set(nav)
    assert config["strict"] is True


def test_conformance_table_lives_on_its_page() -> None:
    source = (ROOT / "conformance" / "oracle.py").read_text()
    start = re.search(r'^README_START = "(.*)"$', source, re.M)
    end = re.search(r'^README_END = "(.*)"$', source, re.M)
    assert start and end
    page = (DOCS / "conformance.md").read_text()
    assert page.count(start.group(1)) == 1 and page.count(end.group(1)) == 1
    table = page.split(start.group(1))[1].split(end.group(1))[0]
    assert table.count("\n| ") >= 30  # the run's rows, one per configuration
    ci = (ROOT / ".ci" / "run").read_text()
    assert "conformance/run --check-page docs/conformance.md" in ci


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 15
    for link in links:
        assert (ROOT / link).exists(), link
    for page in ("docs/getting-started.md", "docs/recording.md", "docs/ci.md", "docs/api.md"):
        assert page in links


def test_nothing_of_the_old_readme_points_to_it() -> None:
    """Sections moved to the site: no page sends the reader to README for them."""
    for page in _pages():
        assert 'README "' not in page.read_text(), page
