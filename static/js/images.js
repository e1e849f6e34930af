// @ts-check
/* The image card: choose, drop or paste an image; the browser fixes its orientation (EXIF), scales it
 * down to the server's pixel budget for the chosen detail, encodes it (JPEG, or PNG for small
 * screenshots) and estimates its image tokens the way the model's processor counts them.
 *
 * Uploading the downscaled image instead of the original saves bandwidth and the server's decode
 * time; the server would shrink it to the same budget anyway.
 */

import { config } from "./api.js";
import { tr, onLanguage } from "./strings.js";
import { $, context2d, el, fmtMs, isNum } from "./util.js";
import { loadVideoFile, removeVideo } from "./video.js";

/**
 * The chosen image: its decoded source, then (once encoded for the chosen detail) what is sent.
 * @typedef {object} PageImage
 * @property {ImageBitmap | HTMLImageElement} source
 * @property {number} srcW
 * @property {number} srcH
 * @property {boolean} isPng
 * @property {number} fileSize
 * @property {string} [dataUrl]
 * @property {string} [mime]
 * @property {number} [w]
 * @property {number} [h]
 * @property {number} [bytes]
 * @property {string} [detail]
 * @property {number} [tokens]
 */
/** @type {PageImage | null} */
let image = null;
let imageJob = 0; // increments to discard stale async image work
const dom = {};

/** The image to send, as {url, detail}, or null. */
export function currentImage() {
  return image && image.dataUrl ? { url: image.dataUrl, detail: image.detail } : null;
}

function maxPixelsFor(detail) {
  const table = (config && config.detail_max_pixels) || {};
  return Number(table[detail]) || Number(table.auto) || 786432;
}

// Python's round(): half to even (what Qwen's smart_resize uses).
function roundHalfEven(x) {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

// The model's processor refuses images whose long side is more than 200 times the short one.
const MAX_RATIO = 200;

/**
 * Target size so that w*h <= budget (aspect ratio kept; a thin image stays within the processor's
 * 200:1, which flooring its short side alone could break: 7000x35 is not sent as 4525x22).
 */
export function fitToBudget(w, h, budget) {
  if (w * h <= budget) return { w, h };
  const scale = Math.sqrt(budget / (w * h));
  let nw = Math.max(1, Math.floor(w * scale));
  let nh = Math.max(1, Math.floor(h * scale));
  while (nw * nh > budget && (nw > 1 || nh > 1)) {
    if (nw >= nh) nw--; else nh--;
  }
  if (Math.max(w, h) <= MAX_RATIO * Math.min(w, h)) {
    nw = Math.min(nw, MAX_RATIO * nh);
    nh = Math.min(nh, MAX_RATIO * nw);
  }
  return { w: nw, h: nh };
}

/**
 * The server's smart_resize (vlservice/engine/media/images.py), to the letter: each side rounded to a
 * multiple of the factor, then brought within the pixel budget (never below the model's
 * min_pixels) or, only when it is under it, up to min_pixels. Returns the image tokens,
 * (h/f)*(w/f) for the resized h x w.
 */
export function estimateTokens(w, h, budget) {
  const f = Number(config && config.token_factor) || 32;
  const minPixels = Number(config && config.min_pixels) || 0;
  const maxPixels = Math.max(budget, minPixels);
  let hb = roundHalfEven(h / f) * f;
  let wb = roundHalfEven(w / f) * f;
  if (hb * wb > maxPixels) {
    const beta = Math.sqrt((h * w) / maxPixels);
    hb = Math.max(f, Math.floor(h / beta / f) * f);
    wb = Math.max(f, Math.floor(w / beta / f) * f);
  } else if (hb * wb < minPixels) {
    const beta = Math.sqrt(minPixels / (h * w));
    hb = Math.ceil((h * beta) / f) * f;
    wb = Math.ceil((w * beta) / f) * f;
  }
  return (hb / f) * (wb / f);
}

/**
 * What the page sends for a source image of srcW x srcH at `detail`: the size it scales it to
 * (within the detail's pixel budget) and the image tokens the server will count for that size.
 */
export function planImage(srcW, srcH, detail) {
  const budget = maxPixelsFor(detail);
  const { w, h } = fitToBudget(srcW, srcH, budget);
  return { w, h, tokens: estimateTokens(w, h, budget) };
}

async function decodeImage(file) {
  if (typeof createImageBitmap === "function") {
    try {
      const bmp = await createImageBitmap(file, { imageOrientation: "from-image" });
      return { source: bmp, w: bmp.width, h: bmp.height };
    } catch { /* fall back below */ }
  }
  const url = URL.createObjectURL(file);
  try {
    const img = new Image();
    img.decoding = "async";
    img.style.imageOrientation = "from-image";
    img.src = url;
    await img.decode();
    return { source: img, w: img.naturalWidth, h: img.naturalHeight };
  } finally {
    URL.revokeObjectURL(url); // the decoded pixels stay usable for drawImage
  }
}

function drawScaled(source, srcW, srcH, w, h, opaque) {
  // Halve in steps for big reductions (better quality than one jump).
  let cur = source;
  let cw = srcW;
  let ch = srcH;
  while (cw / 2 >= w * 1.5 && ch / 2 >= h * 1.5) {
    const nw = Math.max(w, Math.round(cw / 2));
    const nh = Math.max(h, Math.round(ch / 2));
    const step = document.createElement("canvas");
    step.width = nw;
    step.height = nh;
    const sctx = context2d(step);
    sctx.imageSmoothingEnabled = true;
    sctx.imageSmoothingQuality = "high";
    sctx.drawImage(cur, 0, 0, nw, nh);
    cur = step;
    cw = nw;
    ch = nh;
  }
  const canvas = document.createElement("canvas");
  canvas.width = w;
  canvas.height = h;
  const ctx = context2d(canvas);
  if (opaque) {
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, w, h);
  }
  ctx.imageSmoothingEnabled = true;
  ctx.imageSmoothingQuality = "high";
  ctx.drawImage(cur, 0, 0, w, h);
  return canvas;
}

