#!/usr/bin/env python3
"""Regenerate tests/data/gemma3_270m_reference.json and tests/data/tokenizer_gemma3_reference.json.

  python3 tools/reference/gen_gemma3_data.py \
      --gguf /work/main/models/gemma-3-270m-q4_k_m.gguf \
      --llama-bin /tmp/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin \
      --out tests/data

llama.cpp (llama-tokenize, llama-server) supplies the prompt ids, the
tokenizer golden ids and the cross-check greedy run; the numbers themselves
come from gemma3_reference.py (float64 numpy). --no-llama-cpp: take the prompt
ids from the python mirror of llama.cpp's SPM tokenizer instead, skip the
cross-check and the tokenizer file.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3_reference as g3  # noqa: E402
import gen_reference_data as gen  # noqa: E402  (g9, sha256, versions)
from llama_server import free_port, post  # noqa: E402
import llama_reference as ref  # noqa: E402
import numpy as np  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LONG_SOURCE = "tests/data/pride_and_prejudice_ch1-3.txt"
LONG_PARAGRAPHS = 24  # paragraphs ("\n\n"-separated) 1..24 -> 664 tokens with BOS


def long_prompt():
    with open(os.path.join(REPO, LONG_SOURCE), encoding="utf-8") as f:
        return "\n\n".join(f.read().split("\n\n")[:LONG_PARAGRAPHS])


PROMPTS = [  # name, text, n_generate
    ("once_upon", "Once upon a time", 32),
    ("capital_france", "The capital of France is", 32),
    ("fibonacci", "def fibonacci(n):", 32),
    ("long_pride_prejudice", None, 8),   # > 512 tokens: the sliding window matters
]
# first-step logits recorded for: specials, <start/end_of_turn>, newline / space tokens,
# punctuation, mid and high ids, a tab run, the last id
FIXED_IDS = [0, 1, 2, 3, 105, 106, 107, 108, 138, 236743, 236761, 236764, 496, 1000, 12345, 100000,
             200000, 255968, 262143]

TOKENIZER_TEXTS = [
    "Hello, world! This is a simple English sentence.",
    "def add(a, b):\n    return a + b\n",
    "12345 apples cost $6.78",
    "I'm sure they'll say it's fine, we've done what we'd planned. DON'T",
    "Multiple   spaces\n\n\nand\ttabs  \n end",
    "Café naïve 日本語 Привет 🙂",
    "<start_of_turn>user\nHi<end_of_turn>\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "  leading and trailing  ",
    "",
    " ",
    "\n",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "x = [i**2 for i in range(10)]  # squares",
    "#include <vector>\nint main() { return 0; }\n",
    "It's 3:45pm on 2024-01-31; pi ≈ 3.14159.",
    "Ünïcödé façade — “quotes” and ‘single’ … ellipsis",
    "中文测试：你好，世界！",
    "한국어 텍스트와 日本語のテキスト",
    "Emoji: 👍🏽 👨\u200d👩\u200d👧 🚀✨",
    "Tabs\tand\r\nCRLF\r\nlines",
    "    indented code\n\tand tab\n\t\t\tdeeper\n",
    "<html><body><div><b>bold</b> and <i>italic</i></div></body></html>",
    "<table><tr><td>1</td><td>2</td></tr></table>",
    "<start_of_turn <end_of_turn>x <eos> <bos> <pad> <unused0> <mask> [multimodal] <start_of_image>",
    "Numbers: 0 00 007 1,000,000 ½ ² Ⅻ ١٢٣",
    "Ελληνικά και Русский язык",
    "ÿþ control\x01chars\x7f",
    "trailing newline\n\n",
    "a" * 50 + " " + "b" * 30,
    " " * 40 + "x",
    "\n" * 35,
    "\t" * 33 + "end",
    " \n \n  \n\t \t",
    "word1  word2   word3    word4",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥² ∑∫√∞ and a rare char 𓀀",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "https://example.com/path?q=1&x=y#frag <a href=\"x\">link</a>",
    "\u2581 literal U+2581 \u2581\u2581 and __init__",
    "<s>text</s> and <sub>2</sub>",
    "Hello\u00a0world a\u200bb",
    '{"key": [1, 2.5, true, null], "nested": {"a": "b"}}',
]


# ----------------------------------------------------------------------------
# llama.cpp helpers
# ----------------------------------------------------------------------------
def tokenize_cmd(bin_dir, model, flags=()):
    return [os.path.join(bin_dir, "llama-tokenize"), "-m", model, "--stdin", "--no-escape", "--ids",
            "--log-disable", *flags]


def llama_tokenize(bin_dir, model, text, flags=()):
    out = subprocess.run(tokenize_cmd(bin_dir, model, flags), input=text.encode("utf-8"),
                         capture_output=True, check=True).stdout.decode()
    return json.loads(out.strip().splitlines()[-1])


SERVER_FLAGS = ["-t", "2", "-c", "1024", "-np", "1", "--no-warmup", "-ctk", "f32", "-ctv", "f32", "-fa", "off"]


class LlamaServer:
    def __init__(self, bin_dir, model, flags=SERVER_FLAGS):
        self.port = free_port()
        self.cmd = [os.path.join(bin_dir, "llama-server"), "-m", model, "--port", str(self.port), *flags]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(1200):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("llama-server did not come up")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()

    def complete(self, ids, n, n_probs=5):
        a = post(self.url + "/completion", {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1,
                                            "n_probs": n_probs, "return_tokens": True, "cache_prompt": False})
        probs = a["completion_probabilities"]
        assert [e["id"] for e in probs] == a["tokens"], "one probabilities entry per token"
        return a["tokens"], [[[p["id"], p["logprob"]] for p in e["top_logprobs"]] for e in probs]

    def tokenize(self, text, parse_special=True):
        return post(self.url + "/tokenize", {"content": text, "add_special": False,
                                             "parse_special": parse_special})["tokens"]


# ----------------------------------------------------------------------------
# reference runs
# ----------------------------------------------------------------------------
def run_case(cfg, W, prompt_ids, n, first_top=20, fixed_ids=(), window_override=None):
    steps, first = [], {}

    def on_step(step, logits, nxt):
        top = ref.topk(logits, 5)
        m = float(np.max(logits))
        lse = m + float(np.log(np.sum(np.exp(logits - m))))
        steps.append({"step": step, "id": nxt, "logit": gen.g9(logits[nxt]),
                      "top5": [[i, gen.g9(v)] for i, v in top],
                      "margin": gen.g9(top[0][1] - top[1][1]), "logsumexp": gen.g9(lse)})
        if step == 0:
            first["top"] = [[i, gen.g9(v)] for i, v in ref.topk(logits, first_top)]
            first["fixed"] = {str(i): gen.g9(logits[i]) for i in fixed_ids}
            first["logits"] = logits.copy()

    ids = g3.greedy(cfg, W, prompt_ids, n, on_step=on_step, window_override=window_override)
    return ids, steps, first


def log_softmax(lg):
    m = float(np.max(lg))
    return lg - (m + float(np.log(np.sum(np.exp(lg - m)))))


def window_sensitivity(cfg, W, prompt_ids, base_logits, keep):
    """First-step logits of the long prompt with a wrong window: no window
    (all layers global), and off-by-one windows 511 / 513. keep[name] gets the
    log-probabilities (for the llama.cpp window check)."""
    out = {}
    keep["window_512"] = log_softmax(base_logits)
    for name, w in (("no_window", 10 ** 9), ("window_511", 511), ("window_513", 513)):
        lg = g3.last_logits(cfg, W, prompt_ids, ref.KVCache(cfg.n_layers), window_override=w)
        keep[name] = log_softmax(lg)
        top = ref.topk(lg, 2)
        out[name] = {"max_abs_dlogit": gen.g9(np.max(np.abs(lg - base_logits))),
                     "argmax": top[0][0], "margin": gen.g9(top[0][1] - top[1][1])}
        print(f"[gemma3] window check {name}: {out[name]}", file=sys.stderr)
    return out


def compare_llama_cpp(case, ll_ids, ll_top):
    """Leading agreement, and log-probability differences on the agreeing steps."""
    ref_ids = case["generated_ids"]
    agree = 0
    while agree < min(len(ref_ids), len(ll_ids)) and ref_ids[agree] == ll_ids[agree]:
        agree += 1
    # reference log-probabilities of llama.cpp's top-5 ids, where the reference recorded them
    worst_chosen, worst_top = 0.0, 0.0
    for k in range(agree):
        st = case["steps"][k]
        ref_lp = {i: v - st["logsumexp"] for i, v in st["top5"]}
        worst_chosen = max(worst_chosen, abs(ref_lp[st["id"]] - dict(map(tuple, ll_top[k]))[st["id"]]))
        for i, lp in ll_top[k]:
            if i in ref_lp:
                worst_top = max(worst_top, abs(ref_lp[i] - lp))
    res = {"generated_ids": ll_ids, "agree_prefix": agree, "n_generate": len(ref_ids),
           "max_abs_dlogprob_chosen": round(worst_chosen, 6), "max_abs_dlogprob_top5": round(worst_top, 6)}
    if agree < len(ref_ids):
        st = case["steps"][agree]
        res["first_divergence"] = {"step": agree, "reference_id": ref_ids[agree], "llama_cpp_id": ll_ids[agree],
                                   "reference_margin": st["margin"],
                                   "llama_cpp_id_in_reference_top5": ll_ids[agree] in [i for i, _ in st["top5"]]}
    return res


def gen_model(a, vocab, cfg, W, window_logprobs):
    model = os.path.abspath(a.gguf)
    eos = 1
    cases = []
    long_text = long_prompt()
    for name, text, n in PROMPTS:
        if text is None:
            text = long_text
        if a.no_llama_cpp:
            pids = vocab.encode(text, add_bos=True)
        else:
            pids = llama_tokenize(a.llama_bin, model, text)
            assert pids == vocab.encode(text, add_bos=True), (name, "python SPM mirror disagrees")
        t0 = time.time()
        ids, steps, first = run_case(cfg, W, pids, n, fixed_ids=FIXED_IDS)
        gen_text = vocab.decode(ids)
        case = {
            "name": name,
            "prompt": text,
            "prompt_ids": pids,
            "n_prompt": len(pids),
            "n_generate": n,
            "generated_ids": ids,
            "generated_text": gen_text,
            "first_eos_index": ids.index(eos) if eos in ids else None,
            "first_step_top20": first["top"],
            "first_step_fixed_logits": first["fixed"],
            "min_margin": min(s["margin"] for s in steps),
            "steps": steps,
        }
        if name.startswith("long"):
            case["prompt_source"] = f"{LONG_SOURCE}, paragraphs 1..{LONG_PARAGRAPHS} joined by \\n\\n"
            window_logprobs[name] = {}
            case["window_sensitivity"] = window_sensitivity(cfg, W, pids, first["logits"], window_logprobs[name])
        cases.append(case)
        print(f"[gemma3] {name}: {len(pids)} prompt ids -> {gen_text!r} (min margin {case['min_margin']}, "
              f"{time.time() - t0:.1f} s)", file=sys.stderr)

    doc = {
        "description": "Float64 numpy reference (tools/reference/gemma3_reference.py) for Gemma 3 270M (base) "
                       "Q4_K_M GGUF: weights dequantized exactly (own Q8_0/Q5_0/Q4_K/Q6_K code, equal to "
                       "gguf.quants), all activations float64, greedy (argmax, ties -> lowest id), no EOS stop: "
                       "exactly n_generate ids. steps[k] describes the logits that chose generated_ids[k]; step 0 = "
                       "last prompt position; logsumexp lets one turn logits into log-probabilities. margin = top1 "
                       "- top2 logit. Prompt ids are llama.cpp's (llama-tokenize, BOS 2 added). The last case has "
                       "664 prompt tokens so that the 512-token sliding window matters (window_sensitivity: how "
                       "far the first-step logits move with a wrong window). llama_cpp: llama-server's greedy ids "
                       "on the same prompt ids, for comparison only.",
        "model": os.path.basename(model),
        "model_sha256": gen.sha256(model),
        "config": {k: v for k, v in cfg.asdict().items()},
        "conventions": {
            "embedding": "x = token_embd[id] * float32(sqrt(640)) = 25.2982216",
            "norms": "RMSNorm x / sqrt(mean(x^2) + eps) * w, eps = stored f32 9.99999997e-07; GGUF norm weights "
                     "already include Gemma's +1 (plain multipliers)",
            "block": "x += rmsnorm(Wo attn(rmsnorm(x)*attn_norm)) * post_attention_norm; "
                     "x += rmsnorm(Wdown(gelu_tanh(Wgate h) * (Wup h))) * post_ffw_norm, h = rmsnorm(x)*ffn_norm",
            "qk_norm": "q and k RMS-normed per head over head_dim (attn_q_norm / attn_k_norm) before RoPE",
            "rope": "NeoX halves (x[i], x[i + 128]), freq_i = theta^(-2i/256); theta 1e6 on global layers, "
                    "10000 on sliding layers (no rope.freq_base_swa key: llama.cpp default)",
            "attention": "q scaled by 1/sqrt(256) = 1/16 after RoPE; GQA 4 query heads : 1 kv head; no softcap",
            "sliding_window": "layer il is sliding unless il % 6 == 5 (global: 5, 11, 17); on sliding layers a "
                              "query at position p sees keys j <= p with p - j < 512",
            "gelu": "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))",
            "output": "tied: logits = token_embd.weight (Q8_0) @ (rmsnorm(x) * output_norm); no final softcap",
            "tokenizer": "SentencePiece (llama) vocab, add_space_prefix false, BOS 2 added; see "
                         "tokenizer_gemma3_reference.json",
            "logit_format": "9 significant digits",
        },
        "prompt_ids_command": " ".join(tokenize_cmd("LLAMA_BIN", "MODEL")) + "  (prompt text on stdin)"
        if not a.no_llama_cpp else "python SPM mirror (gemma3_reference.SpmVocab.encode)",
        "bos_token_id": 2,
        "eos_token_id": eos,
        "fixed_ids": FIXED_IDS,
        "versions": gen.versions(),
        "cases": cases,
    }
    return doc


def make_f32_copy(a, tmpdir):
    """llama-quantize --allow-requantize MODEL OUT F32: the same weight values
    (dequantizing these blocks to f32 is exact; checked against our float64
    dequantization), so llama.cpp then runs without 8-bit activations."""
    out = os.path.join(tmpdir, "gemma-3-270m-f32-from-q4_k_m.gguf")
    subprocess.run([os.path.join(a.llama_bin, "llama-quantize"), "--allow-requantize", os.path.abspath(a.gguf),
                    out, "F32", "2"], check=True, capture_output=True)
    import gguf
    q = {t.name: t for t in gguf.GGUFReader(a.gguf).tensors}
    for t in gguf.GGUFReader(out).tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(ref.tensor_to_f64(t), ref.tensor_to_f64(q[t.name])), t.name
    return out


def add_llama_cpp(a, doc, window_logprobs):
    import tempfile
    version = subprocess.run([os.path.join(a.llama_bin, "llama-server"), "--version"], capture_output=True,
                             text=True).stderr.strip().splitlines()
    runs = {}
    default_flags = ["-t", "2", "-c", "1024", "-np", "1", "--no-warmup"]
    window_check = None
    with tempfile.TemporaryDirectory() as tmp:
        f32_model = make_f32_copy(a, tmp)
        for label, model, flags in (("q4_k_m_f32_kv", os.path.abspath(a.gguf), SERVER_FLAGS),
                                    ("q4_k_m_default", os.path.abspath(a.gguf), default_flags),
                                    ("f32_weights", f32_model, SERVER_FLAGS)):
            with LlamaServer(a.llama_bin, model, flags) as srv:
                per_case = []
                for case in doc["cases"]:
                    ids, top = srv.complete(case["prompt_ids"], case["n_generate"])
                    r = {"name": case["name"], **compare_llama_cpp(case, ids, top)}
                    if label != "q4_k_m_default":
                        r["top_logprobs"] = [[[i, round(lp, 6)] for i, lp in s] for s in top]
                    per_case.append(r)
                    print(f"[llama.cpp {label}] {case['name']}: agree {r['agree_prefix']}/{r['n_generate']} "
                          f"{r.get('first_divergence', '')} dlogprob {r['max_abs_dlogprob_chosen']}",
                          file=sys.stderr)
                    if label == "f32_weights" and case["name"] in window_logprobs:
                        # which sliding-window convention does llama.cpp's f32 run match?
                        _, top200 = srv.complete(case["prompt_ids"], 1, n_probs=200)
                        window_check = {"case": case["name"], "n_ids": len(top200[0])}
                        for wname, lp in window_logprobs[case["name"]].items():
                            d = [abs(lp[i] - v) for i, v in top200[0]]
                            window_check[wname] = {"max_abs_dlogprob": round(max(d), 6),
                                                   "mean_abs_dlogprob": round(float(np.mean(d)), 6)}
                        print(f"[llama.cpp f32_weights] window check {window_check}", file=sys.stderr)
            runs[label] = {"model": "models/" + os.path.basename(a.gguf) if model != f32_model else
                           "llama-quantize --allow-requantize models/" + os.path.basename(a.gguf) + " OUT.gguf F32",
                           "server_flags": flags, "cases": per_case}
    doc["llama_cpp"] = {
        "what": "llama-server /completion on the same prompt ids: temperature 0, n_probs 5, cache_prompt false "
                "(stops at its EOG ids 1, 106, 212). agree_prefix = number of leading generated ids equal to the "
                "reference; max_abs_dlogprob_* compare llama.cpp's log-probabilities with the reference's "
                "(logit - logsumexp) on the agreeing steps. q4_k_m_*: the quantized file as is; llama.cpp's CPU "
                "matmuls then quantize activations to 8 bits, so differences of ~0.1 and a different pick where "
                "the reference margin is that small are expected. f32_weights: the same weight values stored as "
                "F32 (exact), so llama.cpp runs f32 activations (GELU through its fp16 table): this checks the "
                "reference's math. window_check: first-step log-probabilities of llama.cpp's top-200 ids on the "
                "long prompt (f32_weights) against the reference with window 512 and with wrong windows.",
        "version": version,
        "runs": runs,
        "window_check": window_check,
    }


def gen_tokenizer(a, vocab, out_dir, n_fuzz=3000):
    model = os.path.abspath(a.gguf)
    cases = []
    for text in TOKENIZER_TEXTS:
        ids = llama_tokenize(a.llama_bin, model, text, ["--no-bos"])
        ids_ns = llama_tokenize(a.llama_bin, model, text, ["--no-bos", "--no-parse-special"])
        with_bos = llama_tokenize(a.llama_bin, model, text)
        assert with_bos == [2] + ids, (text, with_bos, ids)
        assert ids == vocab.encode(text, add_bos=False), (text, ids, vocab.encode(text, add_bos=False))
        assert ids_ns == vocab.encode(text, add_bos=False, parse_special=False), text
        c = {"text": text, "ids": ids}
        if ids_ns != ids:
            c["ids_no_parse_special"] = ids_ns
        cases.append(c)
    # fuzz: python mirror vs llama.cpp (server /tokenize) on random strings from tricky pieces
    pieces = [" ", "  ", "\n", "\n\n", "\t", "a", "b", "the", " the", "ing", "é", "ï", "日本", "語", "🙂", "👍🏽",
              "\u200d", "𓀀", "1", "23", ".", ",", "'s", "\"", "<", ">", "/", "<b>", "</b>", "<start_of_turn>",
              "<end_of_turn>", "<eos>", "<s>", "\u2581", "\r", "\x01", "x", "Hello", "world", "def", "():", "=="]
    rng = random.Random(1234)
    n_bad = 0
    with LlamaServer(a.llama_bin, model) as srv:
        for _ in range(n_fuzz):
            t = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 24)))
            for ps in (True, False):
                if srv.tokenize(t, ps) != vocab.encode(t, add_bos=False, parse_special=ps):
                    n_bad += 1
                    print(f"[tokenizer] fuzz mismatch ps={ps} {t!r}", file=sys.stderr)
    print(f"[tokenizer] fuzz: {n_fuzz} strings x 2 parse_special settings, {n_bad} mismatches", file=sys.stderr)
    doc = {
        "source": "llama.cpp llama-tokenize (" + subprocess.run([os.path.join(a.llama_bin, "llama-tokenize"),
                                                                   "--version"], capture_output=True,
                                                                  text=True).stderr.strip().splitlines()[0] + ")",
        "model": os.path.basename(model),
        "model_sha256": gen.sha256(model),
        "made_by": "python3 tools/reference/gen_gemma3_data.py (the text goes on stdin: no escape processing)",
        "commands": {
            "ids": " ".join(tokenize_cmd("LLAMA_BIN", "MODEL", ["--no-bos"])),
            "ids_no_parse_special": " ".join(tokenize_cmd("LLAMA_BIN", "MODEL", ["--no-bos", "--no-parse-special"])),
        },
        "notes": "ids: add_bos=false, parse_special=true. With the model's default add_bos, llama-tokenize gives "
                 "[2] + ids for every case (checked). ids_no_parse_special (parse_special=false) is present only "
                 "where it differs: control tokens (<start_of_turn>, <eos>, <unusedN>, ...) are then plain text, "
                 "but USER_DEFINED tokens (runs of 2-31 spaces, 1-31 newlines, 1-31 tabs, HTML tags like <b>, "
                 "<s>, [multimodal], <start_of_image>) are always matched first, longest text first. Exception: "
                 "llama.cpp promotes the USER_DEFINED text '</s>' (id 212) to CONTROL because it is on its list "
                 "of end-of-generation texts, so '</s>' is split into '</' 's' '>' when parse_special is false "
                 "(and llama.cpp stops generating at id 212, as at 1 <eos> and 106 <end_of_turn>). Runs of 2+ "
                 "spaces are the raw-space USER_DEFINED tokens 138..167, so the next word gets no U+2581 "
                 "prefix; a single space is U+2581 (236743). '\\r' and NBSP have no piece: byte fallback. A python "
                 "mirror of llama.cpp's SPM path (gemma3_reference.SpmVocab.encode) gives the same ids for all "
                 f"cases and for {n_fuzz} random strings (both settings, {n_bad} mismatches).",
        "cases": cases,
    }
    out = os.path.join(out_dir, "tokenizer_gemma3_reference.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)
    return n_bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default=os.path.join(REPO, "models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--llama-bin", default="/tmp/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin")
    ap.add_argument("--out", default=os.path.join(REPO, "tests/data"))
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--only", choices=["model", "tokenizer"], help="regenerate only one of the two files")
    a = ap.parse_args()
    import gguf
    vocab = g3.SpmVocab(gguf.GGUFReader(a.gguf))
    if not a.no_llama_cpp and a.only != "model":
        gen_tokenizer(a, vocab, a.out)
    if a.only == "tokenizer":
        return
    cfg, W, _ = g3.load_gemma3(a.gguf, check_dequant=True)
    window_logprobs = {}
    doc = gen_model(a, vocab, cfg, W, window_logprobs)
    if not a.no_llama_cpp:
        add_llama_cpp(a, doc, window_logprobs)
    out = os.path.join(a.out, "gemma3_270m_reference.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
