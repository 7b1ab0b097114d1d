"""The documentation's reference tables, generated from the code so that they cannot drift.

A page asks for a table with a line ``<!-- generated: NAME -->``; :func:`expand` replaces
each such line by :data:`TABLES` ``[NAME]()``, at build time (``docs/hooks.py``, the MkDocs
hook). A table changed in the code (a rule's threshold, a preset's setting, a loss's
parameter, an option's help) therefore changes the page with no edit of it.

What the code does not say (why a rule's threshold is where it is, which config of a
trainer a preset mirrors) is written here, keyed by the code's own names: a name the code
has and this file does not (or the reverse) stops the build with a message naming it.

    python docs/reference.py NAME    # print one table (check-rules, presets, cli, ...)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- generated: (?P<name>[\w-]+) -->$", re.M)
HELP_WIDTH = 80  # click wraps help at 80 columns at most


class DocsError(Exception):
    """The code and this file's words disagree (a rule, a preset without its words)."""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(head: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = list(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _num(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _same_keys(what: str, code: Iterable[str], words: Mapping[str, str]) -> None:
    code = list(code)
    missing = [k for k in code if k not in words]
    extra = [k for k in words if k not in code]
    if missing or extra:
        raise DocsError(
            f"docs/reference.py: {what}: "
            + (f"no words for {', '.join(missing)} (add them)" if missing else "")
            + ("; " if missing and extra else "")
            + (f"words for {', '.join(extra)}, which the code no longer has" if extra else "")
        )


