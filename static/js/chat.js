// @ts-check
/* The conversation: the composer and presets, sending a question (with the image in the first user
 * message that had it, and the JSON switch's response_format or forced function call), the streamed
 * answer (text, or tool calls as call blocks; a JSON answer shown parsed once whole), stop, and the
 * state line.
 *
 * The state line follows the server's structured stage events (queued with its position, vision
 * encode, prefill) and then the answer's tokens; while an answer streams, the conversation region
 * says aria-busy="true" so screen readers announce the answer once it is whole.
 */

import { cancelChat, config, getApiKey, httpError, newSession, postChat, readChatStream, setApiKey } from "./api.js";
import { createOverlay, lastImageUrl } from "./grounding.js";
import { currentImage } from "./images.js";
import { scheduleStats } from "./cpu.js";
import { lang, onLanguage, presetLabel, table, tr } from "./strings.js";
import { mergeToolCalls, renderToolCalls, showJsonAnswer, structuredRequest } from "./structured.js";
import { fillCompact, showLatest } from "./timings.js";
import { currentVideo, onVideoChange } from "./video.js";
import { $, el, isNum } from "./util.js";

/**
 * @typedef {import("./api.js").Config} Config
 * @typedef {{url: string, detail?: string}} Media
 * @typedef {{kind: "busy"|"http"|"network"|"server"|"stream", message?: string, status?: number,
 *            retryAfter?: number | null}} ChatError
 * @typedef {object} Answer
 * @property {string} text
 * @property {"pending"|"done"|"error"|"stopped"} status
 * @property {ChatError | null} error
 * @property {Record<string, any> | null} timings
 * @property {string | null} finish the finish_reason
 * @property {boolean} json asked with the JSON switch on (as JSON or as a function call)
 * @property {string} jsonNote the key of the note on a JSON answer that does not parse
 * @property {import("./structured.js").ToolCall[]} toolCalls
 * @typedef {{node: HTMLElement, textNode: Text, tools: HTMLElement, notes: HTMLElement, err: HTMLElement,
 *            timings: HTMLElement, grounding?: {feed(text: string): void} | null}} TurnElements
 * @typedef {{user: {text: string, image: Media | null, video: Media | null}, assistant: Answer,
 *            el: TurnElements | null}} Turn
 * @typedef {{controller: AbortController, id: string | null, turn: Turn, stopped: boolean, cancelSent: boolean,
 *            hasImage: boolean, queuePos: number}} ActiveRequest
 */

/** @type {Turn[]} */
const turns = [];
/** @type {ActiveRequest | null} the request in flight */
let active = null;
let uiState = "idle";
/** @type {number | null} */
let uiStateArg = null;
/** @type {ReturnType<typeof setTimeout> | undefined} */
let flashTimer;
const dom = {};

export const isWorking = () => !!active;

const finished = (a) => a.status === "done" || a.status === "error" || a.status === "stopped";

// ----------------------------------------------------------------------------- state line

/** @param {string} s @param {number | null} [arg] */
function setState(s, arg = null) {
  uiState = s;
  uiStateArg = arg;
  renderState();
}

function renderState() {
  dom.state.dataset.state = uiState;
  let text = table().state[uiState] || uiState;
  if (uiState === "queued" && isNum(uiStateArg) && uiStateArg > 0) text = tr("queuedPos", uiStateArg);
  dom.state.textContent = text;
}

function flashComposerError(msg) {
  dom.state.textContent = msg;
  clearTimeout(flashTimer);
  flashTimer = setTimeout(renderState, 4000);
}

function setBusy(busy) {
  dom.send.disabled = busy || !config;
  dom.stop.hidden = !busy;
  dom.stop.disabled = !busy;
  dom.messages.setAttribute("aria-busy", busy ? "true" : "false");
  document.body.classList.toggle("busy", busy);
  scheduleStats(true);
}

// ----------------------------------------------------------------------------- bubbles

function scrollToBottom(force) {
  const m = dom.messages;
  if (force || m.scrollHeight - m.scrollTop - m.clientHeight < 80) m.scrollTop = m.scrollHeight;
  // On the phone layout the page itself scrolls.
  if (force && window.matchMedia("(max-width: 859px)").matches) dom.state.scrollIntoView({ block: "nearest" });
}

/** The question's and the answer's bubbles; returns the answer's elements. @returns {TurnElements} */
function addBubbles(turn) {
  const user = el("div", "msg user");
  if (turn.user.image) {
    const thumb = el("img", "thumb");
    thumb.alt = "";
    thumb.src = turn.user.image.url;
    user.append(thumb);
  }
  if (turn.user.video) user.append(el("div", "video-badge", "▶ video"));
  user.append(el("div", "content", turn.user.text));

  const node = el("div", "msg assistant pending");
  const content = el("div", "content");
  const textNode = document.createTextNode("");
  content.append(textNode);
  const notes = el("div", "notes");
  const err = el("div", "error-text");
  err.hidden = true;
  const tools = el("div", "tool-calls");
  tools.hidden = true;
  const timings = el("div", "msg-timings");
  timings.hidden = true;
  node.append(content, tools, notes, err, timings);
  if (turn.assistant.json) node.dataset.json = "pending";
  dom.messages.append(user, node);
  return { node, textNode, tools, notes, err, timings };
}

