// The chat page of `kvserve serve` (docs/server.md, "Chat page"): streams
// answers from /v1/chat/completions and keeps the conversation in
// localStorage. Model text is only ever inserted as text (textContent, text
// nodes), never parsed as HTML; the page's CSP forbids inline script besides.

import {
  modelStatus, modelLabel, MODEL_STATUS_TEXT, splitThinking, renderText, createSseParser, loadJson, saveJson,
  answerStats, describeStats, showPending, roleText, errorMessage,
} from "/webui_util.js";

const STORAGE_KEYS = {
  conversation: "kvserve.webui.conversation",
  settings: "kvserve.webui.settings",
  apiKey: "kvserve.webui.apiKey",
};
const SAVE_INTERVAL_MS = 300;  // while an answer streams, the conversation is saved at most this often
const MODEL_POLL_MS = 500;  // while an answer waits for its model to load, the model list is read this often

// ---- The page ----

class ChatPage {
  constructor() {
    const $ = (id) => document.getElementById(id);
    this.el = {
      model: $("model"), system: $("system"), temperature: $("temperature"), topP: $("top-p"),
      maxTokens: $("max-tokens"), seed: $("seed"), settings: $("settings-form"), messages: $("messages"),
      composer: $("composer"), message: $("message"), send: $("send"), stop: $("stop"), newChat: $("new-chat"),
      status: $("status"), keyForm: $("api-key-form"), key: $("api-key"), keyReason: $("api-key-reason"),
      changeKey: $("change-key"), modelStatus: $("model-status"),
    };
    this.models = new Map();  // id -> /v1/models' entry
    this.modelsRead = 0;  // the number of the latest model list asked for: an older answer is not shown
    this.listFailed = false;  // the last read of the model list failed (the status line says so)
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
    el.model.addEventListener("change", () => {
      this.saveSettings();
      this.showModelStatus();
      this.refreshModels();  // the chosen model's status now
    });
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
    const models = await this.refreshModels();
    if (models === null) return;
    this.el.changeKey.hidden = !this.apiKey;
    this.setStatus(models.length ? "" : "The server lists no models.");
  }

  // Reads /v1/models and shows it (unless a later read was asked for meanwhile); null where it failed.
  async refreshModels() {
    const read = ++this.modelsRead;
    const models = await this.fetchModels();
    if (models !== null && read === this.modelsRead) this.showModels(models);
    if (models !== null && this.listFailed) this.setStatus("");
    this.listFailed = models === null;
    return models;
  }

  async fetchModels() {
    try {
      const response = await this.api("/v1/models");
      if (response.status === 401) {
        this.askForKey(this.apiKey ? "The saved API key was refused; enter another." : "This server needs an API key.");
        return null;
      }
      if (!response.ok) throw new Error(await errorMessage(response));
      return (await response.json()).data || [];
    } catch (e) {
      this.setStatus("Listing the models failed: " + e.message);
      return null;
    }
  }

  // The picker keeps the chosen model (else the saved one); with the same ids only the labels change, so that
  // an open picker stays open.
  showModels(models) {
    const select = this.el.model;
    const chosen = select.value || this.savedModel;
    this.models = new Map(models.map((m) => [m.id, m]));
    const same = models.length === select.options.length && models.every((m, i) => select.options[i].value === m.id);
    if (same) models.forEach((m, i) => { select.options[i].text = modelLabel(m); });
    else select.replaceChildren(...models.map((m) => new Option(modelLabel(m), m.id)));
    if (this.models.has(chosen)) select.value = chosen;
    this.showModelStatus();
  }

  showModelStatus() {
    const status = modelStatus(this.models.get(this.el.model.value));
    this.el.modelStatus.textContent = MODEL_STATUS_TEXT[status] || "";
    this.el.modelStatus.classList.toggle("loading", status === "loading");
  }

  // While an answer waits for its first token from a model that was not loaded, the picker and the answer show
  // the model loading (the request itself loads it).
  async followLoading(model, timing, element) {
    const controller = this.controller;
    const waiting = () => this.controller === controller && timing.firstAt === null;
    const loading = () => ["unloaded", "loading"].includes(modelStatus(this.models.get(model)));
    while (waiting() && loading()) {
      showPending(element, `Loading ${model}…`);
      await this.refreshModels();
      if (waiting()) await new Promise((resolve) => setTimeout(resolve, MODEL_POLL_MS));
    }
    if (waiting()) showPending(element, "");
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
      this.refreshModels();  // the statuses after the answer: the model loaded, maybe another unloaded
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
    this.followLoading(body.model, timing, element);
    const parser = createSseParser((data) => {
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new Error(event.error.message || "the server reported an error");
      if (event.usage) timing.usage = event.usage;
      if (typeof event.model === "string" && event.model) answer.model = event.model;  // the server's word
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
    const pending = document.createElement("p");
    pending.className = "pending";
    pending.hidden = true;
    const stats = document.createElement("p");
    stats.className = "tokens-per-second";
    element.append(role, reasoning, content, pending, error, stats);
    this.updateMessage(element, message);
    return element;
  }

  updateMessage(element, message) {
    const follow = this.isScrolledToEnd();
    element.querySelector(".role").textContent = roleText(message);
    showPending(element, "");
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
window.kvserveChat = { page: new ChatPage(), renderText, splitThinking, createSseParser, answerStats, describeStats,
                       modelLabel };
