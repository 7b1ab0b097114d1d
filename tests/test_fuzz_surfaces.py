"""Hostile and random inputs on the surfaces added after npz and parquet (issue 27): run
directories (meta.json and its config, metrics.jsonl, the files' recorder metadata, cut
files), JSONL and NeMo-RL records, ``--logged`` files. Hypothesis writes them valid and
broken in the ways they break (wrong types, huge and non-finite numbers, deep nesting,
truncation, invalid UTF-8); every run ends in a result or in exit 2 with one
``grpo-cli: error:`` line, never a traceback, within bounded time and memory."""

from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_cli.trainers import TRAINERS

from .conftest import Cli
from .test_hostile_runs import make_run

SLOW = 30.0  # seconds one command may take on these inputs (they are kilobytes)
GROWTH_MIB = 400  # how much the process's peak RSS may grow over one fuzz test

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -0.0, 1e308, -1e-320, 10**400, -(10**4000)]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=6))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def text_of(value: Any) -> str:
    """JSON as Python writes it (NaN, Infinity, every digit of an integer)."""
    return json.dumps(value)


@st.composite
def damage(draw: st.DrawFn, text: str) -> bytes:
    """``text`` as it is, cut mid-write, with invalid UTF-8, or with a deep nesting."""
    data = text.encode()
    how = draw(st.sampled_from(["as is", "as is", "cut", "utf8", "deep", "deep object"]))
    if how == "cut" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "utf8":
        at = draw(st.integers(0, len(data)))
        return data[:at] + b"\xff\xc3" + data[at:]
    if how == "deep":
        n = draw(st.sampled_from([65, 1000, 30000]))
        return data.rstrip(b"}") + b', "z": ' + b"[" * n + b"]" * n + b"}"
    if how == "deep object":
        return b'{"a": ' * 5000 + b"1" + b"}" * 5000
    return data


class Bounded:
    """Each command's time, and the peak RSS over a whole test."""

    def __init__(self) -> None:
        self.rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def run(self, cli: Cli, *args: str | Path) -> Any:
        t0 = time.monotonic()
        r = cli(*args)
        took = time.monotonic() - t0
        assert took < SLOW, (args, took)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.rss0) / 1024
        assert grown < GROWTH_MIB, (args, grown)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
        check = str(args[0]) == "check"
        assert r.exit_code in ((0, 1, 2) if check else (0, 2)), (r.exit_code, r.stderr)
        if r.exit_code == 2:
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("grpo-cli: error: "), r.stderr
            assert r.stdout == ""
        elif "--json" in args or "json" in args:
            doc = json.loads(r.stdout)
            objective = doc.get("objective") if check else doc
            if isinstance(objective, dict):
                for key in ("objective", "loss"):
                    v = objective.get(key)
                    assert v is None or (isinstance(v, float | int) and math.isfinite(v)), v
        return r


FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
COMMANDS = st.sampled_from(["objective", "check", "trend", "answers"])


def args_of(cmd: str, target: Path) -> list[str | Path]:
    return [cmd, target, *(["--format", "json"] if cmd == "check" else ["--json"])]


@FUZZ
@given(data=st.data(), cmd=COMMANDS)
def test_random_meta_json_and_configs(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str
) -> None:
    run = make_run(tmp_path_factory.mktemp("meta") / "run", steps=(1, 2))
    meta = json.loads((run / "meta.json").read_text())
    trainer = data.draw(st.sampled_from([*sorted(TRAINERS), "nemo", 7, None]))
    meta["trainer"] = trainer
    named = TRAINERS.get(trainer) if isinstance(trainer, str) else None
    keys = sorted(named.from_config.keys) if named is not None else ["beta"]  # type: ignore[attr-defined]
    chosen = data.draw(st.lists(st.sampled_from(keys), unique=True, max_size=4))
    meta["config"] = {k: data.draw(VALUES) for k in chosen}
    fields = ["trainer_version", "world_size", "config", "format_version"]
    for field in data.draw(st.lists(st.sampled_from(fields), max_size=2)):
        meta[field] = data.draw(VALUES)
    (run / "meta.json").write_bytes(data.draw(damage(text_of(meta))))
    target = run if cmd == "trend" else run / "step_000001"
    Bounded().run(cli, *args_of(cmd, target))


@FUZZ
@given(data=st.data(), cmd=COMMANDS)
def test_random_metrics_lines(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str
) -> None:
    run = make_run(tmp_path_factory.mktemp("metrics") / "run", steps=(1, 2), metrics=False)
    lines = []
    for step in data.draw(st.lists(st.sampled_from([1, 2, 3, "2", None]), max_size=4)):
        record = {"step": step, **data.draw(st.dictionaries(
            st.sampled_from(["loss", "kl", "entropy", "clip_ratio/region_mean", "x"]),
            VALUES, max_size=3))}  # fmt: skip
        lines.append(data.draw(damage(text_of(record))))
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    target = run if cmd == "trend" else run / "step_000002"
    b = Bounded()
    b.run(cli, *args_of(cmd, target))
    if cmd == "objective":  # the same file given as --logged
        b.run(cli, "objective", run / "step_000001", "--logged", run / "metrics.jsonl", "--json")