function renderTurnNotes(turn) {
  if (!turn.el) return;
  const a = turn.assistant;
  turn.el.notes.textContent = "";
  if (a.jsonNote) turn.el.notes.append(el("span", "json-note", tr(a.jsonNote)));
  else if (a.finish === "length") turn.el.notes.append(el("span", "", tr("truncated")));
  if (a.status === "stopped") turn.el.notes.append(el("span", "", tr("stoppedNote")));
  turn.el.notes.hidden = !turn.el.notes.childNodes.length;
  if (a.error) {
    turn.el.err.textContent = formatError(a.error);
    turn.el.err.hidden = false;
  }
  if (a.timings) {
    fillCompact(turn.el.timings, a.timings);
    turn.el.timings.hidden = false;
  }
}

// error: {kind: "busy"|"http"|"network"|"server"|"stream", message, retryAfter, status}
function formatError(e) {
  switch (e.kind) {
    case "busy": {
      const head = isNum(e.retryAfter) ? tr("busyRetry", e.retryAfter) : tr("busyRetrySoon");
      return e.message ? `${head}\n${e.message}` : head;
    }
    case "network":
      return tr("networkError", e.message || "");
    case "stream":
      return tr("streamClosed");
    default:
      return e.message || tr("httpError", e.status || "?");
  }
}

function updateEmptyHint() {
  dom.emptyHint.hidden = turns.length > 0;
}

// ----------------------------------------------------------------------------- the answer

function appendContent(turn, text) {
  turn.assistant.text += text;
  turn.el.textNode.appendData(text);
  if (turn.el.grounding) turn.el.grounding.feed(text); // boxes and points drawn as they arrive
  turn.el.node.classList.remove("pending");
  if (uiState !== "generating") setState("generating");
  scrollToBottom(false);
}

/** Tool-call fragments of the answer (streamed `delta.tool_calls`, or a whole `message.tool_calls`). */
function addToolCalls(turn, fragments) {
  mergeToolCalls(turn.assistant.toolCalls, fragments);
  renderToolCalls(turn.el.tools, turn.assistant.toolCalls);
  turn.el.node.classList.remove("pending");
  if (uiState !== "generating") setState("generating");
  scrollToBottom(false);
}

function finishTurn(turn, status) {
  const a = turn.assistant;
  if (finished(a)) return;
  a.status = status;
  // A JSON answer: the parsed object instead of the raw text, or a note why it does not parse; one
  // asked as a call that came as one: its call blocks.
  if (a.json && status === "done") {
    if (a.toolCalls.length) turn.el.node.dataset.json = "call";
    else a.jsonNote = showJsonAnswer(turn.el.node, a.text, a.finish);
  }
  turn.el.node.classList.remove("pending");
  turn.el.node.classList.toggle("error", status === "error");
  turn.el.node.classList.toggle("stopped", status === "stopped");
  renderTurnNotes(turn);
  setState(status);
  scrollToBottom(false);
}

function setTimings(turn, t) {
  turn.assistant.timings = t;
  showLatest(t);
  renderTurnNotes(turn);
}

/** A `vlservice.stage` event: what the server is doing before the first token. */
function onStage(turn, ev) {
  if (!active || active.turn !== turn || finished(turn.assistant) || turn.assistant.text.length) return;
  if (ev.stage === "queued") {
    active.queuePos = isNum(ev.position) ? ev.position : 0;
    if (active.queuePos > 0) setState("queued", active.queuePos);
    else setState(active.hasImage ? "analysing" : "prefill"); // starting now: the image or the prompt first
  } else if (ev.stage === "vision_encode") {
    setState("analysing");
  } else if (ev.stage === "prefill") {
    setState("prefill");
  }
}

/** A data chunk (or an error object) of the stream. */
function onChunk(turn, obj) {
  const a = turn.assistant;
  if (!active || active.turn !== turn || finished(a)) return;
  if (obj.error) {
    a.error = { kind: "server", message: obj.error.message || obj.error.code || "error" };
    finishTurn(turn, "error");
    return;
  }
  if (obj.id && !active.id) active.id = String(obj.id);
  if (active.stopped) sendCancel(active);
  for (const choice of obj.choices || []) {
    const delta = choice.delta || {};
    if (typeof delta.content === "string" && delta.content.length) appendContent(turn, delta.content);
    if (Array.isArray(delta.tool_calls) && delta.tool_calls.length) addToolCalls(turn, delta.tool_calls);
    if (choice.finish_reason) a.finish = choice.finish_reason;
  }
  if (obj.timings && typeof obj.timings === "object") setTimings(turn, obj.timings);
}

