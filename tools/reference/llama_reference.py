#!/usr/bin/env python3
"""Independent numpy reference for Llama-family models (kvserve cross-check).

Deliberately simple, float64 everywhere:
  * weights: GGUF tensors dequantized with our own numpy Q4_1/Q8_0 code
    (cross-checked against gguf.quants.dequantize), or a llama2.c .bin;
  * forward: RMSNorm -> attention (RoPE, GQA, causal softmax) -> SwiGLU FFN,
    with a plain per-layer KV cache (``--no-cache`` = full recomputation
    every step, to check the cache);
  * greedy decoding (argmax; ties resolve to the lowest id, like np.argmax).

Conventions (see README.md):
  * gguf numpy arrays of a weight are [out, in] (ne[0] is the contiguous /
    input dim), so y = W @ x.
  * arch "llama" in GGUF: Q/K rows were permuted by the HF->GGUF converter,
    so RoPE is applied to interleaved pairs (x[2i], x[2i+1]) with
    freq_i = theta^(-2i/head_dim).  llama2.c checkpoints use the same
    interleaved layout natively (theta 10000).
  * GQA: query head h reads KV head h // (n_heads // n_kv_heads).
  * Tied classifier: no output.weight -> logits = token_embd @ h.

Usage:
  llama_reference.py --gguf F.gguf --prompt-ids 1,2,3 -n 32 --dump-logits 8
  llama_reference.py --gguf F.gguf --prompt "Once upon a time" -n 32
  llama_reference.py --llama2c stories260K.bin --tokenizer tok512.bin \
        --prompt "Once upon a time" -n 64
"""
import argparse
import json
import os
import struct
import sys

# keep runs modest on a shared machine (must precede numpy import)
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

F = np.float64


# ----------------------------------------------------------------------------
# Dequantization (own implementation, float64, exact)
# ----------------------------------------------------------------------------
QK = 32


def dequant_q8_0(raw, n_rows, n_cols):
    """Q8_0 block (34 bytes): fp16 d, 32 x int8 q; x = d * q."""
    blk = np.asarray(raw, dtype=np.uint8).reshape(-1, 34)
    d = blk[:, 0:2].copy().view(np.float16).astype(F)        # [nb, 1]
    q = blk[:, 2:34].copy().view(np.int8).astype(F)          # [nb, 32]
    return (d * q).reshape(n_rows, n_cols)


def dequant_q4_1(raw, n_rows, n_cols):
    """Q4_1 block (20 bytes): fp16 d, fp16 m, 16 bytes qs;
    x[j] = (qs[j] & 0xF) * d + m,  x[j+16] = (qs[j] >> 4) * d + m."""
    blk = np.asarray(raw, dtype=np.uint8).reshape(-1, 20)
    d = blk[:, 0:2].copy().view(np.float16).astype(F)
    m = blk[:, 2:4].copy().view(np.float16).astype(F)
    qs = blk[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(F)  # [nb, 32]
    return (q * d + m).reshape(n_rows, n_cols)


def dequant_q5_0(raw, n_rows, n_cols):
    """Q5_0 block (22 bytes): fp16 d, u32 qh (little-endian), 16 bytes qs;
    q[j] = (qs[j] & 0xF) | bit j of qh << 4, q[j+16] = (qs[j] >> 4) | bit j+16 << 4;
    x = d * (q - 16)."""
    blk = np.asarray(raw, dtype=np.uint8).reshape(-1, 22)
    d = blk[:, 0:2].copy().view(np.float16).astype(F)
    qh = blk[:, 2:6].copy().view("<u4").astype(np.int64)             # [nb, 1]
    qs = blk[:, 6:22].astype(np.int64)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=1)               # [nb, 32]
    high = ((qh >> np.arange(32)) & 1) << 4
    return (d * ((low | high) - 16)).reshape(n_rows, n_cols)


