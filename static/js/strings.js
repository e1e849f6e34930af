// @ts-check
/* Every string the page shows, in English and Chinese, and the current language.
 *
 * Elements in the HTML name their string with data-i18n (text), data-i18n-placeholder and
 * data-i18n-aria-label; modules that render text themselves re-render on `onLanguage`.
 */

import { storageGet, storageSet } from "./util.js";

export const STRINGS = {
  en: {
    langButton: "中文",
    apiKey: "API key",
    apiTitle: "API",
    apiIntro: "The same model answers these APIs; the official clients work as they are.",
    apiChat: "OpenAI Chat Completions",
    apiResponses: "OpenAI Responses",
    apiCompletions: "OpenAI Completions (raw text)",
    apiMessages: "Anthropic Messages",
    apiTokenize: "tokens of a text, and back",
    apiSchema: "every route's schema",
    apiKeyPlaceholder: "Bearer token",
    apiKeyNeeded: "This server needs an API key: enter it in the header field, then send again.",
    conversation: "Conversation",
    newChat: "New conversation",
    emptyHint: "Choose an image (or paste / drop one), then pick a preset or ask a question.",
    presetsLabel: "Presets",
    // Labels of the preset buttons by preset name (the prompts themselves come from /api/config).
    presets: { describe: "Describe", ocr: "Read text (OCR)", count: "Count shapes", locate: "Find objects",
               describe_video: "Describe video", free: "Free question" },
    questionLabel: "Question",
    questionPlaceholder: "Ask about the image… (Enter sends, Shift+Enter for a new line)",
    send: "Send",
    stop: "Stop",
    maxTokens: "Max tokens",
    image: "Image",
    dropZoneLabel: "Image drop zone",
    dropHint: "Drop an image or a short video here, or paste one with Ctrl+V",
    chooseImage: "Choose image…",
    changeImage: "Change…",
    removeImage: "Remove image",
    detail: "Detail",
    detailLow: "Low (fast)",
    detailAuto: "Auto",
    detailHigh: "High (slow)",
    noImage: "No image: questions are sent as text only.",
    tokensEstimate: (t) => `≈ ${t} image tokens`,
    encodeEstimate: (s) => `≈ ${s} to encode`,
    sentAs: (w, h, kb, fmt) => `sent as ${w}×${h} ${fmt}, ${kb} KB`,
    processing: "Preparing image…",
    notAnImage: "That file is not an image.",
    decodeFailed: "This image format cannot be decoded by the browser.",
    imageTooLarge: "The image is too large even after downscaling.",
    cpuTitle: "Server CPU",
    total: "Total",
    historyLabel: "CPU history (last samples)",
    rss: "Memory (RSS)",
    queueDepth: "Queue depth",
    serverState: "Server",
    busy: "busy",
    idleServer: "idle",
    imageCache: "Image cache",
    cacheStats: (c) => `${c.entries ?? 0} entries · ${c.hits ?? 0} hits / ${c.misses ?? 0} misses`,
    statsUnavailable: "Statistics unavailable.",
    statsNeedKey: "Statistics need the API key: enter it in the header field.",
    core: (i) => `Core ${i}`,
    state: {
      idle: "Idle",
      sending: "Sending…",
      queued: "Queued — waiting for the model…",
      analysing: "Analysing the image…",
      prefill: "Reading the prompt…",
      generating: "Generating…",
      done: "Done",
      stopped: "Stopped",
      error: "Error",
    },
    queuedPos: (n) => `Queued — position ${n}…`,
    truncated: "(answer cut at the max-tokens limit)",
    stoppedNote: "(stopped)",
    busyRetry: (n) => `Server busy, retry in ${n} s.`,
    busyRetrySoon: "Server busy, please retry in a moment.",
    networkError: (m) => `Network error: ${m}`,
    httpError: (s) => `Request failed (HTTP ${s}).`,
    streamClosed: "The connection closed before the answer was complete.",
    configError: "Could not load the server configuration; retrying…",
    demoNotice: "Demo mode.",
    lastAnswer: "Last answer",
    groundingShow: "Show boxes",
    groundingDownload: "Download image with boxes",
    jsonMode: "JSON",
    jsonSchema: "JSON Schema",
    jsonSchemaPlaceholder: "Empty: any JSON object. Or a JSON Schema the answer must follow.",
    jsonExampleLabel: "Example schemas",
    jsonPickExample: "Examples…",
    jsonExamples: { receipt: "Receipt", shapes: "Shape list" },
    jsonSchemaInvalid: (m) => `The schema is not valid JSON: ${m}`,
    jsonSchemaNotObject: "The schema must be a JSON object, e.g. {\"type\": \"object\"}.",
    jsonCut: "(not complete JSON: the answer was cut at the max-tokens limit; raise Max tokens)",
    jsonUnparsed: "(the answer is not valid JSON; shown as text)",
    toolCall: "Tool call",
    jsonAnswerAs: "Answer as",
    jsonAsJson: "JSON",
    jsonAsTool: "a function call",
    jsonFunctionDescription: "Record what the user asks about, as arguments that follow the schema.",
    video: {
      loading: "Reading the clip…",
      notPlayable: "The browser cannot play this clip; it is sent as it is and the server decodes it.",
      tooLarge: (mb) => `The clip is larger than the server's limit of ${mb} MB.`,
      tooLong: (s) => `The clip is longer than the server's limit of ${s} s.`,
      summary: (n, d) => `${n} frames sampled from ${d} s`,
      tokens: (t) => `≈ ${t} video tokens`,
      remove: "Remove video",
      stripLabel: "Sampled frames",
    },
    t: {
      queue_ms: "Queue",
      image_decode_ms: "Image decode",
      preprocess_ms: "Preprocess",
      vision_encode_ms: "Vision encode",
      image_tokens: "Image tokens",
      video_decode_ms: "Video decode",
      video_preprocess_ms: "Frame sampling + resize",
      video_frames: "Video frames",
      video_tokens: "Video tokens",
      prompt_ms: "Prefill",
      prompt_n: "Prompt tokens",
      predicted_ms: "Generation",
      predicted_n: "Output tokens",
      predicted_per_second: "Speed",
      tokPerSec: "tok/s",
      total_ms: "Total",
      cacheHit: "image features from cache",
      cTotal: (v) => `${v} total`,
      cVision: (v) => `vision ${v}`,
      cPrefill: (v) => `prefill ${v}`,
      cTokens: (n, r) => (r ? `${n} tokens at ${r} tok/s` : `${n} tokens`),
      cRate: (r) => `${r} tok/s`,
    },
  },
  zh: {
    langButton: "English",
    apiKey: "API 密钥",
    apiTitle: "API",
    apiIntro: "同一个模型回答以下 API；官方客户端可直接使用。",
    apiChat: "OpenAI 聊天补全（Chat Completions）",
    apiResponses: "OpenAI Responses",
    apiCompletions: "OpenAI 文本补全（原始文本）",
    apiMessages: "Anthropic Messages",
    apiTokenize: "文本与词元互相转换",
    apiSchema: "所有接口的模式定义",
    apiKeyPlaceholder: "Bearer 令牌",
    apiKeyNeeded: "此服务器需要 API 密钥：请在页眉的输入框中填写，然后重新发送。",
    conversation: "对话",
    newChat: "新对话",
    emptyHint: "选择一张图片（或粘贴 / 拖入），然后点一个预设或提出问题。",
    presetsLabel: "预设",
    presets: { describe: "描述", ocr: "识别文字", count: "数图形", locate: "找出物体", describe_video: "描述视频",
               free: "自由提问" },
    questionLabel: "问题",
    questionPlaceholder: "就这张图片提问…（Enter 发送，Shift+Enter 换行）",
    send: "发送",
    stop: "停止",
    maxTokens: "最大 token 数",
    image: "图片",
    dropZoneLabel: "图片拖放区",
    dropHint: "把图片或短视频拖到这里，或按 Ctrl+V 粘贴",
    chooseImage: "选择图片…",
    changeImage: "更换…",
    removeImage: "移除图片",
    detail: "细节",
    detailLow: "低（快）",
    detailAuto: "自动",
    detailHigh: "高（慢）",
    noImage: "没有图片：问题将仅以文字发送。",
    tokensEstimate: (t) => `约 ${t} 个图像 token`,
    encodeEstimate: (s) => `编码约需 ${s}`,
    sentAs: (w, h, kb, fmt) => `以 ${w}×${h} ${fmt} 发送，${kb} KB`,
    processing: "正在处理图片…",
    notAnImage: "该文件不是图片。",
    decodeFailed: "浏览器无法解码这种图片格式。",
    imageTooLarge: "图片缩小后仍然太大。",
    cpuTitle: "服务器 CPU",
    total: "总计",
    historyLabel: "CPU 历史（最近的采样）",
    rss: "内存（RSS）",
    queueDepth: "队列长度",
    serverState: "服务器",
    busy: "忙碌",
    idleServer: "空闲",
    imageCache: "图像缓存",
    cacheStats: (c) => `${c.entries ?? 0} 项 · 命中 ${c.hits ?? 0} / 未命中 ${c.misses ?? 0}`,
    statsUnavailable: "无法获取统计信息。",
    statsNeedKey: "统计信息需要 API 密钥：请在页眉的输入框中填写。",
    core: (i) => `核心 ${i}`,
    state: {
      idle: "空闲",
      sending: "发送中…",
      queued: "排队中——等待模型…",
      analysing: "正在分析图片…",
      prefill: "正在读取提示…",
      generating: "生成中…",
      done: "完成",
      stopped: "已停止",
      error: "出错",
    },
    queuedPos: (n) => `排队中——第 ${n} 位…`,
    truncated: "（回答已达到最大 token 数上限）",
    stoppedNote: "（已停止）",
    busyRetry: (n) => `服务器繁忙，请在 ${n} 秒后重试。`,
    busyRetrySoon: "服务器繁忙，请稍后重试。",
    networkError: (m) => `网络错误：${m}`,
    httpError: (s) => `请求失败（HTTP ${s}）。`,
    streamClosed: "回答完成之前连接已关闭。",
    configError: "无法加载服务器配置，正在重试…",
    demoNotice: "演示模式。",
    lastAnswer: "上一个回答",
    groundingShow: "显示标注框",
    groundingDownload: "下载带标注框的图片",
    jsonMode: "JSON",
    jsonSchema: "JSON Schema",
    jsonSchemaPlaceholder: "留空：任意 JSON 对象。或填写回答必须遵循的 JSON Schema。",
    jsonExampleLabel: "示例 Schema",
    jsonPickExample: "示例…",
    jsonExamples: { receipt: "收据", shapes: "图形列表" },
    jsonSchemaInvalid: (m) => `Schema 不是有效的 JSON：${m}`,
    jsonSchemaNotObject: "Schema 必须是一个 JSON 对象，例如 {\"type\": \"object\"}。",
    jsonCut: "（JSON 不完整：回答已达到最大 token 数上限而被截断；请调高最大 token 数）",
    jsonUnparsed: "（回答不是有效的 JSON；按文本显示）",
    toolCall: "工具调用",
    jsonAnswerAs: "回答形式",
    jsonAsJson: "JSON",
    jsonAsTool: "函数调用",
    jsonFunctionDescription: "按 Schema 以参数形式记录用户所问的内容。",
    video: {
      loading: "正在读取视频…",
      notPlayable: "浏览器无法播放此视频；将原样发送，由服务器解码。",
      tooLarge: (mb) => `视频超过服务器的 ${mb} MB 上限。`,
      tooLong: (s) => `视频超过服务器的 ${s} 秒上限。`,
      summary: (n, d) => `从 ${d} 秒中抽取 ${n} 帧`,
      tokens: (t) => `约 ${t} 个视频 token`,
      remove: "移除视频",
      stripLabel: "抽取的帧",
    },
    t: {
      queue_ms: "排队",
      image_decode_ms: "图像解码",
      preprocess_ms: "预处理",
      vision_encode_ms: "视觉编码",
      image_tokens: "图像 token 数",
      video_decode_ms: "视频解码",
      video_preprocess_ms: "抽帧与缩放",
      video_frames: "视频帧数",
      video_tokens: "视频 token 数",
      prompt_ms: "预填充",
      prompt_n: "提示 token 数",
      predicted_ms: "生成",
      predicted_n: "输出 token 数",
      predicted_per_second: "速度",
      tokPerSec: "token/秒",
      total_ms: "总计",
      cacheHit: "图像特征来自缓存",
      cTotal: (v) => `总计 ${v}`,
      cVision: (v) => `视觉编码 ${v}`,
      cPrefill: (v) => `预填充 ${v}`,
      cTokens: (n, r) => (r ? `${n} 个 token，${r} token/秒` : `${n} 个 token`),
      cRate: (r) => `${r} token/秒`,
    },
  },
};

