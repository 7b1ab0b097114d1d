"""slime's and prime-rl's own loss, metric and dump code run on crafted batches: writes the
fixtures of ``conformance/frontier/fixtures/`` (see ``LAYOUTS.md`` beside this file).

Neither trainer is on the package index. This script runs their code from a source tree
given on the command line (a checkout, or a git directory whose pinned commit it extracts
with ``git archive``): it downloads nothing, and no code of theirs is committed here.

    python conformance/frontier/record.py --slime SRC --prime-rl SRC [--out DIR]

Environment: Python 3.11+, ``torch==2.13.0`` (CPU), numpy, and for prime-rl's own modules
``beartype jaxtyping pydantic prime-pydantic-config orjson``. What is stood in for (a
module their files import but that does not install on CPU, or that is never called
here) is listed in ``STAND_INS`` and in the fixtures' ``stand_ins``; what is reproduced
from their code rather than called is listed in each fixture's ``reproduced``.

Outputs (``--out``, default ``conformance/frontier/fixtures``):

- ``slime.json``: per case (a set of slime arguments), the batch (tokens, masks, rewards,
  groups, the DP/micro-batch schedule, per-token log-probs as slime's own
  ``get_log_probs_and_entropy`` computed them from the crafted logits), and what slime
  computed: each micro-batch's ``loss_function`` output (the scaled loss and its log
  dict) and each step's logged ``train/*`` metrics (``reduce_train_step_metrics``).
- ``slime_dump/`` and ``slime_dump_tis/``: ``--dump-details`` directories written by
  slime's own writers (``save_debug_rollout_data``, ``_build_dump_payload`` +
  ``torch.save``), two rollouts each; the second with ``args.json`` (non-default
  arguments), the first on slime's argparse defaults.
- ``prime_rl.json``: per case (a loss config), per step and rank and micro-batch the
  micro-batch tensors, prime-rl's ``compute_loss`` output (loss and per-sample metrics)
  and the step's logged tensor statistics.
- ``prime_rl_run/``: an output directory as prime-rl writes it: ``metrics.jsonl``
  (``FileMonitor.log_metrics``), ``token_exports/step_N/rank_R.jsonl`` + ``STABLE``
  (``TokenExporter``), ``rollouts/step_N/train/effective/traces.jsonl`` (reproduced).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "releases"))
from _common import StandIns  # noqa: E402

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
PRIME_RL_COMMIT = "559b44772e471d1538537b8805cc77f3824a5e64"
STAND_INS = {
    "slime": {
        "megatron.core.mpu": "a module of constants: one context-parallel and tensor-parallel "
        "rank, the last pipeline stage, the case's data-parallel size",
        "ray, sglang, wandb, transformers, ...": "conformance/releases/_common.py StandIns: "
        "imported by slime's files, never called here (ray.put / ray.get replaced by "
        "the identity where the data path calls them)",
        "slime/backends/megatron_utils/__init__.py": "skipped (imports Megatron patches, deep_ep)",
        "torch.distributed.all_reduce in train_metric_utils": "sums the ranks' per-step "
        "vectors (the single process holds every rank)",
    },
    "prime-rl": {
        "wandb, torchtitan, transformers, ...": "StandIns, imported and never called",
    },
}


# ---------------------------------------------------------------------------------------
# sources


def source(path: Path, commit: str, paths: list[str], tmp: Path) -> tuple[Path, str]:
    """A source tree of ``path`` (a checkout, or a git directory: its ``commit`` extracted
    with ``git archive``) and the commit it is at."""
    if (path / "objects").is_dir() and (path / "HEAD").is_file():  # a git directory
        out = tmp / path.parent.name
        out.mkdir(parents=True, exist_ok=True)
        tar = subprocess.run(
            ["git", "--git-dir", str(path), "archive", commit, *paths],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
        return out, commit
    head = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    at = head.stdout.strip() if head.returncode == 0 else "unknown"
    if at != commit:
        print(f"warning: {path} is at {at}, not the pinned {commit}", file=sys.stderr)
    return path, at


def load_slime(root: Path, dp: int) -> types.SimpleNamespace:
    mpu = types.ModuleType("megatron.core.mpu")
    consts = {
        "get_context_parallel_world_size": 1,
        "get_context_parallel_rank": 0,
        "get_tensor_model_parallel_rank": 0,
        "get_tensor_model_parallel_group": None,
        "get_context_parallel_group": None,
        "get_virtual_pipeline_model_parallel_world_size": None,
        "is_pipeline_last_stage": True,
    }
    for name, value in consts.items():
        setattr(mpu, name, (lambda v: lambda *a, **k: v)(value))
    mpu.get_data_parallel_world_size = lambda *a, **k: DP[0]  # type: ignore[attr-defined]
    core = types.ModuleType("megatron.core")
    core.mpu = mpu  # type: ignore[attr-defined]
    core.__path__ = []
    meg = types.ModuleType("megatron")
    meg.core = core  # type: ignore[attr-defined]
    meg.__path__ = []
    sys.modules.update({"megatron": meg, "megatron.core": core, "megatron.core.mpu": mpu})
    sys.path.insert(0, str(root))
    import slime.backends

    pkg = types.ModuleType("slime.backends.megatron_utils")
    pkg.__path__ = [str(root / "slime/backends/megatron_utils")]
    sys.modules["slime.backends.megatron_utils"] = pkg
    slime.backends.megatron_utils = pkg  # type: ignore[attr-defined]
    sys.meta_path.append(StandIns("slime"))
    import slime.backends.megatron_utils.cp_utils as cp
    import slime.backends.megatron_utils.data as bdata
    import slime.backends.megatron_utils.loss as loss
    import slime.observability.rollout_data_utils as rdu
    import slime.observability.train_data_utils as tdu
    import slime.observability.train_metric_utils as tmu
    import slime.ray.rollout as rollout
    import slime.utils.arguments as arguments
    import slime.utils.data as udata
    import slime.utils.types as stypes

    rollout.ray = types.SimpleNamespace(put=lambda x, **k: x)  # the Ray object store: identity
    udata.ray = types.SimpleNamespace(get=lambda x: x)
    return types.SimpleNamespace(
        loss=loss,
        cp=cp,
        bdata=bdata,
        rdu=rdu,
        tdu=tdu,
        tmu=tmu,
        rollout=rollout,
        udata=udata,
        types=stypes,
        arguments=arguments,
    )


DP = [2]


# ---------------------------------------------------------------------------------------
# slime's arguments: their argparse defaults, read from slime/utils/arguments.py (ast)

LOSS_ARGS = (
    "eps_clip eps_clip_high eps_clip_c kl_coef loss_type kl_loss_type advantage_estimator "
    "use_kl_loss kl_loss_coef use_unbiased_kl entropy_coef gamma lambd normalize_advantages "
    "grpo_std_normalization rewards_normalization use_rollout_entropy get_mismatch_metrics "
    "use_rollout_logprobs use_tis tis_clip tis_clip_low custom_tis_function_path "
    "custom_pg_loss_reducer_function_path use_opsm opsm_delta calculate_per_token_loss "
    "n_samples_per_prompt global_batch_size micro_batch_size rollout_temperature "
    "use_dynamic_batch_size"
).split()


def slime_defaults(root: Path) -> dict[str, Any]:
    """Each ``add_argument`` / ``reset_arg`` of ``slime/utils/arguments.py``: its dest and
    default (store_true: False, store_false: True), by ast (no parser is built: the file
    imports Megatron's)."""
    tree = ast.parse((root / "slime/utils/arguments.py").read_text())
    out: dict[str, Any] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        args = node.args[1:] if name == "reset_arg" else node.args
        if name not in ("add_argument", "reset_arg") or not args:
            continue
        if not isinstance(args[0], ast.Constant) or not str(args[0].value).startswith("--"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        dest = str(args[0].value)[2:].replace("-", "_")
        if "dest" in kw and isinstance(kw["dest"], ast.Constant):
            dest = kw["dest"].value
        action = kw.get("action")
        act = action.value if isinstance(action, ast.Constant) else None
        if "default" in kw:
            try:
                out[dest] = ast.literal_eval(kw["default"])
            except ValueError:
                out[dest] = ast.unparse(kw["default"])
        elif act == "store_true":
            out[dest] = False
        elif act == "store_false":
            out[dest] = True
        else:
            out.setdefault(dest, None)
    return out


# ---------------------------------------------------------------------------------------
# the crafted batch


def crafted(seed: int, groups: int, per_group: int, vocab: int) -> dict[str, Any]:
    """Groups of answers: ragged prompt and response lengths, masks with a zeroed span (a
    tool's tokens), graded rewards (a group of equal rewards), logits of the rollout
    policy; the old policy's logits a small perturbation of them, the reference's a
    larger one; some answers' old log-probs moved far (ratios beyond every clip)."""
    rng = np.random.default_rng(seed)
    n = groups * per_group
    prompt = rng.integers(2, 6, size=n)
    response = rng.integers(1, 10, size=n)
    response[0], response[1] = 1, 12
    rewards = rng.choice([0.0, 0.25, 1.0], size=n)
    rewards[per_group : 2 * per_group] = 1.0  # a group whose rewards are all equal
    samples = []
    for i in range(n):
        total = int(prompt[i] + response[i])
        tokens = rng.integers(0, vocab, size=total)
        mask = np.ones(int(response[i]), dtype=np.int64)
        if response[i] >= 6 and i % 3 == 0:
            mask[2:4] = 0  # an observation inside the response
        base = rng.normal(0, 1.5, size=(total, vocab))
        old = base + rng.normal(0, 0.05, size=(total, vocab))
        if i % 5 == 2:
            old += rng.normal(0, 2.0, size=(total, vocab))  # far: every ratio bound crossed
        new = base + rng.normal(0, 0.3, size=(total, vocab))
        ref = base + rng.normal(0, 0.5, size=(total, vocab))
        samples.append(
            {
                "index": i,
                "group_index": i // per_group,
                "tokens": tokens.tolist(),
                "response_length": int(response[i]),
                "loss_mask": mask.tolist(),
                "reward": float(rewards[i]),
                "truncated": bool(i % 7 == 6),
                "logits_rollout": base,
                "logits_old": old,
                "logits_new": new,
                "logits_ref": ref,
            }
        )
    return {"samples": samples, "vocab": vocab}


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    return torch.tensor(x, dtype=torch.float32).to(torch.bfloat16).float().numpy()


# ---------------------------------------------------------------------------------------
# slime


def slime_case(
    S: types.SimpleNamespace,
    defaults: dict[str, Any],
    name: str,
    over: dict[str, Any],
    batch: dict[str, Any],
    *,
    step0_is_old: bool,
    dump: Path | None = None,
    rollout_id: int = 0,
    bf16: bool = False,
) -> dict[str, Any]:
    """One rollout through slime's data path, loss and metric reductions."""
    args = types.SimpleNamespace(**defaults)
    args.n_samples_per_prompt = 4
    args.rollout_batch_size = len(batch["samples"]) // 4
    args.global_batch_size = len(batch["samples"]) // 2  # two optimizer steps per rollout
    args.micro_batch_size = 2
    args.use_dynamic_batch_size = False
    args.balance_data = False
    args.balance_by_flops = False
    args.log_probs_chunk_size = -1
    args.allgather_cp = False
    args.rollout_top_p = 1.0
    args.reward_key = None
    args.rollout_data_transport = "object-store"
    args.use_critic = False
    args.keep_old_actor = False
    args.use_opd = False
    args.use_routing_replay = False
    args.use_rollout_routing_replay = False
    args.recompute_loss_function = False
    args.save_debug_train_data = None
    for k, v in over.items():
        setattr(args, k, v)
    if args.eps_clip_high is None:  # slime_validate_args
        args.eps_clip_high = args.eps_clip
    dp = DP[0]
    batch["vocab"]

    def logits_of(kind: str, i: int) -> torch.Tensor:
        x = batch["samples"][i][f"logits_{kind}"]
        return torch.tensor(bf16_rounded(x) if bf16 else x, dtype=torch.float32)

    # the rollout side: Sample objects, the rollout dump, the train data, the DP split
    Sample = S.types.Sample
    samples = []
    for s in batch["samples"]:
        lp = torch.log_softmax(logits_of("rollout", s["index"]), -1)
        toks = torch.tensor(s["tokens"])
        resp = s["response_length"]
        total = len(s["tokens"])
        rollout_lp = lp[total - resp - 1 : total - 1].gather(1, toks[total - resp :, None])[:, 0]
        rollout_lp = rollout_lp.clone()
        if s["index"] % 4 == 1:  # a sampler off by more than TIS's bounds on some tokens
            rollout_lp[::2] -= 1.2
            rollout_lp[1::2] += 0.9
        samples.append(
            Sample(
                group_index=s["group_index"],
                index=s["index"],
                prompt=f"prompt {s['group_index']}",
                tokens=list(s["tokens"]),
                response=f"response {s['index']}",
                response_length=resp,
                reward=s["reward"],
                loss_mask=list(s["loss_mask"]),
                rollout_log_probs=[float(v) for v in rollout_lp],
                status=Sample.Status.TRUNCATED if s["truncated"] else Sample.Status.COMPLETED,
            )
        )
    if dump is not None:
        S.rdu.save_debug_rollout_data(
            str(dump / "rollout_data" / "{rollout_id}.pt"),
            samples,
            rollout_id=rollout_id,
            evaluation=False,
        )
    RM = S.rollout.RolloutManager
    Fake = type(
        "RolloutManagerData",
        (),
        {
            m: getattr(RM, m)
            for m in (
                "_post_process_rewards",
                "_convert_samples_to_train_data",
                "_split_train_data_by_dp",
            )
        },
    )
    fake = Fake()
    fake.__dict__.update(
        args=args,
        custom_reward_post_process_func=None,
        custom_convert_samples_to_train_data_func=None,
        train_parallel_config={
            "dp_size": dp,
            "cp_size": 1,
            "vpp_size": 1,
            "microbatch_group_size_per_vp_stage": 1,
        },
    )
    data = fake._convert_samples_to_train_data(samples)
    refs = fake._split_train_data_by_dp(data)

    ranks = []
    for r in range(dp):
        rd = S.udata.process_rollout_data(args, refs, r, dp)
        # MegatronTrainRayActor._get_rollout_data (actor.py:258-299), on CPU
        rd["tokens"] = [t.to(dtype=torch.long) for t in rd["tokens"]]
        rd["loss_masks"] = [t.to(dtype=torch.int) for t in rd["loss_masks"]]
        rd["rollout_mask_sums"] = rd["rollout_mask_sums"].to(dtype=torch.float32)
        rd["rollout_log_probs"] = [
            S.cp.slice_log_prob_with_cp(lp, tl, rl).to(dtype=torch.float32)
            for lp, tl, rl in zip(
                rd["rollout_log_probs"], rd["total_lengths"], rd["response_lengths"], strict=False
            )
        ]
        ranks.append(rd)

    def forward(rd: dict[str, Any], kind: str, with_entropy: bool) -> dict[str, list[Any]]:
        """forward_only (model.py:348-509): each micro-batch's packed logits through
        slime's get_log_probs_and_entropy, gathered in schedule order."""
        it = S.bdata.DataIterator(rd, rd["micro_batch_indices"])
        out: dict[str, list[Any]] = {}
        for _ in range(sum(rd["num_microbatches"])):
            mb = it.get_next(["tokens", "total_lengths", "response_lengths", "partition"])
            logits = torch.cat([logits_of(kind, p) for p in mb["partition"]])[None]
            _, res = S.loss.get_log_probs_and_entropy(
                logits,
                args=args,
                unconcat_tokens=mb["tokens"],
                total_lengths=mb["total_lengths"],
                response_lengths=mb["response_lengths"],
                with_entropy=with_entropy,
            )
            for k, v in res.items():
                out.setdefault(k, []).extend(v)
        return out

    for rd in ranks:  # train_actor (actor.py:434-503)
        if args.use_kl_loss or args.kl_coef != 0:
            rd.update(
                {f"ref_{k}": v for k, v in forward(rd, "ref", args.use_rollout_entropy).items()}
            )
        if not args.use_rollout_logprobs or args.get_mismatch_metrics:
            rd.update(forward(rd, "old", args.use_rollout_entropy))
        S.loss.compute_advantages_and_returns(args, rd)

    # training: each step's micro-batches on each rank through loss_function
    keys = [
        "tokens",
        "total_lengths",
        "response_lengths",
        "loss_masks",
        "log_probs",
        "ref_log_probs",
        "advantages",
        "returns",
        "rollout_log_probs",
        "rollout_mask_sums",
        "partition",
    ]
    steps = []
    its = [S.bdata.DataIterator(rd, rd["micro_batch_indices"]) for rd in ranks]
    num_mbs, gbs = ranks[0]["num_microbatches"], ranks[0]["global_batch_sizes"]
    current: dict[int, dict[str, list[float]]] = {}
    for step, (k_mbs, step_gbs) in enumerate(zip(num_mbs, gbs, strict=True)):
        kind = "old" if (step == 0 and step0_is_old) else "new"
        per_rank: list[list[dict[str, Any]]] = []
        mbs_out = []
        for r, it in enumerate(its):
            rank_logs = []
            for m in range(k_mbs):
                mb = it.get_next(keys)
                mb["unconcat_tokens"] = mb["tokens"]
                logits = torch.cat([logits_of(kind, p) for p in mb["partition"]])[None]
                logits.requires_grad_(True)
                scaled, _norm, log = S.loss.loss_function(args, mb, k_mbs, step_gbs, logits)
                _, res = S.loss.get_log_probs_and_entropy(
                    logits.detach(),
                    args=args,
                    unconcat_tokens=mb["tokens"],
                    total_lengths=mb["total_lengths"],
                    response_lengths=mb["response_lengths"],
                    with_entropy=True,
                )
                for p, lp, ent in zip(
                    mb["partition"], res["log_probs"], res["entropy"], strict=True
                ):
                    current[p] = {"logp": lp.tolist(), "entropy": ent.tolist()}
                rank_logs.append(log)
                mbs_out.append(
                    {
                        "rank": r,
                        "micro_batch": m,
                        "positions": list(mb["partition"]),
                        "scaled_loss": float(scaled.detach()),
                        "log": dict(zip(log["keys"], log["values"][1:].tolist(), strict=True)),
                    }
                )
            per_rank.append(rank_logs)
        totals = []
        for rank_logs in per_rank:  # reduce_train_step_metrics' own local sum, per rank
            v = None
            for item in rank_logs:
                v = item["values"] if v is None else v + item["values"]
            totals.append(v)
        everything = torch.stack(totals).sum(0)
        S.tmu.dist = types.SimpleNamespace(
            all_reduce=lambda t, group=None, total=everything: t.copy_(total)
        )
        reduced = S.tmu.reduce_train_step_metrics(
            per_rank[0],
            calculate_per_token_loss=args.calculate_per_token_loss,
            step_global_batch_size=step_gbs,
            cp_size=1,
            dp_with_cp_group=None,
        )
        logged = {f"train/{k}": float(v) for k, v in reduced.items()}  # model.py:882-885
        steps.append(
            {
                "step": step,
                "policy": kind,
                "global_batch_size": step_gbs,
                "num_microbatches": k_mbs,
                "micro_batches": mbs_out,
                "logged": logged,
            }
        )

    if dump is not None:  # save_debug_train_data (train_data_utils.py:191-242) on CPU
        shards = []
        for r, rd in enumerate(ranks):
            restored = S.tdu.restore_context_parallel_fields_to_cpu(
                rd, lambda t, total, resp: t, keep_restored=True
            )
            shards.append({"rank": r, "data_parallel_rank": r, "rollout_data": restored})
        payload = S.tdu._build_dump_payload(shards, rollout_id=rollout_id, writer_rank=0)
        path = dump / "train_data" / f"{rollout_id}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(payload, path)

    by_pos = {}
    for rd in ranks:
        for j, p in enumerate(rd["partition"]):
            by_pos[p] = {
                "old_logp": rd["log_probs"][j].tolist() if "log_probs" in rd else None,
                "ref_logp": rd["ref_log_probs"][j].tolist() if "ref_log_probs" in rd else None,
                "rollout_logp": rd["rollout_log_probs"][j].tolist(),
                "advantages": rd["advantages"][j].tolist(),
                "loss_mask": rd["loss_masks"][j].tolist(),
                "rollout_mask_sum": float(rd["rollout_mask_sums"][j]),
                "reward": float(rd["rewards"][j]),
            }
    rows = []
    for s in batch["samples"]:
        p = s["index"]
        rows.append(
            {
                "position": p,
                "index": p,
                "group_index": s["group_index"],
                "raw_reward": s["reward"],
                "response_length": s["response_length"],
                **by_pos[p],
                "logp_by_step": None,
            }
        )
    return {
        "name": name,
        "args": {k: getattr(args, k) for k in LOSS_ARGS if hasattr(args, k)},
        "overrides": over,
        "bf16_logits": bf16,
        "dp_size": dp,
        "schedule": {
            "partitions": [rd["partition"] for rd in ranks],
            "micro_batch_indices": [rd["micro_batch_indices"] for rd in ranks],
            "num_microbatches": num_mbs,
            "global_batch_sizes": gbs,
        },
        "samples": rows,
        "current": {str(p): v for p, v in sorted(current.items())},
        "steps": steps,
    }


SLIME_CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("defaults", {}, False),
    (
        "clip_higher_dual_clip_kl",
        {
            "eps_clip_high": 0.28,
            "eps_clip_c": 3.0,
            "use_kl_loss": True,
            "kl_loss_type": "low_var_kl",
            "kl_loss_coef": 0.01,
            "entropy_coef": 0.001,
        },
        False,
    ),
    ("tis", {"use_tis": True, "tis_clip": 2.0, "tis_clip_low": 0.0}, False),
    (
        "icepop",
        {
            "use_tis": True,
            "tis_clip": 2.0,
            "tis_clip_low": 0.5,
            "custom_tis_function_path": "slime.backends.megatron_utils.loss.icepop_function",
        },
        False,
    ),
    ("cispo", {"advantage_estimator": "cispo", "eps_clip": 1.0, "eps_clip_high": 0.28}, False),
    ("gspo", {"advantage_estimator": "gspo", "eps_clip": 3e-4, "eps_clip_high": 4e-4}, False),
    ("opsm", {"use_opsm": True, "opsm_delta": 1e-4}, False),
    (
        "unbiased_kl_k3",
        {"use_kl_loss": True, "kl_loss_type": "k3", "kl_loss_coef": 0.05, "use_unbiased_kl": True},
        False,
    ),
    (
        "per_token_loss_k2",
        {
            "calculate_per_token_loss": True,
            "use_kl_loss": True,
            "kl_loss_type": "k2",
            "kl_loss_coef": 0.02,
        },
        False,
    ),
    ("rollout_logprobs", {"use_rollout_logprobs": True}, False),
    (
        "dr_grpo_no_std",
        {"grpo_std_normalization": False},
        False,
    ),
]


# ---------------------------------------------------------------------------------------
# prime-rl


def load_prime(root: Path) -> types.SimpleNamespace:
    sys.path[:0] = [str(root / "packages/prime-rl-configs/src"), str(root / "src")]
    sys.meta_path.append(StandIns("prime_rl"))
    import prime_rl.configs.trainer as config
    import prime_rl.monitors.file as monitor_file
    import prime_rl.trainer.rl.loss as loss
    import prime_rl.trainer.rl.token_export as export
    import prime_rl.trainer.utils as tutils

    return types.SimpleNamespace(
        config=config, loss=loss, export=export, monitor_file=monitor_file, tutils=tutils
    )


def prime_stats(values: list[torch.Tensor]) -> dict[str, float]:
    """``Tensors.compute_stats`` (trainer/utils.py:245-281) on one process holding every
    rank: the ranks' tensors concatenated in rank order (flexible_all_gather)."""
    t = torch.cat(values) if values else torch.empty(0)
    if t.numel() == 0:
        return {s: float("nan") for s in ("mean", "median", "std", "min", "max")}
    return {
        "mean": t.mean().item(),
        "median": torch.median(t).item(),
        "std": t.std().item(),
        "min": t.min().item(),
        "max": t.max().item(),
    }


def prime_case(
    P: types.SimpleNamespace,
    name: str,
    loss_config: Any,
    batch: dict[str, Any],
    *,
    ranks: int = 2,
    steps: int = 2,
    out_dir: Path | None = None,
    bf16: bool = False,
) -> dict[str, Any]:
    vocab = batch["vocab"]
    samples = batch["samples"]
    per_group = 4
    rl_fn = P.loss.setup_rl_loss_fn(loss_config)
    record_steps = []
    exporters = (
        [P.export.TokenExporter(out_dir, rank) for rank in range(ranks)] if out_dir else None
    )
    for step in range(1, steps + 1):
        # the step's samples: a branch per sample (prompt unsampled, then completion; a
        # tool observation inside the completion is unsampled too), advantages reward − group
        # mean (orchestrator/algo/grpo.py:27-30), spread onto the sampled tokens
        rewards = torch.tensor([s["reward"] for s in samples], dtype=torch.float32)
        if step == 2:
            rewards = torch.flip(rewards, [0])
        adv = rewards.view(-1, per_group) - rewards.view(-1, per_group).mean(1, keepdim=True)
        adv = adv.flatten()
        branches = []
        for s, a, rw in zip(samples, adv.tolist(), rewards.tolist(), strict=True):
            total, resp = len(s["tokens"]), s["response_length"]
            mask = [False] * (total - resp) + [bool(m) for m in s["loss_mask"]]
            x = s["logits_rollout"] if step == 1 else s["logits_ref"]
            lp = torch.log_softmax(torch.tensor(x, dtype=torch.float32), -1)
            tok = torch.tensor(s["tokens"])
            # inference log-prob of token t from the logits at t−1 (position 0: none)
            inf = [0.0, *lp[:-1].gather(1, tok[1:, None])[:, 0].tolist()]
            if s["index"] % 4 == 1:
                inf = [v - 0.8 if k % 2 else v + 0.6 for k, v in enumerate(inf)]
            inf = [v if m else 0.0 for v, m in zip(inf, mask, strict=True)]
            branches.append(
                {
                    "index": s["index"],
                    "group": s["group_index"],
                    "reward": rw,
                    "token_ids": list(s["tokens"]),
                    "loss_mask": mask,
                    "inference_logprobs": inf,
                    "advantages": [a if m else 0.0 for m in mask],
                    "prompt_len": total - resp,
                    "truncated": s["truncated"],
                }
            )
        # packing: each rank two micro-batches of consecutive samples, padded to seq_len
        # as prime-rl's pad_micro_batch pads (trainer/batch.py:692-736): pad token 1,
        # position ids restarting at 0, env "", and the padding added to the *last*
        # sequence's length (no sequence of its own, so no per-sample metric of its own)
        per_rank = len(branches) // ranks
        seq_len = 64
        rank_mbs: list[list[dict[str, Any]]] = []
        for r in range(ranks):
            mine = branches[r * per_rank : (r + 1) * per_rank]
            half = len(mine) // 2
            mbs = []
            for part in (mine[:half], mine[half:]):
                lens = [len(b["token_ids"]) for b in part]
                pad = seq_len - sum(lens)
                ids = [t for b in part for t in b["token_ids"]] + [1] * pad
                mbs.append(
                    {
                        "branches": part,
                        "input_ids": torch.tensor([ids]),
                        "position_ids": torch.tensor(
                            [[i for n in lens for i in range(n)] + list(range(pad))]
                        ),
                        "loss_mask": torch.tensor(
                            [[m for b in part for m in b["loss_mask"]] + [False] * pad]
                        ),
                        "advantages": torch.tensor(
                            [[v for b in part for v in b["advantages"]] + [0.0] * pad]
                        ),
                        "inference_logprobs": torch.tensor(
                            [[v for b in part for v in b["inference_logprobs"]] + [0.0] * pad]
                        ),
                        "temperatures": torch.ones(1, seq_len),
                        "env_names": [f"env{b['group'] % 2}" for b in part for _ in b["token_ids"]]
                        + [""] * pad,
                        "sequence_lengths": [*lens[:-1], lens[-1] + pad],
                        "pad": pad,
                        "rl_weights": None,
                        "ce_weights": None,
                        "ref_kl_weights": None,
                        "ref_logprobs": None,
                    }
                )
            rank_mbs.append(mbs)
        rl_scale = max(sum(int(mb["loss_mask"].sum()) for mbs in rank_mbs for mb in mbs), 1)
        tensors: dict[str, list[torch.Tensor]] = {}
        mb_records = []
        for r, mbs in enumerate(rank_mbs):
            for micro_step, mb in enumerate(mbs):
                rows = []
                for b in mb["branches"]:
                    s = samples[b["index"]]
                    x = s["logits_new"] if step == 1 else s["logits_old"]
                    if b["index"] % 4 == 1:  # a trainer far from the sampler: DPPO's masks bite
                        x = 4.0 * x
                    rows.append(torch.tensor(bf16_rounded(x) if bf16 else x, dtype=torch.float32))
                pad = mb["pad"]
                logits = torch.cat([*rows, torch.zeros(pad, vocab)])[None]
                labels = P.loss.shift_tensor_left(mb["input_ids"])
                scaled = logits / mb["temperatures"].unsqueeze(-1)
                out = {
                    "logprobs": P.loss.selective_log_softmax(scaled, labels),
                    "entropy": P.loss.compute_entropy(scaled),
                }
                out["logprobs"] = P.loss.shift_tensor_right(
                    out["logprobs"], pad_value=torch.log(torch.tensor(1.0 / vocab)).item()
                )
                out["entropy"] = P.loss.shift_tensor_right(
                    out["entropy"], pad_value=torch.log(torch.tensor(float(vocab))).item()
                )
                lens = mb["sequence_lengths"]
                loss_mask = mb["loss_mask"]
                loss, loss_tensors = P.loss.compute_loss(
                    trainer_logprobs=out["logprobs"].squeeze().split(lens),
                    inference_logprobs=mb["inference_logprobs"].squeeze().split(lens),
                    ref_logprobs=None,
                    advantages=mb["advantages"].squeeze().split(lens),
                    loss_mask=loss_mask.squeeze().split(lens),
                    rl_weights=None,
                    ce_weights=None,
                    ref_kl_weights=None,
                    rl_loss_fn=rl_fn,
                    rl_scale=rl_scale,
                    ce_scale=1,
                    ref_kl_scale=1,
                )
                # train.py:483-539: what the step's statistics are made of
                ent = out["entropy"][loss_mask].detach()
                tensors.setdefault("entropy/all", []).append(ent)
                tensors.setdefault("loss", []).append(loss.detach().unsqueeze(0))
                names = [
                    e
                    for e, k in zip(mb["env_names"], loss_mask.flatten().tolist(), strict=True)
                    if k
                ]
                for env in sorted(set(names), key=names.index):
                    idx = [i for i, e in enumerate(names) if e == env]
                    tensors.setdefault(f"entropy/{env}", []).append(ent[idx])
                _, _, mkl = P.loss.compute_importance_ratio_and_mismatch_kl(
                    out["logprobs"], mb["inference_logprobs"]
                )
                mkl = mkl[loss_mask].detach()
                tensors.setdefault("mismatch_kl/all", []).append(mkl)
                for env in sorted(set(names), key=names.index):
                    idx = [i for i, e in enumerate(names) if e == env]
                    tensors.setdefault(f"mismatch_kl/{env}", []).append(mkl[idx])
                if exporters is not None:
                    exporters[r].export(step, micro_step, mb, out, lens, loss_config)
                for k, v in loss_tensors.items():
                    tensors.setdefault(k, []).append(v.detach())
                mb_records.append(
                    {
                        "rank": r,
                        "micro_step": micro_step,
                        "samples": [b["index"] for b in mb["branches"]],
                        "sequence_lengths": lens,
                        "trainer_logprobs": out["logprobs"].squeeze().tolist(),
                        "entropy": out["entropy"].squeeze().tolist(),
                        "loss": float(loss),
                        "loss_tensors": {k: v.tolist() for k, v in loss_tensors.items()},
                    }
                )
        if exporters is not None:
            for e in exporters:
                e.mark_stable()
        # the ranks' tensors in rank order: tensors were appended rank by rank above
        stats: dict[str, float] = {}
        for key in sorted(tensors):
            for s_name, v in prime_stats(tensors[key]).items():
                stats[f"{key}/{s_name}"] = v
        ent_mean = stats.get("entropy/all/mean", 0.0)
        mk = stats.get("mismatch_kl/all/mean")
        if mk is not None and ent_mean > 0:
            stats["kl_ent_ratio/mean"] = mk / ent_mean
        stats["step"] = step
        logged = P.tutils.filter_rl_trainer_tensor_stats_for_wandb(stats)
        if out_dir is not None:
            mon = object.__new__(P.monitor_file.FileMonitor)
            mon.logger = types.SimpleNamespace(warning=lambda *a, **k: None)
            with (out_dir / "metrics.jsonl").open("a", buffering=1) as f:
                mon.file = f
                asyncio.run(mon.log_metrics(logged, step=step))
            write_traces(out_dir, step, branches)
        record_steps.append(
            {
                "step": step,
                "rl_scale": rl_scale,
                "branches": branches,
                "micro_batches": mb_records,
                "logged": {
                    k: (None if isinstance(v, float) and math.isnan(v) else v)
                    for k, v in logged.items()
                },
            }
        )
    cfg = loss_config.model_dump() if hasattr(loss_config, "model_dump") else dict(loss_config)
    return {"name": name, "loss": cfg, "bf16_logits": bf16, "ranks": ranks, "steps": record_steps}


def write_traces(out_dir: Path, step: int, branches: list[dict[str, Any]]) -> None:
    """``rollouts/step_N/train/effective/traces.jsonl`` as FileMonitor.log_episodes writes it
    (monitors/file.py:43-59: one ``Episode.to_record()`` per line): REPRODUCED, the
    verifiers models (verifiers/v1/episode.py:149-155, trace.py:363-409, graph.py:64-131 at
    verifiers a60a606e) are not imported. Only the fields a reader needs are filled: per
    trace its nodes (parent, message, sampled, token_ids, mask, logprobs, advantages) and
    rewards; a branch = the nodes from a leaf back to its root."""
    path = out_dir / "rollouts" / f"step_{step}" / "train" / "effective" / "traces.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    by_group: dict[int, list[dict[str, Any]]] = {}
    for b in branches:
        by_group.setdefault(b["group"], []).append(b)
    with path.open("a") as f:
        for g, members in by_group.items():
            for b in members:
                pl = b["prompt_len"]
                ids, mask, inf = b["token_ids"], b["loss_mask"], b["inference_logprobs"]
                nodes = [
                    {
                        "parent": None,
                        "message": {"role": "user", "content": f"prompt {g}"},
                        "sampled": False,
                        "token_ids": ids[:pl],
                        "mask": mask[:pl],
                        "logprobs": [],
                    },
                    {
                        "parent": 0,
                        "message": {"role": "assistant", "content": f"answer {b['index']}"},
                        "sampled": True,
                        "token_ids": ids[pl:],
                        "mask": mask[pl:],
                        "logprobs": [v for v, m in zip(inf[pl:], mask[pl:], strict=True) if m],
                        "advantages": [
                            v for v, m in zip(b["advantages"][pl:], mask[pl:], strict=True) if m
                        ],
                    },
                ]
                record = {
                    "id": f"ep{step}-{b['index']}",
                    "env": {"id": f"env{g % 2}", "name": f"env{g % 2}"},
                    "task": {"type": "Task", "data": {"prompt": f"prompt {g}"}},
                    "group": {"id": f"g{step}-{g}"},
                    "run": {"type": "train", "id": "run", "work": {"type": "train", "step": step}},
                    "ok": True,
                    "errors": [],
                    "traces": [
                        {
                            "version": 1,
                            "id": f"tr{step}-{b['index']}",
                            "nodes": nodes,
                            "calls": [
                                {"node": 1, "finish_reason": "length" if b["truncated"] else "stop"}
                            ],
                            "rewards": {"score": {"score": b["reward"], "weight": 1.0}},
                            "metrics": {},
                            "is_completed": True,
                            "ok": True,
                        }
                    ],
                }
                f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------------------------------


def finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slime", type=Path, required=True)
    parser.add_argument("--prime-rl", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=HERE / "fixtures")
    opts = parser.parse_args()
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        sroot, scommit = source(opts.slime, SLIME_COMMIT, ["slime"], Path(tmp) / "s")
        proot, pcommit = source(
            opts.prime_rl, PRIME_RL_COMMIT, ["src", "packages"], Path(tmp) / "p"
        )
        S = load_slime(sroot, 2)
        defaults = slime_defaults(sroot)
        batch = crafted(28, 4, 4, 11)
        cases = [
            slime_case(S, defaults, name, over, batch, step0_is_old=old)
            for name, over, old in SLIME_CASES
        ]
        cases.append(
            slime_case(
                S, defaults, "bf16_logits", {"use_tis": True}, batch, step0_is_old=False, bf16=True
            )
        )
        dumps = []
        for dname, over in (
            ("slime_dump", {}),
            (
                "slime_dump_tis",
                SLIME_CASES[2][1]
                | {"use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.01},
            ),
        ):
            d = out / dname
            for rid in (0, 1):
                b = crafted(100 + rid, 4, 4, 11)
                dumps.append(
                    slime_case(
                        S,
                        defaults,
                        f"{dname}/{rid}",
                        over,
                        b,
                        step0_is_old=True,
                        dump=d,
                        rollout_id=rid,
                    )
                )
            if over:
                (d / "args.json").write_text(
                    json.dumps({k: v for k, v in dumps[-1]["args"].items()}, indent=1) + "\n"
                )
        doc = {
            "trainer": "slime",
            "commit": scommit,
            "torch": torch.__version__,
            "stand_ins": STAND_INS["slime"],
            "reproduced": {
                "actor._get_rollout_data (actor.py:258-299)": "dtype casts only, on CPU",
                "forward_only (model.py:348-509)": "the schedule's micro-batches in order",
                "save_debug_train_data (train_data_utils.py:191-242)": "CP gather = identity, "
                "one process holds every DP shard; _build_dump_payload and torch.save are slime's",
            },
            "argparse_defaults": {k: defaults.get(k) for k in LOSS_ARGS},
            "cases": cases,
            "dumps": dumps,
        }
        (out / "slime.json").write_text(json.dumps(finite(doc)) + "\n")
        print(f"slime {scommit[:12]}: {len(cases)} cases, {len(dumps)} dumped rollouts")

        P = load_prime(proot)
        C = P.config
        run = out / "prime_rl_run"
        if run.exists():
            import shutil

            shutil.rmtree(run)
        run.mkdir()
        # configs/trainer.json (entrypoints/rl.py:77-82 dump_resolved_config): REPRODUCED,
        # only the fields a reader needs
        (run / "configs").mkdir()
        (run / "configs" / "trainer.json").write_text(
            json.dumps(
                {
                    "loss": C.DefaultLossConfig().model_dump(mode="json"),
                    "enable_token_export": True,
                },
                indent=2,
            )
        )
        pcases = [
            prime_case(P, "default", C.DefaultLossConfig(), batch, out_dir=run),
            prime_case(
                P,
                "dppo_custom",
                C.DefaultLossConfig(
                    dppo_mask_low=0.1, dppo_mask_high=0.3, adv_tau=0.5, kl_tau=0.01
                ),
                batch,
            ),
            prime_case(P, "ipo", C.IPOLossConfig(ipo_threshold=0.1), batch),
            prime_case(P, "bf16_logits", C.DefaultLossConfig(), batch, bf16=True),
        ]
        pdoc = {
            "trainer": "prime-rl",
            "commit": pcommit,
            "torch": torch.__version__,
            "stand_ins": STAND_INS["prime-rl"],
            "reproduced": {
                "Tensors.compute_stats (trainer/utils.py:245-281)": "one process, ranks in order",
                "train.py:301-323": "rl_scale: the global loss-mask count",
                "the packer": "consecutive samples, padded to seq_len as pad_micro_batch "
                "(trainer/batch.py:692-736): token 1, env '', the last sequence's length",
                "traces.jsonl": "Episode.to_record's fields a reader needs (see write_traces)",
                "configs/trainer.json": "its loss section and enable_token_export only",
            },
            "cases": pcases,
        }
        (out / "prime_rl.json").write_text(json.dumps(finite(pdoc)) + "\n")
        print(f"prime-rl {pcommit[:12]}: {len(pcases)} cases")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
