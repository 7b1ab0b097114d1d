"""The compiled kernel (grpo_cli/_kernel.c) against the numpy path it replaces.

Both fold the same batches into a TokenPartial; every count and histogram bin must be
equal, every sum equal up to summation order (tolerances scale with the sum of the
magnitudes summed), on random ragged batches with every setting, overflowing ratios and
KL values, float32 and float64 columns, and answers longer than the kernel's block.

CI sets GRPO_CLI_KERNEL=c, so there a missing kernel fails these tests instead of
skipping them.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_cli import EngineOptions, objective_report, open_source, resolve_settings
from grpo_cli.batch import Batch
from grpo_cli.core import ClipCounts, clip_counts, ratio_moments, token_terms
from grpo_cli.core import kernel as _fast
from grpo_cli.errors import GrpoCliError, InputError, UsageError
from grpo_cli.fold.tokens import TokenPartial
from grpo_cli.settings import Settings

from .conftest import SAMPLE, Cli

built = _fast._library() is not None
pytestmark = pytest.mark.skipif(
    not built and os.environ.get("GRPO_CLI_KERNEL") != "c",
    reason="compiled kernel not built (no C compiler at install)",
)


def _batch(rng: np.random.Generator, lengths: list[int], dtype: Any, spread: float) -> Batch:
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    t = int(offsets[-1])
    logp = -rng.exponential(1.0, size=t)
    # log-ratios: mostly near 0, some far out (spread 800 overflows exp to inf)
    far = rng.random(t) < 0.05
    old = logp - np.where(far, rng.uniform(-spread, spread, size=t), rng.normal(0, 0.2, size=t))
    ref = logp + np.where(
        rng.random(t) < 0.05, rng.uniform(-spread, spread, t), rng.normal(0, 0.1, t)
    )
    fields = {"logp": logp, "old_logp": old, "ref_logp": ref}
    fields = {k: v.astype(dtype) for k, v in fields.items()}
    lengths_arr = np.diff(offsets)
    return Batch(start=0, offsets=offsets, fields=fields, width=lengths_arr)


def _fold(
    batch: Batch,
    adv: np.ndarray,
    s: Settings,
    compiled: bool,
    vector: bool,
    gradient: bool = False,
) -> TokenPartial:
    p = TokenPartial(s, gradient=gradient)
    p.compiled, p.vector = compiled, vector
    p.update(batch, adv)
    return p


def _scale(batch: Batch, adv: np.ndarray, s: Settings) -> dict[str, float]:
    """Σ|v| of each per-token value summed: the size of a sum's rounding error."""
    f = batch.fields
    t = token_terms(
        np.asarray(f["logp"], dtype=np.float64),
        None if "old_logp" not in f else np.asarray(f["old_logp"], dtype=np.float64),
        None if "ref_logp" not in f else np.asarray(f["ref_logp"], dtype=np.float64),
        adv,
        batch.offsets,
        **s.term_kwargs(),
    )
    with np.errstate(over="ignore", invalid="ignore"):
        out = {"term": float(np.sum(np.abs(t.term))), "policy": float(np.sum(np.abs(t.policy)))}
        out["kl"] = float(np.sum(np.abs(t.kl))) if t.kl is not None else 0.0
    return out


def _near(a: float, b: float, scale: float, what: str) -> None:
    assert not (math.isnan(a) or math.isnan(b)), what
    if math.isinf(a) or math.isinf(b) or math.isinf(scale):
        assert a == b or math.isinf(scale), (what, a, b)
        return
    assert abs(a - b) <= 1e-12 * scale + 1e-300, (what, a, b, scale)


