"""grpo_cli.integrations.trl.record on a real TRL GRPOTrainer (tests/trl_runs.py): the
files it writes, and every metric TRL logged recomputed here with numpy from the recorded
parquet files alone, against ``trainer.state.log_history`` (never a mock, never grpo-cli).

How TRL 1.16.0 forms what it logs (trl/trainer/grpo_trainer.py, transformers 5.24.0
trainer.py), which the reference below follows:
- ``_compute_loss`` appends one value per call (micro-batch) to ``kl``, ``entropy`` and
  ``clip_ratio/*``; ``GRPOTrainer.log`` logs the mean of each list over the logging window
  (here one step: the mean over the step's micro-batches).
- ``loss``: each call returns its loss already divided for gradient accumulation
  (``loss_is_scaled_for_ga``); ``Trainer._inner_training_loop`` sums the returned losses in
  float32 (``_tr_loss``) and ``_maybe_log_save_evaluate`` divides the sum by the optimizer
  steps since the last log (after a mean over processes): the sum over micro-batches here.
- ``reward``, ``reward_std``, ``frac_reward_zero_std``, ``completions/*_length``: once per
  generation batch, in ``_generate_and_score_completions``, over the whole generation batch
  (all processes, all its micro-batches), logged at the step that generated.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.integrations import _writer

from .trl_runs import (
    CONFIGS,
    STEPS,
    TWO_REWARDS,
    Run,
    make_trainer,
    require_trl,
    step_records,
    tokenizer,
    train,
    without_timing,
)

# the clipped surrogate's configurations (this file's reference computes that loss; the
# runs of TRL's own losses, cispo and sapo, are tests/test_loss_fold.py's)
RECORDED = [c for c in CONFIGS if CONFIGS[c].get("loss_type") not in ("cispo", "sapo")]
BASELINE = "ga2_dapo"  # training-unchanged and never-harm runs compare with its plain run

# GRPOConfig defaults (TRL 1.16.0) the reference needs when a configuration leaves them
DEFAULTS: dict[str, Any] = {
    "loss_type": "dapo",
    "beta": 0.0,
    "epsilon": 0.2,
    "epsilon_high": None,
    "delta": None,
    "importance_sampling_level": "token",
    "num_iterations": 1,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": None,
    "use_bias_correction_kl": True,
    "mask_truncated_completions": False,
    "top_entropy_quantile": 1.0,
    "reward_weights": None,
    "logging_steps": 1,
    "entropy_coef": 0.0,
    "off_policy_mask_threshold": None,
}


def settings(run: Run) -> dict[str, Any]:
    s = {**DEFAULTS, **run.settings}
    s["epsilon_high"] = s["epsilon_high"] if s["epsilon_high"] is not None else s["epsilon"]
    s["steps_per_generation"] = s["steps_per_generation"] or s["gradient_accumulation_steps"]
    return s


def close(got: float, want: float) -> bool:
    """1e-5 relative, 1e-6 absolute (on-policy losses are ~0)."""
    return math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)


# -- reading the recorded files, with pyarrow only -------------------------------------
def read_micro_batch(path: Path) -> dict[str, Any]:
    table = pq.read_table(path)
    out: dict[str, Any] = {"info": json.loads(table.schema.metadata[b"grpo_cli"])}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_list(col.type):
            flat = col.flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(col), -1)
        elif pa.types.is_string(col.type):
            out[name] = col.to_pylist()
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def read_step(run: Run, step: int) -> list[dict[str, Any]]:
    assert run.directory is not None
    paths = sorted((run.directory / f"step_{step:06d}").glob("rank000-mb*.parquet"))
    return [read_micro_batch(p) for p in paths]


def generation_rows(run: Run) -> dict[int, dict[str, Any]]:
    """Each generation batch's rows, from the files of its first pass (iteration 0, its
    steps_per_generation chunks), concatenated."""
    parts: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for step in range(1, STEPS + 1):
        for mb in read_step(run, step):
            if mb["info"]["iteration"] == 0:
                parts[mb["info"]["generation"]].append(mb)
    out = {}
    for g, mbs in parts.items():
        out[g] = {
            "group": [x for mb in mbs for x in mb["group"]],
            "reward": np.concatenate([mb["reward"] for mb in mbs]),
            "advantage": np.concatenate([mb["advantage"] for mb in mbs]),
            "completion": [x for mb in mbs for x in mb["completion"]],
            "length": np.concatenate([mb["mask"].sum(axis=1) for mb in mbs]),
            "generated_at_step": mbs[0]["info"]["generated_at_step"],
            "chunks": sorted(mb["info"]["chunk"] for mb in mbs),
        }
    return out


# -- the reference: TRL's formulas on the recorded arrays, float64 -----------------------
def masked_rows(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Per answer Σ x·m / Σ m; NaN for an answer without a valid token (as TRL's
    unclamped division, which its nanmin/nanmax then skip)."""
    num, den = (x * m).sum(axis=1), m.sum(axis=1)
    return np.divide(num, den, out=np.full(num.shape, np.nan), where=den > 0)