async function readAnswer(resp, turn) {
  if ((resp.headers.get("Content-Type") || "").toLowerCase().includes("application/json")) {
    // A non-streamed answer (something between us and the server dropped "stream": true).
    const j = await resp.json();
    if (j && j.error) {
      onChunk(turn, j);
      return;
    }
    const choice = (j && j.choices && j.choices[0]) || {};
    const text = (choice.message && choice.message.content) || "";
    if (text) appendContent(turn, String(text));
    const calls = choice.message && choice.message.tool_calls;
    if (Array.isArray(calls) && calls.length) addToolCalls(turn, calls);
    turn.assistant.finish = choice.finish_reason || "stop";
    if (j && j.timings) setTimings(turn, j.timings);
    finishTurn(turn, "done");
    return;
  }
  const complete = await readChatStream(resp, {
    stage: (ev) => onStage(turn, ev),
    chunk: (obj) => onChunk(turn, obj),
    shouldStop: () => finished(turn.assistant),
  });
  if (finished(turn.assistant)) return;
  if (complete || turn.assistant.finish) {
    finishTurn(turn, "done");
  } else {
    turn.assistant.error = { kind: "stream" };
    finishTurn(turn, "error");
  }
}

// ----------------------------------------------------------------------------- sending

/** The messages of the conversation so far (failed turns left out) ending with `current`. */
function buildMessages(current) {
  const included = turns.filter((t) => t === current || (t.assistant.status !== "error" && t.assistant.text.length > 0));
  const msgs = [];
  for (const t of included) {
    const u = t.user;
    if (u.video) {
      msgs.push({ role: "user", content: [{ type: "video_url", video_url: { url: u.video.url, detail: u.video.detail } },
                                           { type: "text", text: u.text }] });
    } else if (u.image) {
      msgs.push({ role: "user", content: [{ type: "image_url", image_url: { url: u.image.url, detail: u.image.detail } },
                                           { type: "text", text: u.text }] });
    } else {
      msgs.push({ role: "user", content: u.text });
    }
    if (t !== current) msgs.push({ role: "assistant", content: t.assistant.text });
  }
  return { msgs, included };
}

/** @param {Config} cfg */
function maxTokens(cfg) {
  let v = parseInt(dom.maxTokens.value, 10);
  if (!Number.isFinite(v) || v < 1) v = Number(cfg.default_max_tokens) || 256;
  if (isNum(cfg.max_tokens_cap)) v = Math.min(v, cfg.max_tokens_cap);
  return v;
}

function askForKey() {
  dom.apiKeyWrap.hidden = false;
  dom.apiKey.hidden = false;
  dom.apiKeyWrap.classList.add("attention");
}

async function send() {
  if (!config || active) return;
  const text = dom.question.value.trim();
  if (!text) {
    dom.question.focus();
    return;
  }
  if (config.api_key_required && !getApiKey()) {
    askForKey();
    dom.apiKey.focus();
    setState("error");
    flashComposerError(tr("apiKeyNeeded"));
    return;
  }

  let structured;
  try {
    structured = structuredRequest(); // null: free text
  } catch (err) {
    setState("error");
    flashComposerError(err instanceof Error ? err.message : String(err));
    return;
  }

  /** @type {Turn} */
  const turn = {
    user: { text, image: null, video: null },
    assistant: { text: "", status: "pending", error: null, timings: null, finish: null, json: !!structured,
                 jsonNote: "", toolCalls: [] },
    el: null,
  };
  turns.push(turn);
  // The image goes in the FIRST (still valid) user message that had it.
  const image = currentImage();
  if (image && !buildMessages(turn).included.some((t) => t.user.image && t.user.image.url === image.url)) {
    turn.user.image = image;
  }
  const video = currentVideo(); // the same rule for a clip
  if (video && !buildMessages(turn).included.some((t) => t.user.video && t.user.video.url === video.url)) {
    turn.user.video = video;
  }
  const { msgs } = buildMessages(turn);

  turn.el = addBubbles(turn);
  turn.el.grounding = createOverlay(turn.el.node, lastImageUrl(msgs));
  updateEmptyHint();
  dom.question.value = "";
  autoGrow();
  scrollToBottom(true);

  const controller = new AbortController();
  /** @type {ActiveRequest} */
  const req = { controller, id: null, turn, stopped: false, cancelSent: false, queuePos: 0,
                hasImage: msgs.some((m) => Array.isArray(m.content)) };
  active = req; // until the answer ends: a second send waits for it
  const cfg = config;
  setBusy(true);
  setState("sending");
  try {
    const body = { model: cfg.model, messages: msgs, max_tokens: maxTokens(cfg) };
    if (structured) Object.assign(body, structured);
    const resp = await postChat(body, controller.signal);
    req.id = resp.headers.get("X-Request-Id") || null;
    if (req.stopped) {
      // Stop was pressed while the request was on its way.
      sendCancel(req);
      throw new DOMException("stopped", "AbortError");
    }
    if (!resp.ok) {
      turn.assistant.error = await httpError(resp);
      if ((resp.status === 401 || resp.status === 403) && config.api_key_required) askForKey();
      finishTurn(turn, "error");
      return;
    }
    await readAnswer(resp, turn);
  } catch (caught) {
    const err = /** @type {{name?: string, message?: string} | null} */ (caught);
    if (err && err.name === "AbortError") {
      finishTurn(turn, "stopped");
    } else {
      turn.assistant.error = { kind: "network", message: (err && err.message) || String(err) };
      finishTurn(turn, "error");
    }
  } finally {
    if (active && active.turn === turn) active = null;
    setBusy(false);
  }
}

