"""Writes a Llama-shaped GGUF with random weights for bench_decode's GGUF
comparison with llama.cpp, at one of F32, BF16, Q8_0, Q4_0, Q4_K_M.

  python make_bench_gguf.py OUT.gguf FORMAT [--size 1.1b|0.5b|tiny] [--seed S]

Shapes: 1.1b is TinyLlama's (22 x 2048, MLP 5632, 32/4 heads, vocab 32000);
0.5b (16 x 1536, MLP 4096, 12/4 heads, vocab 32000; ~0.5B parameters) runs
a full comparison on a 2-core machine in minutes; tiny is for smoke tests.
Float weights are normal(0, 0.02), the same for every format (seeded per
tensor); Q8_0 / Q4_0 are gguf-py's quantization of them (as llama.cpp's
converter writes them: every matrix in the type, the output head in Q6_K for
Q4_0 as llama-quantize does). Q4_K_M's mix is llama-quantize's: Q4_K
matrices, Q6_K for the output head and for attn_v / ffn_down of the layers
llama.cpp gives more bits (the first and last eighth and every third one);
gguf-py has no k-quant quantizer, so those are random blocks with scales
giving weights of about the same size. A SentencePiece-shaped vocabulary of
placeholder tokens (bench inputs are token ids) lets llama.cpp load it.
Written tensor by tensor (no second copy of the model in memory).
"""
import argparse
import sys

import numpy as np
import gguf

T = gguf.GGMLQuantizationType
SIZES = {
    "1.1b": dict(layers=22, hidden=2048, ffn=5632, heads=32, kv=4, vocab=32000),
    "0.5b": dict(layers=16, hidden=1536, ffn=4096, heads=12, kv=4, vocab=32000),
    "tiny": dict(layers=2, hidden=256, ffn=512, heads=4, kv=2, vocab=512),
}
FILE_TYPE = {"F32": gguf.LlamaFileType.ALL_F32, "BF16": gguf.LlamaFileType.MOSTLY_BF16,
             "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
             "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M}


def more_bits(layer, n_layers):
    # llama-quantize's use_more_bits: the first and last eighth, and every third layer.
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_type(fmt, name, layer, n_layers):
    if name.endswith("_norm.weight"):
        return T.F32
    if fmt == "F32":
        return T.F32
    if fmt == "BF16":
        return T.BF16
    if fmt == "Q8_0":
        return T.Q8_0
    if fmt == "Q4_0":
        return T.Q6_K if name == "output.weight" else T.Q4_0
    # Q4_K_M
    if name == "output.weight":
        return T.Q6_K
    if layer is not None and (".attn_v." in name or ".ffn_down." in name) and more_bits(layer, n_layers):
        return T.Q6_K
    return T.Q4_K


# Scales for random k-quant blocks giving weights of roughly 0.02.
FP16_FIELDS = {T.Q4_K: [(0, 2.5e-5, False), (2, 2.5e-5, True)], T.Q6_K: [(208, 1.2e-5, False)]}


def random_kquant(rng, qtype, rows, cols):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = rows * cols // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off, mag, is_min in FP16_FIELDS[qtype]:
        val = rng.uniform(0.5, 1.5, size=n) * mag
        if not is_min:
            val *= rng.choice([-1.0, 1.0], size=n)
        raw[:, off:off + 2] = val.astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, cols // block * size)


def tensors(c):
    """(name, shape [out, in], layer) in llama.cpp's order."""
    h, f, hd = c["hidden"], c["ffn"], c["hidden"] // c["heads"]
    yield "token_embd.weight", (c["vocab"], h), None
    for i in range(c["layers"]):
        yield f"blk.{i}.attn_norm.weight", (h,), i
        yield f"blk.{i}.attn_q.weight", (c["heads"] * hd, h), i
        yield f"blk.{i}.attn_k.weight", (c["kv"] * hd, h), i
        yield f"blk.{i}.attn_v.weight", (c["kv"] * hd, h), i
        yield f"blk.{i}.attn_output.weight", (h, c["heads"] * hd), i
        yield f"blk.{i}.ffn_norm.weight", (h,), i
        yield f"blk.{i}.ffn_gate.weight", (f, h), i
        yield f"blk.{i}.ffn_up.weight", (f, h), i
        yield f"blk.{i}.ffn_down.weight", (h, f), i
    yield "output_norm.weight", (h,), None
    yield "output.weight", (c["vocab"], h), None


def data(name, shape, qtype, seed, index):
    rng = np.random.default_rng([seed, index])
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    if qtype in FP16_FIELDS:
        return random_kquant(rng, qtype, *shape)
    x = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    if qtype == T.F32:
        return x
    return gguf.quants.quantize(x, qtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("format", choices=sorted(FILE_TYPE))
    ap.add_argument("--size", choices=sorted(SIZES), default="1.1b")
    ap.add_argument("--seed", type=int, default=52)
    a = ap.parse_args()
    c = SIZES[a.size]
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"bench-llama-{a.size}")
    w.add_context_length(2048)
    w.add_embedding_length(c["hidden"])
    w.add_block_count(c["layers"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["heads"])
    w.add_head_count_kv(c["kv"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(c["hidden"] // c["heads"])
    w.add_file_type(FILE_TYPE[a.format])
    w.add_vocab_size(c["vocab"])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    tokens += [f"\u2581t{i}" for i in range(c["vocab"] - len(tokens))]
    types += [gguf.TokenType.NORMAL] * (c["vocab"] - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(c["vocab"])])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    plan = []
    for index, (name, shape, layer) in enumerate(tensors(c)):
        qtype = tensor_type(a.format, name, layer, c["layers"])
        if qtype == T.BF16:
            nbytes, raw = int(np.prod(shape)) * 2, T.BF16
            w.add_tensor_info(name, shape, np.dtype(np.uint16), nbytes, raw_dtype=T.BF16)
        elif qtype == T.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        plan.append((name, shape, qtype, index))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qtype, index in plan:
        x = data(name, shape, T.F32 if qtype == T.BF16 else qtype, a.seed, index)
        if qtype == T.BF16:
            x = gguf.quants.quantize(x, T.BF16)
        w.write_tensor_data(x)
    w.close()
    print(f"wrote {a.out} ({a.format}, {a.size})", file=sys.stderr)


if __name__ == "__main__":
    main()
