"""Golden data from Transformers 5.23 for model zoo III: Gemma 3 (text and multimodal),
Qwen3-MoE, gpt-oss (plain and MXFP4), OLMo 3, DeepSeek-V3 (q-LoRA, no q-LoRA, FP8) and
DeepSeek-V2 (greedy and group-limited routing).

Run:  $(bash scripts/golden/setup.sh) scripts/golden/make_golden_zoo3.py [OUT]
      (OUT defaults to tests/data/golden5; the golden5 cases and manifest.json are not touched)

Same conventions as make_golden5.py: a tiny random model per case, built from a
configuration made by Transformers 5.23 itself and written by its save_pretrained (then
converted, where 5.23 does not write what the published checkpoints hold, into their
layout: the MTP layer of DeepSeek-V3, MXFP4 experts, FP8 weights), then loaded back by
5.23's from_pretrained, which makes the golden: eager attention, eager experts, fp32,
use_cache=False, a batch of 2 rows of 20 tokens whose second row is left-padded by 5.

Writes OUT/<case>/{config.json, model.safetensors}, OUT/<case>.golden.safetensors
(input_ids, attention_mask, logits and "out.<module>" for every block, the final norm,
every attention and mlp module, the routers (logits reshaped [B, T, E]), the MLA latent
and gpt-oss's sinks) and OUT/manifest_zoo3.json (versions, per case what was captured,
the checkpoint's key layout against 5.23's in-memory names, routing margins).
Single-threaded and seeded: the same files on every run.
"""
import copy
import glob
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

import torch
import transformers as T
import accelerate
from safetensors import safe_open
from safetensors.torch import load_file, save_file

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden5")
torch.set_num_threads(1)
T.logging.set_verbosity_error()

VOCAB = 96          # token ids of the batch are drawn from [3, VOCAB)
SEQ, PAD = 20, 5    # 2 rows of SEQ tokens, the second left-padded by PAD
MXFP4_QUANT = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                          "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
FP8_QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


# ----------------------------------------------------------------------------- configurations
def gemma3_text_config(vocab=VOCAB):
    return T.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=7, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=24, sliding_window=6, max_position_embeddings=64,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})


def gpt_oss_config():
    return T.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=3, sliding_window=6,
        max_position_embeddings=4096, swiglu_limit=5.0,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 1024, "rope_theta": 150000.0})


def deepseek_v3_config(**over):
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=16,
              num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True,
              first_k_dense_replace=1, kv_lora_rank=24, q_lora_rank=40, qk_nope_head_dim=16, qk_rope_head_dim=8,
              v_head_dim=12, rope_interleave=True, max_position_embeddings=4096,
              rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                               "mscale_all_dim": 0.707, "original_max_position_embeddings": 1024, "rope_theta": 10000.0})
    kw.update(over)
    return T.DeepseekV3Config(**kw)


def deepseek_v2_config(**over):
    kw = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=16,
              num_experts_per_tok=3, topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
              norm_topk_prob=False, first_k_dense_replace=1, kv_lora_rank=24, q_lora_rank=None, qk_nope_head_dim=16,
              qk_rope_head_dim=8, v_head_dim=12, max_position_embeddings=4096,
              rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                               "mscale_all_dim": 0.707, "original_max_position_embeddings": 1024, "rope_theta": 10000.0})
    kw.update(over)
    return T.DeepseekV2Config(**kw)


# Cases whose default seed (3000 + index) gave a near tie in a routing choice (< 1e-4), see routing_margins().
SEEDS = {"deepseek_v2": 3109, "deepseek_v2_group": 3311}


def cases():
    """(name, dict) pairs: "config" built by Transformers; "kind" says how the checkpoint is post-processed."""
    yield "gemma3_text", dict(config=gemma3_text_config())
    yield "gemma3", dict(config=T.Gemma3Config(
        text_config=gemma3_text_config(vocab=100),
        vision_config=T.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=16, patch_size=4, vision_use_head=False),
        mm_tokens_per_image=4, boi_token_index=97, eoi_token_index=98, image_token_index=99), kind="multimodal")
    yield "qwen3_moe", dict(config=T.Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1], max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    yield "gpt_oss", dict(config=gpt_oss_config())
    yield "gpt_oss_mxfp4", dict(config=gpt_oss_config(), kind="mxfp4", weights_of="gpt_oss")
    yield "olmo3", dict(config=T.Olmo3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=6, max_position_embeddings=4096, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                                            "attention_factor": 1.2079441541679836, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "rope_theta": 500000.0}}))
    yield "deepseek_v3", dict(config=deepseek_v3_config(), kind="mtp")
    yield "deepseek_v3_noqlora", dict(config=deepseek_v3_config(q_lora_rank=None, rope_interleave=False), kind="mtp")
    yield "deepseek_v3_fp8", dict(config=deepseek_v3_config(hidden_size=144, intermediate_size=200, num_hidden_layers=2),
                                  kind="fp8")
    yield "deepseek_v2", dict(config=deepseek_v2_config(), seed=SEEDS["deepseek_v2"])
    yield "deepseek_v2_group", dict(config=deepseek_v2_config(
        q_lora_rank=40, topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=2.0),
        seed=SEEDS["deepseek_v2_group"])