function dataUrlBytes(url) {
  const i = url.indexOf(",");
  const pad = url.endsWith("==") ? 2 : url.endsWith("=") ? 1 : 0;
  return Math.floor(((url.length - i - 1) * 3) / 4) - pad;
}

async function loadImageFile(file) {
  if (!file) return;
  hideImageError();
  if (file.type && file.type.startsWith("video/")) { // a clip: video.js takes it from here
    removeImage();
    loadVideoFile(file);
    return;
  }
  if (file.type && !file.type.startsWith("image/")) {
    showImageError(tr("notAnImage"));
    return;
  }
  const job = ++imageJob;
  dom.tokenEstimate.textContent = tr("processing");
  let decoded;
  try {
    decoded = await decodeImage(file);
  } catch {
    if (job === imageJob) {
      showImageError(tr("decodeFailed"));
      renderTokenEstimate();
    }
    return;
  }
  if (job !== imageJob) return;
  if (!decoded.w || !decoded.h) {
    showImageError(tr("decodeFailed"));
    return;
  }
  releaseImage();
  removeVideo();
  image = { source: decoded.source, srcW: decoded.w, srcH: decoded.h, isPng: file.type === "image/png", fileSize: file.size };
  reencodeImage();
}

function releaseImage() {
  if (image && image.source && "close" in image.source && typeof image.source.close === "function") {
    try { image.source.close(); } catch { /* already closed */ }
  }
  image = null;
}

/** Scale and encode the current image for the chosen detail (again after the config arrives). */
export function reencodeImage() {
  if (!image) return;
  const detail = dom.detail.value;
  const { w, h, tokens } = planImage(image.srcW, image.srcH, detail);
  const maxBytes = Number(config && config.max_image_bytes) || 20 * 1024 * 1024;

  /** @type {string | null} */
  let url = null;
  let mime = "image/jpeg";
  // Keep PNG (lossless, e.g. screenshots with text) when the source was a small PNG; otherwise
  // JPEG quality 0.9.
  const smallPng = image.isPng && image.fileSize <= 1024 * 1024 && w * h <= 1024 * 1024;
  if (smallPng) {
    const png = drawScaled(image.source, image.srcW, image.srcH, w, h, false).toDataURL("image/png");
    if (png.startsWith("data:image/png") && dataUrlBytes(png) <= Math.min(maxBytes, 2 * 1024 * 1024)) {
      url = png;
      mime = "image/png";
    }
  }
  if (!url) {
    const c = drawScaled(image.source, image.srcW, image.srcH, w, h, true);
    for (const q of [0.9, 0.8, 0.7, 0.5]) {
      url = c.toDataURL("image/jpeg", q);
      if (dataUrlBytes(url) <= maxBytes) break;
    }
    if (dataUrlBytes(url) > maxBytes) {
      showImageError(tr("imageTooLarge"));
      url = null;
    }
  }
  if (!url) {
    releaseImage();
    renderImage();
    return;
  }
  Object.assign(image, { dataUrl: url, mime, w, h, bytes: dataUrlBytes(url), detail, tokens });
  renderImage();
}

function renderImage() {
  const has = !!(image && image.dataUrl);
  if (image && image.dataUrl) dom.preview.src = image.dataUrl;
  else dom.preview.removeAttribute("src");
  dom.preview.hidden = !has;
  dom.dropText.hidden = has;
  dom.dropZone.classList.toggle("has-image", has);
  dom.removeImage.hidden = !has;
  dom.changeImage.hidden = !has;
  renderTokenEstimate();
}

