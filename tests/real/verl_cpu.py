"""A CPU platform for verl 0.9.1, registered through verl's own plugin hook.

verl 0.9.1 ships platforms for CUDA, Ascend NPU and ROCm only
(``verl/plugin/platform/platform_{cuda,npu,rocm}.py``); with no accelerator its
auto-detection falls back to ``nvidia`` (``platform_manager.py``, ``_detect_platform_name``)
and every ``torch.cuda`` call fails. ``verl/__init__.py`` imports the modules named in
``VERL_USE_EXTERNAL_MODULES`` at import time: this is one, and ``VERL_PLATFORM=cpu`` picks
the platform it registers with ``PlatformRegistry.register``. The engine registry keys its
FSDP engine by device ``cuda``/``npu`` only (``workers/engine/fsdp/transformer_impl.py``,
``@EngineRegistry.register(..., device=["cuda", "npu"])``): ``VERL_ENGINE_DEVICE=cuda``
(read by ``workers/engine/base.py``, ``EngineRegistry.get_engine_cls``) selects it while
every tensor stays on this platform's device, the CPU.

Nothing here computes a number verl logs: it answers verl's device questions for the CPU
(device ``cpu``, backend ``gloo``, no memory statistics: 0).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry


class _CpuModule(types.ModuleType):
    """``torch.cpu`` with the few ``torch.cuda`` functions verl calls on its device module
    and torch.cpu lacks (memory statistics, seeds, ``set_device``): no-ops or 0."""

    def __init__(self) -> None:
        super().__init__("verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def max_memory_allocated(self, *args: Any, **kwargs: Any) -> int:
        return 0

    max_memory_reserved = memory_allocated = memory_reserved = max_memory_allocated

    def get_device_name(self, *args: Any, **kwargs: Any) -> str:
        return "CPU"  # verl's FLOPs table has no CPU: its MFU is then 0 (infinite FLOPs)

    def mem_get_info(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return 0, 0

    def empty_cache(self) -> None:
        return None

    def reset_peak_memory_stats(self, *args: Any, **kwargs: Any) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_device(self, *args: Any, **kwargs: Any) -> None:
        return None

    def current_device(self) -> str:
        return "cpu"


DEVICE = _CpuModule()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The CPU as verl's accelerator: device ``cpu``, collectives over gloo."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        """``"cpu"``, as ``torch.cpu.current_device()``: verl passes it to ``.to(...)``
        (``utils/fsdp_utils.py``, ``fsdp2_load_full_state_dict``), where an index would
        mean an accelerator."""
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
