// @ts-check
/* Grounding on the page: the boxes and points of a Qwen3-VL answer drawn over the image they are
 * about, while the answer streams, with their labels, a colour per label, a toggle to hide them
 * and a download of the image with the boxes.
 *
 * The parser is the page's copy of vlservice/engine/output/grounding.py (see there for the format and why
 * braces are matched instead of parsing JSON): the API's `grounding` field only comes with the last
 * chunk, and the page draws each object the moment its closing brace arrives. The model's 0-1000
 * coordinates are drawn on a canvas the size of the image the page sent, which is the (downscaled)
 * image it shows, so the boxes land on the pixels the API's field names.
 */

import { tr } from "./strings.js";
import { context2d, el } from "./util.js";

const SCALE = 1000;
const KINDS = { bbox_2d: ["box", 4], point_2d: ["point", 2] };
// A label's colour is the next one of these in order of first appearance: distinct for the first
// twelve labels (high-contrast colours that stay apart for most colour-blind readers too).
export const COLOURS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#0fa3b1",
                        "#f032e6", "#808000", "#9a6324", "#800000", "#469990", "#000075"];

const isCoord = (v) => typeof v === "number" && Number.isFinite(v) && v >= 0 && v <= SCALE;

function itemOf(source) {
  let obj;
  try {
    obj = JSON.parse(source);
  } catch {
    return null;
  }
  if (!obj || typeof obj !== "object" || Array.isArray(obj)) return null;
  for (const [key, [kind, n]] of Object.entries(KINDS)) {
    const c = obj[key];
    if (Array.isArray(c) && c.length === n && c.every(isCoord)) {
      return { kind, coords: c, label: typeof obj.label === "string" ? obj.label.trim() : "" };
    }
  }
  return null;
}

/** An incremental parser: `feed(text)` returns the items that piece completed; `items` holds all. */
export function createParser() {
  let pending = ""; // the text from the outermost open brace on
  let open = []; // where each open brace is in `pending`
  let inString = false;
  let escape = false;
  const items = [];
  function feed(text) {
    const found = [];
    for (const c of text) {
      if (!open.length) {
        if (c === "{") {
          pending = "{";
          open = [0];
        }
        continue;
      }
      pending += c;
      if (inString) {
        if (escape) escape = false;
        else if (c === "\\") escape = true;
        else if (c === '"') inString = false;
        else if (c === "\n") { // JSON strings hold no raw line break: what is open is not JSON
          pending = "";
          open = [];
          inString = false;
        }
      } else if (c === '"') {
        inString = true;
      } else if (c === "{") {
        open.push(pending.length - 1);
      } else if (c === "}") {
        const item = itemOf(pending.slice(open.pop()));
        if (item) found.push(item);
        if (!open.length) pending = "";
      }
    }
    items.push(...found);
    return found;
  }
  return { feed, items };
}

/** The URL of the last image in the request's messages (the one an answer's coordinates refer to). */
export function lastImageUrl(messages) {
  let url = null;
  for (const m of messages) {
    for (const part of Array.isArray(m.content) ? m.content : []) {
      if (part.type === "image_url") url = part.image_url.url;
    }
  }
  return url;
}

