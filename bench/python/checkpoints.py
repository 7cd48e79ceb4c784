"""The bench's random-weight checkpoints, written once with Transformers' save_pretrained.

GPT-2 small's shape (12 x 768, 12 heads, vocab 50257, n_positions 1024) and a
Llama of about the same size with grouped-query attention (12 x 768, MLP 2048,
12 query / 4 key-value heads, vocab 32000): ~124M and ~125M parameters, fp32
safetensors, ~0.5 GB each. Random weights are enough: every tool does the same
arithmetic whatever the values, and the bench checks that they agree. A third,
GPT-2's tree at width 64, is only for timing a Python editing function's call.

Each folder also gets a word-level tokenizer ("t0", "t1", ...), because nnsight
and TransformerLens build a tokenizer from the model folder even when they are
only ever given token ids.
"""
import os
import pathlib

import torch

MODELS = {
    "gpt2": dict(model_type="gpt2", n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                 activation_function="gelu_new", bos_token_id=0, eos_token_id=0),
    "llama": dict(model_type="llama", num_hidden_layers=12, hidden_size=768, intermediate_size=2048,
                  num_attention_heads=12, num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=0,
                  eos_token_id=0, pad_token_id=0),
    # GPT-2's module tree (12 blocks) at width 64: a forward of ~1 ms, next to which the few us of a Python
    # editing function call per module can be measured on a busy 2-core machine.
    "gpt2-tiny": dict(model_type="gpt2", n_layer=12, n_embd=64, n_head=4, vocab_size=512, n_positions=128,
                      activation_function="gelu_new", bos_token_id=0, eos_token_id=0),
}

# The residual stream after each block: what "the 12 blocks" means throughout the bench.
BLOCK_PREFIX = {"gpt2": "transformer.h", "gpt2-tiny": "transformer.h", "llama": "model.layers"}


def block_names(kind, n_layers=12):
    return [f"{BLOCK_PREFIX[kind]}.{i}" for i in range(n_layers)]


def _tokenizer(vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t0", eos_token="t0", pad_token="t0",
                                   unk_token="t0")


def _write(kind, folder):
    import transformers
    cfg = dict(MODELS[kind])
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp, safe_serialization=True)
    _tokenizer(config.vocab_size).save_pretrained(tmp)
    os.replace(tmp, folder)  # only a complete folder is ever reused


def ensure(cache_dir, kinds):
    """{kind: folder}, writing the checkpoints that are not in cache_dir yet."""
    cache_dir = pathlib.Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind in kinds:
        folder = cache_dir / kind
        if not (folder / "config.json").exists():
            print(f"writing the random {kind} checkpoint to {folder}", flush=True)
            _write(kind, folder)
        out[kind] = folder
    return out
