"""The Ray engine against a real local Ray (no mocks).

Most tests share one in-process Ray (``ray.init(num_cpus=2)``); the CLI, run in-process,
uses it. Others start what a user would: the CLI in a subprocess with a private Ray, and a
``ray start --head`` cluster on localhost with token authentication that the CLI joins
with ``--ray-address``. Every JSON is compared with the local engine's on the same files:
floats to 1e-12 relative + 1e-14 absolute, everything else exactly.

Token authentication (Ray 2.60 turns it on for a new local Ray and writes
``~/.ray/auth_token``): the in-process Ray gets a token of its own in the environment,
the subprocesses a throwaway HOME that is checked to stay empty.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_cli.engine.options import EngineOptions
from grpo_cli.engine.ray import reload_auth_config

from .conftest import SAMPLE, Cli, sample_steps

if os.environ.get("GRPO_CLI_REQUIRE_EXTRAS"):  # CI: a missing Ray must fail, not skip
    import ray
else:
    ray = pytest.importorskip("ray")

GRPO = [sys.executable, "-m", "grpo_cli"]
BATCH_TOKENS = "500"  # small batches: a few files make many blocks (a merge tree of 2 levels)


@pytest.fixture(scope="module")
def in_process_ray() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    reload_auth_config()  # Ray was imported above, with the environment as it was then
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reload_auth_config()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three steps, ragged, several row groups each, with every optional column."""
    return sample_steps(
        tmp_path_factory.mktemp("ray-data"), 3, "--groups", "24", "--group-size", "8",
        "--mean-len", "60", "--row-group-rows", "40", "--extras",
    )  # fmt: skip


