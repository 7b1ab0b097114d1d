"""The page of a run (``report RUN --html``, ``check RUN --report-html``) and the
explorer part of a step's report: one self-contained HTML file, its data one embedded
JSON document (``<script type=application/json id=page-data>``), its CSS and script
inline, nothing fetched.

Every number the page shows is in that document, computed by
:mod:`grpo_cli.commands.run_page` from the fold's own per-token terms; the script draws
them (the trend panels, the group, the token layers, the prompt across steps) and computes
one thing itself: the counterfactual states of the shown tokens when ε, the IS cap or
the rejection threshold is moved (the PPO clip, the TIS cap and a token-level rejection
on the sampler ratio, from each token's log ρ, advantage and sampler gap), which
tests/test_run_html.py checks against the Python fold at one setting.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

__all__ = ["EXPLORER_CSS", "explorer", "page_json", "render_run_html"]

EXPLORER_CSS = """
.xp{--fg:#1d2430;--mute:#5c6675;--line:#d9dee5;--panel:#f6f8fa;--ok:#2f7d4f;--warn:#b7791f;
--fail:#c0392b;--accent:#30638e}
.xp .bar{display:flex;flex-wrap:wrap;gap:8px 16px;align-items:center;margin:8px 0}
.xp select,.xp button{font:inherit;padding:2px 6px}
.xp .panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(250px,1fr));gap:8px}
.xp .panels svg{width:100%;height:auto;background:#fff;border:1px solid var(--line);
cursor:pointer}
.xp svg text{font:10px system-ui,sans-serif;fill:var(--mute)}
.xp .strip{display:flex;gap:1px;flex-wrap:wrap;margin:6px 0}
.xp .strip span{width:10px;height:16px;background:var(--ok);cursor:pointer;opacity:.75}
.xp .strip span.f{background:var(--fail)}.xp .strip span.w{background:var(--warn)}
.xp .strip span.sel{outline:2px solid var(--fg);opacity:1}
.xp .gtabs button{margin:0 4px 4px 0;border:1px solid var(--line);background:var(--panel);
border-radius:4px;cursor:pointer}.xp .gtabs button.sel{border-color:var(--accent);
background:#e3edf6}
.xp .answers{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));gap:8px}
.xp .ans{border:1px solid var(--line);border-radius:6px;padding:6px 8px;background:#fff;
min-width:0}
.xp .ans.nograd{background:var(--panel)}
.xp .ans h4{margin:0 0 4px;font-size:12px}.xp .ans .kv{font-size:12px;width:100%}
.xp .ans .kv td{padding:0;border:0}.xp .ans .kv td.v{text-align:right}
.xp .why{font-size:12px;color:var(--mute);margin:4px 0}
.xp .toks{font:12px/1.9 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;
word-break:break-word;background:var(--panel);padding:6px;border-radius:4px;margin-top:4px;
max-height:320px;overflow:auto}
.xp .toks span{border-radius:2px;cursor:default}
.xp .toks span.flip{outline:2px solid #111;outline-offset:-1px}
.xp .legend{display:flex;flex-wrap:wrap;gap:4px 12px;font-size:12px;align-items:center}
.xp .legend i{display:inline-block;width:14px;height:12px;border-radius:2px;
vertical-align:-2px;margin-right:3px;border:1px solid var(--line)}
.xp .ramp{width:160px;height:12px;border:1px solid var(--line);display:inline-block;
vertical-align:-2px}
.xp #hover{font:12px ui-monospace,Menlo,monospace;min-height:18px;color:var(--fg)}
.xp .sliders label{display:inline-block;margin-right:18px;font-size:13px}
.xp .sliders input[type=range]{vertical-align:middle;width:150px}
.xp .cf{font-size:13px;margin:6px 0}
.xp .cfbox{border:1px solid var(--line);border-radius:6px;padding:4px 10px;margin:8px 0;background:var(--panel)}
.xp .cfbox h3{margin:4px 0;font-size:13px}
.xp .badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:11px;color:#fff;
font-weight:600}.xp .b-ok{background:var(--ok)}.xp .b-fail{background:var(--fail)}
.xp .b-warn{background:var(--warn)}.xp .b-mute{background:var(--mute)}
.xp .note{font-size:12px;color:var(--mute)}
.xp .rules{margin:8px 0}.xp .rules table{font-size:12px}
@media (max-width:860px){.xp .answers{grid-template-columns:1fr 1fr}
.xp .panels{grid-template-columns:1fr 1fr}}
"""

JS = r"""
(function(){
'use strict';
const D = JSON.parse(document.getElementById('page-data').textContent);
const $ = (s, r) => (r || document).querySelector(s);
const el = (tag, attrs, text) => { const e = document.createElement(tag);
  for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text; return e; };
const fmt = v => v === null || v === undefined ? 'null' :
  (Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0)) ? v.toExponential(3) :
  String(Math.round(v * 1e4) / 1e4);
const STATE_COLOURS = ['#2a6fb0','#d1495b','#7b2cbf','#e07a1f','#8d6e63','#f2c14e',
  '#00a6a6','#111111','#66a182','#9aa4b1','#c9a227'];
const LAYERS = {
  lr: {name: 'log ρ', words: 'log ρ = logp − old_logp', signed: true},
  gap: {name: 'sampler gap δ', words: 'δ = old_logp − rollout_logp', signed: true},
  kl: {name: 'KL to ref', words: 'the KL estimate of logp against ref_logp', signed: false},
  ent: {name: 'entropy', words: 'the recorded per-token entropy', signed: false},
  share: {name: 'gradient share', words: "the token's share of ‖∂J/∂logp‖² under the run's loss (log scale, 3 decades)", signed: false, log: true},
  state: {name: 'state', words: 'clipped, capped, masked or rejected, by mechanism', state: true},
};
const S = {step: 0, group: 0, layer: 'state', cf: null};
const steps = D.steps;

function stepRowByNum(num) {
  return D.trend ? D.trend.rows.find(r => r.step === num) : null; }

// ------------------------------------------------------------------ trend panels
function drawPanels() {
  const box = $('#panels'); if (!box || !D.trend) return;
  box.textContent = '';
  const rows = D.trend.rows, nums = rows.map(r => r.step);
  const s0 = Math.min(...nums), s1 = Math.max(...nums);
  const W = 300, H = 150, pl = 50, pr = 8, pt = 16, pb = 20;
  const X = s => pl + (s - s0) / ((s1 - s0) || 1) * (W - pl - pr);
  for (const p of D.trend.panels) {
    const pts = rows.filter(r => r[p.key] !== null && r[p.key] !== undefined);
    if (!pts.length) continue;
    const vals = pts.map(r => r[p.key]);
    let lo = Math.min(...vals), hi = Math.max(...vals);
    for (const t of [p.warn, p.fail]) if (t !== null && t <= 3 * Math.max(hi, 1e-12)) {
      lo = Math.min(lo, t); hi = Math.max(hi, t); }
    const span = (hi - lo) || Math.abs(hi) || 1; const nonneg = lo >= 0;
    lo -= 0.08 * span; hi += 0.08 * span; if (nonneg) lo = Math.max(lo, 0);
    const Y = v => pt + (1 - (v - lo) / (hi - lo)) * (H - pt - pb);
    const NS = 'http://www.w3.org/2000/svg';
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('viewBox', `0 0 ${W} ${H}`); svg.dataset.key = p.key;
    const add = (tag, a, text) => { const e = document.createElementNS(NS, tag);
      for (const k in a) e.setAttribute(k, a[k]); if (text !== undefined) e.textContent = text;
      svg.appendChild(e); return e; };
    add('text', {x: W / 2, y: 11, 'text-anchor': 'middle', 'font-weight': 600}, p.title);
    add('rect', {x: pl, y: pt, width: W - pl - pr, height: H - pt - pb, fill: 'none', stroke: '#9aa4b1'});
    [[p.warn, '#b7791f', 'warn'], [p.fail, '#c0392b', 'fail']].forEach(([t, c, n]) => {
      if (t === null || t < lo || t > hi) return;
      add('line', {x1: pl, x2: W - pr, y1: Y(t), y2: Y(t), stroke: c, 'stroke-dasharray': '4 3', class: 'threshold'});
      add('text', {x: W - pr - 3, y: Y(t) - 2, fill: c, 'text-anchor': 'end'}, `${p.rule} ${n} ${fmt(t)}`);
    });
    const at_step = {};  // step -> [[rule, fails?]]: one line and one label a step
    for (const rid in p.first) { const f = p.first[rid]; if (!f) continue;
      const at = f.fail !== null ? f.fail : f.warn; if (at === null) continue;
      (at_step[at] = at_step[at] || []).push([rid, f.fail !== null]); }
    let k = 0;
    for (const at in at_step) { const marks = at_step[at], x = X(+at);
      const c = marks.some(m => m[1]) ? '#c0392b' : '#b7791f';
      marks.forEach(([rid]) => add('line', {x1: x, x2: x, y1: pt, y2: H - pb, stroke: c, 'stroke-width': 1.5, class: 'first-bad', 'data-rule': rid, 'data-step': at}));
      const right = x > (pl + W - pr) / 2;
      add('text', {x: x + (right ? -3 : 3), y: pt + 22 + 11 * k++, fill: c, 'text-anchor': right ? 'end' : 'start'},
        marks.map(([rid, f]) => `${rid} ${f ? 'fails' : 'warns'}`).join(', ') + ` @${at}`);
    }
    add('polyline', {points: pts.map(r => `${X(r.step).toFixed(1)},${Y(r[p.key]).toFixed(1)}`).join(' '), fill: 'none', stroke: '#30638e', 'stroke-width': 1.6});
    const verdict = {}; if (D.trend.steps) D.trend.steps.forEach(v => { verdict[v.step] = v.passed ? (v.bad.length ? '#b7791f' : '#2f7d4f') : '#c0392b'; });
    pts.forEach(r => add('circle', {cx: X(r.step).toFixed(1), cy: Y(r[p.key]).toFixed(1), r: rows.length > 40 ? 1.6 : 2.6, fill: verdict[r.step] || '#30638e'}));
    add('text', {x: pl - 3, y: pt + 8, 'text-anchor': 'end'}, fmt(hi));
    add('text', {x: pl - 3, y: H - pb, 'text-anchor': 'end'}, fmt(lo));
    add('text', {x: pl, y: H - 5}, String(s0));
    add('text', {x: W - pr, y: H - 5, 'text-anchor': 'end'}, String(s1));
    const cur = steps[S.step] && steps[S.step].step;
    if (cur !== null && cur !== undefined) add('line', {x1: X(cur), x2: X(cur), y1: pt, y2: H - pb, stroke: '#1d2430', 'stroke-opacity': .5, class: 'cursor'});
    svg.addEventListener('click', ev => { const r = svg.getBoundingClientRect();
      const x = (ev.clientX - r.left) / r.width * W;
      const s = s0 + (x - pl) / (W - pl - pr) * (s1 - s0);
      let best = 0; steps.forEach((st, i) => { if (Math.abs(st.step - s) < Math.abs(steps[best].step - s)) best = i; });
      pickStep(best); });
    box.appendChild(svg);
  }
}

function drawRules() {
  const box = $('#rules'); if (!box || !D.trend) return; box.textContent = '';
  const order = {fail: 0, warn: 1, pass: 2, skip: 3};
  const rules = D.trend.rules.filter(r => r.status !== 'skip').sort((a, b) => order[a.status] - order[b.status]);
  const t = el('table'); const h = el('tr');
  ['', 'rule', 'first warns at', 'first fails at', ''].forEach(x => h.appendChild(el('th', {}, x))); t.appendChild(h);
  const jump = at => { const a = el('a', {href: '#explorer', 'data-step': at}, 'step ' + at);
    a.addEventListener('click', ev => { ev.preventDefault(); const i = steps.findIndex(s => s.step === at); if (i >= 0) pickStep(i); });
    return a; };
  rules.forEach(r => { const tr = el('tr', {'data-rule': r.rule});
    const b = el('td'); b.appendChild(el('span', {class: 'badge ' + ({fail: 'b-fail', warn: 'b-warn', pass: 'b-ok'}[r.status] || 'b-mute')}, r.status.toUpperCase())); tr.appendChild(b);
    tr.appendChild(el('td', {}, r.rule));
    for (const k of ['warn', 'fail']) { const td = el('td'); const at = r.first ? r.first[k] : null;
      if (at !== null && at !== undefined) td.appendChild(jump(at)); else td.textContent = '—'; tr.appendChild(td); }
    tr.appendChild(el('td', {class: 'note'}, r.message.length > 140 ? r.message.slice(0, 140) + '…' : r.message));
    t.appendChild(tr); });
  box.appendChild(t);
}

function drawStrip() {
  const box = $('#strip'); if (!box || !D.trend) return; box.textContent = '';
  D.trend.steps.forEach(v => { const i = steps.findIndex(s => s.step === v.step);
    const c = el('span', {title: `step ${v.step}: ${v.passed ? (v.bad.length ? 'warns: ' + v.bad.join(', ') : 'passes') : 'fails: ' + v.failing.join(', ')}`});
    c.className = (v.passed ? (v.bad.length ? 'w' : '') : 'f') + (i === S.step ? ' sel' : '');
    if (i >= 0) c.addEventListener('click', () => pickStep(i));
    box.appendChild(c); });
}

// ------------------------------------------------------------------ the group
function colour(layer, v, top) {
  if (v === null || v === undefined || !(top > 0)) return 'transparent';
  const L = LAYERS[layer];
  let a;
  if (L.log) { a = v > top * 1e-3 ? 0.08 + 0.77 * Math.log10(v / (top * 1e-3)) / 3 : 0; }
  else a = Math.min(1, Math.abs(v) / top) * 0.85;
  if (L.signed) return v >= 0 ? `rgba(192,57,43,${a.toFixed(3)})` : `rgba(48,99,142,${a.toFixed(3)})`;
  return `rgba(123,44,191,${a.toFixed(3)})`;
}
function stateNames(bits) { return D.states.filter(s => bits & s.bit).map(s => s.name); }
function stateColour(bits) { const k = D.states.findIndex(s => bits & s.bit);
  return k < 0 ? 'transparent' : STATE_COLOURS[k % STATE_COLOURS.length]; }

function layerTop(group, layer) {
  let top = 0;
  for (const a of group.answers) { const v = a.layers && a.layers[layer];
    if (v) for (const x of v) if (x !== null) top = Math.max(top, Math.abs(x)); }
  return top;
}

function drawGroup() {
  const st = steps[S.step], box = $('#group'); box.textContent = '';
  const tabs = $('#gtabs'); tabs.textContent = '';
  if (!st.groups.length) { box.appendChild(el('p', {class: 'note', id: 'no-groups'}, st.error ? 'This step cannot be shown: ' + st.error : 'No group with tokens in this step.')); drawLegend(0); return; }
  st.groups.forEach((g, i) => { const b = el('button', {type: 'button', 'data-group': i},
    `${g.key || 'answers'}${g.zero_variance ? ' · zero variance' : ''}`);
    if (i === S.group) b.className = 'sel';
    b.addEventListener('click', () => { S.group = i; drawGroup(); drawPrompt(); recompute(); });
    tabs.appendChild(b); });
  const g = st.groups[S.group];
  const head = el('div', {class: 'bar', id: 'group-head'});
  head.appendChild(el('b', {}, `group ${g.key}`));
  head.appendChild(el('span', {}, `${g.size} answers · reward mean ${fmt(g.mean)} · std ${fmt(g.std)} (${g.stats})`));
  if (g.zero_variance) { const z = el('span', {class: 'badge b-warn', id: 'zero-var'}, 'ZERO VARIANCE: no answer carries gradient from its advantage'); head.appendChild(z); }
  box.appendChild(head);
  if (g.prompt) { const p = el('div', {class: 'note'}, 'prompt: ' + g.prompt); box.appendChild(p); }
  const grid = el('div', {class: 'answers'});
  const top = S.layer === 'state' ? 1 : layerTop(g, S.layer);
  g.answers.forEach((a, i) => grid.appendChild(answerCard(a, i, top)));
  box.appendChild(grid);
  drawLegend(top);
}

function answerCard(a, i, top) {
  const card = el('div', {class: 'ans' + (a.carries ? '' : ' nograd'), 'data-row': a.row});
  card.appendChild(el('h4', {}, `row ${a.row}`));
  const kv = el('table', {class: 'kv'});
  const fin = a.finished === null ? 'unknown' : (a.finished ? 'finished' : 'truncated');
  [['reward', fmt(a.reward)], ['advantage A', fmt(a.adv)], ['length', String(a.length)],
   ['end', fin], ['gradient share', fmt(a.share)], ['|log ρ| max', fmt(a.lr_max)]].forEach(([k, v]) => {
    const tr = el('tr'); tr.appendChild(el('td', {}, k)); tr.appendChild(el('td', {class: 'v'}, v)); kv.appendChild(tr); });
  card.appendChild(kv);
  card.appendChild(el('span', {class: 'badge ' + (a.carries ? 'b-ok' : 'b-mute')}, a.carries ? 'carries gradient' : 'no gradient'));
  card.appendChild(el('div', {class: 'why'}, a.why));
  const toks = el('div', {class: 'toks', 'data-answer': i});
  const L = a.layers;
  if (!L) { toks.textContent = a.text || '(no tokens carried)'; card.appendChild(toks); return card; }
  for (let t = 0; t < a.shown; t++) {
    const s = el('span', {'data-t': t}, a.toks ? a.toks[t] : '·');
    const bits = L.state ? L.state[t] : 0;
    const cfb = S.cf ? S.cf[i][t] : bits;
    if (S.layer === 'state') s.style.background = stateColour(S.cf ? cfb : bits);
    else s.style.background = colour(S.layer, L[S.layer] ? L[S.layer][t] : null, top);
    if (S.cf && cfb !== bits) s.className = 'flip';
    s.addEventListener('mouseover', () => hover(a, t, cfb));
    toks.appendChild(s);
  }
  if (a.length > a.shown) toks.appendChild(el('span', {class: 'note'}, ` … ${a.length - a.shown} more tokens not carried`));
  card.appendChild(toks);
  return card;
}

function hover(a, t, cfb) {
  const L = a.layers, parts = [`row ${a.row} token ${t}` + (a.toks ? ` ${JSON.stringify(a.toks[t])}` : '')];
  for (const k of ['lr', 'gap', 'kl', 'ent', 'share']) if (L[k]) parts.push(`${LAYERS[k].name} ${fmt(L[k][t])}`);
  const bits = L.state ? L.state[t] : 0;
  parts.push('state ' + (stateNames(bits).join('+') || 'in the gradient'));
  if (S.cf && cfb !== bits) parts.push('→ ' + (stateNames(cfb).join('+') || 'in the gradient'));
  $('#hover').textContent = parts.join(' · ');
}

function drawLegend(top) {
  const box = $('#legend'); box.textContent = '';
  const L = LAYERS[S.layer];
  box.appendChild(el('b', {}, L.name + ': '));
  box.appendChild(el('span', {}, L.words));
  if (L.state) { D.states.forEach((s, k) => { const w = el('span', {title: s.words});
      const sw = el('i'); sw.style.background = STATE_COLOURS[k % STATE_COLOURS.length]; w.appendChild(sw);
      w.appendChild(document.createTextNode(s.name)); box.appendChild(w); });
    const n = el('span'); const sw = el('i'); sw.style.background = 'transparent'; n.appendChild(sw);
    n.appendChild(document.createTextNode('in the gradient')); box.appendChild(n);
    return; }
  const ramp = el('span', {class: 'ramp'});
  ramp.style.background = L.signed ? 'linear-gradient(90deg,rgba(48,99,142,.85),#fff,rgba(192,57,43,.85))' : 'linear-gradient(90deg,#fff,rgba(123,44,191,.85))';
  box.appendChild(el('span', {}, L.signed ? fmt(-top) : (L.log ? fmt(top * 1e-3) : '0')));
  box.appendChild(ramp); box.appendChild(el('span', {}, fmt(top)));
  if (!(top > 0)) box.appendChild(el('span', {class: 'note'}, '(not recorded for this group)'));
}

// ------------------------------------------------------------------ prompt across steps
function drawPrompt() {
  const box = $('#prompt'); if (!box) return; box.textContent = '';
  const g = steps[S.step].groups[S.group];
  const key = g && g.answers.length ? g.answers[0].prompt_key : null;
  const hist = key ? D.prompts[key] : null;
  if (!hist) { box.appendChild(el('p', {class: 'note'}, key ? 'This prompt is seen at one step only.' : 'The run records no prompt id or text: a prompt cannot be followed across steps.')); return; }
  box.appendChild(el('div', {class: 'note'}, `prompt ${key}: seen at ${hist.length} steps`));
  const t = el('table', {id: 'prompt-table'});
  const h = el('tr'); ['step', 'rewards', 'advantages', 'mean sampler gap δ'].forEach(x => h.appendChild(el('th', {}, x))); t.appendChild(h);
  hist.forEach(r => { const tr = el('tr'); if (r.step === steps[S.step].step) tr.style.fontWeight = 600;
    [String(r.step), r.rewards.map(fmt).join(' '), r.advs.map(fmt).join(' '), fmt(r.gap)].forEach(x => tr.appendChild(el('td', {}, x)));
    t.appendChild(tr); });
  box.appendChild(t);
}

// ------------------------------------------------------------------ counterfactuals
function counterfactual(eps, cap, thr) {
  // the shown tokens' states at ε (ε_high scaled as recorded), an IS cap and a token
  // rejection threshold; only the PPO clip, TIS cap and rejection bits are recomputed
  const s = D.settings, st = steps[S.step], g = st.groups[S.group];
  if (!g) return [];
  const ratio = s.eps_high / s.clip_eps, lo = 1 - eps, hi = 1 + eps * ratio;
  const B = Object.fromEntries(D.states.map(x => [x.name, x.bit]));
  return g.answers.map(a => { const L = a.layers; if (!L || !L.state) return [];
    return L.state.map((bits, t) => {
      let out = bits;
      if (s.core_loss) {
        out &= ~(B['clip-low'] | B['clip-high']);
        const rho = Math.exp(L.lr[t]), A = L.adv ? L.adv[t] : a.adv;
        if (A < 0 && rho < lo) out |= B['clip-low'];
        if (A > 0 && rho > hi) out |= B['clip-high'];
      }
      if (L.gap && cap !== undefined) { out &= ~B['tis-cap'];
        if (cap !== null && Math.exp(L.gap[t]) > cap && !(out & B['rejected'])) out |= B['tis-cap']; }
      if (L.gap && thr !== undefined) { out &= ~B['rejected'];
        if (thr !== null && Math.abs(L.gap[t]) > Math.log(thr)) { out |= B['rejected']; out &= ~B['tis-cap']; } }
      return out;
    }); });
}

function sliderValues() {
  // ε; the IS cap and the rejection threshold (null: off, at the slider's end;
  // undefined: where the run has it, the fold's own states kept)
  const s = D.settings, e = parseFloat($('#cf-eps').value);
  const read = (id, rec) => { const x = $(id);
    const v = x.value === x.max ? null : parseFloat(x.value);
    return x.dataset.start === x.value ? undefined : v; };
  return [e, read('#cf-cap', s.is_cap), read('#cf-rs', s.rs_threshold)];
}

function recompute() {
  const [e, c, r] = sliderValues();
  $('#cf-eps-v').textContent = e.toFixed(3);
  const shown = (id, v) => { const x = $(id); return x.value === x.max ? 'off' : parseFloat(x.value).toFixed(2) + (v === undefined ? ' (as run)' : ''); };
  $('#cf-cap-v').textContent = shown('#cf-cap', c);
  $('#cf-rs-v').textContent = shown('#cf-rs', r);
  const s = D.settings;
  const atRecorded = Math.abs(e - s.clip_eps) < 1e-12 && c === undefined && r === undefined;
  S.cf = atRecorded ? null : counterfactual(e, c, r);
  drawGroup();
  summary();
}

function summary() {
  const g = steps[S.step].groups[S.group], box = $('#cf-out');
  if (!g) { box.textContent = ''; return; }
  const out = S.cf || counterfactual(...sliderValues());
  const clipBits = D.states.filter(x => x.name.startsWith('clip')).reduce((a, x) => a | x.bit, 0);
  const off = D.states.filter(x => !['truncated'].includes(x.name)).reduce((a, x) => a | x.bit, 0);
  let n = 0, c0 = 0, c1 = 0, flips = 0, lost = 0, total = 0;
  g.answers.forEach((a, i) => { const L = a.layers; if (!L || !L.state) return;
    L.state.forEach((b, t) => { n++; const nb = out[i][t];
      if (b & clipBits) c0++; if (nb & clipBits) c1++;
      const sh = L.share ? (L.share[t] || 0) : 0; total += sh;
      if (nb !== b) { flips++; if ((nb & off) && !(b & off)) lost += sh; } }); });
  box.textContent = `${flips} of ${n} shown tokens change state · clip share of the shown tokens ${(c0 / Math.max(n, 1) * 100).toFixed(1)}% → ${(c1 / Math.max(n, 1) * 100).toFixed(1)}% · gradient share leaving with the tokens that leave the gradient: ${(lost / Math.max(total, 1e-300) * 100).toFixed(1)}% of the shown tokens' share`;
  box.dataset.flips = flips;
}

function pickStep(i) {
  S.step = i; S.group = 0; $('#step-picker').value = String(i);
  $('#step-title').textContent = `step ${steps[i].step === null ? steps[i].name : steps[i].step} · ${steps[i].answers} answers · ${steps[i].tokens} tokens` + (steps[i].zero_variance_groups !== null ? ` · ${steps[i].zero_variance_groups} of ${steps[i].groups_total} groups zero-variance` : '');
  drawPanels(); drawStrip(); drawPrompt(); recompute();
}

function init() {
  const pick = $('#step-picker');
  steps.forEach((s, i) => pick.appendChild(el('option', {value: String(i)}, s.step === null ? s.name : `step ${s.step}`)));
  pick.addEventListener('change', () => pickStep(parseInt(pick.value, 10)));
  $('#prev').addEventListener('click', () => pickStep(Math.max(0, S.step - 1)));
  $('#next').addEventListener('click', () => pickStep(Math.min(steps.length - 1, S.step + 1)));
  document.querySelectorAll('input[name=layer]').forEach(r => r.addEventListener('change', () => { S.layer = r.value; drawGroup(); }));
  const s = D.settings;
  $('#cf-eps').value = String(s.clip_eps);
  $('#cf-cap').value = s.is_cap === null ? $('#cf-cap').max : String(s.is_cap);
  $('#cf-rs').value = s.rs_threshold === null ? $('#cf-rs').max : String(s.rs_threshold);
  $('#cf-cap').dataset.start = $('#cf-cap').value; $('#cf-rs').dataset.start = $('#cf-rs').value;
  ['#cf-eps', '#cf-cap', '#cf-rs'].forEach(id => $(id).addEventListener('input', recompute));
  $('#cf-reset').addEventListener('click', () => { $('#cf-eps').value = String(s.clip_eps);
    $('#cf-cap').value = s.is_cap === null ? $('#cf-cap').max : String(s.is_cap);
    $('#cf-rs').value = s.rs_threshold === null ? $('#cf-rs').max : String(s.rs_threshold); recompute(); });
  let start = 0;
  if (D.trend && D.trend.first_failing_step !== null) start = Math.max(0, steps.findIndex(x => x.step === D.trend.first_failing_step));
  drawRules();
  pickStep(start);
  window.grpoPage = {data: D, state: S, pickStep, counterfactual};
}
init();
})();
"""


def page_json(page: dict[str, Any]) -> str:
    """The page's data as the document embeds it: JSON with ``<``, ``>`` and ``&``
    escaped (no ``</script>`` can end the block early)."""
    text = json.dumps(page, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _layer_radios() -> str:
    names = (("state", "state"), ("lr", "log ρ"), ("gap", "sampler gap δ"),
             ("kl", "KL to ref"), ("ent", "entropy"), ("share", "gradient share"))  # fmt: skip
    return "".join(
        f"<label><input type=radio name=layer value={k} id=layer-{k}"
        f"{' checked' if k == 'state' else ''}> {escape(t)}</label>"
        for k, t in names
    )


def explorer(page: dict[str, Any]) -> str:
    """The explorer part (step picker, trend panels, group view, token layers,
    prompt across steps, counterfactuals) with its data and script."""
    s = page["settings"]
    trend = ""
    if page.get("trend"):
        t = page["trend"]
        badge = ("<span class='badge b-ok'>PASSED</span>" if t["passed"] else
                 f"<span class='badge b-fail'>FAILED</span> first failing step "
                 f"<b id=first-failing>{escape(str(t['first_failing_step']))}</b>")  # fmt: skip
        trend = (f"<h2>The run</h2><div class=bar id=run-verdict>{badge}"
                 f"<span class=note>each step's verdict (click a step):</span></div>"
                 f"<div class=strip id=strip></div>"
                 f"<p class=note>The trend panels: check's thresholds dashed, the first step "
                 f"each rule warns or fails at marked; click a panel to pick the step.</p>"
                 f"<div class=panels id=panels></div>"
                 f"<details class=rules open><summary>Every rule: the first step it warns and "
                 f"fails at</summary><div id=rules></div></details>")  # fmt: skip
    budget = page["budget"]
    return (
        f"<section class=xp id=explorer>{trend}"
        "<h2>A step, a group, its tokens</h2>"
        "<div class=bar><label>step <select id=step-picker></select></label>"
        "<button type=button id=prev>◀</button><button type=button id=next>▶</button>"
        "<span id=step-title></span></div>"
        f"<p class=note>The groups shown per step are the worst by their largest |log ρ|, "
        f"KL or sampler gap, and one zero-variance group, within {budget['per_step']:,} "
        f"tokens a step ({budget['answer']} an answer, {budget['tokens']:,} over the page)."
        "</p><div class=gtabs id=gtabs></div>"
        f"<div class=bar>layer: {_layer_radios()}</div><div class=legend id=legend></div>"
        "<div class=cfbox id=counterfactuals>"
        "<h3>Counterfactuals</h3>"
        "<p class=note>Computed in this page from the per-token data it carries (each "
        "token's log ρ, advantage and sampler gap δ): the PPO clip at ε (ε_high scaled "
        f"as recorded, {s['eps_high']:g} / {s['clip_eps']:g}), a TIS cap on exp(δ) and "
        "a token rejection where |δ| &gt; log(threshold); the other states are the "
        "fold's, at the run's settings. Flipped tokens are outlined.</p>"
        "<div class='bar sliders'>"
        "<label>ε <input type=range id=cf-eps min=0.01 max=0.5 step=0.005> "
        "<span id=cf-eps-v></span></label>"
        "<label>IS cap <input type=range id=cf-cap min=1 max=10.5 step=0.05> "
        "<span id=cf-cap-v></span></label>"
        "<label>rejection threshold <input type=range id=cf-rs min=1.01 max=10.5 "
        "step=0.01> <span id=cf-rs-v></span></label>"
        "<button type=button id=cf-reset>reset</button></div>"
        "<div class=cf id=cf-out></div>"
        "</div><div id=hover></div><div id=group></div>"
        "<h2>The same prompt across steps</h2><div id=prompt></div>"
        f"<script type=application/json id=page-data>{page_json(page)}</script>"
        f"<script>{JS}</script></section>"
    )


def render_run_html(page: dict[str, Any], css: str) -> str:
    """The page of a run: a header, its notes, the explorer (:func:`explorer`)."""
    notes = "".join(f"<li>{escape(n)}</li>" for n in page.get("notes", []))
    s = page["settings"]
    sub = (f"loss {s['loss']} · {s['agg']} · ε {s['clip_eps']:g}/{s['eps_high']:g} · β "
           f"{s['beta']:g} · correction {s['correction']}")  # fmt: skip
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>grpo-cli run: {escape(page['title'])}</title>"
        f"<style>{css}{EXPLORER_CSS}</style></head><body><main>"
        f"<header><h1>grpo-cli run report</h1><div class=sub>{escape(page['title'])} · "
        f"{len(page['steps'])} steps · {escape(sub)}</div></header>"
        f"{explorer(page)}"
        + (f"<h2>Notes</h2><ul class=mute>{notes}</ul>" if notes else "")
        + f"<footer>grpo-cli {escape(page['version'])} · one file, no network; the data is "
        "the JSON block in this file</footer></main></body></html>\n"
    )
