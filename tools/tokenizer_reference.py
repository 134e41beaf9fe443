#!/usr/bin/env python3
"""Independent reference token ids for kvserve's tokenizer tests.

  bpe GGUF [--json OUT]   Builds a Hugging Face `tokenizers` tokenizer from the
                          GGUF file's vocabulary and merges (read with the
                          `gguf` package) and prints the ids of the test texts.
  spm TOK512_BIN          Encodes "Once upon a time" and a few more texts with a
                          Python re-implementation of llama2.c's encode() on a
                          llama2.c tokenizer.bin.

Needs: pip install tokenizers gguf
"""
import argparse
import json
import struct

# The texts whose ids tests/tokenizer_test.cpp records.
BPE_TEXTS = [
    "Hello, world! This is a simple English sentence.",
    "def add(a, b):\n    return a + b\n",
    "12345 apples cost $6.78",
    "I'm sure they'll say it's fine, we've done what we'd planned. DON'T",
    "Multiple   spaces\n\n\nand\ttabs  \n end",
    "Café naïve 日本語 Привет 🙂",
    "<|im_start|>user\nHi<|im_end|>",
    "  leading and trailing  ",
]

# Further texts only checked through the JSON fixture.
EXTRA_BPE_TEXTS = [
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
    "Emoji: 👍🏽 👨‍👩‍👧 🚀✨",
    "Tabs\tand\r\nCRLF\r\nlines",
    "    indented code\n\tand tab\n",
    "'s 'S 're 'VE 'll ''",
    "URL: https://example.com/path?q=1&x=y#frag",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start <|im_end|x <|endoftext|>",
    "Numbers: 0 00 007 1,000,000 ½ ² Ⅻ ١٢٣",
    "Ελληνικά και Русский язык",
    "ÿþ control\x01chars\x7f",
    "trailing newline\n\n",
    "a" * 50 + " " + "b" * 30,
]


def gguf_field(reader, key):
    field = reader.fields[key]
    return field.contents()


def hf_pre_tokenizer(pre):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("default", "gpt2", "gpt-2"):
        return byte_level, False
    if pre in ("smollm", "starcoder", "refact"):
        # SmolLM2's own tokenizer.json: digits split off, then GPT-2's pattern.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]), False
    digits = {"llama-bpe": r"\p{N}{1,3}", "llama3": r"\p{N}{1,3}", "qwen2": r"\p{N}"}[pre]
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|" + digits +
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), \
        digits.endswith("{1,3}")


def build_hf_tokenizer(path):
    from gguf import GGUFReader
    from tokenizers import AddedToken, Tokenizer, decoders, models

    reader = GGUFReader(path)
    assert gguf_field(reader, "tokenizer.ggml.model") == "gpt2"
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    types = gguf_field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges")]
    pre = gguf_field(reader, "tokenizer.ggml.pre") if "tokenizer.ggml.pre" in reader.fields else "default"
    pre_tokenizer, ignore_merges = hf_pre_tokenizer(pre)
    vocab = {piece: i for i, piece in reversed(list(enumerate(tokens)))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    # Control (3) and user-defined (4) tokens are matched literally in the text.
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t in (3, 4)])
    return tok


def run_bpe(args):
    tok = build_hf_tokenizer(args.gguf)
    cases = []
    for text in BPE_TEXTS + EXTRA_BPE_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids})
        if text in BPE_TEXTS:
            print(json.dumps(text), "->", "{" + ", ".join(map(str, ids)) + "}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"source": "tools/tokenizer_reference.py bpe (Hugging Face tokenizers "
                                 "built from the GGUF vocabulary and merges)",
                       "cases": cases}, f, ensure_ascii=True, indent=1)
            f.write("\n")


def read_llama2c_tokenizer(path):
    with open(path, "rb") as f:
        data = f.read()
    (max_len,) = struct.unpack_from("<i", data, 0)
    pos, pieces, scores = 4, [], []
    while pos < len(data):
        score, length = struct.unpack_from("<fi", data, pos)
        pos += 8
        pieces.append(data[pos:pos + length])
        scores.append(score)
        pos += length
    return pieces, scores


def llama2c_encode(pieces, scores, text):
    """llama2.c's encode(): a dummy-prefix space, one token per UTF-8
    character (bytes +3 when the character is not a piece), then repeatedly
    merge the first best-scoring adjacent pair whose concatenation is a piece."""
    index = {p: i for i, p in reversed(list(enumerate(pieces)))}
    data = text.encode("utf-8")
    ids = [index[b" "]] if data else []
    pos = 0
    while pos < len(data):
        length = 1
        while pos + length < len(data) and (data[pos + length] & 0xC0) == 0x80 and length < 4:
            length += 1
        char = data[pos:pos + length]
        if char in index:
            ids.append(index[char])
        else:
            ids.extend(b + 3 for b in char)
        pos += length
    while True:
        best, best_score = None, -1e10
        for i in range(len(ids) - 1):
            merged = index.get(pieces[ids[i]] + pieces[ids[i + 1]])
            if merged is not None and scores[merged] > best_score:
                best, best_score = i, scores[merged]
        if best is None:
            return ids
        ids[best:best + 2] = [index[pieces[ids[best]] + pieces[ids[best + 1]]]]


SPM_TEXTS = ["Once upon a time", "The little girl saw a big, red ball.", "Lily 日", "hello  world"]


def run_spm(args):
    pieces, scores = read_llama2c_tokenizer(args.bin)
    for text in SPM_TEXTS:
        print(json.dumps(text), "->", "{" + ", ".join(map(str, llama2c_encode(pieces, scores, text))) + "}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    bpe = sub.add_parser("bpe")
    bpe.add_argument("gguf")
    bpe.add_argument("--json")
    bpe.set_defaults(run=run_bpe)
    spm = sub.add_parser("spm")
    spm.add_argument("bin")
    spm.set_defaults(run=run_spm)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
