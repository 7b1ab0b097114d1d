"""Streaming: many record batches, several files, worker threads and histogram quantiles
give the in-memory answer (exactly where the maths allows, within the documented
resolution where quantiles come from the histogram)."""

from __future__ import annotations

import json
import math
import pickle
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from grpo_cli import (
    EngineOptions,
    objective_report,
    open_source,
    raw_from_arrow,
    resolve_settings,
    validate,
)
from grpo_cli.batch import Batch
from grpo_cli.commands.objective import TOKEN_FIELDS, fold_batch, kl_report
from grpo_cli.core import token_terms
from grpo_cli.core.stats import Histogram, IntCounts, Moments, Sketch, quantiles_from_counts
from grpo_cli.engine.plan import plan
from grpo_cli.engine.run import iter_batches
from grpo_cli.errors import InputError, MergeError
from grpo_cli.finalize.objective import objective_record
from grpo_cli.fold.groups import GroupPartial, group_table
from grpo_cli.fold.parts import LOG_RATIO_BINS
from grpo_cli.fold.pass1 import objective_pass1
from grpo_cli.fold.tokens import TokenPartial
from grpo_cli.io.answers import Answers, encode_groups
from grpo_cli.records import QUANTILES

from .conftest import SAMPLE, Cli, random_batch, write_npz, write_parquet

_Q = np.array(list(QUANTILES.values()))


# ------------------------------------------------------------------- partial statistics
def test_moments_merge_equals_concatenation() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.normal(3.0, 2.0, size=n) for n in (1, 7, 100, 3)]
    merged = Moments()
    for p in parts:
        merged.merge(Moments().update(p))
    x = np.concatenate(parts)
    assert merged.n == x.size
    assert math.isclose(merged.mean or 0, x.mean(), rel_tol=1e-13)
    assert math.isclose(merged.std or 0, x.std(), rel_tol=1e-12)
    assert (merged.min, merged.max) == (x.min(), x.max())
    fast = Moments(fast=True)
    for p in parts:
        fast.update(p)
    assert math.isclose(fast.std or 0, x.std(), rel_tol=1e-10)


def test_moments_report_infinity_not_nan() -> None:
    m = Moments().update(np.array([1.0, np.inf, 2.0]))
    assert m.mean == np.inf and m.std is None and m.n_inf == 1 and m.max == np.inf


def test_quantiles_from_counts_matches_numpy() -> None:
    rng = np.random.default_rng(2)
    x = rng.integers(0, 9, size=57).astype(float)
    v, c = np.unique(x, return_counts=True)
    np.testing.assert_allclose(quantiles_from_counts(v, c, _Q), np.quantile(x, _Q), rtol=1e-15)


def test_int_counts_merge_and_quantiles() -> None:
    a, b = np.array([3, 1, 4, 1, 5]), np.array([9, 2, 6])
    c = IntCounts().update(a).merge(IntCounts().update(b))
    x = np.concatenate([a, b])
    q = c.quantiles(_Q)
    assert q is not None
    np.testing.assert_allclose(q, np.quantile(x, _Q))
    mean, std, lo, hi = c.moments()
    assert (lo, hi) == (1, 9) and math.isclose(mean, x.mean()) and math.isclose(std, x.std())


def test_int_counts_of_huge_lengths_stay_small() -> None:
    # one answer of 60M tokens must not allocate a 60M-entry bincount (480 MB)
    a = np.array([3, 60_000_000, 1, 70_000, 70_000])
    b = np.array([2, 60_000_000, 5])
    c = IntCounts().update(a).merge(pickle.loads(pickle.dumps(IntCounts().update(b))))
    assert c.counts.shape[0] <= IntCounts.DENSE
    x = np.concatenate([a, b]).astype(float)
    q = c.quantiles(_Q)
    assert q is not None and c.n == 8
    np.testing.assert_allclose(q, np.quantile(x, _Q), rtol=1e-15)
    mean, std, lo, hi = c.moments()
    assert (lo, hi) == (1, 60_000_000)
    assert math.isclose(mean, x.mean(), rel_tol=1e-15) and math.isclose(std, x.std(), rel_tol=1e-12)


