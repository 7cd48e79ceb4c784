"""RoPE scaling in GGUF files as llama.cpp's convert_hf_to_gguf.py writes it
(written by make_gguf.py after its other files, or alone: they are
independent of the others), each a random tiny model in F32 with Transformers
5.23's logits for 24 token ids, beyond the 16 positions of the original
context, so the scaled frequencies matter:

  llama3-rope-tiny.gguf     Llama with Llama 3's rope_scaling (factor 8, low/high
                            frequency factors 1 / 4, original context 16): the
                            converter writes no scaling keys but a rope_freqs
                            tensor, each frequency's divisor (Transformers'
                            default frequencies over its llama3 frequencies)
  qwen2-yarn-tiny.gguf      Qwen2 with YaRN (factor 4 over 16 positions):
                            rope.scaling.type yarn, factor, original_context_length
  phi3-longrope-tiny.gguf   Phi-3 with longrope (short/long factors, 16 of 64
                            positions): rope_factors_short / _long tensors,
                            rope.scaling.attn_factor and original_context_length;
                            its logits file also holds a 10-token forward
                            (input_ids_short / logits_short: the short factors)

    <name>.logits.safetensors   input_ids, logits (Transformers on the model's own weights),
                                logits_unscaled (the same weights, default RoPE)
"""

import math
import os

import numpy as np
import torch
from safetensors.numpy import save_file

from make_gguf import OUT, randomize, write_llama_gguf

IDS = [1, 7, 19, 42, 3, 63, 0, 25, 11, 8, 50, 33, 2, 61, 17, 40, 9, 28, 55, 4, 36, 12, 47, 21]


def default_inv_freq(base, dim):
    """Transformers' unscaled frequencies, in its float32 order of operations."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))


def save_logits(model, name, short=None):
    """Transformers' logits, and (logits_unscaled) those of the same weights with default RoPE."""
    ids = torch.tensor([IDS])
    out = {"input_ids": ids.numpy()}
    cfg = model.config.to_dict()
    theta = cfg["rope_parameters"]["rope_theta"]
    plain = type(model)(type(model.config)(**{**cfg, "rope_parameters": {"rope_type": "default", "rope_theta": theta}}))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        out["logits"] = model(ids).logits.float().numpy()
        out["logits_unscaled"] = plain.eval()(ids).logits.float().numpy()
        if short is not None:
            s = ids[:, :short]
            out["input_ids_short"] = s.numpy()
            out["logits_short"] = model(s).logits.float().numpy()
    save_file(out, os.path.join(OUT, f"{name}.logits.safetensors"))


def write_llama3():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(60)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16})
    model = randomize(LlamaForCausalLM(cfg)).eval()
    dim = cfg.hidden_size // cfg.num_attention_heads
    scaled = model.model.rotary_emb.inv_freq.double()
    factors = (default_inv_freq(50000.0, dim).double() / scaled).float().numpy()
    assert factors.min() < 2 and factors.max() == 8.0  # one smoothed, the rest slowed eightfold
    write_llama_gguf(os.path.join(OUT, "llama3-rope-tiny.gguf"), cfg, model, quantize=False,
                     extra=lambda w: w.add_tensor("rope_freqs.weight", np.ascontiguousarray(factors)))
    save_logits(model, "llama3-rope-tiny")


def write_qwen2_yarn():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(61)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 16})
    model = randomize(Qwen2ForCausalLM(cfg)).eval()
    assert model.model.rotary_emb.attention_scaling > 1.1  # 0.1 ln 4 + 1

    def extra(w):
        w.add_rope_scaling_type(gguf_rope_type("yarn"))
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(16)

    write_llama_gguf(os.path.join(OUT, "qwen2-yarn-tiny.gguf"), cfg, model, quantize=False, arch="qwen2", extra=extra)
    save_logits(model, "qwen2-yarn-tiny")


def write_phi3_longrope():
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(62)
    half = 64 // 4 // 2
    short = [1.0 + 0.05 * i for i in range(half)]
    long = [1.0 + 0.75 * i for i in range(half)]
    cfg = Phi3Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=16,
                     rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short,
                                      "long_factor": long},
                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = randomize(Phi3ForCausalLM(cfg)).eval()
    attn = math.sqrt(1 + math.log(64 / 16) / math.log(16))  # what the converter computes and writes
    assert abs(model.model.rotary_emb.attention_scaling - attn) < 1e-12

    def extra(w):
        w.add_rope_scaling_attn_factors(attn)
        w.add_rope_scaling_orig_ctx_len(16)
        w.add_tensor("rope_factors_long.weight", np.asarray(long, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(short, dtype=np.float32))

    write_llama_gguf(os.path.join(OUT, "phi3-longrope-tiny.gguf"), cfg, model, quantize=False, arch="phi3",
                     extra=extra)
    save_logits(model, "phi3-longrope-tiny", short=10)


def gguf_rope_type(name):
    import gguf
    return gguf.RopeScalingType(name)


def main():
    write_llama3()
    write_qwen2_yarn()
    write_phi3_longrope()


if __name__ == "__main__":
    main()
