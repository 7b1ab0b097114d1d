"""Benchmark: the Ray engine against the local engine on this machine, and a projection.

Generates a multi-file dataset with ``grpo-cli sample`` (one file a step, cached under
``--data``), starts a ``ray start --head`` cluster on localhost (token authentication, a
token of its own, stopped at the end) and measures, as ratios in the same run:

- ``local``: ``grpo-cli objective DIR --json``;
- ``ray``: the same with ``--engine ray --ray-address`` the running cluster (what a user of
  an existing cluster pays: no start-up of Ray);
- ``ray-private``: ``--engine ray`` alone, which starts a Ray for the run and stops it.

The timing criterion is the median ratio of ``--paired N`` alternations of local and ray.

Then, in this process, what a projection to N nodes needs, measured on the same blocks:
the fold time of a block on one core, the size of its partial (what travels to the
merge), the time to merge 8 partials (one node of the merge tree) and pass 1's reading of
the answer columns on the driver. The projection is printed with its formula.

Usage: python bench/ray_engine.py [--scale 1] [--files 8] [--paired 5] [--data DIR]
``--scale 1`` is ~70M tokens over ``--files`` files.
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run import ENV, measure

HERE = Path(__file__).resolve().parent


def dataset(data: Path, scale: float, files: int) -> Path:
    d = data / f"steps_x{scale:g}_f{files}"
    d.mkdir(parents=True, exist_ok=True)
    groups = max(1, int(6400 * scale / files))
    for i in range(files):
        p = d / f"step_{i}.parquet"
        if p.exists():
            continue
        print(f"generating {p} ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "grpo_cli", "sample", str(p), "--groups", str(groups),
             "--group-size", "8", "--mean-len", "1367", "--max-len", "8192", "--seed",
             str(i + 1), "--row-group-rows", "1024"],
            check=True, capture_output=True,
        )  # fmt: skip
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Head:
    """``ray start --head --block`` on localhost with a token file of its own."""

    def __init__(self, home: Path) -> None:
        self.token = home / "token"
        self.token.write_text(secrets.token_hex(32))
        self.port = free_port()
        self.env = {
            **{k: v for k, v in ENV.items() if not k.startswith("RAY_")},
            "HOME": str(home),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
        }
        ray_bin = Path(sys.executable).with_name("ray")
        self.proc = subprocess.Popen(
            [str(ray_bin), "start", "--head", "--block", "--port", str(self.port),
             "--node-ip-address", "127.0.0.1", "--include-dashboard=false",
             "--disable-usage-stats"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    time.sleep(1.0)  # the raylet registers after the GCS listens
                    return
            time.sleep(0.3)
        raise SystemExit("ray start --head did not listen within 60 s")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)


def paired(a: list[str], b: list[str], n: int, env: dict[str, str]) -> list[float]:
    ratios = []
    for _ in range(n):
        ta = float(measure(a, 1, env)["wall_s"])
        tb = float(measure(b, 1, env)["wall_s"])
        ratios.append(tb / ta)
    return ratios


def task_cost(head: Head, n: int = 500) -> float:
    """The driver's time per task: submitting and collecting ``n`` empty tasks (after a
    warm-up), what the driver pays serially for every block."""
    os.environ.update({k: v for k, v in head.env.items() if k.startswith("RAY_")})
    import ray

    ray.init(address=head.address, logging_level="ERROR", log_to_driver=False)
    try:
        noop = ray.remote(lambda: None)
        ray.get([noop.remote() for _ in range(50)])
        t0 = time.perf_counter()
        ray.get([noop.remote() for _ in range(n)])
        return (time.perf_counter() - t0) / n
    finally:
        ray.shutdown()


def block_costs(d: Path) -> dict[str, float]:
    """Per-block fold time on one core, partial size, merge time of 8 partials, and
    pass 1 on the driver: the quantities the projection scales."""
    import copy

    from grpo_cli.commands.objective import TOKEN_FIELDS
    from grpo_cli.engine.options import EngineOptions
    from grpo_cli.engine.plan import batches, plan
    from grpo_cli.fold.pass1 import objective_pass1
    from grpo_cli.fold.tokens import TokenPartial
    from grpo_cli.io import load_answers, open_source
    from grpo_cli.trainers.presets import resolve_settings

    engine = EngineOptions().resolved()
    src = open_source([str(d)])
    settings = resolve_settings(None)
    pass1 = []
    for _ in range(3):  # the first call pays one-time costs (imports, kernels' set-up)
        t0 = time.perf_counter()
        load_answers(src, need_rewards=False)
        pass1.append(time.perf_counter() - t0)
    pass1_s = min(pass1)
    p1 = objective_pass1(src, settings, engine=engine)
    fold = p1.fold(src.label)
    blocks = plan(src, TOKEN_FIELDS, EngineOptions(name="ray")).blocks
    sample = blocks[:: max(1, len(blocks) // 6)][:6]
    times, tokens, parts = [], [], []
    for b in sample:
        part = TokenPartial(settings, backend=engine.backend)
        t0 = time.perf_counter()
        for batch in batches(src, b.units, TOKEN_FIELDS, engine.batch_tokens):
            fold(part, batch)
        times.append(time.perf_counter() - t0)
        tokens.append(part.tokens)
        parts.append(part)
    size = statistics.median(len(pickle.dumps(p)) for p in parts)
    eight = [copy.deepcopy(parts[k % len(parts)]) for k in range(8)]
    t0 = time.perf_counter()
    total = eight[0]
    for p in eight[1:]:
        total = total.merge(p)
    merge8 = time.perf_counter() - t0
    return {
        "blocks": len(blocks),
        "block_s": statistics.median(times),
        "block_tokens": statistics.median(tokens),
        "partial_bytes": size,
        "merge8_s": merge8,
        "pass1_s": pass1_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="1 = ~70M tokens")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--paired", type=int, default=5, metavar="N")
    ap.add_argument("--data", type=Path, default=HERE / "data")
    args = ap.parse_args()
    d = dataset(args.data, args.scale, args.files)
    cli = [sys.executable, "-m", "grpo_cli"]
    local = [*cli, "objective", str(d), "--json"]
    with tempfile.TemporaryDirectory(prefix="grpo-bench-ray-") as home:
        head = Head(Path(home))
        try:
            on_ray = [*local, "--engine", "ray", "--ray-address", head.address]
            measure(on_ray, 1, head.env)  # warm: the workers' first imports
            ratios = paired(local, on_ray, args.paired, head.env)
            t_local = float(measure(local, 1, head.env)["wall_s"])
            t_ray = float(measure(on_ray, 1, head.env)["wall_s"])
            t_task = task_cost(head)
        finally:
            head.stop()
        private_env = {**head.env, "HOME": home}
        private_env.pop("RAY_AUTH_MODE"), private_env.pop("RAY_AUTH_TOKEN_PATH")
        t_private = float(measure([*local, "--engine", "ray"], 1, private_env)["wall_s"])
    ratios.sort()
    median = statistics.median(ratios)
    cores = os.cpu_count() or 1
    print(f"\nmachine: {cores} cores; dataset {d.name}: {args.files} files")
    print(f"{'contender':<12} {'wall s':>8} {'/ local':>8}")
    for name, t in (("local", t_local), ("ray", t_ray), ("ray-private", t_private)):
        print(f"{name:<12} {t:>8.2f} {t / t_local:>8.2f}")
    print(
        f"paired ({args.paired} alternations): ray / local median {median:.2f}, "
        f"range {ratios[0]:.2f} to {ratios[-1]:.2f} (Ray's overhead on one node)"
    )
    c = block_costs(d)
    tok_s = c["block_tokens"] / c["block_s"]
    print(
        f"\nper block ({c['blocks']} blocks): {c['block_tokens']:,.0f} tokens folded in "
        f"{c['block_s'] * 1e3:.0f} ms on one core ({tok_s / 1e6:.1f}M tokens/s); partial "
        f"{c['partial_bytes'] / 1024:.0f} KiB; merging 8 partials {c['merge8_s'] * 1e3:.1f} ms; "
        f"pass 1 (answer columns, on the driver) {c['pass1_s']:.2f} s"
    )
    # what the one-node run spent beyond pass 1 and the folds: connecting, scheduling,
    # the merge tree, the driver's merge and output
    fixed = max(t_ray - c["pass1_s"] - c["blocks"] * (c["block_s"] / cores + t_task), 0.0)
    print(f"driver time per task: {t_task * 1e3:.2f} ms (500 empty tasks on the running cluster)")
    print(
        "projection for S times the data on N nodes of C cores (C = this machine's):\n"
        "  T = fixed + S*t_pass1 + ceil(S*blocks / (N*C))*t_block + S*blocks*t_task + "
        f"ceil(log8(S*blocks))*t_merge8, with fixed = {fixed:.2f} s (measured: the ray run "
        "less pass 1, the folds and the tasks)"
    )
    print(f"{'S':>6} {'nodes':>6} {'tokens':>16} {'blocks':>8} {'T s':>9} {'M tokens/s':>11}")
    for scale_up in (1, 100, 1000):
        blocks = c["blocks"] * scale_up
        tokens = blocks * c["block_tokens"]
        for n in (1, 4, 16, 64):
            levels = math.ceil(math.log(max(blocks, 2), 8))
            t = (
                fixed
                + scale_up * c["pass1_s"]
                + math.ceil(blocks / (n * cores)) * c["block_s"]
                + blocks * t_task
                + levels * c["merge8_s"]
            )
            print(
                f"{scale_up:>6} {n:>6} {tokens:>16,.0f} {blocks:>8,} {t:>9.1f} "
                f"{tokens / t / 1e6:>11.1f}"
            )
    print(
        "what scales: the block folds (reading and arithmetic, in the tasks, near the data); "
        "what does not: pass 1's answer columns gathered on the driver (a few bytes an "
        "answer), the merge tree's depth, Ray's scheduling of one task per block "
        f"(~{c['partial_bytes'] / 1024:.0f} KiB a partial through the object store)"
    )


if __name__ == "__main__":
    main()
