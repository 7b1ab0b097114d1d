#!/usr/bin/env bash
# The AReaL 1.0.4 environment of tests/test_real_areal.py and conformance/areal/record.py:
# .areal-venv with torch's CPU build (tests/trainers.txt), areal without its dependencies
# (they pin torch<2.11 and pull CUDA, vLLM/SGLang and agent stacks), the packages its actor
# and loss import (tests/real/areal-requirements.txt) and grpo-cli. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=.areal-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q -c tests/trainers.txt torch
"$venv/bin/pip" install -q --no-deps areal==1.0.4
"$venv/bin/pip" install -q -r tests/real/areal-requirements.txt
# GRPO_CLI_ENV_DEPS_ONLY=1: without grpo-cli itself (.ci/run builds the rest in the
# background while another install of this checkout may be building the kernel in place)
if [ -n "${GRPO_CLI_ENV_DEPS_ONLY:-}" ]; then exit 0; fi
"$venv/bin/pip" install -q -e .
