"""Writes sample_data/broken/: small rollout logs, each broken in one known way.

`grpo-cli check` must fail exactly the rules named in BROKEN for each file (tested in
tests/test_check.py), and pass healthy.parquet. Deterministic: fixed seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

OUT = Path(__file__).resolve().parent / "broken"

# file -> the rules it is built to fail (on-policy-exact only with --on-policy)
BROKEN = {
    "nan_logp.parquet": ["finite"],
    "positive_logp.parquet": ["logp-range"],
    "ragged_lengths.parquet": ["lengths-match"],
    "empty_answer.parquet": ["mask-nonempty"],
    "uneven_groups.parquet": ["group-size"],
    "inf_reward.parquet": ["rewards-finite"],
    "no_signal.parquet": ["zero-std-groups"],
    "kl_mean.parquet": ["kl-mean"],
    "kl_spike.parquet": ["kl-max"],
    "clipped.parquet": ["clip-region"],
    "ratio_overflow.parquet": ["ratio-extreme"],
    "recomputed.parquet": ["on-policy-exact"],
    "bad_advantages.parquet": ["advantage-mean"],
    "rollout_mismatch.parquet": ["rollout-mismatch"],
    "residual_advantages.parquet": ["zero-variance-advantage"],
}

G = 4
PATTERNS = [
    [1, 0, 0, 1],
    [0, 1, 1, 1],
    [1, 0, 0, 0],
    [0.5, 1, 0, 0.25],
    [1, 1, 0, 1],
    [0, 0, 1, 0],
    [1, 0, 1, 0],
    [0.2, 0.8, 0.4, 0.6],
    [0, 0, 0, 0],
    [1, 1, 1, 1],
]


def base(seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    n = len(PATTERNS) * G
    lengths = rng.integers(20, 41, size=n)
    old = [-rng.exponential(0.3, size=k) - 0.01 for k in lengths]
    return {
        "group": [f"q{i // G}" for i in range(n)],
        "reward": [float(r) for p in PATTERNS for r in p],
        "old_logp": old,
        "logp": [np.minimum(o + rng.normal(0, 0.02, size=o.size), -1e-4) for o in old],
        "ref_logp": [np.minimum(o + rng.normal(0, 0.02, size=o.size), -1e-4) for o in old],
    }


def advantages(reward: list[float]) -> np.ndarray:
    r = np.asarray(reward).reshape(-1, G)
    std = r.std(axis=1, keepdims=True)
    a = np.where(std > 0, (r - r.mean(axis=1, keepdims=True)) / (std + 1e-8), 0.0)
    return a.reshape(-1)


def write(
    name: str,
    d: dict[str, list],
    mask: list[np.ndarray] | None = None,
    advantage: np.ndarray | None = None,
) -> None:
    cols: dict[str, pa.Array] = {"group": pa.array(d["group"]), "reward": pa.array(d["reward"])}
    for f in ("logp", "old_logp", "ref_logp", "rollout_logp"):
        if f not in d:
            continue
        cols[f] = pa.array(
            [np.asarray(x, dtype=np.float32).tolist() for x in d[f]], type=pa.list_(pa.float32())
        )
    if mask is not None:
        cols["mask"] = pa.array([m.tolist() for m in mask], type=pa.list_(pa.bool_()))
    if advantage is not None:
        cols["advantage"] = pa.array(advantage)
    pq.write_table(pa.table(cols), OUT / name)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    write("healthy.parquet", base())

    d = base()
    d["logp"][5][3] = np.nan
    write("nan_logp.parquet", d)

    d = base()
    d["logp"][2][1] = 0.7
    write("positive_logp.parquet", d)

    d = base()
    d["old_logp"][4] = d["old_logp"][4][:-1]
    write("ragged_lengths.parquet", d)

    d = base()
    mask = [np.ones(len(x), dtype=bool) for x in d["logp"]]
    mask[6][:] = False
    write("empty_answer.parquet", d, mask=mask)

    d = base()
    keep = [i for i in range(len(d["group"])) if i not in (1, 2)]  # group q0 keeps 2 answers
    write("uneven_groups.parquet", {k: [v[i] for i in keep] for k, v in d.items()})

    d = base()
    d["reward"][3] = float("inf")
    write("inf_reward.parquet", d)

    d = base()
    d["reward"] = [float(i // G % 2) for i in range(len(d["group"]))]  # every group constant
    write("no_signal.parquet", d)

    d = base()
    d["ref_logp"] = [lp - 2.5 for lp in d["logp"]]  # k3 = e^-2.5 + 1.5 ≈ 1.58 on every token
    write("kl_mean.parquet", d)

    d = base()
    d["logp"][7][2] = d["old_logp"][7][2] = d["ref_logp"][7][2] - 4.5  # k3 = e^4.5 − 5.5 ≈ 84.5
    write("kl_spike.parquet", d)

    d = base()
    adv = advantages(d["reward"])
    d["logp"] = [o + 0.5 * np.sign(a) for o, a in zip(d["old_logp"], adv, strict=True)]
    d["logp"] = [np.minimum(x, -1e-4) for x in d["logp"]]
    d["ref_logp"] = [x.copy() for x in d["logp"]]
    write("clipped.parquet", d)

    d = base()
    for row, tok in ((0, 0), (9, 4), (17, 1)):
        d["old_logp"][row][tok] = d["logp"][row][tok] - 30.0  # ratio e^30
    write("ratio_overflow.parquet", d)

    d = base()
    d["logp"] = [o + np.random.default_rng(1).normal(0, 1e-3, o.size) for o in d["old_logp"]]
    d["ref_logp"] = [o.copy() for o in d["old_logp"]]
    write("recomputed.parquet", d)

    d = base()
    adv = advantages(d["reward"])
    adv[adv != 0] += 0.5  # not centred (0 left in the zero-variance groups)
    write("bad_advantages.parquet", d, advantage=adv)

    d = base()
    d["rollout_logp"] = [o - 0.5 for o in d["old_logp"]]  # sampler disagrees: k3 = e^½ − 1.5
    write("rollout_mismatch.parquet", d)

    d = base()
    adv = advantages(d["reward"])
    reward = np.asarray(d["reward"])
    for g in range(len(reward) // G):  # the residual of float32 statistics (as in TRL)
        block = slice(g * G, (g + 1) * G)
        if np.ptp(reward[block]) == 0:
            adv[block] = 6e-4
    write("residual_advantages.parquet", d, advantage=adv)


if __name__ == "__main__":
    main()