# ----------------------------------------------------------------------------- helpers
def batch():
    """Two rows of SEQ tokens, the second left-padded by PAD."""
    g = torch.Generator().manual_seed(20261124)
    ids = torch.randint(3, VOCAB, (2, SEQ), generator=g)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, :PAD] = 0
    ids[1, :PAD] = 0
    return ids, mask


@torch.no_grad()
def randomize(model):
    """Weights that keep activations O(1): every matrix N(0, 1/fan_in), embeddings N(0, 1), vectors
    (norm weights, biases) moved by N(0, 0.1); gpt-oss sinks N(0, 1) and its expert gate_up 3x larger
    (so that the SwiGLU clamp clips), DeepSeek-V3's e_score_correction_bias N(0, 0.3)."""
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if p.dim() == 1:
            if leaf == "sinks":
                p.copy_(torch.randn_like(p))
            elif name.endswith("router.bias"):
                p.copy_(torch.randn_like(p) * 0.5)
            else:
                p.add_(torch.randn_like(p) * 0.1)
        elif p.dim() == 2:
            if "vision_tower" in name:
                continue
            if "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif leaf == "mm_input_projection_weight":
                p.normal_(0.0, p.shape[0] ** -0.5)
            else:
                p.normal_(0.0, p.shape[1] ** -0.5)
        elif p.dim() == 3:  # fused experts: gpt-oss [E, in, out], the others [E, out, in]
            gpt_oss = isinstance(model, T.GptOssForCausalLM)
            fan_in = p.shape[1] if gpt_oss else p.shape[2]
            p.normal_(0.0, fan_in ** -0.5)
            if gpt_oss and leaf == "gate_up_proj":
                p.mul_(3.0)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(torch.randn_like(b) * 0.3)


def tie(model):
    if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        model.tie_weights()


def inner_text_model(model):
    """(prefix, decoder) of the text decoder: "model" or "model.language_model"."""
    if isinstance(model, T.Gemma3ForConditionalGeneration):
        return "model.language_model", model.model.language_model
    return "model", model.model


def capture_plan(model):
    """Module names to hook: blocks + final norm ("captured", as golden5), the attention, mlp and
    router modules of every block, DeepSeek's kv_a_proj_with_mqa; and gpt-oss's sinks (params)."""
    prefix, inner = inner_text_model(model)
    n = len(inner.layers)
    blocks = [f"{prefix}.layers.{i}" for i in range(n)] + [f"{prefix}.norm"]
    sub, routers, params = [], [], []
    for i in range(n):
        layer = inner.layers[i]
        base = f"{prefix}.layers.{i}"
        sub.append(f"{base}.self_attn")
        if hasattr(layer.self_attn, "kv_a_proj_with_mqa"):
            sub.append(f"{base}.self_attn.kv_a_proj_with_mqa")
        sub.append(f"{base}.mlp")
        for r in ("gate", "router"):
            m = getattr(layer.mlp, r, None)
            if isinstance(m, torch.nn.Module) and not isinstance(m, torch.nn.Linear):
                routers.append(f"{base}.mlp.{r}")
        if hasattr(layer.self_attn, "sinks"):
            params.append(f"{base}.self_attn.sinks")
    return blocks, sub, routers, params


@torch.no_grad()
def run(model, ids, mask, names):
    outputs, handles = {}, []
    for n in names:
        def hook(_m, _inp, out, n=n):
            outputs[n] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        handles.append(model.get_submodule(n).register_forward_hook(hook))
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    for h in handles:
        h.remove()
    return logits, outputs


def load(folder, cls=T.AutoModelForCausalLM, experts="eager", **kw):
    model, info = cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                      experts_implementation=experts, output_loading_info=True, **kw)
    return model.eval(), info


