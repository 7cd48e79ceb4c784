"""Writes the GGUF test files in tests/data/gguf/ with gguf-py (the `gguf`
package, pinned in scripts/golden/setup.sh), and gguf-py's own reading of
them as the reference the C++ reader is checked against:

  types.gguf                 one tensor per ggml type flexmodel dequantizes
                             (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
                             Q4_K, Q5_K, Q6_K), plus Q2_K and Q3_K tensors
                             flexmodel refuses, and metadata of every GGUF
                             value type (arrays and nested arrays included),
                             written with a 64-byte alignment
  types.dequant.safetensors  gguf.quants.dequantize of each tensor (float32,
                             the tensor's numpy shape)
  llama-tiny/                a random Llama (Transformers 5.23 save_pretrained:
                             config.json, model.safetensors), with
    llama-tiny.gguf          its F32 GGUF as llama.cpp's convert_hf_to_gguf.py
                             lays it out (names, metadata, Q/K rows permuted
                             for its rope), written with gguf-py's GGUFWriter
    llama-tiny.logits.safetensors  Transformers' logits for fixed input ids
    llama-tiny-q8_0.gguf     the same with every matrix whose rows are whole
                             32-blocks quantized to Q8_0 by gguf-py (the rest F32)
    llama-tiny-q8_0.logits.safetensors  Transformers' logits with the weights
                             gguf-py dequantizes from that file
  qwen2-tiny-q8_0.gguf       a random Qwen2 (q/k/v biases, tied embeddings) as
                             llama.cpp writes it (arch qwen2: no q/k permutation),
    .logits.safetensors      and Transformers' logits on gguf-py's weights
  llama-tiny-tied-q8_0.gguf  a Llama with tied embeddings (no output.weight,
                             as llama.cpp writes it), Q8_0, and its
    .logits.safetensors      Transformers' logits with gguf-py's weights
  qwen3-tiny-q8_0.gguf       a random Qwen3 (per-head q/k norms, head_dim 32
                             beside hidden 64) as llama.cpp writes arch qwen3,
    .logits.safetensors      Q8_0, and Transformers' logits on gguf-py's weights
  phi3-tiny-q8_0.gguf        a random Phi-3 (fused qkv_proj / gate_up_proj, kept
                             fused by llama.cpp as attn_qkv / ffn_up), Q8_0,
    .logits.safetensors      and Transformers' logits on gguf-py's weights
  gemma2-tiny-q8_0.gguf      a random Gemma 2 (sandwich norms stored as 1 + w, as
                             llama.cpp's converter stores them; softcaps, window 4),
    .logits.safetensors      Q8_0, and Transformers' logits on gguf-py's weights
  llama-mixed.gguf           one Llama block (hidden 256) whose matrices are
                             random blocks of Q4_K, Q4_0, Q5_K, Q6_K, Q4_1,
                             Q5_1, Q5_0 and a Q8_0 head (the quantized kernels)
    .logits.safetensors      Transformers' logits on gguf-py's dequantized
                             weights, for a 12-token (prefill) and a 5-token
                             (decode-shaped) input
  vocab-qwen2.gguf           tokenizer-only GGUFs (no tensors) written the way
  vocab-gpt2.gguf            llama.cpp's convert_hf_to_gguf writes a byte-level
  vocab-llama-bpe.gguf       BPE vocabulary (tokenizer.ggml.model "gpt2"): from
                             tests/data/tokenizers/qwen2 (pre "qwen2"), and from
                             GPT-2's first 300 merges (pre "gpt-2"; and with Llama
                             3's split regex and add_bos_token, pre "llama-bpe")
    vocab.expected.json      the `tokenizers` package's ids (add_special_tokens)
                             and decoding for a set of strings, per file
  llama-bpe-tiny-q8_0.gguf   a random tied Llama (Q8_0) with the llama-bpe
    .expected.json           vocabulary, and a prompt's ids, 4 greedy tokens by
                             Transformers on gguf-py's weights, and their text
  <arch>-tiny-q8_0.gguf      gemma3, olmo2, gpt2, gptneox, qwen2moe, qwen3moe:
    .logits.safetensors      written by make_gguf_archs.py (see its docstring)
  vocab-spm.gguf             a sentencepiece ("llama") vocabulary and Transformers'
    .expected.json           tokenization of it: make_gguf_spm.py
  fuzz/corpus/gguf/*.gguf    small seeds (vocab.gguf: vocab-qwen2.gguf's metadata) for the fuzz target fuzz/fuzz_gguf.cpp
  types.metadata.json        each metadata key as gguf-py's GGUFReader reads
                             it back: {"type": name, "value": ...}; plus
                             "__tensors__": name -> {"type", "shape"}

Quantized tensors: the legacy types are quantized by gguf-py from random
normal floats ("<type>") and also given as random block bytes
("<type>.random"); the k-quants, which gguf-py does not quantize, are random
block bytes. In random blocks every fp16 scale field is overwritten with a
finite, moderate value; all other bits are random.

Run:  PY=$(bash scripts/golden/setup.sh); $PY scripts/golden/make_gguf.py
"""