def _same(c: TokenPartial, n: TokenPartial, scale: dict[str, float]) -> None:
    """Compiled partial ``c`` against numpy partial ``n``."""
    assert (c.answers, c.tokens, c.max_width) == (n.answers, n.tokens, n.max_width)
    if c.gradient_wanted:
        _same_gradient(c, n)
    assert c.clip == n.clip
    assert c.clip_shares == n.clip_shares  # per-answer counts over integer lengths: exact
    lc, ln = c.log_ratios, n.log_ratios
    for a, b, what in ((lc.delta, ln.delta, "ΣΔ"), (lc.delta20, ln.delta20, "Σ clamp Δ"),
                       (lc.ref, ln.ref, "Σd")):  # fmt: skip
        if math.isfinite(a) or math.isfinite(b):
            assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9), (what, a, b)
    for key in ("term", "policy", "kl"):
        sc, sn = getattr(c, key), getattr(n, key)
        _near(sc.token, sn.token, scale[key], f"{key} token sum")
        _near(sc.answer_means, sn.answer_means, scale[key], f"{key} answer means")
    assert c.ratio.n_inf == n.ratio.n_inf
    if c.ratio.n_inf == 0:
        assert math.isclose(c.ratio.total, n.ratio.total, rel_tol=1e-12)
        assert math.isclose(c.ratio.sq, n.ratio.sq, rel_tol=1e-12)
    else:
        assert c.ratio.total == n.ratio.total == math.inf
    # the kernel bins into this thread's scratch counts, handed back whole: none is left
    for buf in getattr(_fast._local, "bufs", {}).values():
        assert not buf[0].any() and not buf[1].any()
    # Δ and d are computed with the same operations: histograms and extremes are exact
    for sk_c, sk_n in ((c.delta, n.delta), (c.kl_d, n.kl_d)):
        assert sk_c.n == sk_n.n
        np.testing.assert_array_equal(sk_c.hist.counts, sk_n.hist.counts)
        assert (sk_c.hist.vmin, sk_c.hist.vmax) == (sk_n.hist.vmin, sk_n.hist.vmax)
        assert sk_c.exact is not None and sk_n.exact is not None
        if sk_c.n:
            np.testing.assert_array_equal(np.concatenate(sk_c.exact), np.concatenate(sk_n.exact))
    kc, kn = c.kl_values, n.kl_values
    assert (kc.n, kc.n_inf) == (kn.n, kn.n_inf)
    if kc.n:
        _near(kc.total, kn.total, scale["kl"], "kl total")
        # extremes: the vector exp is within 4 ulp of numpy's, and k3 = e^x − x − 1 cancels
        for a, b in ((kc.lo, kn.lo), (kc.hi, kn.hi)):
            assert math.isclose(a, b, rel_tol=1e-13, abs_tol=1e-14), (a, b)


def _same_gradient(c: TokenPartial, n: TokenPartial) -> None:
    """The kernel's gradient sums against numpy's (token_gradients): the derivatives are
    the same operations, so the counts of nonzero ones are equal and the sums of their
    squares and products agree to the order of additions (1e-12 of their magnitude)."""
    gc, gn = c.grad, n.grad
    assert (gc.tokens_policy, gc.answers_policy) == (gn.tokens_policy, gn.answers_policy)
    pairs = [(gc.pp[i], gn.pp[i]) for i in (0, 1)] + [(gc.kk[i], gn.kk[i]) for i in (0, 1)]
    pairs += [(gc.pk[i][j], gn.pk[i][j]) for i in (0, 1) for j in (0, 1)]
    size = max((abs(b) for _, b in pairs if math.isfinite(b)), default=0.0)
    for a, b in pairs:
        if math.isfinite(a) or math.isfinite(b):
            # |Σ u u' g_p g_k| <= sqrt(pp·kk): the squares bound the products' rounding
            assert abs(a - b) <= 1e-12 * size + 1e-300, (a, b, size)
        else:
            assert a == b or (math.isnan(a) and math.isnan(b)), (a, b)
    gc_, gn_ = c.gradient(), n.gradient()
    assert gc_ is not None and gn_ is not None
    for key, v in gn_.items():
        if math.isfinite(v):
            assert gc_[key] == pytest.approx(v, rel=1e-9, abs=1e-12 * math.sqrt(size)), key


