#!/usr/bin/env python3
"""kvserve's dequantization against gguf-py's, bit for bit.

    llama-quantize --allow-requantize IN.gguf Q.gguf IQ4_NL     # any type kvserve reads
    kvserve quantize Q.gguf DQ.gguf f32                         # kvserve's dequantization of every matrix
    python3 tools/reference/dequant_vs_gguf.py Q.gguf DQ.gguf

    python3 tools/reference/dequant_vs_gguf.py --random R.gguf  # random blocks of every type below
    kvserve quantize R.gguf RDQ.gguf f32 && python3 tools/reference/dequant_vs_gguf.py R.gguf RDQ.gguf

--random writes one 64 x 1024 matrix per type whose blocks are random bytes
(every scale and bit pattern, which llama-quantize's searched scales may
never produce), with the fp16 scales drawn from [0.001, 0.02) and a random sign.

For every tensor of Q.gguf stored in a quantized type, gguf.quants.dequantize
(the `gguf` package, numpy, the same arithmetic as ggml's dequantize_row_*)
of its bytes is compared with the f32 tensor of the same name in DQ.gguf:
the count of values whose float32 bits differ is printed per tensor, and the
exit status is 1 if any differs.
"""
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


# type: byte offsets of its fp16 scales in a block
RANDOM_TYPES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "IQ4_NL": [0],
                "IQ4_XS": [0], "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def write_random(path):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
    rng = np.random.default_rng(18)
    w = GGUFWriter(path, "llama")
    rows, cols = 64, 1024
    for name, scale_offsets in RANDOM_TYPES.items():
        qtype = GGMLQuantizationType[name]
        block_size, block_bytes = GGML_QUANT_SIZES[qtype]
        n_blocks = rows * cols // block_size
        blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for at in scale_offsets:
            scale = (rng.uniform(0.001, 0.02, n_blocks) * rng.choice([-1, 1], n_blocks)).astype(np.float16)
            blocks[:, at:at + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        w.add_tensor(f"random.{name.lower()}", blocks.reshape(rows, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--random":
        return write_random(sys.argv[2])
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    quantized, dequantized = GGUFReader(sys.argv[1]), GGUFReader(sys.argv[2])
    ours = {t.name: t for t in dequantized.tensors}
    differing = 0
    for t in quantized.tensors:
        if t.tensor_type.name in ("F32", "F16", "BF16"):
            continue
        expected = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        got = np.asarray(ours[t.name].data, dtype=np.float32).reshape(-1)
        diff = int(np.count_nonzero(expected.view(np.uint32) != got.view(np.uint32)))
        differing += diff
        print(f"{t.name:32} {t.tensor_type.name:8} {expected.size:9} values, {diff} differ")
    print("all equal" if differing == 0 else f"{differing} values differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