# ------------------------------------------------------------------ check's rules
# Why each rule of grpo_cli.check.rules.RULES measures what it does, and why its default
# threshold is where it is (the thresholds themselves are read from RULES).
CHECK_WHY = {
    "finite": "NaN/inf log-probs inside the mask. One NaN poisons the loss and every gradient.",
    "logp-range": "log p > 0 means p > 1: a corrupted or misaligned tensor. It also warns "
    "when more than `zero_share_warn` of `logp` is exactly 0.0: exact zeros are legitimate "
    "for confident tokens in bf16, but a large share means padding (0.0) leaked into the "
    "valid region.",
    "lengths-match": "an answer whose `logp`, `old_logp`, `ref_logp` (or `mask`) lists differ "
    "in length: the fields are misaligned.",
    "mask-nonempty": "an answer without a valid token divides by zero under sequence-mean "
    "aggregation.",
    "group-size": "groups of another size than most, or of one answer: usually a dropped or "
    "duplicated sample; a singleton has no baseline (TRL gives A = 0, verl A ≈ r).",
    "rewards-finite": "non-finite rewards or logged advantages.",
    "zero-std-groups": "share of groups whose rewards are all equal: they give no policy "
    "gradient, only KL. Past half the batch most compute is wasted (what DAPO's dynamic "
    "sampling filters); past 90% the step is nearly signal-free.",
    "kl-mean": "mean per-token KL to the reference (the `--kl-estimator`, k3 by default). "
    "Healthy runs with β ≈ 0.04 sit around 1e-3..1e-2; 0.1 is a policy far from its "
    "reference; 1.0 is a different model (reward hacking or collapse).",
    "kl-max": "the largest per-token KL. verl clamps k3 at 10, so above it the trainer's KL "
    "loss is already saturated; 50 means the reference found that token e⁵⁰ times likelier.",
    "clip-region": "share of tokens whose gradient clipping removes (TRL "
    "`clip_ratio/region_mean`, verl `pg_clipfrac`). Typical runs stay under a few percent; "
    "10% means steps that are too large or data too stale; 30% means most of the batch "
    "learns nothing.",
    "ratio-extreme": "share of tokens with ρ outside [1/band, band]: trainer and sampler "
    "disagree by 10x — an engine/trainer mismatch or a stale `old_logp`. The message adds "
    "the tokens with a log-ratio outside [−20, 20) (where verl and OpenRLHF clamp) and "
    "overflows.",
    "on-policy-exact": "opt-in (`--on-policy`). A log declared on-policy must have "
    "`logp == old_logp` bit for bit; any difference (and a nonzero clip fraction) is the "
    "known recomputation bug: rollout and training forward passes computed differently.",
    "rollout-mismatch": "mismatch KL (k3) between the sampler's `rollout_logp` and the "
    "trainer's `old_logp`; skipped when the sampler's log-probs are not logged. Same model, "
    "different kernels or precision gives ~1e-3; practitioners alarm at 0.1 (then "
    "importance correction or a fix of the engine is needed). The message adds the IS "
    "weight mean, ESS and mean \\|Δp\\| (verl flags > 0.01 as an engine precision issue).",
    "sampler-support": "a truncated or tempered sampler, told from the log-probs alone "
    "(issue 29; TRL #6789, #7269, verl #6240): with δ = `old_logp` − `rollout_logp`, the "
    "larger of its one-sidedness −mean δ / mean \\|δ\\| (a top-p/top-k/min-p sampler "
    "reports log-probs renormalised over the kept tokens, so δ = log(kept mass) < 0 at every "
    "token: 1.0) and \\|correlation of δ with `rollout_logp`\\| (a tempered sampler's "
    "log-probs are log p / T + c: δ linear in the token's log-prob; 0.78 at T = 0.7 and 1.3 on "
    "random logits). A precision mismatch gives ~0 on both (0.02 at σ = 0.02, 0.26 at σ = "
    "0.5, 0.52 at σ = 1, where `rollout-mismatch` fails anyway), hence warn at 0.6, fail at "
    "0.9 (a truncation: its ρ is off by the kept mass, 0.83 at top_p 0.8). Skipped below "
    "`min_tokens` (100) tokens with δ ≠ 0. The message gives the IS weight mean raw and, for "
    "a truncation, with the kept mass divided out (by bin of the logged entropy, else over "
    "the batch), and the run's sampling settings from `meta.json`.",
    "config-causes": "causes from the run's configuration (`meta.json`) and its data, each "
    "an explain finding too (issue 29): `micro-batch-mismatch` (verl, on-policy by its "
    "config, `ppo_epochs` 1 and `ppo_mini_batch_size` ≥ `data.train_batch_size`, yet ρ ≠ 1 "
    "or tokens clipped, with `rollout.log_prob_micro_batch_size_per_gpu` ≠ "
    "`actor.ppo_micro_batch_size_per_gpu`: the two forward passes differ by batch shape, "
    "verl #6280, #2088, #2305), `kl-twice` (verl `use_kl_in_reward` and `actor.use_kl_loss` "
    "both true) and `reference-is-policy` (β > 0 and the KL exactly 0 at every token). "
    "The value is how many apply; any one warns (a setting to change, not a broken batch).",
    "unmasked-padding": "share of the answers (of 2+ valid tokens) that close with a run of "
    "2 or more exact 0.0 in every log-prob field present: the padding value of a file "
    "written without its mask (every token counts, lengths and KL means are diluted: 176 "
    "tokens counted instead of 112, KL mean 0.0034 instead of 0.0053 in one crafted case). "
    "A real log-prob is 0.0 only for a token of probability 1 in the model's dtype, and "
    "rarely in the trainer's and the reference's log-probs at once at the end of most "
    "answers.",
    "logp-alignment": "fails when a neighbour wins: the Pearson correlation of the trainer's "
    "log-probs (`old_logp`, else `logp`) with `rollout_logp` at the same position against "
    "the next and the previous one, within answers (every 8th answer by input row, 100 "
    "pairs at least; skipped without `rollout_logp`). Two engines scoring the same tokens "
    "agree token by token (r ≈ 1); log-probs of `logits[:, :-1]` paired with the wrong "
    "`input_ids` slice are one token off, and then a neighbour's correlation wins and every "
    "sampler-vs-trainer number compares different tokens.",
    "advantage-mean": "group-normalised advantages average 0 within each group; logged "
    "advantages that do not are mis-grouped or mis-normalised. 1e-6 leaves room for float32 "
    "storage.",
    "zero-variance-advantage": "logged advantages that are not 0 in a group whose rewards "
    "are all equal: the trainer computed its group statistics in float32, where equal "
    "rewards leave a mean off by an ulp and a std of ~1e-8 that the normalisation turns "
    "into one shared nonzero advantage (up to 0.056 in verl, 6e-4 in TRL, ±10 after "
    "OpenRLHF's reward clip); the trainer's clip metrics then count those tokens (0.230 "
    "logged where the true value is 0.117 in one measured run). `objective` notes it and "
    "uses the logged advantages, as the trainer did.",
    "logged-metrics": "with `--logged FILE` (or a recorded run's `metrics.jsonl`): the "
    "largest relative difference between a metric the trainer logged and grpo-cli's value "
    "of it (`--preset` or `--trainer` names the trainer; skipped, never passed, when nothing "
    "can be compared). Logging in float32 differs far less; 1e-3 is another formula, preset "
    "or batch.",
}

