"""AReaL 1.0.4's own loss and statistics code run on crafted batches: writes (or, with
``--check``, compares with) ``conformance/areal/fixtures/areal.json``, which
``tests/test_areal.py`` reproduces with grpo-cli in the normal suite.

What runs is AReaL's (the areal 1.0.4 wheel, installed by ``tests/real/areal_env.sh``):
``areal/trainer/ppo/actor.py`` ``grpo_loss_fn`` (which calls
``areal/utils/functional/functional.py`` ``ppo_actor_loss_fn`` or ``sapo_loss_fn``) on
packed micro-batches (1-D tensors with ``cu_seqlens``, as ``FSDPEngine.train_batch`` gives
them), under ``stats_tracker.scope("ppo_actor")`` / ``scope("update")`` as
``PPOActor._ppo_update`` calls it, then ``stats_tracker.export()``: the ``ppo_actor/update/*``
statistics AReaL logs for that update.

    .areal-venv/bin/python conformance/areal/record.py [--check]

Each case is a ``PPOActorConfig`` subset (AReaL's field names) and a batch of answers,
split into micro-batches; the fixture holds, per answer, its tokens' current, proximal
(``prox_logp``) and behaviour (``logprobs``) log-probs, advantages, loss mask and
entropy, its micro-batch, and what AReaL returned: each call's loss and the exported
statistics. The only stand-ins are the experiment trackers ``areal/utils/stats_logger.py``
imports (tests/real/areal_seam.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "areal.json"

SEQ = {"importance_sampling_level": "sequence"}
SAPO = {"use_sapo_loss": True}
# (name, PPOActorConfig fields, answers, micro-batches, seed, scale of the log-ratios)
CASES: list[tuple[str, dict[str, Any], int, int, int, float]] = [
    ("defaults", {"eps_clip": 0.2}, 8, 2, 1, 0.3),
    ("clip_higher_dual", {"eps_clip": 0.2, "eps_clip_higher": 0.28, "c_clip": 3.0}, 8, 2, 2, 1.2),
    ("gspo", {"eps_clip": 3e-4, "eps_clip_higher": 4e-4, **SEQ}, 8, 2, 3, 0.01),
    ("gspo_dual", {"eps_clip": 0.2, "c_clip": 2.0, **SEQ}, 6, 3, 7, 2.0),
    ("sapo", {**SAPO, "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05}, 8, 2, 5, 0.5),
    ("sapo_seq", {**SAPO, "sapo_tau_pos": 2.0, "sapo_tau_neg": 3.0, **SEQ}, 6, 2, 6, 0.5),
]
PROMPT = 2
LOGGED = ("actor_loss", "importance_weight", "approx_kl", "clip_ratio", "dual_clip_ratio",
          "entropy", "new_logp", "old_logp")  # fmt: skip


def _answers(n: int, seed: int, scale: float) -> list[dict[str, Any]]:
    """``n`` answers of 2 prompt tokens and 1–7 answer tokens, float32 values; the loss
    mask is AReaL's after ``compute_advantages``' roll (position t: the prediction of
    token t + 1), 0 over the prompt but its last position; groups of 2 answers share an
    advantage sign pattern with some A = 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = PROMPT + int(rng.integers(1, 8))
        mask = [0] * (PROMPT - 1) + [1] * (length - PROMPT) + [0]
        prox = rng.uniform(-4.0, -0.1, length).astype(np.float32)
        logp = (prox + rng.normal(0.0, scale, length)).astype(np.float32)
        behave = (prox + rng.normal(0.0, 0.05, length)).astype(np.float32)
        adv = [-1.5, 0.0, 0.8, -0.4, 1.2, -2.0, 0.3, -0.9][i % 8]
        out.append({
            "mask": mask,
            "logp": logp.tolist(),
            "prox_logp": prox.tolist(),
            "logprobs": behave.tolist(),
            "advantage": [float(np.float32(adv))] * length,
            "entropy": rng.uniform(0.1, 3.0, length).astype(np.float32).tolist(),
        })  # fmt: skip
    return out


