// @ts-check
/* The page's entry point: translates the page, starts each part (chat, image, timings, CPU panel),
 * loads the server's configuration and hands it to the parts that need it.
 */

import { config, loadConfig } from "./api.js";
import { configureChat, initChat, isWorking } from "./chat.js";
import { initCpu } from "./cpu.js";
import { initImages, reencodeImage } from "./images.js";
import { applyLanguage, lang, onLanguage, setLanguage, tr } from "./strings.js";
import { initStructured } from "./structured.js";
import { initTimings } from "./timings.js";
import { initVideo } from "./video.js";
import { $ } from "./util.js";

const dom = {
  lang: $("#lang"),
  modelName: $("#model-name"),
  demoNotice: $("#demo-notice"),
  configError: $("#config-error"),
};

function renderHeader() {
  dom.lang.textContent = tr("langButton");
  dom.lang.setAttribute("aria-label", lang === "zh" ? "Switch to English" : "切换到中文");
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

async function start() {
  onLanguage(renderHeader);
  initTimings();
  initImages();
  initVideo();
  initChat();
  initStructured();
  dom.lang.addEventListener("click", () => setLanguage(lang === "zh" ? "en" : "zh"));
  applyLanguage();
  initCpu(isWorking);

  const loaded = await loadConfig(() => {
    dom.configError.textContent = tr("configError");
    dom.configError.hidden = false;
  });
  dom.configError.hidden = true;
  dom.modelName.textContent = loaded.model || "";
  dom.modelName.title = loaded.model || "";
  renderHeader();
  configureChat();
  reencodeImage(); // an image chosen before the config arrived: now with the server's budget
}

start();
