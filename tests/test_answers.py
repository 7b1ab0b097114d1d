"""grpo-cli answers: the top answers by each key are the ones a full sort of statistics
computed here from the formulas gives, whatever the batches, workers and files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.commands.answers import FIELDS, SORT_KEYS, TopAnswers
from grpo_cli.commands.check import WORST_BY

from .conftest import Cli

EPS = 0.2


def _write(path: Path, seed: int, n: int) -> list[dict[str, Any]]:
    """A ragged file with a mask (masked tokens hold garbage) and an advantage column;
    returns each answer's statistics computed by loops over its valid tokens."""
    rng = np.random.default_rng(seed)
    rows: dict[str, list[Any]] = {k: [] for k in ("group", "advantage", "logp", "old_logp",
                                                  "ref_logp", "rollout_logp", "mask")}  # fmt: skip
    expected = []
    for i in range(n):
        width = int(rng.integers(1, 30))
        mask = rng.random(width) < 0.8
        mask[rng.integers(width)] = True
        logp = -rng.exponential(1.0, width)
        # log-probs stay below 0 (check's integrity rules pass)
        old = np.minimum(logp + rng.normal(0, 0.3, width), -1e-3)
        ref = np.minimum(logp + rng.normal(0, 0.5 + 0.1 * (i % 7), width), -1e-3)
        rollout = np.minimum(old + rng.normal(0, 0.05 * (1 + i % 3), width), -1e-3)
        garbage = ~mask
        logp[garbage], old[garbage], ref[garbage] = 5.0, -50.0, 40.0  # padding: ignored
        rollout[garbage] = 3.0
        adv = float(rng.normal()) if i % 5 else 0.0
        rows["group"].append(f"g{i // 4}")
        rows["advantage"].append(adv)
        for k, v in (("logp", logp), ("old_logp", old), ("ref_logp", ref),
                     ("rollout_logp", rollout), ("mask", mask)):  # fmt: skip
            rows[k].append(v.tolist())
        v = mask
        d = ref[v] - logp[v]
        k3 = np.exp(d) - d - 1  # Schulman's k3, DeepSeekMath eq. 4
        ratio = np.exp(logp[v] - old[v])
        dr = old[v] - rollout[v]
        clipped = ((ratio < 1 - EPS) & (adv < 0)) | ((ratio > 1 + EPS) & (adv > 0))
        # ∂J/∂logp_t times N (seq-mean-token-mean, k3, β = 0.04): the policy part A·ρ where
        # the clip does not bind, the KL part −β·(1 − e^d); over N·|o_i|
        free = ((adv > 0) & (ratio <= 1 + EPS)) | ((adv < 0) & (ratio >= 1 - EPS))
        g_n = (np.where(free, adv * ratio, 0.0) - 0.04 * (1 - np.exp(d))) / v.sum()
        expected.append(
            {
                "source": path.name,
                "row": i,
                "group": f"g{i // 4}",
                "advantage": adv,
                "length": int(v.sum()),
                "kl_mean": float(k3.mean()),
                "kl_max": float(k3.max()),
                "log_ratio_max_abs": float(np.abs(logp[v] - old[v]).max()),
                "clip_share": float(clipped.mean()),
                # sampler vs trainer: δ = old − rollout, k3(δ) = e^δ − δ − 1, the answer's mean
                "rollout_kl_mean": float(np.mean(np.exp(dr) - dr - 1)),
                "kl_max_token": int(np.argmax(k3)),  # among the valid tokens
                "log_ratio_max_token": int(np.argmax(np.abs(logp[v] - old[v]))),
                "g2_n2": float(np.sum(g_n**2)),  # Σ_t g_t² times N²
            }
        )
    pq.write_table(pa.table(rows), path, row_group_size=7)
    return expected


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    d = tmp_path_factory.mktemp("answers")
    expected = _write(d / "a.parquet", 1, 60) + _write(d / "b.parquet", 2, 45)
    total = sum(e["g2_n2"] for e in expected)
    for e in expected:
        e["gradient_share"] = e["g2_n2"] / total
    return d, expected