def drop_generation_config(folder):
    path = os.path.join(folder, "generation_config.json")
    if os.path.exists(path):
        os.remove(path)


def write_config(folder, cfg_dict):
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")


def read_config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def checkpoint_keys(folder):
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        return {k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()}


# ----------------------------------------------------------------------------- MXFP4
FP4_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4_encode(w):
    """[..., K] (K % 32 == 0) -> blocks [..., K/32, 16] uint8, scales [..., K/32] uint8.
    OCP MX: per 32 values a shared exponent e = floor(log2(amax)) - 2 stored as e + 127, elements
    x / 2^e rounded to the nearest E2M1 value (ties to the smaller magnitude, saturating at 6);
    element 2j in the low nibble, element 2j+1 in the high nibble, sign in bit 3."""
    *pre, k = w.shape
    g = w.reshape(*pre, k // 32, 32)
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 2, torch.full_like(amax, -127.0)).clamp(-127, 127)
    x = g / torch.exp2(e)[..., None]
    code = (x.abs().clamp(max=6.0)[..., None] - FP4_MAGNITUDES).abs().argmin(-1)
    code = code | (((x < 0) & (code > 0)).to(torch.long) << 3)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (e + 127).to(torch.uint8)


def mxfp4_decode(blocks, scales):
    """Inverse layout of mxfp4_encode, in fp32: [..., G, 16] u8, [..., G] u8 -> [..., G * 32]."""
    lut = torch.cat([FP4_MAGNITUDES, -FP4_MAGNITUDES])
    b = blocks.to(torch.long)
    vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = vals * torch.exp2(scales.to(torch.float32) - 127)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def to_mxfp4(folder):
    """Replace gpt-oss's fused expert matrices by the published MXFP4 tensors.
    In memory (and in a plain checkpoint) gate_up_proj is [E, hidden, 2*inter] and down_proj
    [E, inter, hidden] (x @ W); the published blocks hold W^T: gate_up_proj_blocks
    [E, 2*inter, hidden/32, 16], down_proj_blocks [E, hidden, inter/32, 16]."""
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            blocks, scales = mxfp4_encode(v.transpose(1, 2).contiguous())
            out[k + "_blocks"], out[k + "_scales"] = blocks, scales
        else:
            out[k] = v
    save_file(out, path, metadata={"format": "pt"})
    cfg = read_config(folder)
    cfg["quantization_config"] = copy.deepcopy(MXFP4_QUANT)
    write_config(folder, cfg)


# ----------------------------------------------------------------------------- FP8
def fp8_quantize(w, block=128):
    """DeepSeek-V3 block FP8: [out, in] fp32 -> float8_e4m3fn [out, in] and weight_scale_inv
    [ceil(out/128), ceil(in/128)] fp32 with W ~= q * scale_inv[i // 128, j // 128] (edge blocks partial)."""
    o, i = w.shape
    rows, cols = math.ceil(o / block), math.ceil(i / block)
    s = torch.zeros(rows, cols)
    q = torch.zeros(o, i, dtype=torch.float8_e4m3fn)
    for a in range(rows):
        for b in range(cols):
            blk = w[a * block:(a + 1) * block, b * block:(b + 1) * block]
            s[a, b] = blk.abs().max() / 448.0
            q[a * block:(a + 1) * block, b * block:(b + 1) * block] = (blk / s[a, b]).to(torch.float8_e4m3fn)
    return q, s


def fp8_dequantize(q, s, block=128):
    rep = s.repeat_interleave(block, 0)[:q.shape[0]].repeat_interleave(block, 1)[:, :q.shape[1]]
    return q.to(torch.float32) * rep


def fp8_is_quantized(key, n_layers):
    """The matrices DeepSeek-V3 stores in FP8: every Linear of the decoder layers (attention, dense
    MLP, experts, shared experts); not the embeddings, lm_head, norms, router (mlp.gate) or the MTP
    layer's embed_tokens / eh_proj / shared_head."""
    if not key.endswith(".weight") or not key.startswith("model.layers.") or ".mlp.gate.weight" in key:
        return False
    rest = key.split(".", 3)[3]
    return not rest.startswith(("embed_tokens", "eh_proj", "shared_head", "enorm", "hnorm")) and "norm" not in rest