# Why each rule of grpo_cli.commands.trend.TREND_RULES (`trend --check`) is where it is.
TREND_WHY = {
    "entropy-drop": "last step's mean token entropy as a share of the first's: half gone is "
    "a policy turning deterministic; four fifths gone, it no longer explores (the usual "
    "precursor of plateaus and mode collapse)",
    "kl-growth": "last over first KL mean: tenfold is drift worth watching, a hundredfold a "
    "policy far from where it started (reward hacking, or β too small)",
    "clip-growth": "clip region share, last minus first: one token in ten more losing its "
    "gradient (steps too large, data too stale); +0.3, most of a batch learning nothing",
    "zero-variance-growth": "share of zero-variance groups, last minus first: a quarter more "
    "groups without signal (the task too easy or too hard for the policy); half, most "
    "compute spent on groups that teach nothing",
}


def _threshold(c: Any, below: bool = False) -> str:
    op = "<" if below else ">"
    parts = [
        f"{k} {op} {_num(v)}" for k, v in (("warn", c.warn), ("fail", c.fail)) if v is not None
    ]
    text = ", ".join(parts) or "-"
    if c.params:
        text += " (" + ", ".join(f"`{k}` {_num(v)}" for k, v in c.params.items()) + ")"
    if c.severity != "fail":
        text += f", at most {c.severity}"
    if not c.enabled:
        text += ", off"
    return text


def check_rules() -> str:
    """`grpo-cli check`'s rules in their order, with their default thresholds."""
    from grpo_cli.check.rules import INTEGRITY, RULES

    _same_keys("check rules (grpo_cli/check/rules.py RULES)", RULES, CHECK_WHY)
    rows = [
        (f"`{rid}`" + (" (integrity)" if rid in INTEGRITY else ""), _threshold(cfg), CHECK_WHY[rid])
        for rid, (_, cfg) in RULES.items()
    ]
    return _table(("rule", "default", "what it measures, and why this threshold"), rows)


def trend_rules() -> str:
    """`grpo-cli trend --check`'s rules with their default thresholds (a rule whose warn
    is above its fail judges a value falling below them)."""
    from grpo_cli.commands.trend import TREND_RULES

    _same_keys("trend rules (grpo_cli/commands/trend.py TREND_RULES)", TREND_RULES, TREND_WHY)
    rows = []
    for rid, (_, cfg) in TREND_RULES.items():
        below = cfg.warn is not None and cfg.fail is not None and cfg.warn > cfg.fail
        rows.append((f"`{rid}`", _threshold(cfg, below), TREND_WHY[rid]))
    return _table(("rule", "default", "what, and why this threshold"), rows)