@FUZZ
@given(data=st.data(), cmd=COMMANDS)
def test_random_recorded_files(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str
) -> None:
    """A file's recorder metadata of any kind, or a file cut after its step's _DONE."""
    run = make_run(tmp_path_factory.mktemp("files") / "run", steps=(1, 2))
    p = run / "step_000001" / "rank000-mb000.parquet"
    if data.draw(st.booleans()):
        t = pq.read_table(p)
        keys = ["step", "rank", "micro_batch", "micro_batches", "world_size", "generation",
                "iteration", "num_items_in_batch", "generated_at_step"]  # fmt: skip
        info = data.draw(st.dictionaries(st.sampled_from(keys), VALUES, max_size=3))
        raw = data.draw(damage(text_of({"micro_batches": 1, **info})))
        pq.write_table(t.replace_schema_metadata({b"grpo_cli": raw}), p)
    else:
        cut = p.read_bytes()
        p.write_bytes(cut[: data.draw(st.integers(0, len(cut) - 1))])
    target = run if cmd == "trend" else run / "step_000001"
    Bounded().run(cli, *args_of(cmd, target))


@st.composite
def jsonl_record(draw: st.DrawFn, n: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"group": draw(st.sampled_from(["a", "b"])), "reward": 1.0}
    for field in ("logp", "old_logp", "ref_logp", "mask"):
        if draw(st.booleans()) or field == "logp":
            k = n + draw(st.sampled_from([0, 0, 0, -1, 1]))
            vals = st.booleans() if field == "mask" else st.one_of(
                st.floats(-5, 0), NUMBERS, st.none())  # fmt: skip
            rec[field] = draw(st.lists(vals, min_size=max(k, 0), max_size=max(k, 0)))
    if draw(st.booleans()):
        rec[draw(st.sampled_from(["reward", "group", "logp", "extra"]))] = draw(VALUES)
    return rec


@FUZZ
@given(data=st.data(), cmd=COMMANDS, gz=st.booleans())
def test_random_jsonl(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str, gz: bool
) -> None:
    import gzip

    n = data.draw(st.integers(1, 4))
    lines = [data.draw(damage(text_of(data.draw(jsonl_record(n)))))
             for _ in range(data.draw(st.integers(1, 5)))]  # fmt: skip
    body = b"\n".join(lines) + data.draw(st.sampled_from([b"\n", b"", b"\r\n\n"]))
    p = tmp_path_factory.mktemp("jsonl") / ("a.jsonl.gz" if gz else "a.jsonl")
    p.write_bytes(gzip.compress(body) if gz else body)
    Bounded().run(cli, *args_of(cmd, p), "--beta", "0")


@st.composite
def nemo_record(draw: st.DrawFn, s: int, i: int) -> dict[str, Any]:
    def per_token(values: Any) -> list[Any]:
        k = s + draw(st.sampled_from([0, 0, 0, -2, 1]))
        return [draw(st.lists(values, min_size=max(k, 0), max_size=max(k, 0)))]

    rec: dict[str, Any] = {
        "token_loss_mask": per_token(st.sampled_from([0, 1, 1, 0.5])),
        "sample_loss_mask": [draw(st.sampled_from([1, 1, 0, 2]))],
        "prev_logprobs": per_token(st.one_of(st.floats(-5, 0), NUMBERS)),
        "rewards": [draw(st.one_of(st.floats(-1, 1), NUMBERS))],
        "token_ids": per_token(st.integers(0, 9)),
        "idx": i,
    }
    if draw(st.booleans()):
        rec["advantages"] = per_token(st.floats(-2, 2))
    if draw(st.booleans()):
        rec["generation_logprobs"] = per_token(st.floats(-5, 0))
    if draw(st.booleans()):
        rec[draw(st.sampled_from(sorted(rec)))] = draw(VALUES)
    return rec


@FUZZ
@given(data=st.data(), cmd=COMMANDS)
def test_random_nemo_rl(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str
) -> None:
    s = data.draw(st.integers(2, 5))
    first = data.draw(nemo_record(s, 0))
    first["token_loss_mask"], first["sample_loss_mask"] = [[0] + [1] * (s - 1)], [1]
    lines = [text_of(first).encode()]  # NeMo-RL's own first line: the file is claimed
    for i in range(1, data.draw(st.integers(1, 6))):
        lines.append(data.draw(damage(text_of(data.draw(nemo_record(s, i))))))
    p = tmp_path_factory.mktemp("nemo") / "train_data_step3.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    Bounded().run(cli, *args_of(cmd, p), "--beta", "0")