def k_scales_mins(s):
    """The 12 packed bytes of Q4_K/Q5_K -> (scale[nb, 8], min[nb, 8]), 6 bits each."""
    s = s.astype(np.int64)
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    mn = np.empty_like(sc)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def dequant_q4_k(raw, n_rows, n_cols, with_high_bits=False):
    """Q4_K super-block (144 bytes, 256 values): fp16 d, fp16 dmin, 12 bytes of
    6-bit scales/mins, 128 bytes qs. In 64-value chunk k, qs[32k+l] & 0xF is
    value 64k+l (sub-block 2k), >> 4 is value 64k+32+l (sub-block 2k+1);
    x = d * scale[j] * q - dmin * min[j]. Q5_K (176 bytes) adds qh[32] before
    qs: bit 2k of qh[l] for value 64k+l, bit 2k+1 for 64k+32+l."""
    size = 176 if with_high_bits else 144
    blk = np.asarray(raw, dtype=np.uint8).reshape(-1, size)
    d = blk[:, 0:2].copy().view(np.float16).astype(F)               # [nb, 1]
    dmin = blk[:, 2:4].copy().view(np.float16).astype(F)
    sc, mn = k_scales_mins(blk[:, 4:16])
    qs = blk[:, size - 128:].astype(np.int64).reshape(-1, 4, 32)     # [nb, chunk, l]
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)    # [nb, sub-block, l]
    if with_high_bits:
        qh = blk[:, 16:48].astype(np.int64)                          # [nb, 32]
        q = q | (((qh[:, None, :] >> np.arange(8)[None, :, None]) & 1) << 4)
    x = d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]
    return x.reshape(n_rows, n_cols)


def dequant_q6_k(raw, n_rows, n_cols):
    """Q6_K super-block (210 bytes): ql[128], qh[64], int8 scales[16], fp16 d.
    Half h (ql += 64h, qh += 32h), l < 32: value 32g+l of the half has low bits
    ql[l] & 0xF (g=0), ql[32+l] & 0xF (g=1), ql[l] >> 4 (g=2), ql[32+l] >> 4
    (g=3), high bits (qh[l] >> 2g) & 3; x = d * scales[i // 16] * (q - 32)."""
    blk = np.asarray(raw, dtype=np.uint8).reshape(-1, 210)
    ql = blk[:, 0:128].astype(np.int64)
    qh = blk[:, 128:192].astype(np.int64)
    sc = blk[:, 192:208].copy().view(np.int8).astype(F)              # [nb, 16]
    d = blk[:, 208:210].copy().view(np.float16).astype(F)            # [nb, 1]
    halves = []
    for h in range(2):
        a, b, hb = ql[:, 64 * h:64 * h + 32], ql[:, 64 * h + 32:64 * h + 64], qh[:, 32 * h:32 * h + 32]
        halves += [(a & 0x0F) | ((hb & 3) << 4), (b & 0x0F) | (((hb >> 2) & 3) << 4),
                   (a >> 4) | (((hb >> 4) & 3) << 4), (b >> 4) | (((hb >> 6) & 3) << 4)]
    q = np.concatenate(halves, axis=1) - 32                          # [nb, 256]
    return (d * np.repeat(sc, 16, axis=1) * q).reshape(n_rows, n_cols)


def tensor_to_f64(t, check_with_gguf=False):
    """gguf ReaderTensor -> float64 numpy array, shape [ne1, ne0] (= [out, in])."""
    import gguf
    ne = [int(x) for x in t.shape]          # ne[0] first (contiguous dim)
    n_cols = ne[0]
    n_rows = int(np.prod(ne[1:])) if len(ne) > 1 else 1
    tt = t.tensor_type
    if tt == gguf.GGMLQuantizationType.F32:
        out = np.asarray(t.data, dtype=np.float32).astype(F).reshape(n_rows, n_cols)
    elif tt == gguf.GGMLQuantizationType.F16:
        out = np.asarray(t.data, dtype=np.float16).astype(F).reshape(n_rows, n_cols)
    elif tt == gguf.GGMLQuantizationType.Q8_0:
        out = dequant_q8_0(t.data, n_rows, n_cols)
    elif tt == gguf.GGMLQuantizationType.Q4_1:
        out = dequant_q4_1(t.data, n_rows, n_cols)
    elif tt == gguf.GGMLQuantizationType.Q5_0:
        out = dequant_q5_0(t.data, n_rows, n_cols)
    elif tt == gguf.GGMLQuantizationType.Q4_K:
        out = dequant_q4_k(t.data, n_rows, n_cols)
    elif tt == gguf.GGMLQuantizationType.Q5_K:
        out = dequant_q4_k(t.data, n_rows, n_cols, with_high_bits=True)
    elif tt == gguf.GGMLQuantizationType.Q6_K:
        out = dequant_q6_k(t.data, n_rows, n_cols)
    else:
        # not needed for SmolLM2; fall back to the gguf package
        from gguf.quants import dequantize
        out = dequantize(t.data, tt).astype(F).reshape(n_rows, n_cols)
    if check_with_gguf:
        from gguf.quants import dequantize
        ref = dequantize(t.data, tt).reshape(n_rows, n_cols)
        diff = float(np.max(np.abs(out - ref.astype(F))))
        print(f"[dequant-check] {t.name} {tt.name} max|own-gguf|={diff:.3g}", file=sys.stderr)
        assert diff <= 1e-6 * max(1.0, float(np.max(np.abs(out)))), t.name
    if len(ne) == 1:
        out = out.reshape(n_cols)
    return out