SETTINGS = st.builds(
    lambda eps, high, dual, lrc, beta, est, kl_clamp: replace(
        resolve_settings(),
        clip_eps=eps,
        clip_eps_high=high,
        dual_clip=dual,
        log_ratio_clamp=lrc,
        beta=beta,
        kl_estimator=est,
        kl_clamp=kl_clamp,
    ),
    st.sampled_from([0.0, 0.2, 0.28]),
    st.sampled_from([None, 0.28, 5.0]),
    st.sampled_from([None, 3.0]),
    st.sampled_from([None, 1.0, 20.0]),
    st.sampled_from([0.0, 0.04, 1.0]),
    st.sampled_from(["k1", "k2", "k3"]),
    st.sampled_from([None, 10.0]),
)


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    s=SETTINGS,
    dtype=st.sampled_from([np.float32, np.float64]),
    spread=st.sampled_from([1.0, 60.0, 800.0]),
    zero_adv=st.booleans(),
    vector=st.booleans(),
    gradient=st.booleans(),
)
def test_kernel_equals_numpy(
    seed: int,
    lengths: list[int],
    s: Settings,
    dtype: Any,
    spread: float,
    zero_adv: bool,
    vector: bool,
    gradient: bool,
) -> None:
    rng = np.random.default_rng(seed)
    b = _batch(rng, lengths, dtype, spread)
    adv = rng.normal(0, 1, size=b.n)
    if zero_adv:
        adv[rng.random(b.n) < 0.5] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        c = _fold(b, adv, s, True, vector, gradient)
        _same(c, _fold(b, adv, s, False, False, gradient), _scale(b, adv, s))
        _same_as_core(c, b, adv, s)


def _same_as_core(c: TokenPartial, b: Batch, adv: np.ndarray, s: Settings) -> None:
    """The kernel's clip counts and ratio moments against their definitions in the core
    (clip_counts, ratio_moments), not against another partial."""
    f = {k: np.asarray(v, dtype=np.float64) for k, v in b.fields.items()}
    terms = token_terms(f["logp"], f.get("old_logp"), f.get("ref_logp"), adv, b.offsets,
                        **s.term_kwargs())  # fmt: skip
    cc = clip_counts(
        terms.ratio, adv, b.offsets,
        clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high, dual_clip=s.dual_clip,
    )  # fmt: skip
    assert c.clip == cc
    total, sq, n_inf = ratio_moments(terms.delta)
    assert c.ratio.n_inf == n_inf
    if n_inf == 0:
        assert math.isclose(c.ratio.total, total, rel_tol=1e-12)
        assert math.isclose(c.ratio.sq, sq, rel_tol=1e-12)


@pytest.mark.parametrize("vector", [True, False])
def test_long_answers_cross_the_kernel_block(vector: bool) -> None:
    # the kernel works in blocks of 512 tokens: lengths around and well past that
    rng = np.random.default_rng(7)
    b = _batch(rng, [511, 512, 513, 1, 1500, 4, 2049], np.float32, 60.0)
    adv = rng.normal(0, 1, size=b.n)
    s = replace(resolve_settings(), dual_clip=3.0)
    with np.errstate(over="ignore", invalid="ignore"):
        for g in (False, True):
            c, n = _fold(b, adv, s, True, vector, g), _fold(b, adv, s, False, False, g)
            _same(c, n, _scale(b, adv, s))


def test_on_policy_and_no_reference() -> None:
    rng = np.random.default_rng(8)
    b = _batch(rng, [5, 9, 3], np.float64, 1.0)
    adv = np.array([1.0, -2.0, 0.5])
    for drop in (["old_logp"], ["ref_logp"], ["old_logp", "ref_logp"]):
        fields = {k: v for k, v in b.fields.items() if k not in drop}
        bb = replace(b, fields=fields)
        s = replace(resolve_settings(), beta=0.0 if "ref_logp" in drop else 0.04)
        c, n = _fold(bb, adv, s, True, True), _fold(bb, adv, s, False, False)
        _same(c, n, _scale(bb, adv, s))
        if "old_logp" in drop:  # ratio 1 everywhere: the policy term is A, token by token
            assert c.ratio.total == c.tokens
            assert c.policy.token == pytest.approx(float(adv @ np.diff(bb.offsets)))


