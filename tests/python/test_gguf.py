"""A GGUF model through the Python API (issue 52): flexmodel.from_pretrained on
a .gguf file, hooked by FlexModel. tests/data/gguf/ (scripts/golden/make_gguf.py)
holds a random Llama saved by Transformers 5.23, its F32 GGUF laid out as
llama.cpp's converter lays it out, and Transformers' logits."""
import torch
from safetensors.torch import load_file

import flexmodel
from conftest import DATA, assert_close

GGUF = DATA.parent / "gguf" / "llama-tiny.gguf"
FOLDER = DATA.parent / "gguf" / "llama-tiny"


def captures(model, ids):
    out = {}
    fm = flexmodel.FlexModel(model, out)
    fm.create_hook_group("every", "")
    with torch.no_grad():
        logits = fm(ids)
    return logits, out


def test_gguf_model_captures_equal_the_safetensors_model():
    ref = load_file(str(DATA.parent / "gguf" / "llama-tiny.logits.safetensors"))
    ids = ref["input_ids"]
    g_logits, g = captures(flexmodel.from_pretrained(GGUF), ids)
    s_logits, s = captures(flexmodel.from_pretrained(FOLDER), ids)
    assert_close(g_logits, ref["logits"], 1e-5, "GGUF model logits vs Transformers'")
    assert_close(g_logits, s_logits, 1e-5, "GGUF model logits vs the safetensors model's")
    assert sorted(g) == sorted(s) and len(g) >= 20, sorted(g)
    for name in s:
        got = g[name][0] if isinstance(g[name], list) else g[name]
        want = s[name][0] if isinstance(s[name], list) else s[name]
        assert_close(got, want, 1e-5, f"capture of {name}")


def test_gguf_model_takes_edits():
    ref = load_file(str(DATA.parent / "gguf" / "llama-tiny.logits.safetensors"))
    ids = ref["input_ids"]
    outs = []
    for path in (GGUF, FOLDER):
        model = flexmodel.from_pretrained(path)
        out = {}
        fm = flexmodel.FlexModel(model, out)
        fm.register_forward_hook(flexmodel.HookFunction(
            "model.layers.0.mlp", expected_shape=(1, ids.shape[1], 32), editing_function=lambda m, x, *a: x * 0.5))
        with torch.no_grad():
            outs.append(fm(ids))
    assert (outs[0] - ref["logits"]).abs().max() > 1e-3  # the edit changed the logits
    assert_close(outs[0], outs[1], 1e-5, "edited GGUF model vs edited safetensors model")


def test_gguf_model_errors_are_typed():
    try:
        flexmodel.from_pretrained(GGUF, device_map="auto")
    except flexmodel.Error as e:
        assert "device maps" in str(e) and str(GGUF) in str(e)
    else:
        raise AssertionError("no error for device_map on a GGUF file")


def test_quantized_gguf_hooks_and_fast_activations():
    """llama-mixed.gguf's layers compute on their blocks: captures from Python
    equal Transformers' logits on gguf-py's weights, fast_activations stays
    within its documented error, and a safetensors folder refuses the option."""
    mixed = DATA.parent / "gguf" / "llama-mixed.gguf"
    ref = load_file(str(DATA.parent / "gguf" / "llama-mixed.logits.safetensors"))
    ids, want = ref["decode_input_ids"], ref["decode_logits"]
    logits, caps = captures(flexmodel.from_pretrained(mixed), ids)
    assert_close(logits, want, 2e-5 * want.abs().max().item(), "quantized GGUF logits vs Transformers'")
    assert "model.layers.0.self_attn.q_proj" in caps and "lm_head" in caps, sorted(caps)
    fast, _ = captures(flexmodel.from_pretrained(mixed, fast_activations=True), ids)
    err = (fast - want).abs().max().item() / want.abs().max().item()
    assert 0 < err < 3e-2, err
    try:
        flexmodel.from_pretrained(FOLDER, fast_activations=True)
    except flexmodel.ConfigError as e:
        assert "GGUF" in str(e)
    else:
        raise AssertionError("no error for fast_activations on a safetensors folder")


def test_text_corpus_is_tokenized_with_the_gguf_vocabulary(tmp_path):
    # llama-bpe-tiny-q8_0.gguf has no tokenizer.json: capture_dataset tokenizes with the
    # vocabulary in its metadata, giving the `tokenizers` package's ids (make_gguf.py).
    import json
    model_path = DATA.parent / "gguf" / "llama-bpe-tiny-q8_0.gguf"
    expected = json.loads((DATA.parent / "gguf" / "llama-bpe-tiny-q8_0.expected.json").read_text(encoding="utf-8"))
    want = expected["prompt_ids"]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(expected["prompt"] + "\n", encoding="utf-8")
    model = flexmodel.from_pretrained(model_path)
    result = flexmodel.capture_dataset(model, corpus, tmp_path / "acts", ["model.layers.1"], context_len=len(want),
                                       batch_size=1)
    assert result["tokens_stored"] == len(want) and result["tokens_dropped"] == 0, result
    batch = next(iter(flexmodel.ActivationDataset(tmp_path / "acts").loader(batch_tokens=len(want))))
    assert batch["token_ids"].flatten().tolist() == want