# ----------------------------------------------------------------------------
# Model containers / loaders
# ----------------------------------------------------------------------------
class Config:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def asdict(self):
        return dict(self.__dict__)


def gguf_field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def load_gguf(path, check_dequant=False):
    import gguf
    r = gguf.GGUFReader(path)
    arch = gguf_field(r, "general.architecture")
    assert arch in ("llama", "qwen2"), f"only arch 'llama' and 'qwen2' supported, got {arch}"
    a = arch + "."
    dim = int(gguf_field(r, a + "embedding_length"))
    n_heads = int(gguf_field(r, a + "attention.head_count"))
    cfg = Config(
        arch=arch,
        dim=dim,
        n_layers=int(gguf_field(r, a + "block_count")),
        n_heads=n_heads,
        n_kv_heads=int(gguf_field(r, a + "attention.head_count_kv", n_heads)),
        hidden=int(gguf_field(r, a + "feed_forward_length")),
        rope_theta=float(gguf_field(r, a + "rope.freq_base", 10000.0)),
        # stored as f32 in GGUF (9.999999747e-06); use it as stored
        eps=float(gguf_field(r, a + "attention.layer_norm_rms_epsilon")),
        head_dim=int(gguf_field(r, a + "rope.dimension_count", dim // n_heads)),
        # llama.cpp's converter permutes llama Q/K rows for interleaved pairs;
        # qwen2 keeps HF's layout, rotated as halves (NeoX)
        rope_neox=(arch == "qwen2"),
    )
    assert cfg.head_dim == dim // n_heads
    tensors = {t.name: t for t in r.tensors}
    # only check a few tensors against gguf's dequantizer (it is slowish)
    checked = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight",
               "blk.0.attn_v.weight", "blk.29.attn_v.weight", "output_norm.weight"}

    def get(name):
        return tensor_to_f64(tensors[name], check_with_gguf=check_dequant and name in checked)

    W = {"tok_emb": get("token_embd.weight"), "norm": get("output_norm.weight"), "layers": []}
    if "output.weight" in tensors:
        W["output"] = get("output.weight")
        cfg.tied_output = False
    else:
        W["output"] = W["tok_emb"]
        cfg.tied_output = True
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        W["layers"].append({
            "attn_norm": get(p + "attn_norm.weight"),
            "wq": get(p + "attn_q.weight"),
            "wk": get(p + "attn_k.weight"),
            "wv": get(p + "attn_v.weight"),
            "wo": get(p + "attn_output.weight"),
            "ffn_norm": get(p + "ffn_norm.weight"),
            "w1": get(p + "ffn_gate.weight"),
            "w2": get(p + "ffn_down.weight"),
            "w3": get(p + "ffn_up.weight"),
        })
        for b in ("q", "k", "v"):  # qwen2: attention biases
            if p + f"attn_{b}.bias" in tensors:
                W["layers"][-1]["b" + b] = get(p + f"attn_{b}.bias")
    cfg.vocab = W["tok_emb"].shape[0]
    L0 = W["layers"][0]
    assert L0["wq"].shape == (n_heads * cfg.head_dim, dim)
    assert L0["wk"].shape == (cfg.n_kv_heads * cfg.head_dim, dim)
    assert L0["w1"].shape == (cfg.hidden, dim) and L0["w2"].shape == (dim, cfg.hidden)
    return cfg, W, r


def load_llama2c(path):
    """llama2.c legacy (version 0) checkpoint, float32 -> float64."""
    with open(path, "rb") as f:
        buf = f.read()
    dim, hidden, n_layers, n_heads, n_kv_heads, vocab_size, seq_len = struct.unpack_from("<7i", buf, 0)
    shared = vocab_size > 0
    vocab = abs(vocab_size)
    hd = dim // n_heads
    kvd = n_kv_heads * hd
    data = np.frombuffer(buf, dtype="<f4", offset=28)
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = data[off:off + n].astype(F).reshape(shape)
        off += n
        return a

    tok_emb = take(vocab, dim)
    rms_att = take(n_layers, dim)
    wq = take(n_layers, dim, dim)
    wk = take(n_layers, kvd, dim)
    wv = take(n_layers, kvd, dim)
    wo = take(n_layers, dim, dim)
    rms_ffn = take(n_layers, dim)
    w1 = take(n_layers, hidden, dim)
    w2 = take(n_layers, dim, hidden)
    w3 = take(n_layers, hidden, dim)
    rms_final = take(dim)
    off += seq_len * hd // 2 * 2  # skip freq_cis_real / freq_cis_imag
    output = tok_emb if shared else take(vocab, dim)
    assert off == data.size, (off, data.size)
    cfg = Config(arch="llama2c", dim=dim, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                 hidden=hidden, rope_theta=10000.0, eps=1e-5, head_dim=hd, vocab=vocab,
                 seq_len=seq_len, tied_output=shared)
    W = {"tok_emb": tok_emb, "norm": rms_final, "output": output, "layers": []}
    for i in range(n_layers):
        W["layers"].append({"attn_norm": rms_att[i], "wq": wq[i], "wk": wk[i], "wv": wv[i], "wo": wo[i],
                            "ffn_norm": rms_ffn[i], "w1": w1[i], "w2": w2[i], "w3": w3[i]})
    return cfg, W


# ----------------------------------------------------------------------------
# Forward pass
# ----------------------------------------------------------------------------
def rmsnorm(x, w, eps):
    # x: [T, D]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_interleaved(x, positions, theta):
    """x: [T, H, hd]; rotate pairs (x[..., 2i], x[..., 2i+1]) by pos * theta^(-2i/hd)."""
    hd = x.shape[-1]
    i = np.arange(hd // 2, dtype=F)
    inv_freq = theta ** (-2.0 * i / hd)                              # [hd/2]
    ang = np.asarray(positions, dtype=F)[:, None] * inv_freq[None, :]  # [T, hd/2]
    c = np.cos(ang)[:, None, :]
    s = np.sin(ang)[:, None, :]
    x0 = x[..., 0::2]
    x1 = x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def rope_neox(x, positions, theta):
    """x: [T, H, hd]; rotate (x[..., i], x[..., i + hd/2]) by pos * theta^(-2i/hd)."""
    hd = x.shape[-1]
    i = np.arange(hd // 2, dtype=F)
    inv_freq = theta ** (-2.0 * i / hd)
    ang = np.asarray(positions, dtype=F)[:, None] * inv_freq[None, :]
    c = np.cos(ang)[:, None, :]
    s = np.sin(ang)[:, None, :]
    x0, x1 = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


class KVCache:
    def __init__(self, n_layers):
        self.k = [None] * n_layers  # each [T, n_kv, hd]
        self.v = [None] * n_layers

    @property
    def length(self):
        return 0 if self.k[0] is None else self.k[0].shape[0]

    def append(self, layer, k, v):
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = np.concatenate([self.k[layer], k], axis=0)
            self.v[layer] = np.concatenate([self.v[layer], v], axis=0)
        return self.k[layer], self.v[layer]


def forward(cfg, W, tokens, cache):
    """Run `tokens` (new positions cache.length .. cache.length+T-1).
    Returns logits [T, vocab] (float64) and updates the cache."""
    T = len(tokens)
    start = cache.length
    pos = np.arange(start, start + T)
    H, KVH, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    group = H // KVH
    x = W["tok_emb"][np.asarray(tokens)]                              # [T, D]
    for li, L in enumerate(W["layers"]):
        h = rmsnorm(x, L["attn_norm"], cfg.eps)
        q = h @ L["wq"].T + L.get("bq", 0.0)
        k = h @ L["wk"].T + L.get("bk", 0.0)
        v = h @ L["wv"].T + L.get("bv", 0.0)
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KVH, hd), v.reshape(T, KVH, hd)
        rope = rope_neox if getattr(cfg, "rope_neox", False) else rope_interleaved
        q = rope(q, pos, cfg.rope_theta)
        k = rope(k, pos, cfg.rope_theta)
        K, V = cache.append(li, k, v)                                # [S, KVH, hd]
        S = K.shape[0]
        att_out = np.empty((T, H, hd), dtype=F)
        # causal mask: query at absolute position p sees keys 0..p
        mask = np.arange(S)[None, :] > pos[:, None]                  # [T, S]
        for hh in range(H):
            kv = hh // group
            sc = (q[:, hh, :] @ K[:, kv, :].T) / np.sqrt(hd)         # [T, S]
            sc = np.where(mask, -np.inf, sc)
            sc = sc - sc.max(axis=1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(axis=1, keepdims=True)
            att_out[:, hh, :] = p @ V[:, kv, :]
        x = x + att_out.reshape(T, H * hd) @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], cfg.eps)
        g = h @ L["w1"].T
        u = h @ L["w3"].T
        x = x + (silu(g) * u) @ L["w2"].T
    x = rmsnorm(x, W["norm"], cfg.eps)
    return x @ W["output"].T


def topk(logits, k):
    # stable: ties -> lower id first
    idx = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(logits[i])] for i in idx]