function renderTokenEstimate() {
  const box = dom.tokenEstimate;
  box.textContent = "";
  if (!image || !image.dataUrl) {
    delete box.dataset.tokens;
    box.append(el("span", "muted", tr("noImage")));
    return;
  }
  const shown = /** @type {Required<PageImage>} */ (image); // encoded: every field is set
  box.dataset.tokens = String(shown.tokens);
  box.append(el("strong", "tokens", tr("tokensEstimate", shown.tokens)));
  const ms = config && config.encode_ms_per_token;
  if (isNum(ms)) {
    box.dataset.encodeMs = String(Math.round(shown.tokens * ms));
    box.append(document.createTextNode(" · "), el("span", "encode", tr("encodeEstimate", fmtMs(shown.tokens * ms))));
  } else {
    delete box.dataset.encodeMs;
  }
  const fmt = shown.mime === "image/png" ? "PNG" : "JPEG";
  box.append(el("div", "muted small-text", tr("sentAs", shown.w, shown.h, Math.max(1, Math.round(shown.bytes / 1024)), fmt)));
}

function removeImage() {
  imageJob++;
  releaseImage();
  dom.fileInput.value = "";
  hideImageError();
  renderImage();
}

function showImageError(msg) {
  dom.imageError.textContent = msg;
  dom.imageError.hidden = false;
}

function hideImageError() {
  dom.imageError.hidden = true;
  dom.imageError.textContent = "";
}

function imageFromDataTransfer(dt) {
  if (!dt) return null;
  if (dt.files && dt.files.length) {
    for (const f of dt.files) if (!f.type || f.type.startsWith("image/")) return f;
    return dt.files[0];
  }
  for (const item of dt.items || []) {
    if (item.kind === "file" && /^(image|video)\//.test(item.type)) return item.getAsFile();
  }
  return null;
}

function wireDragAndDrop() {
  // The drop zone highlights; a drop anywhere is accepted so that a missed drop does not navigate
  // away from the page.
  let dragDepth = 0;
  const hasFiles = (e) => e.dataTransfer && Array.from(e.dataTransfer.types || []).includes("Files");
  const endDrag = () => {
    dragDepth = 0;
    dom.dropZone.classList.remove("dragging");
  };
  window.addEventListener("dragenter", (e) => {
    if (!hasFiles(e)) return;
    dragDepth++;
    dom.dropZone.classList.add("dragging");
  });
  window.addEventListener("dragleave", () => {
    dragDepth = Math.max(0, dragDepth - 1);
    if (!dragDepth) dom.dropZone.classList.remove("dragging");
  });
  window.addEventListener("dragover", (e) => {
    if (!hasFiles(e)) return;
    e.preventDefault();
    /** @type {DataTransfer} */ (e.dataTransfer).dropEffect = "copy";
  });
  window.addEventListener("drop", (e) => {
    endDrag();
    const f = imageFromDataTransfer(e.dataTransfer);
    if (!f && !hasFiles(e)) return;
    e.preventDefault();
    if (f) loadImageFile(f);
  });
  dom.dropZone.addEventListener("dragover", (e) => {
    e.preventDefault();
    if (e.dataTransfer) e.dataTransfer.dropEffect = "copy";
  });
  dom.dropZone.addEventListener("drop", (e) => {
    e.preventDefault();
    e.stopPropagation();
    endDrag();
    const f = imageFromDataTransfer(e.dataTransfer);
    if (f) loadImageFile(f);
  });
}

function wirePaste() {
  // An image pasted anywhere is taken; pasting text into a text field stays a text paste.
  document.addEventListener("paste", (e) => {
    const dt = e.clipboardData;
    if (!dt) return;
    const target = /** @type {HTMLElement | null} */ (e.target);
    const inField = target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT");
    if (inField && (dt.getData("text/plain") || "").trim()) return;
    /** @type {File | null} */
    let file = null;
    for (const item of dt.items || []) {
      if (item.kind === "file" && /^(image|video)\//.test(item.type)) {
        file = item.getAsFile();
        break;
      }
    }
    if (!file && dt.files && dt.files.length && /^(image|video)\//.test(dt.files[0].type)) file = dt.files[0];
    if (file) {
      e.preventDefault();
      loadImageFile(file);
    }
  });
}

export function initImages() {
  Object.assign(dom, {
    dropZone: $("#drop-zone"),
    dropText: $("#drop-text"),
    preview: $("#preview"),
    fileInput: $("#file-input"),
    chooseImage: $("#choose-image"),
    changeImage: $("#change-image"),
    removeImage: $("#remove-image"),
    detail: $("#detail"),
    tokenEstimate: $("#token-estimate"),
    imageError: $("#image-error"),
  });
  dom.detail.value = "auto";
  dom.chooseImage.addEventListener("click", () => dom.fileInput.click());
  dom.changeImage.addEventListener("click", () => dom.fileInput.click());
  dom.removeImage.addEventListener("click", removeImage);
  dom.fileInput.addEventListener("change", () => {
    const f = dom.fileInput.files && dom.fileInput.files[0];
    if (f) loadImageFile(f);
  });
  dom.detail.addEventListener("change", reencodeImage);
  wireDragAndDrop();
  wirePaste();
  onLanguage(renderTokenEstimate);
  renderImage();
}