def test_histogram_bins_and_open_ends() -> None:
    h = Histogram(-1.0, 1.0, 4).update(np.array([-5.0, -1.0, -0.49, 0.0, 0.5, 0.99, 1.0, 7.0]))
    # bins: under | [-1,-.5) | [-.5,0) | [0,.5) | [.5,1) | over (>= 1)
    assert h.counts.tolist() == [1, 1, 1, 1, 2, 2]
    assert (h.vmin, h.vmax) == (-5.0, 7.0)


def test_histogram_counts_alike_in_few_or_many_values() -> None:
    # few values per update are added one by one, many at once by bincount: same counts,
    # and the same as numpy's own histogram on the inner bins
    x = np.random.default_rng(5).normal(0, 0.3, size=5000)
    few, many = Histogram(-1.0, 1.0, 100_000), Histogram(-1.0, 1.0, 100_000).update(x)
    for chunk in np.array_split(x, 500):
        few.update(chunk)
    np.testing.assert_array_equal(few.counts, many.counts)
    inner, _ = np.histogram(x, bins=100_000, range=(-1.0, 1.0))
    assert abs(int(np.abs(many.counts[1:-1] - inner).sum())) <= 2  # edge rounding only
    assert many.counts[0] == np.sum(x < -1.0) and many.counts[-1] == np.sum(x >= 1.0)


@pytest.mark.parametrize("cap", [0, 10])
def test_sketch_quantiles_within_documented_resolution(cap: int) -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(0, 0.05, 5000), rng.normal(0, 2.0, 50)])
    s = Sketch(*LOG_RATIO_BINS, exact_cap=cap)
    for chunk in np.array_split(x, 7):
        s.update(chunk)
    assert not s.is_exact
    width = (LOG_RATIO_BINS[1] - LOG_RATIO_BINS[0]) / LOG_RATIO_BINS[2]
    got = s.quantiles(_Q)
    assert got is not None
    assert np.all(np.abs(got - np.quantile(x, _Q)) <= width / 2 + 1e-15)
    # quantiles of exp(x): relative error at most exp(w/2) - 1
    ratio = s.quantiles(_Q, np.exp)
    assert ratio is not None
    assert np.all(np.abs(ratio / np.quantile(np.exp(x), _Q) - 1) <= math.expm1(width / 2) + 1e-15)


def test_sketch_is_exact_under_the_cap() -> None:
    x = np.array([0.3, -0.2, 0.1, 0.25])
    s = Sketch(*LOG_RATIO_BINS).update(x[:2]).merge(Sketch(*LOG_RATIO_BINS).update(x[2:]))
    assert s.is_exact
    np.testing.assert_array_equal(s.quantiles(_Q), np.quantile(x, _Q))


# ----------------------------------------------------------------------- end to end
def _strip(doc: dict[str, object]) -> dict[str, object]:
    """The document without what names where and how it was computed."""
    doc = dict(doc)
    doc.pop("source")
    doc.pop("engine")
    # split into files, the groups span them: that is said, and changes nothing computed
    warnings = doc.pop("warnings")
    assert isinstance(warnings, list)
    doc["warnings"] = [w for w in warnings if "appear in more than one file" not in w]
    return doc


def _close(a: object, b: object, rel: float) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k], rel)
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _close(x, y, rel)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-15), (a, b)
    else:
        assert a == b