# ------------------------------------------------------------------ presets
# The trainer configuration each preset of grpo_cli.trainers.presets.PRESETS mirrors.
PRESET_MIRRORS = {
    "deepseekmath": "the DeepSeekMath paper (Shao et al. 2024): the defaults",
    "trl": 'TRL `GRPOConfig` defaults: `scale_rewards="group"`, `loss_type="dapo"`, '
    "`beta=0.0`, `epsilon=0.2`, `use_bias_correction_kl=True`",
    "dr-grpo": 'TRL `loss_type="dr_grpo"`, `scale_rewards="none"`, '
    "`max_completion_length=512` (give yours with `--max-len`)",
    "gspo": 'TRL `importance_sampling_level="sequence"`, `epsilon=3e-4`, `epsilon_high=4e-4`, '
    '`loss_type="grpo"`',
    "verl": "verl: `adv_estimator=grpo`, `norm_adv_by_std_in_grpo=True`, "
    "`loss_agg_mode=token-mean`, `clip_ratio_c=3.0`, `use_kl_loss=True`, "
    "`kl_loss_type=low_var_kl`, `kl_loss_coef=0.001`",
    "dapo": "the DAPO recipe on verl: `clip_ratio_low=0.2`, `clip_ratio_high=0.28`, "
    "`loss_agg_mode=token-mean`, `use_kl_loss=False`, verl's vanilla loss (dual clip always "
    "on)",
    "openrlhf": "OpenRLHF defaults: `--advantage_estimator group_norm`, `--reward.clip_range "
    "-10 10`, `--algo.kl.estimator k1`, `--init_kl_coef 0.01`; its `--algo.kl.use_loss "
    "--algo.kl.estimator k3` setup is `--kl-mode loss --kl-estimator k3` (the KL loss "
    "aggregated per token whatever the policy loss)",
    "slime": "slime 624b824a argparse defaults: `--advantage-estimator grpo` (torch's unbiased "
    "std + 1e-6), `--eps-clip 0.2`, no `--eps-clip-c`, no `--use-kl-loss`, the reducer "
    "`get_sum_of_sample_mean` (a per-sample token mean, summed over the step's samples over "
    "`global_batch_size`); a dump's `args.json` gives the run's own options",
    "prime_rl": "prime-rl 559b4477 `DefaultLossConfig`: DPPO-Binary-TV masks "
    "(`dppo_mask_low=0.2`, `dppo_mask_high=0.2`), `adv_tau=1.0`, `kl_tau=1e-3`, the step's "
    "loss over its loss-token count (`rl_scale`), ρ against the sampler; `configs/trainer.json`'s "
    "`loss` section gives the run's own",
    "prime-rl": "the same as `prime_rl` (the name prime-rl's project uses)",
    "areal": "AReaL 1.0.4 `PPOActorConfig` defaults: `eps_clip=0.2`, no `c_clip`, "
    "`kl_ctl=0.1` with `kl_estimator=k1` as reward shaping, token-mean over the update "
    "(`stats_tracker`), `NormConfig`'s unbiased std and eps 1e-5 (its GRPO recipes' "
    "`adv_norm` by group)",
}
_NOT_CONVENTIONS = {"preset", "trainer", "mirrors", "origin", "folds"}


def _settings_diff(s: Any, base: Any) -> str:
    """The conventions of ``s`` that differ from ``base``, as `field value`."""
    out = []
    for f in fields(s):
        if f.name in _NOT_CONVENTIONS:
            continue
        v, b = getattr(s, f.name), getattr(base, f.name)
        if v == b:
            continue
        if f.name.endswith("_params") or f.name == "masks":
            out.append(f"{f.name} {v!r}")
        else:
            out.append(f"{f.name} {'off' if v is None else _num(v)}")
    return ", ".join(out) or "the defaults"


def presets() -> str:
    """Every named preset: its trainer and release, its conventions (where they differ
    from the defaults), the configuration it mirrors."""
    from grpo_cli.settings import Settings
    from grpo_cli.trainers.presets import PRESETS

    _same_keys("presets (grpo_cli/trainers/presets.py PRESETS)", PRESETS, PRESET_MIRRORS)
    base = Settings()
    rows = [
        (f"`{name}`", s.mirrors or "-", _settings_diff(s, base), PRESET_MIRRORS[name])
        for name, s in PRESETS.items()
    ]
    return _table(("preset", "checked on", "settings (besides the defaults)", "mirrors"), rows)


def releases() -> str:
    """Every release change point of every trainer: its preset, the releases it covers,
    the one its code was checked on, its conventions and what changed there."""
    from grpo_cli.settings import Settings
    from grpo_cli.trainers import TRAINERS
    from grpo_cli.trainers.presets import RELEASE_PRESETS

    base = Settings()
    parts = []
    for t in TRAINERS.values():
        rows = []
        for r in t.releases:
            name = f"{t.name}@{r.first}"
            span = r.first if r.first == r.last else f"{r.first} – {r.last}"
            changed = "<br>".join(_cell(c) for c in r.changes) or "-"
            rows.append((
                f"`{name}`", span, r.checked, _settings_diff(RELEASE_PRESETS[name], base),
                changed,
            ))  # fmt: skip
        parts.append(f"### {t.name}\n\n" + _table(
            ("preset", "releases", "checked on", "settings (besides the defaults)",
             "what changed at the first release (file: function: what)"),
            rows,
        ))  # fmt: skip
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the loss registry
def _params_cell(params: Iterable[tuple[str, Any, str, str]]) -> str:
    return "<br>".join(f"`{n}` = {_num(d)}: {_cell(h)}" for n, d, _, h in params) or "-"


