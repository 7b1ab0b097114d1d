"""The recorders' writers and Python API (issue 27): a float keeps the width the trainer
held it in (float64 as float64, float32 as float32, float16/bfloat16 widened to float32); a
step written without the current policy's log-probs is read with no flag as the step's
first update (on-policy: logp = old_logp, ratio 1) with a note; every public function
checks its arguments at setup by name, and never raises inside a training step."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.integrations import openrlhf, trl, verl
from grpo_cli.integrations._writer import rollout_table

from .conftest import Cli


def arrays(dtype: Any, n: int = 8, width: int = 5, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    old = -rng.exponential(0.7, (n, width))
    return {
        "old_log_probs": old.astype(dtype),
        "log_probs": (old + rng.normal(0, 1e-3, (n, width))).astype(dtype),
        "ref_log_prob": (old + rng.normal(0, 1e-2, (n, width))).astype(dtype),
        "advantages": np.repeat(rng.normal(0, 1, (n, 1)), width, axis=1).astype(dtype),
        "response_mask": np.ones((n, width), bool),
        "token_level_scores": np.zeros((n, width)),
        "uid": np.array([f"u{i // 4}" for i in range(n)]),
    }


def column_type(path: Path, name: str) -> pa.DataType:
    return pq.read_schema(path).field(name).type.value_type


@pytest.mark.parametrize(
    ("dtype", "stored"),
    [(np.float64, pa.float64()), (np.float32, pa.float32()), (np.float16, pa.float32())],
)
def test_a_token_field_keeps_its_width(tmp_path: Path, dtype: Any, stored: pa.DataType) -> None:
    batch = arrays(dtype)
    path = verl.write_batch(batch, tmp_path / "run", 1)
    assert path is not None
    for name in ("logp", "old_logp", "ref_logp"):
        assert column_type(path, name) == stored
    t = pq.read_table(path)
    got = np.array(t.column("logp").to_pylist())
    # every digit the trainer had: float64 bit for bit, float16 exactly (it widens)
    assert np.array_equal(got, batch["log_probs"].astype(np.float64))


def test_a_float64_step_gives_verl_s_float64_numbers(cli: Cli, tmp_path: Path) -> None:
    """The clipped surrogate's token mean of a float64 step, recomputed by hand from the
    arrays given to the recorder (not read back): equal to 1e-13, where float32 storage
    differed in the 7th digit."""
    batch = arrays(np.float64)
    verl.write_batch(batch, tmp_path / "run", 1, config={"actor_rollout_ref": {"actor": {
        "use_kl_loss": False, "loss_agg_mode": "token-mean"}}})  # fmt: skip
    lp, old, a = batch["log_probs"], batch["old_log_probs"], batch["advantages"]
    r = np.exp(lp - old)
    want = float(np.mean(np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)))
    doc = cli.json("objective", tmp_path / "run" / "step_000001", "--beta", "0")
    assert math.isclose(doc["policy_term"], want, rel_tol=1e-13)
    f32 = np.exp(lp.astype(np.float32).astype(np.float64) - old.astype(np.float32))
    rounded = float(np.mean(np.minimum(f32 * a, np.clip(f32, 0.8, 1.2) * a)))
    assert not math.isclose(rounded, want, rel_tol=1e-9)  # what float32 storage gave


def test_rollout_table_widths_and_an_explicit_type() -> None:
    mask = np.ones((2, 3), bool)
    tokens: dict[str, np.ndarray | None] = {
        "logp": np.zeros((2, 3)), "old_logp": np.zeros((2, 3), np.float32)
    }  # fmt: skip
    t = rollout_table(group=["a", "b"], reward=None, advantage=np.zeros((2, 3)), mask=mask,
                      tokens=tokens)  # fmt: skip
    assert t.schema.field("logp").type.value_type == pa.float64()
    assert t.schema.field("old_logp").type.value_type == pa.float32()
    assert t.schema.field("advantage").type.value_type == pa.float64()
    t = rollout_table(group=["a", "b"], reward=None, advantage=None, mask=mask, tokens=tokens,
                      token_dtype=pa.float32())  # fmt: skip
    assert t.schema.field("logp").type.value_type == pa.float32()


def test_bfloat16_widens_to_float32(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    batch: dict[str, Any] = {k: v for k, v in arrays(np.float32).items()}
    for k in ("old_log_probs", "log_probs", "ref_log_prob", "advantages"):
        batch[k] = torch.from_numpy(batch[k]).to(torch.bfloat16)
    batch["response_mask"] = torch.from_numpy(batch["response_mask"])
    path = verl.write_batch(batch, tmp_path / "run", 1)
    assert path is not None and column_type(path, "logp") == pa.float32()
    got = np.array(pq.read_table(path).column("logp").to_pylist())
    assert np.array_equal(got, batch["log_probs"].float().numpy().astype(np.float64))


# ------------------------------------------------ a step without the current log-probs
def experiences(with_logp: bool = False) -> list[Any]:
    rng = np.random.default_rng(9)
    out = []
    for k in range(2):
        old = -rng.exponential(0.5, (4, 6))
        out.append(SimpleNamespace(
            action_mask=np.ones((4, 6), bool), index=list(range(4 * k, 4 * k + 4)),
            action_log_probs=old, base_action_log_probs=old + 0.01, rollout_log_probs=None,
            rewards=rng.integers(0, 2, 4).astype(float),
            advantages=np.repeat(rng.normal(0, 1, (4, 1)), 6, axis=1), log_probs=None,
        ))  # fmt: skip
    return out


def test_write_experiences_without_log_probs_reads_with_no_flag(cli: Cli, tmp_path: Path) -> None:
    """Measured: "column 'logp' is missing" with no flag. The first update of a step is
    on-policy (its log-probs are the sampler's): logp = old_logp, ratio 1, said."""
    root = tmp_path / "run"
    openrlhf.write_experiences(experiences(), root, 1, n_samples_per_prompt=4)
    doc = cli.json("objective", root / "step_000001")
    assert doc["ratio"]["min"] == doc["ratio"]["max"] == 1.0
    said = [w for w in doc["warnings"] if "no current-policy log-probs recorded" in w]
    assert said and "logp = old_logp" in said[0] and "first update" in said[0]
    assert cli("check", root / "step_000001").exit_code in (0, 1)
    # -c logp=NAME still wins; an explicit -c logp=none still refuses
    r = cli("objective", root / "step_000001", "-c", "logp=none")
    assert r.exit_code == 2


def test_write_batch_without_log_probs_reads_with_no_flag(cli: Cli, tmp_path: Path) -> None:
    batch = arrays(np.float32)
    del batch["log_probs"]
    verl.write_batch(batch, tmp_path / "run", 1)
    doc = cli.json("objective", tmp_path / "run" / "step_000001", "--beta", "0")
    assert doc["ratio"]["mean"] == 1.0
    assert any("no current-policy log-probs recorded" in w for w in doc["warnings"])


# ------------------------------------------------------------------------ the Python API
class FakeVerl:
    def _update_actor(self, batch: Any) -> Any:
        return batch


class FakeOpenRLHF:
    def __init__(self) -> None:
        self.experience_maker = SimpleNamespace(make_experience_batch=lambda s: s)

    def train_step(self, samples: Any, step: int) -> Any:
        return {}


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"every_steps": "2"}, TypeError, "every_steps: expected an integer >= 1, got '2'"),
        ({"every_steps": 0}, ValueError, "every_steps: expected an integer >= 1, got 0"),
        ({"every_steps": True}, TypeError, "every_steps"),
        ({"token_dtype": "float64"}, TypeError, "token_dtype: expected None, pyarrow"),
        ({"check": 1}, TypeError, "check: expected True, False or a check config"),
        ({"on_check": "print"}, TypeError, "on_check: expected a function"),
        ({"stop_on_fail": "yes", "check": True}, TypeError, "stop_on_fail: expected True"),
    ],
)
def test_install_checks_its_arguments_by_name(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words.replace("(", r"\(")):
        verl.install(FakeVerl(), tmp_path / "run", **kwargs)
    with pytest.raises(error, match=words.replace("(", r"\(")):
        openrlhf.install(FakeOpenRLHF(), tmp_path / "run", **kwargs)
    with pytest.raises(error, match=words.replace("(", r"\(")):
        openrlhf.recording(FakeOpenRLHF, tmp_path / "run", **kwargs)
    if "token_dtype" not in kwargs:  # TRL's recorder takes no token_dtype
        with pytest.raises(error, match=words.replace("(", r"\(")):
            trl.record(object(), tmp_path / "run", **kwargs)


