"""Writes the .pt fixtures of tests/test_torch_pickle.py and what torch.load reads from them.

Run with torch installed (``pip install torch==2.13.0``), from the repository root:
``python tests/data/torch_pickle/make.py``. Writes, beside this file:

- ``tensors.pt``: ``torch.save`` of a nested dict holding a tensor of every dtype a dump
  may hold (float32/64/16, bfloat16, int8/16/32/64, uint8, uint16/32/64, bool,
  complex64/128), strided, offset, transposed, 0-d and empty views, two views of one
  storage, nested dicts, lists and tuples, None fields, an OrderedDict, bytes, a set, a
  complex, NumPy scalars and an array;
- ``expected.npz``: each tensor as ``torch.load`` gives it (``weights_only=False``: the
  NumPy objects are outside its default allow-list), converted
  by ``.numpy()`` (bfloat16 first widened by ``.float()``), keyed by its path in the
  object (``a/b/0``);
- ``expected.json``: the object's structure as torch.load gives it, each tensor replaced
  by ``{"tensor": path, "dtype": torch dtype, "shape": [...]}``.

The test compares :func:`grpo_cli.io.torch_pickle.load` against the last two without
torch.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def build() -> dict[str, Any]:
    g = torch.Generator().manual_seed(28)
    base = torch.randn(5, 7, generator=g, dtype=torch.float64)
    f32 = base.float()
    shared = torch.arange(40, dtype=torch.int64)
    dtypes: dict[str, Any] = {
        "float64": base,
        "float32": f32,
        "float16": f32.half(),
        "bfloat16": (f32 * 3.3).to(torch.bfloat16),
        "int8": (base * 40).to(torch.int8),
        "int16": (base * 4000).to(torch.int16),
        "int32": (base * 4e8).to(torch.int32),
        "int64": (base * 4e17).to(torch.int64),
        "uint8": (base.abs() * 50).to(torch.uint8),
        "uint16": (base.abs() * 9000).to(torch.uint16),
        "uint32": (base.abs() * 1e9).to(torch.uint32),
        "uint64": (base.abs() * 1e18).to(torch.uint64),
        "bool": base > 0,
        "complex64": torch.complex(f32, -f32),
        "complex128": torch.complex(base, base * 2),
    }
    views = {
        "transposed": f32.t(),
        "strided": f32[::2, 1::3],
        "offset": f32[2:, 3:],
        "row": f32[3],
        "scalar": f32[1, 2],
        "empty": f32[:, 7:],
        "empty_2d": torch.empty(0, 4),
        "bf16_view": dtypes["bfloat16"][1:, ::2].t(),
        "bool_strided": dtypes["bool"].flip(1)[::2, ::2],
        "shared_a": shared[3:9],
        "shared_b": shared.view(5, 8)[:, 1],
        "expanded": torch.tensor([1.5, -2.0]).expand(3, 2),
        "int_scalar": torch.tensor(7),
    }
    return {
        "format_version": 2,
        "dtypes": dtypes,
        "views": views,
        "samples": [
            {
                "rollout_position": 0,
                "log_probs": f32[0, :4],
                "ref_log_probs": None,
                "tokens": shared[:5],
            },
            {
                "rollout_position": 1,
                "log_probs": f32[1, :2],
                "ref_log_probs": f32[2, :2],
                "tokens": shared[5:7],
            },
        ],
        "nested": {
            "a": {"b": [f32[4], (shared[10], None, "x")]},
            "empty_list": [],
            "empty_dict": {},
        },
        "plain": {
            "none": None,
            "true": True,
            "int": -3,
            "big": 2**70,
            "float": 0.1,
            "nan": float("nan"),
            "str": "ünï",
            "bytes": b"\x00\xffab",
            "empty_bytes": b"",
            "set": {1, 2, 3},
            "complex": 1.5 - 2j,
            "tuple": (1, (2, 3)),
            "ordered": collections.OrderedDict([("z", 1), ("a", 2)]),
            "np_float": np.float64(0.375),
            "np_int": np.int32(-9),
            "np_array": np.arange(6, dtype=np.float32).reshape(2, 3),
        },
    }


def describe(obj: Any, path: str, arrays: dict[str, np.ndarray]) -> Any:
    if torch.is_tensor(obj):
        value = obj.float() if obj.dtype == torch.bfloat16 else obj
        arrays[path] = value.numpy()
        return {"tensor": path, "dtype": str(obj.dtype), "shape": list(obj.shape)}
    if isinstance(obj, np.ndarray):
        arrays[path] = obj
        return {"ndarray": path}
    if isinstance(obj, np.generic):
        return {"np_scalar": obj.dtype.str, "value": obj.item()}
    if isinstance(obj, collections.OrderedDict):
        return {"ordered": [[k, describe(v, f"{path}/{k}", arrays)] for k, v in obj.items()]}
    if isinstance(obj, dict):
        return {"dict": {k: describe(v, f"{path}/{k}", arrays) for k, v in obj.items()}}
    if isinstance(obj, list):
        return {"list": [describe(v, f"{path}/{i}", arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, tuple):
        return {"tuple": [describe(v, f"{path}/{i}", arrays) for i, v in enumerate(obj)]}
    if isinstance(obj, (set, frozenset)):
        return {"set": sorted(obj)}
    if isinstance(obj, bytes):
        return {"bytes": obj.hex()}
    if isinstance(obj, complex):
        return {"complex": [obj.real, obj.imag]}
    if isinstance(obj, float) and obj != obj:
        return {"float": "nan"}
    if isinstance(obj, int) and not isinstance(obj, bool) and abs(obj) >= 2**53:
        return {"bigint": str(obj)}
    return obj


def main() -> None:
    torch.save(build(), HERE / "tensors.pt")
    loaded = torch.load(HERE / "tensors.pt", weights_only=False)
    arrays: dict[str, np.ndarray] = {}
    doc = {"torch": torch.__version__, "object": describe(loaded, "", arrays)}
    (HERE / "expected.json").write_text(json.dumps(doc, indent=1) + "\n")
    named: dict[str, Any] = {k.lstrip("/"): v for k, v in arrays.items()}
    np.savez(HERE / "expected.npz", **named)
    size = (HERE / "tensors.pt").stat().st_size
    print(f"tensors.pt {size} bytes, {len(arrays)} arrays")


if __name__ == "__main__":
    main()