def test_many_batches_files_and_workers_equal_one_batch(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(31)
    b = random_batch(rng, n=300, width=40, groups=23)
    whole = _strip(cli.json("objective", write_npz(tmp_path / "all.npz", b)))
    # the same answers over three parquet files, streamed in batches of ~64 tokens
    table = pq.read_table(write_parquet(tmp_path / "all.parquet", b))
    d = tmp_path / "parts"
    d.mkdir()
    for i, (lo, hi) in enumerate(((0, 90), (90, 200), (200, 300))):
        pq.write_table(table.slice(lo, hi - lo), d / f"part-{i}.parquet")
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "64")
    for spec in (
        [str(d)],
        [str(d / "part-*.parquet")],
        [str(d / f"part-{i}.parquet") for i in range(3)],
    ):
        streamed = _strip(cli.json("objective", *spec))
        _close(streamed, whole, rel=1e-12)
    settings = resolve_settings()
    src = open_source([str(d)])
    assert sum(1 for _ in iter_batches(src, ["logp"], batch_tokens=64)) > 10
    one = objective_report(src, settings, engine=EngineOptions(workers=1, batch_tokens=64))
    two = objective_report(src, settings, engine=EngineOptions(workers=2, batch_tokens=64))
    assert math.isclose(one.objective, two.objective, rel_tol=1e-12)
    again = objective_report(src, settings, engine=EngineOptions(workers=2, batch_tokens=64))
    assert again.objective == two.objective  # deterministic, whatever the thread timing


def test_streamed_histogram_quantiles_match_in_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(32)
    b = random_batch(rng, n=200, width=30)
    src = open_source([str(write_parquet(tmp_path / "b.parquet", b))])
    s = resolve_settings()
    exact = objective_report(src, s)
    binned = objective_report(src, s, exact_cap=0)
    assert exact.ratio.exact and not binned.ratio.exact
    w = (LOG_RATIO_BINS[1] - LOG_RATIO_BINS[0]) / LOG_RATIO_BINS[2]
    for k in QUANTILES:
        assert abs(binned.ratio.quantiles[k] / exact.ratio.quantiles[k] - 1) <= math.expm1(w / 2)
    assert binned.objective == exact.objective  # quantile mode never touches the sums
    # KL quantiles: |k3(d ± w/2) − k3(d)| is at most |e^d − 1|·w/2 + O(w²)
    assert exact.kl is not None and binned.kl is not None
    d = np.concatenate([r - lp for lp, r in zip(b["logp"], b["ref_logp"], strict=True)])
    bound = float(np.max(np.abs(np.expm1(d)))) * w / 2 + w * w
    for k in QUANTILES:
        assert abs(binned.kl.quantiles[k] - exact.kl.quantiles[k]) <= bound
    kb, ke = kl_report(src, s, exact_cap=0), kl_report(src, s)
    assert kb.token.mean == ke.token.mean


def test_progress_counts_every_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = random_batch(np.random.default_rng(33), n=50, width=20)
    src = open_source([str(write_parquet(tmp_path / "b.parquet", b))])
    seen: list[int] = []
    engine = EngineOptions(batch_tokens=32)
    objective_report(src, resolve_settings(), engine=engine, progress=seen.append)
    assert sum(seen) == 50 and len(seen) > 1


