// The chat page of `kvserve serve` (docs/server.md, "Chat page"): streams
// answers from /v1/chat/completions and keeps the conversation in
// localStorage. Model text is only ever inserted as text (textContent, text
// nodes), never parsed as HTML; the page's CSP forbids inline script besides.

const STORAGE_KEYS = {
  conversation: "kvserve.webui.conversation",
  settings: "kvserve.webui.settings",
  apiKey: "kvserve.webui.apiKey",
};
const SAVE_INTERVAL_MS = 300;  // while an answer streams, the conversation is saved at most this often

// ---- Rendering model text ----

// A reasoning model's answer split into its thinking and the rest: "<think>...</think>answer", or
// "...</think>answer" where the chat template opened the tag itself. `thinking`: the end tag is still to come.
function splitThinking(text) {
  const open = text.indexOf("<think>");
  if (open >= 0 && text.slice(0, open).trim() === "") {
    const start = open + "<think>".length;
    const close = text.indexOf("</think>", start);
    if (close < 0) return { reasoning: text.slice(start), answer: "", thinking: true };
    return { reasoning: text.slice(start, close), answer: text.slice(close + "</think>".length).trimStart(), thinking: false };
  }
  const close = text.indexOf("</think>");
  if (open < 0 && close >= 0)
    return { reasoning: text.slice(0, close), answer: text.slice(close + "</think>".length).trimStart(), thinking: false };
  return { reasoning: "", answer: text, thinking: false };
}

// Text with `code` spans: each span a <code>, the rest text nodes.
function appendInline(parent, text) {
  const parts = text.split("`");
  parts.forEach((part, i) => {
    if (i % 2 === 1 && i < parts.length - 1) {
      const code = document.createElement("code");
      code.textContent = part;
      parent.append(code);
    } else {
      parent.append((i % 2 === 1 ? "`" : "") + part);  // an unclosed backtick stays a backtick
    }
  });
}

function proseBlocks(text) {
  const blocks = [];
  for (const paragraph of text.split(/\n{2,}/)) {
    if (paragraph.trim() === "") continue;
    const p = document.createElement("p");
    appendInline(p, paragraph);
    blocks.push(p);
  }
  return blocks;
}

function codeBlock(lines, language) {
  const pre = document.createElement("pre");
  const code = document.createElement("code");
  if (language) {
    code.className = "language-" + language.replace(/[^\w+#.-]/g, "");
    pre.dataset.language = language;
  }
  code.textContent = lines.join("\n");
  pre.append(code);
  return pre;
}

// Model text as DOM nodes: ``` fences become <pre><code>, the rest paragraphs. A fence still open (the
// answer is streaming) runs to the end.
function renderText(text) {
  const fragment = document.createDocumentFragment();
  let prose = [];
  let code = null;
  let language = "";
  for (const line of text.split("\n")) {
    const fence = line.match(/^\s*```+\s*([^\s`]*)\s*$/);
    if (fence && code === null) {
      fragment.append(...proseBlocks(prose.join("\n")));
      prose = [];
      code = [];
      language = fence[1];
    } else if (fence && fence[1] === "") {
      fragment.append(codeBlock(code, language));
      code = null;
    } else if (code !== null) {
      code.push(line);
    } else {
      prose.push(line);
    }
  }
  if (code !== null) fragment.append(codeBlock(code, language));
  fragment.append(...proseBlocks(prose.join("\n")));
  return fragment;
}

// ---- Server-sent events ----

// Feeds decoded text in, calls onData with each event's data ("[DONE]" included).
function createSseParser(onData) {
  let buffer = "";
  return {
    push(text) {
      buffer += text.replace(/\r/g, "");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
        if (data.length > 0) onData(data.join("\n"));
      }
    },
  };
}

// ---- Storage (the page works on without it: private windows may refuse) ----

function loadJson(key, fallback) {
  try {
    const text = localStorage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;
  }
}

