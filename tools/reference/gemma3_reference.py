#!/usr/bin/env python3
"""Independent float64 numpy reference for Gemma 3 (GGUF arch ``gemma3``).

Reuses the GGUF loader pieces of llama_reference.py (own Q8_0/Q5_0/Q4_K/Q6_K
dequantizers, RMSNorm, NeoX RoPE, top-k), and adds the Gemma 3 block, as in
llama.cpp src/models/gemma3.cpp:

  x = token_embd[id] * float32(sqrt(dim))
  per layer il (sliding unless il % 6 == 5; theta 10000 sliding, freq_base global):
    h = rmsnorm(x) * attn_norm
    q, k, v = Wq h, Wk h, Wv h                      (no biases)
    q = rmsnorm_per_head(q) * attn_q_norm;  k = rmsnorm_per_head(k) * attn_k_norm
    q, k = NeoX RoPE (pairs i, i + head_dim/2)
    att = softmax(q k^T / sqrt(head_dim) + mask) v  (GQA; sliding layers:
          query p sees keys j with j <= p and p - j < sliding_window)
    x = x + rmsnorm(Wo att) * post_attention_norm
    h = rmsnorm(x) * ffn_norm
    x = x + rmsnorm(Wdown (gelu_tanh(Wgate h) * (Wup h))) * post_ffw_norm
  logits = token_embd @ (rmsnorm(x) * output_norm)   (tied)

The GGUF norm weights already include Gemma's "+1" (the converter adds it), so
they are plain multipliers. Everything is float64.

Usage:
  gemma3_reference.py --gguf gemma-3-270m-q4_k_m.gguf --prompt-ids 2,14946,3324,496,990 -n 16 --top 5
  # --no-cache: recompute the full sequence every step (checks the KV cache)
  # --window N: override the sliding window (e.g. to see how much it matters)
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402  (sets the BLAS thread variables before numpy)
import numpy as np  # noqa: E402

F = np.float64


def load_gemma3(path, check_dequant=False):
    import gguf
    r = gguf.GGUFReader(path)
    arch = ref.gguf_field(r, "general.architecture")
    assert arch == "gemma3", f"expected arch gemma3, got {arch}"
    a = "gemma3."
    g = lambda k, d=None: ref.gguf_field(r, a + k, d)  # noqa: E731
    dim = int(g("embedding_length"))
    n_heads = int(g("attention.head_count"))
    head_dim = int(g("attention.key_length"))
    assert int(g("attention.value_length", head_dim)) == head_dim
    n_layers = int(g("block_count"))
    window = g("attention.sliding_window")
    pattern = int(g("attention.sliding_window_pattern", 6))  # llama.cpp default for gemma3
    cfg = ref.Config(
        arch=arch, dim=dim, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=int(g("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        hidden=int(g("feed_forward_length")),
        # stored as f32 9.99999997e-07; used as stored
        eps=float(g("attention.layer_norm_rms_epsilon")),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        # no gemma3.rope.freq_base_swa key in the 270M file -> llama.cpp default 10000
        rope_theta_swa=float(g("rope.freq_base_swa", 10000.0)),
        sliding_window=int(window) if window is not None else None,
        swa_pattern=pattern,
        # llama.cpp: ggml_scale(inp, sqrtf(n_embd)), an f32 constant
        embed_scale=float(np.float32(np.sqrt(np.float32(dim)))),
        # gemma3-270m: f_attention_scale = 1/sqrt(n_embd_head_k)
        attn_scale=1.0 / np.sqrt(float(head_dim)),
        final_logit_softcap=float(g("final_logit_softcapping", 0.0) or 0.0),
    )
    assert g("rope.dimension_count") in (None, head_dim), "partial rotary not handled"
    assert g("rope.scaling.type") in (None, "none"), "rope scaling not handled"
    cfg.is_sliding = [cfg.sliding_window is not None and il % pattern < pattern - 1 for il in range(n_layers)]
    tensors = {t.name: t for t in r.tensors}
    assert "output.weight" not in tensors, "untied output not expected for gemma3-270m"
    checked = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
               "blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight",
               "blk.0.ffn_gate.weight", "blk.17.ffn_down.weight", "blk.17.attn_output.weight",
               "output_norm.weight", "blk.0.attn_q_norm.weight"}

    def get(name):
        return ref.tensor_to_f64(tensors[name], check_with_gguf=check_dequant and name in checked)

    W = {"tok_emb": get("token_embd.weight"), "norm": get("output_norm.weight"), "layers": []}
    cfg.tied_output = True
    for i in range(n_layers):
        p = f"blk.{i}."
        W["layers"].append({k: get(p + n + ".weight") for k, n in (
            ("attn_norm", "attn_norm"), ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"),
            ("wo", "attn_output"), ("q_norm", "attn_q_norm"), ("k_norm", "attn_k_norm"),
            ("post_attn_norm", "post_attention_norm"), ("ffn_norm", "ffn_norm"),
            ("w_gate", "ffn_gate"), ("w_up", "ffn_up"), ("w_down", "ffn_down"),
            ("post_ffn_norm", "post_ffw_norm"))})
    cfg.vocab = W["tok_emb"].shape[0]
    L0 = W["layers"][0]
    assert L0["wq"].shape == (n_heads * head_dim, dim)
    assert L0["wk"].shape == (cfg.n_kv_heads * head_dim, dim)
    assert L0["wo"].shape == (dim, n_heads * head_dim)
    assert L0["q_norm"].shape == (head_dim,)
    assert L0["w_gate"].shape == (cfg.hidden, dim) and L0["w_down"].shape == (dim, cfg.hidden)
    return cfg, W, r


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)))


def attention_mask(q_pos, S, window):
    """True = masked. Query at absolute position p sees key j iff j <= p and
    (window is None or p - j < window)."""
    j = np.arange(S)[None, :]
    p = np.asarray(q_pos)[:, None]
    m = j > p
    if window is not None:
        m |= (p - j) >= window
    return m


def forward_hidden(cfg, W, tokens, cache, window_override=None):
    """Run `tokens` at positions cache.length..; returns the final-normed
    hidden states [T, dim] (logits are taken by the caller, usually only for
    the last row: 262144 x T float64 logits would be large)."""
    T = len(tokens)
    start = cache.length
    pos = np.arange(start, start + T)
    H, KVH, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    group = H // KVH
    eps = cfg.eps
    x = W["tok_emb"][np.asarray(tokens)] * cfg.embed_scale             # [T, D]
    for li, L in enumerate(W["layers"]):
        sliding = cfg.is_sliding[li]
        theta = cfg.rope_theta_swa if sliding else cfg.rope_theta
        window = (window_override if window_override is not None else cfg.sliding_window) if sliding else None
        h = ref.rmsnorm(x, L["attn_norm"], eps)
        q = (h @ L["wq"].T).reshape(T, H, hd)
        k = (h @ L["wk"].T).reshape(T, KVH, hd)
        v = (h @ L["wv"].T).reshape(T, KVH, hd)
        q = ref.rmsnorm(q, L["q_norm"], eps)                           # per head, over head_dim
        k = ref.rmsnorm(k, L["k_norm"], eps)
        q = ref.rope_neox(q, pos, theta) * cfg.attn_scale
        k = ref.rope_neox(k, pos, theta)
        K, V = cache.append(li, k, v)                                  # [S, KVH, hd]
        mask = attention_mask(pos, K.shape[0], window)                 # [T, S]
        att = np.empty((T, H, hd), dtype=F)
        for hh in range(H):
            kv = hh // group
            sc = q[:, hh, :] @ K[:, kv, :].T
            sc = np.where(mask, -np.inf, sc)
            sc = sc - sc.max(axis=1, keepdims=True)
            pr = np.exp(sc)
            pr /= pr.sum(axis=1, keepdims=True)
            att[:, hh, :] = pr @ V[:, kv, :]
        o = att.reshape(T, H * hd) @ L["wo"].T
        x = x + ref.rmsnorm(o, L["post_attn_norm"], eps)
        h = ref.rmsnorm(x, L["ffn_norm"], eps)
        f = (gelu_tanh(h @ L["w_gate"].T) * (h @ L["w_up"].T)) @ L["w_down"].T
        x = x + ref.rmsnorm(f, L["post_ffn_norm"], eps)
    return ref.rmsnorm(x, W["norm"], eps)


def logits_of(cfg, W, hidden_row):
    z = W["tok_emb"] @ hidden_row
    if cfg.final_logit_softcap:
        z = np.tanh(z / cfg.final_logit_softcap) * cfg.final_logit_softcap
    return z


def last_logits(cfg, W, tokens, cache, window_override=None):
    return logits_of(cfg, W, forward_hidden(cfg, W, tokens, cache, window_override)[-1])


def greedy(cfg, W, prompt_ids, n, use_cache=True, on_step=None, window_override=None):
    """Same contract as llama_reference.greedy: exactly n ids, argmax (ties ->
    lowest id), on_step(step, logits, chosen) with step 0 = last prompt position."""
    return ref.greedy_loop(lambda tokens, cache: last_logits(cfg, W, tokens, cache, window_override), cfg.n_layers,
                           prompt_ids, n, use_cache, on_step)


# ----------------------------------------------------------------------------
# SentencePiece vocabulary (GGUF tokenizer.ggml.model = "llama") decoding
# ----------------------------------------------------------------------------
class SpmVocab:
    def __init__(self, reader):
        f = reader.fields["tokenizer.ggml.tokens"]
        self.tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        tf = reader.fields["tokenizer.ggml.token_type"]
        self.types = [int(tf.parts[i][0]) for i in tf.data]
        sf = reader.fields["tokenizer.ggml.scores"]
        self.scores = [float(sf.parts[i][0]) for i in sf.data]

    def piece_bytes(self, i):
        t, ty = self.tokens[i], self.types[i]
        if ty == 6:                                  # <0xXX> byte token
            return bytes([int(t[3:5], 16)])
        return t.replace("\u2581", " ").encode("utf-8")

    def decode(self, ids):
        """Concatenate pieces (control tokens included as their text, like
        llama.cpp's token_to_piece with special=true); no prefix-space strip
        (add_space_prefix is false for Gemma 3)."""
        return b"".join(self.piece_bytes(i) for i in ids).decode("utf-8", errors="replace")

    # texts llama.cpp marks as end-of-generation (and thus CONTROL) whatever their GGUF type
    LLAMA_CPP_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
                           "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
                           "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
                           "<|tool_response>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[")

    # --- encoder: a python mirror of llama.cpp's SPM path (llama-vocab.cpp) ---
    # Only used to cross-check the ids that llama-tokenize writes into
    # tests/data/tokenizer_gemma3_reference.json.
    def _prepare_encoder(self):
        if hasattr(self, "_lookup"):
            return
        self._lookup = {}
        for i, t in enumerate(self.tokens):
            self._lookup.setdefault(t, i)          # text_to_token: first id of a text
        # tokenizer_st_partition order: CONTROL / USER_DEFINED / UNKNOWN tokens,
        # longest text first (std::sort by length; ties here by id)
        sp = [i for i, ty in enumerate(self.types) if ty in (2, 3, 4)]
        self._special = sorted(sp, key=lambda i: (-len(self.tokens[i].encode("utf-8")), i))
        # CONTROL / UNKNOWN ids (skipped when parse_special is false). llama.cpp
        # also promotes end-of-generation texts to CONTROL (llama-vocab.cpp,
        # special_eog_ids): for Gemma 3 that turns the USER_DEFINED HTML tag
        # "</s>" (id 212) into a control token (and an EOG token).
        self._control = {i for i, ty in enumerate(self.types) if ty in (2, 3)}
        self._control |= {self._lookup[t] for t in self.LLAMA_CPP_EOG_TEXTS if t in self._lookup}

    def encode(self, text, add_bos=True, parse_special=True, bos_id=2):
        """llama_vocab::impl::tokenize for an SPM vocabulary with
        add_space_prefix = false: (1) cut the text at every occurrence of the
        CONTROL / USER_DEFINED / UNKNOWN token texts, longest first (CONTROL and
        UNKNOWN only when parse_special; USER_DEFINED always - so runs of
        spaces, tabs, newlines and the HTML tags are matched even then,
        except "</s>", which llama.cpp promotes to CONTROL as an EOG text);
        (2) in each remaining fragment, ' ' -> U+2581; (3) start from single
        code points and repeatedly merge the adjacent pair whose concatenation
        is a token with the highest score (leftmost on ties); (4) symbols
        that are not tokens become <0xXX> byte tokens."""
        import heapq
        self._prepare_encoder()
        frags = [text] if text else []
        for sid in self._special:
            if not parse_special and sid in self._control:
                continue
            st = self.tokens[sid]
            out = []
            for fr in frags:
                if isinstance(fr, int) or st not in fr:
                    out.append(fr)
                    continue
                parts = fr.split(st)
                for k, p in enumerate(parts):
                    if k:
                        out.append(sid)
                    if p:
                        out.append(p)
            frags = out
        ids = [bos_id] if add_bos else []
        for fr in frags:
            if isinstance(fr, int):
                ids.append(fr)
                continue
            syms = list(fr.replace(" ", "\u2581"))
            n = len(syms)
            nxt = list(range(1, n)) + [-1]
            prv = list(range(-1, n - 1))
            heap = []
            look = self._lookup

            def add(l, r):
                if l == -1 or r == -1:
                    return
                tid = look.get(syms[l] + syms[r])
                if tid is None:
                    return
                heapq.heappush(heap, (-self.scores[tid], l, r, len(syms[l]) + len(syms[r])))

            for i in range(1, n):
                add(i - 1, i)
            while heap:
                _, l, r, size = heapq.heappop(heap)
                if not syms[l] or not syms[r] or len(syms[l]) + len(syms[r]) != size:
                    continue
                syms[l] += syms[r]
                syms[r] = ""
                nxt[l] = nxt[r]
                if nxt[r] >= 0:
                    prv[nxt[r]] = l
                add(prv[l], l)
                add(l, nxt[l])
            i = 0 if n else -1
            while i != -1:
                tid = look.get(syms[i])
                if tid is not None:
                    ids.append(tid)
                else:
                    ids.extend(look["<0x%02X>" % b] for b in syms[i].encode("utf-8"))
                i = nxt[i]
        return ids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated ids, BOS included (e.g. from llama-tokenize)")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--dump-logits", type=int, default=0, metavar="K")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--window", type=int, default=None, help="override sliding_window")
    ap.add_argument("--check-dequant", action="store_true")
    a = ap.parse_args(argv)
    cfg, W, reader = load_gemma3(a.gguf, check_dequant=a.check_dequant)
    vocab = SpmVocab(reader)
    prompt_ids = [int(x) for x in a.prompt_ids.split(",") if x.strip()]
    steps = []

    def on_step(step, logits, nxt):
        top = ref.topk(logits, max(a.top, 2))
        rec = {"step": step, "id": nxt, "top": top[:a.top], "margin": top[0][1] - top[1][1]}
        if a.dump_logits:
            rec["logits"] = [float(x) for x in logits[:a.dump_logits]]
        steps.append(rec)

    ids = greedy(cfg, W, prompt_ids, a.n, use_cache=not a.no_cache, on_step=on_step, window_override=a.window)
    res = {"config": cfg.asdict(), "prompt_ids": prompt_ids, "generated_ids": ids,
           "generated_text": vocab.decode(ids), "steps": steps}
    json.dump(res, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
