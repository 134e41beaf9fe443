#!/usr/bin/env python3
"""Self-checks of the numpy reference (run: python3 tools/reference/selfcheck.py).

1. KV-cache decoding == full recomputation (logits to ~1e-9).
2. RoPE convention: un-permuting GGUF Q/K rows back to HF layout and applying
   HF's rotate_half ("NeoX") RoPE gives the same logits as interleaved RoPE on
   the GGUF rows; applying NeoX RoPE to the GGUF rows (the wrong convention)
   changes them a lot.
3. HF `tokenizers` build == a pure-python byte-level BPE on assorted strings.
4. Own Q4_1/Q8_0 dequant == gguf.quants.dequantize (all tensors).
5. Gemma 3 (if GEMMA3_GGUF / models/gemma-3-270m-q4_k_m.gguf exists):
   KV cache == full recomputation; a 600-token prefill in 3 chunks == one
   chunk (sliding-window mask with a cache offset); own Q5_0/Q4_K/Q6_K/Q8_0
   dequant == gguf.quants on every tensor.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402
import numpy as np  # noqa: E402

GGUF = os.environ.get("SMOLLM2_GGUF", "/work/main/models/smollm2-135m-instruct-q4_1.gguf")
L2C = os.environ.get("STORIES_BIN", "/work/shared/models/stories260K.bin")
GEMMA3 = os.environ.get("GEMMA3_GGUF", "/work/main/models/gemma-3-270m-q4_k_m.gguf")


def gemma3_checks():
    import gemma3_reference as g3
    import gguf
    from gguf.quants import dequantize
    ok = True
    cfg, W, reader = g3.load_gemma3(GEMMA3)
    prompt = [2, 14946, 3324, 496, 990]
    rows = {True: [], False: []}
    for use_cache in (True, False):
        g3.greedy(cfg, W, prompt, 4, use_cache=use_cache, on_step=lambda s, l, i, u=use_cache: rows[u].append(l))
    d = float(np.max(np.abs(np.array(rows[True]) - np.array(rows[False]))))
    print(f"[5] gemma3 cache vs recompute max|dlogit| = {d:.3g}")
    ok &= d < 1e-8
    rng = np.random.default_rng(0)
    long = [2] + [int(x) for x in rng.integers(300, 200000, size=599)]
    one = g3.forward_hidden(cfg, W, long, ref.KVCache(cfg.n_layers))
    cache = ref.KVCache(cfg.n_layers)
    parts = [g3.forward_hidden(cfg, W, long[a:b], cache) for a, b in ((0, 250), (250, 520), (520, 600))]
    d = float(np.max(np.abs(np.concatenate(parts) - one)))
    print(f"[5] gemma3 600-token prefill in chunks 250/270/80 vs one chunk: max|dhidden| = {d:.3g}")
    ok &= d < 1e-8
    worst = 0.0
    for t in reader.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            mine = ref.tensor_to_f64(t)
            theirs = dequantize(t.data, t.tensor_type).reshape(mine.shape).astype(np.float64)
            worst = max(worst, float(np.max(np.abs(mine - theirs))))
    print(f"[5] gemma3 max|own dequant - gguf.quants.dequantize| over all quantized tensors = {worst:.3g}")
    ok &= worst == 0.0
    return ok


def rope_neox(x, positions, theta):
    hd = x.shape[-1]
    half = hd // 2
    inv = theta ** (-2.0 * np.arange(half) / hd)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    c = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    s = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * c + rot * s


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py LlamaModel.permute."""
    out, inp = w.shape
    hd = out // n_head
    return w.reshape(n_head, hd // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def logits_steps(cfg, W, prompt, n, use_cache):
    rows = []
    ref.greedy(cfg, W, prompt, n, use_cache=use_cache, on_step=lambda s, l, i: rows.append(l.copy()))
    return np.array(rows)


def main():
    ok = True
    # --- 1. cache vs recompute (both models) ---
    cfg2, W2 = ref.load_llama2c(L2C)
    a = logits_steps(cfg2, W2, [1, 403, 407, 261, 378], 12, True)
    b = logits_steps(cfg2, W2, [1, 403, 407, 261, 378], 12, False)
    d = float(np.max(np.abs(a - b)))
    print(f"[1] stories260K cache vs recompute max|dlogit| = {d:.3g}")
    ok &= d < 1e-9

    cfg, W, reader = ref.load_gguf(GGUF)
    prompt = [6403, 1980, 253, 655]
    a = logits_steps(cfg, W, prompt, 4, True)
    b = logits_steps(cfg, W, prompt, 4, False)
    d = float(np.max(np.abs(a - b)))
    print(f"[1] smollm2 cache vs recompute max|dlogit| = {d:.3g}")
    ok &= d < 1e-9

    # --- 2. rope convention ---
    base = logits_steps(cfg, W, prompt, 1, True)[0]
    orig = ref.rope_interleaved
    try:
        Wu = dict(W)
        Wu["layers"] = [dict(L, wq=unpermute(L["wq"], cfg.n_heads), wk=unpermute(L["wk"], cfg.n_kv_heads))
                        for L in W["layers"]]
        ref.rope_interleaved = rope_neox
        hf = logits_steps(cfg, Wu, prompt, 1, True)[0]
        wrong = logits_steps(cfg, W, prompt, 1, True)[0]
    finally:
        ref.rope_interleaved = orig
    d_hf = float(np.max(np.abs(hf - base)))
    d_wrong = float(np.max(np.abs(wrong - base)))
    print(f"[2] interleaved(GGUF rows) vs neox(unpermuted rows): max|dlogit| = {d_hf:.3g}  (expect ~0)")
    print(f"[2] interleaved vs neox on GGUF rows (wrong layout): max|dlogit| = {d_wrong:.3g}  "
          f"argmax {int(np.argmax(base))} vs {int(np.argmax(wrong))}")
    ok &= d_hf < 1e-9 and d_wrong > 0.1

    # --- 3. tokenizer cross-check ---
    tok = ref.build_hf_tokenizer(reader)
    simple = ref.SimpleBPE(reader)
    texts = ["Once upon a time", "The capital of France is", "def fibonacci(n):",
             "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
             "Hello,   world!!  \n\n\tTabs and   spaces", "Numbers 12345 and 3.14159, x=42;",
             "It's we'll they're I'd", "Unicode: café naïve 日本語 🚀 — “quotes”",
             "    indented code\n        more", "<|endoftext|><file_sep>mixed<jupyter_code>"]
    for t in texts:
        h = tok.encode(t).ids
        s = simple.encode(t)
        rt = tok.decode(h, skip_special_tokens=False)
        good = h == s and rt == t
        ok &= good
        print(f"[3] {'ok ' if good else 'BAD'} {t!r}: {h}")

    # --- 4. dequant vs gguf on every tensor ---
    import gguf
    from gguf.quants import dequantize
    worst = 0.0
    for t in reader.tensors:
        if t.tensor_type in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0):
            mine = ref.tensor_to_f64(t)
            theirs = dequantize(t.data, t.tensor_type).reshape(mine.shape).astype(np.float64)
            worst = max(worst, float(np.max(np.abs(mine - theirs))))
    print(f"[4] max|own dequant - gguf.quants.dequantize| over all quantized tensors = {worst:.3g}")
    ok &= worst == 0.0

    if os.path.exists(GEMMA3):
        ok &= gemma3_checks()
    else:
        print(f"[5] skipped: no {GEMMA3}")

    print("ALL OK" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
