"""Inputs as filesystem URIs (pyarrow's filesystems): ``file://`` and ``s3://`` against a
real S3 API (moto's server on localhost), on the local engine and on Ray. The documents
equal those of the same files read from a local path (the source label aside)."""

from __future__ import annotations

import glob
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import SAMPLE, Cli, sample_steps

GRPO = [sys.executable, "-m", "grpo_cli"]


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_steps(
        tmp_path_factory.mktemp("steps"), 3, "--groups", "16", "--group-size", "8",
        "--mean-len", "50", "--row-group-rows", "32",
    )  # fmt: skip


def _sourceless(doc: Any) -> Any:
    """The document without its ``source`` labels (a path or a URI: the one difference)."""
    if isinstance(doc, dict):
        return {k: _sourceless(v) for k, v in doc.items() if k != "source"}
    if isinstance(doc, list):
        return [_sourceless(v) for v in doc]
    return doc


def _doc(cli: Cli, *args: str) -> Any:
    return _sourceless(cli.json(*args))


def test_file_uris_read_like_paths(steps: Path, cli: Cli) -> None:
    want = _doc(cli, "objective", str(steps))
    assert _doc(cli, "objective", f"file://{steps}") == want
    assert _doc(cli, "objective", f"file://{steps}/step_*.parquet") == want
    one = _doc(cli, "kl", str(steps / "step_1.parquet"))
    assert _doc(cli, "kl", f"file://{steps}/step_1.parquet") == one
    assert _doc(cli, "advantages", f"file://{SAMPLE / 'rewards.npz'}") == _doc(
        cli, "advantages", str(SAMPLE / "rewards.npz")
    )


def test_bad_uris_are_one_line(cli: Cli, tmp_path: Path) -> None:
    cli.error(["kl", f"file://{tmp_path}/none.parquet"], f"{tmp_path}/none.parquet: no such file")
    cli.error(["kl", "nosuch://bucket/x.parquet"], "nosuch://bucket/x.parquet: cannot open")
    cli.error(["kl", f"file://{tmp_path}"], "directory holds no .parquet")


# --------------------------------------------------------------------------- S3 (moto)
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="module")
def s3(steps: Path) -> Iterator[str]:
    """A local S3 API with bucket ``rollouts`` holding the steps under ``run1/``: the
    query string a URI needs to reach it."""
    server = Path(sys.executable).with_name("moto_server")
    if not server.exists():
        if os.environ.get("GRPO_CLI_REQUIRE_EXTRAS"):  # CI installs the test extra: must run
            pytest.fail("moto_server is missing: the test extra brings moto[server]")
        pytest.skip("moto[server] is not installed (pip install -e '.[test]')")
    port = _free_port()
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                pytest.fail("moto_server did not listen within 30 s")
            time.sleep(0.2)
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True
        )
        fs.create_dir("rollouts")
        for p in sorted(glob.glob(str(steps / "*.parquet"))):
            pafs.copy_files(
                p,
                f"rollouts/run1/{Path(p).name}",
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=fs,
            )
        yield f"?endpoint_override=127.0.0.1:{port}&scheme=http"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_s3_prefix_and_pattern_read_like_paths(s3: str, steps: Path, cli: Cli) -> None:
    for cmd in (["objective"], ["check", "--format", "json"], ["trend"]):
        if cmd[0] == "check":
            local = cli(*cmd, str(steps))
            remote = cli(*cmd, f"s3://rollouts/run1{s3}")
            assert local.exit_code == remote.exit_code == 0, remote.stderr
            assert _sourceless(json.loads(local.stdout)) == _sourceless(json.loads(remote.stdout))
            continue
        want = _doc(cli, *cmd, str(steps))
        assert _doc(cli, *cmd, f"s3://rollouts/run1{s3}") == want
        assert _doc(cli, *cmd, f"s3://rollouts/run1/step_*.parquet{s3}") == want
    doc = cli.json("kl", f"s3://rollouts/run1/step_2.parquet{s3}")
    assert doc["source"] == "s3://rollouts/run1/step_2.parquet"
    cli.error(["kl", f"s3://rollouts/run2{s3}"], "s3://rollouts/run2")


def test_s3_on_ray_equals_local(s3: str, steps: Path, tmp_path: Path) -> None:
    """The CLI with a private Ray: tasks read the S3 objects themselves."""
    pytest.importorskip("ray")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(S3_ENV, HOME=str(tmp_path), GRPO_CLI_BATCH_TOKENS="500")
    args = ["objective", f"s3://rollouts/run1{s3}", "--json"]
    local = subprocess.run([*GRPO, *args], capture_output=True, text=True, env=env, check=False)
    ray = subprocess.run(
        [*GRPO, *args, "--engine", "ray"], capture_output=True, text=True, env=env, check=False
    )
    assert local.returncode == ray.returncode == 0, ray.stderr
    a, b = json.loads(local.stdout), json.loads(ray.stdout)
    assert b["engine"]["name"] == "ray" and b["engine"]["blocks"] >= 3
    from .test_ray import same

    assert same(a, b) == []
