"""The command line: JSON documents checked against independent computations, formats agree,
options and help."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli import group_advantages
from grpo_cli.cli import app
from grpo_cli.records import QUANTILES

from .conftest import SAMPLE, Cli, random_batch, reference_objective, write_npz, write_parquet


def test_seed_example_through_the_cli(cli: Cli) -> None:
    doc = cli.json("objective", SAMPLE / "seed_example.npz")
    assert doc["objective"] == -0.13122323326245566
    assert doc["loss"] == 0.13122323326245566
    assert math.isclose(doc["policy_term"] - doc["kl_term"], doc["objective"], rel_tol=1e-14)
    assert (
        cli.json("objective", SAMPLE / "seed_example.npz", "--beta", "0")["objective"]
        == -0.1299723302889813
    )
    assert doc["counts"] == {"groups": None, "answers": 2, "tokens": 5}
    assert doc["advantages_source"] == "file"


def test_objective_json_matches_independent_computation(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    b = random_batch(rng, n=40, width=12, groups=5)
    path = write_npz(tmp_path / "b.npz", b)
    doc = cli.json("objective", path)
    # advantages from rewards, per group (population std, eps 1e-8), done by hand
    r, g = b["reward"], b["group"]
    adv = np.zeros_like(r)
    for k in np.unique(g):
        sel = g == k
        if r[sel].max() > r[sel].min():
            adv[sel] = (r[sel] - r[sel].mean()) / (r[sel].std() + 1e-8)
    width = int(max(b["lengths"]))
    mask = np.arange(width)[None, :] < b["lengths"][:, None]
    lp, olp, rlp = (
        np.where(mask, np.vstack([np.pad(x, (0, width - len(x))) for x in b[f]]), 0)
        for f in ("logp", "old_logp", "ref_logp")
    )
    expected = reference_objective(lp, olp, rlp, adv, mask)
    assert math.isclose(doc["objective"], expected, rel_tol=1e-12)
    # clip fractions, TRL definitions, over valid tokens
    delta = np.concatenate([lp - o for lp, o in zip(b["logp"], b["old_logp"], strict=True)])
    ratio = np.exp(delta)
    a_tok = np.repeat(adv, b["lengths"])
    low = (ratio < 0.8) & (a_tok < 0)
    high = (ratio > 1.2) & (a_tok > 0)
    T = delta.size
    assert doc["counts"]["tokens"] == T and doc["counts"]["answers"] == 40
    assert doc["clip_fraction"]["low"] == low.sum() / T
    assert doc["clip_fraction"]["high"] == high.sum() / T
    assert doc["clip_fraction"]["region"] == (low | high).sum() / T
    assert doc["clip_fraction"]["outside_range"] == ((ratio < 0.8) | (ratio > 1.2)).sum() / T
    assert doc["clip_fraction"]["dual_clip_lower"] is None
    for name, q in QUANTILES.items():
        assert math.isclose(doc["ratio"][name], float(np.quantile(ratio, q)), rel_tol=1e-12)
    assert doc["ratio"]["min"] == ratio.min() and doc["ratio"]["max"] == ratio.max()
    assert math.isclose(doc["ratio"]["mean"], ratio.mean(), rel_tol=1e-12)
    d = np.concatenate([rf - lp for lp, rf in zip(b["logp"], b["ref_logp"], strict=True)])
    kl = np.exp(d) - d - 1
    assert math.isclose(doc["kl"]["mean"], kl.mean(), rel_tol=1e-12)
    assert doc["kl"]["max"] == kl.max()
    assert math.isclose(doc["kl"]["p50"], float(np.median(kl)), rel_tol=1e-12)
    assert doc["lengths"]["max"] == max(b["lengths"]) and doc["lengths"]["min"] == min(b["lengths"])
    assert sum(h["count"] for h in doc["ratio_histogram"]) == T
    assert doc["settings"]["clip_eps"] == 0.2 and doc["settings"]["beta"] == 0.04


def test_npz_and_parquet_give_identical_json(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(12)
    b = random_batch(rng, n=30, width=20, groups=6)
    a = cli.json("objective", write_npz(tmp_path / "b.npz", b, fill=-123.0))
    p = cli.json("objective", write_parquet(tmp_path / "b.parquet", b))
    a.pop("source"), p.pop("source")
    assert a == p
    for cmd in ("kl", "advantages"):
        x = cli.json(cmd, tmp_path / "b.npz")
        y = cli.json(cmd, tmp_path / "b.parquet")
        x.pop("source"), y.pop("source")
        assert x == y


@pytest.mark.parametrize("fill", [1e30, -7.0, np.nan])
def test_padding_values_never_change_the_cli_result(cli: Cli, tmp_path: Path, fill: float) -> None:
    # padding may hold any finite value; NaN in padding is ignored as well (never read)
    b = random_batch(np.random.default_rng(13), n=10, width=8)
    a = cli.json("objective", write_npz(tmp_path / "a.npz", b, fill=0.0))
    c = cli.json("objective", write_npz(tmp_path / "c.npz", b, fill=fill))
    a.pop("source"), c.pop("source")
    assert a == c


def test_advantages_json_is_nested_for_2d_rewards(cli: Cli, tmp_path: Path) -> None:
    r = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    np.savez(tmp_path / "r.npz", rewards=r)
    doc = cli.json("advantages", tmp_path / "r.npz")
    assert doc["advantages"] == group_advantages(r).tolist()
    s = doc["summary"]
    assert (s["groups"], s["answers"], s["zero_variance_groups"]) == (3, 12, 1)
    assert s["frac_zero_variance_groups"] == 1 / 3
    assert [g["zero_variance"] for g in doc["groups"]] == [False, False, True]
    assert doc["groups"][1]["std"] == math.sqrt(0.1875)


def test_advantages_json_is_row_order_for_answer_rows(cli: Cli, tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(15), n=9, width=4, groups=2)
    doc = cli.json("advantages", write_parquet(tmp_path / "b.parquet", b))
    assert len(doc["advantages"]) == 9
    g, r = b["group"], b["reward"]
    for i in range(9):
        sel = g == g[i]
        if r[sel].max() == r[sel].min():
            assert doc["advantages"][i] == 0.0
        else:
            assert math.isclose(
                doc["advantages"][i], (r[i] - r[sel].mean()) / (r[sel].std() + 1e-8), rel_tol=1e-12
            )


def test_string_group_ids_and_first_seen_order(cli: Cli, tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(16), n=6, width=3)
    b["group"] = np.array(["q7", "q2", "q7", "q2", "q9", "q9"])
    doc = cli.json("advantages", write_parquet(tmp_path / "b.parquet", b))
    assert [g["id"] for g in doc["groups"]] == ["q7", "q2", "q9"]


def test_advantages_out_roundtrip(cli: Cli, tmp_path: Path) -> None:
    r = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]])
    np.savez(tmp_path / "r.npz", rewards=r)
    assert cli("advantages", tmp_path / "r.npz", "--out", tmp_path / "a.npz").exit_code == 0
    with np.load(tmp_path / "a.npz") as z:
        np.testing.assert_array_equal(z["advantages"], group_advantages(r))
    assert cli("advantages", tmp_path / "r.npz", "--out", tmp_path / "a.parquet").exit_code == 0
    t = pq.read_table(tmp_path / "a.parquet")
    assert t.column("advantage").to_pylist() == group_advantages(r).reshape(-1).tolist()


def test_missing_old_logp_is_on_policy_with_a_note(cli: Cli, tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(17), n=8, width=5)
    path = write_parquet(tmp_path / "b.parquet", b)
    import pyarrow.parquet as pq2

    pq2.write_table(pq2.read_table(path).drop(["old_logp"]), path)
    r = cli("objective", path, "--json")
    assert r.exit_code == 0
    assert "on-policy" in r.stderr
    import json

    doc = json.loads(r.stdout)
    assert doc["on_policy"] is True
    assert doc["ratio"]["min"] == doc["ratio"]["max"] == 1.0
    assert doc["clip_fraction"]["region"] == 0.0
    # On-policy with group-centred advantages, the policy term is the mean advantage of
    # answers (seq-mean-token-mean): 0 up to rounding when every group is complete.
    assert abs(doc["policy_term"]) < 1e-12


def test_column_mapping_and_framework_aliases(cli: Cli, tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(18), n=8, width=5)
    base = cli.json("objective", write_parquet(tmp_path / "a.parquet", b))
    import pyarrow.parquet as pq2

    t = pq2.read_table(tmp_path / "a.parquet").rename_columns(
        ["uid", "score", "lp", "old_log_probs", "ref_log_prob"]
    )
    pq2.write_table(t, tmp_path / "b.parquet")
    doc = cli.json("objective", tmp_path / "b.parquet", "--column", "logp=lp", "-c", "reward=score")
    assert doc["objective"] == base["objective"]


def test_presets_and_overrides_are_echoed(cli: Cli) -> None:
    doc = cli.json("objective", SAMPLE / "batch.parquet", "--preset", "verl", "--dual-clip", "off")
    s = doc["settings"]
    assert (s["preset"], s["ddof"], s["eps"], s["agg"], s["dual_clip"]) == (
        "verl",
        1,
        1e-6,
        "token-mean",
        None,
    )
    assert doc["aggregation"] == "token-mean"
    assert doc["objective"] == doc["aggregations"]["token-mean"]


@pytest.mark.parametrize(
    "cmd", [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]
)
def test_every_command_has_help(cli: Cli, cmd: str) -> None:
    """Every registered command, present and future (check and trend were missed)."""
    r = cli(cmd, "--help")
    assert r.exit_code == 0 and "Usage" in r.stdout and r.stdout.count("\n") > 5


def test_tables_render_for_sample_data(cli: Cli) -> None:
    r = cli("objective", SAMPLE / "batch.parquet", "--compare", "--full")
    assert r.exit_code == 0
    for text in (
        "objective J",
        "loss = −J",
        "Clip fractions",
        "Ratio histogram",
        "seq-mean-token-sum-norm",
    ):
        assert text in r.stdout
    assert cli("advantages", SAMPLE / "rewards.npz").exit_code == 0
    assert cli("kl", SAMPLE / "batch.npz").exit_code == 0
    assert "\x1b[" not in r.stdout  # no colour codes when stdout is not a terminal


def test_sample_command_is_deterministic(cli: Cli, tmp_path: Path) -> None:
    for name in ("a", "b"):
        r = cli(
            "sample",
            tmp_path / f"{name}.parquet",
            "--groups",
            "3",
            "--group-size",
            "4",
            "--mean-len",
            "20",
            "--seed",
            "5",
        )
        assert r.exit_code == 0, r.stderr
    ta, tb = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert ta.equals(tb) and ta.num_rows == 12
    r = cli("sample", tmp_path / "c.npz", "--groups", "2", "--group-size", "3", "--mean-len", "10")
    assert r.exit_code == 0
    doc = cli.json("objective", tmp_path / "c.npz")
    assert doc["counts"]["answers"] == 6 and doc["counts"]["groups"] == 2


def test_python_dash_m_entry_point() -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "--version"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0 and r.stdout.startswith("grpo-cli ")


def test_parquet_mask_column_equals_npz_mask(cli: Cli, tmp_path: Path) -> None:
    # the same valid tokens: npz pads and masks; parquet keeps every token in its lists
    # and masks some of them (e.g. tool output inside an answer)
    rng = np.random.default_rng(19)
    b = random_batch(rng, n=12, width=9, groups=3)
    keep = [rng.random(k) < 0.7 for k in b["lengths"]]
    for k in keep:
        k[0] = True  # every answer keeps a token
    kept = {
        f: [x[k] for x, k in zip(b[f], keep, strict=True)] for f in ("logp", "old_logp", "ref_logp")
    }
    only = {**b, **kept, "lengths": np.array([int(k.sum()) for k in keep])}
    a = cli.json("objective", write_npz(tmp_path / "a.npz", only))
    masked = write_parquet(
        tmp_path / "m.parquet",
        b,
        mask=pa.array([k.tolist() for k in keep], type=pa.list_(pa.bool_())),
    )
    p = cli.json("objective", masked)
    for doc in (a, p):
        doc.pop("source"), doc.pop("max_len"), doc.pop("aggregations"), doc.pop("length_weights")
    assert a == p


def test_sample_extras_add_fields_without_changing_the_others(cli: Cli, tmp_path: Path) -> None:
    args = ["--groups", "3", "--group-size", "4", "--mean-len", "20", "--seed", "9"]
    assert cli("sample", tmp_path / "a.parquet", *args).exit_code == 0
    assert cli("sample", tmp_path / "b.parquet", *args, "--extras").exit_code == 0
    a, b = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert set(b.column_names) - set(a.column_names) == {"rollout_logp", "entropy"}
    assert b.select(a.column_names).equals(a)
    doc = cli.json("objective", tmp_path / "b.parquet")
    assert doc["rollout"]["kl_k3"] < 1e-3 and 0 <= doc["entropy"]["min"]


def test_json_runs_start_without_rich() -> None:
    # what a pipeline times: `--json` never imports the table renderer or the check rules
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from grpo_cli.cli import app\n"
        f"sys.argv = ['grpo-cli', 'objective', {str(SAMPLE / 'batch.parquet')!r}, '--json']\n"
        "try:\n"
        "    app()\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'rich'\n"
        "          or m.startswith(('grpo_cli.commands.check', 'grpo_cli.check'))]\n"
        "print(loaded, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert '"objective"' in r.stdout
    assert r.stderr.strip().splitlines()[-1] == "[]"


CLIENTS = ("pandas", "polars", "duckdb", "datasets")


@pytest.mark.parametrize(
    "args",
    [
        ["objective", "batch.parquet", "--json"],
        ["objective", "batch.npz", "--json"],
        ["advantages", "rewards.npz", "--json"],
        ["advantages", "batch.parquet", "--json"],
        ["kl", "batch.parquet", "--json"],
        ["check", "batch.parquet", "--format", "json"],
        ["check", "batch.npz"],
        ["answers", "batch.parquet", "--json"],
        ["trend", "batch.parquet", "--json"],
    ],
)
def test_no_client_library_is_imported(args: list[str]) -> None:
    # pyarrow's Array.to_numpy and pa.array import pandas whenever it is installed (0.3 s of
    # start-up): the readers build numpy views and Arrow arrays from buffers instead
    import subprocess
    import sys

    if not os.environ.get("GRPO_CLI_REQUIRE_EXTRAS"):
        pytest.importorskip("pandas")  # without it the test cannot fail
    argv = [args[0], str(SAMPLE / args[1]), *args[2:]]
    code = (
        "import sys\n"
        "from grpo_cli.cli import app\n"
        f"sys.argv = ['grpo-cli', *{argv!r}]\n"
        "try:\n"
        "    app()\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, file=sys.stderr)\n"
        f"print([m for m in sys.modules if m.split('.')[0] in {CLIENTS!r}], file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.stdout.strip(), r.stderr
    assert r.stderr.strip().splitlines()[-1] == "[]", r.stderr


def test_only_the_command_asked_for_is_built() -> None:
    from grpo_cli.cli import _asked_for

    cmds = app.registered_commands
    assert [c.callback.__name__ for c in _asked_for(["kl"], cmds) if c.callback] == ["kl"]
    for first in ([], ["--help"], ["--version"], ["objectiv"], ["kl "]):
        assert _asked_for(first, cmds) == cmds