def test_hand_worked_batch() -> None:
    # two answers, values chosen so that every branch is taken and the sums are by hand
    lp = np.array([-1.0, -1.0, -1.0, -2.0, -2.0])
    old = lp - np.log([0.5, 1.0, 1.5, 0.5, 10.0])  # ratios 0.5, 1, 1.5 | 0.5, 10
    ref = lp + np.array([0.0, 0.0, 0.0, 0.0, 1.0])  # d = 0 except the last token: k3 = e − 2
    b = Batch(
        start=0,
        offsets=np.array([0, 3, 5]),
        fields={"logp": lp, "old_logp": old, "ref_logp": ref},
        width=np.array([3, 2]),
    )
    adv = np.array([1.0, -1.0])
    s = replace(resolve_settings(), dual_clip=3.0, beta=0.1)
    p = _fold(b, adv, s, True, True)
    # A = 1: min(ρ, 1.2) → 0.5 + 1 + 1.2; A = −1: −min(max(ρ, 0.8), 3) → −0.8 − 3
    assert p.policy.token == pytest.approx(2.7 - 3.8, rel=1e-15)
    assert p.kl.token == pytest.approx(math.e - 2, rel=1e-15)
    assert p.term.token == pytest.approx(2.7 - 3.8 - 0.1 * (math.e - 2), rel=1e-15)
    assert p.policy.answer_means == pytest.approx(2.7 / 3 - 3.8 / 2, rel=1e-15)
    # low: ρ < 0.8 with A < 0 (0.5); high: ρ > 1.2 with A > 0 (1.5); outside: 0.5,1.5,0.5,10
    # dual: ρ > 3 with A < 0 (10)
    assert p.clip == ClipCounts(low=1, high=1, region=2, outside=4, dual=1)
    assert p.ratio.total == pytest.approx(0.5 + 1 + 1.5 + 0.5 + 10, rel=1e-15)


