"""What trainers already write, read natively: per-token advantages and rewards (verl's
``(N, L)`` ``advantages`` and ``token_level_scores``, in npz and as parquet list
columns), JSONL in grpo-cli's own fields, and NeMo-RL's ``train_data_step{N}.jsonl``.

Every file here is written by the test itself (numpy, pyarrow, Python's ``json``) from
padded arrays, and every expected number is computed from those arrays with plain numpy
loops, or is an identity between formats and layouts of the same data.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.io import open_source
from grpo_cli.io.readers import reader_for

from .conftest import Cli

RNG_SEED = 20260


# ---------------------------------------------------------------------------- data
def rollouts(seed: int = RNG_SEED, n: int = 12, width: int = 7, groups: int = 3) -> dict[str, Any]:
    """Padded ``(N, L)`` rollouts (verl's layout): a mask of lengths 1..L, log-probs,
    per-answer rewards and advantages, group ids; padding holds NaN."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, width + 1, size=n)
    mask = np.arange(width)[None, :] < lengths[:, None]
    old = -rng.exponential(0.6, size=(n, width))
    d: dict[str, Any] = {
        "old_log_probs": old,
        "log_probs": old + rng.normal(0, 0.3, size=(n, width)),
        "ref_log_prob": old + rng.normal(0, 0.2, size=(n, width)),
        "rollout_log_probs": old + rng.normal(0, 0.05, size=(n, width)),
        "response_mask": mask,
    }
    for k in list(d):
        if k != "response_mask":
            d[k] = np.where(mask, d[k], np.nan)
    d["uid"] = np.array([f"p{i % groups}" for i in range(n)])
    d["reward"] = rng.integers(0, 3, size=n).astype(np.float64)
    d["advantage"] = rng.normal(size=n)
    return d


TOKENS = ("old_log_probs", "log_probs", "ref_log_prob", "rollout_log_probs")


def write_npz(path: Path, arrays: dict[str, Any]) -> Path:
    np.savez(path, **arrays)
    return path


def _lists(x: np.ndarray, mask: np.ndarray | None, ragged: bool) -> list[Any]:
    """Rows of a padded array as lists: each answer's own length (``ragged``) or the
    padded width."""
    rows = []
    for i in range(x.shape[0]):
        row = x[i] if not ragged or mask is None else x[i][mask[i]]
        rows.append([v.item() if hasattr(v, "item") else v for v in row])
    return rows


def columns(arrays: dict[str, Any], *, ragged: bool = False) -> dict[str, list[Any]]:
    """The same data as one list per column (2-D arrays as per-row lists; ``ragged``: the
    valid tokens only, no mask)."""
    mask = arrays.get("response_mask")
    out: dict[str, list[Any]] = {}
    for k, v in arrays.items():
        v = np.asarray(v)
        if ragged and k == "response_mask":
            continue
        if v.ndim == 2:
            out[k] = _lists(v, mask, ragged)
        else:
            out[k] = [x.item() for x in v]
    return out


def write_parquet(path: Path, arrays: dict[str, Any], *, ragged: bool = False) -> Path:
    cols = columns(arrays, ragged=ragged)
    table = {}
    for k, v in cols.items():
        if isinstance(v[0], list):
            kind = pa.bool_() if isinstance(v[0][0], bool) else pa.float64()
            table[k] = pa.array(v, type=pa.list_(kind))
        else:
            table[k] = pa.array(v)
    pq.write_table(pa.table(table), path)
    return path


def write_jsonl(path: Path, arrays: dict[str, Any], *, ragged: bool = False) -> Path:
    """One answer a line by Python's ``json.dumps`` (NaN and Infinity as it writes them)."""
    cols = columns(arrays, ragged=ragged)
    n = len(next(iter(cols.values())))
    lines = [json.dumps({k: v[i] for k, v in cols.items()}) for i in range(n)]
    text = "\n".join(lines) + "\n"
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def every_format(tmp: Path, arrays: dict[str, Any], stem: str = "d") -> list[Path]:
    return [
        write_npz(tmp / f"{stem}.npz", arrays),
        write_parquet(tmp / f"{stem}.parquet", arrays),
        write_parquet(tmp / f"{stem}_ragged.parquet", arrays, ragged=True),
        write_jsonl(tmp / f"{stem}.jsonl", arrays),
        write_jsonl(tmp / f"{stem}.jsonl.gz", arrays),
        write_jsonl(tmp / f"{stem}_ragged.jsonl", arrays, ragged=True),
    ]


def close(a: Any, b: Any, path: str = "", rel: float = 1e-12) -> None:
    """Equal, floats to ``rel`` (sums of the same values added in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            close(a[k], b[k], f"{path}.{k}", rel)
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, f"{path}[{i}]", rel)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-14), (path, a, b)
    else:
        assert a == b, (path, a, b)


def doc(cli: Cli, *args: str | Path) -> dict[str, Any]:
    """A command's JSON without what names the input (its source, its warnings' words)."""
    d = cli.json(*args)
    d.pop("source", None)
    d.pop("warnings", None)
    return d


def reference(
    arrays: dict[str, Any], adv: np.ndarray, clip: float = 0.2, beta: float = 0.04
) -> float:
    """The default objective written the plain way, answer by answer: seq-mean-token-mean
    of ``min(ρ A, clip(ρ) A) − β k3``; ``adv`` ``(N,)`` or ``(N, L)``."""
    m = arrays["response_mask"]
    out = []
    for i in range(m.shape[0]):
        v = m[i]
        lp, old = arrays["log_probs"][i][v], arrays["old_log_probs"][i][v]
        ref = arrays["ref_log_prob"][i][v]
        a = adv[i][v] if adv.ndim == 2 else adv[i]
        rho = np.exp(lp - old)
        surr = np.minimum(rho * a, np.clip(rho, 1 - clip, 1 + clip) * a)
        d = ref - lp
        out.append(np.mean(surr - beta * (np.exp(d) - d - 1)))
    return float(np.mean(out))


# ------------------------------------------------------------ per-token advantages
def test_constant_per_token_advantages_are_the_answers_own(cli: Cli, tmp_path: Path) -> None:
    # verl's advantages (N, L): the answer's value times the mask (0 in padding). Read as
    # one value an answer, every format gives the document of the (N,) advantages.
    d = rollouts()
    per_answer = {k: v for k, v in d.items() if k != "reward"}
    per_answer["advantages"] = per_answer.pop("advantage")
    per_token = dict(per_answer)
    per_token["advantages"] = d["advantage"][:, None] * d["response_mask"]
    want = doc(cli, "objective", write_npz(tmp_path / "answers.npz", per_answer))
    assert math.isclose(want["objective"], reference(d, d["advantage"]), rel_tol=1e-12)
    for p in every_format(tmp_path, per_token):
        got = cli.json("objective", p)
        assert any("constant over each answer's valid tokens" in w for w in got["warnings"]), p
        got.pop("source")
        got.pop("warnings")
        close(got, want, str(p))


def test_varying_per_token_advantages_fold_per_token(cli: Cli, tmp_path: Path) -> None:
    # OpenRLHF's KL in the reward: advantages that differ within an answer. The objective
    # takes each token's own (hand: the plain loop with A_{i,t}); every format agrees.
    d = rollouts()
    rng = np.random.default_rng(7)
    adv = d["advantage"][:, None] + rng.normal(0, 0.5, size=d["response_mask"].shape)
    adv = np.where(d["response_mask"], adv, np.nan)  # padding: anything, even NaN
    arrays = {k: v for k, v in d.items() if k not in ("reward", "advantage")}
    arrays["advantages"] = adv
    docs = []
    k = int(np.count_nonzero(d["response_mask"].sum(axis=1) >= 2))  # one token: constant
    for p in every_format(tmp_path, arrays):
        got = cli.json("objective", p)
        assert any(f"varying within {k} of 12 answers" in w for w in got["warnings"]), got
        assert math.isclose(got["objective"], reference(d, adv), rel_tol=1e-12), p
        # each answer's advantage in the statistics: its mean over its valid tokens
        means = [float(np.mean(adv[i][d["response_mask"][i]])) for i in range(12)]
        assert math.isclose(got["advantage"]["mean"], float(np.mean(means)), rel_tol=1e-12)
        got.pop("source")
        got.pop("warnings")
        docs.append(got)
    for other in docs[1:]:
        close(other, docs[0])


def test_per_token_advantages_in_every_command(cli: Cli, tmp_path: Path) -> None:
    # answers and check take the same per-token advantages as the objective
    d = rollouts()
    adv = d["advantage"][:, None] * np.linspace(0.5, 1.5, d["response_mask"].shape[1])
    arrays = {k: v for k, v in d.items() if k not in ("reward", "advantage")}
    arrays["advantages"] = np.where(d["response_mask"], adv, 0.0)
    npz, parquet, _, jsonl, _, _ = every_format(tmp_path, arrays)
    tops = []
    for p in (npz, parquet, jsonl):
        rows = cli.json("answers", p, "--sort", "advantage")["answers"]
        # (an npz without rewards carries no group ids, as before: not compared)
        tops.append([{k: v for k, v in r.items() if k not in ("source", "group")} for r in rows])
    # the answer of the largest |A_t|: hand
    valid = np.where(d["response_mask"], np.abs(arrays["advantages"]), -1.0)
    best = int(np.argmax(valid.max(axis=1)))
    for top in tops:
        assert top[0]["row"] == best
        close(top, tops[0])
    checks = []
    for p in (npz, parquet, jsonl):
        r = cli("check", p, "--format", "json")
        assert r.exit_code in (0, 1), r.stderr
        c = json.loads(r.stdout)
        checks.append([(x["rule"], x["status"], x["value"]) for x in c["results"]])
    assert checks[0] == checks[1] == checks[2]


# ---------------------------------------------------------------- per-token rewards
def verl_scores(d: dict[str, Any]) -> np.ndarray:
    """verl's token_level_scores: the reward on the answer's last valid token, 0 elsewhere."""
    m = d["response_mask"]
    scores = np.zeros(m.shape)
    last = m.sum(axis=1) - 1
    scores[np.arange(m.shape[0]), last] = d["reward"]
    return scores


@pytest.mark.parametrize("name", ["token_level_scores", "token_level_rewards"])
def test_token_scores_are_summed_per_answer(cli: Cli, tmp_path: Path, name: str) -> None:
    # no --column: the name is known, the layout says per token; the rewards are the row
    # sums, so the advantages are those of the (N,) rewards
    d = rollouts()
    base = {k: v for k, v in d.items() if k not in ("reward", "advantage")}
    per_answer = {**base, "rewards": d["reward"]}
    want = doc(cli, "advantages", write_npz(tmp_path / "rewards.npz", per_answer))
    # hand: the grpo advantages of the rewards, group by group
    codes = np.array([int(u[1:]) for u in d["uid"]])
    hand = np.zeros(12)
    for g in range(3):
        r = d["reward"][codes == g]
        hand[codes == g] = 0.0 if r.max() == r.min() else (r - r.mean()) / (r.std() + 1e-8)
    np.testing.assert_allclose(want["advantages"], hand, rtol=1e-12, atol=1e-15)
    for p in every_format(tmp_path, {**base, name: verl_scores(d)}):
        got = cli.json("advantages", p)
        assert any("holds one reward per token" in w for w in got["warnings"]), got
        got.pop("source")
        got.pop("warnings")
        close(got, want, str(p))


def test_token_scores_outside_the_mask_count_as_verl_counts_them(cli: Cli, tmp_path: Path) -> None:
    # verl 0.9.1 compute_grpo_outcome_advantage: scores = token_level_rewards.sum(dim=-1),
    # no mask: a score in the padding is part of the answer's reward (and noted)
    d = rollouts()
    scores = verl_scores(d)
    short = int(np.flatnonzero(d["response_mask"].sum(axis=1) < 7)[0])
    scores[short, -1] = 5.0  # outside that answer's mask
    arrays = {k: v for k, v in d.items() if k not in ("reward", "advantage")}
    arrays["token_level_scores"] = scores
    for p in every_format(tmp_path, arrays)[:2]:  # the padded layouts (npz, parquet)
        got = cli.json("advantages", p)
        g = next(x for x in got["groups"] if x["id"] == d["uid"][short])
        members = d["uid"] == d["uid"][short]
        assert math.isclose(g["mean"], float(scores.sum(axis=1)[members].mean()), rel_tol=1e-12)
        assert any("1 answer(s) hold nonzero scores outside the mask" in w for w in got["warnings"])


def test_token_scores_match_verl_itself(tmp_path: Path) -> None:
    # the oracle: verl 0.9.1's own compute_grpo_outcome_advantage on the padded tensors
    if os.environ.get("GRPO_CLI_REQUIRE_TRAINERS"):
        import torch
    else:
        torch = pytest.importorskip("torch")
        pytest.importorskip("verl")
    import warnings

    warnings.filterwarnings("ignore", message=r".*engine is not available")
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from grpo_cli import Settings, advantages_report, resolve_settings

    d = rollouts()
    scores = verl_scores(d)
    scores[0, -1] += 0.5  # a score in the padding too, which verl counts
    arrays = {k: v for k, v in d.items() if k not in ("reward", "advantage")}
    arrays["token_level_scores"] = scores.astype(np.float32)
    want, _ = compute_grpo_outcome_advantage(
        torch.tensor(scores, dtype=torch.float32),
        torch.tensor(d["response_mask"], dtype=torch.float32),
        d["uid"],
    )
    per_answer = want.numpy()[np.arange(12), d["response_mask"].sum(axis=1) - 1]
    s: Settings = resolve_settings("verl")
    npz, parquet, _, jsonl, gz, _ = every_format(tmp_path, arrays)  # the padded layouts
    for p in (npz, parquet, jsonl, gz):
        got = advantages_report(open_source([str(p)]), s)
        np.testing.assert_allclose(got.advantages, per_answer, rtol=1e-5, atol=1e-6, err_msg=p)


# ---------------------------------------------------------------------------- JSONL
def test_jsonl_is_parquet(cli: Cli, tmp_path: Path) -> None:
    # grpo-cli's own fields, one answer a line: every command's document equals parquet's
    d = rollouts(n=30)
    arrays = {k: v for k, v in d.items() if k != "advantage"}
    pqf = write_parquet(tmp_path / "x.parquet", arrays, ragged=True)
    for p in (write_jsonl(tmp_path / "x.jsonl", arrays, ragged=True), pqf.with_suffix(".jsonl")):
        for cmd in (["objective"], ["objective", "--preset", "verl"], ["kl"], ["advantages"]):
            close(doc(cli, *cmd[:1], p, *cmd[1:]), doc(cli, *cmd[:1], pqf, *cmd[1:]), str(cmd))
        a = [r | {"source": ""} for r in cli.json("answers", p, "--sort", "kl-max")["answers"]]
        b = [r | {"source": ""} for r in cli.json("answers", pqf, "--sort", "kl-max")["answers"]]
        close(a, b)


def test_jsonl_shards_are_one_dataset(cli: Cli, tmp_path: Path) -> None:
    # a directory of .jsonl files is one step's shards (as parquet's), in any engine cut
    d = rollouts(n=30)
    arrays = {k: v for k, v in d.items() if k != "advantage"}
    whole = doc(cli, "objective", write_jsonl(tmp_path / "whole.jsonl", arrays, ragged=True))
    shards = tmp_path / "shards"
    shards.mkdir()
    for k, (lo, hi) in enumerate([(0, 7), (7, 8), (8, 30)]):
        part = {key: v[lo:hi] for key, v in arrays.items()}
        write_jsonl(shards / f"rank{k}.jsonl{'.gz' if k == 1 else ''}", part, ragged=True)
    for workers in ("1", "2"):
        got = doc(cli, "objective", shards, "--workers", workers)
        got["engine"] = whole["engine"]
        close(got, whole)


def test_jsonl_nan_and_infinity_are_floats(cli: Cli, tmp_path: Path) -> None:
    # Python's json.dumps writes NaN, Infinity, -Infinity: read as those floats. In the
    # padding (mask False) they change nothing; inside the mask they are an error naming
    # the field, row and token (and counted by check).
    d = rollouts()
    arrays = {k: v for k, v in d.items() if k != "advantage"}
    want = doc(cli, "objective", write_npz(tmp_path / "x.npz", arrays))
    pad = {k: (np.where(d["response_mask"], v, -np.inf) if k in TOKENS else v)
           for k, v in arrays.items()}  # fmt: skip
    pad["log_probs"] = np.where(d["response_mask"], d["log_probs"], np.inf)
    p = write_jsonl(tmp_path / "pad.jsonl", pad)
    assert b"Infinity" in p.read_bytes() and b"NaN" not in p.read_bytes()
    close(doc(cli, "objective", p), want)
    assert "NaN" in (write_jsonl(tmp_path / "nan.jsonl", arrays)).read_text()
    close(doc(cli, "objective", tmp_path / "nan.jsonl"), want)
    bad = {**arrays, "log_probs": arrays["log_probs"].copy()}
    bad["log_probs"][3, 0] = np.nan
    f = write_jsonl(tmp_path / "bad.jsonl", bad)
    cli.error(["objective", str(f)], "column 'log_probs' has nan inside the mask at row 3, token 0")
    r = cli("check", f, "--format", "json")
    assert r.exit_code == 1
    finite = next(x for x in json.loads(r.stdout)["results"] if x["rule"] == "finite")
    assert finite["status"] == "fail" and finite["value"] == 1


def test_jsonl_lines_as_people_write_them(cli: Cli, tmp_path: Path) -> None:
    # blank lines, CRLF, keys in any order per line, null padding, booleans as the mask,
    # integers as floats, no newline at the end: the same numbers
    lines = [
        {"group": 1, "reward": 1, "logp": [-0.5, -1.0], "old_logp": [-0.4, -1.1],
         "mask": [True, True]},
        {"mask": [True, False], "old_logp": [-0.2, None], "logp": [-0.1, None], "reward": 0,
         "group": 1},
        {"group": 2, "reward": 0.5, "logp": [-2, -0.25, -0.5], "old_logp": [-2, -0.5, -0.5],
         "mask": [True, True, True]},
        {"group": 2, "reward": 1.5, "logp": [-1], "old_logp": [-1], "mask": [True]},
    ]  # fmt: skip
    text = "\r\n".join(["", json.dumps(lines[0]), "  ", *map(json.dumps, lines[1:])])
    f = tmp_path / "x.jsonl"
    f.write_bytes(text.encode())
    got = cli.json("objective", f, "--beta", "0")
    # hand: group 1 rewards (1, 0): A = (±0.5)/(0.5 + 1e-8); group 2 (0.5, 1.5): ∓ the same
    a = 0.5 / (0.5 + 1e-8)
    adv = [a, -a, -a, a]
    rho = [np.exp([-0.1, 0.1]), np.exp([0.1]), np.exp([0.0, 0.25, 0.0]), np.exp([0.0])]
    per = [
        np.mean(np.minimum(r * x, np.clip(r, 0.8, 1.2) * x)) for r, x in zip(rho, adv, strict=True)
    ]
    assert math.isclose(got["objective"], float(np.mean(per)), rel_tol=1e-12)
    assert got["counts"] == {"groups": 2, "answers": 4, "tokens": 7}


def test_jsonl_on_a_pyarrow_filesystem(tmp_path: Path) -> None:
    # a file on a filesystem that is not the local one (here a sub-tree filesystem, the
    # same path as s3:// takes): read through its streams, gzip too, as the local file
    import pyarrow.fs as pafs

    from grpo_cli import objective_report, resolve_settings
    from grpo_cli.io import RemoteFile

    d = rollouts(n=20)
    arrays = {k: v for k, v in d.items() if k != "advantage"}
    write_jsonl(tmp_path / "x.jsonl.gz", arrays)
    nemo = write_nemo(tmp_path / "n.jsonl", nemo_step())
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    for name, s in (("x.jsonl.gz", resolve_settings()), (nemo.name, resolve_settings(beta=0.0))):
        remote = open_source([RemoteFile(fs, name, f"sub://{name}")])
        local = open_source([str(tmp_path / name)])
        assert type(remote.reader) is type(local.reader)
        a, b = objective_report(remote, s), objective_report(local, s)
        assert a.objective == b.objective and a.tokens == b.tokens


def test_jsonl_files_are_told_apart_from_nemo_rl(tmp_path: Path) -> None:
    # both end in .jsonl: NeMo-RL's are claimed by their nested loss masks
    nemo = write_nemo(tmp_path / "anything.jsonl", nemo_step())
    own = tmp_path / "train_data_step1.jsonl"  # named like NeMo-RL's, grpo-cli's fields
    own.write_text(json.dumps({"group": 0, "reward": 1, "logp": [-1.0],
                               "token_loss_mask": [1]}) + "\n")  # fmt: skip
    assert reader_for(nemo).format == "nemo-rl"  # type: ignore[union-attr]
    assert reader_for(own).format == "jsonl"  # type: ignore[union-attr]
    assert open_source([str(own)]).name("mask") == "token_loss_mask"


def test_jsonl_memory_does_not_grow_with_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a JSONL file of 1x, then 4x, many chunks (pass 1's of 64 KiB here, 16 MiB by default;
    # batches of 4096 tokens): the numpy and Python memory a run takes (tracemalloc sees
    # numpy's buffers and the text chunks) grows by pass 1's arrays (a few floats an
    # answer), not by the file. The quantile sketches keep exact values up to a cap (a
    # million by default): capped small here, so that what is left is the reading.
    import tracemalloc

    monkeypatch.setattr("grpo_cli.io.readers.jsonl.PASS1_BYTES", 1 << 16)
    from grpo_cli import objective_report, resolve_settings
    from grpo_cli.engine.options import EngineOptions

    rng = np.random.default_rng(3)
    engine = EngineOptions(workers=1, batch_tokens=4096)
    sizes, peaks = [], []
    for k, n in enumerate((2_000, 8_000)):
        f = tmp_path / f"big{k}.jsonl"
        with f.open("w") as out:
            for i in range(n):
                t = int(rng.integers(20, 60))
                old = (-rng.exponential(0.5, t)).round(6)
                row = {"group": i // 8, "reward": float(i % 3), "logp": (old - 0.01).tolist(),
                       "old_logp": old.tolist(), "ref_logp": (old + 0.02).tolist()}  # fmt: skip
                out.write(json.dumps(row) + "\n")
        sizes.append(f.stat().st_size / 2**20)
        tracemalloc.start()
        try:
            r = objective_report(open_source([str(f)]), resolve_settings(), engine=engine,
                                 exact_cap=1024)  # fmt: skip
            peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        finally:
            tracemalloc.stop()
        assert r.answers == n
    per_answer = 6_000 * 64 / 2**20  # pass 1's arrays and the answer-level partials
    assert sizes[1] > 3.5 * sizes[0] > 10, sizes
    # the file grew by 9 MiB of text; the run's peak (fixed histograms and sketches, a
    # chunk, a batch) by less than the answers' own arrays and a MiB
    assert peaks[1] - peaks[0] < 1 + per_answer, (peaks, sizes)


# --------------------------------------------------------------------------- NeMo-RL
def nemo_step(seed: int = 5, prompts: int = 3, g: int = 4, s: int = 14) -> dict[str, Any]:
    """One GRPO step as NeMo-RL's train_data holds it: prompts repeated g times
    (``repeat_interleave``), token ids and masks padded to S, advantages expanded over all
    S positions, log-probs with position i for token i (0 at position 0 and the prompt),
    float32 as its tensors are."""
    rng = np.random.default_rng(seed)
    b = prompts * g
    prompt = [rng.integers(5, 50, size=int(rng.integers(2, 5))) for _ in range(prompts)]
    ids = np.zeros((b, s), np.int64)
    tmask = np.zeros((b, s), np.int64)
    gen = np.zeros((b, s), np.float32)
    prev = np.zeros((b, s), np.float32)
    for i in range(b):
        p = prompt[i // g]
        k = p.shape[0]
        n = int(rng.integers(1, s - k))
        ids[i, :k], ids[i, k : k + n] = p, rng.integers(50, 99, size=n)
        tmask[i, k : k + n] = 1
        gen[i, k : k + n] = -rng.exponential(1.0, n)
        prev[i, k : k + n] = gen[i, k : k + n] + rng.normal(0, 0.1, n)
    rewards = rng.integers(0, 2, b).astype(np.float32)
    adv = np.repeat(rng.normal(size=(b, 1)), s, axis=1).astype(np.float32)
    return {
        "content": [[f"prompt {i // g}", f"answer {i}"] for i in range(b)],
        "rewards": rewards,
        "input_lengths": (ids != 0).sum(axis=1),
        "token_ids": ids,
        "token_loss_mask": tmask,
        "sample_loss_mask": np.ones(b, np.float32),
        "advantages": adv,
        "generation_logprobs": gen,
        "prev_logprobs": prev,
    }


def write_nemo(path: Path, log: dict[str, Any]) -> Path:
    """As ``Logger.log_batched_dict_as_jsonl`` writes (NeMo-RL v0.6.0): a batch of one a
    line (tensors' rows by tolist(), lists sliced), plus its index, by json.dumps."""
    n = len(log["rewards"])
    with path.open("w") as f:
        for i in range(n):
            sample = {
                k: (v[i : i + 1].tolist() if isinstance(v, np.ndarray) else v[i : i + 1])
                for k, v in log.items()
            }
            f.write(json.dumps({**sample, "idx": i}, default=str) + "\n")
    return path


def nemo_mask(log: dict[str, Any]) -> np.ndarray:
    """The loss's mask: token_loss_mask[:, 1:] * sample_loss_mask."""
    return (log["token_loss_mask"][:, 1:] * log["sample_loss_mask"][:, None]).astype(bool)


def test_nemo_rl_objective_is_its_loss_by_hand(cli: Cli, tmp_path: Path) -> None:
    # the file's own advantages, every field's [:, 1:], the loss's mask; samples with a
    # sample_loss_mask 0 left out. With old_logp given as the sampler's, the ratio moves.
    log = nemo_step()
    log["sample_loss_mask"][5] = 0.0  # overlong filtering
    f = write_nemo(tmp_path / "train_data_step7.jsonl", log)
    m = nemo_mask(log)
    keep = m.any(axis=1)
    adv = log["advantages"][:, 1:].astype(np.float64)
    prev = log["prev_logprobs"][:, 1:].astype(np.float64)
    gen = log["generation_logprobs"][:, 1:].astype(np.float64)

    got = cli.json("objective", f, "--beta", "0")
    assert got["on_policy"] and got["advantages_source"] == "file"
    assert got["counts"]["answers"] == 11 and got["counts"]["tokens"] == int(m.sum())
    hand = np.mean([adv[i][m[i]].mean() for i in np.flatnonzero(keep)])  # ratio 1
    assert math.isclose(got["objective"], float(hand), rel_tol=1e-12)
    assert any("1 sample(s) without a loss token" in w and "idx 5" in w for w in got["warnings"])
    assert "no 'old_logp': treating the batch as on-policy (ratio = 1)" in got["warnings"]
    assert got["kl"] is None  # no reference: null, with its note
    assert any("kl (no ref_logp)" in w for w in got["warnings"])
    # the sampler against the trainer, token by token: rollout KL k1 = mean(prev − gen)?
    # (grpo-cli's rollout block compares rollout_logp with the trainer's log-probs)
    d = (prev - gen)[m]
    assert math.isclose(got["rollout"]["abs_diff_mean"], float(np.mean(np.abs(d))), rel_tol=1e-12)
    assert math.isclose(got["rollout"]["abs_diff_max"], float(np.max(np.abs(d))), rel_tol=1e-12)

    moved = cli.json("objective", f, "--beta", "0", "-c", "old_logp=generation_logprobs")
    per = []
    for i in np.flatnonzero(keep):
        rho = np.exp(prev[i][m[i]] - gen[i][m[i]])
        a = adv[i][m[i]]
        per.append(np.mean(np.minimum(rho * a, np.clip(rho, 0.8, 1.2) * a)))
    assert math.isclose(moved["objective"], float(np.mean(per)), rel_tol=1e-12)
    tok = cli.json("objective", f, "--beta", "0", "--agg", "token-mean")
    assert math.isclose(tok["objective"], float(adv[m].mean()), rel_tol=1e-12)


def test_nemo_rl_groups_are_its_prompts(cli: Cli, tmp_path: Path) -> None:
    # NeMo-RL's baseline groups identical prompt rows (calculate_baseline_and_std_per_prompt):
    # recomputed advantages group the same samples (hand: by the prompt each was drawn
    # from), a prompt drawn twice in the step being one group, said in a note
    log = nemo_step(prompts=3, g=4)
    f = write_nemo(tmp_path / "a.jsonl", log)
    prompt_of = np.repeat(np.arange(3), 4)
    got = cli.json("advantages", f)
    r = log["rewards"].astype(np.float64)
    hand = np.zeros(12)
    for g in range(3):
        x = r[prompt_of == g]
        hand[prompt_of == g] = 0.0 if x.max() == x.min() else (x - x.mean()) / (x.std() + 1e-8)
    np.testing.assert_allclose(got["advantages"], hand, rtol=1e-12, atol=1e-15)
    assert [x["size"] for x in got["groups"]] == [4, 4, 4]
    assert not any("groups:" in w for w in got["warnings"])
    # the first prompt again as the last block: one group of 8, not contiguous
    twice = {k: (v.copy() if isinstance(v, np.ndarray) else list(v)) for k, v in log.items()}
    for k in ("token_ids", "token_loss_mask", "generation_logprobs", "prev_logprobs"):
        twice[k][8:] = log[k][:4]
    g2 = cli.json("advantages", write_nemo(tmp_path / "b.jsonl", twice))
    assert sorted(x["size"] for x in g2["groups"]) == [4, 8]
    assert any("the 2 distinct prompts" in w and "not contiguous" in w for w in g2["warnings"])


def test_nemo_rl_varying_advantages_and_non_finite_values(cli: Cli, tmp_path: Path) -> None:
    # a message-level penalty (invalid_tool_call_advantage) sets some tokens' advantages:
    # per token; NaN and -Infinity where the loss does not look (position 0, the prompt)
    log = nemo_step()
    two = int(np.flatnonzero(log["token_loss_mask"].sum(axis=1) >= 3)[0])
    log["advantages"][two, np.flatnonzero(log["token_loss_mask"][two])[-1]] = -1.0
    log["generation_logprobs"][:, 0] = -np.inf
    log["prev_logprobs"][:, 1] = np.nan  # inside every prompt (each is 2+ tokens)
    f = write_nemo(tmp_path / "train_data_step2.jsonl", log)
    assert "-Infinity" in f.read_text() and "NaN" in f.read_text()
    m = nemo_mask(log)
    adv = log["advantages"][:, 1:].astype(np.float64)
    got = cli.json("objective", f, "--beta", "0")
    assert math.isclose(
        got["objective"], float(np.mean([adv[i][m[i]].mean() for i in range(12)])), rel_tol=1e-12
    )
    assert any("varying within 1 of 12 answers" in w for w in got["warnings"])
    log["prev_logprobs"][4, np.flatnonzero(log["token_loss_mask"][4])[0]] = np.nan
    bad = write_nemo(tmp_path / "bad.jsonl", log)
    first = int(np.flatnonzero(m[4])[0])
    cli.error(
        ["objective", str(bad), "--beta", "0"],
        f"column 'prev_logprobs' has nan inside the mask at row 4, token {first}",
    )


def test_nemo_rl_without_prev_logprobs_is_said(cli: Cli, tmp_path: Path) -> None:
    # loss_fn.force_on_policy_ratio: prev_logprobs are zeros; the ratio is 1 either way
    log = nemo_step()
    log["prev_logprobs"][:] = 0.0
    f = write_nemo(tmp_path / "z.jsonl", log)
    got = cli.json("objective", f, "--beta", "0")
    assert any("--column logp=generation_logprobs" in w for w in got["warnings"])
    fixed = cli.json("objective", f, "--beta", "0", "-c", "logp=generation_logprobs")
    assert not any("--column logp=generation_logprobs" in w for w in fixed["warnings"])
    assert math.isclose(fixed["objective"], got["objective"], rel_tol=1e-12)


def test_nemo_rl_steps_in_trend(cli: Cli, tmp_path: Path) -> None:
    # one file a step: trend reads a directory of them, each row objective's on its file
    for step in (3, 10):
        write_nemo(tmp_path / f"train_data_step{step}.jsonl", nemo_step(seed=step))
    t = cli.json("trend", tmp_path, "--beta", "0")
    assert [r["step"] for r in t["steps"]] == [3, 10]
    for r in t["steps"]:
        one = cli.json("objective", tmp_path / r["source"], "--beta", "0")
        assert r["objective"] == one["objective"] and r["answers"] == one["counts"]["answers"]


def test_nemo_rl_streams_in_batches(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # small batches (a chunk of lines each) give the numbers of one batch
    log = nemo_step(prompts=16, g=8, s=120)
    f = write_nemo(tmp_path / "s.jsonl", log)
    whole = doc(cli, "objective", f, "--beta", "0", "-c", "old_logp=generation_logprobs")
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", "1")  # the smallest chunk: 64 KiB of text
    assert f.stat().st_size > 3 * 65536
    small = doc(cli, "objective", f, "--beta", "0", "-c", "old_logp=generation_logprobs")
    small["engine"] = whole["engine"]
    close(small, whole)


# -------------------------------------------------------------------------- refusals
def test_refusals_name_the_field_and_what_to_do(cli: Cli, tmp_path: Path) -> None:
    d = rollouts(n=4, groups=2)
    m = d["response_mask"]
    tok = {k: d[k] for k in ("log_probs", "old_log_probs")}

    def npz(name: str, **arrays: Any) -> str:
        return str(write_npz(tmp_path / f"{name}.npz", arrays))

    def parquet(name: str, table: dict[str, Any]) -> str:
        pq.write_table(pa.table(table), tmp_path / f"{name}.parquet")
        return str(tmp_path / f"{name}.parquet")

    def jsonl(name: str, text: str) -> str:
        (tmp_path / f"{name}.jsonl").write_text(text)
        return str(tmp_path / f"{name}.jsonl")

    scores = verl_scores(d)
    obj = ["objective", "--beta", "0"]
    cases = [
        # npz: per-token rewards need their groups
        (["advantages", npz("a", token_level_scores=scores)],
         "array 'token_level_scores' holds per-token rewards (N, L): give each answer's group "
         "id as an (N,) array 'group'"),
        (["advantages", npz("b", token_level_scores=scores, uid=d["uid"][:3])],
         "per-token rewards (N, L) need 'uid' of shape (4,)"),
        (["advantages", npz("c", token_level_scores=scores, uid=d["uid"],
                            response_mask=m[:, :3])],
         "array 'response_mask' has shape (4, 3), but 'token_level_scores' has (4, 7)"),
        ([*obj, npz("d", **tok, advantages=np.zeros((4, 5)), response_mask=m)],
         "array 'advantages' has shape (4, 5), but 'log_probs' has (4, 7): per-token "
         "advantages are (N, L)"),
        ([*obj, npz("e", **tok, advantages=np.zeros((3, 7)))],
         "array 'advantages' has shape (3, 7), expected (4,) or (4, L)"),
        # parquet: a per-token column must line up with the mask and the tokens
        ([*obj, parquet("f", {"log_probs": [[-1.0, -1.0]], "advantages": [[1.0]],
                                     "mask": [[True, True]]})],
         "row 0: column 'advantages' has 1 values but the mask 'mask' has 2"),
        ([*obj, parquet("g", {"log_probs": [[-1.0, -1.0]], "advantages": [[1.0]]})],
         "row 0: column 'advantages' has 1 values but column 'log_probs' has 2 (per-token "
         "advantages need one value per token)"),
        (["advantages", parquet("h", {"uid": ["a"], "token_level_scores": [[True, False]]})],
         "column 'token_level_scores' holds booleans, expected numbers"),
        ([*obj, parquet("i", {"log_probs": [[-1.0, -1.0]], "advantages": [[1.0, None]]})],
         "column 'advantages' has a null value at row 0, token 1"),
        ([*obj, parquet("j", {"log_probs": [[-1.0, -1.0]],
                                     "advantages": [[1.0, float("nan")]]})],
         "column 'advantages' has non-finite value nan at row 0"),
        (["advantages", parquet("k", {"uid": ["a"], "acc_reward": [1.0], "logp": [[-1.0]]})],
         "the file has: uid, acc_reward, logp; if 'acc_reward' holds it, pass --column "
         "reward=acc_reward"),
        # JSONL
        ([*obj, jsonl("l", '{"logp": [-1.0], "advantage": 1}\n'
                                  '{"logp": "x", "advantage": 1}\n')],
         "field 'logp' holds a string at row 1 where a array was expected (as on the first "
         "line): give every line the same JSON types"),
        ([*obj, jsonl("m", '{"logp": [-1.0], "advantage": 1}\n[1, 2]\n')],
         "row 1 is not a JSON object (one answer per line)"),
        ([*obj, jsonl("n", '{"logp": [-1.0], "advantage": 1}\n{"logp": [-1.0], '
                                  '"advantage": 1\n')],
         "cannot read row 1 as JSON (Missing a comma or '}' after an object member)"),
        ([*obj, jsonl("o", '{"logp": [-1.0], "advantage": 1}\n{"advantage": 2}\n')],
         "field 'logp' is null at row 1"),
        ([*obj, jsonl("p", "\n \n")], "no answers (the file is empty)"),
        (["advantages", jsonl("q", '{"group": 1.5, "reward": 1}\n')],
         "field 'group' has type double, expected integers or strings"),
        (["advantages", jsonl("r", '{"group": 1, "reward": [true]}\n')],
         "field 'reward' holds a boolean at row 0 where a number was expected"),
    ]  # fmt: skip
    for args, message in cases:
        cli.error(args, message)
    other = tmp_path / "two"
    other.mkdir()
    (other / "a.jsonl").write_text('{"logp": [-1.0], "advantage": 1}\n')
    (other / "b.jsonl").write_text('{"logp": [-1.0], "advantages": 1}\n')
    cli.error(["objective", str(other)], "fields differ from")


def test_nemo_rl_refusals(cli: Cli, tmp_path: Path) -> None:
    log = nemo_step()
    f = write_nemo(tmp_path / "train_data_step1.jsonl", log)
    cli.error(
        ["objective", str(f)],
        "'reference_policy_logprobs' is missing, but with beta = 0.04 > 0 the KL term needs "
        "the reference log-probs (give them, or pass --beta 0)",
    )
    write_nemo(tmp_path / "train_data_step2.jsonl", log)
    cli.error(
        ["objective", str(tmp_path), "--beta", "0"],
        "2 NeMo-RL files given: each train_data_step file is one step; give one (grpo-cli "
        "trend DIR reads every step in turn)",
    )
    frac = dict(log, sample_loss_mask=np.full(12, 0.5, np.float32))
    cli.error(
        ["objective", str(write_nemo(tmp_path / "frac.jsonl", frac)), "--beta", "0"],
        "field 'sample_loss_mask' is 0.5 at row 0: grpo-cli reads a 0/1 sample mask",
    )
    two = write_nemo(tmp_path / "two.jsonl", log)
    lines = two.read_text().splitlines()
    row = json.loads(lines[3])
    row["rewards"] = [1.0, 0.0]
    lines[3] = json.dumps(row)
    two.write_text("\n".join(lines) + "\n")
    cli.error(
        ["advantages", str(two)],
        "field 'rewards' holds 2 values at row 3, expected a list of one (NeMo-RL writes one "
        "sample a line)",
    )
    short = dict(log, token_loss_mask=log["token_loss_mask"][:, :10])
    cli.error(
        ["objective", str(write_nemo(tmp_path / "short.jsonl", short)), "--beta", "0"],
        "row 0: field 'advantages' has 14 positions but 'token_loss_mask' has 10",
    )
