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


TABLES: dict[str, Callable[[], str]] = {
    "check-rules": check_rules,
    "trend-rules": trend_rules,
    "presets": presets,
    "releases": releases,
    "losses": losses,
    "cli": cli,
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