def test_cli_results_agree_with_numpy(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    path = SAMPLE / "batch.parquet"
    compiled = cli.json("objective", path, "--preset", "verl")
    monkeypatch.setenv("GRPO_CLI_KERNEL", "numpy")
    plain = cli.json("objective", path, "--preset", "verl")
    assert compiled["counts"] == plain["counts"]
    assert compiled["clip_fraction"] == plain["clip_fraction"]
    for key in ("objective", "policy_term", "kl_term"):
        assert math.isclose(compiled[key], plain[key], rel_tol=1e-11), key
    assert compiled["ratio"]["p50"] == plain["ratio"]["p50"]


def test_version_names_the_kernel(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    r = cli("--version")
    kernel = _fast.kernel_name(EngineOptions().resolved().backend)
    assert r.exit_code == 0 and r.stdout.strip().endswith(f"(token kernel: {kernel})")
    monkeypatch.setenv("GRPO_CLI_KERNEL", "numpy")
    assert cli("--version").stdout.strip().endswith("(token kernel: numpy)")
    monkeypatch.setenv("GRPO_CLI_KERNEL", "fast")
    for args in (["--version"], ["objective", str(SAMPLE / "batch.parquet"), "--json"]):
        r = cli(*args)
        assert r.exit_code == 2 and r.stdout == ""
        assert r.stderr == "grpo-cli: error: GRPO_CLI_KERNEL must be auto, c or numpy, got 'fast'\n"


def test_engine_options_choose_the_backend(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library never reads the environment: the backend is an engine option, decided
    (auto) once and echoed; the CLI maps GRPO_CLI_KERNEL to it."""
    monkeypatch.setenv("GRPO_CLI_KERNEL", "numpy")  # ignored by the library
    assert EngineOptions().resolved().backend == ("c" if built else "numpy")
    src = open_source([str(SAMPLE / "batch.parquet")])
    r = objective_report(src, resolve_settings(), engine=EngineOptions(backend="numpy"))
    assert r.tokens > 0 and r.engine.backend == "numpy"
    doc = cli.json("objective", str(SAMPLE / "batch.parquet"))
    assert doc["engine"] == {
        "name": "local", "workers": 2, "batch_tokens": 1048576, "prefetch": True,
        "backend": "numpy",
    }  # fmt: skip
    monkeypatch.setenv("GRPO_CLI_KERNEL", "c")
    monkeypatch.setenv("GRPO_CLI_WORKERS", "3")
    if built:
        assert cli.json("kl", str(SAMPLE / "batch.parquet"))["engine"]["backend"] == "c"
    assert cli.json("objective", str(SAMPLE / "batch.parquet"))["engine"]["workers"] == 3
    assert (
        cli.json("objective", str(SAMPLE / "batch.parquet"), "--workers", "1")["engine"]["workers"]
        == 1
    )
    monkeypatch.setattr(_fast, "_library", lambda: None)
    with pytest.raises(UsageError, match="compiled kernel is not built"):
        EngineOptions(backend="c").resolved()
    r = cli("objective", str(SAMPLE / "batch.parquet"), "--json")
    assert r.exit_code == 2 and "GRPO_CLI_KERNEL=c but the compiled kernel is not built" in r.stderr


def test_a_kernel_of_another_layout_is_refused() -> None:
    """The loader compares the kernel's interface version and struct sizes with its own."""

    def abi(out: Any) -> int:
        out[0], out[1], out[2] = _fast.ABI_VERSION, 8, 8  # a struct of another size
        return 3

    lib = type("Lib", (), {"grpo_abi": staticmethod(abi)})()
    with pytest.raises(GrpoCliError, match=r"does not match this grpo-cli .* rebuild it"):
        _fast.check_abi(lib, "k.so")
    no_abi = type("Lib", (), {})()  # a kernel from before the check: refused as well
    with pytest.raises(GrpoCliError, match="interface 0"):
        _fast.check_abi(no_abi, "k.so")
    if built:
        lib = _fast._library()
        assert lib is not None
        _fast.check_abi(lib, "built")  # the installed one matches


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lengths=st.lists(st.integers(1, 1200), min_size=1, max_size=6),
    s=SETTINGS,
    dtype=st.sampled_from([np.float32, np.float64]),
    vector=st.booleans(),
)
def test_answer_extremes_and_gradient_parts_equal_numpy(
    seed: int, lengths: list[int], s: Settings, dtype: Any, vector: bool
) -> None:
    """Per answer, the kernel's largest |Δ| and KL estimate and their first tokens
    (``np.argmax``), and its sums of the derivatives of :func:`token_gradients` (Σg_p²,
    Σg_k², Σg_p·g_k, nonzero g_p), over answers longer than the kernel's block too."""
    from grpo_cli.core import segment_sum, token_gradients

    rng = np.random.default_rng(seed)
    b = _batch(rng, lengths, dtype, 60.0)
    adv = rng.normal(0, 1, size=b.n)
    adv[rng.random(b.n) < 0.2] = 0.0
    o = s.term_options()
    f = b.fields
    with np.errstate(over="ignore", invalid="ignore"):
        out = _fast.fold(f["logp"], f["old_logp"], f["ref_logp"], adv, b.offsets, options=o,
                         gradient=True, extremes=True, vector=vector)  # fmt: skip
        terms = token_terms(f["logp"], f["old_logp"], f["ref_logp"], adv, b.offsets, options=o)
        gp, gk = token_gradients(terms, offsets=b.offsets, options=o)
        assert gk is not None
        want = {"pp": segment_sum(gp * gp, b.offsets), "kk": segment_sum(gk * gk, b.offsets),
                "pk": segment_sum(gp * gk, b.offsets)}  # fmt: skip
    ext, g = out.extremes, out.gradient
    assert ext is not None and g is not None and ext.kl_max is not None and ext.kl_at is not None
    for i, (lo, hi) in enumerate(zip(b.offsets[:-1], b.offsets[1:], strict=True)):
        d = np.abs(terms.delta[lo:hi])
        assert ext.log_ratio_max[i] == d.max() and ext.log_ratio_at[i] == int(np.argmax(d))
        k = terms.kl[lo:hi]  # type: ignore[index]
        assert math.isclose(ext.kl_max[i], k.max(), rel_tol=1e-13, abs_tol=1e-15)
        top2 = np.sort(k)[-2:] if k.shape[0] > 1 else np.array([-np.inf, k[0]])
        if not vector or top2[1] - top2[0] > 1e-9 * abs(top2[1]):  # no near tie
            assert ext.kl_at[i] == int(np.argmax(k)), i
        assert g.nonzero[i] == int(np.count_nonzero(gp[lo:hi]))
    if o.beta:
        assert g.kk is not None and g.pk is not None
        got = {"pp": g.pp, "kk": g.kk, "pk": g.pk}
    else:  # no KL part asked
        assert g.kk is None and g.pk is None
        got, want = {"pp": g.pp}, {"pp": want["pp"]}
    scale = want["pp"] + want["kk"] if o.beta else want["pp"]  # bounds |Σ g_p·g_k| too
    for key, w in want.items():
        fin = np.isfinite(w) & np.isfinite(scale)
        assert np.all(np.abs(got[key][fin] - w[fin]) <= 1e-12 * scale[fin] + 1e-300), key
        assert np.array_equal(np.isfinite(got[key]), np.isfinite(w)), key


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([1, 2, 4], "offsets: must start at 0"),
        ([0, 3, 2, 4], "offsets: must not decrease"),
        ([0, 2, 3], "offsets: must start at 0 and end at the number of values (4)"),
        ([0, 2, 9], "offsets: must start at 0 and end"),
    ],
)
def test_fold_checks_offsets_first(offsets: list[int], message: str) -> None:
    """The kernel reads tokens offsets[i] .. offsets[i+1]: offsets that overrun the values
    would read past them, so they are checked before the call."""
    x = np.array([-1.0, -0.5, -2.0, -0.1])
    adv = np.ones(len(offsets) - 1)
    with pytest.raises(InputError, match=re.escape(message)):
        _fast.fold(x, x, x, adv, np.array(offsets))
    with pytest.raises(InputError, match=re.escape("old_logp: expected shape (4,)")):
        _fast.fold(x, x[:3], x, np.ones(2), np.array([0, 2, 4]))
    with pytest.raises(InputError, match=re.escape("adv: expected shape (2,)")):
        _fast.fold(x, x, x, np.ones(4), np.array([0, 2, 4]))