def greedy_loop(last_logits, n_layers, prompt_ids, n, use_cache=True, on_step=None):
    """Greedy decode n tokens with last_logits(tokens, cache) -> logits of the
    last token. on_step(step, logits_of_last_position, chosen_id); step 0's
    logits are those of the last prompt position; ties go to the lowest id."""
    cache = KVCache(n_layers)
    logits = last_logits(list(prompt_ids), cache)
    seq = list(prompt_ids)
    out = []
    for step in range(n):
        nxt = int(np.argmax(logits))
        if on_step:
            on_step(step, logits, nxt)
        out.append(nxt)
        seq.append(nxt)
        if step == n - 1:
            break
        if use_cache:
            logits = last_logits([nxt], cache)
        else:
            logits = last_logits(seq, KVCache(n_layers))
    return out


def greedy(cfg, W, prompt_ids, n, use_cache=True, on_step=None):
    """Greedy decode n tokens of the Llama-family forward (greedy_loop)."""
    return greedy_loop(lambda tokens, cache: forward(cfg, W, tokens, cache)[-1], cfg.n_layers, prompt_ids, n,
                       use_cache, on_step)


# ----------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------
def gguf_vocab(reader):
    f = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
    tf = reader.fields.get("tokenizer.ggml.token_type")
    types = [int(tf.parts[i][0]) for i in tf.data] if tf else [1] * len(tokens)
    mf = reader.fields["tokenizer.ggml.merges"]
    merges = [bytes(mf.parts[i]).decode("utf-8") for i in mf.data]
    return tokens, types, merges


