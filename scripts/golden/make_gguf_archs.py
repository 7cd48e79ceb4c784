"""The GGUF architectures beyond the Llama family's first five (issue 52),
written by make_gguf.py after its other files (so those stay byte-identical):
a random tiny model of each, laid out as llama.cpp's convert_hf_to_gguf.py
lays it out (tensor names, metadata keys, the tensor rewrites its model
classes make), matrices Q8_0 (gguf-py's quantizer) where rows are whole
32-blocks, the rest F32. For each, <arch>-tiny-q8_0.logits.safetensors holds
Transformers 5.23's logits on the weights gguf-py dequantizes from the file
(undoing the converter's rewrites), and "capture": the output of one module
(CAPTURED below) in that forward, taken by a PyTorch forward hook.

  gemma3    Gemma 3 text: q/k norms, every norm stored as 1 + w, 6 layers so
            that layer 5 attends globally (llama.cpp's pattern of 6), window 4
  olmo2     OLMo 2: post-norms only, q/k norms over the whole projections
  gpt2      GPT-2: Conv1D weights transposed to [out, in], position_embd, the
            tied head written again as output.weight (as the converter does)
  gptneox   GPT-NeoX: each head's q | k | v rows regrouped as all q | all k | all v
            (the converter's bloom-to-gpt reordering), partial rotary (half)
  qwen2moe  Qwen2-MoE: experts stacked into 3-D ffn_{gate,up,down}_exps
            [experts, rows, cols], router ffn_gate_inp and the shared expert's
            gate ffn_gate_inp_shexp kept F32 (as the converter keeps them)
  qwen3moe  Qwen3-MoE: the same without shared expert, q/k norms, normalised top-k
  deepseek2 DeepSeek-V2: latent attention (q-LoRA), kv_b_proj split per head into
            attn_k_b (transposed) and attn_v_b as the converter splits it,
            head_count_kv 1, a dense first layer, greedy softmax routing scaled;
            deepseek2-v3: DeepSeek-V3 written under that arch (sigmoid gating,
            exp_probs_b score correction, expert groups, renormalised weights,
            YaRN x4 over 16 positions with mscale 0.707 as DeepSeek's configs have)
and fuzz/corpus/gguf/experts.gguf, a seed for fuzz_gguf with a 3-D Q8_0 tensor.
"""

import os

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

from make_gguf import OUT, ROOT, add_decoder_hparams, add_placeholder_vocab, randomize, write_and_close

IDS = [[1, 7, 19, 42, 3, 63, 0, 25, 11, 8]]  # longer than the window of 4

# The module whose output each golden file also records (same name in flexmodel).
CAPTURED = {"gemma3": "model.layers.5.self_attn", "olmo2": "model.layers.1.post_feedforward_layernorm",
            "gpt2": "transformer.h.1.mlp", "gptneox": "gpt_neox.layers.1.attention",
            "qwen2moe": "model.layers.1.mlp", "qwen3moe": "model.layers.1.mlp",
            "deepseek2": "model.layers.1.self_attn", "deepseek2-v3": "model.layers.1.mlp"}

# Tensors llama.cpp's converter keeps in F32 whatever the file type (routers).
KEEP_F32 = ("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")

# Transformers' per-block names -> llama.cpp's, for the decoder architectures here.
DECODER_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
                 "mlp.gate": "ffn_gate_inp", "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
                 "mlp.shared_expert.up_proj": "ffn_up_shexp", "mlp.shared_expert.down_proj": "ffn_down_shexp",
                 "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
