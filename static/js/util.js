// @ts-check
/* Small DOM and formatting helpers shared by the page's modules.
 *
 * Model output and user input only ever reach the page as text (textContent, Text nodes), never as
 * HTML: `el` is the one way the modules make elements with text in them.
 */

/**
 * The element of the page's HTML that `sel` names (the modules name only elements it has).
 * @param {string} sel
 * @returns {any}
 */
export const $ = (sel) => document.querySelector(sel);

/**
 * A new element, with a class and text.
 * @template {keyof HTMLElementTagNameMap} K
 * @param {K} tag
 * @param {string} [className]
 * @param {unknown} [text]
 * @returns {HTMLElementTagNameMap[K]}
 */
export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/**
 * A canvas's 2D context (there always is one for a canvas nothing else has drawn on).
 * @param {HTMLCanvasElement} canvas
 * @returns {CanvasRenderingContext2D}
 */
export const context2d = (canvas) => /** @type {CanvasRenderingContext2D} */ (canvas.getContext("2d"));

/** @param {unknown} v @returns {v is number} */
export const isNum = (v) => typeof v === "number" && Number.isFinite(v);

/** @param {unknown} ms */
export function fmtMs(ms) {
  if (!isNum(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(2)} s`;
  return `${(ms / 1000).toFixed(1)} s`;
}

/** @typedef {"localStorage" | "sessionStorage"} StorageName */

// Storage can throw (private mode, disabled cookies): the page then simply does not remember.
/** @param {StorageName} storage @param {string} key @returns {string | null} */
export function storageGet(storage, key) {
  try { return window[storage].getItem(key); } catch { return null; }
}

/** @param {StorageName} storage @param {string} key @param {string | null} value */
export function storageSet(storage, key, value) {
  try {
    if (value === null || value === "") window[storage].removeItem(key);
    else window[storage].setItem(key, value);
  } catch { /* not remembered */ }
}