def call_metrics(mb: dict[str, Any], s: dict[str, Any], world_size: int) -> dict[str, float]:
    """One _compute_loss call's loss and metrics from its recorded arrays."""
    m = mb["mask"].astype(np.float64)
    logp = mb["logp"].astype(np.float64)
    old = mb["old_logp"].astype(np.float64) if "old_logp" in mb else logp
    adv = mb["advantage"].astype(np.float64)[:, None]
    delta_logp = logp - old
    if s["importance_sampling_level"] == "sequence":
        lw = (delta_logp * m).sum(axis=1, keepdims=True) / np.maximum(
            m.sum(axis=1, keepdims=True), 1.0
        )
    else:
        lw = delta_logp
    ratio = np.exp(lw)
    out: dict[str, float] = {}
    beta = s["beta"]
    if beta != 0.0:
        x = mb["ref_logp"].astype(np.float64) - logp
        kl = np.exp(x) - x - 1.0
        if s["use_bias_correction_kl"]:
            kl = kl * ratio
        out["kl"] = float((kl * m).sum() / max(m.sum(), 1.0))
    lo, hi = 1.0 - s["epsilon"], 1.0 + s["epsilon_high"]
    clipped = np.clip(ratio, lo, hi)
    if s["delta"] is not None:
        ratio = np.minimum(ratio, s["delta"])
    per_token = -np.minimum(ratio * adv, clipped * adv)
    if s["off_policy_mask_threshold"] is not None:  # TRL 1.16.0 get_off_policy_mask
        sampling = mb["rollout_logp"].astype(np.float64) if "rollout_logp" in mb else old
        drift = np.nan_to_num(sampling - logp, nan=0.0)
        seq = (drift * m).sum(axis=1, keepdims=True) / np.maximum(m.sum(axis=1, keepdims=True), 1)
        per_token = per_token * ((adv >= 0) | (seq <= s["off_policy_mask_threshold"]))
    if "entropy_mask" in mb:
        per_token = per_token * mb["entropy_mask"]
    if beta != 0.0:
        per_token = per_token + beta * kl
    k = mb["info"]["micro_batches"]
    total = (per_token * m).sum()
    loss_type = s["loss_type"]
    if loss_type == "grpo":
        loss = float(np.mean((per_token * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0))) / k
    elif loss_type == "bnpo":
        loss = float(total / max(m.sum(), 1.0)) / k
    elif loss_type == "dr_grpo":
        loss = float(total / (m.shape[0] * s["max_completion_length"])) / k
    elif loss_type == "dapo":
        items = max(mb["info"]["num_items_in_batch"], 1)
        loss = float(total / (items / world_size * k / s["steps_per_generation"]))
    else:
        raise AssertionError(loss_type)
    out["entropy"] = float((mb["entropy"] * m).sum() / max(m.sum(), 1.0))
    if s["entropy_coef"]:  # the bonus: coef × the call's token-mean entropy, over k
        out["policy_loss"] = loss * (1 if loss_type == "dapo" else k)
        out["entropy_coef"] = s["entropy_coef"]
        em = m * mb["entropy_mask"] if "entropy_mask" in mb else m  # the same tokens
        bonus = float((mb["entropy"] * em).sum() / max(em.sum(), 1.0))
        loss -= s["entropy_coef"] * bonus / k
    out["loss"] = loss
    low = ((ratio < lo) & (adv < 0)).astype(np.float64)
    high = ((ratio > hi) & (adv > 0)).astype(np.float64)
    region = np.maximum(low, high)
    for name, flag in (("low", low), ("high", high), ("region", region)):
        if flag.shape[1] == 1:  # sequence level: one value per answer, every answer counts
            out[f"clip_ratio/{name}_mean"] = float(flag.sum() / max(flag.shape[0], 1))
        else:
            out[f"clip_ratio/{name}_mean"] = float((flag * m).sum() / max(m.sum(), 1.0))
    per_low = low[:, 0] if low.shape[1] == 1 else masked_rows(low, m)
    per_high = high[:, 0] if high.shape[1] == 1 else masked_rows(high, m)
    out["clip_ratio/low_min"] = float(np.nanmin(per_low)) if np.any(~np.isnan(per_low)) else np.nan
    out["clip_ratio/high_max"] = (
        float(np.nanmax(per_high)) if np.any(~np.isnan(per_high)) else np.nan
    )
    return out