GEMMA_BLOCK = {**DECODER_BLOCK, "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
OLMO2_BLOCK = {**DECODER_BLOCK, "post_attention_layernorm": "post_attention_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}
GPT2_NAMES = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
              "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
NEOX_NAMES = {"input_layernorm": "attn_norm", "attention.query_key_value": "attn_qkv",
              "attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}


def neox_qkv_to_gguf(x, n_head):
    """Rows [head][q|k|v][d] -> [q|k|v][head][d] (weights [3E, E] or biases [3E])."""
    return x.reshape(n_head, 3, -1, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)


def neox_qkv_from_gguf(x, n_head):
    return x.reshape(3, n_head, -1, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)


def decoder_tensors(model, block, norms_plus_one=False, tied=False):
    """(gguf name, llama.cpp layout, inverse) for a Llama-family model; experts of
    Transformers 5's fused gate_up_proj / down_proj become 3-D ffn_*_exps."""
    out = []
    for name, t in model.state_dict().items():
        x = np.ascontiguousarray(t.float().numpy())
        parts = name.split(".")
        ident = lambda d: d
        if name == "lm_head.weight":
            if not tied:
                out.append(("output.weight", x, {name: ident}))
            continue
        if parts[1] != "layers":
            g = {"embed_tokens": "token_embd", "norm": "output_norm"}[parts[1]] + ".weight"
        else:
            sub, bid = ".".join(parts[3:-1]), parts[2]
            if sub == "mlp.experts":  # fused experts (Transformers 5)
                if parts[-1] == "gate_up_proj":
                    ff = x.shape[1] // 2
                    gate = f"blk.{bid}.ffn_gate_exps.weight"
                    out.append((gate, np.ascontiguousarray(x[:, :ff]), None))
                    out.append((f"blk.{bid}.ffn_up_exps.weight", np.ascontiguousarray(x[:, ff:]), {name: ("cat", gate)}))
                else:
                    out.append((f"blk.{bid}.ffn_down_exps.weight", x, {name: ident}))
                continue
            g = f"blk.{bid}.{block[sub]}.{parts[-1]}"
        if norms_plus_one and name.endswith("norm.weight"):
            out.append((g, (x + np.float32(1.0)).astype(np.float32), {name: lambda d: (d - np.float32(1.0)).astype(np.float32)}))
        else:
            out.append((g, x, {name: ident}))
    return out


def write_file(path, arch, hparams, tensors):
    """Writes the tensors (Q8_0 where rows are whole blocks) after `hparams(w)`;
    returns Transformers' state dict from what gguf-py dequantizes."""
    w = gguf.GGUFWriter(path, arch)
    hparams(w)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    add_placeholder_vocab(w, next(x.shape[0] for g, x, _ in tensors if g == "token_embd.weight"))
    read = {}
    for g, x, _ in tensors:
        if x.ndim >= 2 and x.shape[-1] % 32 == 0 and not g.endswith(KEEP_F32):
            q = gguf.quants.quantize(x, T.Q8_0)
            w.add_tensor(g, q, raw_dtype=T.Q8_0)
            read[g] = gguf.quants.dequantize(q, T.Q8_0).reshape(x.shape)
        else:
            w.add_tensor(g, x)
            read[g] = x
    write_and_close(w)
    back = {}
    for g, _, inverse in tensors:
        for name, f in (inverse or {}).items():
            if isinstance(f, tuple) and f[0] == "cat":  # gate | up rows of fused experts
                back[name] = np.concatenate([read[f[1]], read[g]], axis=1)
            elif isinstance(f, tuple) and f[0] == "kv_b":  # DeepSeek's kv_b_proj from k_b (transposed) and v_b
                k_b, v_b = read[f[1]], read[g]
                kv = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
                back[name] = np.ascontiguousarray(kv.reshape(-1, kv.shape[-1]))
            else:
                back[name] = np.ascontiguousarray(f(read[g]))
    return back


def golden(arch, model_class, cfg, back, tied):
    """Transformers' logits (and CAPTURED's output) on the weights read back."""
    import torch
    q = model_class(cfg).eval()
    missing, unexpected = q.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if tied else set()), (missing, unexpected)
    if tied:
        q.tie_weights()
    seen = {}
    module = q.get_submodule(CAPTURED[arch])
    def keep(m, i, o):  # returns None: the output is left as it is
        seen["out"] = o[0] if isinstance(o, tuple) else o
    h = module.register_forward_hook(keep)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        logits = q(ids).logits.float()
    h.remove()
    assert torch.isfinite(logits).all()
    save_file({"input_ids": ids.numpy(), "logits": logits.numpy(), "capture": seen["out"].float().contiguous().numpy()},
              os.path.join(OUT, f"{arch}-tiny-q8_0.logits.safetensors"), metadata={"capture": CAPTURED[arch]})


def decoder_hparams(cfg, arch_extra=None, head_dim=None, rope_base=None):
    def h(w):
        add_decoder_hparams(w, f"{w.arch}-tiny", cfg,
                            rope_base if rope_base is not None else cfg.rope_parameters["rope_theta"])
        if head_dim:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        if arch_extra:
            arch_extra(w)
    return h


def write_gemma3():
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    torch.manual_seed(60)
    cfg = Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, rms_norm_eps=1e-6,
                           sliding_window=4, max_position_embeddings=64, tie_word_embeddings=True,
                           bos_token_id=1, eos_token_id=2, pad_token_id=0)
    assert cfg.layer_types[5] == "full_attention" and cfg.layer_types[4] == "sliding_attention"
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0  # llama.cpp's fixed local base
    model = randomize(Gemma3ForCausalLM(cfg), 60)
    tensors = decoder_tensors(model, GEMMA_BLOCK, norms_plus_one=True, tied=True)
    hp = decoder_hparams(cfg, lambda w: w.add_sliding_window(cfg.sliding_window), head_dim=cfg.head_dim,
                         rope_base=cfg.rope_parameters["full_attention"]["rope_theta"])
    back = write_file(os.path.join(OUT, "gemma3-tiny-q8_0.gguf"), "gemma3", hp, tensors)
    golden("gemma3", Gemma3ForCausalLM, cfg, back, tied=True)


def write_olmo2():
    from transformers import Olmo2Config, Olmo2ForCausalLM
    cfg = Olmo2Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = randomize(Olmo2ForCausalLM(cfg), 61)
    back = write_file(os.path.join(OUT, "olmo2-tiny-q8_0.gguf"), "olmo2", decoder_hparams(cfg),
                      decoder_tensors(model, OLMO2_BLOCK))
    golden("olmo2", Olmo2ForCausalLM, cfg, back, tied=False)


def write_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=64, n_embd=64, n_layer=2, n_head=4, n_positions=64, layer_norm_epsilon=1e-5,
                     bos_token_id=1, eos_token_id=2)
    model = randomize(GPT2LMHeadModel(cfg), 62)
    tensors = []
    for name, t in model.state_dict().items():
        x = np.ascontiguousarray(t.float().numpy())
        parts = name.split(".")
        if name == "lm_head.weight":
            continue  # tied: written below as output.weight, a copy of token_embd
        if parts[1] in ("wte", "wpe", "ln_f"):
            g = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm"}[parts[1]] + "." + parts[-1]
            tensors.append((g, x, {name: lambda d: d}))
            if parts[1] == "wte":
                tensors.append(("output.weight", x.copy(), None))
            continue
        sub = ".".join(parts[3:-1])
        g = f"blk.{parts[2]}.{GPT2_NAMES[sub]}.{parts[-1]}"
        if parts[-1] == "weight" and x.ndim == 2:  # Conv1D [in, out] -> [out, in]
            tensors.append((g, np.ascontiguousarray(x.T), {name: lambda d: np.ascontiguousarray(d.T)}))
        else:
            tensors.append((g, x, {name: lambda d: d}))

    def hp(w):
        w.add_name("gpt2-tiny")
        w.add_block_count(cfg.n_layer)
        w.add_context_length(cfg.n_positions)
        w.add_embedding_length(cfg.n_embd)
        w.add_feed_forward_length(4 * cfg.n_embd)
        w.add_head_count(cfg.n_head)
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    back = write_file(os.path.join(OUT, "gpt2-tiny-q8_0.gguf"), "gpt2", hp, tensors)
    golden("gpt2", GPT2LMHeadModel, cfg, back, tied=True)


