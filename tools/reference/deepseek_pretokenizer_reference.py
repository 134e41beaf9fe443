#!/usr/bin/env python3
"""Independent reference for kvserve's DeepSeek pre-tokenizers.

llama.cpp (src/llama-vocab.cpp) pre-tokenizes a DeepSeek GGUF with a list of
regexes per tokenizer.ggml.pre value, and src/unicode.cpp applies such a list
as a chain of splits: each regex splits every piece that the previous one
left (its matches and the gaps between them all become pieces), one regex
after the other, not as one alternation. This script applies the same lists,
copied verbatim below, with Python's `regex` module in that manner, and
records the pieces of a corpus of tricky texts. tests/deepseek_pretokenizer_test.cpp
checks kvserve's pre_tokenize() against the file without Python.

Two details of llama.cpp's matcher are mirrored on purpose:
  * it replaces every non-ASCII whitespace character (U+0085, U+00A0, U+3000,
    ...) by U+000B before matching, so that its std::regex's \\s sees it; the
    same character then no longer falls in an explicit range such as
    DeepSeek-LLM's [　-。] or [ࠀ-一]. Done here too.
  * std::regex's ECMAScript `$` matches only at the end of the piece; Python's
    also matches before a final newline, so a trailing `$` becomes `\\Z`.

  splits [--out FILE]       the pre-token pieces of every corpus text under
                            every DeepSeek pre-tokenizer (JSON)
  ids --llama-bin DIR --model GGUF [--vocab-from GGUF] [--out FILE]
                            token ids from llama.cpp's llama-tokenize for the
                            same texts, on copies of a byte-level BPE GGUF
                            (`kvserve synth --preset tiny-deepseek2`) with
                            tokenizer.ggml.pre set to each DeepSeek name (and
                            optionally the vocabulary of another synth file)

Needs: pip install regex
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import regex

# llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe's regex_exprs, as Python
# strings (the C++ "[\r\n]" holds a real CR and LF). Non-ASCII characters are
# written as escapes: an editor that normalizes to NFC would turn U+1FD3 into
# U+0390 (breaking the range \u1fd0-\u1fd3), U+2126 into U+03A9, and so on.
PRE_TOKENIZERS = {
    # LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM: DeepSeek-LLM, DeepSeek-V2, V2-Lite
    "deepseek-llm": [
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}+",
    ],
    # LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM: DeepSeek-V3, R1
    "deepseek-v3": [
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
        "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ],
    # LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_CODER
    "deepseek-coder": [
        "[\r\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}",
    ],
}

# Tricky texts: scripts, digits, punctuation (ASCII, fullwidth, CJK),
# whitespace of every kind, marks, emoji, controls, long runs.
TEXTS = [
    "",
    " ",
    "\n",
    "\t",
    "a",
    "Hello, world! This is a simple English sentence.",
    "I'm sure they'll say it's fine, we've done what we'd planned. DON'T",
    "'s 'S 're 'VE 'll '' ''x",
    "def add(a, b):\n    return a + b\n",
    "#include <vector>\nint main() { return v[0]->x ? 1 : -1; }\n",
    "if (x == 1) {\n\tfoo_bar(&y, \"str\");\n}\r\n",
    "x = [i**2 for i in range(10)]  # squares",
    "URL: https://example.com/path?q=1&x=y#frag @user $var %d ^_^ `code` {a|b} ~x",
    "12345 apples cost $6.78",
    "1234567890123456789 and 00700 and 3.14159 and 1,000,000",
    "Numbers: 0 00 007 ½ ² ³ Ⅻ ⅷ ① ١٢٣٤٥ ০১২ 123abc456",
    "abc123def 4567x 89",
    "Café naïve façade résumé Ünïcödé ÀÖØöøÿ",
    "e\u0301 a\u0308o\u0308 n\u0303 \u0301x \u0301",
    "Ελληνικά και ἀρχαῖα ᾧ ῼ",
    "Привет мир, Ёжик! ҐЄЇ",
    "Բարեւ Հայաստան ԱԲԳ աբգ",
    "שלום עולם",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "ქართული ენა ᲐᲑᲒ Ⴀ",
    "中文测试：你好，世界！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트와 한글 자모 ㄱㄴㄷ",
    "Hello世界123abc한국어テストx",
    "ＡＢＣａｂｃ１２３！？",
    "！！？？（括号）【】《》「」『』",
    "“quoted” ‘single’ … ellipsis — dash – en",
    "!!!??? ... --- *** ///",
    " !x  ?? y",
    "Emoji: 👍🏽 👨\u200d👩\u200d👧 🚀✨ 😀!",
    "$100 + 5 = €6 © ® ™ ± × ÷ → ∑ ∞ ≈ ≠",
    "a  b   c\t\td",
    "   leading",
    "trailing   ",
    "  both  ",
    "\u3000full\u3000width\u3000space\u3000",
    "\xa0nbsp\xa0 and\u2003em\u2003space \u2009thin",
    "x\u3001y\u3002z\u3000\u3001",
    "sep\u2028line\u2029para\u205fmath\u1680ogham\u180emongolian\u200bzw \u202fnarrow",
    "\u4e2d\u3000\u6587 \ud55c\u2003\uad6d \u0928\u2000\u092e \u3000\u3000\u3001",
    "line1\nline2\n\n\nline3",
    "a\r\nb\r\n\r\nc\r",
    "  \n  \n",
    "text\n   \n  more\n\t\n",
    "end.\n\n",
    "ctrl\x01chars\x1c\x7f and \x85next",
    "zero\u200bwidth\u200djoin\ufeffbom",
    "\U0001d400\U0001d401 \U0001d538\U0001d553 \U00010400\U00010428 \U0001e900 \u00df \u1e9e \u017f \u00b5 "
    "\u03a9 \u2126 K \u212a \u01c5 \u1fbe \u1fd3 \u0390 \u0386 \u1fbb \u2c00 \ua640 \ufb01",
    "x.y_z foo-bar a/b c\\d",
    "\u0301\u0301\u0301",
    "a" * 100,
    " " * 50 + "x",
    "!" * 40,
    "1" * 40,
    "\n" * 10 + " " * 5,
]


def llama_cpp_whitespace(ch):
    return bool(regex.match(r"\s", ch))


def compile_like_llama_cpp(expr):
    if expr.endswith("$") and not expr.endswith("\\$"):
        expr = expr[:-1] + "\\Z"
    return regex.compile(expr)


def split(text, exprs):
    """The pieces of text after applying exprs one after the other."""
    work = "".join("\x0b" if ord(c) > 0x7F and llama_cpp_whitespace(c) else c for c in text)
    offsets = [(0, len(text))] if text else []
    for expr in exprs:
        pattern = compile_like_llama_cpp(expr)
        pieces = []
        for begin, end in offsets:
            pos = begin
            for m in pattern.finditer(work, begin, end):
                if m.start() > pos:
                    pieces.append((pos, m.start()))
                pieces.append((m.start(), m.end()))
                pos = m.end()
            if pos < end:
                pieces.append((pos, end))
        offsets = pieces
    return [text[b:e] for b, e in offsets]


def cmd_splits(args):
    cases = [{"text": t, "pieces": {name: split(t, exprs) for name, exprs in PRE_TOKENIZERS.items()}} for t in TEXTS]
    for case in cases:
        for name, pieces in case["pieces"].items():
            assert "".join(pieces) == case["text"], (name, case["text"])
    out = {
        "generator": "tools/reference/deepseek_pretokenizer_reference.py splits",
        "versions": {"python": sys.version.split()[0], "regex": regex.__version__},
        "regexes": PRE_TOKENIZERS,
        "cases": cases,
    }
    write_json(out, args.out)


# --- a copy of a GGUF file with some metadata replaced (no numpy needed) ---
# Tensor offsets are relative to the data section, so only the header and the
# padding before the data change.

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY, GGUF_INT32 = 8, 9, 5


class _Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n]
        self.pos += n
        return s

    def value(self, typ):
        if typ == GGUF_STRING:
            return self.string()
        if typ == GGUF_ARRAY:
            et, n = self.take("<I"), self.take("<Q")
            return [self.value(et) for _ in range(n)]
        return self.take(_SCALAR[typ])


def _pack_value(typ, value, elem_type=None):
    if typ == GGUF_STRING:
        b = value if isinstance(value, bytes) else value.encode("utf-8")
        return struct.pack("<Q", len(b)) + b
    if typ == GGUF_ARRAY:
        return struct.pack("<IQ", elem_type, len(value)) + b"".join(_pack_value(elem_type, v) for v in value)
    return struct.pack(_SCALAR[typ], value)


def read_gguf(path):
    """(raw KV entries by key, {key: (type, value)}, tensor-info bytes, data bytes, alignment)."""
    with open(path, "rb") as f:
        data = f.read()
    c = _Cursor(data)
    assert c.data[:4] == b"GGUF", path
    c.pos = 4
    version, n_tensors, n_kv = c.take("<I"), c.take("<Q"), c.take("<Q")
    assert version == 3, version
    raw, values = {}, {}
    for _ in range(n_kv):
        start = c.pos
        key = c.string().decode()
        typ = c.take("<I")
        values[key] = (typ, c.value(typ))
        raw[key] = data[start:c.pos]
    start = c.pos
    for _ in range(n_tensors):
        c.string()
        n_dims = c.take("<I")
        c.pos += 8 * n_dims + 4 + 8
    infos = data[start:c.pos]
    align = values.get("general.alignment", (4, 32))[1]
    data_start = (c.pos + align - 1) // align * align
    return raw, values, n_tensors, infos, data[data_start:], align


def rewrite_gguf(src, dst, replace):
    """Copies src to dst with the KV entries in replace ({key: packed entry bytes}) swapped."""
    raw, _, n_tensors, infos, tensor_data, align = read_gguf(src)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(raw)))
    for key, entry in raw.items():
        out += replace.get(key, entry)
    out += infos
    out += b"\0" * (-len(out) % align)
    out += tensor_data
    with open(dst, "wb") as f:
        f.write(out)


def kv_entry(key, typ, value, elem_type=None):
    k = key.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<I", typ) + _pack_value(typ, value, elem_type)


def llama_tokenize(llama_bin, model, text):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [os.path.join(llama_bin, "llama-tokenize"), "-m", model, "-f", path, "--no-escape", "--ids",
               "--no-bos", "--log-disable"]
        env = dict(os.environ, LD_LIBRARY_PATH=llama_bin)
        res = subprocess.run(cmd, capture_output=True, env=env, check=True)
        last = res.stdout.decode().strip().splitlines()[-1]
        return json.loads(last)
    finally:
        os.unlink(path)


def cmd_ids(args):
    # llama-tokenize loads the model with default parameters, so --override-kv
    # does not reach the vocabulary: write a copy per pre-tokenizer instead.
    replace = {}
    _, base, *_ = read_gguf(args.model)
    if args.vocab_from:
        _, vocab, *_ = read_gguf(args.vocab_from)
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"):
            typ, value = vocab[key]
            elem = GGUF_INT32 if key.endswith("token_type") else GGUF_STRING
            replace[key] = kv_entry(key, typ, value, elem)
        for key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"):
            replace[key] = kv_entry(key, vocab[key][0], vocab[key][1])
        base = vocab
    vocab_size = len(base["tokenizer.ggml.tokens"][1])
    models = {}
    tmp = tempfile.mkdtemp()
    for pre in PRE_TOKENIZERS:
        models[pre] = os.path.join(tmp, f"{pre}.gguf")
        rewrite_gguf(args.model, models[pre], dict(replace, **{"tokenizer.ggml.pre": kv_entry(
            "tokenizer.ggml.pre", GGUF_STRING, pre)}))
        _, check, *_ = read_gguf(models[pre])
        assert check["tokenizer.ggml.pre"][1] == pre.encode()
    cases = []
    for t in TEXTS:
        if not t:
            continue  # llama-tokenize wants a prompt
        cases.append({"text": t, "ids": {pre: llama_tokenize(args.llama_bin, models[pre], t) for pre in PRE_TOKENIZERS}})
    for path in models.values():
        os.unlink(path)
    os.rmdir(tmp)
    out = {
        "generator": "tools/reference/deepseek_pretokenizer_reference.py ids",
        "command": "llama-tokenize -m COPY_WITH_PRE.gguf -f TEXT_FILE --no-escape --ids --no-bos --log-disable",
        "model": args.model_note or os.path.basename(args.model),
        "vocab_size": vocab_size,
        "cases": cases,
    }
    write_json(out, args.out)


def write_json(obj, path):
    text = json.dumps(obj, ensure_ascii=False, indent=1) + "\n"
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("splits")
    s.add_argument("--out")
    s.set_defaults(func=cmd_splits)
    i = sub.add_parser("ids")
    i.add_argument("--llama-bin", required=True, help="folder with llama-tokenize and its libraries")
    i.add_argument("--model", required=True, help="a GGUF file llama.cpp loads (its vocabulary only)")
    i.add_argument("--vocab-from", help="take tokens, types, merges and BOS/EOS ids from this GGUF instead")
    i.add_argument("--model-note", help="how the model was made, recorded in the JSON")
    i.add_argument("--out")
    i.set_defaults(func=cmd_ids)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
