"""An independent reference for the zoo III goldens: re-implements, in plain torch and without
Transformers' modeling code, the forward of every case in tests/data/golden5/manifest_zoo3.json
from its config.json and the checkpoint's own tensors (published key layout: per-expert keys,
fused gpt-oss experts, MXFP4 blocks, FP8 + weight_scale_inv, Gemma 3's language_model.model.*),
and compares logits and every captured output with the golden at the kept positions
(atol 1e-5, rtol 1e-4, as tests/models/test_golden5.cpp).

Run:  $(bash scripts/golden/setup.sh) scripts/golden/check_golden_zoo3.py [DIR]

It documents, as code, the formulas the C++ side has to match (see the README there).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden5")
torch.set_num_threads(1)


# ----------------------------------------------------------------------------- weights
FP4 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def mxfp4(blocks, scales):
    """[E, rows, G, 16] u8 + [E, rows, G] u8 -> [E, rows, G*32] fp32: low nibble first, x 2^(scale-127)."""
    b = blocks.to(torch.long)
    v = torch.stack([FP4[b & 15], FP4[b >> 4]], -1).reshape(*blocks.shape[:-1], 32)
    return (v * torch.exp2(scales.float() - 127)[..., None]).reshape(*blocks.shape[:-2], -1)


def weights(folder, cfg):
    sd = load_file(os.path.join(folder, "model.safetensors"))
    out = {}
    for k, v in sd.items():
        if k.endswith("weight_scale_inv") or k.endswith("_scales"):
            continue
        if v.dtype == torch.float8_e4m3fn:
            s = sd[k + "_scale_inv"]
            s = s.repeat_interleave(128, 0)[: v.shape[0]].repeat_interleave(128, 1)[:, : v.shape[1]]
            out[k] = v.float() * s
        elif k.endswith("_blocks"):
            base = k[: -len("_blocks")]
            w = mxfp4(v, sd[base + "_scales"])          # [E, out, in]
            out[base] = w.transpose(1, 2).contiguous()  # in-memory [E, in, out]
        else:
            out[k] = v.float()
    return out


# ----------------------------------------------------------------------------- RoPE
def inv_freq_and_scale(rp, head_dim, max_pos, nested):
    """5.23's ROPE_INIT_FUNCTIONS for the types used here: (inv_freq [head_dim/2], attention_scaling)."""
    base = rp["rope_theta"]
    d = head_dim
    pos = base ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)
    t = rp.get("rope_type", "default")
    if t == "default":
        return 1.0 / pos, 1.0
    if t == "linear":
        return 1.0 / pos / rp["factor"], 1.0
    assert t == "yarn", t
    factor = rp["factor"]
    orig = rp["original_max_position_embeddings"]

    def mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
    att = rp.get("attention_factor")
    if att is None:
        m, mad = rp.get("mscale"), rp.get("mscale_all_dim")
        att = mscale(factor, m) / mscale(factor, mad) if (m and mad) else mscale(factor)
    beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1
    # 5.23 reads `truncate` from the top level of config.rope_parameters: for a per-layer-type
    # (nested) dict it is never found and defaults to True.
    truncate = True if nested else rp.get("truncate", True)

    def corr(n):
        return (d * math.log(orig / (n * 2 * math.pi))) / (2 * math.log(base))
    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra = 1 - ramp  # 1 = keep the original frequency (extrapolation)
    inv = (1.0 / (factor * pos)) * (1 - extra) + (1.0 / pos) * extra
    return inv, float(att)


def cos_sin(inv, scale, seq):
    f = torch.arange(seq).float()[:, None] * inv[None, :]     # [T, d/2]
    return f.cos() * scale, f.sin() * scale