KEYS = SORT_KEYS  # --sort KEY -> the field ranked


def _top(expected: list[dict[str, Any]], field: str, k: int) -> list[dict[str, Any]]:
    def rank(i: int) -> tuple[float, int]:
        v = expected[i][field]
        return (-abs(v) if field == "advantage" else -v, i)

    order = sorted(range(len(expected)), key=rank)
    return [expected[i] for i in order[:k]]


@pytest.mark.parametrize("sort", list(KEYS))
def test_top_answers_are_a_full_sort_of_the_formulas(
    cli: Cli, data: tuple[Path, list[dict[str, Any]]], sort: str
) -> None:
    d, expected = data
    doc = cli.json("answers", d, "--sort", sort, "--top", "12", "--clip-eps", str(EPS))
    assert doc["command"] == "answers" and doc["sort"] == sort and doc["top"] == 12
    got = doc["answers"]
    want = _top(expected, KEYS[sort], 12)
    assert [(a["source"], a["row"]) for a in got] == [(w["source"], w["row"]) for w in want]
    for a, w in zip(got, want, strict=True):
        assert list(a) == list(FIELDS)
        assert a["group"] == w["group"] and a["length"] == w["length"] and a["reward"] is None
        assert a["kl_max_token"] == w["kl_max_token"]
        assert a["log_ratio_max_token"] == w["log_ratio_max_token"]
        for k in ("advantage", "kl_mean", "kl_max", "log_ratio_max_abs", "clip_share",
                  "gradient_share", "rollout_kl_mean"):  # fmt: skip
            assert a[k] == pytest.approx(w[k], rel=1e-5, abs=1e-6), k