def mean(values: list[float]) -> float:
    """GRPOTrainer.log's mean of a metric's list: NaN values left out, NaN if none is left
    (TRL logs None then)."""
    valid = [v for v in values if not math.isnan(v)]
    return sum(valid) / len(valid) if valid else math.nan


def window_metrics(run: Run, steps: range) -> dict[str, float]:
    """What TRL logs at the last of ``steps`` (the steps since its previous log): every
    per-call metric averaged over the window's calls, the loss summed over them and
    divided by the window's optimizer steps."""
    s = settings(run)
    calls = [
        call_metrics(mb, s, mb["info"]["world_size"])
        for step in steps
        for mb in read_step(run, step)
    ]
    out = {name: mean([c[name] for c in calls]) for name in calls[0]}
    out["loss"] = float(np.sum([c["loss"] for c in calls])) / len(steps)
    return out


def nanstd1(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(np.std(x, ddof=1)) if x.size > 1 else np.nan


def generation_metrics(rows: dict[str, Any]) -> dict[str, float]:
    reward = rows["reward"]
    groups: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(rows["group"]):
        groups[g].append(i)
    zero = np.zeros(reward.shape[0], dtype=bool)
    for idx in groups.values():
        # torch.isclose(std, 0) with its defaults: |std| <= 1e-8
        zero[idx] = abs(nanstd1(reward[idx])) <= 1e-8
    length = rows["length"].astype(np.float64)
    return {
        "reward": float(np.nanmean(reward)),
        "reward_std": nanstd1(reward),
        "frac_reward_zero_std": float(zero.mean()),
        "completions/mean_length": float(length.mean()),
        "completions/min_length": float(length.min()),
        "completions/max_length": float(length.max()),
    }


# -- the files ------------------------------------------------------------------------
def test_import_is_light() -> None:
    code = (
        "import sys, grpo_cli.integrations.trl; "
        "print(sorted(m for m in ('torch', 'trl', 'transformers', 'accelerate') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", RECORDED)
def test_layout_and_schema(trl_run: Any, name: str) -> None:
    import trl

    run = trl_run(name)
    s = settings(run)
    assert run.directory is not None
    meta = json.loads((run.directory / "meta.json").read_text())
    assert meta["format"] == "grpo-cli-run" and meta["format_version"] == 1
    assert meta["trainer"] == "trl" and meta["trainer_version"] == trl.__version__
    assert meta["world_size"] == 1
    config = meta["config"]
    for key in (
        "loss_type", "beta", "epsilon", "epsilon_high", "delta", "importance_sampling_level",
        "scale_rewards", "num_generations", "gradient_accumulation_steps",
        "steps_per_generation", "num_iterations", "max_completion_length",
        "use_bias_correction_kl", "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
        "vllm_importance_sampling_clip_max", "use_vllm", "top_entropy_quantile",
        "mask_truncated_completions", "reward_weights", "per_device_train_batch_size",
        "logging_steps",
    ):  # fmt: skip
        assert key in config, key
    for key in ("loss_type", "beta", "epsilon", "epsilon_high", "delta", "num_iterations"):
        assert config[key] == s[key], key
    assert config["steps_per_generation"] == s["steps_per_generation"]
    weights = s["reward_weights"] or [1.0] * (2 if name in TWO_REWARDS else 1)
    assert config["reward_weights"] == weights

    ga, spg, iters = (
        s["gradient_accumulation_steps"],
        s["steps_per_generation"],
        s["num_iterations"],
    )
    has_old = ga % (spg * iters) != 0  # TRL computes old log-probs only then (no vLLM)
    expected = ["group", "reward", "advantage", "logp"]
    expected += ["old_logp"] * has_old + ["ref_logp"] * (s["beta"] != 0.0)
    expected += ["entropy", "mask", "token_id", "completion"]
    expected += ["entropy_mask"] * (s["top_entropy_quantile"] < 1.0)
    tok = tokenizer()
    leftovers = [p for p in run.directory.rglob("*") if ".tmp-" in p.name]
    assert leftovers == []
    for step in range(1, STEPS + 1):
        d = run.directory / f"step_{step:06d}"
        names = sorted(p.name for p in d.iterdir())
        assert names == ["_DONE"] + [f"rank000-mb{k:03d}.parquet" for k in range(ga)]
        for k, path in enumerate(sorted(d.glob("*.parquet"))):
            table = pq.read_table(path)
            assert table.column_names == expected
            types = {f.name: f.type for f in table.schema}
            assert types["group"] == pa.string() and types["completion"] == pa.string()
            assert types["reward"] == pa.float64() and types["advantage"] == pa.float64()
            assert types["mask"] == pa.list_(pa.bool_())
            assert types["token_id"] == pa.list_(pa.int64())
            for col in ("logp", "old_logp", "ref_logp", "entropy"):
                if col in types:
                    assert types[col] == pa.list_(pa.float32()), col
            assert table.num_rows == s["per_device_train_batch_size"]
            lengths = {
                c: set(pa.compute.list_value_length(table.column(c)).to_pylist())
                for c in table.column_names
                if pa.types.is_list(types[c])
            }
            widths = set().union(*lengths.values())
            assert len(widths) == 1 and widths.pop() <= s["max_completion_length"], lengths
            info = json.loads(table.schema.metadata[b"grpo_cli"])
            assert info["step"] == step and info["micro_batch"] == k
            assert info["rank"] == 0 and info["world_size"] == 1
            assert info["micro_batches"] == ga
            assert info["old_logp_is_logp"] is (not has_old)
            # the mask is the answer's tokens, left-aligned; its words are at most its
            # tokens (a word-level tokenizer; EOS, and pad or unk the random model may
            # sample, decode to no text)
            mb = read_micro_batch(path)
            if not s["mask_truncated_completions"]:
                ids = table.column("token_id").to_pylist()
                for text, row, tid in zip(mb["completion"], mb["mask"], ids, strict=True):
                    n = int(row.sum())
                    assert 1 <= n and len(text.split()) <= n
                    assert row[:n].all() and not row[n:].any()
                    # the recorded ids are TRL's completion_ids: they decode to its text
                    assert tok.decode(tid[:n], skip_special_tokens=True) == text


@pytest.mark.parametrize("name", RECORDED)
def test_metrics_jsonl_is_what_was_logged(trl_run: Any, name: str) -> None:
    run = trl_run(name)
    assert run.directory is not None
    lines = (run.directory / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    logged = [r for r in run.log_history if "train_runtime" not in r]
    assert len(records) == len(logged) == STEPS // settings(run)["logging_steps"]
    for got, want in zip(records, logged, strict=True):
        assert got == want  # JSON round-trips floats exactly; same keys, same step


@pytest.mark.parametrize("name", RECORDED)
def test_groups_and_rewards(trl_run: Any, name: str) -> None:
    """Each group: num_generations answers to one prompt, the completions and the rewards
    TRL's reward functions saw and returned for that prompt's block of the generation."""
    run = trl_run(name)
    s = settings(run)
    size = s["num_generations"]
    weights = np.asarray(s["reward_weights"] or [1.0] * (2 if name in TWO_REWARDS else 1))
    gens = generation_rows(run)
    assert sorted(gens) == list(range(len(run.reward_calls)))
    for g, rows in gens.items():
        assert rows["chunks"] == list(range(s["steps_per_generation"]))
        call = run.reward_calls[g]
        total = (np.asarray(call["rewards"]).T * weights).sum(axis=1)
        by_group: dict[str, list[int]] = defaultdict(list)
        for i, label in enumerate(rows["group"]):
            by_group[label].append(i)
        assert len(rows["group"]) == len(call["completions"])
        assert sorted(by_group) == [f"g{g:06d}-p{j:04d}" for j in range(len(by_group))]
        for label, idx in by_group.items():
            assert len(idx) == size
            j = int(label.split("-p")[1])
            block = slice(j * size, (j + 1) * size)
            assert len(set(call["prompts"][block])) == 1  # one prompt per group
            got = sorted((rows["completion"][i], float(rows["reward"][i])) for i in idx)
            want = sorted(zip(call["completions"][block], total[block].tolist(), strict=True))
            assert len(got) == len(want)
            for (gc, gr), (wc, wr) in zip(got, want, strict=True):
                assert gc == wc and math.isclose(gr, wr, abs_tol=1e-6)


@pytest.mark.parametrize("name", RECORDED)
def test_advantages_from_recorded_rewards_and_groups(trl_run: Any, name: str) -> None:
    """TRL's scale_rewards="group": (r − mean_g) / (std_g (ddof 1) + 1e-4), per group."""
    rows_by_gen = generation_rows(trl_run(name))
    for rows in rows_by_gen.values():
        reward, adv = rows["reward"], rows["advantage"]
        idx: dict[str, list[int]] = defaultdict(list)
        for i, label in enumerate(rows["group"]):
            idx[label].append(i)
        for members in idx.values():
            r = reward[members]
            want = (r - r.mean()) / (np.std(r, ddof=1) + 1e-4)
            np.testing.assert_allclose(adv[members], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", RECORDED)
def test_logged_metrics_recomputed_from_the_files(trl_run: Any, name: str) -> None:
    run = trl_run(name)
    s = settings(run)
    every = s["logging_steps"]
    logged = step_records(run.log_history)
    assert sorted(logged) == list(range(every, STEPS + 1, every))
    gens = generation_rows(run).values()
    compared: set[str] = set()
    for step, record in logged.items():
        window = range(step - every + 1, step + 1)
        ours = window_metrics(run, window)
        generated = [generation_metrics(g) for g in gens if g["generated_at_step"] in window]
        if generated:
            for key in generated[0]:
                if s["mask_truncated_completions"] and key.startswith("completions/"):
                    continue  # the lengths before the mask: not recorded
                ours[key] = mean([g[key] for g in generated])
        else:
            assert "reward" not in record  # logged only in a window that generated
        assert {"loss", "entropy", "clip_ratio/region_mean"} <= record.keys()
        assert ("kl" in record) is (s["beta"] != 0.0)
        bad = []
        for key, value in ours.items():
            assert key in record, (step, key)
            want = record[key]
            if (want is None or math.isnan(want)) and math.isnan(value):
                continue
            if not close(value, want):
                bad.append(f"step {step} {key}: recomputed {value!r}, logged {want!r}")
            compared.add(key)
        assert not bad, "\n".join(bad)
    assert {"loss", "entropy", "clip_ratio/high_max", "reward", "frac_reward_zero_std"} <= compared


def test_configurations_exercise_what_they_claim(trl_run: Any) -> None:
    """The recorded runs clip and mask: the comparisons above are not all on ratio 1."""
    assert step_records(trl_run("iterations").log_history)[2]["clip_ratio/region_mean"] > 0
    assert step_records(trl_run("gspo").log_history)[2]["clip_ratio/region_mean"] > 0
    assert step_records(trl_run("ga2_bnpo").log_history)[2]["clip_ratio/high_max"] > 0
    masks = trl_run("masks")
    mbs = read_step(masks, 4)
    assert any(not row.any() for mb in mbs for row in mb["mask"])  # a truncated answer
    assert any((mb["mask"] & ~mb["entropy_mask"]).any() for mb in mbs)  # a low-entropy token
    assert step_records(masks.log_history)[4]["clip_ratio/region_mean"] > 0


# -- training is the same, recorded or not, and whatever goes wrong in recording -------
def test_recording_does_not_change_training(trl_run: Any) -> None:
    plain, recorded = trl_run(BASELINE, recorded=False), trl_run(BASELINE)
    assert plain.directory is None
    assert without_timing(recorded.log_history) == without_timing(plain.log_history)


def _grpo_cli_warnings(records: Any) -> list[str]:
    return [
        str(w.message)
        for w in records
        if issubclass(w.category, RuntimeWarning) and "grpo-cli" in str(w.message)
    ]


def _not_writable(tmp: Path) -> Path:
    d = tmp / "read-only"
    d.mkdir()
    d.chmod(0o500)
    if os.access(d, os.W_OK):  # root writes anyway: a place no one can make a directory
        return Path("/proc/grpo-cli-not-writable/run")
    return d / "run"


@pytest.mark.parametrize("case", ["file", "not_writable", "writer_raises", "callback_raises"])
def test_never_harm_the_run(
    trl_run: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    plain = trl_run(BASELINE, recorded=False)
    options: dict[str, Any] = {}
    if case == "callback_raises":
        directory = tmp_path / "run"

        def on_step_written(path: Path) -> None:
            raise KeyError("a bug in the user's callback")

        options["on_step_written"] = on_step_written
    elif case == "file":
        directory = tmp_path / "a-file"
        directory.write_text("not a directory")
    elif case == "not_writable":
        directory = _not_writable(tmp_path)
    else:
        directory = tmp_path / "run"
        real = _writer.pq.write_table
        calls = []

        def write_table(*args: Any, **kwargs: Any) -> None:
            calls.append(1)
            if len(calls) == 3:  # step 2's first micro-batch
                raise OSError(28, "No space left on device")
            real(*args, **kwargs)

        monkeypatch.setattr(_writer.pq, "write_table", write_table)
    with pytest.warns(RuntimeWarning) as records:
        run = train(BASELINE, tmp_path / "work", directory=directory, **options)
    messages = _grpo_cli_warnings(records)
    assert len(messages) == 1, messages
    assert "TRL" in messages[0] and "training goes on" in messages[0]
    assert without_timing(run.log_history) == without_timing(plain.log_history)
    if case == "writer_raises":
        assert "No space left on device" in messages[0]
        assert (directory / "step_000001" / "_DONE").exists()
        assert not (directory / "step_000002" / "_DONE").exists()
        assert not (directory / "step_000003").exists()
        lines = (directory / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [1]  # recording stopped at step 2
    if case == "callback_raises":
        assert "a bug in the user's callback" in messages[0]
        assert (directory / "step_000001" / "_DONE").exists()  # written before the call
        assert not (directory / "step_000002").exists()


def test_every_steps_and_on_step_written(trl_run: Any, tmp_path: Path) -> None:
    full = trl_run(BASELINE)
    seen: list[tuple[str, bool]] = []

    def written(path: Path) -> None:
        seen.append((path.name, (path / "_DONE").exists()))

    run = train(
        BASELINE, tmp_path, directory=tmp_path / "run", every_steps=2, on_step_written=written
    )
    assert seen == [("step_000002", True), ("step_000004", True)]
    assert run.directory is not None and full.directory is not None
    steps = sorted(p.name for p in run.directory.iterdir() if p.is_dir())
    assert steps == ["step_000002", "step_000004"]
    lines = (run.directory / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4]  # every logged step
    assert without_timing(run.log_history) == without_timing(full.log_history)
    for step in ("step_000002", "step_000004"):
        for path in sorted((run.directory / step).glob("*.parquet")):
            assert pq.read_table(path).equals(pq.read_table(full.directory / step / path.name))


def test_a_subclass_without_completions(trl_run: Any, tmp_path: Path) -> None:
    """A GRPOTrainer subclass that overrides hooked methods (calling TRL's) is recorded
    the same; completions=False leaves the text out."""
    from trl import GRPOTrainer

    class Custom(GRPOTrainer):
        def _compute_loss(self, model: Any, inputs: Any) -> Any:
            return super()._compute_loss(model, inputs)

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            return super()._generate_and_score_completions(inputs)

    full = trl_run(BASELINE)
    run = train(BASELINE, tmp_path, trainer_class=Custom, completions=False)
    assert without_timing(run.log_history) == without_timing(full.log_history)
    assert run.directory is not None and full.directory is not None
    for path in sorted(run.directory.glob("step_*/*.parquet")):
        ours = pq.read_table(path)
        theirs = pq.read_table(full.directory / path.parent.name / path.name)
        assert ours.equals(theirs.drop_columns(["completion"]))


def test_record_arguments(tmp_path: Path) -> None:
    require_trl()
    from grpo_cli.integrations.trl import record

    with pytest.raises(TypeError, match="GRPOTrainer"):
        record(object(), tmp_path / "run")
    trainer = make_trainer("defaults", tmp_path / "out")
    bad: Any
    for bad in (0, -1, 1.5, True):  # a value out of range, or not an integer at all
        with pytest.raises((ValueError, TypeError), match="every_steps"):
            record(trainer, tmp_path / "run", every_steps=bad)
    assert record(trainer, tmp_path / "run") is trainer
    for name in ("_compute_loss", "_generate_and_score_completions", "_calculate_rewards"):
        assert name in vars(trainer)  # the instance is hooked, its class is not
        assert getattr(type(trainer), name).__qualname__ == f"GRPOTrainer.{name}"
    with pytest.raises(ValueError, match="already recorded"):
        record(trainer, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written before a step is recorded