def _metrics_cell(metrics: Iterable[tuple[str, str, str]]) -> str:
    return ", ".join(f"`{n}`" for n, _, _ in metrics) or "-"


def losses() -> str:
    """The loss registry (grpo_cli.commands.losses.registry_entries, what `grpo-cli
    losses` lists): every loss, correction and mask with its trainer and parameters."""
    from grpo_cli.commands.losses import registry_entries

    entries = registry_entries()
    kinds = {
        "loss": ("`--loss`", "aggregation forced", "metrics its trainer logs"),
        "correction": ("`--correction`",),
        "mask": ("mask",),
    }
    parts = []
    for kind, head in kinds.items():
        rows = []
        for e in entries:
            if e.kind != kind:
                continue
            row = [f"`{e.name}`", e.trainer or "all", e.words, _params_cell(e.params)]
            if kind == "loss":
                row += [e.agg or "-", _metrics_cell(e.metrics)]
            rows.append(row)
        parts.append(_table((head[0], "trainer", "what", "parameters", *head[1:]), rows))
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the command line
def _help(args: list[str]) -> str:
    from typer.testing import CliRunner

    from grpo_cli.cli import app

    r = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(HELP_WIDTH)})
    if r.exit_code != 0:
        raise DocsError(f"grpo-cli {' '.join(args)} --help: exit {r.exit_code}: {r.output}")
    return "\n".join(line.rstrip() for line in r.stdout.rstrip("\n").splitlines())


def command_names() -> list[str]:
    """The commands as the CLI registers them, in its order."""
    import typer

    from grpo_cli.cli import app

    return [
        c.name or typer.main.get_command_name(c.callback.__name__)
        for c in app.registered_commands
        if c.callback is not None and not c.hidden
    ]


def cli() -> str:
    """Every command's ``--help``, as the CLI prints it (at 80 columns)."""
    parts = ["## `grpo-cli`\n\n```text\n" + _help([]) + "\n```"]
    for name in command_names():
        parts.append(f"## `grpo-cli {name}`\n\n```text\n" + _help([name]) + "\n```")
    return "\n\n".join(parts)


# ------------------------------------------------------------------ the gate's metrics
def gate_metrics() -> str:
    """What the in-training gate logs into the trainer's metrics
    (grpo_cli.integrations._gate.KEYS, its words included)."""
    from grpo_cli.integrations._gate import KEYS

    return _table(("key", "value"), ((f"`{k}`", v) for k, v in KEYS.items()))


# ------------------------------------------------------------------ limits on JSON inputs
# Why each limit of grpo_cli/io/bounded.py is there (the values are read from it).
JSON_LIMITS = {
    "MAX_DEPTH": (
        "nesting",
        "pyarrow's JSON parser recurses per level (20,000 levels: SIGSEGV), Python's raises; "
        "grpo-cli's formats nest 3",
    ),
    "MAX_LINE": (
        "a JSONL / NeMo-RL line",
        "the text of one answer is parsed whole with its arrays: memory",
    ),
    "MAX_DOCUMENT": (
        "a document or line read into Python objects",
        "`meta.json`, a metrics line, `trainer_state.json`: Python objects take ~10× their text",
    ),
}


def json_limits() -> str:
    """The bounds every JSON input passes (grpo_cli.io.bounded's ``MAX_*``), and the file
    kind it accepts."""
    from grpo_cli.io import bounded

    limits = [n for n in bounded.__all__ if n.startswith("MAX_")]
    _same_keys("limits (grpo_cli/io/bounded.py MAX_*)", limits, JSON_LIMITS)
    rows = []
    for name in JSON_LIMITS:
        what, why = JSON_LIMITS[name]
        n = getattr(bounded, name)
        value = f"{n} levels" if name == "MAX_DEPTH" else bounded.mib(n)
        rows.append((what, f"{value} (`{name}`)", why))
    rows.append((
        "the file", "a regular file", "a FIFO would block, `/dev/zero` never ends: `--logged "
        "/dev/zero` is `a device, not a regular file`, at once",
    ))  # fmt: skip
    return _table(("limit", "value", "why"), rows)