# ------------------------------------------------ every loss, correction and mask
# one case per registry row: the settings that turn it on (its parameters where the
# defaults leave it off), by the names of resolve_settings
def _row_cases() -> dict[str, dict[str, Any]]:
    from grpo_cli.losses import CORRECTIONS, LOSSES, MASKS

    on: dict[str, dict[str, Any]] = {
        "verl/dro": {"dro_beta": 0.3},
        "verl/clip_cov": {"clip_cov_ratio": 0.05, "clip_cov_lb": 0.0},
        "verl/kl_cov": {"kl_cov_ratio": 0.05},
        "verl-rollout": {"rollout_is": "token", "rollout_is_threshold": 1.2},
        "verl-rollout/rejection": {"rollout_is": "token", "rollout_rs": "token_k1",
                                   "rollout_rs_threshold": "0.85_1.15"},
        "trl-vllm": {"vllm_is_clip_max": 1.5},
        "trl/top_entropy_mask": {"entropy_mask": True},
        "trl/off_policy_mask": {"off_policy_mask_threshold": 0.0},
        "slime/opsm": {"use_opsm": True, "opsm_delta": 0.0},
    }  # fmt: skip
    out = {n: {"loss": n, **on.get(n, {})} for n in LOSSES if n != "clip"}
    out |= {n: {"correction": n, **on.get(n, {})} for n in CORRECTIONS}
    out["verl-rollout/rejection"] = {"correction": "verl-rollout", **on["verl-rollout/rejection"]}
    out |= {n: dict(on[n]) for n in MASKS}
    out["trl/cispo+trl-vllm+trl/off_policy_mask"] = {
        "loss": "trl/cispo", "correction": "trl-vllm", "vllm_is_mode": "token_truncate",
        **on["trl/off_policy_mask"],
    }  # fmt: skip
    return out


ROW_CASES = _row_cases()


def _row_batch(rng: np.random.Generator, dtype: Any) -> tuple[Batch, np.ndarray]:
    """Ragged answers (1 to 700 tokens: some cross the kernel's block and the loss's
    runs are several answers), with the sampler's log-probs and a recorded entropy mask."""
    lengths = [int(x) for x in rng.integers(1, 40, size=10)] + [700, 1]
    b = _batch(rng, lengths, dtype, 1.0)
    t = int(b.offsets[-1])
    old = np.asarray(b.fields["old_logp"], dtype=np.float64)
    fields = dict(b.fields)
    fields["rollout_logp"] = (old + rng.normal(0, 0.15, size=t)).astype(dtype)
    fields["entropy_mask"] = (rng.random(t) < 0.7).astype(np.float64)
    return replace(b, fields=fields), rng.normal(0, 1, size=b.n)