def _stub_trackers() -> None:
    sys.path.insert(0, str(ROOT))
    from tests.real.areal_seam import stub_trackers

    stub_trackers()


def _run_case(config: dict[str, Any], answers: list[dict[str, Any]], mbs: int) -> dict[str, Any]:
    """AReaL's ``grpo_loss_fn`` on each micro-batch (packed), its statistics exported."""
    import torch
    from areal.trainer.ppo.actor import grpo_loss_fn
    from areal.utils import stats_tracker

    stats_tracker.export_all(reset=True)  # nothing of another case
    losses = []
    order = [[i for i in range(len(answers)) if i % mbs == k] for k in range(mbs)]
    with stats_tracker.scope("ppo_actor"), stats_tracker.scope("update"):
        for rows in order:
            cat: dict[str, list[float]] = {}
            for i in rows:
                for key in ("logp", "prox_logp", "logprobs", "advantage", "entropy", "mask"):
                    cat.setdefault(key, []).extend(answers[i][key])
            lengths = [len(answers[i]["mask"]) for i in rows]
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
            data = {
                "logprobs": torch.tensor(cat["logprobs"]),
                "prox_logp": torch.tensor(cat["prox_logp"]),
                "advantages": torch.tensor(cat["advantage"]),
                "loss_mask": torch.tensor(cat["mask"], dtype=torch.int32),
                "cu_seqlens": cu,
            }
            logp = torch.tensor(cat["logp"], requires_grad=True)
            loss = grpo_loss_fn(
                logp, torch.tensor(cat["entropy"]), data,
                eps_clip=config.get("eps_clip", 0.2),
                eps_clip_higher=config.get("eps_clip_higher"),
                c_clip=config.get("c_clip"),
                importance_sampling_level=config.get("importance_sampling_level", "token"),
                use_sapo_loss=config.get("use_sapo_loss", False),
                sapo_tau_pos=config.get("sapo_tau_pos", 1.0),
                sapo_tau_neg=config.get("sapo_tau_neg", 1.05),
            )  # fmt: skip
            losses.append(float(loss.detach()))
    stats = stats_tracker.export_all(reset=True)
    logged = {
        f"ppo_actor/update/{k}/avg": stats[f"ppo_actor/update/{k}/avg"]
        for k in LOGGED
        if f"ppo_actor/update/{k}/avg" in stats
    }
    return {"micro_batches": order, "losses": losses, "logged": logged}


def record() -> dict[str, Any]:
    from importlib.metadata import version

    _stub_trackers()
    cases = []
    for name, config, n, mbs, seed, scale in CASES:
        answers = _answers(n, seed, scale)
        cases.append({"name": name, "config": config, "answers": answers,
                      **_run_case(config, answers, mbs)})  # fmt: skip
    return {
        "trainer": "areal",
        "version": version("areal"),
        "torch": version("torch"),
        "called": [
            "areal/trainer/ppo/actor.py grpo_loss_fn",
            "areal/utils/functional/functional.py ppo_actor_loss_fn, sapo_loss_fn",
            "areal/utils/stats_tracker.py scope, export_all",
        ],
        "stand_ins": ["swanlab", "trackio", "wandb", "tensorboardX (stats_logger.py imports)"],
        "cases": cases,
    }


def _differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items, {len(b)} committed"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in _differences(x, y, f"{where}[{i}]")]  # fmt: skip
    if isinstance(a, float) and isinstance(b, float):
        ok = math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        return [] if ok else [f"{where}: {a!r}, committed {b!r}"]
    return [] if a == b else [f"{where}: {a!r}, committed {b!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the fixture")
    args = parser.parse_args()
    doc = record()
    if args.check:
        committed = json.loads(FIXTURE.read_text())
        diff = _differences({"cases": doc["cases"]}, {"cases": committed["cases"]})
        if diff:
            print("conformance/areal: AReaL's code no longer gives the fixture:", *diff[:20],
                  sep="\n  ", file=sys.stderr)  # fmt: skip
            return 1
        print(f"conformance/areal: {len(doc['cases'])} cases match {FIXTURE.name}")
        return 0
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {FIXTURE} ({len(doc['cases'])} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
