// The chat page's functions that hold no state (webui.js is the page): model text rendered as DOM nodes, the
// server-sent events parser, the storage, the answer statistics and the model picker's labels. Model text is
// only ever inserted as text (textContent, text nodes), never parsed as HTML.

// ---- Models and their status ----

// A model's status in /v1/models ("loaded", "loading", "unloaded"; null on a one-model server, which gives none).
export function modelStatus(model) {
  return (model && model.status && model.status.value) || null;
}

// The picker's line for a model: its id, and its status unless it is ready.
export function modelLabel(model) {
  const status = modelStatus(model);
  if (status === null || status === "loaded") return model.id;
  return `${model.id} (${status === "loading" ? "loading…" : "not loaded"})`;
}

// The note beside the picker for the chosen model.
export const MODEL_STATUS_TEXT = {
  loaded: "loaded", loading: "loading…", unloaded: "not loaded: loads on the first message",
};

// ---- Rendering model text ----

// A reasoning model's answer split into its thinking and the rest: "<think>...</think>answer", or
// "...</think>answer" where the chat template opened the tag itself. `thinking`: the end tag is still to come.
export function splitThinking(text) {
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
    appendInline(p, paragraph.replace(/^\n+|\n+$/g, ""));  // (pre-wrap would show a blank line after a fence)
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
export function renderText(text) {
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
export function createSseParser(onData) {
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

export function loadJson(key, fallback) {
  try {
    const text = localStorage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;
  }
}

export function saveJson(key, value) {
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
export function answerStats({ startedAt, firstAt, lastAt, chunks, usage, stopped }) {
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

export function describeStats(stats) {
  const parts = [`${stats.tokens} tokens${stats.counted ? " (counted from the stream)" : ""}`];
  if (stats.perSecond !== null) parts.push(`${stats.perSecond.toFixed(1)} tokens/s`);
  if (stats.firstTokenSeconds !== null) parts.push(`first token after ${stats.firstTokenSeconds.toFixed(2)} s`);
  if (stats.stopped) parts.push("stopped");
  return parts.join(" · ");
}

// The line under an answer that has no text yet: what it waits for ("" hides it).
export function showPending(element, text) {
  const pending = element.querySelector(".pending");
  pending.textContent = text;
  pending.hidden = text === "";
}

export function roleText(message) {
  return message.role === "user" ? "You" : "Assistant" + (message.model ? ` (${message.model})` : "");
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch {
    // not JSON: the status says enough
  }
  return `HTTP ${response.status}`;
}