def test_same_ranking_for_any_batches_and_workers(
    cli: Cli, data: tuple[Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    d, _ = data
    base = cli.json("answers", d, "--sort", "length", "--top", "30")["answers"]
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "40")
    for workers in ("1", "3"):
        again = cli.json("answers", d, "--sort", "length", "--top", "30", "--workers", workers)
        # ties (equal lengths) broken by row, every time; the gradient's share to rounding
        for a, b in zip(again["answers"], base, strict=True):
            assert a["gradient_share"] == pytest.approx(b["gradient_share"], rel=1e-9)
        strip = [{k: v for k, v in a.items() if k != "gradient_share"} for a in base]
        assert [{k: v for k, v in a.items() if k != "gradient_share"}
                for a in again["answers"]] == strip  # fmt: skip


def test_merge_keeps_the_best_of_the_union() -> None:
    rng = np.random.default_rng(0)
    rows = [{"kl_mean": float(v), "_index": i} for i, v in enumerate(rng.integers(0, 9, 200))]
    rows[17]["kl_mean"] = float("nan")  # ranks last
    whole = TopAnswers("kl_mean", 25)
    whole.add(rows)
    parts = [TopAnswers("kl_mean", 25) for _ in range(4)]
    for j, r in enumerate(rows):
        parts[(j * 7) % 4].add([r])
    merged = parts[3].merge(parts[1]).merge(parts[0].merge(parts[2]))
    assert [r["_index"] for r in merged.rows] == [r["_index"] for r in whole.rows]
    want = sorted(range(200), key=lambda i: (-rows[i]["kl_mean"] if i != 17 else np.inf, i))
    assert [r["_index"] for r in whole.rows] == want[:25]


def test_without_reference_kl_is_null_and_noted(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "noref.parquet"
    pq.write_table(pa.table({"advantage": [1.0, -1.0], "logp": [[-1.0, -2.0], [-0.5]]}), f)
    r = cli("answers", f, "--beta", "0", "--json")
    assert r.exit_code == 0, r.stderr
    assert "kl_mean and kl_max are null" in r.stderr
    doc = json.loads(r.stdout)
    assert [a["row"] for a in doc["answers"]] == [0, 1]
    assert all(a["kl_mean"] is None and a["group"] is None for a in doc["answers"])
    assert any("group is null" in w for w in doc["warnings"])
    assert any("reward is null" in w for w in doc["warnings"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sort", "entropy"], "--sort: expected one of"),
        (["--top", "0"], "--top: expected a positive"),
    ],
)
def test_bad_arguments(cli: Cli, data: tuple[Path, Any], args: list[str], message: str) -> None:
    cli.error(["answers", str(data[0]), *args], message)


def test_table(cli: Cli, data: tuple[Path, Any]) -> None:
    r = cli("answers", data[0], "--top", "3")
    assert r.exit_code == 0 and "Top 3 answers by kl" in r.stdout


def test_check_names_the_worst_answers_of_a_failing_health_rule(
    cli: Cli, data: tuple[Path, list[dict[str, Any]]]
) -> None:
    d, expected = data
    r = cli("check", d, "--rule", "kl-max.fail=1", "--rule", "clip-region.warn=0.001",
            "--rule", "rollout-mismatch.warn=1e-6",
            "--clip-eps", str(EPS), "--format", "json")  # fmt: skip
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    by_rule = {x["rule"]: x for x in doc["results"]}
    assert by_rule["kl-max"]["status"] == "fail" and by_rule["clip-region"]["status"] == "warn"
    # the places to look: the answers beyond the threshold the rule crossed, worst first
    limits = {"kl-max": {"fail": 1.0}, "clip-region": {"warn": 0.001, "fail": 0.3},
              "rollout-mismatch": {"warn": 1e-6, "fail": 0.1}}  # fmt: skip
    for rule, field in (("kl-max", "kl_max"), ("clip-region", "clip_share"),
                        ("rollout-mismatch", "rollout_kl_mean")):  # fmt: skip
        limit = limits[rule][by_rule[rule]["status"]]
        want = [w for w in _top(expected, field, 5) if w[field] > limit]
        assert want  # a rule beyond its threshold has an answer beyond it here
        got = by_rule[rule]["examples"]
        # the answer index is the row in the whole input (a.parquet's 60 rows come first)
        index = [w["row"] + (60 if w["source"] == "b.parquet" else 0) for w in want]
        assert [g["answer"] for g in got] == index
        assert [Path(g["file"]).name for g in got] == [w["source"] for w in want]
        assert [g[field] for g in got] == pytest.approx([w[field] for w in want], rel=1e-6)
    # the worst answer's largest KL is the batch's largest
    want_tokens = [w["kl_max_token"] for w in _top(expected, "kl_max", 5) if w["kl_max"] > 1.0]
    assert [g["valid_token"] for g in by_rule["kl-max"]["examples"]] == want_tokens
    top_kl = by_rule["kl-max"]["examples"][0]["kl_max"]
    assert top_kl == pytest.approx(doc["objective"]["kl"]["max"])
    passing = [x for x in doc["results"] if x["status"] == "pass" and x["rule"] in WORST_BY]
    assert passing and all(x["examples"] == [] for x in passing)  # passing rules list nothing


H = 1e-6


def _gradient_file(
    path: Path, seed: int
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, int]:
    """A small ragged file (masked tokens hold garbage); returns its offsets, valid token
    fields, advantages and widest row (masked tokens included: L)."""
    rng = np.random.default_rng(seed)
    n = 14
    widths = rng.integers(2, 11, n)
    rows: dict[str, list[Any]] = {"advantage": [], "logp": [], "old_logp": [], "ref_logp": [],
                                  "mask": []}  # fmt: skip
    valid: dict[str, list[np.ndarray]] = {"logp": [], "old_logp": [], "ref_logp": []}
    for w in widths:
        mask = rng.random(w) < 0.85
        mask[0] = True
        lp = -rng.exponential(1.0, w)
        # log-ratios up to ±0.6: the clips and the log-ratio clamp bind on some tokens
        old, ref = lp - rng.uniform(-0.6, 0.6, w), lp + rng.normal(0, 0.8, w)
        for k, v in (("logp", lp), ("old_logp", old), ("ref_logp", ref)):
            valid[k].append(v[mask])
            garbage = v.copy()
            garbage[~mask] = 7.0
            rows[k].append(garbage.tolist())
        rows["mask"].append(mask.tolist())
        rows["advantage"].append(float(rng.normal()))
    pq.write_table(pa.table(rows), path, row_group_size=5)
    lengths = [len(v) for v in valid["logp"]]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    fields = {k: np.concatenate(v) for k, v in valid.items()}
    return offsets, fields, np.array(rows["advantage"]), int(widths.max())


GRADIENT_CASES = [
    {},  # seq-mean-token-mean for both: the constant cancels
    {"agg": "token-sum", "kl_agg": "token-mean", "beta": 0.1},  # 1 against 1/T: T counted
    {"agg": "seq-mean-token-sum-norm", "kl_agg": "seq-mean-token-mean", "beta": 0.05},  # L
    {
        "agg": "token-mean",
        "kl_agg": "seq-mean-token-sum",
        "beta": 0.2,
        "kl_estimator": "k2",
        "log_ratio_clamp": 0.3,
    },
    {
        "ratio_level": "sequence",
        "agg": "seq-mean-token-mean",
        "kl_agg": "token-mean",
        "beta": 0.1,
        "clip_eps": 0.05,
    },
    {"kl_mode": "reward", "trainer": "verl", "beta": 0.5},  # no KL term in the loss
]


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("kw", GRADIENT_CASES, ids=lambda kw: ",".join(map(str, kw.values())))
def test_gradient_share_is_the_finite_difference_gradient(
    tmp_path: Path, kw: dict[str, Any], backend: str
) -> None:
    """Each answer's gradient_share is its part of ‖∂J/∂logp‖², J = agg(policy) −
    β·kl_agg(kl) computed by the core, differentiated by central differences: whichever
    constants the two aggregations divide by (an answers pass does not know T or L
    before the end), on every backend, over several batches."""
    from grpo_cli import EngineOptions, open_source
    from grpo_cli.commands.answers import answers_report
    from grpo_cli.core import aggregate, token_terms
    from grpo_cli.settings import Settings

    if backend == "c" and not _fast_built():
        pytest.skip("compiled kernel not built")
    path = tmp_path / "g.parquet"
    offs, f, adv, widest = _gradient_file(path, 4)
    s = Settings(**kw)
    o = s.term_options()
    lmax = widest if s.max_len is None else s.max_len  # the widest row, as verl pads

    def J(x: np.ndarray) -> float:
        t = token_terms(x, f["old_logp"], f["ref_logp"], adv, offs, options=o)

        def agg(v: np.ndarray, how: Any) -> float:
            return aggregate(v, offs, agg=how, max_len=lmax, norm_scale=s.norm_scale)

        kl = agg(t.kl_loss, s.kl_aggregation) if o.beta and t.kl_loss is not None else 0.0
        return agg(t.policy, s.agg) - o.beta * kl

    lp = f["logp"]
    g = np.zeros(lp.shape)
    for i in range(lp.shape[0]):
        up, down = lp.copy(), lp.copy()
        up[i] += H
        down[i] -= H
        g[i] = (J(up) - J(down)) / (2 * H)
    per_answer = np.add.reduceat(g * g, offs[:-1])
    want = per_answer / per_answer.sum()
    engine = EngineOptions(backend=backend, batch_tokens=16, workers=2)
    r = answers_report(open_source([path]), s, sort="gradient", top=100, engine=engine)
    got = {a["row"]: a["gradient_share"] for a in r.rows}
    assert sorted(got) == list(range(len(want)))
    for row, share in got.items():
        assert share == pytest.approx(want[row], rel=1e-5, abs=1e-9), row
    order = sorted(range(len(want)), key=lambda i: (-want[i], i))
    assert [a["row"] for a in r.rows] == order  # ranked by the share, worst first


def _fast_built() -> bool:
    from grpo_cli.core import kernel as _fast

    return _fast.built()
