"""prime-rl's loss rows against its own compute_loss (conformance/frontier/fixtures/prime_rl.json,
recorded from prime-rl 559b4477 by conformance/frontier/record.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from grpo_cli.losses.prime_rl import dppo_binary_terms

FIXTURE = Path(__file__).parent.parent / "conformance" / "frontier" / "fixtures" / "prime_rl.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_micro_batch_loss_and_metric_is_prime_rl_s(case: dict) -> None:
    cfg = case["loss"]
    kw = (
        {"rule": "tv", "mask_low": cfg["dppo_mask_low"], "mask_high": cfg["dppo_mask_high"]}
        if cfg["type"] == "default"
        else {"rule": "ipo", "ipo_threshold": cfg["ipo_threshold"]}
    )
    for st in case["steps"]:
        for mb in st["micro_batches"]:
            starts = np.cumsum([0, *mb["sequence_lengths"]])
            tl = np.array(mb["trainer_logprobs"])
            total = 0.0
            for j, si in enumerate(mb["samples"]):
                b = st["branches"][si]
                m = np.array(b["loss_mask"])
                lp = tl[starts[j] : starts[j] + m.shape[0]][m]
                t = dppo_binary_terms(
                    lp, np.array(b["inference_logprobs"])[m], np.array(b["advantages"])[m],
                    [0, lp.shape[0]], adv_tau=cfg["adv_tau"], kl_tau=cfg["kl_tau"], **kw,
                )  # fmt: skip
                total -= float(t.term.sum())
                for key, logged in mb["loss_tensors"].items():
                    # one value per packed sequence: the padding lengthens the last one
                    # (pad_micro_batch), it is no sequence of its own
                    assert len(logged) == len(mb["samples"]), key
                    mine = t.values[key][0] if key in t.values else t.flags[key].mean()
                    assert mine == pytest.approx(logged[j], rel=1e-5, abs=1e-6), key
            assert total / st["rl_scale"] == pytest.approx(mb["loss"], rel=1e-5, abs=1e-7)