function saveJson(key, value) {
  try {
    if (value === null) localStorage.removeItem(key);
    else localStorage.setItem(key, JSON.stringify(value));
  } catch {
    // storage full or refused: the conversation lives on in the page
  }
}

// ---- Answer statistics ----

// Tokens per second of one answer: the server's token count (usage) where the stream gave one, else the
// stream's chunks; decode speed over the time between the first and the last token.
function answerStats({ startedAt, firstAt, lastAt, chunks, usage, stopped }) {
  const tokens = usage ? usage.completion_tokens : chunks;
  const decodeSeconds = firstAt === null ? 0 : (lastAt - firstAt) / 1000;
  return {
    tokens,
    counted: !usage,
    perSecond: tokens > 1 && decodeSeconds > 0 ? (tokens - 1) / decodeSeconds : null,
    firstTokenSeconds: firstAt === null ? null : (firstAt - startedAt) / 1000,
    stopped,
  };
}

function describeStats(stats) {
  const parts = [`${stats.tokens} tokens${stats.counted ? " (counted from the stream)" : ""}`];
  if (stats.perSecond !== null) parts.push(`${stats.perSecond.toFixed(1)} tokens/s`);
  if (stats.firstTokenSeconds !== null) parts.push(`first token after ${stats.firstTokenSeconds.toFixed(2)} s`);
  if (stats.stopped) parts.push("stopped");
  return parts.join(" · ");
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch {
    // not JSON: the status says enough
  }
  return `HTTP ${response.status}`;
}

// ---- The page ----

class ChatPage {
  constructor() {
    const $ = (id) => document.getElementById(id);
    this.el = {
      model: $("model"), system: $("system"), temperature: $("temperature"), topP: $("top-p"),
      maxTokens: $("max-tokens"), seed: $("seed"), settings: $("settings-form"), messages: $("messages"),
      composer: $("composer"), message: $("message"), send: $("send"), stop: $("stop"), newChat: $("new-chat"),
      status: $("status"), keyForm: $("api-key-form"), key: $("api-key"), keyReason: $("api-key-reason"),
      changeKey: $("change-key"),
    };
    this.conversation = loadJson(STORAGE_KEYS.conversation, []);
    this.apiKey = loadJson(STORAGE_KEYS.apiKey, "");
    this.controller = null;  // the AbortController of the answer streaming now
    this.lastSave = 0;
    this.restoreSettings();
    this.bindEvents();
    this.renderConversation();
    this.loadModels();
  }

