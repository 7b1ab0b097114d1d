"""What the one screen says of a batch, shared by the table view and the HTML report:
its objective, its health and its data as (name, value) rows, and a finding in one
line. Plain strings, no rich; numbers as :mod:`.format` writes them."""

from __future__ import annotations

from typing import Any

from ..records import Finding, ObjectiveReport
from .format import NONE, num, pct, span

__all__ = ["data_rows", "headline", "health_rows", "objective_rows"]


def objective_rows(r: ObjectiveReport) -> list[tuple[str, str]]:
    rows = [
        ("J", num(r.objective)),
        ("loss = −J", num(r.loss)),
        ("policy term", num(r.policy_term)),
        ("KL term (β·KL)", num(r.kl_term)),
    ]
    if r.gradient is not None:
        rows.append(("‖∂J/∂logp‖", num(r.gradient["norm"])))
    rows.append(("answers", num(r.answers)))
    rows.append(("tokens", num(r.tokens)))
    return rows


def health_rows(r: ObjectiveReport) -> list[tuple[str, str]]:
    s = r.settings
    unit = "answers" if r.clip.unit == "sequences" else "tokens"
    rows = [
        (f"clip region ({unit})", pct(r.clip.region)),
        ("clip low · high", f"{pct(r.clip.low)} · {pct(r.clip.high)}"),
    ]
    own = r.loss_clip
    if own is not None:  # the loss's own clip share, in their place
        rows = [("clipped by the loss", "none (no clip)" if own.share is None else pct(own.share))]
    rows += [
        ("ratio ρ p99 · max", f"{num(r.ratio.quantiles.get('p99'))} · {num(r.ratio.max)}"),
    ]
    if r.kl is not None:
        rows.append((f"KL {s.kl_estimator} mean · max", f"{num(r.kl.mean)} · {num(r.kl.max)}"))
    else:
        rows.append(("KL", f"{NONE} (no ref_logp)"))
    g = r.group_summary
    if g is not None:
        zero = f"{g.zero_variance_groups:,} ({pct(g.frac_zero_variance_groups)})"
        rows.append(("zero-variance groups", zero))
    if r.entropy is not None:
        rows.append(("entropy mean", num(r.entropy.mean)))
    if r.rollout is not None:
        rows.append(("sampler KL (k3)", num(r.rollout.kl_k3)))
    return rows


def data_rows(r: ObjectiveReport) -> list[tuple[str, str]]:
    rows = []
    g = r.group_summary
    if g is not None:
        rows.append(("groups", f"{g.groups:,} of {span(g.min_size, g.max_size)}"))
    L = r.lengths
    rows.append(("lengths", f"{num(L.min)}–{num(L.max)}"))
    rows.append(("length mean · p50", f"{num(L.mean)} · {num(L.quantiles.get('p50'))}"))
    rows.append(("advantages from", r.advantages_source))
    rows.append(("ratio ρ from", "logp only (ρ = 1)" if r.on_policy else "old_logp"))
    if r.calls is not None:
        rows.append(("loss calls", str(r.calls)))
    return rows


def headline(f: Finding) -> str:
    """A finding in one short line, from its evidence (the message is in ``--full``)."""
    e = f.evidence

    def g(key: str) -> Any:
        return e.get(key)

    try:
        if f.id == "negative-loss":
            return f"loss {num(g('loss'))} < 0: policy term > KL term (fine)"
        if f.id == "near-zero-loss":
            norm = g("gradient_norm")
            if norm is None:
                return f"J ≈ 0 ({num(g('objective'))}): A cancels in J, not in ∇J"
            if norm == 0:
                return "J ≈ 0 and ‖∂J/∂logp‖ = 0: no token moves the policy"
            return f"J ≈ 0 ({num(g('objective'))}) but ‖∂J/∂logp‖ = {num(norm, 3)}: it learns"
        if f.id == "zero-variance-groups":
            return (
                f"{g('zero_variance_groups'):,} of {g('groups'):,} groups "
                f"({pct(g('frac_zero_variance_groups'))}): equal rewards, no signal"
            )
        if f.id == "clipping":
            return (
                f"{pct(g('clip_region'))} of tokens clipped (low {pct(g('low'))}, "
                f"high {pct(g('high'))})"
            )
        if f.id == "kl-drift":
            return f"KL to the reference: mean {num(g('kl_mean'))}, max {num(g('kl_max'))}"
        if f.id == "ratio-outliers":
            return (
                f"{pct(g('outside_band_share'))} of tokens with ρ outside "
                f"[1/{num(g('band'), 6)}, {num(g('band'), 6)}], {g('overflow_tokens'):,} overflow"
            )
        if f.id == "sampler-mismatch":
            return (
                f"sampler vs trainer: mismatch KL {num(g('kl_k3'))}, "
                f"token ESS {num(g('ess_token'), 3)}"
            )
        if f.id == "length-bias":
            return f"short answers' tokens weigh {num(g('weight_ratio'), 3)}× long ones'"
        if f.id == "truncation":
            if "max_len" in e:
                at, n = g("at_max_len"), g("answers")
                return f"{at:,} answers ({pct(at / n)}) exactly --max-len {g('max_len')} long"
            at, n = g("at_longest"), g("answers")
            return f"{at:,} answers ({pct(at / n)}) at the longest length, {g('longest')}: cut?"
        if f.id == "entropy-collapse":
            return f"mean entropy {num(g('entropy_mean'), 3)} nats: nearly deterministic"
        if f.id == "residual-advantages":
            return (
                f"{g('answers'):,} answers of zero-variance groups with A ≠ 0 logged "
                f"(up to {num(g('max_abs'), 3)})"
            )
        if f.id == "logged-factor":
            return str(g("cause")["words"]).replace("logged", f"logged {g('metric')}", 1)
        if f.id == "logged-differs":
            ratio = g("cause").get("ratio")
            at = f"logged / recomputed = {num(ratio, 6)}, " if ratio is not None else ""
            return f"logged {g('metric')} ≠ recomputed: {at}no known factor"
    except (TypeError, ValueError, ZeroDivisionError):
        pass
    return f.message.split(": ", 1)[0]