def test_bad_row_late_in_a_stream_is_a_clean_error(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = random_batch(np.random.default_rng(34), n=120, width=20)
    b["old_logp"][97][0] = np.inf
    path = write_parquet(tmp_path / "b.parquet", b)
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "32")
    for cmd in ("objective", "kl"):
        r = cli(cmd, path, "--json")
        if cmd == "kl":  # kl reads logp and ref_logp only: the bad old_logp is not its concern
            assert r.exit_code == 0
            continue
        assert r.exit_code == 2 and r.stdout == ""
        assert "'old_logp' has inf (no mask: every token counts) at row 97, token 0" in r.stderr
    r = cli("check", path, "--format", "json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    finite = next(x for x in doc["results"] if x["rule"] == "finite")
    assert finite["status"] == "fail" and finite["examples"][0]["answer"] == 97


def test_workers_option(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = random_batch(np.random.default_rng(35), n=60, width=20)
    path = write_parquet(tmp_path / "b.parquet", b)
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "32")
    docs = [cli.json("objective", path, "--workers", str(w)) for w in (1, 2, 3)]
    for d in docs[1:]:
        assert math.isclose(d["objective"], docs[0]["objective"], rel_tol=1e-12)
    assert cli("objective", path, "--workers", "0").exit_code == 2
    # kl and check take the workers too, and give the numbers one worker gives
    kl = [cli.json("kl", path, "--workers", str(w))["kl"] for w in (1, 3)]
    assert kl[0]["count"] == kl[1]["count"]
    assert math.isclose(kl[0]["mean"], kl[1]["mean"], rel_tol=1e-12)
    checks = []
    for w in (1, 3):
        r = cli("check", path, "--format", "json", "--workers", str(w))
        assert r.exit_code in (0, 1) and r.stderr == "", r.stderr  # 1: a rule failed
        checks.append(json.loads(r.stdout))
    assert [x["status"] for x in checks[0]["results"]] == [
        x["status"] for x in checks[1]["results"]
    ]
    assert checks[1]["engine"]["workers"] == 3


# ------------------------------------------------------------- row groups in parallel
def _row_groups(path: Path, rows: int) -> Path:
    """Rewrite a parquet file with ``rows`` rows per row group."""
    table = pq.read_table(path)
    pq.write_table(table, path, row_group_size=rows)
    return path


def test_row_group_streams_equal_one_stream(tmp_path: Path) -> None:
    b = random_batch(np.random.default_rng(36), n=230, width=30, groups=17)
    path = _row_groups(write_parquet(tmp_path / "b.parquet", b), 20)  # 12 row groups
    src = open_source([str(path)])
    streams = plan(src, ["logp"], EngineOptions(workers=2)).streams
    assert streams is not None and len(streams) == 2
    # row groups alternate between the streams; each stream keeps row order
    starts = [[u.start for u in s] for s in streams]
    assert starts[0] == list(range(0, 230, 40)) and starts[1] == list(range(20, 230, 40))
    s = resolve_settings()
    one = objective_report(src, s, engine=EngineOptions(workers=1))  # one stream, no threads
    two = objective_report(src, s, engine=EngineOptions(workers=2))  # two row-group streams
    three = objective_report(src, s, engine=EngineOptions(workers=3))
    for r in (two, three):
        assert (r.answers, r.tokens, r.clip) == (one.answers, one.tokens, one.clip)
        assert math.isclose(r.objective, one.objective, rel_tol=1e-12)
        assert r.ratio.quantiles == one.ratio.quantiles
    assert objective_report(src, s, engine=EngineOptions()).objective == two.objective
    seen: list[int] = []
    objective_report(src, s, engine=EngineOptions(workers=2), progress=seen.append)
    assert sum(seen) == 230 and len(seen) == 12  # one tick per batch, from both streams
    k1 = kl_report(src, s, engine=EngineOptions(workers=1))
    k2 = kl_report(src, s, engine=EngineOptions(workers=2))
    assert k1.token.count == k2.token.count and k2.token.mean is not None
    assert math.isclose(k2.token.mean, k1.token.mean or 0.0, rel_tol=1e-12)
    # fewer row groups than streams: the single reader feeds the workers instead
    single = write_parquet(tmp_path / "one.parquet", b)
    assert plan(open_source([str(single)]), ["logp"], EngineOptions(workers=2)).streams is None


@pytest.mark.parametrize(
    ("bad_rows", "reported"),
    [((13, 25), 13), ((25, 13), 13), ((5, 15), 5), ((25,), 25), ((15,), 15)],
)
def test_first_bad_row_is_reported_whichever_stream_meets_it(
    cli: Cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bad_rows: tuple[int, ...],
    reported: int,
) -> None:
    # row groups of 10 rows: rows 0-9 and 20-29 go to stream 0, rows 10-19 to stream 1
    b = random_batch(np.random.default_rng(37), n=60, width=12)
    for row in bad_rows:
        b["old_logp"][row][0] = np.nan
    path = _row_groups(write_parquet(tmp_path / "b.parquet", b), 10)
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "16")
    r = cli("objective", path, "--json")
    assert r.exit_code == 2 and r.stdout == ""
    assert (
        f"'old_logp' has nan (no mask: every token counts) at row {reported}, token 0" in r.stderr
    )


