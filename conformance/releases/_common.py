"""What every release script shares: the rollouts (numpy only, the same on every release
and machine), their padded tensors, and writing a fixture."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np


def rollouts(
    seed: int,
    sizes: list[int],
    *,
    width: int = 30,
    shuffle: bool = False,
    extremes: bool = False,
) -> dict[str, Any]:
    """Groups of ``sizes`` answers, ragged lengths 1 to ``width`` (one of the full width),
    binary and graded rewards, a zero-variance group (the second group of two or more
    answers), answers at their group's mean (A = 0: the third), an answer whose ratio is
    e^1.5 on every token (beyond the clip and a dual clip of 3), one below 1 − ε;
    log-probs < 0. ``extremes``
    adds what verl's and OpenRLHF's clamps bite on: a token with Δ = 25 (beyond ±20), an
    answer whose mean log-ratio is 11 (beyond GSPO's 10), a KL beyond ±10 (k3 of 12), a
    reference 25 below (k3's exponent beyond ±20). ``shuffle``: groups not adjacent."""
    rng = np.random.default_rng(seed)
    group = [f"p{g}" for g, size in enumerate(sizes) for _ in range(size)]
    B, L = len(group), width
    reward = rng.choice([0.0, 0.25, 0.5, 1.0], size=B)
    starts = np.cumsum([0, *sizes])
    multi = [g for g, size in enumerate(sizes) if size > 1]
    z = multi[1]  # the second group of two or more: all rewards equal
    reward[starts[z] : starts[z + 1]] = 0.5
    m = multi[2]  # the third: an answer at its group's mean
    reward[starts[m] : starts[m + 1]] = [1.0, 0.0] + [0.5] * (sizes[m] - 2)  # mean 0.5
    lengths = rng.integers(1, L, size=B)
    lengths[0], lengths[1] = 1, L
    mask = np.arange(L)[None, :] < lengths[:, None]
    logp = -(rng.exponential(1.0, size=(B, L)) + 0.01)
    old = np.minimum(logp + rng.normal(0.0, 0.3, size=(B, L)), -1e-3)
    ref = np.minimum(logp + rng.normal(0.0, 0.3, size=(B, L)), -1e-3)
    old[3] = logp[3] - 1.5  # ratio e^1.5 on every token
    old[9] = np.minimum(logp[9] + 0.4, -1e-3)  # ratio below 1 − ε
    if extremes:
        old[2, 0] = logp[2, 0] - 25.0  # Δ = 25: beyond the ±20 clamp
        old[4] = logp[4] - 11.0  # mean log-ratio 11 > 10
        ref[5, 0] = logp[5, 0] + 12.0  # k3 = e^12 − 13: the ±10 KL clamp bites
        ref[6, 0] = logp[6, 0] - 25.0  # k3's exponent −25: beyond ±20
    for a in (logp, old, ref):
        a[~mask] = 0.0
    order = rng.permutation(B) if shuffle else np.arange(B)
    return {
        "group": [group[i] for i in order],
        "reward": [float(reward[i]) for i in order],
        "lengths": [int(lengths[i]) for i in order],
        "logp": [logp[i, : lengths[i]].tolist() for i in order],
        "old_logp": [old[i, : lengths[i]].tolist() for i in order],
        "ref_logp": [ref[i, : lengths[i]].tolist() for i in order],
    }


def padded(data: dict[str, Any], name: str) -> Any:
    """``(B, L)`` float64 tensor of a ragged field, padding 0."""
    import torch

    lengths = data["lengths"]
    out = torch.zeros(len(lengths), max(lengths), dtype=torch.float64)
    for i, row in enumerate(data[name]):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out


def mask_of(data: dict[str, Any]) -> Any:
    """``(B, L)`` long mask of the valid tokens."""
    import torch

    lengths = torch.tensor(data["lengths"])
    return (torch.arange(max(data["lengths"]))[None, :] < lengths[:, None]).long()


def write(out: Path, doc: dict[str, Any]) -> None:
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{doc['trainer']} {doc['version']}: {len(doc['cases'])} cases -> {out}")


class _Any:
    """Whatever a missing module's attribute is used as: called, subscripted, a base
    class, a decorator (returns what it decorates)."""

    def __call__(self, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and not k and (inspect.isclass(a[0]) or inspect.isfunction(a[0])):
            return a[0]
        return _Any()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()

    def __getitem__(self, key: Any) -> Any:
        return _Any()

    def __or__(self, other: Any) -> Any:
        return _Any()

    __ror__ = __or__

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on ``sys.meta_path``: a module no other finder finds, imported by a file of one
    of ``packages`` (the trainer's own code), is a stand-in; imported by anything else
    (a library probing for an optional module) it stays missing, and so do ``absent``
    (modules the trainer probes for and then uses at import time: verl's ``torch_npu``)."""

    def __init__(self, *packages: str, absent: tuple[str, ...] = ()) -> None:
        self.packages = tuple(f"/{p}/" for p in packages)
        self.absent = absent

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in self.absent:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
            frame = frame.f_back  # type: ignore[assignment]
        caller = frame.f_code.co_filename if frame is not None else ""
        if not any(p in caller for p in self.packages):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        m = _StandInModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module: Any) -> None:
        pass
