// @ts-check
/* The video clip: dropped, pasted or chosen through the image card (images.js hands video files
 * here). The browser plays the clip into a hidden <video>, seeks to the times the server will
 * sample (2 per second by default, an even count of at least 4, at most the server's limit) and
 * draws those frames as a strip, and estimates the video tokens with the model's own rule (one
 * size for all frames from the per-clip budget, two frames per temporal patch). The clip itself is
 * sent as it is: the server decodes it with FFmpeg and the exact counts come back in the timings.
 */

import { config } from "./api.js";
import { onLanguage, table } from "./strings.js";
import { $, context2d, el } from "./util.js";

/**
 * The chosen clip: sent as it is (dataUrl); its duration, size, sampled times and token estimate
 * once the browser has read it (duration and tokens stay null when it cannot play it).
 * @typedef {{file: File, dataUrl: string, duration: number | null, w: number, h: number, times: number[],
 *            tokens: number | null}} Clip
 */
/** @type {Clip | null} */
let clip = null;
let job = 0;
const listeners = [];
const dom = {};

const T = () => table().video;

/** The clip to send, as {url, detail}, or null. */
export function currentVideo() {
  return clip && clip.dataUrl ? { url: clip.dataUrl, detail: dom.detail.value } : null;
}

/** Call `fn` whenever a clip is chosen or removed (the presets depend on it). */
export function onVideoChange(fn) {
  listeners.push(fn);
}

function changed() {
  dom.imageEstimate.hidden = !!clip; // "no image" would be wrong beside a clip
  for (const fn of listeners) fn(!!clip);
}

function videoConfig() {
  return (config && config.video) || {};
}

// Python's round(): half to even (the processor's smart_resize uses it).
function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** How many frames the server samples from `duration` seconds (header frame count unknown here). */
export function sampledFrames(duration) {
  const v = videoConfig();
  const cap = Math.max(2, (Number(v.max_frames) || 64) - ((Number(v.max_frames) || 64) % 2));
  const n = Math.floor(duration * (Number(v.fps) || 2));
  return Math.min(Math.max(n, Number(v.min_frames) || 4), cap);
}

/** The video processor's smart_resize with the per-frame cap, for `n` frames of w x h. */
export function videoTokens(n, w, h, detail) {
  const v = videoConfig();
  const f = Number(config && config.token_factor) || 32;
  const minPixels = Number(v.min_pixels) || 4096;
  const maxPixels = Number(v.max_pixels) || 25165824;
  const frameCap = Math.min(Number(v.frame_cap_pixels) || 786432,
                            Number((v.detail_frame_pixels || {})[detail]) || 262144);
  const frames = Math.max(n, 2);
  const budget = Math.max(Math.min(frameCap, Math.floor(maxPixels / frames)), Math.floor(minPixels * 1.05)) * frames;
  if (h < f || w < f) {
    const s = Math.max(f / h, f / w);
    h = Math.floor(h * s);
    w = Math.floor(w * s);
  }
  let hb = roundHalfEven(h / f) * f;
  let wb = roundHalfEven(w / f) * f;
  const tb = roundHalfEven(frames / 2) * 2;
  if (tb * hb * wb > budget) {
    const beta = Math.sqrt((frames * h * w) / budget);
    hb = Math.max(f, Math.floor(h / beta / f) * f);
    wb = Math.max(f, Math.floor(w / beta / f) * f);
  } else if (tb * hb * wb < minPixels) {
    const beta = Math.sqrt(minPixels / (frames * h * w));
    hb = Math.ceil((h * beta) / f) * f;
    wb = Math.ceil((w * beta) / f) * f;
  }
  return Math.ceil(frames / 2) * (hb / f) * (wb / f);
}

