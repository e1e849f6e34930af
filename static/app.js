/* vlservice web page — plain ES2020, no build step, no external libraries.
 *
 * Security note: model output and user input are only ever put into the page
 * as text (textContent / Text nodes), never as HTML.
 */
"use strict";

(() => {
  // ---------------------------------------------------------------------------
  // Strings (both languages). Preset prompts must stay byte-exact.
  // ---------------------------------------------------------------------------
  const PRESETS = {
    describe: { en: "Describe this image.", zh: "描述这张图片。" },
    ocr: { en: "Read all the text in this image.", zh: "读出图片中的所有文字。" },
    chart: {
      en: "Read the chart or table in this image and summarize it.",
      zh: "读取图片中的图表或表格并总结。",
    },
    free: { en: "", zh: "" },
  };

  const I18N = {
    en: {
      langButton: "中文",
      apiKey: "API key",
      apiKeyPlaceholder: "Bearer token",
      apiKeyNeeded: "This server needs an API key: enter it in the header field, then send again.",
      conversation: "Conversation",
      newChat: "New conversation",
      emptyHint: "Choose an image (or paste / drop one), then pick a preset or ask a question.",
      presetsLabel: "Presets",
      presetDescribe: "Describe",
      presetOcr: "Read text (OCR)",
      presetChart: "Chart / table",
      presetFree: "Free question",
      questionLabel: "Question",
      questionPlaceholder: "Ask about the image… (Enter sends, Shift+Enter for a new line)",
      send: "Send",
      stop: "Stop",
      maxTokens: "Max tokens",
      image: "Image",
      dropZoneLabel: "Image drop zone",
      dropHint: "Drop an image here, or paste one with Ctrl+V",
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
      core: (i) => `Core ${i}`,
      state: {
        idle: "Idle",
        sending: "Sending…",
        queued: "Queued — waiting for the model…",
        analysing: "Analysing the image…",
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
      needText: "Type a question first.",
      lastAnswer: "Last answer",
      t: {
        queue_ms: "Queue",
        image_decode_ms: "Image decode",
        preprocess_ms: "Preprocess",
        vision_encode_ms: "Vision encode",
        image_tokens: "Image tokens",
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
      apiKeyPlaceholder: "Bearer 令牌",
      apiKeyNeeded: "此服务器需要 API 密钥：请在页眉的输入框中填写，然后重新发送。",
      conversation: "对话",
      newChat: "新对话",
      emptyHint: "选择一张图片（或粘贴 / 拖入），然后点一个预设或提出问题。",
      presetsLabel: "预设",
      presetDescribe: "描述",
      presetOcr: "识别文字",
      presetChart: "图表 / 表格",
      presetFree: "自由提问",
      questionLabel: "问题",
      questionPlaceholder: "就这张图片提问…（Enter 发送，Shift+Enter 换行）",
      send: "发送",
      stop: "停止",
      maxTokens: "最大 token 数",
      image: "图片",
      dropZoneLabel: "图片拖放区",
      dropHint: "把图片拖到这里，或按 Ctrl+V 粘贴",
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
      core: (i) => `核心 ${i}`,
      state: {
        idle: "空闲",
        sending: "发送中…",
        queued: "排队中——等待模型…",
        analysing: "正在分析图片…",
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
      needText: "请先输入问题。",
      lastAnswer: "上一个回答",
      t: {
        queue_ms: "排队",
        image_decode_ms: "图像解码",
        preprocess_ms: "预处理",
        vision_encode_ms: "视觉编码",
        image_tokens: "图像 token 数",
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

  const LS_LANG = "vlservice.lang";
  const LS_KEY = "vlservice.apiKey";

  // ---------------------------------------------------------------------------
  // Small helpers
  // ---------------------------------------------------------------------------
  const $ = (sel) => document.querySelector(sel);

  function lsGet(key) {
    try { return window.localStorage.getItem(key); } catch (_) { return null; }
  }
  function lsSet(key, value) {
    try {
      if (value === null || value === "") window.localStorage.removeItem(key);
      else window.localStorage.setItem(key, value);
    } catch (_) { /* private mode etc. */ }
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  const isNum = (v) => typeof v === "number" && Number.isFinite(v);

  function fmtMs(ms) {
    if (!isNum(ms)) return "";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 10000) return `${(ms / 1000).toFixed(2)} s`;
    return `${(ms / 1000).toFixed(1)} s`;
  }

  // Python's round(): half to even (what Qwen's smart_resize uses).
  function roundHalfEven(x) {
    const r = Math.round(x);
    return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
  }

  // ---------------------------------------------------------------------------
  // State
  // ---------------------------------------------------------------------------
  let lang = "en";
  let config = null;
  let image = null;        // {source, srcW, srcH, isPng, fileSize, dataUrl, w, h, bytes, mime, tokens}
  let imageJob = 0;        // increments to discard stale async image work
  const turns = [];        // [{user: {text, image: {url, detail}|null}, assistant: {text, status}, el}]
  let active = null;       // in-flight request {controller, id, turn, ...}
  let uiState = "idle";
  let uiStateArg = null;

  // DOM
  const dom = {};

  // ---------------------------------------------------------------------------
  // i18n
  // ---------------------------------------------------------------------------
  function tr(key, ...args) {
    const v = I18N[lang][key] ?? I18N.en[key];
    return typeof v === "function" ? v(...args) : v;
  }

  function applyLanguage() {
    document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
    for (const node of document.querySelectorAll("[data-i18n]")) {
      const v = tr(node.dataset.i18n);
      if (typeof v === "string") node.textContent = v;
    }
    for (const node of document.querySelectorAll("[data-i18n-placeholder]")) {
      node.placeholder = tr(node.dataset.i18nPlaceholder);
    }
    for (const node of document.querySelectorAll("[data-i18n-aria-label]")) {
      node.setAttribute("aria-label", tr(node.dataset.i18nAriaLabel));
    }
    dom.lang.textContent = tr("langButton");
    dom.lang.setAttribute("aria-label", lang === "zh" ? "Switch to English" : "切换到中文");
    renderDemoNotice();
    renderState();
    renderTokenEstimate();
    renderAllTimings();
    renderLastStats();
    for (const t of turns) renderTurnNotes(t);
  }

  function setLanguage(next) {
    lang = next === "zh" ? "zh" : "en";
    lsSet(LS_LANG, lang);
    applyLanguage();
  }

  function initialLanguage() {
    const saved = lsGet(LS_LANG);
    if (saved === "en" || saved === "zh") return saved;
    const nav = (navigator.language || "").toLowerCase();
    return nav.startsWith("zh") ? "zh" : "en";
  }

  // ---------------------------------------------------------------------------
  // Config
  // ---------------------------------------------------------------------------
  async function loadConfig() {
    for (let attempt = 0; ; attempt++) {
      try {
        const resp = await fetch("/api/config", { headers: { Accept: "application/json" }, cache: "no-store" });
        if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
        config = await resp.json();
        dom.configError.hidden = true;
        break;
      } catch (err) {
        dom.configError.textContent = tr("configError");
        dom.configError.hidden = false;
        await new Promise((r) => setTimeout(r, Math.min(10000, 1000 * 2 ** Math.min(attempt, 4))));
      }
    }
    applyConfig();
  }

  function applyConfig() {
    dom.modelName.textContent = config.model || "";
    dom.modelName.title = config.model || "";
    renderDemoNotice();

    const needKey = !!config.api_key_required;
    dom.apiKeyWrap.hidden = !needKey;
    dom.apiKey.hidden = !needKey;
    if (needKey) dom.apiKey.value = lsGet(LS_KEY) || "";

    const def = Number(config.default_max_tokens) || 256;
    dom.maxTokens.value = String(def);
    if (isNum(config.max_tokens_cap)) dom.maxTokens.max = String(config.max_tokens_cap);

    dom.send.disabled = false;
    if (image) reencodeImage();
    renderTokenEstimate();
  }

  function renderDemoNotice() {
    if (!config || !config.demo) {
      dom.demoNotice.hidden = true;
      return;
    }
    const n = config.demo_notice;
    let text = "";
    if (n && typeof n === "object") text = n[lang] || n.en || n.zh || "";
    else if (typeof n === "string") text = n;
    dom.demoNotice.textContent = text || tr("demoNotice");
    dom.demoNotice.hidden = false;
  }

  function maxPixelsFor(detail) {
    const table = (config && config.detail_max_pixels) || {};
    return Number(table[detail]) || Number(table.auto) || 786432;
  }
  function tokenFactor() {
    return Number(config && config.token_factor) || 32;
  }

  // ---------------------------------------------------------------------------
  // Image handling
  // ---------------------------------------------------------------------------
  async function decodeImage(file) {
    if (typeof createImageBitmap === "function") {
      try {
        const bmp = await createImageBitmap(file, { imageOrientation: "from-image" });
        return { source: bmp, w: bmp.width, h: bmp.height };
      } catch (_) { /* fall back below */ }
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
      // The decoded pixels stay usable for drawImage after revoking.
      URL.revokeObjectURL(url);
    }
  }

  async function loadImageFile(file) {
    if (!file) return;
    hideImageError();
    if (file.type && !file.type.startsWith("image/")) {
      showImageError(tr("notAnImage"));
      return;
    }
    const job = ++imageJob;
    dom.tokenEstimate.textContent = tr("processing");
    let decoded;
    try {
      decoded = await decodeImage(file);
    } catch (_) {
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
    image = {
      source: decoded.source,
      srcW: decoded.w,
      srcH: decoded.h,
      isPng: file.type === "image/png",
      fileSize: file.size,
    };
    reencodeImage();
  }

  function releaseImage() {
    if (image && image.source && typeof image.source.close === "function") {
      try { image.source.close(); } catch (_) { /* ignore */ }
    }
    image = null;
  }

  // Target size so that w*h <= budget (aspect ratio kept).
  function fitToBudget(w, h, budget) {
    if (w * h <= budget) return { w, h };
    const scale = Math.sqrt(budget / (w * h));
    let nw = Math.max(1, Math.floor(w * scale));
    let nh = Math.max(1, Math.floor(h * scale));
    while (nw * nh > budget && (nw > 1 || nh > 1)) {
      if (nw >= nh) nw--; else nh--;
    }
    return { w: nw, h: nh };
  }

  // Qwen-style smart resize: each side rounded to a multiple of f, then kept
  // within the pixel budget. Returns the token count ceil(h/f)*ceil(w/f).
  function estimateTokens(w, h, budget) {
    const f = tokenFactor();
    let hb = Math.max(f, roundHalfEven(h / f) * f);
    let wb = Math.max(f, roundHalfEven(w / f) * f);
    if (hb * wb > budget) {
      const beta = Math.sqrt((h * w) / budget);
      hb = Math.max(f, Math.floor(h / beta / f) * f);
      wb = Math.max(f, Math.floor(w / beta / f) * f);
    }
    const minPixels = Number(config && config.min_pixels);
    if (minPixels && hb * wb < minPixels) {
      const beta = Math.sqrt(minPixels / (h * w));
      hb = Math.ceil((h * beta) / f) * f;
      wb = Math.ceil((w * beta) / f) * f;
    }
    return Math.ceil(hb / f) * Math.ceil(wb / f);
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
      const sctx = step.getContext("2d");
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
    const ctx = canvas.getContext("2d");
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
    const b64 = url.length - i - 1;
    const pad = url.endsWith("==") ? 2 : url.endsWith("=") ? 1 : 0;
    return Math.floor((b64 * 3) / 4) - pad;
  }

  function reencodeImage() {
    if (!image) return;
    const detail = dom.detail.value;
    const budget = maxPixelsFor(detail);
    const { w, h } = fitToBudget(image.srcW, image.srcH, budget);
    const maxBytes = Number(config && config.max_image_bytes) || 20 * 1024 * 1024;

    let url = null;
    let mime = "image/jpeg";
    // Keep PNG (lossless, e.g. screenshots with text) when the source was a
    // small PNG; otherwise JPEG quality 0.9.
    const smallPng = image.isPng && image.fileSize <= 1024 * 1024 && w * h <= 1024 * 1024;
    if (smallPng) {
      const c = drawScaled(image.source, image.srcW, image.srcH, w, h, false);
      const png = c.toDataURL("image/png");
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
    Object.assign(image, {
      dataUrl: url,
      mime,
      w,
      h,
      bytes: dataUrlBytes(url),
      detail,
      tokens: estimateTokens(w, h, budget),
    });
    renderImage();
  }

  function renderImage() {
    if (image && image.dataUrl) {
      dom.preview.src = image.dataUrl;
      dom.preview.hidden = false;
      dom.dropText.hidden = true;
      dom.dropZone.classList.add("has-image");
      dom.removeImage.hidden = false;
      dom.changeImage.hidden = false;
    } else {
      dom.preview.removeAttribute("src");
      dom.preview.hidden = true;
      dom.dropText.hidden = false;
      dom.dropZone.classList.remove("has-image");
      dom.removeImage.hidden = true;
      dom.changeImage.hidden = true;
    }
    renderTokenEstimate();
  }

  function renderTokenEstimate() {
    const box = dom.tokenEstimate;
    if (!box) return;
    box.textContent = "";
    if (!image || !image.dataUrl) {
      delete box.dataset.tokens;
      box.append(el("span", "muted", tr("noImage")));
      return;
    }
    box.dataset.tokens = String(image.tokens);
    box.append(el("strong", "tokens", tr("tokensEstimate", image.tokens)));
    const ms = config && config.encode_ms_per_token;
    if (isNum(ms)) {
      box.dataset.encodeMs = String(Math.round(image.tokens * ms));
      box.append(document.createTextNode(" · "), el("span", "encode", tr("encodeEstimate", fmtMs(image.tokens * ms))));
    } else {
      delete box.dataset.encodeMs;
    }
    const fmt = image.mime === "image/png" ? "PNG" : "JPEG";
    box.append(el("div", "muted small-text", tr("sentAs", image.w, image.h, Math.max(1, Math.round(image.bytes / 1024)), fmt)));
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
    if (dt.items) {
      for (const item of dt.items) {
        if (item.kind === "file" && item.type.startsWith("image/")) return item.getAsFile();
      }
    }
    return null;
  }

  // ---------------------------------------------------------------------------
  // Conversation rendering
  // ---------------------------------------------------------------------------
  function scrollToBottom(force) {
    const m = dom.messages;
    const near = m.scrollHeight - m.scrollTop - m.clientHeight < 80;
    if (force || near) m.scrollTop = m.scrollHeight;
    // On phone layout the page itself scrolls.
    if (force && window.matchMedia("(max-width: 859px)").matches) {
      dom.state.scrollIntoView({ block: "nearest" });
    }
  }

  function addUserBubble(turn) {
    const node = el("div", "msg user");
    if (turn.user.image) {
      const thumb = el("img", "thumb");
      thumb.alt = "";
      thumb.src = turn.user.image.url;
      node.append(thumb);
    }
    node.append(el("div", "content", turn.user.text));
    dom.messages.append(node);
  }

  function addAssistantBubble(turn) {
    const node = el("div", "msg assistant pending");
    const content = el("div", "content");
    const textNode = document.createTextNode("");
    content.append(textNode);
    const notes = el("div", "notes");
    const err = el("div", "error-text");
    err.hidden = true;
    const timings = el("div", "msg-timings");
    timings.hidden = true;
    node.append(content, notes, err, timings);
    dom.messages.append(node);
    turn.el = { node, content, textNode, notes, err, timings };
  }

  function renderTurnNotes(turn) {
    if (!turn.el) return;
    const a = turn.assistant;
    turn.el.notes.textContent = "";
    if (a.finish === "length") turn.el.notes.append(el("span", "", tr("truncated")));
    if (a.status === "stopped") turn.el.notes.append(el("span", "", tr("stoppedNote")));
    turn.el.notes.hidden = !turn.el.notes.childNodes.length;
    if (a.error) {
      turn.el.err.textContent = formatError(a.error);
      turn.el.err.hidden = false;
    }
    if (a.timings) {
      fillTimingsCompact(turn.el.timings, a.timings);
      turn.el.timings.hidden = false;
    }
  }

  function updateEmptyHint() {
    dom.emptyHint.hidden = turns.length > 0;
  }

  // ---------------------------------------------------------------------------
  // Timings
  // ---------------------------------------------------------------------------
  const TIMING_FIELDS = [
    ["queue_ms", "ms"],
    ["image_decode_ms", "ms"],
    ["preprocess_ms", "ms"],
    ["vision_encode_ms", "ms"],
    ["image_tokens", "n"],
    ["prompt_ms", "ms"],
    ["prompt_n", "n"],
    ["predicted_ms", "ms"],
    ["predicted_n", "n"],
    ["predicted_per_second", "rate"],
    ["total_ms", "ms"],
  ];

  // Full breakdown (the "last answer" card): one label/value row per field.
  function fillTimingsFull(box, t) {
    const L = I18N[lang].t;
    box.textContent = "";
    for (const [key, kind] of TIMING_FIELDS) {
      if (!isNum(t[key])) continue;
      let value;
      if (kind === "ms") value = fmtMs(t[key]);
      else if (kind === "rate") value = `${t[key].toFixed(1)} ${L.tokPerSec}`;
      else value = String(t[key]);
      const row = el("div", `t-row t-${key}`);
      row.dataset.key = key;
      row.append(el("span", "t-label", L[key]), document.createTextNode(" "), el("span", "t-value", value));
      box.append(row);
    }
    if (t.vision_cache_hit === true) {
      const badge = el("div", "t-row t-vision_cache_hit", L.cacheHit);
      badge.dataset.key = "vision_cache_hit";
      box.append(badge);
    }
  }

  // Compact one-line summary under each answer bubble.
  function fillTimingsCompact(box, t) {
    const L = I18N[lang].t;
    box.textContent = "";
    const add = (key, text) => {
      const span = el("span", `t-item t-${key}`, text);
      span.dataset.key = key;
      box.append(span);
    };
    if (isNum(t.total_ms)) add("total_ms", L.cTotal(fmtMs(t.total_ms)));
    if (isNum(t.vision_encode_ms) && t.vision_encode_ms > 0) add("vision_encode_ms", L.cVision(fmtMs(t.vision_encode_ms)));
    if (isNum(t.prompt_ms)) add("prompt_ms", L.cPrefill(fmtMs(t.prompt_ms)));
    const rate = isNum(t.predicted_per_second) ? t.predicted_per_second.toFixed(1) : null;
    if (isNum(t.predicted_n)) add("predicted_n", L.cTokens(t.predicted_n, rate));
    else if (rate) add("predicted_per_second", L.cRate(rate));
    if (t.vision_cache_hit === true) add("vision_cache_hit", L.cacheHit);
  }

  let lastTimings = null;
  function showLatestTimings(t) {
    lastTimings = t;
    renderLatestTimings();
  }
  function renderLatestTimings() {
    const box = dom.timings;
    if (!lastTimings) {
      box.textContent = "";
      box.hidden = true;
      box.dataset.cacheHit = "false";
      dom.timingsCard.hidden = true;
      return;
    }
    fillTimingsFull(box, lastTimings);
    box.dataset.cacheHit = lastTimings.vision_cache_hit === true ? "true" : "false";
    box.hidden = false;
    dom.timingsCard.hidden = false;
  }
  function renderAllTimings() {
    renderLatestTimings();
  }

  // ---------------------------------------------------------------------------
  // State line
  // ---------------------------------------------------------------------------
  function setState(s, arg = null) {
    uiState = s;
    uiStateArg = arg;
    renderState();
  }
  function renderState() {
    if (!dom.state) return;
    dom.state.dataset.state = uiState;
    let text = I18N[lang].state[uiState] || uiState;
    if (uiState === "queued" && isNum(uiStateArg) && uiStateArg > 0) text = tr("queuedPos", uiStateArg);
    dom.state.textContent = text;
  }

  function setBusy(busy) {
    dom.send.disabled = busy || !config;
    dom.send.hidden = false;
    dom.stop.hidden = !busy;
    dom.stop.disabled = !busy;
    document.body.classList.toggle("busy", busy);
    scheduleStats(true);
  }

  // ---------------------------------------------------------------------------
  // Errors
  // ---------------------------------------------------------------------------
  // error: {kind: "busy"|"http"|"network"|"server"|"stream"|"apikey", message, retryAfter, status}
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
      case "apikey":
        return tr("apiKeyNeeded");
      case "http":
        return e.message || tr("httpError", e.status);
      default:
        return e.message || tr("httpError", e.status || "?");
    }
  }

  function parseRetryAfter(value) {
    if (!value) return null;
    const s = value.trim();
    if (/^\d+$/.test(s)) return parseInt(s, 10);
    const date = Date.parse(s);
    if (!Number.isNaN(date)) return Math.max(0, Math.ceil((date - Date.now()) / 1000));
    return null;
  }

  // ---------------------------------------------------------------------------
  // Sending / streaming
  // ---------------------------------------------------------------------------
  function authHeaders() {
    const h = {};
    if (config && config.api_key_required) {
      const key = (dom.apiKey.value || "").trim();
      if (key) h.Authorization = `Bearer ${key}`;
    }
    return h;
  }

  function buildMessages(currentTurn) {
    const included = turns.filter(
      (t) => t === currentTurn || (t.assistant.status !== "error" && t.assistant.text.length > 0),
    );
    const msgs = [];
    for (const t of included) {
      const u = t.user;
      if (u.image) {
        msgs.push({
          role: "user",
          content: [
            { type: "image_url", image_url: { url: u.image.url, detail: u.image.detail } },
            { type: "text", text: u.text },
          ],
        });
      } else {
        msgs.push({ role: "user", content: u.text });
      }
      if (t !== currentTurn) msgs.push({ role: "assistant", content: t.assistant.text });
    }
    return { msgs, included };
  }

  function maxTokens() {
    let v = parseInt(dom.maxTokens.value, 10);
    if (!Number.isFinite(v) || v < 1) v = Number(config.default_max_tokens) || 256;
    if (isNum(config.max_tokens_cap)) v = Math.min(v, config.max_tokens_cap);
    return v;
  }

  async function send() {
    if (!config || active) return;
    const text = dom.question.value.trim();
    if (!text) {
      dom.question.focus();
      return;
    }
    if (config.api_key_required && !(dom.apiKey.value || "").trim()) {
      dom.apiKeyWrap.hidden = false;
      dom.apiKey.hidden = false;
      dom.apiKeyWrap.classList.add("attention");
      dom.apiKey.focus();
      setState("error");
      flashComposerError(tr("apiKeyNeeded"));
      return;
    }

    const turn = {
      user: { text, image: null },
      assistant: { text: "", status: "pending", error: null, timings: null, finish: null },
      el: null,
    };
    // The image goes in the FIRST (still valid) user message that had it.
    turns.push(turn);
    const { included } = buildMessages(turn);
    if (image && image.dataUrl) {
      const already = included.some((t) => t !== turn && t.user.image && t.user.image.url === image.dataUrl);
      if (!already) turn.user.image = { url: image.dataUrl, detail: dom.detail.value };
    }
    const { msgs } = buildMessages(turn);

    addUserBubble(turn);
    addAssistantBubble(turn);
    updateEmptyHint();
    dom.question.value = "";
    autoGrow();
    scrollToBottom(true);

    const controller = new AbortController();
    active = { controller, id: null, turn, stopped: false, cancelSent: false, hasImage: msgs.some((m) => Array.isArray(m.content)) };
    setBusy(true);
    setState("sending");
    // No response yet after a moment: the request is waiting for the model.
    const queuedTimer = setTimeout(() => {
      if (active && active.turn === turn && uiState === "sending") setState("queued");
    }, 300);

    const body = {
      model: config.model,
      messages: msgs,
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: maxTokens(),
    };

    try {
      const resp = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          Accept: "text/event-stream",
          "X-Request-Priority": "interactive",
          ...authHeaders(),
        },
        body: JSON.stringify(body),
        signal: controller.signal,
        cache: "no-store",
      });
      const headerId = resp.headers.get("X-Request-Id");
      if (headerId) active.id = headerId;
      if (active.stopped) {
        // Stop was pressed while the request was in flight.
        sendCancel(active);
        throw new DOMException("stopped", "AbortError");
      }
      if (!resp.ok) {
        await handleHttpError(resp, turn);
        return;
      }
      const qpos = parseInt(resp.headers.get("X-Queue-Position") || "0", 10);
      active.queuePos = Number.isFinite(qpos) ? qpos : 0;
      setState("queued", active.queuePos > 0 ? active.queuePos : null);
      await readStream(resp, turn);
    } catch (err) {
      if (err && err.name === "AbortError") {
        finishTurn(turn, "stopped");
      } else {
        turn.assistant.error = { kind: "network", message: (err && err.message) || String(err) };
        finishTurn(turn, "error");
      }
    } finally {
      clearTimeout(queuedTimer);
      if (active && active.turn === turn) active = null;
      setBusy(false);
    }
  }

  async function handleHttpError(resp, turn) {
    let message = "";
    try {
      const text = await resp.text();
      try {
        const j = JSON.parse(text);
        message = (j && j.error && (j.error.message || j.error.code)) || (typeof j.error === "string" ? j.error : "");
      } catch (_) {
        message = text && text.length < 300 && !/^\s*</.test(text) ? text.trim() : "";
      }
    } catch (_) { /* ignore */ }
    const status = resp.status;
    if (status === 429 || status === 503) {
      turn.assistant.error = { kind: "busy", status, message, retryAfter: parseRetryAfter(resp.headers.get("Retry-After")) };
    } else {
      turn.assistant.error = { kind: "http", status, message };
    }
    if (status === 401 || status === 403) {
      if (config && config.api_key_required) {
        dom.apiKeyWrap.hidden = false;
        dom.apiKey.hidden = false;
        dom.apiKeyWrap.classList.add("attention");
      }
    }
    finishTurn(turn, "error");
  }

  async function readStream(resp, turn) {
    const ctype = (resp.headers.get("Content-Type") || "").toLowerCase();
    if (ctype.includes("application/json")) {
      // A non-streamed answer (server ignored "stream": true).
      const j = await resp.json();
      if (j && j.error) {
        turn.assistant.error = { kind: "server", message: j.error.message || j.error.code || "error" };
        finishTurn(turn, "error");
        return;
      }
      const choice = (j && j.choices && j.choices[0]) || {};
      const text = (choice.message && choice.message.content) || "";
      if (text) appendContent(turn, String(text));
      turn.assistant.finish = choice.finish_reason || "stop";
      if (j && j.timings) {
        turn.assistant.timings = j.timings;
        showLatestTimings(j.timings);
      }
      finishTurn(turn, "done");
      return;
    }
    if (!resp.body) {
      // Very old browsers: no streaming body. Parse everything at once.
      const text = await resp.text();
      const parser = makeSseParser((ev) => handleEvent(ev, turn));
      parser.push(text);
      parser.end();
      settleAfterStream(turn);
      return;
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder("utf-8");
    const parser = makeSseParser((ev) => handleEvent(ev, turn));
    active.reader = reader;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      if (value && value.length) {
        parser.push(decoder.decode(value, { stream: true }));
        if (turn.assistant.status === "done" || turn.assistant.status === "error") {
          reader.cancel().catch(() => {});
          break;
        }
      }
    }
    parser.push(decoder.decode());
    parser.end();
    settleAfterStream(turn);
  }

  function settleAfterStream(turn) {
    const st = turn.assistant.status;
    if (st === "done" || st === "error" || st === "stopped") return;
    if (turn.assistant.finish) {
      finishTurn(turn, "done");
    } else {
      turn.assistant.error = { kind: "stream" };
      finishTurn(turn, "error");
    }
  }

  // Minimal Server-Sent Events parser. Calls onEvent({type, data}) or
  // onEvent({comment}) for ":" lines.
  function makeSseParser(onEvent) {
    let buf = "";
    let dataLines = [];
    let eventType = "";
    const dispatch = () => {
      if (dataLines.length) onEvent({ type: eventType || "message", data: dataLines.join("\n") });
      dataLines = [];
      eventType = "";
    };
    const line = (raw) => {
      if (raw === "") { dispatch(); return; }
      if (raw.startsWith(":")) { onEvent({ comment: raw.slice(1).trim() }); return; }
      const idx = raw.indexOf(":");
      const field = idx === -1 ? raw : raw.slice(0, idx);
      let value = idx === -1 ? "" : raw.slice(idx + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") dataLines.push(value);
      else if (field === "event") eventType = value;
    };
    return {
      push(text) {
        buf += text;
        let nl;
        while ((nl = buf.search(/\r\n|\n|\r/)) !== -1) {
          // A lone "\r" at the very end may be the first half of "\r\n".
          if (buf[nl] === "\r" && nl === buf.length - 1) break;
          const raw = buf.slice(0, nl);
          buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
          line(raw);
        }
      },
      end() {
        if (buf) { line(buf.replace(/\r$/, "")); buf = ""; }
        dispatch();
      },
    };
  }

  function handleEvent(ev, turn) {
    if (!active || active.turn !== turn) return;
    const a = turn.assistant;
    if (a.status === "done" || a.status === "error" || a.status === "stopped") return;

    if (ev.comment !== undefined) {
      // Keep-alive pings while the image is being encoded (or while queued).
      if (a.text.length === 0) {
        if (/queue/i.test(ev.comment) && !/encod|analy|vision|image/i.test(ev.comment)) {
          const m = ev.comment.match(/(\d+)/);
          setState("queued", m ? parseInt(m[1], 10) : uiStateArg);
        } else {
          setState("analysing");
        }
      }
      return;
    }

    const data = ev.data;
    if (data.trim() === "[DONE]") {
      finishTurn(turn, "done");
      return;
    }
    let obj;
    try {
      obj = JSON.parse(data);
    } catch (_) {
      return; // ignore malformed chunk
    }
    if (!obj || typeof obj !== "object") return;
    if (obj.error || ev.type === "error") {
      const e = obj.error || obj;
      a.error = { kind: "server", message: (e && (e.message || e.code || e.type)) || "error" };
      finishTurn(turn, "error");
      return;
    }
    if (obj.id && !active.id) active.id = String(obj.id);
    if (active.stopped && !active.cancelSent) sendCancel(active);

    for (const choice of obj.choices || []) {
      const delta = choice.delta || {};
      if (typeof delta.content === "string" && delta.content.length) {
        appendContent(turn, delta.content);
      } else if (delta.role && a.text.length === 0 && (uiState === "sending" || uiState === "queued")) {
        // The server accepted the request and started on it.
        if (!(active.queuePos > 0 && uiState === "queued")) setState(active.hasImage ? "analysing" : "generating");
      }
      if (choice.finish_reason) a.finish = choice.finish_reason;
    }
    if (obj.timings && typeof obj.timings === "object") {
      a.timings = obj.timings;
      showLatestTimings(obj.timings);
      renderTurnNotes(turn);
    }
    if (obj.usage && typeof obj.usage === "object") a.usage = obj.usage;
  }

  function appendContent(turn, text) {
    const a = turn.assistant;
    a.text += text;
    turn.el.textNode.appendData(text);
    turn.el.node.classList.remove("pending");
    if (uiState !== "generating") setState("generating");
    scrollToBottom(false);
  }

  function finishTurn(turn, status) {
    const a = turn.assistant;
    if (a.status === "done" || a.status === "error" || a.status === "stopped") return;
    a.status = status;
    if (turn.el) {
      turn.el.node.classList.remove("pending");
      turn.el.node.classList.toggle("error", status === "error");
      turn.el.node.classList.toggle("stopped", status === "stopped");
    }
    renderTurnNotes(turn);
    setState(status);
    scrollToBottom(false);
  }

  function sendCancel(req) {
    if (!req || !req.id || req.cancelSent) return;
    req.cancelSent = true;
    fetch(`/v1/chat/completions/${encodeURIComponent(req.id)}/cancel`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: "{}",
      keepalive: true,
    }).catch(() => { /* best effort */ });
  }

  function stop() {
    if (!active) return;
    const req = active;
    req.stopped = true;
    sendCancel(req);
    finishTurn(req.turn, "stopped");
    try { req.controller.abort(); } catch (_) { /* ignore */ }
  }

  function newConversation() {
    if (active) stop();
    turns.length = 0;
    dom.messages.textContent = "";
    lastTimings = null;
    renderLatestTimings();
    updateEmptyHint();
    setState("idle");
    dom.question.focus();
  }

  let composerErrTimer = null;
  function flashComposerError(msg) {
    dom.state.textContent = msg;
    clearTimeout(composerErrTimer);
    composerErrTimer = setTimeout(renderState, 4000);
  }

  // ---------------------------------------------------------------------------
  // Presets
  // ---------------------------------------------------------------------------
  function onPreset(name) {
    const p = PRESETS[name];
    if (!p) return;
    if (name === "free") {
      dom.question.value = "";
      autoGrow();
      dom.question.focus();
      return;
    }
    dom.question.value = p[lang];
    autoGrow();
    if (image && image.dataUrl && !active && config) send();
    else dom.question.focus();
  }

  // ---------------------------------------------------------------------------
  // CPU / stats panel
  // ---------------------------------------------------------------------------
  let statsTimer = null;
  let statsInFlight = false;
  let lastStats = null;
  let statsFailures = 0;

  function scheduleStats(soon) {
    clearTimeout(statsTimer);
    const fast = !!active || !!(lastStats && lastStats.busy);
    let delay = fast ? 500 : 2000;
    if (statsFailures > 2) delay = 5000;
    if (document.hidden) delay = Math.max(delay, 10000);
    if (soon) delay = Math.min(delay, 100);
    statsTimer = setTimeout(pollStats, delay);
  }

  async function pollStats() {
    if (statsInFlight) { scheduleStats(false); return; }
    statsInFlight = true;
    try {
      const resp = await fetch("/api/stats", { headers: { Accept: "application/json", ...authHeaders() }, cache: "no-store" });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      lastStats = await resp.json();
      statsFailures = 0;
      dom.statsError.hidden = true;
      renderStats(lastStats);
    } catch (_) {
      statsFailures++;
      dom.statsError.textContent = tr("statsUnavailable");
      dom.statsError.hidden = false;
    } finally {
      statsInFlight = false;
      scheduleStats(false);
    }
  }

  function renderLastStats() {
    if (lastStats) renderStats(lastStats);
    if (!dom.statsError.hidden) dom.statsError.textContent = tr("statsUnavailable");
  }

  function pctText(v) {
    return `${(Math.round(v * 10) / 10).toFixed(Math.abs(v) >= 100 ? 0 : 1)}%`;
  }

  function renderStats(s) {
    const cpu = (s && s.cpu) || {};
    const cores = Array.isArray(cpu.per_core) ? cpu.per_core : [];
    // One bar per core (rebuilt only when the core count changes).
    if (dom.coreBars.childElementCount !== cores.length) {
      dom.coreBars.textContent = "";
      cores.forEach((_, i) => {
        const row = el("div", "core-row");
        const label = el("span", "core-label");
        const track = el("div", "core-track");
        const bar = el("div", "core-bar");
        bar.setAttribute("role", "meter");
        bar.setAttribute("aria-valuemin", "0");
        bar.setAttribute("aria-valuemax", "100");
        track.append(bar);
        const val = el("span", "core-value");
        row.append(label, track, val);
        row.dataset.core = String(i);
        dom.coreBars.append(row);
      });
    }
    cores.forEach((raw, i) => {
      const v = Number(raw) || 0;
      const row = dom.coreBars.children[i];
      const bar = row.querySelector(".core-bar");
      bar.dataset.pct = String(v);
      bar.style.width = `${Math.max(0, Math.min(100, v))}%`;
      bar.setAttribute("aria-valuenow", String(v));
      bar.setAttribute("aria-label", tr("core", i));
      bar.classList.toggle("hot", v >= 85);
      row.querySelector(".core-label").textContent = tr("core", i);
      row.querySelector(".core-value").textContent = pctText(v);
    });

    const total = Number(cpu.total);
    dom.cpuTotal.textContent = isNum(total) ? pctText(total) : "–";
    if (isNum(total)) dom.cpuTotal.dataset.pct = String(total);

    drawHistory(Array.isArray(cpu.history) ? cpu.history.slice(-60) : []);

    dom.statRss.textContent = isNum(s.rss_bytes) ? `${(s.rss_bytes / 1048576).toFixed(0)} MB` : "–";
    dom.statQueue.textContent = isNum(s.queue_depth) ? String(s.queue_depth) : "–";
    dom.statBusy.textContent = typeof s.busy === "boolean" ? (s.busy ? tr("busy") : tr("idleServer")) : "–";
    dom.statBusy.classList.toggle("is-busy", s.busy === true);
    dom.statCache.textContent = s.cache && typeof s.cache === "object" ? tr("cacheStats", s.cache) : "–";
  }

  function drawHistory(points) {
    const canvas = dom.history;
    const dpr = window.devicePixelRatio || 1;
    const cssW = canvas.clientWidth || 300;
    const cssH = canvas.clientHeight || 60;
    const W = Math.round(cssW * dpr);
    const H = Math.round(cssH * dpr);
    if (canvas.width !== W || canvas.height !== H) {
      canvas.width = W;
      canvas.height = H;
    }
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, W, H);
    const styles = getComputedStyle(canvas);
    const lineColor = styles.getPropertyValue("--spark-line").trim() || "#2f5fd0";
    const fillColor = styles.getPropertyValue("--spark-fill").trim() || "rgba(47,95,208,0.15)";
    const gridColor = styles.getPropertyValue("--spark-grid").trim() || "rgba(128,128,128,0.25)";

    ctx.strokeStyle = gridColor;
    ctx.lineWidth = 1;
    for (const frac of [0.25, 0.5, 0.75]) {
      const y = Math.round(H * frac) + 0.5;
      ctx.beginPath();
      ctx.moveTo(0, y);
      ctx.lineTo(W, y);
      ctx.stroke();
    }
    const vals = points
      .map((p) => (Array.isArray(p) ? Number(p[1]) : Number(p)))
      .filter((v) => Number.isFinite(v));
    if (vals.length < 2) return;
    const n = 60;
    const step = W / (n - 1);
    const x0 = W - (vals.length - 1) * step;
    const yOf = (v) => H - (Math.max(0, Math.min(100, v)) / 100) * (H - 2 * dpr) - dpr;
    ctx.beginPath();
    vals.forEach((v, i) => {
      const x = x0 + i * step;
      if (i === 0) ctx.moveTo(x, yOf(v)); else ctx.lineTo(x, yOf(v));
    });
    ctx.lineWidth = 1.5 * dpr;
    ctx.strokeStyle = lineColor;
    ctx.stroke();
    ctx.lineTo(W, H);
    ctx.lineTo(x0, H);
    ctx.closePath();
    ctx.fillStyle = fillColor;
    ctx.fill();
  }

  // ---------------------------------------------------------------------------
  // Textarea
  // ---------------------------------------------------------------------------
  function autoGrow() {
    const q = dom.question;
    q.style.height = "auto";
    q.style.height = `${Math.min(q.scrollHeight + 2, 200)}px`;
  }

  // ---------------------------------------------------------------------------
  // Wiring
  // ---------------------------------------------------------------------------
  function init() {
    Object.assign(dom, {
      lang: $("#lang"),
      modelName: $("#model-name"),
      apiKeyWrap: $("#api-key-wrap"),
      apiKey: $("#api-key"),
      demoNotice: $("#demo-notice"),
      configError: $("#config-error"),
      messages: $("#messages"),
      emptyHint: $("#empty-hint"),
      state: $("#state"),
      timings: $("#timings"),
      timingsCard: $("#timings-card"),
      presets: $("#presets"),
      composer: $("#composer"),
      question: $("#question"),
      send: $("#send"),
      stop: $("#stop"),
      newChat: $("#new-chat"),
      maxTokens: $("#max-tokens"),
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
      coreBars: $("#core-bars"),
      cpuTotal: $("#cpu-total"),
      history: $("#cpu-history"),
      statRss: $("#stat-rss"),
      statQueue: $("#stat-queue"),
      statBusy: $("#stat-busy"),
      statCache: $("#stat-cache"),
      statsError: $("#stats-error"),
    });

    lang = initialLanguage();
    dom.detail.value = "auto";

    dom.lang.addEventListener("click", () => setLanguage(lang === "zh" ? "en" : "zh"));

    dom.apiKey.addEventListener("input", () => {
      lsSet(LS_KEY, dom.apiKey.value.trim());
      dom.apiKeyWrap.classList.remove("attention");
    });

    dom.composer.addEventListener("submit", (e) => {
      e.preventDefault();
      send();
    });
    dom.question.addEventListener("keydown", (e) => {
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

    dom.chooseImage.addEventListener("click", () => dom.fileInput.click());
    dom.changeImage.addEventListener("click", () => dom.fileInput.click());
    dom.removeImage.addEventListener("click", removeImage);
    dom.fileInput.addEventListener("change", () => {
      const f = dom.fileInput.files && dom.fileInput.files[0];
      if (f) loadImageFile(f);
    });
    dom.detail.addEventListener("change", () => {
      reencodeImage();
      renderTokenEstimate();
    });

    // Drag and drop: the drop zone highlights; a drop anywhere is accepted so
    // that a missed drop does not navigate away from the page.
    let dragDepth = 0;
    const hasFiles = (e) => e.dataTransfer && Array.from(e.dataTransfer.types || []).includes("Files");
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
      e.dataTransfer.dropEffect = "copy";
    });
    window.addEventListener("drop", (e) => {
      dragDepth = 0;
      dom.dropZone.classList.remove("dragging");
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
      dragDepth = 0;
      dom.dropZone.classList.remove("dragging");
      const f = imageFromDataTransfer(e.dataTransfer);
      if (f) loadImageFile(f);
    });

    // Paste an image anywhere (text pastes are left alone).
    document.addEventListener("paste", (e) => {
      const dt = e.clipboardData;
      if (!dt) return;
      // Pasting text into a text field stays a text paste.
      const target = e.target;
      const inField = target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT");
      if (inField && (dt.getData("text/plain") || "").trim()) return;
      let file = null;
      for (const item of dt.items || []) {
        if (item.kind === "file" && item.type.startsWith("image/")) {
          file = item.getAsFile();
          break;
        }
      }
      if (!file && dt.files && dt.files.length && dt.files[0].type.startsWith("image/")) file = dt.files[0];
      if (file) {
        e.preventDefault();
        loadImageFile(file);
      }
    });

    document.addEventListener("visibilitychange", () => scheduleStats(!document.hidden));
    window.addEventListener("resize", () => { if (lastStats) renderStats(lastStats); });

    applyLanguage();
    updateEmptyHint();
    renderImage();
    setBusy(false);
    loadConfig();
    pollStats();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