  bindEvents() {
    const el = this.el;
    el.composer.addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    el.message.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); el.composer.requestSubmit(); }
    });
    el.stop.addEventListener("click", () => this.controller && this.controller.abort());
    el.newChat.addEventListener("click", () => this.newChat());
    el.settings.addEventListener("input", () => this.saveSettings());
    el.model.addEventListener("change", () => this.saveSettings());
    el.keyForm.addEventListener("submit", (e) => { e.preventDefault(); this.useKey(el.key.value.trim()); });
    el.changeKey.addEventListener("click", () => this.askForKey("Enter another API key."));
  }

  // ---- settings ----

  restoreSettings() {
    const s = loadJson(STORAGE_KEYS.settings, {});
    for (const [name, input] of this.settingInputs()) if (typeof s[name] === "string") input.value = s[name];
    this.savedModel = s.model;
  }

  settingInputs() {
    const el = this.el;
    return [["system", el.system], ["temperature", el.temperature], ["top_p", el.topP], ["max_tokens", el.maxTokens],
            ["seed", el.seed]];
  }

  saveSettings() {
    const s = { model: this.el.model.value };
    for (const [name, input] of this.settingInputs()) s[name] = input.value;
    saveJson(STORAGE_KEYS.settings, s);
  }

  // The sampling fields of a request; empty inputs are left to the server's defaults.
  samplingFields() {
    const fields = {};
    const number = (input) => (input.value.trim() === "" ? null : Number(input.value));
    if (number(this.el.temperature) !== null) fields.temperature = number(this.el.temperature);
    if (number(this.el.topP) !== null) fields.top_p = number(this.el.topP);
    if (number(this.el.maxTokens) !== null) fields.max_tokens = Math.round(number(this.el.maxTokens));
    if (number(this.el.seed) !== null) fields.seed = Math.round(number(this.el.seed));
    return fields;
  }

  // ---- the API and its key ----

  api(path, options = {}) {
    const headers = { ...(options.headers || {}) };
    if (this.apiKey) headers.Authorization = "Bearer " + this.apiKey;
    return fetch(path, { ...options, headers });
  }

  async loadModels() {
    let response;
    try {
      response = await this.api("/v1/models");
    } catch (e) {
      this.setStatus("Cannot reach the server: " + e.message);
      return;
    }
    if (response.status === 401) {
      this.askForKey(this.apiKey ? "The saved API key was refused; enter another." : "This server needs an API key.");
      return;
    }
    if (!response.ok) {
      this.setStatus("Listing the models failed: " + (await errorMessage(response)));
      return;
    }
    const ids = ((await response.json()).data || []).map((m) => m.id);
    this.el.model.replaceChildren(...ids.map((id) => new Option(id, id)));
    if (ids.includes(this.savedModel)) this.el.model.value = this.savedModel;
    this.el.changeKey.hidden = !this.apiKey;
    this.setStatus(ids.length ? "" : "The server lists no models.");
  }

  askForKey(reason) {
    this.el.keyReason.textContent = reason;
    this.el.keyForm.hidden = false;
    this.el.key.value = "";
    this.el.key.focus();
  }

  useKey(key) {
    if (!key) return;
    this.apiKey = key;
    saveJson(STORAGE_KEYS.apiKey, key);
    this.el.keyForm.hidden = true;
    this.loadModels();
  }

  setStatus(text) {
    this.el.status.textContent = text;
  }

  // ---- the conversation ----

  saveConversation(force) {
    const now = performance.now();
    if (!force && now - this.lastSave < SAVE_INTERVAL_MS) return;
    this.lastSave = now;
    saveJson(STORAGE_KEYS.conversation, this.conversation);
  }

  newChat() {
    if (this.controller) this.controller.abort();
    this.conversation = [];
    saveJson(STORAGE_KEYS.conversation, null);
    this.renderConversation();
    this.el.message.focus();
  }

  // The messages of a request: the system prompt, then the conversation without the thinking of earlier answers.
  requestMessages() {
    const messages = [];
    const system = this.el.system.value.trim();
    if (system) messages.push({ role: "system", content: system });
    for (const m of this.conversation) {
      const content = m.role === "assistant" ? splitThinking(m.content).answer : m.content;
      if (m.role === "assistant" && content === "") continue;  // an answer stopped before it began
      messages.push({ role: m.role, content });
    }
    return messages;
  }

  async send() {
    const text = this.el.message.value;
    const model = this.el.model.value;
    if (this.controller || text.trim() === "") return;
    if (!model) {
      this.setStatus("No model to send to: the model list did not load.");
      return;
    }
    this.el.message.value = "";
    this.conversation.push({ role: "user", content: text });
    const body = { model, messages: this.requestMessages(), stream: true, stream_options: { include_usage: true },
                   ...this.samplingFields() };
    const answer = { role: "assistant", model, content: "", reasoning: "", stats: null, error: "" };
    this.conversation.push(answer);
    this.renderConversation();
    this.saveConversation(true);
    this.setStreaming(true);
    try {
      await this.streamAnswer(body, answer, this.el.messages.lastElementChild);
    } finally {
      this.setStreaming(false);
      this.saveConversation(true);
    }
  }

  setStreaming(streaming) {
    if (!streaming) this.controller = null;
    this.el.send.disabled = streaming;
    this.el.stop.disabled = !streaming;
    this.el.messages.setAttribute("aria-busy", String(streaming));
  }

  // Streams one answer into `answer` and its element; a stop keeps what arrived.
  async streamAnswer(body, answer, element) {
    this.controller = new AbortController();
    const timing = { startedAt: performance.now(), firstAt: null, lastAt: null, chunks: 0, usage: null, stopped: false };
    const parser = createSseParser((data) => {
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message || "the server reported an error");
      if (event.usage) timing.usage = event.usage;
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (!delta || !(delta.content || delta.reasoning_content)) return;
      timing.firstAt = timing.firstAt ?? performance.now();
      timing.lastAt = performance.now();
      timing.chunks += 1;
      answer.content += delta.content || "";
      answer.reasoning += delta.reasoning_content || "";
      this.updateMessage(element, answer);
      this.saveConversation(false);
    });
    try {
      const response = await this.api("/v1/chat/completions", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
        signal: this.controller.signal,
      });
      if (response.status === 401) this.askForKey("The server refused the API key; enter another.");
      if (!response.ok) throw new Error(await errorMessage(response));
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.push(decoder.decode(value, { stream: true }));
      }
    } catch (e) {
      if (e.name === "AbortError") {
        timing.stopped = true;
      } else {
        answer.error = e.message;
        this.controller.abort();  // an error event mid-stream: let go of the connection
      }
    }
    answer.stats = answerStats(timing);
    this.updateMessage(element, answer);
  }

  // ---- rendering ----

  renderConversation() {
    this.el.messages.replaceChildren(...this.conversation.map((m) => this.messageElement(m)));
    this.scrollToEnd(true);
  }

  messageElement(message) {
    const element = document.createElement("article");
    element.className = "message " + (message.role === "user" ? "user" : "assistant");
    const role = document.createElement("h2");
    role.className = "role";
    role.textContent = message.role === "user" ? "You" : "Assistant" + (message.model ? ` (${message.model})` : "");
    const reasoning = document.createElement("details");
    reasoning.className = "reasoning";
    const summary = document.createElement("summary");
    const reasoningText = document.createElement("div");
    reasoningText.className = "reasoning-text";
    reasoning.append(summary, reasoningText);
    const content = document.createElement("div");
    content.className = "content";
    const error = document.createElement("p");
    error.className = "error";
    error.setAttribute("role", "alert");
    const stats = document.createElement("p");
    stats.className = "tokens-per-second";
    element.append(role, reasoning, content, error, stats);
    this.updateMessage(element, message);
    return element;
  }

  updateMessage(element, message) {
    const follow = this.isScrolledToEnd();
    const split = message.role === "assistant" ? splitThinking(message.content) : { reasoning: "", answer: message.content };
    const reasoning = [message.reasoning, split.reasoning].filter(Boolean).join("\n").trim();
    const details = element.querySelector(".reasoning");
    details.hidden = reasoning === "";
    details.querySelector("summary").textContent = split.thinking ? "Reasoning (thinking…)" : "Reasoning";
    details.querySelector(".reasoning-text").replaceChildren(renderText(reasoning));
    element.querySelector(".content").replaceChildren(renderText(split.answer));
    const error = element.querySelector(".error");
    error.hidden = !message.error;
    error.textContent = message.error ? "Error: " + message.error : "";
    const stats = element.querySelector(".tokens-per-second");
    stats.hidden = !message.stats;
    stats.textContent = message.stats ? describeStats(message.stats) : "";
    if (follow) this.scrollToEnd(true);
  }

  isScrolledToEnd() {
    const m = this.el.messages;
    return m.scrollHeight - m.scrollTop - m.clientHeight < 40;
  }

  scrollToEnd(always) {
    if (always || this.isScrolledToEnd()) this.el.messages.scrollTop = this.el.messages.scrollHeight;
  }
}

// The page, and the pure functions for tests (tests/webui_browser_test.py calls them through execute_script).
window.kvserveChat = { page: new ChatPage(), renderText, splitThinking, createSseParser, answerStats, describeStats };