/** @param {File} file @returns {Promise<string>} */
function readDataUrl(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(/** @type {string} */ (r.result)); // a data: URL
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

function once(target, name, ms) {
  return /** @type {Promise<void>} */ (new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} timed out`)), ms);
    target.addEventListener(name, () => { clearTimeout(timer); resolve(); }, { once: true });
    target.addEventListener("error", () => { clearTimeout(timer); reject(new Error("media error")); }, { once: true });
  }));
}

/** @param {number} ms @returns {Promise<void>} */
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Seek and wait until the frame at `t` is the one shown: "seeked" can come before it is painted. */
async function seekTo(player, t) {
  const painted = typeof player.requestVideoFrameCallback === "function"
    ? /** @type {Promise<void>} */ (new Promise((resolve) => player.requestVideoFrameCallback(() => resolve())))
    : sleep(100);
  player.currentTime = t;
  await once(player, "seeked", 5000);
  await Promise.race([painted, sleep(1000)]);
}

/** Seek the player to each time and draw that frame into a small canvas. */
async function drawStrip(player, times, mine) {
  dom.strip.textContent = "";
  const h = 40;
  const w = Math.max(1, Math.round((player.videoWidth / player.videoHeight) * h));
  for (const t of times) {
    if (mine !== job) return;
    await seekTo(player, t);
    const c = document.createElement("canvas");
    c.width = w;
    c.height = h;
    c.className = "video-frame";
    c.title = `${t.toFixed(1)} s`;
    context2d(c).drawImage(player, 0, 0, w, h);
    dom.strip.append(c);
  }
}

/** A video file from the drop zone, the file picker or the clipboard. */
export async function loadVideoFile(file) {
  const mine = ++job;
  const v = videoConfig();
  hideError();
  dom.info.textContent = T().loading;
  dom.card.hidden = false;
  const maxBytes = Number(v.max_bytes) || 32 * 1024 * 1024;
  if (file.size > maxBytes) {
    removeVideo();
    showError(T().tooLarge(Math.floor(maxBytes / 1048576)));
    return;
  }
  const dataUrl = await readDataUrl(file);
  if (mine !== job) return;
  /** @type {Clip} */
  const mineClip = { file, dataUrl, duration: null, w: 0, h: 0, times: [], tokens: null };
  clip = mineClip; // stays the clip while `mine === job`
  changed();
  const url = URL.createObjectURL(file);
  const player = document.createElement("video");
  player.muted = true;
  player.preload = "auto";
  player.playsInline = true;
  player.className = "video-player"; // in the page but invisible: a detached player may not paint its frames
  document.body.append(player);
  player.src = url;
  try {
    await once(player, "loadeddata", 10000);
    if (mine !== job) return;
    const duration = player.duration;
    const maxSeconds = Number(v.max_seconds) || 120;
    if (Number.isFinite(duration) && duration > maxSeconds) {
      removeVideo();
      showError(T().tooLong(maxSeconds));
      return;
    }
    const n = sampledFrames(duration);
    // the processor's linspace(0, frames - 1, n): the last frame starts one frame before the end
    const last = Math.max(0, duration - 1 / 30);
    const times = Array.from({ length: n }, (_, i) => (n === 1 ? 0 : (last * i) / (n - 1)));
    Object.assign(mineClip, { duration, w: player.videoWidth, h: player.videoHeight, times });
    mineClip.tokens = videoTokens(n, mineClip.w, mineClip.h, dom.detail.value);
    renderInfo();
    await drawStrip(player, times, mine);
  } catch {
    if (mine === job && clip) {
      dom.strip.textContent = "";
      renderInfo(T().notPlayable);
    }
  } finally {
    player.remove();
    URL.revokeObjectURL(url);
  }
}

function renderInfo(note) {
  const box = dom.info;
  box.textContent = "";
  if (!clip) return;
  if (clip.tokens !== null) {
    box.dataset.tokens = String(clip.tokens);
    box.dataset.frames = String(clip.times.length);
    box.append(el("strong", "tokens", T().tokens(clip.tokens)), document.createTextNode(" · "),
               el("span", "muted", T().summary(clip.times.length, Number(clip.duration).toFixed(1))));
  } else {
    delete box.dataset.tokens;
  }
  if (note) box.append(el("div", "muted small-text", note));
}

export function removeVideo() {
  job++;
  const had = !!clip;
  clip = null;
  dom.strip.textContent = "";
  dom.info.textContent = "";
  delete dom.info.dataset.tokens;
  dom.card.hidden = true;
  if (had) changed();
}

function showError(msg) {
  dom.error.textContent = msg;
  dom.error.hidden = false;
}

function hideError() {
  dom.error.hidden = true;
  dom.error.textContent = "";
}

export function initVideo() {
  Object.assign(dom, {
    card: $("#video-card"),
    strip: $("#video-strip"),
    info: $("#video-info"),
    error: $("#video-error"),
    remove: $("#remove-video"),
    detail: $("#detail"),
    imageEstimate: $("#token-estimate"),
  });
  dom.remove.addEventListener("click", removeVideo);
  dom.detail.addEventListener("change", () => {
    if (clip && clip.times.length) {
      clip.tokens = videoTokens(clip.times.length, clip.w, clip.h, dom.detail.value);
      renderInfo();
    }
  });
  onLanguage(() => {
    dom.remove.textContent = T().remove;
    dom.strip.setAttribute("aria-label", T().stripLabel);
    renderInfo();
  });
}
