"""Golden data from Transformers 5.23 for the architectures flexmodel supports.

Run:  $(bash scripts/golden/setup.sh) scripts/golden/make_golden5.py [OUT]
      (OUT defaults to tests/data/golden5)

For each case: a tiny random model of that architecture, written by
Transformers 5.23's save_pretrained (so its config.json is in the 5.x form:
rope_theta and rope scaling inside "rope_parameters", "dtype"), and what
Transformers computes on a fixed batch whose second row is left-padded:
the logits and the output of every block and of the final norm (the modules
whose names are the same in flexmodel, Transformers 4.47 and 5.23; 5.x
renames or fuses others, e.g. the experts). Each case exercises what is
special about its architecture: inputs longer than the sliding windows,
RoPE scaling, partial rotary, soft-caps, several experts per token.

Writes OUT/<case>/{config.json, model.safetensors} and
OUT/<case>.golden.safetensors (input_ids, attention_mask, logits,
"out.<module>") and OUT/manifest.json (versions, what was captured).
Single-threaded and seeded: the same files on every run.
"""
import json
import os
import sys

import torch
import transformers as T
import accelerate
from safetensors.torch import save_file

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden5")
torch.set_num_threads(1)

VOCAB = 96
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)


def cases():
    """(name, config) pairs; every config is built by Transformers itself."""
    yield "gpt2", T.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=64)
    yield "gpt_neox", T.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, max_position_embeddings=64,
                                      rope_parameters={"rope_type": "default", "rope_theta": 20000.0,
                                                       "partial_rotary_factor": 0.5})
    yield "llama", T.LlamaConfig(**{**SMALL, "tie_word_embeddings": True},
                                 rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                                  "rope_theta": 500000.0})
    yield "mistral", T.MistralConfig(**SMALL, sliding_window=5)
    yield "qwen2", T.Qwen2Config(**SMALL)
    yield "qwen3", T.Qwen3Config(**SMALL, head_dim=8)
    yield "gemma2", T.Gemma2Config(**SMALL, head_dim=8, sliding_window=5, query_pre_attn_scalar=24,
                                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0)
    yield "phi3", T.Phi3Config(**SMALL, pad_token_id=0)
    yield "olmo2", T.Olmo2Config(**SMALL)
    yield "mixtral", T.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    yield "qwen2_moe", T.Qwen2MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                        shared_expert_intermediate_size=24, decoder_sparse_step=1,
                                        mlp_only_layers=[1], norm_topk_prob=False)
    # layer_types overriding Gemma 2's every-other-layer pattern.
    yield "gemma2_layer_types", T.Gemma2Config(**SMALL, head_dim=8, sliding_window=5, query_pre_attn_scalar=24,
                                               layer_types=["full_attention", "sliding_attention", "sliding_attention"])


def batch():
    """Two rows of 12 tokens, the second left-padded by 3."""
    g = torch.Generator().manual_seed(20261124)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    return ids, mask


def captured_names(model):
    """Every block and the final norm, by the names all three agree on."""
    base = model.base_model_prefix
    inner = getattr(model, base)
    blocks = "h" if hasattr(inner, "h") else "layers"
    norm = next(n for n in ("ln_f", "final_layer_norm", "norm") if hasattr(inner, n))
    n_layers = len(getattr(inner, blocks))
    return [f"{base}.{blocks}.{i}" for i in range(n_layers)] + [f"{base}.{norm}"]


def main():
    os.makedirs(OUT, exist_ok=True)
    ids, mask = batch()
    manifest = {"transformers": T.__version__, "torch": torch.__version__, "accelerate": accelerate.__version__,
                "attn_implementation": "eager", "dtype": "float32", "mode": "eval(), torch.no_grad()",
                "forward_call": "model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)",
                "compare": "logits and outputs at positions where attention_mask is 1", "cases": {}}
    for i, (name, cfg) in enumerate(cases()):
        torch.manual_seed(1000 + i)
        cfg._attn_implementation = "eager"
        model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
        with torch.no_grad():  # random weights well away from zero-initialised norms
            for pname, p in model.named_parameters():
                if p.dim() == 1:
                    p.add_(torch.randn_like(p) * 0.1)
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder, safe_serialization=True)
        for extra in ("generation_config.json",):
            path = os.path.join(folder, extra)
            if os.path.exists(path):
                os.remove(path)
        outputs = {}
        names = captured_names(model)
        handles = []
        for n in names:
            def hook(_m, _inp, out, n=n):
                outputs[n] = (out[0] if isinstance(out, tuple) else out).detach().clone()
            handles.append(model.get_submodule(n).register_forward_hook(hook))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        for h in handles:
            h.remove()
        tensors = {"input_ids": ids, "attention_mask": mask, "logits": logits.contiguous()}
        tensors.update({"out." + n: t.contiguous() for n, t in outputs.items()})
        save_file(tensors, os.path.join(OUT, name + ".golden.safetensors"), metadata={"format": "pt"})
        manifest["cases"][name] = {"class": type(model).__name__, "captured": names}
        print(f"{name}: {type(model).__name__}, {len(names)} modules captured")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