def test_streams_stop_when_pass_one_fails(tmp_path: Path) -> None:
    # the row-group readers start before pass 1; an error there must not leave them running
    b = random_batch(np.random.default_rng(38), n=80, width=20)
    path = _row_groups(write_parquet(tmp_path / "b.parquet", b), 10)
    table = pq.read_table(path).drop_columns(["reward"])
    pq.write_table(table, path, row_group_size=10)
    src = open_source([str(path)])
    with pytest.raises(InputError, match="neither 'advantage' nor 'reward' is present"):
        objective_report(src, resolve_settings())
    assert not [t for t in threading.enumerate() if t.name == "grpo-cli-prefetch"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GRPO_CLI_WORKERS", "two", "GRPO_CLI_WORKERS must be an integer, got 'two'"),
        ("GRPO_CLI_WORKERS", "-1", "GRPO_CLI_WORKERS must be >= 0, got -1"),
        ("GRPO_CLI_BATCH_TOKENS", "0", "GRPO_CLI_BATCH_TOKENS must be >= 1, got 0"),
    ],
)
def test_bad_tuning_variable_is_a_one_line_error(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    path = write_parquet(tmp_path / "b.parquet", random_batch(np.random.default_rng(39), n=20))
    monkeypatch.setenv(name, value)
    r = cli("objective", path, "--json")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == f"grpo-cli: error: {message}\n"


# ------------------------------------------------------------------- partials on the wire
def _partial_after(tokens: int, exact_cap: int | None = 0) -> tuple[TokenPartial, Batch]:
    rng = np.random.default_rng(51)
    lengths = rng.integers(1, 1200, size=tokens // 600)
    lengths[-1] += tokens - int(lengths.sum())
    off = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    logp = -rng.exponential(1.0, size=tokens).astype(np.float32)
    old = (logp + rng.normal(0, 0.1, size=tokens)).astype(np.float32)
    ref = (logp + rng.normal(0, 0.1, size=tokens)).astype(np.float32)
    b = Batch(start=0, offsets=off, fields={"logp": logp, "old_logp": old, "ref_logp": ref},
              width=np.diff(off))  # fmt: skip
    p = TokenPartial(resolve_settings(), exact_cap=exact_cap)
    p.update(b, rng.normal(size=b.n))
    return p, b


def test_partials_are_small_on_the_wire() -> None:
    """Only occupied histogram bins are pickled: an empty partial was 9.6 MB (four dense
    histograms), one after a batch of the default 262,144 tokens (binned) was 10 MB."""
    empty = pickle.dumps(TokenPartial(resolve_settings()))
    assert len(empty) < 50_000
    p, _ = _partial_after(262_144)
    wire = pickle.dumps(p)
    assert len(wire) < 1_000_000
    q = pickle.loads(wire)
    for a, b in ((p.delta, q.delta), (p.kl_d, q.kl_d), (p.kl_answer_q, q.kl_answer_q)):
        np.testing.assert_array_equal(a.hist.counts, b.hist.counts)
        assert (a.hist.vmin, a.hist.vmax, a.n) == (b.hist.vmin, b.hist.vmax, b.n)
    assert q.term == p.term and q.clip == p.clip and q.kl_values.n == p.kl_values.n


def test_merge_refuses_partials_that_do_not_fit() -> None:
    p, _ = _partial_after(6_000)
    other = TokenPartial(resolve_settings(preset="verl"), exact_cap=0)
    with pytest.raises(MergeError, match="different settings"):
        p.merge(other)
    h = Histogram(-1.0, 1.0, 10)
    with pytest.raises(MergeError, match="bins"):
        h.merge(Histogram(-1.0, 1.0, 20))
    with pytest.raises(MergeError, match="exact caps"):
        Sketch(0.0, 1.0, 4, exact_cap=0).merge(Sketch(0.0, 1.0, 4, exact_cap=5))


def test_any_block_of_rows_folds_anywhere(tmp_path: Path) -> None:
    """Batches carry their answers' group ids and rewards: each computes its advantages
    from pass 1's group table, not from its position, so folding the batches one by one,
    in reverse order, gives the objective of the whole input."""
    b = random_batch(np.random.default_rng(52), n=300, width=25, groups=23)
    rng = np.random.default_rng(53)
    order = rng.permutation(300)  # the answers of a group are scattered over the file
    b = {k: [v[i] for i in order] if isinstance(v, list) else np.asarray(v)[order]
         for k, v in b.items()}  # fmt: skip
    src = open_source([str(write_parquet(tmp_path / "b.parquet", b))])
    s = resolve_settings(preset="verl")
    whole = objective_report(src, s)
    p1 = objective_pass1(src, s)
    batches = list(iter_batches(src, TOKEN_FIELDS, batch_tokens=200))
    assert len(batches) > 10
    for batch in batches:  # bit for bit the advantages of the whole input
        own = p1.adv[batch.start : batch.start + batch.n]
        assert p1.advantages(batch, "b").tolist() == own.tolist()
    parts = [fold_batch(batch, p1, s) for batch in reversed(batches)]
    total = parts[0]
    for p in parts[1:]:
        total = total.merge(p)
    rec = objective_record(src, s, total, p1, engine=EngineOptions())
    assert math.isclose(rec.objective, whole.objective, rel_tol=1e-12)
    assert (rec.clip, rec.answers, rec.tokens) == (whole.clip, whole.answers, whole.tokens)
    assert rec.ratio.quantiles == whole.ratio.quantiles


def test_group_partials_merge_to_the_two_pass_table() -> None:
    """Pass 1 as a mergeable partial: blocks of answers in any order give the table of the
    whole input (counts, extremes and zero variance exactly; moments to rounding)."""
    rng = np.random.default_rng(54)
    n = 500
    ids = pa.array([f"g{k}" for k in rng.integers(0, 37, n)])
    rewards = rng.choice([0.0, 0.5, 1.0, 3.0], n) + rng.normal(0, 1e-3, n) * (rng.random(n) < 0.5)
    rewards[np.asarray(pc.equal(ids, "g3"))] = 0.7  # a zero-variance group
    codes, _, table_ids = encode_groups(ids, "x", "ids")
    answers = Answers(n=n, codes=codes, labels=table_ids.to_pylist(), reward=rewards,
                      advantage=None, shape=None, group_ids=table_ids)  # fmt: skip
    for s in (resolve_settings(preset="trl"), resolve_settings(scale="batch")):
        whole = group_table(answers, s)
        assert whole is not None
        cuts = np.sort(rng.choice(np.arange(1, n), 7, replace=False))
        parts = [GroupPartial().update(ids[lo:hi], rewards[lo:hi])
                 for lo, hi in zip([0, *cuts], [*cuts, n], strict=True)]  # fmt: skip
        total = GroupPartial()
        for p in reversed(parts):
            total.merge(p)
        t = total.table(s)
        assert t is not None
        order = np.asarray(pc.index_in(whole.ids, value_set=t.ids))
        assert np.array_equal(t.stats.count[order], whole.stats.count)
        assert np.array_equal(t.stats.min[order], whole.stats.min)
        assert np.array_equal(t.stats.max[order], whole.stats.max)
        np.testing.assert_allclose(t.stats.mean[order], whole.stats.mean, rtol=1e-14)
        np.testing.assert_allclose(t.stats.std[order], whole.stats.std, rtol=1e-12, atol=1e-15)
        assert math.isclose(t.batch_std, whole.batch_std, rel_tol=1e-13)


def test_batches_from_any_arrow_reader() -> None:
    """raw_from_arrow + validate make batches from record batches in memory (a Ray
    block, a table): folded with pass 1, the same partial as the file reader's."""
    src = open_source([str(SAMPLE / "batch.parquet")])
    s = resolve_settings()
    p1 = objective_pass1(src, s)
    table = pq.read_table(SAMPLE / "batch.parquet")
    cols = {f: f for f in ("group", "reward", "logp", "old_logp", "ref_logp", "rollout_logp")}
    raw = raw_from_arrow(table.slice(40, 60).to_batches()[0], cols, start=40, label="block")
    mine = fold_batch(validate(raw), p1, s)
    # independently: the per-token terms of rows 40-99, with pass 1's advantages by row
    part = table.slice(40, 60)
    lists = {f: part.column(f).to_pylist() for f in ("logp", "old_logp", "ref_logp")}
    off = np.concatenate(([0], np.cumsum([len(x) for x in lists["logp"]])))
    flat = {f: np.concatenate([np.asarray(x, dtype=np.float64) for x in v])
            for f, v in lists.items()}  # fmt: skip
    terms = token_terms(flat["logp"], flat["old_logp"], flat["ref_logp"], p1.adv[40:100], off,
                        **s.term_kwargs())  # fmt: skip
    assert mine.answers == 60 and mine.tokens == int(off[-1])
    assert math.isclose(mine.term.token, float(terms.term.sum()), rel_tol=1e-12)
    with pytest.raises(InputError, match="no token column"):
        raw_from_arrow(table.to_batches()[0], {"group": "group"})


def test_group_scope_of_files(cli: Cli, tmp_path: Path) -> None:
    """Two steps with the same prompt ids: read as one dataset they merge (4 groups of 16,
    with a warning naming the files, and group-size warns); --group-scope file keeps 8."""
    d = tmp_path / "steps"
    d.mkdir()
    for step in (1, 2):
        r = cli("sample", d / f"step_{step}.parquet", "--groups", "4", "--seed", str(step))
        assert r.exit_code == 0
    merged = cli.json("objective", str(d / "step_*.parquet"))
    assert merged["groups"]["groups"] == 4 and merged["groups"]["min_group_size"] == 16
    (note,) = [w for w in merged["warnings"] if "more than one file" in w]
    assert "step_1.parquet, step_2.parquet" in note and "--group-scope file" in note
    scoped = cli.json("objective", str(d), "--group-scope", "file")
    assert scoped["groups"]["groups"] == 8 and scoped["groups"]["max_group_size"] == 8
    assert not any("more than one file" in w for w in scoped["warnings"])
    # each step alone: the file-scoped advantages are each file's own
    adv = cli.json("advantages", str(d), "--group-scope", "file")["advantages"]
    one = cli.json("advantages", str(d / "step_1.parquet"))["advantages"]
    two = cli.json("advantages", str(d / "step_2.parquet"))["advantages"]
    assert adv == one + two
    r = cli("check", str(d), "--format", "json")
    size = next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "group-size")
    assert size["status"] == "warn" and "more than one file" in size["message"]
    r = cli("check", str(d), "--format", "json", "--group-scope", "file")
    scoped_check = json.loads(r.stdout)
    size = next(x for x in scoped_check["results"] if x["rule"] == "group-size")
    assert size["status"] == "pass"
    assert scoped_check["objective"]["objective"] == scoped["objective"]


def test_a_run_of_long_answers_makes_batches_of_few_rows(tmp_path: Path) -> None:
    """Batches are cut by tokens, not by the file's average row: 300 answers of 5,000
    tokens next to each other among 4,000 of 20 made batches of ~1.9M tokens (many times
    ``batch_tokens``); read small and joined, none exceeds it, and the numbers are those
    of one batch of everything."""
    from grpo_cli.io import open_source

    rng = np.random.default_rng(5)
    lens = np.concatenate([np.full(2000, 20), np.full(300, 5000), np.full(2000, 20)])
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    vals = pa.array(-rng.exponential(1.0, int(off[-1])))
    lst = pa.LargeListArray.from_arrays(pa.array(off), vals)
    n = len(lens)
    f = tmp_path / "clustered.parquet"
    pq.write_table(
        pa.table({"group": np.arange(n) // 4, "reward": rng.integers(0, 2, n) * 1.0,
                  "logp": lst, "old_logp": lst}),
        f, row_group_size=n,
    )  # fmt: skip
    src = open_source([str(f)])
    cap = 100_000
    batches = list(iter_batches(src, ["logp", "old_logp"], batch_tokens=cap, threaded=False))
    sizes = [int(b.offsets[-1]) for b in batches]
    assert sum(sizes) == int(off[-1]) and sum(b.n for b in batches) == n
    assert max(sizes) <= cap
    rows = [b.n for b in batches]
    assert min(rows) < 30 and max(rows) > 300  # few long rows, many short ones


def test_numpy_of_and_arrow_of_round_trip_without_pa_array() -> None:
    # the readers' own converters (pa.array and Array.to_numpy import pandas): values,
    # slices (an offset into the buffer), booleans, big-endian input, non-ASCII strings
    from grpo_cli.io import arrow_of, numpy_of

    rng = np.random.default_rng(0)
    for dtype in ("<f4", ">f8", "<i2", ">i8", "<u4", "<u8"):
        x = (rng.normal(size=50) * 100).astype(dtype)
        a = arrow_of(x)
        assert a.to_pylist() == x.tolist()
        assert np.array_equal(numpy_of(a), x) and np.array_equal(numpy_of(a.slice(7, 20)), x[7:27])
    b = pa.array([True, False, True, True, False] * 3).slice(3)
    assert numpy_of(b).dtype == np.bool_ and numpy_of(b).tolist() == b.to_pylist()
    assert numpy_of(pa.chunked_array([pa.array([1.5]), pa.array([2.5, 3.5])])).tolist() == [
        1.5, 2.5, 3.5,
    ]  # fmt: skip
    assert numpy_of(pa.array([], pa.float32())).shape == (0,)
    s = np.array(["q1", "", "préfixe [INST]", "日本"])
    assert arrow_of(s).type == pa.string() and arrow_of(s).to_pylist() == s.tolist()
    assert arrow_of([3, 1, 2]).to_pylist() == [3, 1, 2]
    with pytest.raises(ValueError):
        numpy_of(pa.array([1.0, None]))


def test_quantiles_linear_is_numpys_bit_for_bit() -> None:
    from grpo_cli.core.stats import quantiles_linear
    from grpo_cli.records import QUANTILE_LEVELS

    rng = np.random.default_rng(5)
    qs = np.concatenate([QUANTILE_LEVELS, [0.0, 1.0, 0.5, 1 / 3], rng.random(20)])
    cases = [np.array([2.5]), np.array([1.0, -1.0]), rng.integers(0, 3, 40).astype(float)]
    cases += [rng.normal(size=n) * 10.0 ** rng.integers(-300, 300) for n in (3, 17, 1000)]
    cases += [np.array([1.0, np.inf, 3.0]), np.array([-np.inf, 0.0, np.inf, np.inf])]
    cases += [np.array([1.0, np.nan, 0.0])]
    for x in cases:
        with np.errstate(invalid="ignore"):
            want = np.quantile(x, qs)
        got = quantiles_linear(x, qs)
        assert np.array_equal(got, want, equal_nan=True), x
        assert got.tobytes() == want.tobytes() or np.isnan(want).any()
