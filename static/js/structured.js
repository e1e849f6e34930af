// @ts-check
/* Structured answers: the JSON switch (a schema, or none for any JSON object; two example schemas to
 * start from; the answer asked as JSON or as a call of one function), what it adds to requests
 * (`response_format`, or `tools` and a `tool_choice` naming the function), and how the answer is
 * shown: parsed and pretty-printed, or the raw text with a note when it does not parse (cut by
 * max_tokens). Also the model's tool calls (`delta.tool_calls` fragments in the stream,
 * `message.tool_calls` in a whole answer), each shown as a call block with its name and arguments.
 *
 * The server enforces the schema with a grammar (docs/api.md, Structured output and Tool calls), so
 * an answer that ended normally parses, and a forced call's arguments follow the schema; a schema it
 * cannot use is a 400 whose message the conversation shows.
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
 * @typedef {{type: "function", function: {name: string, description: string, parameters: object}}} Tool
 * @typedef {{response_format: ResponseFormat} | {tools: Tool[], tool_choice: {type: "function", function: {name: string}}}} StructuredFields
 */

/** The function a schema is sent as when the answer is asked as a call (an example's own name otherwise). */
export const FUNCTION_NAME = "record";

/** @type {{toggle: HTMLInputElement, panel: HTMLElement, example: HTMLSelectElement, schema: HTMLTextAreaElement, error: HTMLElement, asTool: HTMLInputElement}} */
const dom = /** @type {any} */ ({});
let exampleName = ""; // the example last put in the textarea (its name goes with the schema)

/** Whether the JSON switch is on. */
export const jsonMode = () => dom.toggle.checked;

/** How the answer is asked: as JSON (`response_format`) or as a call of one function (`tools`). */
export const answerAs = () => (dom.asTool.checked ? "tool" : "json");

/**
 * What the JSON switch adds to a request: nothing when it is off; asked as JSON, a `response_format`
 * (`json_object` for an empty schema, else `json_schema`); asked as a call, the schema as the
 * `parameters` of one function (any object for an empty schema) and a `tool_choice` naming it, so
 * the server forces that call. Throws an Error with a message for the user when the schema is not
 * JSON.
 * @returns {StructuredFields | null}
 */
export function structuredRequest() {
  hideError();
  if (!jsonMode()) return null;
  const text = dom.schema.value.trim();
  let schema = null;
  if (text) {
    try {
      schema = JSON.parse(text);
    } catch (err) {
      throw showError(tr("jsonSchemaInvalid", err instanceof Error ? err.message : String(err)));
    }
    if (!schema || typeof schema !== "object" || Array.isArray(schema)) throw showError(tr("jsonSchemaNotObject"));
  }
  const example = EXAMPLES[exampleName];
  const sameAsExample = !!schema && !!example && JSON.stringify(example.schema) === JSON.stringify(schema);
  if (answerAs() === "tool") {
    const name = sameAsExample ? example.name : FUNCTION_NAME;
    const fn = { name, description: tr("jsonFunctionDescription"), parameters: schema || { type: "object" } };
    return { tools: [{ type: "function", function: fn }], tool_choice: { type: "function", function: { name } } };
  }
  if (!schema) return { response_format: { type: "json_object" } };
  const name = sameAsExample ? example.name : "page_schema";
  return { response_format: { type: "json_schema", json_schema: { name, schema } } };
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
    asTool: $("#json-as-tool"),
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
