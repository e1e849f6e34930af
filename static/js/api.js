// @ts-check
/* The page's client of the server's public API: /api/config, /api/stats, the streamed
 * /v1/chat/completions (Server-Sent Events) and the cancel endpoint. No DOM here.
 *
 * The page asks for `stream_options.include_stages`, so besides the OpenAI chunks the stream carries
 * named `vlservice.stage` events ({"stage": "queued"|"vision_encode"|"prefill", "position"?}); the
 * parser below follows the SSE spec (event name + data lines, comments skipped), so the UI is driven
 * by those events and never by the text of a comment.
 */

import { storageGet, storageSet } from "./util.js";

const STAGE_EVENT = "vlservice.stage";

// The API key lives for the tab only: a secret should not stay on a shared office PC.
const SS_KEY = "vlservice.apiKey";

/**
 * A preset button's question: its name, the prompt in each language, image or video.
 * @typedef {{name: string, en?: string, zh?: string, media?: string, [lang: string]: string | undefined}} Preset
 */
/**
 * What the page reads of /api/config (vlservice/http/ops.py); fields may be missing from an older
 * server, so the page keeps its defaults for them.
 * @typedef {object} Config
 * @property {string} [model]
 * @property {boolean} [demo]
 * @property {string | Record<string, string> | null} [demo_notice]
 * @property {boolean} [api_key_required]
 * @property {Preset[]} [presets]
 * @property {number} [default_max_tokens]
 * @property {number | null} [max_tokens_cap]
 * @property {Record<string, number>} [detail_max_pixels]
 * @property {number} [min_pixels]
 * @property {number} [token_factor]
 * @property {number | null} [encode_ms_per_token]
 * @property {number} [max_image_bytes]
 * @property {VideoConfig} [video]
 */
/**
 * @typedef {object} VideoConfig
 * @property {number} [max_bytes]
 * @property {number} [max_seconds]
 * @property {number} [max_frames]
 * @property {number} [min_frames]
 * @property {number} [fps]
 * @property {number} [min_pixels]
 * @property {number} [max_pixels]
 * @property {number} [frame_cap_pixels]
 * @property {Record<string, number>} [detail_frame_pixels]
 */

/** The server's configuration, once loaded (a live binding: importers see it change). */
export let config = /** @type {Config | null} */ (null);
let apiKey = storageGet("sessionStorage", SS_KEY) || "";

export const getApiKey = () => apiKey;

export function setApiKey(value) {
  apiKey = (value || "").trim();
  storageSet("sessionStorage", SS_KEY, apiKey);
}

// One session id per conversation, sent with every request of it: a load balancer in front of
// several replicas hashes it onto one, where the conversation's KV cache lives (README, Several
// replicas). getRandomValues, not randomUUID: the latter exists only on https or localhost pages.
let sessionId = "";

/** Start a new session (a new conversation); returns its id. */
export function newSession() {
  sessionId = "page-" + Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, "0")).join("");
  return sessionId;
}
newSession();

/** @returns {Record<string, string>} */
function authHeaders() {
  return config && config.api_key_required && apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

/**
 * Load /api/config, retrying with backoff; `onRetry()` is called after every failure.
 * @param {() => void} onRetry
 * @returns {Promise<Config>}
 */
export async function loadConfig(onRetry) {
  for (let attempt = 0; ; attempt++) {
    try {
      const resp = await fetch("/api/config", { headers: { Accept: "application/json" }, cache: "no-store" });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const loaded = /** @type {Config} */ (await resp.json());
      config = loaded;
      return loaded;
    } catch {
      onRetry();
      await new Promise((r) => setTimeout(r, Math.min(10000, 1000 * 2 ** Math.min(attempt, 4))));
    }
  }
}

/** GET /api/stats (with the key when the server wants one: the stats follow it); throws a
 * `StatsError` whose `status` says why (401: no key, or not this one). */
export async function fetchStats() {
  const resp = await fetch("/api/stats", { headers: { Accept: "application/json", ...authHeaders() }, cache: "no-store" });
  if (!resp.ok) throw new StatsError(resp.status);
  return resp.json();
}

export class StatsError extends Error {
  /** @param {number} status */
  constructor(status) {
    super(`HTTP ${status}`);
    this.status = status;
  }
}

/** POST a chat completion asking for a stream with usage and stage events; resolves to the Response. */
export function postChat(body, signal) {
  return fetch("/v1/chat/completions", {
    method: "POST",
    headers: {
      "Content-Type": "application/json",
      Accept: "text/event-stream",
      "X-Request-Priority": "interactive",
      "X-Session-Id": sessionId,
      ...authHeaders(),
    },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true, include_stages: true } }),
    signal,
    cache: "no-store",
  });
}

