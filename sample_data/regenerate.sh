#!/usr/bin/env bash
# Regenerates every file in sample_data/ (deterministic: fixed seeds).
set -euo pipefail
cd "$(dirname "$0")"
# the project's environment when there is one (README's set-up commands make .venv), else
# $PYTHON or python3 with grpo-cli installed
py=${PYTHON:-python3}
[ -x ../.venv/bin/python ] && py=../.venv/bin/python
"$py" -m grpo_cli sample batch.parquet --groups 32 --group-size 8 --mean-len 120 --seed 7 --extras
"$py" -m grpo_cli sample batch.npz --groups 16 --group-size 8 --mean-len 60 --seed 11
"$py" -m grpo_cli sample rewards.npz --rewards-only --groups 12 --group-size 6 --seed 3
"$py" - <<'PY'
import numpy as np
# The seed spec's (001) worked example: grpo-cli objective gives -0.13122323326245566.
np.savez(
    "seed_example.npz",
    logp=np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]),
    old_logp=np.array([[-1.1, -0.5, -1.0], [-0.6, -1.0, 0.0]]),
    ref_logp=np.array([[-1.2, -0.4, -1.5], [-0.4, -1.1, 0.0]]),
    advantages=np.array([1.0, -1.0]),
    mask=np.array([[True, True, True], [True, True, False]]),
)
PY
"$py" make_broken.py  # sample_data/broken/: one file per check rule it breaks