def rope_half(x, cos, sin):
    """rotate_half convention: pairs (i, i + d/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rope_interleaved_deinterleave(x, cos, sin):
    """DeepSeek-V3 rope_interleave=True in 5.23: pairs (2i, 2i+1), output de-interleaved
    (the rotated even elements first, then the odd ones) for both q and k."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rope_complex(x, cos, sin):
    """DeepSeek-V2: pairs (2i, 2i+1) as complex numbers, output interleaved (in place)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


# ----------------------------------------------------------------------------- pieces
def rms(x, w, eps, gemma=False):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w) if gemma else y * w


def lin(x, W, name):
    y = x @ W[name + ".weight"].T
    b = W.get(name + ".bias")
    return y + b if b is not None else y


def allowed(mask, window):
    """[B, T, T] bool: causal, not padding, and kv > q - window for sliding layers."""
    t = mask.shape[1]
    q = torch.arange(t)[:, None]
    k = torch.arange(t)[None, :]
    a = (k <= q)
    if window:
        a = a & (k > q - window)
    return a[None] & mask.bool()[:, None, :]


def attention(q, k, v, allow, scale, sinks=None, softcap=None):
    """q [B, nh, T, dq], k [B, nkv, T, dq], v [B, nkv, T, dv] -> [B, T, nh*dv]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~allow[:, None], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks[None, :, None, None].expand(s.shape[0], -1, s.shape[2], 1)], -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    if sinks is not None:
        p = p[..., :-1]
    o = p @ v
    return o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)


def heads(x, n, d):
    return x.view(x.shape[0], x.shape[1], n, d).transpose(1, 2)


def swiglu_mlp(x, W, p, act=F.silu):
    return lin(act(lin(x, W, p + ".gate_proj")) * lin(x, W, p + ".up_proj"), W, p + ".down_proj")


def experts_sum(x, W, p, idx, wts, n_exp):
    """Per-expert checkpoint keys p.experts.N.{gate,up,down}_proj.weight."""
    out = torch.zeros_like(x)
    for e in range(n_exp):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if len(tok) == 0:
            continue
        y = swiglu_mlp(x[tok], W, f"{p}.experts.{e}")
        out.index_add_(0, tok, y * wts[tok, slot, None])
    return out