/** Ask the server to stop request `id` (best effort: the stream's abort cancels it too). */
export function cancelChat(id) {
  fetch(`/v1/chat/completions/${encodeURIComponent(id)}/cancel`, {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Session-Id": sessionId, ...authHeaders() },
    body: "{}",
    keepalive: true,
  }).catch(() => { /* best effort */ });
}

/**
 * An error response as {kind: "busy"|"http", status, message, retryAfter}.
 * @param {Response} resp
 * @returns {Promise<{kind: "busy" | "http", status: number, message: string, retryAfter?: number | null}>}
 */
export async function httpError(resp) {
  let message = "";
  try {
    const text = await resp.text();
    try {
      const j = JSON.parse(text);
      message = (j && j.error && (j.error.message || j.error.code)) || (typeof j.error === "string" ? j.error : "");
    } catch {
      message = text && text.length < 300 && !/^\s*</.test(text) ? text.trim() : "";
    }
  } catch { /* no body */ }
  const status = resp.status;
  if (status === 429 || status === 503) {
    return { kind: "busy", status, message, retryAfter: parseRetryAfter(resp.headers.get("Retry-After")) };
  }
  return { kind: "http", status, message };
}

function parseRetryAfter(value) {
  if (!value) return null;
  const s = value.trim();
  if (/^\d+$/.test(s)) return parseInt(s, 10);
  const date = Date.parse(s);
  return Number.isNaN(date) ? null : Math.max(0, Math.ceil((date - Date.now()) / 1000));
}

/**
 * A Server-Sent Events parser (the WHATWG "event stream interpretation"): feed it text with push(),
 * call end() at the end of the stream. Each dispatched event reaches `onEvent({type, data})`, type
 * being the `event:` field or "message"; comment lines (":") and events without data are skipped.
 */
export function createSseParser(onEvent) {
  let buf = "";
  let data = [];
  let type = "";
  let first = true;
  const dispatch = () => {
    if (data.length) onEvent({ type: type || "message", data: data.join("\n") });
    data = [];
    type = "";
  };
  const line = (raw) => {
    if (raw === "") { dispatch(); return; }
    if (raw.startsWith(":")) return;
    const idx = raw.indexOf(":");
    const field = idx === -1 ? raw : raw.slice(0, idx);
    let value = idx === -1 ? "" : raw.slice(idx + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "data") data.push(value);
    else if (field === "event") type = value;
    // "id" and "retry" matter only to EventSource's reconnection, which a POST stream has not.
  };
  return {
    push(text) {
      buf += text;
      if (first && buf) {
        if (buf.charCodeAt(0) === 0xfeff) buf = buf.slice(1);
        first = false;
      }
      let nl;
      while ((nl = buf.search(/\r\n|\n|\r/)) !== -1) {
        // A "\r" at the very end may be the first half of a "\r\n" still on its way.
        if (buf[nl] === "\r" && nl === buf.length - 1) break;
        const raw = buf.slice(0, nl);
        buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
        line(raw);
      }
    },
    // The spec drops an event that is not followed by a blank line: a cut stream's last event is lost.
    end() {
      if (buf.endsWith("\r")) line(buf.slice(0, -1));
      buf = "";
      data = [];
      type = "";
    },
  };
}

/**
 * Read a streamed chat response, calling `on.stage(obj)` for stage events and `on.chunk(obj)` for
 * chunk objects (and error objects); resolves with true when "[DONE]" arrived, false when the stream
 * ended without it. `on.shouldStop()` true stops reading early.
 */
export async function readChatStream(resp, on) {
  let done = false;
  const parser = createSseParser((ev) => {
    if (done) return;
    if (ev.type === STAGE_EVENT) {
      const obj = parseJson(ev.data);
      if (obj && typeof obj.stage === "string") on.stage(obj);
    } else if (ev.type === "message") {
      if (ev.data.trim() === "[DONE]") {
        done = true;
        return;
      }
      const obj = parseJson(ev.data);
      if (obj && typeof obj === "object") on.chunk(obj);
    }
  });
  if (!resp.body) {
    parser.push(await resp.text()); // no streaming body (very old browsers): all at once
    parser.end();
    return done;
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder("utf-8");
  for (;;) {
    const { value, done: eof } = await reader.read();
    if (eof) break;
    parser.push(decoder.decode(value, { stream: true }));
    if (done || on.shouldStop()) {
      reader.cancel().catch(() => {});
      break;
    }
  }
  parser.push(decoder.decode());
  parser.end();
  return done;
}

function parseJson(text) {
  try { return JSON.parse(text); } catch { return null; }
}