def same(local: Any, other: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ beyond the engines' tolerance (the engine block
    aside): floats 1e-12 relative + 1e-14 absolute, all else exactly."""
    if path.endswith(".engine"):
        return []
    if isinstance(local, dict) and isinstance(other, dict):
        if local.keys() != other.keys():
            return [f"{path}: keys {sorted(local.keys() ^ other.keys())}"]
        return [d for k in local for d in same(local[k], other[k], f"{path}.{k}")]
    if isinstance(local, list) and isinstance(other, list):
        if len(local) != len(other):
            return [f"{path}: {len(local)} items vs {len(other)}"]
        out: list[str] = []
        for i, (a, b) in enumerate(zip(local, other, strict=True)):
            out += same(a, b, f"{path}[{i}]")
        return out
    if isinstance(local, float) and isinstance(other, float):
        if abs(local - other) <= 1e-12 * abs(local) + 1e-14:
            return []
    elif local == other and type(local) is type(other):
        return []
    return [f"{path}: {local!r} vs {other!r}"]


def test_same_document_helper_finds_differences() -> None:
    assert same({"a": 1.0, "b": [1, 2]}, {"a": 1.0 + 1e-15, "b": [1, 2]}) == []
    assert same({"a": 1.0}, {"a": 1.0 + 1e-9}) == [".a: 1.0 vs 1.000000001"]
    assert same({"a": [1, 2]}, {"a": [1, 3]}) == [".a[1]: 2 vs 3"]
    assert same({"a": 1}, {"a": 1.0}) == [".a: 1 vs 1.0"]


COMMANDS = [
    ["objective", "--group-scope", "file"],
    ["objective", "--preset", "verl", "--gradient"],
    ["objective", "--preset", "openrlhf", "--recompute-advantages"],
    # a loss of the trainer's own and a sampler correction: their metrics merge over blocks
    ["objective", "--preset", "trl", "--loss", "cispo", "--correction", "trl-vllm", "--gradient"],
    ["objective", "--preset", "verl", "--loss", "dppo_kl", "--correction", "verl-rollout"],
    # verl's rejection sampling (tokens and answers leave each batch) and bypass mode
    "objective --preset verl --correction verl-rollout --correction-param rollout_rs=token_k1 "
    "--correction-param rollout_rs_threshold=0.99_1.01".split(),
    "objective --preset verl --loss bypass_mode --loss-param rollout_rs=seq_mean_k2 "
    "--loss-param rollout_rs_threshold=0.0005 --gradient".split(),
    ["kl"],
    ["advantages", "--group-scope", "file"],
    ["answers", "--top", "7", "--sort", "kl"],
    ["trend"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_ray_gives_the_local_json(
    in_process_ray: None,
    dataset: Path,
    cli: Cli,
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", BATCH_TOKENS)
    local = cli.json(*args, dataset)
    on_ray = cli.json(*args, dataset, "--engine", "ray")
    assert same(local, on_ray) == []
    engine = on_ray["engine"]
    assert engine["name"] == "ray" and engine["workers"] == 2
    if args[0] in ("advantages", "trend"):
        assert engine["blocks"] == 3  # pass 1 alone: a task a file; trend: a task a step
    else:  # 3 files of ~12k tokens, blocks of 16 batches of 500 tokens: 2 blocks a file
        assert engine["blocks"] >= 6
    assert local["engine"]["name"] == "local"


def test_check_on_ray_same_verdicts_and_exit_codes(
    in_process_ray: None, dataset: Path, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", BATCH_TOKENS)
    args = ["check", str(dataset), "--group-scope", "file", "--format", "json"]
    local, on_ray = cli(*args), cli(*args, "--engine", "ray")
    assert local.exit_code == on_ray.exit_code == 0, on_ray.stderr
    assert same(json.loads(local.stdout), json.loads(on_ray.stdout)) == []
    # a failing health rule: exit 1 on both engines
    fail = [*args, "--rule", "kl-mean.fail=1e-9"]
    assert cli(*fail).exit_code == 1
    assert cli(*fail, "--engine", "ray").exit_code == 1
    # a bad row: integrity fails on both, at the same place
    bad = _with_bad_row(dataset, tmp_path)
    local, on_ray = (
        cli("check", bad, "--format", "json"),
        cli("check", bad, "--format", "json", "--engine", "ray"),
    )
    assert local.exit_code == on_ray.exit_code == 1
    assert same(json.loads(local.stdout), json.loads(on_ray.stdout)) == []


def _with_bad_row(dataset: Path, tmp_path: Path) -> Path:
    """The dataset with a NaN inside the mask at row 70, token 2 of its second file."""
    out = tmp_path / "bad"
    out.mkdir(exist_ok=True)
    for p in sorted(dataset.glob("*.parquet")):
        t = pq.read_table(p)
        if p.name == "step_1.parquet":
            rows = t.column("logp").to_pylist()
            rows[70][2] = float("nan")
            i = t.schema.get_field_index("logp")
            t = t.set_column(i, "logp", pa.array(rows, type=t.schema.field(i).type))
        pq.write_table(t, out / p.name, row_group_size=40)
    return out


def test_bad_row_same_one_line_error_naming_file_and_row(
    in_process_ray: None, dataset: Path, cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GRPO_CLI_BATCH_TOKENS", BATCH_TOKENS)
    bad = _with_bad_row(dataset, tmp_path)
    want = (
        f"{bad / 'step_1.parquet'}: column 'logp' has nan (no mask: every token counts) at "
        "row 70, token 2"
    )
    for cmd in ("objective", "kl", "answers"):
        cli.error([cmd, str(bad)], want)
        cli.error([cmd, str(bad), "--engine", "ray"], want)


def test_trend_step_column_on_ray_is_a_usage_error(
    in_process_ray: None, cli: Cli, dataset: Path
) -> None:
    cli.error(
        ["trend", str(dataset), "--step-column", "step", "--engine", "ray"],
        "--step-column with --engine ray",
    )


def test_empty_directory_and_usage_errors(
    in_process_ray: None, cli: Cli, tmp_path: Path, dataset: Path
) -> None:
    cli.error(["objective", str(tmp_path), "--engine", "ray"], "directory holds no .parquet")
    cli.error(["check", str(tmp_path), "--engine", "ray"], "directory holds no .parquet")
    cli.error(["objective", str(dataset), "--engine", "spark"], "expected local or ray")
    cli.error(
        ["kl", str(dataset), "--ray-address", "127.0.0.1:1"], "--ray-address: only with --engine"
    )
    cli.error(["kl", str(dataset), "--engine", "ray", "--workers", "4"], "--workers: the local")


@pytest.mark.parametrize("cmd", ["objective", "check", "advantages"])
def test_an_npz_is_one_block(in_process_ray: None, cli: Cli, cmd: str) -> None:
    f = SAMPLE / ("rewards.npz" if cmd == "advantages" else "batch.npz")
    args = [cmd, str(f)] + (["--format", "json"] if cmd == "check" else ["--json"])
    local, on_ray = cli(*args), cli(*args, "--engine", "ray")
    assert local.exit_code == on_ray.exit_code == 0, on_ray.stderr
    doc = json.loads(on_ray.stdout)
    assert same(json.loads(local.stdout), doc) == []
    assert doc["engine"]["blocks"] == (0 if cmd == "advantages" else 1)  # npz: read here


def test_unreadable_file_is_the_same_error(
    in_process_ray: None, dataset: Path, cli: Cli, tmp_path: Path
) -> None:
    d = tmp_path / "trunc"
    shutil.copytree(dataset, d)
    p = d / "step_2.parquet"
    data = p.read_bytes()  # a row group's pages overwritten: the footer still reads
    p.write_bytes(data[:4] + b"\0" * (len(data) // 2) + data[4 + len(data) // 2 :])
    local, on_ray = cli("kl", d), cli("kl", d, "--engine", "ray")
    assert local.exit_code == on_ray.exit_code == 2
    assert local.stderr == on_ray.stderr
    assert local.stderr.startswith(f"grpo-cli: error: {p}: ")


def test_library_fold_equals_local_and_merges_in_block_order(
    in_process_ray: None, dataset: Path
) -> None:
    """Run to run the Ray result is bit for bit the same (a fixed merge order)."""
    from grpo_cli import io as _io
    from grpo_cli.commands.objective import objective_report
    from grpo_cli.trainers.presets import resolve_settings

    src = _io.open_source([str(dataset)], group_scope="file")
    s = resolve_settings(None)
    local = objective_report(src, s, engine=EngineOptions(batch_tokens=500))
    runs = [
        objective_report(src, s, engine=EngineOptions(batch_tokens=500, name="ray"))
        for _ in range(2)
    ]
    assert runs[0].objective == runs[1].objective  # exactly
    assert runs[0].answers == local.answers and runs[0].tokens == local.tokens
    assert np.isclose(runs[0].objective, local.objective, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------ real processes
def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), GRPO_CLI_BATCH_TOKENS=BATCH_TOKENS, **extra)
    return env


def test_cli_private_ray_writes_nothing_in_home(dataset: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run(
        [*GRPO, "objective", str(dataset), "--json", "--engine", "ray"],
        capture_output=True, text=True, env=_env(home), timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["engine"]["name"] == "ray" and doc["engine"]["address"] is None
    assert list(home.iterdir()) == []  # no ~/.ray/auth_token


def test_cli_without_ray_installed_names_the_extra(dataset: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "noray"
    (blocker / "ray").mkdir(parents=True)
    (blocker / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    env = _env(tmp_path, PYTHONPATH=str(blocker))
    r = subprocess.run(
        [*GRPO, "kl", str(dataset), "--engine", "ray"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "grpo-cli: error: --engine ray needs Ray: pip install 'grpo-cli[ray]' "
        "(Ray Data, Ray >= 2.9)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``ray start --head`` (2 CPUs) and a second node (1 CPU) on localhost, with token
    authentication (the token in a file of its own), stopped at the end: (address, token
    file)."""
    home = tmp_path_factory.mktemp("head-home")
    token = home / "token"
    token.write_text(secrets.token_hex(32))
    port = _free_port()
    env = _env(home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--port", str(port), "--num-cpus", "2",
         "--node-ip-address", "127.0.0.1", "--include-dashboard=false",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    address = f"127.0.0.1:{port}"
    procs = [proc]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.3)
        else:
            pytest.fail("ray start --head did not listen within 60 s")
        # a second node (a raylet and object store of its own): blocks and partials travel
        # between nodes as on a cluster of machines
        node = subprocess.Popen(
            [str(ray_bin), "start", "--address", address, "--block", "--num-cpus", "1",
             "--node-ip-address", "127.0.0.1", "--disable-usage-stats"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        procs.append(node)
        wait = (
            "import ray, time\n"
            f"ray.init(address={address!r}, log_to_driver=False)\n"
            "t = time.monotonic()\n"
            "while ray.cluster_resources().get('CPU', 0) < 3 and time.monotonic() - t < 60:\n"
            "    time.sleep(0.3)\n"
            "print(int(ray.cluster_resources().get('CPU', 0)))\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", wait], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.stdout.strip() == "3", r.stderr[-2000:]  # both nodes are in
        yield address, token
    finally:
        for p in reversed(procs):
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def test_cli_joins_a_token_authenticated_cluster(
    head: tuple[str, Path], dataset: Path, tmp_path: Path
) -> None:
    address, token = head
    env = _env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    args = ["objective", str(dataset), "--json"]
    local = subprocess.run([*GRPO, *args], capture_output=True, text=True, env=env, check=False)
    r = subprocess.run(
        [*GRPO, *args, "--engine", "ray", "--ray-address", address],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["engine"]["address"] == address and doc["engine"]["workers"] == 3  # 2 nodes
    assert doc["engine"]["blocks"] >= 6
    assert same(json.loads(local.stdout), doc) == []
    # RAY_ADDRESS is the default address
    r = subprocess.run(
        [*GRPO, *args, "--engine", "ray"],
        capture_output=True, text=True, env={**env, "RAY_ADDRESS": address}, timeout=300,
        check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["engine"]["address"] == address


def _raylets() -> int:
    r = subprocess.run(["pgrep", "-c", "-f", "raylet"], capture_output=True, text=True)
    return int(r.stdout.strip() or 0)


def test_cli_interrupted_stops(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) during a run: exit 130 with one line, and the private Ray is gone."""
    big = tmp_path / "big.parquet"
    r = subprocess.run(
        [*GRPO, "sample", str(big), "--groups", "400", "--group-size", "8", "--mean-len", "400"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    home = tmp_path / "home"
    home.mkdir()
    before = _raylets()
    proc = subprocess.Popen(
        [*GRPO, "objective", str(big), "--json", "--engine", "ray"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home),
    )  # fmt: skip
    time.sleep(2.5)  # Ray starting, or hundreds of small blocks under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "grpo-cli: interrupted"
    assert out == ""
    deadline = time.monotonic() + 20
    while _raylets() > before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _raylets() <= before  # (fewer: another process's Ray on this machine ended meanwhile)


def test_cli_refused_token_and_dead_address_are_one_line(
    head: tuple[str, Path], dataset: Path, tmp_path: Path
) -> None:
    address, _ = head
    r = subprocess.run(  # no token: Ray retries for ~20 s, then one line saying why
        [*GRPO, "kl", str(dataset), "--engine", "ray", "--ray-address", address],
        capture_output=True, text=True, env=_env(tmp_path), timeout=300, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"grpo-cli: error: --ray-address {address}: cannot connect: the cluster uses token "
        "authentication and refused this driver's token: give its token in RAY_AUTH_TOKEN or "
        "RAY_AUTH_TOKEN_PATH, with RAY_AUTH_MODE=token (`ray get-auth-token` on the head "
        "prints it)"
    ]
    dead = f"127.0.0.1:{_free_port()}"
    r = subprocess.run(
        [*GRPO, "kl", str(dataset), "--engine", "ray", "--ray-address", dead],
        capture_output=True, text=True, env=_env(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert r.stderr.startswith(f"grpo-cli: error: --ray-address {dead}: nothing answers there")
    assert len(r.stderr.splitlines()) == 1


def _die(part: object, batch: object) -> None:
    os._exit(3)  # a worker process lost (killed by the OOM killer, a node gone)


def test_a_lost_worker_is_one_error_naming_the_input(in_process_ray: None, dataset: Path) -> None:
    from grpo_cli import io as _io
    from grpo_cli.engine.plan import plan
    from grpo_cli.engine.run import run
    from grpo_cli.errors import InputError
    from grpo_cli.fold.tokens import TokenPartial
    from grpo_cli.trainers.presets import resolve_settings

    src = _io.open_source([str(dataset)])
    s = resolve_settings(None)
    # the first block to fail names its file and rows
    with pytest.raises(
        InputError, match=r"/step_\d\.parquet \(rows \d+-\d+\): a Ray worker failed \("
    ):
        run(plan(src, ["logp"], EngineOptions(name="ray")), lambda: TokenPartial(s), _die)


def test_progress_on_the_driver_counts_every_answer(in_process_ray: None, dataset: Path) -> None:
    from grpo_cli import io as _io
    from grpo_cli.commands.objective import kl_report
    from grpo_cli.trainers.presets import resolve_settings

    src = _io.open_source([str(dataset)])
    seen: list[int] = []
    r = kl_report(
        src, resolve_settings(None), engine=EngineOptions(batch_tokens=500, name="ray"),
        progress=seen.append,
    )  # fmt: skip
    assert sum(seen) == r.answers == src.n_rows() and len(seen) >= 6  # a tick a block