def build_hf_tokenizer(reader):
    """HF `tokenizers` byte-level BPE from GGUF vocab + merges.
    Pre-tokenizer for pre='smollm' (StarCoder-style, as in SmolLM2's own
    tokenizer.json and llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM): split every
    digit individually, then the GPT-2 byte-level regex, add_prefix_space=False.
    Control / user-defined tokens (type 3/4) become special added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
    tokens, types, merges = gguf_vocab(reader)
    pre = gguf_field(reader, "tokenizer.ggml.pre")
    assert gguf_field(reader, "tokenizer.ggml.model") == "gpt2"
    assert pre in ("smollm", "starcoder", "refact", "qwen2"), f"pre-tokenizer {pre!r} not handled"
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate token strings"
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=False))
    if pre == "qwen2":
        # Qwen2's tokenizer.json: its own split regex (single digits, letters
        # with one leading non-letter), then byte-level without GPT-2's regex
        from tokenizers import Regex
        qwen2_regex = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                       r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(qwen2_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    tok.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok.add_special_tokens(special)
    for t in special:
        assert tok.token_to_id(t.content) == vocab[t.content]
    return tok


# --- a second, pure-python byte-level BPE (cross-check of the HF one) ---------
def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class SimpleBPE:
    GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, reader):
        import regex
        self.re = regex
        tokens, types, merges = gguf_vocab(reader)
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.special = sorted([t for t, ty in zip(tokens, types) if ty in (3, 4)], key=len, reverse=True)
        self.b2u = _bytes_to_unicode()

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.vocab[p] for p in parts]

    def encode(self, text):
        ids = []
        if self.special:
            pieces = self.re.split("(" + "|".join(self.re.escape(s) for s in self.special) + ")", text)
        else:
            pieces = [text]
        for piece in pieces:
            if not piece:
                continue
            if piece in self.special:
                ids.append(self.vocab[piece])
                continue
            for chunk in self.re.split(r"(\p{N})", piece):      # individual digits first
                if not chunk:
                    continue
                for w in self.re.findall(self.GPT2_RE, chunk):
                    ids += self._bpe("".join(self.b2u[b] for b in w.encode("utf-8")))
        return ids


# --- llama2.c SentencePiece-style tokenizer (tok512.bin) ---------------------
class Llama2cTokenizer:
    def __init__(self, path, vocab_size):
        with open(path, "rb") as f:
            buf = f.read()
        (self.max_token_length,) = struct.unpack_from("<i", buf, 0)
        off = 4
        self.pieces, self.scores = [], []
        for _ in range(vocab_size):
            score, n = struct.unpack_from("<fi", buf, off)
            off += 8
            self.pieces.append(buf[off:off + n])
            self.scores.append(score)
            off += n
        assert off == len(buf)
        # llama2.c uses bsearch over sorted vocab; our pieces are unique, so a dict is equivalent
        self.lookup = {}
        for i, p in enumerate(self.pieces):
            assert p not in self.lookup
            self.lookup[p] = i

    def encode(self, text, bos=True, eos=False):
        """Mirror of llama2.c run.c encode()."""
        data = text.encode("utf-8")
        toks = []
        if bos:
            toks.append(1)
        if len(data) > 0:
            toks.append(self.lookup[b" "])          # add_dummy_prefix
        for ch in text:                              # one UTF-8 codepoint at a time
            b = ch.encode("utf-8")
            if b in self.lookup:
                toks.append(self.lookup[b])
            else:
                toks.extend(x + 3 for x in b)       # byte fallback
        while True:
            best_score, best_id, best_idx = -1e10, -1, -1
            for i in range(len(toks) - 1):
                cid = self.lookup.get(self.pieces[toks[i]] + self.pieces[toks[i + 1]], -1)
                if cid != -1 and self.scores[cid] > best_score:
                    best_score, best_id, best_idx = self.scores[cid], cid, i
            if best_idx == -1:
                break
            toks[best_idx:best_idx + 2] = [best_id]
        if eos:
            toks.append(2)
        return toks

    def piece_bytes(self, prev, tok):
        """Mirror of llama2.c decode(prev_token, token)."""
        p = self.pieces[tok]
        if prev == 1 and p[:1] == b" ":
            p = p[1:]
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
            p = bytes([int(p[3:5], 16)])
        return p

    def decode(self, ids, prev=None):
        out = b""
        for t in ids:
            out += self.piece_bytes(prev, t)
            prev = t
        return out.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf")
    src.add_argument("--llama2c")
    ap.add_argument("--tokenizer", help="llama2.c tokenizer .bin (with --llama2c)")
    ap.add_argument("--prompt-ids")
    ap.add_argument("--prompt", help="text prompt (special tokens like <|im_start|> are parsed)")
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--dump-logits", type=int, default=0, metavar="K",
                    help="print the first K logits of each step's last position")
    ap.add_argument("--top", type=int, default=10, help="top-N (id, logit) per step")
    ap.add_argument("--no-cache", action="store_true", help="full recomputation each step")
    ap.add_argument("--check-dequant", action="store_true")
    a = ap.parse_args(argv)

    decode = None
    if a.gguf:
        cfg, W, reader = load_gguf(a.gguf, check_dequant=a.check_dequant)
        if a.prompt is not None:
            tok = build_hf_tokenizer(reader)
            prompt_ids = tok.encode(a.prompt).ids
            decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
        elif a.prompt_ids is not None:
            try:
                tok = build_hf_tokenizer(reader)
                decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
            except Exception:
                decode = None
    else:
        cfg, W = load_llama2c(a.llama2c)
        tk = None
        if a.tokenizer:
            tk = Llama2cTokenizer(a.tokenizer, cfg.vocab)
            decode = lambda ids: tk.decode(ids, prev=prompt_ids[-1])  # noqa: E731
        if a.prompt is not None:
            assert tk, "--prompt with --llama2c needs --tokenizer"
            prompt_ids = tk.encode(a.prompt)
    if a.prompt is None:
        assert a.prompt_ids, "give --prompt or --prompt-ids"
        prompt_ids = [int(x) for x in a.prompt_ids.split(",") if x.strip()]

    steps = []

    def on_step(step, logits, nxt):
        top = topk(logits, max(a.top, 2))
        rec = {"step": step, "id": nxt, "top": top[:a.top], "margin": top[0][1] - top[1][1]}
        if a.dump_logits:
            rec["logits"] = [float(x) for x in logits[:a.dump_logits]]
        steps.append(rec)

    ids = greedy(cfg, W, prompt_ids, a.n, use_cache=not a.no_cache, on_step=on_step)
    res = {"config": cfg.asdict(), "prompt_ids": prompt_ids, "generated_ids": ids}
    if decode:
        res["generated_text"] = decode(ids)
    res["steps"] = steps
    json.dump(res, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
