# %% [markdown]
# # A Transformers model in memory: wrap, trace, steer, train a probe
#
# Most interpretability code starts from `AutoModelForCausalLM.from_pretrained(...)`. flexmodel wraps
# that very object: for an architecture it knows (`config.model_type`), the C++ model is built around
# the Transformers model's own tensors (no second copy of the weights) and runs in flexmodel's engine;
# module names stay Transformers' own, and TransformerLens's hook names (`blocks.1.hook_resid_post`)
# work wherever a module name does:
#
#     python3 examples/python/transformers_wrap.py
#
# Steps: 1 a Transformers model (a random Llama, built here: nothing is downloaded), 2 wrap and
# capture, 3 nnsight-style tracing, 4 steering, 5 a linear probe trained through an editing function,
# 6 restore. Each step asserts what it shows against Transformers itself.

# %%
import time

import torch
import transformers
from torch import nn

import flexmodel

START = time.time()
torch.manual_seed(0)
transformers.logging.set_verbosity_error()

# %% [markdown]
# ## 1. A Transformers model
#
# Any `LlamaForCausalLM` would do (`from_pretrained("meta-llama/...")` included); this one is small
# and random. Eager attention, so that Transformers can also return its attention probabilities.

# %%
config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
hf = transformers.LlamaForCausalLM(config).eval()
hf.config._attn_implementation = "eager"
ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    reference = hf(input_ids=ids, output_hidden_states=True, use_cache=False)

# %% [markdown]
# ## 2. Wrap it and capture
#
# `FlexModel(hf, out)` takes the model as it is. `fm.engine` says flexmodel's engine runs it (a model
# type flexmodel has no architecture for would run on PyTorch's hooks: `fm.engine == "torch"`). The
# parameters are the Transformers tensors themselves: same data pointers.

# %%
out = {}
fm = flexmodel.FlexModel(hf, out)
assert fm.engine == "flexmodel"
shared = dict(hf.named_parameters())
assert all(p.data_ptr() == shared[n].data_ptr() for n, p in flexmodel.from_transformers(hf).named_parameters())
fm.register_forward_hook(flexmodel.HookFunction("model.layers.1"))                 # Transformers' module name
fm.register_forward_hook(flexmodel.HookFunction("blocks.1.hook_resid_post"))       # TransformerLens's name for it
fm.register_forward_hook(flexmodel.HookFunction("blocks.2.attn.hook_pattern"))     # attention probabilities
with torch.no_grad():
    logits = fm(ids)
assert torch.allclose(logits, reference.logits, atol=1e-4)
assert torch.allclose(out["model.layers.1"], reference.hidden_states[2], atol=1e-5)
assert torch.equal(out["blocks.1.hook_resid_post"], out["model.layers.1"])
print(f"captured {sorted(out)}; attention pattern {tuple(out['blocks.2.attn.hook_pattern'].shape)}; "
      f"logits within {(logits - reference.logits).abs().max():.1e} of Transformers'")
fm.restore()

# %% [markdown]
# ## 3. nnsight-style tracing
#
# Inside `with fm.trace(ids)`, attribute and index access follow the module tree (`fm.model.layers[1]`,
# or TransformerLens's `fm.blocks[1]`); `.output` / `.input` are proxies to save, compute with and edit.
# The model runs once, on exit.

# %%
with torch.no_grad(), fm.trace(ids):
    layer_1 = fm.model.layers[1].output.save()
    resid_pre_2 = fm.blocks[2].hook_resid_pre.output.save()
    norm_in = fm.model.norm.input.save()
assert torch.allclose(layer_1, reference.hidden_states[2], atol=1e-5)
assert torch.equal(resid_pre_2, layer_1)                      # block 2 reads what block 1 wrote
print(f"traced: layer 1's output {tuple(layer_1.shape)}, the final norm's input {tuple(norm_in.shape)}")

# %% [markdown]
# ## 4. Steering
#
# An editing function returns the activation to go on with: here the residual stream after block 1
# plus a direction. The same edit as a Transformers forward hook gives the same logits.

# %%
direction = torch.randn(64, generator=torch.Generator().manual_seed(2))
fm.register_forward_hook(flexmodel.HookFunction("blocks.1.hook_resid_post",
                                                editing_function=lambda m, x, ctx, mods: x + 4.0 * direction))
with torch.no_grad():
    steered = fm(ids)
fm.restore()
handle = hf.model.layers[1].register_forward_hook(lambda m, a, o: o + 4.0 * direction)
with torch.no_grad():
    want = hf(input_ids=ids, use_cache=False).logits
handle.remove()
assert torch.allclose(steered, want, atol=1e-4) and not torch.allclose(steered, logits, atol=1e-2)
print(f"steering moved the logits by up to {(steered - logits).abs().max():.2f} (as Transformers' hook does)")

# %% [markdown]
# ## 5. A linear probe trained through an editing function
#
# Does block 1's residual stream say whether the token id is in the lower half of the vocabulary? The
# probe is a trainable module; the editing function runs it and leaves the activation alone. Only the
# probe learns: `wrapped_module_requires_grad(False)` freezes flexmodel's parameters, not the
# Transformers model's (which keeps its own requires_grad).

# %%
train_ids = torch.randint(0, 64, (32, 12), generator=torch.Generator().manual_seed(3))
test_ids = torch.randint(0, 64, (16, 12), generator=torch.Generator().manual_seed(4))
probe = nn.Sequential(nn.LayerNorm(64, elementwise_affine=False), nn.Linear(64, 2))  # the stream's scale is ~0.02
fm.register_trainable_module("probe", probe)
fm.wrapped_module_requires_grad(False)


def read_out(module, x, save_ctx, modules):
    save_ctx.probe_logits = modules["probe"](x)
    return x


fm.register_forward_hook(flexmodel.HookFunction("blocks.1.hook_resid_post", editing_function=read_out, save=False))
opt = torch.optim.Adam(probe.parameters(), lr=0.05)
for step in range(100):
    opt.zero_grad()
    fm(train_ids)
    loss = nn.functional.cross_entropy(fm.save_ctx.probe_logits.reshape(-1, 2), (train_ids < 32).long().reshape(-1))
    loss.backward()
    opt.step()
with torch.no_grad():
    fm(test_ids)
    accuracy = (fm.save_ctx.probe_logits.argmax(-1) == (test_ids < 32).long()).float().mean().item()
print(f"probe on blocks.1.hook_resid_post: train loss {loss.item():.3f}, held-out accuracy {accuracy:.2f}")
assert accuracy > 0.85, accuracy

# %% [markdown]
# ## 6. Restore
#
# `restore()` takes every hook off and gives the Transformers model back, untouched.

# %%
assert fm.restore() is hf
assert all(p.requires_grad for p in hf.parameters())
with torch.no_grad():
    assert torch.equal(hf(input_ids=ids, use_cache=False).logits, reference.logits)
print(f"done in {time.time() - START:.1f} s")