def to_fp8(folder, n_layers):
    """Quantize the checkpoint in place; returns the fp32 state dict of the dequantized values."""
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    out, deq = {}, {}
    for k, v in sd.items():
        if v.dim() == 2 and fp8_is_quantized(k, n_layers):
            q, s = fp8_quantize(v)
            out[k], out[k[:-len("weight")] + "weight_scale_inv"] = q, s
            deq[k] = fp8_dequantize(q, s)
        else:
            out[k] = deq[k] = v
    save_file(out, path, metadata={"format": "pt"})
    cfg = read_config(folder)
    cfg["quantization_config"] = copy.deepcopy(FP8_QUANT)
    write_config(folder, cfg)
    return deq


# ----------------------------------------------------------------------------- DeepSeek MTP layer
def add_mtp_layer(folder, n_layers):
    """Append the multi-token-prediction layer the published DeepSeek-V3 checkpoints carry as
    model.layers.<num_hidden_layers>: embed_tokens, enorm, hnorm, eh_proj [H, 2H], a full MoE
    decoder layer (the keys of the last layer, random values) and shared_head.{norm, head}.
    Transformers 5.23 has no MTP module: these keys are unexpected and dropped on load."""
    path = os.path.join(folder, "model.safetensors")
    sd = load_file(path)
    h = sd["model.embed_tokens.weight"].shape[1]
    v = sd["model.embed_tokens.weight"].shape[0]
    mtp = f"model.layers.{n_layers}."
    src = f"model.layers.{n_layers - 1}."
    extra = {}
    for k, t in sd.items():
        if k.startswith(src):
            r = torch.randn(t.shape) * (0.1 if t.dim() == 1 else t.shape[-1] ** -0.5)
            extra[mtp + k[len(src):]] = (1.0 + r) if k.endswith("norm.weight") else r
    extra[mtp + "embed_tokens.weight"] = torch.randn(v, h)
    extra[mtp + "enorm.weight"] = 1.0 + 0.1 * torch.randn(h)
    extra[mtp + "hnorm.weight"] = 1.0 + 0.1 * torch.randn(h)
    extra[mtp + "eh_proj.weight"] = torch.randn(h, 2 * h) * (2 * h) ** -0.5
    extra[mtp + "shared_head.norm.weight"] = 1.0 + 0.1 * torch.randn(h)
    extra[mtp + "shared_head.head.weight"] = torch.randn(v, h) * h ** -0.5
    sd.update(extra)
    save_file(sd, path, metadata={"format": "pt"})
    return sorted(extra)