import json
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from safetensors.numpy import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "gguf")

# Byte offsets of the fp16 fields in one block of each type, and whether the
# field is a minimum (kept non-negative: the k-quants subtract dmin * min).
FP16_FIELDS = {
    T.Q8_0: [(0, False)],
    T.Q4_0: [(0, False)],
    T.Q5_0: [(0, False)],
    T.Q4_1: [(0, False), (2, True)],
    T.Q5_1: [(0, False), (2, True)],
    T.Q2_K: [(80, False), (82, True)],
    T.Q3_K: [(108, False)],
    T.Q4_K: [(0, False), (2, True)],
    T.Q5_K: [(0, False), (2, True)],
    T.Q6_K: [(208, False)],
}


def random_blocks(rng, qtype, rows, cols):
    """Random block bytes for a [rows, cols] tensor of `qtype`, with sane scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert cols % block == 0
    n_blocks = rows * cols // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off, is_min in FP16_FIELDS[qtype]:
        mag = rng.uniform(0.002, 0.08, size=n_blocks)
        val = mag if is_min else mag * rng.choice([-1.0, 1.0], size=n_blocks)
        raw[:, off:off + 2] = val.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(rows, cols // block * size)


def write_and_close(w):
    """Header, metadata, tensors: what every GGUF written here ends with."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def add_placeholder_vocab(w, n_vocab):
    """A model file's stand-in vocabulary (the tests feed ids): <tN> pieces, bos 1, eos 2."""
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(n_vocab)])
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types([gguf.TokenType.NORMAL] * n_vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def randomize(model, seed=None):
    """Weights drawn N(0, 0.3) (larger than the 0.02 init, so the logits differ
    visibly between layouts); seed: set just before the draw."""
    import torch
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def write_types(rng):
    path = os.path.join(OUT, "types.gguf")
    w = gguf.GGUFWriter(path, "flextest")
    w.add_custom_alignment(64)
    w.add_name("flexmodel gguf types")
    # One key per value type, arrays of several element types, a nested array.
    add_all_value_types(w)

    refs = {}
    rows, cols = 2, 512

    def add(name, data, qtype=None):
        if qtype is None:
            w.add_tensor(name, data)
            qt = T.F32 if data.dtype == np.float32 else T.F16
            refs[name] = gguf.quants.dequantize(data.view(np.uint8), qt).reshape(data.shape)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
            refs[name] = gguf.quants.dequantize(data, qtype)
        assert refs[name].dtype == np.float32

    x = rng.standard_normal((rows, cols)).astype(np.float32)
    add("f32", x)
    # F16 from random bits: subnormals, infinities and NaN payloads included.
    add("f16", rng.integers(0, 65536, size=(rows, cols), dtype=np.uint16).view(np.float16))
    add("bf16", gguf.quants.quantize(x, T.BF16), T.BF16)
    for qt in (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
        add(qt.name.lower(), gguf.quants.quantize(x, qt), qt)
        add(qt.name.lower() + ".random", random_blocks(rng, qt, rows, cols), qt)
    for qt in (T.Q4_K, T.Q5_K, T.Q6_K):
        add(qt.name.lower(), random_blocks(rng, qt, rows, cols), qt)
    # A 3-D tensor: the file's dims are reversed to the torch shape.
    blocks3 = random_blocks(rng, T.Q6_K, 2 * 3, 256).reshape(2, 3, -1)
    add("q6_k.3d", blocks3, T.Q6_K)
    # Types flexmodel reads but does not dequantize.
    for qt in (T.Q2_K, T.Q3_K):
        name = qt.name.lower() + ".unsupported"
        w.add_tensor(name, random_blocks(rng, qt, 2, 256), raw_dtype=qt)

    write_and_close(w)
    save_file({k: np.ascontiguousarray(v) for k, v in refs.items()}, os.path.join(OUT, "types.dequant.safetensors"))
    describe(path, os.path.join(OUT, "types.metadata.json"))


def add_all_value_types(w):
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float64("test.f64", -2.5e-300)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo, GGUF")
    w.add_array("test.array_i32", [1, -2, 3, 2147483647])
    w.add_key_value("test.array_u8", [0, 1, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.array_f32", [0.5, -1.25, 3e38], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("test.array_f64", [1e-300, 2.0], V.ARRAY, sub_type=V.FLOAT64)
    w.add_key_value("test.array_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_key_value("test.array_u64", [0, 18446744073709551615], V.ARRAY, sub_type=V.UINT64)
    w.add_array("test.array_str", ["a", "", "ünïcode", "tokens with spaces"])
    w.add_array("test.array_nested", [[1, 2], [3, 4, 5]])


def write_fuzz_seeds(rng):
    out = os.path.join(ROOT, "fuzz", "corpus", "gguf")
    os.makedirs(out, exist_ok=True)
    # Metadata only.
    w = gguf.GGUFWriter(os.path.join(out, "metadata.gguf"), "flextest")
    add_all_value_types(w)
    write_and_close(w)
    # A few small tensors of several types, default alignment.
    w = gguf.GGUFWriter(os.path.join(out, "tensors.gguf"), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    w.add_tensor("f32", rng.standard_normal((2, 4)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((1, 8)).astype(np.float16))
    w.add_tensor("q8_0", random_blocks(rng, T.Q8_0, 1, 32), raw_dtype=T.Q8_0)
    w.add_tensor("q4_k", random_blocks(rng, T.Q4_K, 1, 256), raw_dtype=T.Q4_K)
    w.add_tensor("q6_k", random_blocks(rng, T.Q6_K, 1, 256), raw_dtype=T.Q6_K)
    write_and_close(w)


def field_value(field):
    """A metadata value as GGUFReader decodes it, JSON-ready."""
    def conv(v):
        if isinstance(v, (bytes, bytearray)):
            return v.decode("utf-8")
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, list):
            return [conv(i) for i in v]
        return v
    return conv(field.contents())


def describe(path, out):
    r = gguf.GGUFReader(path)
    meta = {}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue  # the header fields (version, counts)
        entry = {"type": field.types[0].name.lower()}
        if field.types[0] == V.ARRAY:
            # GGUFReader flattens arrays of arrays: "value" then lists the
            # innermost elements, and "types" is the chain of types.
            entry["types"] = [t.name.lower() for t in field.types]
            entry["element_type"] = field.types[-1].name.lower()
        v = field_value(field)
        # JSON cannot hold 64-bit integers exactly everywhere: store as strings.
        if entry["type"] in ("uint64", "int64"):
            v = str(v)
        if entry.get("element_type") in ("uint64", "int64"):
            v = [str(i) for i in v]
        if entry["type"] in ("float32", "float64") or entry.get("element_type") in ("float32", "float64"):
            v = [float(i).hex() for i in v] if isinstance(v, list) else float(v).hex()
        entry["value"] = v
        meta[name] = entry
    meta["__tensors__"] = {
        t.name: {"type": t.tensor_type.name, "type_id": int(t.tensor_type), "shape": [int(d) for d in reversed(t.shape)],
                 "offset": int(t.data_offset - r.data_offset), "nbytes": int(t.n_bytes)}
        for t in r.tensors
    }
    meta["__data_offset__"] = int(r.data_offset)
    with open(out, "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")


def hf_to_gguf_permute(w, n_head):
    """llama.cpp's converter reorders each head's q/k rows from Transformers'
    rotate-half layout (first half, second half) to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_to_hf_permute(w, n_head):
    """The inverse of hf_to_gguf_permute (checked on every tensor it is used on)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_decoder_hparams(w, name, cfg, rope_base):
    """The hyperparameters every decoder GGUF here carries, in the order llama.cpp's converter writes them."""
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(rope_base)


def write_llama_gguf(path, cfg, model, quantize, arch="llama", vocab=None, extra=None):
    """`model` as llama.cpp's converter writes it; quantize: Q8_0 where rows are whole blocks.
    Returns the state dict gguf-py reads back (dequantized, q/k rows in Transformers' order).
    arch "llama" permutes q/k rows (LlamaModel.permute); "qwen2" does not (Qwen2Model keeps
    Transformers' rotate-half layout, llama.cpp runs it with NEOX rope). vocab: add_bpe_vocab's
    arguments after the writer, for a real tokenizer instead of placeholder tokens. extra(w): more
    keys and tensors (make_gguf_rope.py's RoPE scaling), written after the hyperparameters."""
    permute = arch == "llama"
    w = gguf.GGUFWriter(path, arch)
    back = {}
    add_decoder_hparams(w, "llama-tiny", cfg, cfg.rope_parameters["rope_theta"])
    if arch in ("qwen2", "qwen3"):
        w.add_vocab_size(cfg.vocab_size)
    if arch in ("qwen3", "gemma2"):
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    if arch == "gemma2":  # what llama.cpp's Gemma2Model writes
        w.add_sliding_window(cfg.sliding_window)
        w.add_float32(f"{arch}.attn_logit_softcapping", cfg.attn_logit_softcapping)
        w.add_float32(f"{arch}.final_logit_softcapping", cfg.final_logit_softcapping)
    w.add_rope_dimension_count(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32)
    if extra is not None:
        extra(w)
    if vocab is not None:
        add_bpe_vocab(w, *vocab)
    else:
        add_placeholder_vocab(w, cfg.vocab_size)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}
    per_layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                 "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}  # Phi-3's fused ones
    if arch == "gemma2":
        per_layer.update({"post_attention_layernorm": "post_attention_norm",
                          "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"})
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # llama.cpp writes no output tensor for tied embeddings
        x = t.float().numpy()
        parts = name.split(".")
        if parts[0] == "lm_head":
            gname = "output.weight"
        elif parts[1] == "layers":
            sub = ".".join(parts[3:-1])
            gname = f"blk.{parts[2]}.{per_layer[sub]}.{parts[-1]}"
            if permute and sub == "self_attn.q_proj":
                x = hf_to_gguf_permute(x, cfg.num_attention_heads)
            elif permute and sub == "self_attn.k_proj":
                x = hf_to_gguf_permute(x, cfg.num_key_value_heads)
        else:
            gname = names[parts[1]] + ".weight"
        x = np.ascontiguousarray(x)
        gemma_norm = arch == "gemma2" and name.endswith("norm.weight")
        if gemma_norm:  # llama.cpp's Gemma converters store 1 + w (its RMSNorm multiplies by w)
            x = (x + np.float32(1.0)).astype(np.float32)
        if quantize and x.ndim == 2 and x.shape[1] % 32 == 0:
            q = gguf.quants.quantize(x, T.Q8_0)
            w.add_tensor(gname, q, raw_dtype=T.Q8_0)
            d = gguf.quants.dequantize(q, T.Q8_0)
        else:
            w.add_tensor(gname, x)
            d = x
        if permute and parts[0] != "lm_head" and parts[1] == "layers" and sub in ("self_attn.q_proj", "self_attn.k_proj"):
            heads = cfg.num_attention_heads if sub == "self_attn.q_proj" else cfg.num_key_value_heads
            assert np.array_equal(gguf_to_hf_permute(x, heads), t.float().numpy())
            d = gguf_to_hf_permute(d, heads)
        if gemma_norm:
            d = (d - np.float32(1.0)).astype(np.float32)
        back[name] = np.ascontiguousarray(d)
    write_and_close(w)
    return back


def write_llama_tiny():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(52)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, tie_word_embeddings=False)
    model = randomize(LlamaForCausalLM(cfg))
    folder = os.path.join(OUT, "llama-tiny")
    model.save_pretrained(folder, safe_serialization=True)

    ids = torch.tensor([[1, 7, 19, 42, 3, 63, 0, 25, 11, 8]])
    with torch.no_grad():
        logits = model(ids).logits.float()
    save_file({"input_ids": ids.numpy(), "logits": logits.numpy()}, os.path.join(OUT, "llama-tiny.logits.safetensors"))

    write_llama_gguf(os.path.join(OUT, "llama-tiny.gguf"), cfg, model, quantize=False)
    back = write_llama_gguf(os.path.join(OUT, "llama-tiny-q8_0.gguf"), cfg, model, quantize=True)
    qmodel = LlamaForCausalLM(cfg).eval()
    qmodel.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    with torch.no_grad():
        qlogits = qmodel(ids).logits.float()
    assert (qlogits - logits).abs().max() > 1e-3  # the quantization shows
    save_file({"input_ids": ids.numpy(), "logits": qlogits.numpy()}, os.path.join(OUT, "llama-tiny-q8_0.logits.safetensors"))

    # Tied embeddings.
    tcfg = LlamaConfig(**{**cfg.to_dict(), "tie_word_embeddings": True})
    tmodel = randomize(LlamaForCausalLM(tcfg))
    back = write_llama_gguf(os.path.join(OUT, "llama-tiny-tied-q8_0.gguf"), tcfg, tmodel, quantize=True)
    assert "lm_head.weight" not in back
    qt = LlamaForCausalLM(tcfg).eval()
    missing, unexpected = qt.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    qt.tie_weights()
    assert torch.equal(qt.lm_head.weight, torch.from_numpy(back["model.embed_tokens.weight"]))
    with torch.no_grad():
        tlogits = qt(ids).logits.float()
    save_file({"input_ids": ids.numpy(), "logits": tlogits.numpy()},
              os.path.join(OUT, "llama-tiny-tied-q8_0.logits.safetensors"))


# llama-mixed: one Llama block whose matrices are random blocks of every
# quantized type flexmodel computes on (gguf-py quantizes no k-quant, so the
# blocks are drawn, with scales that keep weights near the 0.3 of the other
# tiny models), and Transformers' logits on the weights gguf-py dequantizes.
MIXED_TYPES = {"self_attn.q_proj": T.Q4_K, "self_attn.k_proj": T.Q4_0, "self_attn.v_proj": T.Q5_K,
               "self_attn.o_proj": T.Q6_K, "mlp.gate_proj": T.Q4_1, "mlp.up_proj": T.Q5_1, "mlp.down_proj": T.Q5_0,
               "lm_head": T.Q8_0}
# Scale magnitudes giving weights of roughly unit-0.3 size per type (q ranges differ).
MIXED_SCALE = {T.Q4_K: 0.003, T.Q4_0: 0.5, T.Q5_K: 0.0015, T.Q6_K: 0.0005, T.Q4_1: 0.4, T.Q5_1: 0.2, T.Q5_0: 0.25,
               T.Q8_0: 0.05}


def write_tiny_q8_0(arch, seed, config_class, model_class, tied, check, **config):
    """A random tiny model of `arch` written as llama.cpp writes it, Q8_0, and the
    logits Transformers computes on gguf-py's dequantized weights (read back)."""
    import torch

    torch.manual_seed(seed)
    cfg = config_class(vocab_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=tied, **config)
    model = randomize(model_class(cfg))
    back = write_llama_gguf(os.path.join(OUT, f"{arch}-tiny-q8_0.gguf"), cfg, model, quantize=True, arch=arch)
    assert any(k.endswith(check) for k in back), check
    q = model_class(cfg).eval()
    missing, unexpected = q.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=not tied)
    if tied:
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        q.tie_weights()
    ids = torch.tensor([[1, 7, 19, 42, 3, 63, 0, 25, 11, 8]])  # longer than Gemma 2's window of 4
    with torch.no_grad():
        logits = q(ids).logits.float()
    save_file({"input_ids": ids.numpy(), "logits": logits.numpy()}, os.path.join(OUT, f"{arch}-tiny-q8_0.logits.safetensors"))


def write_architecture_tinies():
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

    write_tiny_q8_0("qwen2", 53, Qwen2Config, Qwen2ForCausalLM, True, "q_proj.bias", hidden_size=32,
                    intermediate_size=48, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    write_tiny_q8_0("qwen3", 55, Qwen3Config, Qwen3ForCausalLM, False, "q_norm.weight", hidden_size=64,
                    intermediate_size=96, head_dim=32, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    write_tiny_q8_0("phi3", 56, Phi3Config, Phi3ForCausalLM, False, "qkv_proj.weight", hidden_size=64,
                    intermediate_size=96, rms_norm_eps=1e-5, sliding_window=None,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
    write_tiny_q8_0("gemma2", 57, Gemma2Config, Gemma2ForCausalLM, True, "post_feedforward_layernorm.weight",
                    hidden_size=64, intermediate_size=96, head_dim=32, query_pre_attn_scalar=32, rms_norm_eps=1e-6,
                    sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)


def write_llama_mixed(rng):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)
    model = randomize(LlamaForCausalLM(cfg), 54)
    path = os.path.join(OUT, "llama-mixed.gguf")
    w = gguf.GGUFWriter(path, "llama")
    add_decoder_hparams(w, "llama-mixed", cfg, 10000.0)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    per_layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    back = {}
    for name, t in model.state_dict().items():
        parts = name.split(".")
        if parts[0] == "lm_head":
            gname, sub = "output.weight", "lm_head"
        elif parts[1] == "layers":
            sub = ".".join(parts[3:-1])
            gname = f"blk.{parts[2]}.{per_layer[sub]}.{parts[-1]}"
        else:
            sub = None
            gname = {"embed_tokens": "token_embd", "norm": "output_norm"}[parts[1]] + ".weight"
        qt = MIXED_TYPES.get(sub)
        if qt is None:
            x = np.ascontiguousarray(t.float().numpy())
            w.add_tensor(gname, x)
            back[name] = x
            continue
        rows, cols = t.shape
        raw = random_blocks(rng, qt, rows, cols)
        block, size = gguf.GGML_QUANT_SIZES[qt]
        for off, is_min in FP16_FIELDS[qt]:  # rescale the fp16 fields to the type's magnitude
            f = raw.reshape(-1, size)[:, off:off + 2].copy().view(np.float16).astype(np.float32)
            f = f / 0.04 * MIXED_SCALE[qt]
            raw.reshape(-1, size)[:, off:off + 2] = f.astype(np.float16).view(np.uint8)
        w.add_tensor(gname, raw, raw_dtype=qt)
        d = gguf.quants.dequantize(raw, qt).reshape(rows, cols)
        if sub == "self_attn.q_proj":  # the file holds llama.cpp's row order
            d = gguf_to_hf_permute(d, cfg.num_attention_heads)
        elif sub == "self_attn.k_proj":
            d = gguf_to_hf_permute(d, cfg.num_key_value_heads)
        back[name] = np.ascontiguousarray(d)
    write_and_close(w)
    q = LlamaForCausalLM(cfg).eval()
    q.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)
    out = {}
    for key, ids in (("prefill", [[1, 7, 19, 42, 3, 63, 0, 25, 11, 8, 5, 9]]), ("decode", [[1, 7, 19, 42, 3]])):
        ids = torch.tensor(ids)
        with torch.no_grad():
            out[key + "_input_ids"] = ids.numpy()
            out[key + "_logits"] = q(ids).logits.float().numpy()
    assert np.isfinite(out["prefill_logits"]).all() and np.abs(out["prefill_logits"]).max() < 1e3
    save_file(out, os.path.join(OUT, "llama-mixed.logits.safetensors"))


# --- tokenizer-only GGUFs ---------------------------------------------------

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

VOCAB_STRINGS = [
    "Hello world", "  leading spaces and   gaps  ", "digits 1234567 and 3.14159", "line one\nline two\n\n\nend",
    "unicode: caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F642 \u00d1", "it's they're I'll WE'VE", "tabs\tand\r\nCRLF",
    "<|endoftext|> after a special token", "the <tool_call> added token", "", " ", "a",
]


def gpt2_prefix_tokenizer(n_merges, llama_bpe):
    """GPT-2's first n_merges merges (ids 256 + i are their results, as in GPT-2's
    vocab.json) and <|endoftext|>, as a `tokenizers` Tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, processors, Regex
    src = os.path.join(ROOT, "tests", "data", "tokenizers", "gpt2")
    with open(os.path.join(src, "vocab.json"), encoding="utf-8") as f:
        full = json.load(f)
    with open(os.path.join(src, "merges.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")[1:1 + n_merges]
    merges = [tuple(l.split(" ")) for l in lines]
    vocab = {t: i for t, i in full.items() if i < 256 + n_merges}
    tok = Tokenizer(models.BPE(vocab, merges))
    if llama_bpe:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    if llama_bpe:
        tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", eot)])
    return tok, merges


def add_bpe_vocab(w, tok, merges, pre, special, add_bos):
    """What convert_hf_to_gguf's _set_vocab_gpt2 + SpecialVocab write, for a
    byte-level BPE tokenizer: every id up to the largest, missing ones as
    [PAD<id>] UNUSED, special added tokens CONTROL, other added tokens
    USER_DEFINED, merges as "a b" strings."""
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    rev = {i: t for t, i in vocab.items()}
    n = max(rev) + 1
    tokens, types = [], []
    for i in range(n):
        if i not in rev:
            tokens.append(f"[PAD{i}]"); types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(rev[i]); types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(rev[i]); types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    for kind, name in special.items():
        getattr(w, f"add_{kind}_token_id")(vocab[name])
    if add_bos is not None:
        w.add_add_bos_token(add_bos)


def write_vocab_gguf(path, *vocab):
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("flexmodel gguf vocabulary")
    add_bpe_vocab(w, *vocab)
    write_and_close(w)


def write_vocab_ggufs():
    from tokenizers import Tokenizer
    expected = {}
    qwen = Tokenizer.from_file(os.path.join(ROOT, "tests", "data", "tokenizers", "qwen2", "tokenizer.json"))
    qmerges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
               for m in json.load(open(os.path.join(ROOT, "tests", "data", "tokenizers", "qwen2", "tokenizer.json"),
                                       encoding="utf-8"))["model"]["merges"]]
    g2, g2m = gpt2_prefix_tokenizer(300, llama_bpe=False)
    l3, l3m = gpt2_prefix_tokenizer(300, llama_bpe=True)
    # SmolLM's pre-tokenizer (llama.cpp's "smollm"): each digit alone, then GPT-2's byte-level split.
    from tokenizers import pre_tokenizers
    sm, smm = gpt2_prefix_tokenizer(300, llama_bpe=False)
    sm.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False)])
    jobs = [("vocab-qwen2.gguf", qwen, qmerges, "qwen2", {"eos": "<|endoftext|>", "pad": "<|endoftext|>"}, None),
            ("vocab-gpt2.gguf", g2, g2m, "gpt-2", {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}, False),
            ("vocab-llama-bpe.gguf", l3, l3m, "llama-bpe", {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}, True),
            ("vocab-smollm.gguf", sm, smm, "smollm", {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}, False)]
    for name, tok, merges, pre, special, add_bos in jobs:
        write_vocab_gguf(os.path.join(OUT, name), tok, merges, pre, special, add_bos)
        ids = [tok.encode(s, add_special_tokens=True).ids for s in VOCAB_STRINGS]
        expected[name] = {"strings": VOCAB_STRINGS, "ids": ids,
                          "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids]}
    write_vocab_gguf(os.path.join(ROOT, "fuzz", "corpus", "gguf", "vocab.gguf"), *jobs[0][1:])  # a fuzz seed
    with open(os.path.join(OUT, "vocab.expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)

    # A model with that vocabulary: generate / capture --prompt on the GGUF alone.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(53)
    n = l3.get_vocab_size(with_added_tokens=True)
    cfg = LlamaConfig(vocab_size=n, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 50000.0}, tie_word_embeddings=True,
                      bos_token_id=l3.token_to_id("<|endoftext|>"), eos_token_id=None, pad_token_id=None)
    model = randomize(LlamaForCausalLM(cfg))
    back = write_llama_gguf(os.path.join(OUT, "llama-bpe-tiny-q8_0.gguf"), cfg, model, quantize=True,
                            vocab=(l3, l3m, "llama-bpe", {"bos": "<|endoftext|>", "eos": "<|endoftext|>"}, True))
    qm = LlamaForCausalLM(cfg).eval()
    missing, unexpected = qm.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    qm.tie_weights()
    prompt = "Hello world, caf\u00e9 12345"
    ids = l3.encode(prompt).ids
    out = torch.tensor([ids])
    with torch.no_grad():  # greedy by hand (no eos: always 4 new tokens)
        for _ in range(4):
            nxt = qm(out).logits[0, -1].argmax()
            out = torch.cat([out, nxt.view(1, 1)], dim=1)
    all_ids = out[0].tolist()
    with open(os.path.join(OUT, "llama-bpe-tiny-q8_0.expected.json"), "w", encoding="utf-8") as f:
        json.dump({"prompt": prompt, "prompt_ids": ids, "ids": all_ids,
                   "text": l3.decode(all_ids, skip_special_tokens=True)}, f, ensure_ascii=False, indent=1)


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(52)
    write_types(rng)
    write_fuzz_seeds(rng)
    write_llama_tiny()
    write_vocab_ggufs()
    write_llama_mixed(np.random.default_rng(54))
    write_architecture_tinies()
    import make_gguf_archs  # gemma3, olmo2, gpt2, gptneox, qwen2moe, qwen3moe (after the files above)
    make_gguf_archs.main()
    import make_gguf_spm  # vocab-spm.gguf, a sentencepiece vocabulary, and Transformers' tokenization of it
    make_gguf_spm.main()
    import make_gguf_rope  # RoPE scaling as llama.cpp writes it: Llama 3's rope_freqs, YaRN, Phi-3's longrope
    make_gguf_rope.main()
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total} bytes), gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''}", file=sys.stderr)


if __name__ == "__main__":
    main()
