"""The environment, read in one place for both boundaries (the CLI and the recorders'
in-training gate): the engine's tuning knobs ``GRPO_CLI_WORKERS``,
``GRPO_CLI_BATCH_TOKENS``, ``GRPO_CLI_NO_PREFETCH``, ``GRPO_CLI_KERNEL`` and Ray's
``RAY_ADDRESS``; GitHub Actions' ``GITHUB_STEP_SUMMARY``. Imports neither typer nor the CLI."""

from __future__ import annotations

import os

from .engine.options import DEFAULT_BATCH_TOKENS, DEFAULT_WORKERS, MAX_WORKERS, EngineOptions
from .errors import UsageError

__all__ = ["engine_options", "env_int", "github_step_summary"]


def env_int(name: str, default: int, minimum: int = 1) -> int:
    """An integer tuning knob from the environment (``default`` when unset); anything
    else than an integer ``>= minimum`` is a :class:`UsageError`."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")
    return value


def _backend() -> str:
    """``GRPO_CLI_KERNEL``: auto (default), c, or numpy."""
    m = os.environ.get("GRPO_CLI_KERNEL", "auto").strip().lower() or "auto"
    if m not in ("auto", "c", "numpy"):
        raise UsageError(f"GRPO_CLI_KERNEL must be auto, c or numpy, got {m!r}")
    return m


def engine_options(
    workers: int | None = None, name: str = "local", ray_address: str | None = None
) -> EngineOptions:
    """The engine options from ``--workers``, ``--engine``, ``--ray-address`` and the
    environment: ``GRPO_CLI_WORKERS`` (0: the default), ``GRPO_CLI_BATCH_TOKENS``,
    ``GRPO_CLI_NO_PREFETCH`` (any value: decode in the computing threads),
    ``GRPO_CLI_KERNEL`` and ``RAY_ADDRESS``. The only place the environment is read."""
    if ray_address is not None and name != "ray":
        raise UsageError("--ray-address: only with --engine ray")
    if workers is not None and name == "ray":
        raise UsageError(
            "--workers: the local engine's threads; with --engine ray the cluster's CPUs fold "
            "the blocks (engine.workers in JSON says how many)"
        )
    address = None
    if name == "ray":
        address = ray_address or os.environ.get("RAY_ADDRESS", "").strip() or None
    if workers is None:
        workers = env_int("GRPO_CLI_WORKERS", 0, minimum=0) or DEFAULT_WORKERS
    if workers > MAX_WORKERS:
        raise UsageError(f"--workers / GRPO_CLI_WORKERS: at most {MAX_WORKERS}, got {workers}")
    try:
        return EngineOptions(
            workers=workers,
            batch_tokens=env_int("GRPO_CLI_BATCH_TOKENS", DEFAULT_BATCH_TOKENS),
            prefetch=not os.environ.get("GRPO_CLI_NO_PREFETCH"),
            backend=_backend(),
            name=name,
            address=address,
        ).resolved()
    except UsageError as exc:
        if "not built" in str(exc):
            raise UsageError(f"GRPO_CLI_KERNEL=c but {str(exc).split(': ', 1)[1]}") from None
        raise


def github_step_summary() -> str | None:
    """The file GitHub Actions collects a job's summary from (``GITHUB_STEP_SUMMARY``)."""
    return os.environ.get("GITHUB_STEP_SUMMARY") or None