# ------------------------------------------------ slime dumps and prime-rl output dirs
FRONTIER = settings(
    max_examples=20,  # each example copies a fixture and runs one command: ~0.2 s
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FIX = Path(__file__).resolve().parent.parent / "conformance" / "frontier" / "fixtures"


@st.composite
def arrays(draw: st.DrawFn) -> Any:
    """A per-token field as a dump may hold it: any dtype, rank or length, non-finite."""
    import numpy as np

    dtype = draw(st.sampled_from(["float32", "float64", "int32", "bool", "complex64", "f2"]))
    shape = draw(st.sampled_from([(1,), (0,), (2,), (1, 1), ()]))
    value = draw(st.sampled_from([0.0, 1.0, -0.5, math.nan, math.inf, 2.0]))
    with np.errstate(invalid="ignore"):
        return np.full(shape, value).astype(dtype)


DUMP_VALUES = st.one_of(VALUES, arrays())


@st.composite
def slime_edit(draw: st.DrawFn, d: Path) -> None:
    """Rollout 0 of the fixture dump with fields of a sample, a shard or the dump
    replaced, a file cut, or an ``args.json`` of slime's options of any value."""
    from grpo_cli.io.torch_pickle import load
    from grpo_cli.trainers import slime

    from .test_hostile_frontier import save

    how = draw(st.sampled_from(["train", "train", "rollout", "shard", "cut", "args"]))
    if how == "args":
        keys = draw(st.lists(st.sampled_from(sorted(slime.CONFIG_KEYS)), max_size=4))
        body = text_of({k: draw(VALUES) for k in keys})
        (d / "args.json").write_bytes(draw(damage(body)))
        return
    name = "rollout_data/0.pt" if how == "rollout" else "train_data/0.pt"
    if how == "cut":
        whole = (d / name).read_bytes()
        (d / name).write_bytes(whole[: draw(st.integers(0, len(whole) - 1))])
        return
    obj = load(d / name)
    if how == "shard":
        shard = obj["dp_shards"][0]
        key = draw(st.sampled_from(sorted(shard)))
        shard[key] = draw(DUMP_VALUES)
    else:
        row = obj["samples"][draw(st.integers(0, 3))]
        keys = sorted(row) + ["rollout_id", "format_version"] * (how == "train")
        key = draw(st.sampled_from(keys))
        target = obj if key in ("rollout_id", "format_version") else row
        target[key] = draw(DUMP_VALUES)
    save(d / name, obj)


@FRONTIER
@given(data=st.data(), cmd=COMMANDS)
def test_random_slime_dumps(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str
) -> None:
    import shutil

    d = tmp_path_factory.mktemp("slime") / "dump"
    for sub in ("train_data", "rollout_data"):
        (d / sub).mkdir(parents=True)
        shutil.copy(FIX / "slime_dump" / sub / "0.pt", d / sub / "0.pt")
    data.draw(slime_edit(d))
    target = d if cmd == "trend" else d / "train_data" / "0.pt"
    Bounded().run(cli, *args_of(cmd, target))


@st.composite
def prime_edit(draw: st.DrawFn, d: Path) -> None:
    """The fixture run with a token record's fields replaced (lists of any length and
    value), a line damaged, a trace line replaced, or a trainer config of any value."""
    from grpo_cli.trainers import prime_rl

    how = draw(st.sampled_from(["record", "record", "line", "trace", "config"]))
    if how == "config":
        keys = [k for k in prime_rl.CONFIG_KEYS if k.startswith("loss.")] + ["loss.x"]
        chosen = draw(st.lists(st.sampled_from(keys), max_size=3))
        loss = {k.removeprefix("loss."): draw(VALUES) for k in chosen}
        body = text_of(draw(st.sampled_from([{"loss": loss}, {"loss": draw(VALUES)}])))
        (d / "configs" / "trainer.json").write_bytes(draw(damage(body)))
        return
    rel = ("rollouts/step_1/train/effective/traces.jsonl" if how == "trace"
           else "token_exports/step_1/rank_0.jsonl")  # fmt: skip
    p = d / rel
    lines = p.read_bytes().splitlines()
    i = draw(st.integers(0, len(lines) - 1))
    rec = json.loads(lines[i])
    if how == "record":
        key = draw(st.sampled_from(sorted(rec)))
        n = len(rec["token_ids"]) + draw(st.sampled_from([0, 0, -1, 1]))
        items = st.one_of(NUMBERS, st.none(), st.booleans(), st.text(max_size=2))
        rec[key] = draw(st.one_of(VALUES, st.lists(items, min_size=max(n, 0), max_size=max(n, 0))))
    elif how == "trace":
        rec[draw(st.sampled_from(sorted(rec)))] = draw(VALUES)
    lines[i] = draw(damage(text_of(rec))) if how != "trace" else text_of(rec).encode()
    p.write_bytes(b"\n".join(lines) + b"\n")


@FRONTIER
@given(data=st.data(), cmd=COMMANDS)
def test_random_prime_rl_runs(
    cli: Cli, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, cmd: str
) -> None:
    import shutil

    d = tmp_path_factory.mktemp("prime") / "run"
    shutil.copytree(FIX / "prime_rl_run", d)
    data.draw(prime_edit(d))
    target = d if cmd == "trend" else d / "token_exports" / "step_1"
    Bounded().run(cli, *args_of(cmd, target))