@pytest.mark.parametrize("name", list(ROW_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_loss_correction_and_mask_on_the_kernel_equals_numpy(
    name: str, dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each registry row folded by the kernel (its terms from numpy, summed in the kernel's
    pass, or the clipped surrogate weighted there) against the numpy path: the same
    objective sums, clip counts, ratio statistics and loss metrics, and the kernel path is
    the one taken. Runs of the loss's function shorter than the batch (LOSS_RUN_TOKENS)
    give the same terms as one run."""
    from grpo_cli.fold import loss as fold_loss

    monkeypatch.setattr(fold_loss, "LOSS_RUN_TOKENS", 64)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    b, adv = _row_batch(rng, dtype)
    s = replace(resolve_settings(**ROW_CASES[name]), beta=0.04)
    assert s.numpy_only
    with np.errstate(over="ignore", invalid="ignore"):
        c = TokenPartial(s, backend="c")
        assert c.compiled
        c.update(b, adv)
        n = TokenPartial(s, backend="numpy")
        assert not n.compiled
        n.update(b, adv)
    _same(c, n, _scale(b, adv, replace(s, beta=0.04)) | _loss_scale(n))
    vc, vn = c.loss_metrics.values(), n.loss_metrics.values()
    assert list(vc) == list(vn)
    for k, v in vn.items():
        assert math.isclose(vc[k], v, rel_tol=1e-12, abs_tol=1e-14), (k, vc[k], v)
    if s.mask_rows:  # masks by runs of answers are the batch's mask
        whole = fold_loss.mask_of(s, b.fields, adv, b.offsets)
        runs = fold_loss._mask_runs(s, b.fields, adv, b.offsets)
        assert whole is not None and runs is not None and 0 < whole.sum() < whole.shape[0]
        np.testing.assert_array_equal(runs, whole)
    # the clipped surrogate's gradient weighted in the kernel; a loss's own stays numpy
    g = TokenPartial(s, backend="c", gradient=True)
    assert g.compiled == (s.loss_row.terms is None)
    if g.compiled:
        with np.errstate(over="ignore", invalid="ignore"):
            g.update(b, adv)
            gn = TokenPartial(s, backend="numpy", gradient=True)
            gn.update(b, adv)
        _same_gradient(g, gn)


@pytest.mark.parametrize(
    "params",
    [{}, {"bypass_loss_type": "reinforce"}, {"rollout_is": "token", "rollout_is_threshold": 1.2}],
)
def test_bypass_mode_by_runs_is_its_function_of_the_whole_batch(
    params: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's bypass mode computes its own correction; with no rejection and no batch
    normalisation its weights and metrics are its answers', so it folds run by run
    (LOSS_RUN_TOKENS): the same per-token terms and gradient as verl_bypass_mode of the
    whole batch, and the same metrics as the batch folded in one run."""
    from grpo_cli.fold import loss as fold_loss
    from grpo_cli.losses import verl_rollout as LVR

    rng = np.random.default_rng(26)
    b, adv = _row_batch(rng, np.float32)
    f = {k: np.asarray(v, dtype=np.float64) for k, v in b.fields.items()}
    s = resolve_settings(loss="verl/bypass_mode", **params)
    assert not fold_loss._own_whole(s)
    kw = {k: v for k, v in params.items() if k != "bypass_loss_type"}
    kind = params.get("bypass_loss_type", "ppo_clip")
    t, _ = LVR.verl_bypass_mode(f["logp"], f["rollout_logp"], adv, b.offsets, loss_type=kind,
                                clip_low=s.clip_eps, clip_high=s.eps_high, **kw)  # fmt: skip
    got = {}
    for tokens in (64, 1 << 30):
        monkeypatch.setattr(fold_loss, "LOSS_RUN_TOKENS", tokens)
        m = fold_loss.LossMetrics.of(s)
        with np.errstate(over="ignore", invalid="ignore"):
            lp = fold_loss.loss_policy(s, b.fields, adv, b.offsets, m)
        assert lp.policy is not None and lp.grad is not None and t.grad is not None
        np.testing.assert_array_equal(lp.policy, np.where(t.term == 0, 0.0, t.term))
        np.testing.assert_array_equal(lp.grad, np.where(t.grad == 0, 0.0, t.grad))
        assert (m.batches, m.answers) == (1, b.n)
        got[tokens] = m.values()
    assert list(got[64]) == list(got[1 << 30]) and len(got[64]) > 10
    for k, v in got[1 << 30].items():
        assert math.isclose(got[64][k], v, rel_tol=1e-12, abs_tol=1e-14), (k, got[64][k], v)


def test_bypass_mode_with_a_rejection_is_one_run() -> None:
    """A rejection (its spreads do not merge) or batch-normalised weights keep verl's
    bypass mode over the whole batch."""
    from grpo_cli.fold import loss as fold_loss

    rs = {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.85_1.15"}
    assert fold_loss._own_whole(resolve_settings(loss="verl/bypass_mode", **rs))
    norm: dict[str, Any] = {"rollout_is_batch_normalize": True}
    assert fold_loss._own_whole(resolve_settings(loss="verl/bypass_mode", **norm))


def _loss_scale(n: TokenPartial) -> dict[str, float]:
    """The loss's sums are of other terms than the surrogate's: their own magnitude (the
    numpy partial's) bounds the rounding, with the KL's."""
    out = {}
    for key in ("term", "policy"):
        t = getattr(n, key)
        out[key] = abs(t.token) + abs(t.answer_means) + n.tokens + abs(n.kl.token) + 1.0
    return out


@pytest.mark.parametrize("vector", [True, False])
def test_a_given_policy_term_and_a_weight_by_hand(vector: bool) -> None:
    """``policy`` replaces the clipped surrogate token by token (the term is policy − β·KL);
    ``weight`` multiplies it and its gradient, 0 where the weight is 0 even where the
    surrogate is −inf (an overflowing ratio with A < 0); the clip counts stay the ratio's."""
    lp = np.array([-1.0, -1.0, -1.0, -2.0, -2.0])
    old = lp - np.log([0.5, 1.0, 1.5, 0.5, 10.0])
    old[4] = -800.0  # ρ = inf, A < 0: the surrogate is −inf
    ref = lp.copy()
    ref[4] += 1.0  # k3 = e − 2 on the last token only
    off, adv = np.array([0, 3, 5]), np.array([1.0, -1.0])
    given = np.array([0.25, 0.5, 1.0, 2.0, 4.0])
    out = _fast.fold(lp, old, ref, adv, off, policy=given, beta=0.1, vector=vector)
    assert out.policy.tolist() == [1.75, 6.0]
    assert out.term[0] == 1.75 and out.term[1] == pytest.approx(6.0 - 0.1 * (math.e - 2))
    assert (out.low.tolist(), out.high.tolist()) == ([0, 1], [1, 0])  # ρ 0.5, A < 0; ρ 1.5
    w = np.array([2.0, 0.5, 0.0, 1.0, 0.0])
    out = _fast.fold(lp, old, ref, adv, off, weight=w, gradient=True, vector=vector)
    # A = 1: 2·0.5 + 0.5·1 + 0·1.2; A = −1: 1·(−0.8) + 0·(−inf)
    assert out.policy.tolist() == [1.5, -0.8]
    assert out.gradient is not None
    # g_p = ρA on the unclipped branch: 0.5 (×2), 1 (×0.5), 0 (clipped); 0 (ρ < 0.8), 0
    assert out.gradient.pp.tolist() == [1.0 + 0.25, 0.0]
    assert out.gradient.nonzero.tolist() == [2, 0]
    with pytest.raises(InputError, match=re.escape("weight: expected shape (5,)")):
        _fast.fold(lp, old, ref, adv, off, weight=w[:4])
    with pytest.raises(ValueError, match="no weight and no gradient"):
        _fast.fold(lp, old, ref, adv, off, policy=given, gradient=True)
