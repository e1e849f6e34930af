// @ts-check
/* Per-stage timings of an answer (the `timings` object the server sends with usage): a full
 * breakdown in the "Last answer" card and a one-line summary under each answer bubble.
 */

import { table, onLanguage } from "./strings.js";
import { $, el, fmtMs, isNum } from "./util.js";

const FIELDS = [
  ["queue_ms", "ms"],
  ["image_decode_ms", "ms"],
  ["preprocess_ms", "ms"],
  ["vision_encode_ms", "ms"],
  ["image_tokens", "n"],
  ["video_decode_ms", "ms"],
  ["video_preprocess_ms", "ms"],
  ["video_frames", "n"],
  ["video_tokens", "n"],
  ["prompt_ms", "ms"],
  ["prompt_n", "n"],
  ["predicted_ms", "ms"],
  ["predicted_n", "n"],
  ["predicted_per_second", "rate"],
  ["total_ms", "ms"],
];

/** @type {Record<string, any> | null} the last answer's timings */
let last = null;
const dom = {};

function fillFull(box, t) {
  const L = table().t;
  box.textContent = "";
  for (const [key, kind] of FIELDS) {
    if (!isNum(t[key])) continue;
    let value;
    if (kind === "ms") value = fmtMs(t[key]);
    else if (kind === "rate") value = `${t[key].toFixed(1)} ${L.tokPerSec}`;
    else value = String(t[key]);
    const row = el("div", `t-row t-${key}`);
    row.dataset.key = key;
    row.append(el("span", "t-label", L[key]), document.createTextNode(" "), el("span", "t-value", value));
    box.append(row);
  }
  if (t.vision_cache_hit === true) {
    const badge = el("div", "t-row t-vision_cache_hit", L.cacheHit);
    badge.dataset.key = "vision_cache_hit";
    box.append(badge);
  }
}

/** The compact summary of `t` into `box` (under an answer). */
export function fillCompact(box, t) {
  const L = table().t;
  box.textContent = "";
  const add = (key, text) => {
    const span = el("span", `t-item t-${key}`, text);
    span.dataset.key = key;
    box.append(span);
  };
  if (isNum(t.total_ms)) add("total_ms", L.cTotal(fmtMs(t.total_ms)));
  if (isNum(t.vision_encode_ms) && t.vision_encode_ms > 0) add("vision_encode_ms", L.cVision(fmtMs(t.vision_encode_ms)));
  if (isNum(t.prompt_ms)) add("prompt_ms", L.cPrefill(fmtMs(t.prompt_ms)));
  const rate = isNum(t.predicted_per_second) ? t.predicted_per_second.toFixed(1) : null;
  if (isNum(t.predicted_n)) add("predicted_n", L.cTokens(t.predicted_n, rate));
  else if (rate) add("predicted_per_second", L.cRate(rate));
  if (t.vision_cache_hit === true) add("vision_cache_hit", L.cacheHit);
}

/** Show `t` (or nothing, for null) in the "Last answer" card. */
export function showLatest(t) {
  last = t;
  render();
}

function render() {
  const box = dom.timings;
  box.dataset.cacheHit = last && last.vision_cache_hit === true ? "true" : "false";
  box.hidden = !last;
  dom.card.hidden = !last;
  if (last) fillFull(box, last);
  else box.textContent = "";
}

export function initTimings() {
  dom.timings = $("#timings");
  dom.card = $("#timings-card");
  onLanguage(render);
}