# ----------------------------------------------------------------------------- routing margins
def routing_margins(model, router_logits, keep):
    """Smallest gap, over the kept tokens and every MoE layer, between the last chosen and the first
    rejected candidate at each selection step of 5.23's router (a near tie would make the golden
    fragile). Recomputes 5.23's selection from the captured logits."""
    cfg = model.config.get_text_config()
    res = {}
    for name, logits in router_logits.items():
        lg = logits.reshape(-1, logits.shape[-1])[keep].double()
        k = cfg.num_experts_per_tok
        steps = {}
        mt = cfg.model_type
        if mt == "qwen3_moe":
            p = lg.softmax(-1).sort(-1, descending=True).values
            steps["topk_of_softmax"] = (p[:, k - 1] - p[:, k]).min().item()
        elif mt == "gpt_oss":
            p = lg.sort(-1, descending=True).values
            steps["topk_of_logits"] = (p[:, k - 1] - p[:, k]).min().item()
        elif mt == "deepseek_v3":
            bias = model.get_submodule(name).e_score_correction_bias.double()
            s = lg.sigmoid() + bias
            g = s.view(s.shape[0], cfg.n_group, -1).topk(2, -1).values.sum(-1).sort(-1, descending=True).values
            steps["group_topk"] = (g[:, cfg.topk_group - 1] - g[:, cfg.topk_group]).min().item()
            gs = s.view(s.shape[0], cfg.n_group, -1).topk(2, -1).values.sum(-1)
            keep_g = gs.topk(cfg.topk_group, -1).indices
            m = torch.zeros_like(gs).scatter_(1, keep_g, 1).repeat_interleave(cfg.n_routed_experts // cfg.n_group, 1)
            sm = s.masked_fill(m == 0, -1e9).sort(-1, descending=True).values
            steps["expert_topk"] = (sm[:, k - 1] - sm[:, k]).min().item()
        elif mt == "deepseek_v2":
            s = lg.softmax(-1)
            if cfg.topk_method == "group_limited_greedy":
                gm = s.view(s.shape[0], cfg.n_group, -1).max(-1).values
                g = gm.sort(-1, descending=True).values
                steps["group_topk"] = (g[:, cfg.topk_group - 1] - g[:, cfg.topk_group]).min().item()
                keep_g = gm.topk(cfg.topk_group, -1).indices
                m = torch.zeros_like(gm).scatter_(1, keep_g, 1).repeat_interleave(cfg.n_routed_experts // cfg.n_group, 1)
                s = s.masked_fill(m == 0, 0.0)
            p = s.sort(-1, descending=True).values
            steps["expert_topk"] = (p[:, k - 1] - p[:, k]).min().item()
        res[name] = steps
    return res


# ----------------------------------------------------------------------------- gpt-oss clamp statistics
class ClampStats:
    """Counts, during a forward, how many gate/up values the clamped SwiGLU clips."""

    def __enter__(self):
        from transformers.models.gpt_oss import modeling_gpt_oss as mg
        self.cls, self.orig = mg.GptOssExperts, mg.GptOssExperts._apply_gate
        self.n = self.gate_hi = self.gate_lo = self.up_hi = self.up_lo = 0
        stats = self

        def apply_gate(module, gate_up):
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
            stats.n += gate.numel()
            stats.gate_hi += int((gate > module.limit).sum())
            stats.gate_lo += int((gate < -module.limit).sum())
            stats.up_hi += int((up > module.limit).sum())
            stats.up_lo += int((up < -module.limit).sum())
            return stats.orig(module, gate_up)
        self.cls._apply_gate = apply_gate
        return self

    def __exit__(self, *a):
        self.cls._apply_gate = self.orig

    def summary(self):
        return {"values_per_half": self.n, "gate_above_limit (clipped)": self.gate_hi,
                "gate_below_minus_limit (not clipped)": self.gate_lo, "up_above_limit (clipped)": self.up_hi,
                "up_below_minus_limit (clipped)": self.up_lo}


# ----------------------------------------------------------------------------- key layouts
def key_layout(name, model, folder):
    """How the checkpoint's keys map onto 5.23's in-memory parameters, where they differ."""
    cfg = model.config.get_text_config()
    notes = []
    if cfg.model_type in ("qwen3_moe", "deepseek_v3", "deepseek_v2"):
        i = cfg.moe_intermediate_size
        notes += [
            ["model.layers.{l}.mlp.experts.{e}.gate_proj.weight [I, H]", f"model.layers.{{l}}.mlp.experts.gate_up_proj[e, 0:{i}, :] ([E, 2I, H], gate rows first)"],
            ["model.layers.{l}.mlp.experts.{e}.up_proj.weight [I, H]", f"model.layers.{{l}}.mlp.experts.gate_up_proj[e, {i}:{2 * i}, :]"],
            ["model.layers.{l}.mlp.experts.{e}.down_proj.weight [H, I]", "model.layers.{l}.mlp.experts.down_proj[e] ([E, H, I])"],
        ]
    if cfg.model_type == "gpt_oss":
        if name.endswith("mxfp4"):
            notes += [
                ["model.layers.{l}.mlp.experts.gate_up_proj_blocks [E, 2I, H/32, 16] u8 + gate_up_proj_scales [E, 2I, H/32] u8",
                 "model.layers.{l}.mlp.experts.gate_up_proj [E, H, 2I] = mxfp4_decode(blocks, scales).reshape(E, 2I, H).transpose(1, 2); columns interleaved: gate = [..., 0::2], up = [..., 1::2]"],
                ["model.layers.{l}.mlp.experts.down_proj_blocks [E, H, I/32, 16] u8 + down_proj_scales [E, H, I/32] u8",
                 "model.layers.{l}.mlp.experts.down_proj [E, I, H] = mxfp4_decode(...).reshape(E, H, I).transpose(1, 2)"],
            ]
        else:
            notes += [["model.layers.{l}.mlp.experts.gate_up_proj [E, H, 2I] (same key and layout in memory)",
                       "out = x @ gate_up_proj[e] + gate_up_proj_bias[e]; gate = out[..., 0::2], up = out[..., 1::2]"],
                      ["model.layers.{l}.mlp.experts.down_proj [E, I, H]", "y = act @ down_proj[e] + down_proj_bias[e]"]]
    if isinstance(model, T.Gemma3ForConditionalGeneration):
        notes += [["language_model.model.{embed_tokens,layers.*,norm}.*", "model.language_model.{...} (Gemma3ForCausalLM: model.{...})"],
                  ["(no lm_head key: tied)", "lm_head.weight = model.language_model.embed_tokens.weight"],
                  ["vision_tower.{embeddings,encoder,post_layernorm}.* (the published files: vision_tower.vision_model.*; 5.23 loads both)", "model.vision_tower.{embeddings,encoder,post_layernorm}.*"],
                  ["multi_modal_projector.*", "model.multi_modal_projector.*"]]
    if name.endswith("fp8"):
        notes += [["<linear>.weight float8_e4m3fn [out, in] + <linear>.weight_scale_inv fp32 [ceil(out/128), ceil(in/128)]",
                   "<linear>.weight = fp8.float() * weight_scale_inv[i // 128, j // 128] (the golden; 5.23's own CPU loader differs, see manifest)"]]
    if cfg.model_type == "deepseek_v3" and not name.endswith("fp8"):
        notes += [[f"model.layers.{cfg.num_hidden_layers}.* (MTP layer)", "dropped by 5.23 (unexpected keys)"]]
    if name.endswith("fp8"):
        notes += [[f"model.layers.{cfg.num_hidden_layers}.* (MTP layer)", "dropped by 5.23 (unexpected keys)"]]
    return notes


# ----------------------------------------------------------------------------- main
def max_diff(a, b):
    return float((a.detach() - b.detach()).abs().max())


def main():
    os.makedirs(OUT, exist_ok=True)
    ids, mask = batch()
    keep = mask.flatten().bool()
    manifest = {"transformers": T.__version__, "torch": torch.__version__, "accelerate": accelerate.__version__,
                "attn_implementation": "eager", "experts_implementation": "eager", "dtype": "float32",
                "mode": "eval(), torch.no_grad()",
                "forward_call": "model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)",
                "position_ids": "5.23's default arange(T) for both rows (left padding is not subtracted)",
                "compare": "logits and outputs at positions where attention_mask is 1",
                "keys": {"captured": "blocks and final norm, out.<name>, [B, T, H]",
                         "captured_submodules": "self_attn (its output [0]), mlp (output [0] where a tuple), "
                                                "DeepSeek's self_attn.kv_a_proj_with_mqa (the MLA latent, before the split and norm)",
                         "routers": "router modules (mlp.gate / mlp.router): out.<name> = their router_logits "
                                    "(output [0], [B*T, E] in 5.23) reshaped to [B, T, E]",
                         "params": "parameters stored under out.<name> as they are (gpt-oss sinks [num_heads])"},
                "cases": {}}
    tmp = tempfile.mkdtemp(prefix="zoo3_")
    saved = {}
    try:
        for i, (name, spec) in enumerate(cases()):
            cfg, kind = spec["config"], spec.get("kind", "")
            folder = os.path.join(OUT, name)
            if os.path.isdir(folder):
                shutil.rmtree(folder)
            entry = {}
            cls = T.Gemma3ForConditionalGeneration if kind == "multimodal" else T.AutoModelForCausalLM
            if "weights_of" in spec:  # same random model as another case, stored differently
                shutil.copytree(saved[spec["weights_of"]], folder)
            else:
                torch.manual_seed(spec.get("seed", 3000 + i))
                if kind == "multimodal":
                    model = T.Gemma3ForConditionalGeneration(cfg)
                    model.set_attn_implementation("eager")
                else:
                    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager",
                                                               experts_implementation="eager")
                model.eval()
                randomize(model)
                tie(model)
                model.save_pretrained(folder, safe_serialization=True)
                drop_generation_config(folder)
                saved[name] = os.path.join(tmp, name)
                shutil.copytree(folder, saved[name])
                in_memory = model
            n_layers = cfg.get_text_config().num_hidden_layers
            reference_folder = folder
            if kind == "mtp":
                entry["mtp_keys"] = add_mtp_layer(folder, n_layers)
            if kind == "mxfp4":
                to_mxfp4(folder)
            if kind == "fp8":
                torch.manual_seed(4000 + i)
                entry["mtp_keys"] = add_mtp_layer(folder, n_layers)
                mtp_model_keys = set(entry["mtp_keys"])
                deq = to_fp8(folder, n_layers)
                # The reference: the fp32 checkpoint holding the dequantized values (DeepSeek's semantics).
                reference_folder = os.path.join(tmp, name + "_dequantized")
                os.makedirs(reference_folder)
                save_file({k: v for k, v in deq.items() if k not in mtp_model_keys},
                          os.path.join(reference_folder, "model.safetensors"), metadata={"format": "pt"})
                rcfg = read_config(folder)
                del rcfg["quantization_config"]
                write_config(reference_folder, rcfg)

            # 5.23 loads the checkpoint as written; this model makes the golden.
            model, info = load(reference_folder, cls)
            missing = sorted(info["missing_keys"])
            assert not missing, (name, missing)
            unexpected = sorted(info["unexpected_keys"])
            blocks, sub, routers, params = capture_plan(model)
            with ClampStats() as clamp:
                logits, outs = run(model, ids, mask, blocks + sub + routers)
            B, S = ids.shape
            for r in routers:
                outs[r] = outs[r].reshape(B, S, -1)
            for p in params:
                outs[p] = model.get_parameter(p).detach().clone()

            # Checks, recorded in the manifest.
            checks = {}
            if "weights_of" not in spec and kind not in ("fp8",):
                ref_logits, _ = run(in_memory, ids, mask, [])
                if kind == "mxfp4":
                    pass
                else:
                    checks["logits_vs_model_before_save"] = max_diff(ref_logits, logits)
                    assert checks["logits_vs_model_before_save"] == 0.0, (name, checks)
            if kind in ("mtp",):
                checks["unexpected_keys_dropped_by_5.23"] = len(unexpected)
                assert unexpected and all(u.startswith(f"model.layers.{n_layers}.") for u in unexpected), unexpected
            if kind == "mxfp4":
                # 5.23's own dequantization (on CPU: always, to the model's dtype) equals ours, and the
                # model equals the plain gpt_oss model with the dequantized experts.
                q = load_file(os.path.join(folder, "model.safetensors"))
                worst = 0.0
                for l in range(n_layers):
                    for proj in ("gate_up_proj", "down_proj"):
                        k = f"model.layers.{l}.mlp.experts.{proj}"
                        ours = mxfp4_decode(q[k + "_blocks"], q[k + "_scales"])
                        e, rows = ours.shape[0], ours.shape[1]
                        ours = ours.reshape(e, rows, -1).transpose(1, 2)
                        worst = max(worst, max_diff(ours, model.get_parameter(k)))
                checks["dequantized_experts_vs_own_decoder"] = worst
                assert worst == 0.0
                plain = load_file(os.path.join(saved["gpt_oss"], "model.safetensors"))
                rel = max(max_diff(model.get_parameter(k), plain[k]) / float(plain[k].abs().max())
                          for k in plain if k.endswith(("gate_up_proj", "down_proj")))
                checks["mxfp4_quantization_error_rel_to_amax"] = rel
                q_explicit, _ = load(folder, cls, quantization_config=T.Mxfp4Config(dequantize=True))
                checks["logits_with_Mxfp4Config_dequantize_True"] = max_diff(run(q_explicit, ids, mask, [])[0], logits)
                assert checks["logits_with_Mxfp4Config_dequantize_True"] == 0.0
            if kind == "fp8":
                fp8_523, fp8_info = load(folder, cls)
                unexpected = sorted(fp8_info["unexpected_keys"])
                assert not fp8_info["missing_keys"] and unexpected
                assert all(u.startswith(f"model.layers.{n_layers}.") for u in unexpected), unexpected
                checks["unexpected_keys_dropped_by_5.23"] = len(unexpected)
                checks["transformers_5.23_fp8_cpu_load_logits_max_abs_diff_vs_golden"] = max_diff(
                    run(fp8_523, ids, mask, [])[0], logits)
                checks["golden_logits_max_abs"] = float(logits.abs().max())
                q = load_file(os.path.join(folder, "model.safetensors"))
                k = "model.layers.0.mlp.gate_proj.weight"
                checks["transformers_5.23_fp8_cpu_dequant_of_" + k] = {
                    "max_abs_diff_vs_block128": max_diff(fp8_523.get_parameter(k), fp8_dequantize(q[k], q[k + "_scale_inv"])),
                    "explained_by": "block size derived as (out // scale_rows, in // scale_cols) instead of 128",
                }
                o, n_in = q[k].shape
                sr, sc = q[k + "_scale_inv"].shape
                derived = (q[k].float().reshape(sr, o // sr, sc, n_in // sc)
                           * q[k + "_scale_inv"][:, None, :, None]).reshape(o, n_in)
                assert max_diff(fp8_523.get_parameter(k), derived) == 0.0
                entry["fp8_blocks"] = {k2: [list(v.shape), list(q[k2 + "_scale_inv"].shape)]
                                       for k2, v in sorted(q.items()) if v.dtype == torch.float8_e4m3fn
                                       and k2.startswith("model.layers.0.")}
            if isinstance(model, (T.Qwen3MoeForCausalLM, T.GptOssForCausalLM, T.DeepseekV3ForCausalLM,
                                  T.DeepseekV2ForCausalLM)):
                default_model, _ = load(reference_folder, cls, experts=None)
                checks["experts_implementation_default"] = default_model.config._experts_implementation
                checks["logits_default_experts_vs_eager"] = max_diff(run(default_model, ids, mask, [])[0], logits)
                entry["routing_margins"] = routing_margins(model, {r: outs[r] for r in routers}, keep)
                worst = min(v for m in entry["routing_margins"].values() for v in m.values())
                assert worst > 1e-4, (name, entry["routing_margins"])
            if isinstance(model, T.GptOssForCausalLM):
                entry["swiglu_clamp_counts (all tokens incl. padding, all layers)"] = clamp.summary()
                assert clamp.gate_hi > 0 and clamp.up_hi > 0 and clamp.up_lo > 0 and clamp.gate_lo > 0
            if kind == "multimodal":
                # flexmodel loads the language model as a causal LM: 5.23's Gemma3ForCausalLM on the same
                # weights gives the same logits.
                tc = copy.deepcopy(model.config.text_config)
                lm = T.Gemma3ForCausalLM(tc).eval()
                sd = {k.replace("model.language_model.", "model."): v for k, v in model.state_dict().items()
                      if k.startswith("model.language_model.")}
                lm.load_state_dict(sd, strict=False)
                lm.tie_weights()
                lm.config._attn_implementation = "eager"
                checks["logits_vs_Gemma3ForCausalLM_same_weights"] = max_diff(run(lm, ids, mask, [])[0], logits)
                assert checks["logits_vs_Gemma3ForCausalLM_same_weights"] == 0.0
                entry["text_class"] = "Gemma3ForCausalLM"
                entry["causal_lm_names"] = {n: n.replace("model.language_model.", "model.")
                                            for n in blocks + sub}
                entry["lm_head"] = "tied to language_model.model.embed_tokens.weight (no lm_head key)"
            if isinstance(model, T.Olmo3ForCausalLM):
                # The published configs hold rope_theta + a legacy rope_scaling: 5.23 applies it to full layers only.
                legacy = read_config(folder)
                rp = legacy.pop("rope_parameters")
                full = dict(rp["full_attention"])
                legacy["rope_theta"] = full.pop("rope_theta")
                legacy["rope_scaling"] = full
                lfold = os.path.join(tmp, name + "_legacy")
                shutil.copytree(folder, lfold)
                write_config(lfold, legacy)
                lmodel, _ = load(lfold)
                checks["legacy_rope_scaling_config_logits_diff"] = max_diff(run(lmodel, ids, mask, [])[0], logits)
                checks["legacy_rope_scaling_config_loaded_as"] = lmodel.config.rope_parameters
                assert checks["legacy_rope_scaling_config_logits_diff"] == 0.0

            tensors = {"input_ids": ids, "attention_mask": mask, "logits": logits.contiguous()}
            tensors.update({"out." + n: t.contiguous() for n, t in outs.items()})
            save_file(tensors, os.path.join(OUT, name + ".golden.safetensors"), metadata={"format": "pt"})

            ck = checkpoint_keys(folder)
            entry.update({
                "class": type(model).__name__,
                "captured": blocks,
                "captured_submodules": sub,
                "routers": routers,
                "params": params,
                "checkpoint": {"tensors": len(ck), "dtypes": sorted({d for d, _ in ck.values()}),
                               "unexpected_keys_on_load": len(unexpected)},
                "key_layout": key_layout(name, model, folder),
                "checks": checks,
            })
            if "mtp_keys" in entry:
                entry["mtp_keys"] = entry["mtp_keys"][:8] + ([f"... {len(entry['mtp_keys'])} keys"]
                                                            if len(entry["mtp_keys"]) > 8 else [])
            manifest["cases"][name] = entry
            print(f"{name}: {type(model).__name__}, {len(blocks) + len(sub) + len(routers) + len(params)} tensors "
                  f"captured, checks {json.dumps(checks, default=str)[:300]}")
    finally:
        shutil.rmtree(tmp)
    with open(os.path.join(OUT, "manifest_zoo3.json"), "w") as f:
        json.dump(manifest, f, indent=1, default=str)
        f.write("\n")


if __name__ == "__main__":
    main()
