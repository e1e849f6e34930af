// @ts-check
/* The server CPU panel: polls /api/stats (fast while an answer streams or the server is busy, slow
 * when idle or the tab is hidden) and draws one bar per core, the recent total as a sparkline,
 * memory, queue depth and the image cache.
 */

import { fetchStats, StatsError } from "./api.js";
import { tr, onLanguage } from "./strings.js";
import { $, context2d, el, isNum } from "./util.js";

const HISTORY_POINTS = 60;

/** @type {ReturnType<typeof setTimeout> | undefined} */
let timer;
let inFlight = false;
/** @type {any} the last /api/stats answer */
let last = null;
let failures = 0;
let errorText = "statsUnavailable"; // the strings key of the last failure's message
let working = () => false; // whether the page is waiting for an answer (set by initCpu)
const dom = {};

/** Poll again after the right delay; `soon`: within 100 ms (state just changed). */
export function scheduleStats(soon) {
  clearTimeout(timer);
  let delay = working() || (last && last.busy) ? 500 : 2000;
  if (failures > 2) delay = 5000;
  if (document.hidden) delay = Math.max(delay, 10000);
  if (soon) delay = Math.min(delay, 100);
  timer = setTimeout(poll, delay);
}

async function poll() {
  if (inFlight) { scheduleStats(false); return; }
  inFlight = true;
  try {
    last = await fetchStats();
    failures = 0;
    dom.error.hidden = true;
    render(last);
  } catch (err) {
    failures++;
    // with VL_API_KEY set the stats need the key too: say so, rather than that they are gone
    errorText = err instanceof StatsError && err.status === 401 ? "statsNeedKey" : "statsUnavailable";
    dom.error.textContent = tr(errorText);
    dom.error.hidden = false;
  } finally {
    inFlight = false;
    scheduleStats(false);
  }
}

const pctText = (v) => `${(Math.round(v * 10) / 10).toFixed(Math.abs(v) >= 100 ? 0 : 1)}%`;

function renderBars(cores) {
  // One bar per core, rebuilt only when the core count changes.
  if (dom.bars.childElementCount !== cores.length) {
    dom.bars.textContent = "";
    cores.forEach((_, i) => {
      const row = el("div", "core-row");
      const track = el("div", "core-track");
      const bar = el("div", "core-bar");
      bar.setAttribute("role", "meter");
      bar.setAttribute("aria-valuemin", "0");
      bar.setAttribute("aria-valuemax", "100");
      track.append(bar);
      row.append(el("span", "core-label"), track, el("span", "core-value"));
      row.dataset.core = String(i);
      dom.bars.append(row);
    });
  }
  cores.forEach((raw, i) => {
    const v = Number(raw) || 0;
    const row = dom.bars.children[i];
    const bar = row.querySelector(".core-bar");
    bar.dataset.pct = String(v);
    bar.style.width = `${Math.max(0, Math.min(100, v))}%`;
    bar.setAttribute("aria-valuenow", String(v));
    bar.setAttribute("aria-label", tr("core", i));
    bar.classList.toggle("hot", v >= 85);
    row.querySelector(".core-label").textContent = tr("core", i);
    row.querySelector(".core-value").textContent = pctText(v);
  });
}

function render(s) {
  const cpu = (s && s.cpu) || {};
  renderBars(Array.isArray(cpu.per_core) ? cpu.per_core : []);
  const total = Number(cpu.total);
  dom.total.textContent = isNum(total) ? pctText(total) : "–";
  if (isNum(total)) dom.total.dataset.pct = String(total);
  drawHistory(Array.isArray(cpu.history) ? cpu.history.slice(-HISTORY_POINTS) : []);
  dom.rss.textContent = isNum(s.rss_bytes) ? `${(s.rss_bytes / 1048576).toFixed(0)} MB` : "–";
  dom.queue.textContent = isNum(s.queue_depth) ? String(s.queue_depth) : "–";
  dom.busy.textContent = typeof s.busy === "boolean" ? tr(s.busy ? "busy" : "idleServer") : "–";
  dom.busy.classList.toggle("is-busy", s.busy === true);
  dom.cache.textContent = s.cache && typeof s.cache === "object" ? tr("cacheStats", s.cache) : "–";
}

function drawHistory(points) {
  const canvas = dom.history;
  const dpr = window.devicePixelRatio || 1;
  const W = Math.round((canvas.clientWidth || 300) * dpr);
  const H = Math.round((canvas.clientHeight || 60) * dpr);
  if (canvas.width !== W || canvas.height !== H) {
    canvas.width = W;
    canvas.height = H;
  }
  const ctx = context2d(canvas);
  ctx.clearRect(0, 0, W, H);
  const styles = getComputedStyle(canvas);
  const color = (name, fallback) => styles.getPropertyValue(name).trim() || fallback;

  ctx.strokeStyle = color("--spark-grid", "rgba(128,128,128,0.25)");
  ctx.lineWidth = 1;
  for (const frac of [0.25, 0.5, 0.75]) {
    const y = Math.round(H * frac) + 0.5;
    ctx.beginPath();
    ctx.moveTo(0, y);
    ctx.lineTo(W, y);
    ctx.stroke();
  }
  const vals = points.map((p) => (Array.isArray(p) ? Number(p[1]) : Number(p))).filter((v) => Number.isFinite(v));
  if (vals.length < 2) return;
  const step = W / (HISTORY_POINTS - 1);
  const x0 = W - (vals.length - 1) * step;
  const yOf = (v) => H - (Math.max(0, Math.min(100, v)) / 100) * (H - 2 * dpr) - dpr;
  ctx.beginPath();
  vals.forEach((v, i) => {
    if (i === 0) ctx.moveTo(x0, yOf(v)); else ctx.lineTo(x0 + i * step, yOf(v));
  });
  ctx.lineWidth = 1.5 * dpr;
  ctx.strokeStyle = color("--spark-line", "#2f5fd0");
  ctx.stroke();
  ctx.lineTo(W, H);
  ctx.lineTo(x0, H);
  ctx.closePath();
  ctx.fillStyle = color("--spark-fill", "rgba(47,95,208,0.15)");
  ctx.fill();
}

/** Start polling; `isWorking()` says whether an answer is on its way (poll faster then). */
export function initCpu(isWorking) {
  working = isWorking;
  Object.assign(dom, {
    bars: $("#core-bars"),
    total: $("#cpu-total"),
    history: $("#cpu-history"),
    rss: $("#stat-rss"),
    queue: $("#stat-queue"),
    busy: $("#stat-busy"),
    cache: $("#stat-cache"),
    error: $("#stats-error"),
  });
  document.addEventListener("visibilitychange", () => scheduleStats(!document.hidden));
  window.addEventListener("resize", () => { if (last) render(last); });
  onLanguage(() => {
    if (last) render(last);
    if (!dom.error.hidden) dom.error.textContent = tr(errorText);
  });
  poll();
}
