"""The CI gate as people use it: the GitHub Actions workflow of docs/examples/grpo-check.yml
and the pre-commit hook of .pre-commit-hooks.yaml, each parsed and its command run (as the
runner would: bash, `grpo-cli` on PATH) on rollouts that pass and on a file that fails."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "docs" / "examples" / "grpo-check.yml"
HOOKS = ROOT / ".pre-commit-hooks.yaml"
SPIKE = ROOT / "sample_data" / "broken" / "kl_spike.parquet"


def _env(tmp: Path) -> dict[str, str]:
    """The environment of a runner where `pip install grpo-cli` put `grpo-cli` on PATH:
    here a shim running this interpreter's grpo_cli (this checkout)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "grpo-cli"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m grpo_cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "80"
    return env


def _sample(work: Path, env: dict[str, str], *names: str) -> None:
    for seed, name in enumerate(names, 1):
        out = work / name
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["grpo-cli", "sample", str(out), "--groups", "8", "--seed", str(seed)],
            env=env, check=True, capture_output=True,
        )  # fmt: skip


def _workflow() -> dict[Any, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def _gate_step(doc: dict[Any, Any]) -> tuple[dict[str, str], dict[str, Any], list[dict[str, Any]]]:
    job = doc["jobs"]["gate"]
    steps = job["steps"]
    (gate,) = [s for s in steps if s.get("id") == "gate"]
    return job.get("env", {}), gate, steps


def test_workflow_is_a_github_actions_workflow() -> None:
    doc = _workflow()
    # YAML 1.1 reads the key `on` as True: GitHub reads it as `on`
    triggers = doc.get("on", doc.get(True))
    assert triggers is not None
    assert {"push", "pull_request"} <= set(triggers)
    env, gate, steps = _gate_step(doc)
    assert doc["jobs"]["gate"]["runs-on"] == "ubuntu-latest"
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert uses == ["actions/checkout", "actions/setup-python", "actions/upload-artifact"]
    assert any("pip install" in s.get("run", "") for s in steps[: steps.index(gate)])
    assert "ROLLOUTS" in env and "$ROLLOUTS" in gate["run"]
    assert "--format github" in gate["run"]
    # the artifact keeps the reports the gate writes
    upload = steps[-1]
    assert upload["if"] == "always()"
    written = re.findall(r"--report(?:-html)? (\S+)", gate["run"])
    assert sorted(written) == sorted(upload["with"]["path"].split())


def _run_gate(work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    job_env, gate, _ = _gate_step(_workflow())
    summary = work / "summary.md"
    summary.unlink(missing_ok=True)
    run_env = {**env, **job_env, "GITHUB_STEP_SUMMARY": str(summary)}
    # GitHub runs a `run:` block with `bash -e {0}`
    return subprocess.run(
        ["bash", "-e", "-c", gate["run"]], cwd=work, env=run_env, capture_output=True,
        text=True, check=False,
    )  # fmt: skip


def test_workflow_gate_step_runs(tmp_path: Path) -> None:
    env = _env(tmp_path)
    work = tmp_path / "repo"
    _sample(work, env, "logs/step_1.parquet", "logs/step_2.parquet")
    r = _run_gate(work, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("::notice title=grpo-cli check::passed"), r.stdout
    assert "(2 files)" in r.stdout
    report = json.loads((work / "check.json").read_text())
    assert report["passed"] is True and report["counts"]["fail"] == 0
    assert (work / "check.html").read_text().startswith("<!DOCTYPE html>")
    assert "| `kl-max` |" in (work / "summary.md").read_text()

    # a step whose KL spikes: the job fails, the rule is an ::error annotation
    shutil.copy(SPIKE, work / "logs" / "step_3.parquet")
    r = _run_gate(work, env)
    assert r.returncode == 1, r.stderr
    errors = [line for line in r.stdout.splitlines() if line.startswith("::error ")]
    assert any(line.startswith("::error title=grpo-cli check kl-max::") for line in errors)
    assert "logs/step_3.parquet" in r.stdout
    report = json.loads((work / "check.json").read_text())
    assert report["passed"] is False
    assert {x["rule"] for x in report["results"] if x["status"] == "fail"} >= {"kl-max"}


def _hook() -> dict[str, Any]:
    hooks = yaml.safe_load(HOOKS.read_text())
    (hook,) = [h for h in hooks if h["id"] == "grpo-check"]
    assert set(hook) >= {"id", "name", "entry", "language", "files"}
    assert hook["language"] == "python"  # pre-commit installs this repository with pip
    return hook


def _run_hook(hook: dict[str, Any], files: list[str], work: Path, env: dict[str, str]) -> Any:
    """What pre-commit runs: the entry, the hook's args, then the staged files that match
    `files` (a Python regex searched in each path)."""
    chosen = [f for f in files if re.search(hook["files"], f)]
    cmd = [*shlex.split(hook["entry"]), *hook.get("args", []), *chosen]
    return chosen, subprocess.run(
        cmd, cwd=work, env=env, capture_output=True, text=True, check=False
    )


def test_pre_commit_hook_runs(tmp_path: Path) -> None:
    hook = _hook()
    env = _env(tmp_path)
    work = tmp_path / "repo"
    _sample(work, env, "rollouts/a.parquet", "rollouts/b.parquet")
    (work / "notes.md").write_text("not a rollout\n")
    staged = ["notes.md", "rollouts/a.parquet", "rollouts/b.parquet", "pyproject.toml"]
    chosen, r = _run_hook(hook, staged, work, env)
    assert chosen == ["rollouts/a.parquet", "rollouts/b.parquet"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASSED" in r.stdout

    shutil.copy(SPIKE, work / "rollouts" / "kl_spike.parquet")
    chosen, r = _run_hook(hook, [*staged, "rollouts/kl_spike.parquet"], work, env)
    assert r.returncode == 1, r.stderr
    assert "FAIL  kl-max" in r.stdout and "FAILED" in r.stdout


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz", "a.npz", "a.pq", "a.parquet"])
def test_pre_commit_hook_takes_every_format(name: str) -> None:
    assert re.search(_hook()["files"], f"rollouts/{name}")
    assert not re.search(_hook()["files"], f"rollouts/{name}.txt")
