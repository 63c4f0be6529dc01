// searchr1 run report: the trajectory browser (this file is inlined; no network, no libraries).
"use strict";
(function () {
  const PAGE = 50;
  const ROLE_LABEL = { prompt: "prompt", generated: "generated \u00b7 trained", observation: "retrieved \u00b7 masked" };
  const dataNode = document.getElementById("report-data");
  if (!dataNode) return;
  const data = JSON.parse(dataNode.textContent);
  const all = data.trajectories || [];
  const list = document.getElementById("traj-list");
  const count = document.getElementById("traj-count");
  const more = document.getElementById("traj-more");
  const fCorrect = document.getElementById("filter-correct");
  const fSearches = document.getElementById("filter-searches");
  const fSource = document.getElementById("filter-source");
  const fText = document.getElementById("filter-text");
  const fStep = document.getElementById("filter-step");
  const fMode = document.getElementById("filter-mode");
  let matching = [];
  let shown = 0;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function addOption(select, value, label) {
    const o = el("option", null, label);
    o.value = value;
    select.appendChild(o);
  }

  function searchBucket(n) { return n >= 3 ? "3+" : String(n); }

  // filter choices come from the data itself
  [...new Set(all.map((t) => t.source))].sort().forEach((s) => addOption(fSource, s, s));
  const buckets = [...new Set(all.map((t) => searchBucket(t.searches)))].sort();
  buckets.forEach((b) => addOption(fSearches, b, b === "3+" ? "3 or more" : b));
  const steps = [...new Set(all.filter((t) => t.step !== null && t.step !== undefined).map((t) => t.step))].sort((a, b) => a - b);
  steps.forEach((s) => addOption(fStep, String(s), String(s)));
  fStep.parentElement.hidden = steps.length === 0;
  const modes = [...new Set(all.map((t) => t.mode).filter((m) => m))].sort();
  modes.forEach((m) => addOption(fMode, m, m));
  fMode.parentElement.hidden = modes.length < 2;

  function passes(t) {
    if (fCorrect.value === "correct" && !t.correct) return false;
    if (fCorrect.value === "incorrect" && t.correct) return false;
    if (fSearches.value !== "all" && searchBucket(t.searches) !== fSearches.value) return false;
    if (fSource.value !== "all" && t.source !== fSource.value) return false;
    if (fStep.value !== "all" && String(t.step) !== fStep.value) return false;
    if (fMode.value !== "all" && t.mode !== fMode.value) return false;
    const needle = fText.value.trim().toLowerCase();
    if (needle && !(t.question + " " + (t.answer || "") + " " + t.golden.join(" ")).toLowerCase().includes(needle)) return false;
    return true;
  }

  function fmt(x) { return typeof x === "number" ? x.toFixed(2) : "\u2013"; }

  function renderBody(t, body) {
    const facts = el("dl", "facts");
    const rows = [
      ["id", t.id], ["golden answers", t.golden.join(" | ")],
      ["answer", t.answer === null ? "(none)" : t.answer + (t.answer_source === "reply" ? "  (the reply itself: no <answer> tag)" : "")],
      ["scores", "EM " + fmt(t.em) + "  subEM " + fmt(t.sub_em) + "  F1 " + fmt(t.f1) + "  format " + (t.valid ? "valid" : "invalid")],
      ["turns", t.turns + " (finish: " + (t.finish || "?") + (t.truncated ? ", truncated" : "") + ")"],
      t.text_roles
        ? ["roles", "recovered from the response text (the trainer's sample log stores no token ids)"]
        : ["tokens", "prompt " + t.tokens.prompt + ", generated " + t.tokens.generated + ", retrieved " + t.tokens.observation],
    ];
    if (t.step !== null && t.step !== undefined) rows.unshift(["step", t.step]);
    if (t.mode) rows.unshift(["mode", t.mode]);
    rows.forEach(([k, v]) => { facts.appendChild(el("dt", null, k)); facts.appendChild(el("dd", null, v)); });
    body.appendChild(facts);

    const s = el("div", "searches");
    s.appendChild(el("h3", null, t.queries.length ? "Searches" : "No searches"));
    if (t.queries.length) {
      const ol = el("ol");
      t.queries.forEach((q, i) => {
        const li = el("li");
        li.appendChild(el("span", "query", q));
        const hits = (t.documents && t.documents[i]) || [];
        const ul = el("ul");
        if (!hits.length) ul.appendChild(el("li", null, "(no hits)"));
        hits.forEach((h) => {
          const item = el("li", "hit", h.title + (typeof h.score === "number" ? "  (" + h.score.toFixed(2) + ")" : ""));
          item.title = h.text || "";
          ul.appendChild(item);
        });
        li.appendChild(ul);
        ol.appendChild(li);
      });
      s.appendChild(ol);
    }
    body.appendChild(s);

    body.appendChild(el("h3", null, "Trajectory"));
    const tr = el("div", "transcript");
    t.segments.forEach(([role, text, n]) => {
      const span = el("span", "seg " + role, text);
      span.title = (ROLE_LABEL[role] || role) + (t.text_roles ? "" : ", " + n + " tokens");
      tr.appendChild(span);
    });
    body.appendChild(tr);
  }

  function card(t) {
    const d = el("details", "traj");
    d.dataset.correct = t.correct ? "1" : "0";
    d.dataset.searches = String(t.searches);
    d.dataset.source = t.source;
    if (t.mode) d.dataset.mode = t.mode;
    if (t.step !== null && t.step !== undefined) d.dataset.step = String(t.step);
    const sm = el("summary");
    sm.appendChild(el("span", "badge " + (t.correct ? "ok" : "bad"), t.correct ? "correct" : "incorrect"));
    sm.appendChild(el("span", "badge src", t.source));
    if (modes.length > 1) sm.appendChild(el("span", "badge src", t.mode));
    if (t.step !== null && t.step !== undefined) sm.appendChild(el("span", "badge src", "step " + t.step));
    sm.appendChild(el("span", "badge n", t.searches + (t.searches === 1 ? " search" : " searches")));
    sm.appendChild(el("span", "q", t.question));
    sm.appendChild(el("span", "ans", "\u2192 " + (t.answer === null ? "(no answer)" : t.answer)));
    d.appendChild(sm);
    const body = el("div", "body");
    d.appendChild(body);
    d.addEventListener("toggle", () => { if (d.open && !body.childNodes.length) renderBody(t, body); });
    return d;
  }

  function showMore() {
    const end = Math.min(matching.length, shown + PAGE);
    const frag = document.createDocumentFragment();
    for (let i = shown; i < end; i++) frag.appendChild(card(matching[i]));
    list.appendChild(frag);
    shown = end;
    more.hidden = shown >= matching.length;
    count.textContent = "showing " + shown + " of " + matching.length + " matching (" + all.length + " in total)";
  }

  function apply() {
    matching = all.filter(passes);
    list.replaceChildren();
    shown = 0;
    if (!matching.length) list.appendChild(el("p", "note", "No trajectory matches these filters."));
    showMore();
  }

  [fCorrect, fSearches, fSource, fStep, fMode].forEach((f) => f.addEventListener("change", apply));
  fText.addEventListener("input", apply);
  more.addEventListener("click", showMore);
  apply();
})();