# ------------------------------------------------------------------ quantile histograms
def _e(x: float, keep: bool = False) -> str:
    """``1e-4`` for 0.0001 (no padded exponent; ``keep``: ``5.0e-5``, its digit kept)."""
    m, e = f"{x:.1e}".split("e")
    return f"{m if keep else m.rstrip('0').rstrip('.')}e{int(e)}"


def _range(lo: float, hi: float) -> str:
    return f"[{lo:g}, {hi:g})".replace("-", "−")


def histograms() -> str:
    """The fixed histograms behind streamed quantiles (grpo_cli/fold/parts.py's ``*_BINS``)
    and the largest error of a quantile read from each: half a bin."""
    import math

    from grpo_cli.fold.parts import ANSWER_BINS, ENTROPY_BINS, LOG_RATIO_BINS

    def bins(lo: float, hi: float, n: int) -> tuple[str, float]:
        return f"{n:,} bins of width {_e((hi - lo) / n)} on {_range(lo, hi)}", (hi - lo) / n / 2

    ratio, h = bins(*LOG_RATIO_BINS)
    answer, ha = bins(*ANSWER_BINS)
    entropy, he = bins(*ENTROPY_BINS)
    rows = [
        ("ratio ρ", f"log-ratio Δ in {ratio}",
         f"relative: |ρ̂/ρ − 1| ≤ e^({_e(h)}) − 1 ≈ {_e(math.expm1(h), keep=True)}"),
        ("per-token KL", "d = ref_logp − logp, same bins; KL = f(d)",
         f"|f(d ± {_e(h)}) − f(d)|: for k3 about {_e(h)}·|e^d − 1|"),
        ("per-answer mean KL", answer, f"absolute {_e(ha)}"),
        ("per-token entropy", entropy, f"absolute {_e(he)}"),
        ("lengths", "exact integer counts", "exact"),
    ]  # fmt: skip
    return _table(("distribution", "histogram", "maximum error of a reported quantile"), rows)


# ------------------------------------------------------------------ the version
def _version() -> str:
    from grpo_cli._version import __version__

    return __version__


def version_example() -> str:
    """What ``grpo-cli --version`` prints, with the version of ``grpo_cli/_version.py`` (the
    one place it is written) and the kernel an x86-64 machine with AVX2 runs."""
    return f"```console\n$ grpo-cli --version\ngrpo-cli {_version()} (token kernel: c+avx2)\n```"


def pre_commit_config() -> str:
    """A ``.pre-commit-config.yaml`` using the hook, at this version's tag."""
    return "\n".join((
        "```yaml",
        "repos:",
        "  - repo: https://github.com/grpo-cli/grpo-cli",
        f"    rev: v{_version()}",
        "    hooks:",
        "      - id: grpo-check",
        "        files: ^rollouts/.*\\.parquet$",
        "        # args: [--rule, kl-mean.fail=0.5]",
        "```",
    ))  # fmt: skip


TABLES: dict[str, Callable[[], str]] = {
    "check-rules": check_rules,
    "trend-rules": trend_rules,
    "presets": presets,
    "releases": releases,
    "losses": losses,
    "cli": cli,
    "gate-metrics": gate_metrics,
    "json-limits": json_limits,
    "histograms": histograms,
    "version": version_example,
    "pre-commit-config": pre_commit_config,
}


def expand(markdown: str, where: str = "a page") -> str:
    """``markdown`` with every ``<!-- generated: NAME -->`` line replaced by that table."""

    def put(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise DocsError(f"{where}: no generated table {name!r} (known: {', '.join(TABLES)})")
        return TABLES[name]()

    return MARKER.sub(put, markdown)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    for arg in sys.argv[1:] or list(TABLES):
        print(TABLES[arg]())