function sendCancel(req) {
  if (!req.id || req.cancelSent) return;
  req.cancelSent = true;
  cancelChat(req.id);
}

function stop() {
  if (!active) return;
  const req = active;
  req.stopped = true;
  sendCancel(req);
  finishTurn(req.turn, "stopped");
  req.controller.abort();
}

function newConversation() {
  if (active) stop();
  newSession(); // its follow-ups may go to another replica than the last conversation's
  turns.length = 0;
  dom.messages.textContent = "";
  showLatest(null);
  updateEmptyHint();
  setState("idle");
  dom.question.focus();
}

function autoGrow() {
  const q = dom.question;
  q.style.height = "auto";
  q.style.height = `${Math.min(q.scrollHeight + 2, 200)}px`;
}

// ----------------------------------------------------------------------------- presets

/** One button per preset the server offers (its prompts are the demo model's own questions). */
function renderPresets() {
  dom.presets.textContent = "";
  if (!config) return;
  const media = currentVideo() ? "video" : "image"; // a video preset only with a clip, and the reverse
  const list = (Array.isArray(config.presets) ? config.presets : []).filter((p) => (p.media || "image") === media);
  for (const p of [...list, { name: "free" }]) {
    const b = el("button", "", presetLabel(p.name, p[lang] || p.en));
    b.type = "button";
    b.dataset.preset = p.name;
    dom.presets.append(b);
  }
}

function onPreset(name) {
  if (!config) return; // the buttons come with the config
  const p = (config.presets || []).find((x) => x.name === name);
  dom.question.value = p ? p[lang] || p.en || "" : "";
  autoGrow();
  if (p && (currentImage() || currentVideo()) && !active) send();
  else dom.question.focus();
}

// ----------------------------------------------------------------------------- wiring

/** Apply the server's configuration: API key field, token limits, presets; sending is possible now. */
export function configureChat() {
  if (!config) return;
  const needKey = !!config.api_key_required;
  dom.apiKeyWrap.hidden = !needKey;
  dom.apiKey.hidden = !needKey;
  if (needKey) dom.apiKey.value = getApiKey();
  dom.maxTokens.value = String(Number(config.default_max_tokens) || 256);
  if (isNum(config.max_tokens_cap)) dom.maxTokens.max = String(config.max_tokens_cap);
  renderPresets();
  dom.send.disabled = !!active;
}

export function initChat() {
  Object.assign(dom, {
    apiKeyWrap: $("#api-key-wrap"),
    apiKey: $("#api-key"),
    messages: $("#messages"),
    emptyHint: $("#empty-hint"),
    state: $("#state"),
    presets: $("#presets"),
    composer: $("#composer"),
    question: $("#question"),
    send: $("#send"),
    stop: $("#stop"),
    newChat: $("#new-chat"),
    maxTokens: $("#max-tokens"),
  });
  dom.apiKey.addEventListener("input", () => {
    setApiKey(dom.apiKey.value);
    dom.apiKeyWrap.classList.remove("attention");
  });
  dom.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  dom.question.addEventListener("keydown", (e) => {
    // Enter sends, except while an input method composes (Chinese input).
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) {
      e.preventDefault();
      send();
    }
  });
  dom.question.addEventListener("input", autoGrow);
  dom.stop.addEventListener("click", stop);
  dom.newChat.addEventListener("click", newConversation);
  dom.presets.addEventListener("click", (e) => {
    const btn = e.target.closest("button[data-preset]");
    if (btn) onPreset(btn.dataset.preset);
  });
  onVideoChange(renderPresets);
  onLanguage(() => {
    renderState();
    renderPresets();
    for (const t of turns) renderTurnNotes(t);
  });
  updateEmptyHint();
  setBusy(false);
}