def test_a_directory_that_is_not_a_path_is_named(tmp_path: Path) -> None:
    bad: list[Any] = [7, None, ["runs"]]
    for call in (lambda: verl.install(FakeVerl(), bad[0]), lambda: trl.record(object(), bad[1]),
                 lambda: openrlhf.install(FakeOpenRLHF(), bad[2])):  # fmt: skip
        with pytest.raises(TypeError, match="directory: expected a directory path"):
            call()


def test_recording_refuses_an_option_install_does_not_take(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not an option of install: every_step"):
        openrlhf.recording(FakeOpenRLHF, tmp_path / "run", every_step=2)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"step": "3"}, "step: expected an integer >= 0, got '3'"),
        ({"step": 1, "micro_batch": 2, "micro_batches": 2}, "micro_batch: 2 is not below"),
        ({"step": 1, "rank": 1}, "rank: 1 is not below world_size (1)"),
        ({"step": 1, "world_size": 0}, "world_size: expected an integer >= 1"),
        ({"step": 1, "token_dtype": np.float64}, "token_dtype: expected None"),
    ],
)
def test_a_writer_in_a_training_step_warns_by_name_and_never_raises(
    tmp_path: Path, kwargs: dict[str, Any], words: str
) -> None:
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert verl.write_batch(arrays(np.float32), tmp_path / "v", **kwargs) is None
        assert openrlhf.write_experiences(experiences(), tmp_path / "o", n_samples_per_prompt=4,
                                          **kwargs) is None  # fmt: skip
    said = [str(w.message) for w in got if w.category is RuntimeWarning]
    assert len(said) == 2 and all(words in s for s in said), said
    assert not (tmp_path / "v").exists() and not (tmp_path / "o").exists()


def test_share_report_runs_without_an_engine(tmp_path: Path) -> None:
    from grpo_cli import resolve_settings
    from grpo_cli.commands.share import share_report
    from grpo_cli.io import open_source

    root = tmp_path / "run"
    openrlhf.write_experiences(experiences(), root, 1, n_samples_per_prompt=4)
    spec = str(root / "step_000001")
    r = share_report([spec], open_source([spec]), resolve_settings("openrlhf", beta=0.0))
    assert r.source == spec and r.objective.answers == 8 and r.check is not None


def test_open_source_names_its_arguments(tmp_path: Path) -> None:
    from grpo_cli import open_source

    sample = str(Path(__file__).resolve().parent.parent / "sample_data" / "batch.parquet")
    with pytest.raises(TypeError, match="specs: expected a list of paths"):
        open_source(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="holding other values"):
        open_source([sample, 4])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="column_map: expected a mapping"):
        open_source([sample], column_map=5)  # type: ignore[arg-type]
    # one path alone is a list of one, a str or a pathlib.Path
    assert open_source(sample).paths == open_source([Path(sample)]).paths
