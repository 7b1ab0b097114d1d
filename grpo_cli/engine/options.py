"""How batches are read and folded on this machine: the one home of every tuning knob.

:class:`EngineOptions` never changes *what* is computed; through the order in which
floats are added it can change the last digits, so every JSON document echoes it as
``engine``. The library never reads the environment: the CLI binds its flags and the
``GRPO_CLI_*`` variables into one of these.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..core import kernel as _fast
from ..errors import UsageError

__all__ = ["DEFAULT_WORKERS", "MAX_WORKERS", "EngineOptions", "Ran"]

# Fixed, not the core count: the result depends on the worker count (the order floats are
# added in), so a fixed default keeps JSON identical across machines.
DEFAULT_WORKERS = 2
# Each worker holds a partial and two batches in flight: a bound keeps a typo (100000) from
# asking for tens of GiB.
MAX_WORKERS = 64
# Tokens per streamed batch: bounds memory (a few float64 temporaries of this size) and
# keeps them small enough to stay in cache and in the allocator's heap.
DEFAULT_BATCH_TOKENS = 1 << 20
BACKENDS = ("auto", "c", "numpy")
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class Ran:
    """What a run of the Ray engine did: the blocks of its last fold (or the tasks of its
    last map) and the cluster's CPUs; None for what it did not do."""

    blocks: int | None = None
    workers: int | None = None

    def then(self, later: Ran) -> Ran:
        """This run, followed by ``later``: the later one's counts where it has them."""
        return Ran(
            later.blocks if later.blocks is not None else self.blocks,
            later.workers if later.workers is not None else self.workers,
        )


@dataclass(frozen=True)
class EngineOptions:
    """The local engine's settings.

    ``workers``: compute threads (and row-group streams); ``batch_tokens``: tokens per
    streamed batch; ``prefetch``: decode in reader threads while computing; ``backend``:
    what folds token batches, ``c`` (the compiled kernel), ``numpy``, or ``auto`` (``c``
    when it is built): :meth:`resolved` decides ``auto``, and reports echo the decision.

    ``name``: ``local`` (this machine's threads) or ``ray`` (:mod:`grpo_cli.engine.ray`:
    blocks folded by Ray tasks; ``address`` is the cluster's, None for a Ray started for
    the run). What a run did (its blocks, the cluster's CPUs) is not a setting: the engine
    returns it as a :class:`Ran`.
    """

    workers: int = DEFAULT_WORKERS
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    prefetch: bool = True
    backend: str = "auto"
    name: str = "local"
    address: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise UsageError(f"workers: must be from 1 to {MAX_WORKERS}, got {self.workers}")
        if self.batch_tokens < 1:
            raise UsageError(f"batch_tokens: must be >= 1, got {self.batch_tokens}")
        if self.backend not in BACKENDS:
            raise UsageError(f"backend: must be auto, c or numpy, got {self.backend!r}")
        if self.name not in ENGINES:
            raise UsageError(f"--engine: must be local or ray, got {self.name!r}")

    def resolved(self) -> EngineOptions:
        """The same options with ``backend`` decided: ``auto`` becomes ``c`` when the
        compiled kernel is built, else ``numpy``; ``c`` without it is an error."""
        built = _fast.built()
        if self.backend == "c" and not built:
            raise UsageError(
                "backend c: the compiled kernel is not built "
                "(reinstall with a C compiler: pip install -e .)"
            )
        if self.backend == "auto":
            return replace(self, backend="c" if built else "numpy")
        return self

    @property
    def compiled(self) -> bool:
        """Whether token batches go through the compiled kernel (after :meth:`resolved`)."""
        return self.resolved().backend == "c"

    def to_json(self, ran: Ran | None = None) -> dict[str, Any]:
        """The options as JSON echoes them, with what the run did (``ran``) on Ray."""
        r = self.resolved()
        if r.name == "ray":
            ran = ran or Ran()
            return {
                "name": "ray",
                "address": r.address,
                "blocks": ran.blocks,
                "workers": ran.workers,
                "batch_tokens": r.batch_tokens,
                "backend": r.backend,
            }
        return {
            "name": "local",
            "workers": r.workers,
            "batch_tokens": r.batch_tokens,
            "prefetch": r.prefetch,
            "backend": r.backend,
        }
