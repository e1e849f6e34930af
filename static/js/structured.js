// @ts-check
/* Structured answers: the JSON switch (a schema, or none for any JSON object; two example schemas to
 * start from), the `response_format` it adds to requests, and how the answer is shown: parsed and
 * pretty-printed, or the raw text with a note when it does not parse (cut by max_tokens). Also the
 * model's tool calls (`delta.tool_calls` fragments in the stream, `message.tool_calls` in a whole
 * answer), each shown as a call block with its name and arguments.
 *
 * The server enforces the schema with a grammar (docs/api.md, Structured output), so an answer that
 * ended normally parses; a schema it cannot use is a 400 whose message the conversation shows.
 */

import { onLanguage, tr } from "./strings.js";
import { $, el } from "./util.js";

/**
 * Example schemas to pick. Bounded (maxLength, maxItems, number bounds), as the API's docs advise,
 * so that a small model's answer ends within the page's max tokens.
 * @type {Record<string, {name: string, schema: object}>}
 */
export const EXAMPLES = {
  receipt: {
    name: "receipt",
    schema: {
      type: "object",
      properties: {
        merchant: { type: "string", maxLength: 48 },
        date: { type: "string", description: "YYYY-MM-DD", maxLength: 10 },
        items: {
          type: "array",
          maxItems: 12,
          items: {
            type: "object",
            properties: {
              name: { type: "string", maxLength: 40 },
              price: { type: "number", minimum: 0, maximum: 100000 },
            },
            required: ["name", "price"],
            additionalProperties: false,
          },
        },
        total: { type: "number", minimum: 0, maximum: 1000000 },
      },
      required: ["merchant", "date", "items", "total"],
      additionalProperties: false,
    },
  },
  shapes: {
    name: "shapes",
    schema: {
      type: "object",
      properties: {
        shapes: {
          type: "array",
          maxItems: 8,
          items: {
            type: "object",
            properties: {
              shape: { enum: ["circle", "square", "triangle", "star"] },
              color: { type: "string", maxLength: 16 },
            },
            required: ["shape", "color"],
            additionalProperties: false,
          },
        },
        count: { type: "integer", minimum: 0, maximum: 20 },
      },
      required: ["shapes", "count"],
      additionalProperties: false,
    },
  },
};

/**
 * @typedef {{type: "json_object"} | {type: "json_schema", json_schema: {name: string, schema: object}}} ResponseFormat
 * @typedef {{id: string, type: string, name: string, arguments: string}} ToolCall
 */

/** @type {{toggle: HTMLInputElement, panel: HTMLElement, example: HTMLSelectElement, schema: HTMLTextAreaElement, error: HTMLElement}} */
const dom = /** @type {any} */ ({});
let exampleName = ""; // the example last put in the textarea (its name goes with the schema)

/** Whether the JSON switch is on. */
export const jsonMode = () => dom.toggle.checked;

/**
 * The `response_format` to send: none when the switch is off, `json_object` for an empty schema,
 * else `json_schema`. Throws an Error with a message for the user when the schema is not JSON.
 * @returns {ResponseFormat | null}
 */
export function responseFormat() {
  hideError();
  if (!jsonMode()) return null;
  const text = dom.schema.value.trim();
  if (!text) return { type: "json_object" };
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (err) {
    throw showError(tr("jsonSchemaInvalid", err instanceof Error ? err.message : String(err)));
  }
  if (!schema || typeof schema !== "object" || Array.isArray(schema)) throw showError(tr("jsonSchemaNotObject"));
  const example = EXAMPLES[exampleName];
  const sameAsExample = example && JSON.stringify(example.schema) === JSON.stringify(schema);
  return { type: "json_schema", json_schema: { name: sameAsExample ? example.name : "page_schema", schema } };
}

/** @param {string} msg @returns {Error} */
function showError(msg) {
  dom.error.textContent = msg;
  dom.error.hidden = false;
  dom.schema.setAttribute("aria-invalid", "true");
  return new Error(msg);
}

function hideError() {
  dom.error.hidden = true;
  dom.error.textContent = "";
  dom.schema.removeAttribute("aria-invalid");
}

function render() {
  dom.panel.hidden = !dom.toggle.checked;
}