/** Draw `items` on a 2D context of a w x h image: boxes and points in their label's colour. */
export function drawItems(ctx, items, w, h) {
  const colours = new Map();
  const line = Math.max(2, Math.round(Math.min(w, h) / 150));
  const font = Math.max(12, Math.round(Math.min(w, h) / 28));
  ctx.font = `600 ${font}px system-ui, sans-serif`;
  ctx.textBaseline = "top";
  for (const it of items) {
    if (!colours.has(it.label)) colours.set(it.label, COLOURS[colours.size % COLOURS.length]);
    const colour = colours.get(it.label);
    const xs = it.coords.filter((_, i) => i % 2 === 0).map((v) => Math.round((v * w) / SCALE));
    const ys = it.coords.filter((_, i) => i % 2 === 1).map((v) => Math.round((v * h) / SCALE));
    const tw = it.label ? ctx.measureText(it.label).width + 8 : 0;
    let lx;
    let ly;
    ctx.strokeStyle = colour;
    ctx.fillStyle = colour;
    ctx.lineWidth = line;
    if (it.kind === "box") {
      const [x1, x2] = [Math.min(...xs), Math.max(...xs)];
      const [y1, y2] = [Math.min(...ys), Math.max(...ys)];
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      lx = x1 - line / 2;
      ly = y1 - font - 4 - line / 2 >= 0 ? y1 - font - 4 - line / 2 : y1 + line / 2; // above, else inside
    } else {
      const r = line * 2.5;
      ctx.beginPath();
      ctx.arc(xs[0], ys[0], r, 0, 2 * Math.PI);
      ctx.fill();
      ctx.lineWidth = Math.max(1, line / 2);
      ctx.strokeStyle = "#ffffff";
      ctx.stroke();
      lx = xs[0] + r + 2 + tw <= w ? xs[0] + r + 2 : xs[0] - r - 2 - tw; // right of it, else left
      ly = ys[0] - font / 2 - 2;
    }
    if (it.label) {
      lx = Math.max(0, Math.min(lx, w - tw));
      ly = Math.max(0, Math.min(ly, h - font - 4));
      ctx.fillStyle = colour;
      ctx.fillRect(lx, ly, tw, font + 4);
      ctx.fillStyle = "#ffffff";
      ctx.fillText(it.label, lx + 4, ly + 2);
    }
  }
}

/**
 * Boxes for one answer about the image at `imageUrl`, put into `bubble` (after its text) once the
 * first object arrives. Returns {feed(text), items}, or null when the request had no image.
 */
export function createOverlay(bubble, imageUrl) {
  if (!imageUrl) return null;
  const parser = createParser();
  /** @type {HTMLElement | null} */
  let figure = null;
  let img;
  let canvas;

  function redraw() {
    if (!img.naturalWidth) return; // drawn when the image has loaded
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    drawItems(context2d(canvas), parser.items, canvas.width, canvas.height);
  }

  function download() {
    const out = document.createElement("canvas");
    out.width = img.naturalWidth;
    out.height = img.naturalHeight;
    const ctx = context2d(out);
    ctx.drawImage(img, 0, 0);
    drawItems(ctx, parser.items, out.width, out.height);
    out.toBlob((blob) => {
      if (!blob) return;
      const a = el("a");
      a.href = URL.createObjectURL(blob);
      a.download = "grounding.png";
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(a.href), 10000);
    }, "image/png");
  }

  function build() {
    const figure = el("figure", "grounding");
    const stage = el("div", "grounding-stage");
    img = el("img");
    img.alt = "";
    img.addEventListener("load", redraw);
    img.src = imageUrl;
    canvas = el("canvas");
    canvas.setAttribute("aria-hidden", "true");
    stage.append(img, canvas);
    const toggle = el("input");
    toggle.type = "checkbox";
    toggle.checked = true;
    toggle.addEventListener("change", () => { canvas.hidden = !toggle.checked; });
    const text = el("span", "", tr("groundingShow"));
    text.dataset.i18n = "groundingShow"; // re-translated with the page
    const label = el("label", "grounding-toggle");
    label.append(toggle, " ", text);
    const save = el("button", "grounding-download", tr("groundingDownload"));
    save.type = "button";
    save.dataset.i18n = "groundingDownload";
    save.addEventListener("click", download);
    const tools = el("figcaption", "grounding-tools");
    tools.append(label, save);
    figure.append(stage, tools);
    const content = bubble.querySelector(".content");
    if (content) content.after(figure);
    else bubble.append(figure);
    return figure;
  }

  function feed(text) {
    if (!parser.feed(text).length) return;
    if (!figure) figure = build();
    redraw();
  }

  return { feed, items: parser.items };
}