// The language choice is a preference, not a secret: it may outlive the tab.
const LS_LANG = "vlservice.lang";

export let lang = initialLanguage();
const listeners = [];

function initialLanguage() {
  const saved = storageGet("localStorage", LS_LANG);
  if (saved === "en" || saved === "zh") return saved;
  return (navigator.language || "").toLowerCase().startsWith("zh") ? "zh" : "en";
}

/** The string `key` in the current language (English when missing); functions are called with `args`. */
export function tr(key, ...args) {
  const v = STRINGS[lang][key] ?? STRINGS.en[key];
  return typeof v === "function" ? v(...args) : v;
}

/** The current language's table (timings labels, state names). */
export const table = () => STRINGS[lang];

export function presetLabel(name, prompt) {
  return STRINGS[lang].presets[name] || STRINGS.en.presets[name] || prompt;
}

/** Call `fn` after every language change (and once the page is first translated). */
export function onLanguage(fn) {
  listeners.push(fn);
}

export function setLanguage(next) {
  lang = next === "zh" ? "zh" : "en";
  storageSet("localStorage", LS_LANG, lang);
  applyLanguage();
}

export function applyLanguage() {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  for (const node of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("[data-i18n]"))) {
    const v = tr(node.dataset.i18n);
    if (typeof v === "string") node.textContent = v;
  }
  const fields = /** @type {NodeListOf<HTMLInputElement | HTMLTextAreaElement>} */ (
    document.querySelectorAll("[data-i18n-placeholder]"));
  for (const node of fields) {
    node.placeholder = tr(node.dataset.i18nPlaceholder);
  }
  for (const node of /** @type {NodeListOf<HTMLElement>} */ (document.querySelectorAll("[data-i18n-aria-label]"))) {
    node.setAttribute("aria-label", tr(node.dataset.i18nAriaLabel));
  }
  for (const fn of listeners) fn(lang);
}