function renderExamples() {
  const chosen = dom.example.value;
  dom.example.textContent = "";
  const pick = el("option", "", tr("jsonPickExample"));
  pick.setAttribute("value", "");
  dom.example.append(pick);
  for (const name of Object.keys(EXAMPLES)) {
    const option = el("option", "", tr("jsonExamples")[name] || name);
    option.setAttribute("value", name);
    dom.example.append(option);
  }
  dom.example.value = chosen;
}

// ----------------------------------------------------------------------------- showing answers

/**
 * The answer of a JSON-mode turn, shown once it is complete: the parsed value pretty-printed in a
 * <pre> (the raw text hidden), or the raw text and a note when it does not parse. Returns the note
 * to show with the turn's other notes ("" when it parsed).
 * @param {HTMLElement} bubble the answer's .msg element (its .content holds the raw text)
 * @param {string} text the raw answer
 * @param {string | null} finish the finish_reason
 */
export function showJsonAnswer(bubble, text, finish) {
  let view = /** @type {HTMLElement | null} */ (bubble.querySelector(".json-view"));
  const content = /** @type {HTMLElement | null} */ (bubble.querySelector(".content"));
  let value;
  let parsed = false;
  try {
    value = JSON.parse(text);
    parsed = true;
  } catch { /* shown raw, with a note */ }
  if (!parsed) {
    if (view) view.remove();
    if (content) content.hidden = false;
    bubble.dataset.json = "unparsed";
    return finish === "length" ? "jsonCut" : "jsonUnparsed";
  }
  if (!view) {
    view = el("pre", "json-view");
    if (content) content.after(view);
    else bubble.append(view);
  }
  view.textContent = JSON.stringify(value, null, 2);
  if (content) content.hidden = true;
  bubble.dataset.json = "parsed";
  return "";
}

/**
 * Merge tool-call fragments (OpenAI's `delta.tool_calls`: by `index`, `arguments` arriving in
 * pieces to concatenate) into `calls`.
 * @param {ToolCall[]} calls
 * @param {any[]} fragments
 */
export function mergeToolCalls(calls, fragments) {
  for (const [i, f] of fragments.entries()) {
    if (!f || typeof f !== "object") continue;
    const index = Number.isInteger(f.index) ? f.index : i;
    const call = (calls[index] ||= { id: "", type: "function", name: "", arguments: "" });
    if (typeof f.id === "string" && f.id) call.id = f.id;
    if (typeof f.type === "string" && f.type) call.type = f.type;
    const fn = f.function || {};
    if (typeof fn.name === "string") call.name += fn.name;
    if (typeof fn.arguments === "string") call.arguments += fn.arguments;
  }
}

/**
 * The calls as blocks in `box` (replacing what was there): each its name and its arguments,
 * pretty-printed when they parse (still arriving: as they are).
 * @param {HTMLElement} box
 * @param {ToolCall[]} calls
 */
export function renderToolCalls(box, calls) {
  box.textContent = "";
  for (const call of calls) {
    if (!call) continue;
    const block = el("div", "tool-call");
    block.dataset.name = call.name;
    if (call.id) block.dataset.id = call.id;
    const head = el("div", "tool-call-head");
    const label = el("span", "tool-call-label", tr("toolCall"));
    label.dataset.i18n = "toolCall"; // re-translated with the page
    head.append(label, " ", el("code", "tool-call-name", call.name));
    let args = call.arguments;
    try {
      args = JSON.stringify(JSON.parse(call.arguments), null, 2);
      block.dataset.parsed = "true";
    } catch {
      block.dataset.parsed = "false";
    }
    block.append(head, el("pre", "tool-call-args", args));
    box.append(block);
  }
  box.hidden = !box.childElementCount;
}

// ----------------------------------------------------------------------------- wiring

export function initStructured() {
  Object.assign(dom, {
    toggle: $("#json-mode"),
    panel: $("#json-panel"),
    example: $("#json-example"),
    schema: $("#json-schema"),
    error: $("#json-error"),
  });
  dom.toggle.addEventListener("change", render);
  dom.example.addEventListener("change", () => {
    const name = dom.example.value;
    if (!EXAMPLES[name]) return;
    exampleName = name;
    dom.schema.value = JSON.stringify(EXAMPLES[name].schema, null, 2);
    hideError();
  });
  dom.schema.addEventListener("input", hideError);
  onLanguage(renderExamples);
  render();
}