def test_quantize_head_q8_0_keeps_the_head_hooked_and_near_float():
    """from_pretrained(..., quantize_head="q8_0") on a safetensors folder: the head stays
    lm_head (captured by its hook), its logits stay near the float head's with the same
    greedy tokens (tests/quant/test_quantize_head.cpp checks them against a float64
    product); an unknown format is a ConfigError naming the option and the allowed formats."""
    ids = load_file(str(DATA.parent / "gguf" / "llama-tiny.logits.safetensors"))["input_ids"]
    f_logits, f = captures(flexmodel.from_pretrained(FOLDER), ids)
    q_model = flexmodel.from_pretrained(FOLDER, quantize_head="q8_0")
    q_logits, q = captures(q_model, ids)
    assert "lm_head" in q and "model.norm" in q
    assert_near_float(q_logits, f_logits, "q8_0 head")
    assert_unknown_format_refused("quantize_head")


def assert_near_float(q_logits, f_logits, what):
    """Logits within 2e-2 of the float model's largest, the same greedy tokens."""
    rel = ((q_logits - f_logits).abs().max() / f_logits.abs().max()).item()
    print(f"llama-tiny {what}: max|logits - float| / max|float logits| {rel:.2e}")
    assert rel < 2e-2, rel
    assert torch.equal(q_logits.argmax(-1), f_logits.argmax(-1))


def assert_unknown_format_refused(option):
    """from_pretrained(..., option="q4_k"): a ConfigError naming the CLI flag and the allowed formats."""
    try:
        flexmodel.from_pretrained(FOLDER, **{option: "q4_k"})
    except flexmodel.errors.ConfigError as e:
        assert "--" + option.replace("_", "-") in str(e) and "none, int8, nf4, q8_0, q6_k" in str(e), str(e)
    else:
        raise AssertionError(f"no error for {option}='q4_k'")


def test_quantize_embeddings_keep_the_embedding_hooked_and_float_weight_dequantizes():
    """from_pretrained(..., quantize_embeddings="q8_0") on a safetensors folder: the embedding
    keeps its name and hook, its weight is the stored bytes and float_weight() the table, whose
    rows the embedding's capture holds bit for bit; a GGUF's Q8_0 token_embd is kept the same way
    without the option; an unknown format is a ConfigError naming the option
    (tests/quant/test_quantize_embeddings.cpp measures the error)."""
    ids = load_file(str(DATA.parent / "gguf" / "llama-tiny.logits.safetensors"))["input_ids"]
    float_model = flexmodel.from_pretrained(FOLDER)
    f_logits, f = captures(float_model, ids)
    float_table = dict(float_model.named_parameters())["model.embed_tokens.weight"]
    for source, options in ((FOLDER, {"quantize_embeddings": "q8_0"}),
                            (DATA.parent / "gguf" / "llama-tiny-q8_0.gguf", {})):
        model = flexmodel.from_pretrained(source, **options)
        q_logits, q = captures(model, ids)
        embed = model.get_submodule("model.embed_tokens")
        weight = dict(model.named_parameters())["model.embed_tokens.weight"]
        assert weight.dtype == torch.uint8, weight.dtype
        table = embed.float_weight()
        assert table.dtype == torch.float32 and table.shape == float_table.shape, table.shape
        assert (table - float_table).abs().max() <= float_table.abs().max() * 6e-3
        assert torch.equal(q["model.embed_tokens"], table[ids]), source
        if source == FOLDER:
            assert_near_float(q_logits, f_logits, "q8_0 embeddings")
    assert_unknown_format_refused("quantize_embeddings")


ARCHS = {"gemma3": "model.layers.5.self_attn", "olmo2": "model.layers.1.post_feedforward_layernorm",
         "gpt2": "transformer.h.1.mlp", "gptneox": "gpt_neox.layers.1.attention", "qwen2moe": "model.layers.1.mlp",
         "qwen3moe": "model.layers.1.mlp", "deepseek2": "model.layers.1.self_attn", "deepseek2-v3": "model.layers.1.mlp"}


def test_gguf_architectures_through_python():
    """Each llama.cpp architecture beyond the first five (make_gguf_archs.py): FlexModel's
    capture of one module and the logits equal Transformers' on gguf-py's weights."""
    for arch, module in ARCHS.items():
        ref = load_file(str(DATA.parent / "gguf" / f"{arch}-tiny-q8_0.logits.safetensors"))
        out = {}
        fm = flexmodel.FlexModel(flexmodel.from_pretrained(DATA.parent / "gguf" / f"{arch}-tiny-q8_0.gguf"), out)
        fm.register_forward_hook(flexmodel.HookFunction(module, expected_shape=tuple(ref["capture"].shape)))
        with torch.no_grad():
            logits = fm(ref["input_ids"])
        assert_close(logits, ref["logits"], 1e-5, f"{arch} logits")
        got = out[module][0] if isinstance(out[module], list) else out[module]
        assert_close(got, ref["capture"], 1e-5, f"{arch} capture of {module}")