def write_gptneox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        rotary_pct=0.5, max_position_embeddings=64, layer_norm_eps=1e-5, use_parallel_residual=True,
                        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    assert cfg.rope_parameters["rope_theta"] == 10000.0  # llama.cpp's default: the converter writes no base
    model = randomize(GPTNeoXForCausalLM(cfg), 63)
    heads = cfg.num_attention_heads
    tensors = []
    for name, t in model.state_dict().items():
        x = np.ascontiguousarray(t.float().numpy())
        parts = name.split(".")
        if name == "lm_head.weight":
            tensors.append(("output.weight", x, {name: lambda d: d}))
            continue
        if parts[1] in ("embed_in", "final_layer_norm"):
            g = {"embed_in": "token_embd", "final_layer_norm": "output_norm"}[parts[1]] + "." + parts[-1]
            tensors.append((g, x, {name: lambda d: d}))
            continue
        sub = ".".join(parts[3:-1])
        g = f"blk.{parts[2]}.{NEOX_NAMES[sub]}.{parts[-1]}"
        if sub == "attention.query_key_value":
            y = np.ascontiguousarray(neox_qkv_to_gguf(x, heads))
            assert np.array_equal(neox_qkv_from_gguf(y, heads), x)
            tensors.append((g, y, {name: lambda d: np.ascontiguousarray(neox_qkv_from_gguf(d, heads))}))
        else:
            tensors.append((g, x, {name: lambda d: d}))

    def hp(w):
        w.add_name("gptneox-tiny")
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_rope_dimension_count(int(0.5 * (cfg.hidden_size // heads)))
        w.add_head_count(heads)
        w.add_parallel_residual(cfg.use_parallel_residual)
        w.add_layer_norm_eps(cfg.layer_norm_eps)
    back = write_file(os.path.join(OUT, "gptneox-tiny-q8_0.gguf"), "gptneox", hp, tensors)
    golden("gptneox", GPTNeoXForCausalLM, cfg, back, tied=False)


def moe_extra(cfg, shared):
    def h(w):
        w.add_vocab_size(cfg.vocab_size)
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if shared:
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    return h


def write_qwen_moes():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen2MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                         shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                         max_position_embeddings=64, tie_word_embeddings=False, norm_topk_prob=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = randomize(Qwen2MoeForCausalLM(cfg), 64)
    back = write_file(os.path.join(OUT, "qwen2moe-tiny-q8_0.gguf"), "qwen2moe",
                      decoder_hparams(cfg, moe_extra(cfg, True)), decoder_tensors(model, DECODER_BLOCK))
    golden("qwen2moe", Qwen2MoeForCausalLM, cfg, back, tied=False)

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
                         norm_topk_prob=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = randomize(Qwen3MoeForCausalLM(cfg), 65)
    back = write_file(os.path.join(OUT, "qwen3moe-tiny-q8_0.gguf"), "qwen3moe",
                      decoder_hparams(cfg, moe_extra(cfg, False), head_dim=cfg.head_dim),
                      decoder_tensors(model, DECODER_BLOCK))
    golden("qwen3moe", Qwen3MoeForCausalLM, cfg, back, tied=False)


DEEPSEEK_BLOCK = {**DECODER_BLOCK, "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
                  "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
                  "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.kv_b_proj": "attn_kv_b",
                  "mlp.shared_experts.gate_proj": "ffn_gate_shexp", "mlp.shared_experts.up_proj": "ffn_up_shexp",
                  "mlp.shared_experts.down_proj": "ffn_down_shexp"}


def write_deepseek2(v3=False):
    """DeepSeek-V2 (greedy softmax routing, q-LoRA, one dense layer then MoE): the
    converter splits kv_b_proj per head into attn_k_b (transposed: [heads,
    kv_lora, nope]) and attn_v_b ([heads, v, kv_lora]) and writes head_count_kv 1.
    v3: DeepSeek-V3 under the same arch name: sigmoid gating with the score
    correction exp_probs_b, groups (2, 1 used), renormalised weights * 2.5."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                  num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
                  n_shared_experts=1, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
                  q_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32, rms_norm_eps=1e-6,
                  max_position_embeddings=64, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if v3:
        model_class, stem = DeepseekV3ForCausalLM, "deepseek2-v3"
        yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
        cfg = DeepseekV3Config(**{**common, "rope_parameters": yarn}, n_group=2, topk_group=1,
                               routed_scaling_factor=2.5, norm_topk_prob=True)
        assert cfg.rope_interleave  # Transformers' V3 rotates interleaved pairs, as llama.cpp's deepseek2 does
    else:
        model_class, stem = DeepseekV2ForCausalLM, "deepseek2"
        cfg = DeepseekV2Config(**common, topk_method="greedy", routed_scaling_factor=1.5, norm_topk_prob=False)
    model = randomize(model_class(cfg), 68 if v3 else 66)
    if v3:  # the score correction is a buffer: make it matter
        with torch.no_grad():
            model.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    heads, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
    tensors = []
    for g, x, inverse in decoder_tensors(model, DEEPSEEK_BLOCK):
        if g.endswith("ffn_gate_inp.e_score_correction_bias"):
            g = g.replace("ffn_gate_inp.e_score_correction_bias", "exp_probs_b.bias")
        if not g.endswith("attn_kv_b.weight"):
            tensors.append((g, x, inverse))
            continue
        (name, _), = inverse.items()
        kv = x.reshape(heads, nope + v, x.shape[-1])
        k_name = g.replace("attn_kv_b", "attn_k_b")
        again = np.concatenate([kv[:, :nope], kv[:, nope:]], axis=1).reshape(x.shape)
        assert np.array_equal(again, x)  # the split is the inverse of the loader's join
        tensors.append((k_name, np.ascontiguousarray(kv[:, :nope].transpose(0, 2, 1)), None))
        tensors.append((g.replace("attn_kv_b", "attn_v_b"), np.ascontiguousarray(kv[:, nope:]), {name: ("kv_b", k_name)}))

    def extra(w):
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_leading_dense_block_count(cfg.first_k_dense_replace)
        w.add_vocab_size(cfg.vocab_size)
        w.add_q_lora_rank(cfg.q_lora_rank)
        w.add_kv_lora_rank(cfg.kv_lora_rank)
        w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
        w.add_value_length(cfg.kv_lora_rank)
        w.add_key_length_mla(nope + cfg.qk_rope_head_dim)
        w.add_value_length_mla(v)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_count(cfg.n_routed_experts)
        w.add_expert_shared_count(cfg.n_shared_experts)
        w.add_expert_weights_scale(cfg.routed_scaling_factor)
        w.add_rope_dimension_count(cfg.qk_rope_head_dim)
        if v3:
            w.add_expert_weights_norm(True)
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
            w.add_expert_group_count(cfg.n_group)
            w.add_expert_group_used_count(cfg.topk_group)
            r = cfg.rope_parameters  # what TextModel and DeepseekV2Model write for YaRN
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(r["factor"])
            w.add_rope_scaling_orig_ctx_len(r["original_max_position_embeddings"])
            w.add_rope_scaling_yarn_log_mul(0.1 * r["mscale_all_dim"])

    class MQA:  # what the converter writes: MLA as MQA, one kv head
        def __getattr__(self, k):
            return 1 if k == "num_key_value_heads" else getattr(cfg, k)
    back = write_file(os.path.join(OUT, f"{stem}-tiny-q8_0.gguf"), "deepseek2", decoder_hparams(MQA(), extra), tensors)
    golden(stem, model_class, cfg, back, tied=False)


def write_fuzz_seed():
    """fuzz/corpus/gguf/experts.gguf: qwen2moe metadata and a stacked [experts, rows, cols] Q8_0 tensor."""
    rng = np.random.default_rng(67)
    w = gguf.GGUFWriter(os.path.join(ROOT, "fuzz", "corpus", "gguf", "experts.gguf"), "qwen2moe")
    w.add_block_count(1)
    w.add_expert_count(2)
    w.add_expert_used_count(1)
    w.add_tensor("blk.0.ffn_gate_exps.weight",
                 gguf.quants.quantize(rng.standard_normal((2, 2, 32)).astype(np.float32), T.Q8_0), raw_dtype=T.Q8_0)
    w.add_tensor("blk.0.ffn_gate_inp.weight", rng.standard_normal((2, 32)).astype(np.float32))
    write_and_close(w)


def main():
    write_gemma3()
    write_olmo2()
    write_gpt2()
    write_gptneox()
    write_qwen_moes()
    write_deepseek2()
    write_deepseek2(v3=True)
    write_fuzz_seed()


if __name__ == "__main__":
    main()