# ----------------------------------------------------------------------------- architectures
def forward(cfg, W, ids, mask, rec):
    mt = cfg["model_type"]
    if mt == "gemma3":
        return forward(dict(cfg["text_config"], _prefix="language_model.model", _tied=True), W, ids, mask, rec)
    P = cfg.get("_prefix", "model")
    B, S = ids.shape
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    eps = cfg["rms_norm_eps"]
    layer_types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    h = W[f"{P}.embed_tokens.weight"][ids]
    if mt == "gemma3_text":
        h = h * torch.tensor(H ** 0.5, dtype=torch.float32)
    rp = cfg["rope_parameters"]
    nested = "full_attention" in rp or "sliding_attention" in rp
    mla = "kv_lora_rank" in cfg
    hd = cfg["qk_rope_head_dim"] if mla else (cfg.get("head_dim") or H // nh)
    ropes = {}
    for lt in set(layer_types):
        inv, sc = inv_freq_and_scale(rp[lt] if nested else rp, hd, cfg["max_position_embeddings"], nested)
        ropes[lt] = cos_sin(inv, sc, S)
    for l in range(cfg["num_hidden_layers"]):
        p = f"{P}.layers.{l}"
        lt = layer_types[l]
        cos, sin = ropes[lt]
        window = cfg.get("sliding_window") if lt == "sliding_attention" else None
        allow = allowed(mask, window)
        g = mt == "gemma3_text"
        x = h if mt == "olmo3" else rms(h, W[p + ".input_layernorm.weight"], eps, g)
        a = p + ".self_attn"
        if mla:
            if cfg.get("q_lora_rank"):
                qs = lin(rms(lin(x, W, a + ".q_a_proj"), W[a + ".q_a_layernorm.weight"], 1e-6), W, a + ".q_b_proj")
            else:
                qs = lin(x, W, a + ".q_proj")
            dn, dr, dv, r = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
            qs = heads(qs, nh, dn + dr)
            q_pass, q_rot = qs[..., :dn], qs[..., dn:]
            latent = lin(x, W, a + ".kv_a_proj_with_mqa")
            rec[a + ".kv_a_proj_with_mqa"] = latent
            c, k_rot = latent[..., :r], latent[..., r:][:, None]      # k_rot: one head [B, 1, T, dr]
            c = rms(c, W[a + ".kv_a_layernorm.weight"], 1e-6)
            if mt == "deepseek_v2":
                rot = rope_complex
            else:
                rot = rope_interleaved_deinterleave if cfg.get("rope_interleave") else rope_half
            q_rot, k_rot = rot(q_rot, cos, sin), rot(k_rot, cos, sin)
            kv = heads(lin(c, W, a + ".kv_b_proj"), nh, dn + dv)
            k_nope, v = kv[..., :dn], kv[..., dn:]
            q = torch.cat([q_pass, q_rot], -1)
            k = torch.cat([k_nope, k_rot.expand(-1, nh, -1, -1)], -1)
            scale = (dn + dr) ** -0.5
            if rp.get("rope_type", "default") != "default" and rp.get("mscale_all_dim"):
                m = 0.1 * rp["mscale_all_dim"] * math.log(rp["factor"]) + 1.0 if rp["factor"] > 1 else 1.0
                scale *= m * m
            o = attention(q, k, v, allow, scale)
        else:
            q, k, v = lin(x, W, a + ".q_proj"), lin(x, W, a + ".k_proj"), lin(x, W, a + ".v_proj")
            if mt == "olmo3":  # q/k norm over the whole projection, before the head split
                q, k = rms(q, W[a + ".q_norm.weight"], eps), rms(k, W[a + ".k_norm.weight"], eps)
            q, k, v = heads(q, nh, hd), heads(k, nkv, hd), heads(v, nkv, hd)
            if mt in ("gemma3_text", "qwen3_moe"):  # per-head q/k norm
                q, k = rms(q, W[a + ".q_norm.weight"], eps, g), rms(k, W[a + ".k_norm.weight"], eps, g)
            q, k = rope_half(q, cos, sin), rope_half(k, cos, sin)
            scale = cfg["query_pre_attn_scalar"] ** -0.5 if g else hd ** -0.5
            o = attention(q, k, v, allow, scale, sinks=W.get(a + ".sinks"), softcap=cfg.get("attn_logit_softcapping"))
        o = lin(o, W, a + ".o_proj")
        rec[a] = o
        if mt in ("gemma3_text", "olmo3"):
            h = h + rms(o, W[p + ".post_attention_layernorm.weight"], eps, g)
        else:
            h = h + o
        x = rms(h, W[p + (".pre_feedforward_layernorm.weight" if g else ".post_attention_layernorm.weight")], eps, g) \
            if mt != "olmo3" else h
        m = p + ".mlp"
        flat = x.reshape(-1, H)
        if mt == "gemma3_text":
            y = swiglu_mlp(x, W, m, act=lambda t: F.gelu(t, approximate="tanh"))
        elif mt == "qwen3_moe" and m + ".gate.weight" in W:
            logits = flat @ W[m + ".gate.weight"].T
            rec[m + ".gate"] = logits.view(B, S, -1)
            pr = logits.softmax(-1)
            wts, idx = pr.topk(cfg["num_experts_per_tok"], -1)
            if cfg["norm_topk_prob"]:
                wts = wts / wts.sum(-1, keepdim=True)
            y = experts_sum(flat, W, m, idx, wts, cfg.get("num_experts", cfg.get("num_local_experts"))).view(B, S, H)
        elif mt == "gpt_oss":
            logits = flat @ W[m + ".router.weight"].T + W[m + ".router.bias"]
            rec[m + ".router"] = logits.view(B, S, -1)
            top, idx = logits.topk(cfg["num_experts_per_tok"], -1)
            wts = top.softmax(-1)                  # softmax over the k chosen logits only
            lim, alpha = cfg["swiglu_limit"], cfg["swiglu_alpha"]
            y = torch.zeros_like(flat)
            for e in range(cfg["num_local_experts"]):
                tok, slot = (idx == e).nonzero(as_tuple=True)
                if len(tok) == 0:
                    continue
                gu = flat[tok] @ W[m + ".experts.gate_up_proj"][e] + W[m + ".experts.gate_up_proj_bias"][e]
                gate, up = gu[:, 0::2].clamp(max=lim), gu[:, 1::2].clamp(-lim, lim)
                act = (up + 1) * gate * torch.sigmoid(alpha * gate)
                out = act @ W[m + ".experts.down_proj"][e] + W[m + ".experts.down_proj_bias"][e]
                y.index_add_(0, tok, out * wts[tok, slot, None])
            y = y.view(B, S, H)
        elif mt == "deepseek_v3" and m + ".gate.weight" in W:
            logits = flat @ W[m + ".gate.weight"].T
            rec[m + ".gate"] = logits.view(B, S, -1)
            sc = logits.sigmoid()
            choice = sc + W[m + ".gate.e_score_correction_bias"]
            E, G = cfg["n_routed_experts"], cfg["n_group"]
            gsc = choice.view(-1, G, E // G).topk(2, -1).values.sum(-1)
            gidx = gsc.topk(cfg["topk_group"], -1).indices
            gmask = torch.zeros_like(gsc).scatter_(1, gidx, 1).repeat_interleave(E // G, 1)
            idx = choice.masked_fill(gmask == 0, float("-inf")).topk(cfg["num_experts_per_tok"], -1).indices
            wts = sc.gather(1, idx)                # the weights use the scores without the bias
            if cfg["norm_topk_prob"]:
                wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
            wts = wts * cfg["routed_scaling_factor"]
            y = experts_sum(flat, W, m, idx, wts, E) + swiglu_mlp(flat, W, m + ".shared_experts")
            y = y.view(B, S, H)
        elif mt == "deepseek_v2" and m + ".gate.weight" in W:
            logits = flat @ W[m + ".gate.weight"].T
            rec[m + ".gate"] = logits.view(B, S, -1)
            sc = logits.softmax(-1)
            E = cfg["n_routed_experts"]
            if cfg["topk_method"] == "group_limited_greedy":
                G = cfg["n_group"]
                gsc = sc.view(-1, G, E // G).max(-1).values
                gidx = gsc.topk(cfg["topk_group"], -1).indices
                gmask = torch.zeros_like(gsc).scatter_(1, gidx, 1).repeat_interleave(E // G, 1)
                sc = sc.masked_fill(gmask == 0, 0.0)
            wts, idx = sc.topk(cfg["num_experts_per_tok"], -1)
            wts = wts * cfg["routed_scaling_factor"]   # norm_topk_prob is not used by 5.23's V2 router
            y = experts_sum(flat, W, m, idx, wts, E) + swiglu_mlp(flat, W, m + ".shared_experts")
            y = y.view(B, S, H)
        else:
            y = swiglu_mlp(x, W, m)
        rec[m] = y
        if g:
            h = h + rms(y, W[p + ".post_feedforward_layernorm.weight"], eps, g)
        elif mt == "olmo3":
            h = h + rms(y, W[p + ".post_feedforward_layernorm.weight"], eps)
        else:
            h = h + y
        rec[p] = h
    h = rms(h, W[f"{P}.norm.weight"], eps, mt == "gemma3_text")
    rec[f"{P}.norm"] = h
    head = W.get("lm_head.weight", W[f"{P}.embed_tokens.weight"])
    logits = h @ head.T
    if cfg.get("final_logit_softcapping") and not cfg.get("_prefix"):
        c = cfg["final_logit_softcapping"]
        logits = torch.tanh(logits / c) * c
    return logits


def main():
    manifest = json.load(open(os.path.join(DIR, "manifest_zoo3.json")))
    bad = 0
    for name, info in manifest["cases"].items():
        folder = os.path.join(DIR, name)
        cfg = json.load(open(os.path.join(folder, "config.json")))
        W = weights(folder, cfg)
        gold = load_file(os.path.join(DIR, name + ".golden.safetensors"))
        ids, mask = gold["input_ids"], gold["attention_mask"]
        rec = {}
        with torch.no_grad():
            logits = forward(cfg, W, ids, mask, rec)
        keep = mask.flatten().bool()
        rec["logits"] = logits
        # names as 5.23 calls them (Gemma 3 multimodal: model.language_model.*)
        rec = {k.replace("language_model.model.", "model.language_model."): v for k, v in rec.items()}
        worst, report = 0.0, []
        for n in ["logits"] + info["captured"] + info["captured_submodules"] + info["routers"]:
            g = gold["logits" if n == "logits" else "out." + n]
            r = rec[n]
            a = g.reshape(-1, g.shape[-1])[keep]
            b = r.reshape(-1, r.shape[-1])[keep]
            ok = torch.allclose(b, a, atol=1e-5, rtol=1e-4)
            d = float((a - b).abs().max())
            worst = max(worst, d)
            if not ok:
                report.append(f"{n}: max |diff| {d:.3g}")
        for n in info["params"]:
            if not torch.equal(gold["out." + n], W[n]):
                report.append(f"{n}: param differs")
        bad += bool(report)
        print(f"{name}: {'OK' if not report else 'MISMATCH'} (largest |diff| {worst:.2g})" + "".join("\n   " + x for x in report))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
