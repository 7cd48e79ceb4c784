# %% [markdown]
# # Any torch.nn.Module: wrap, capture, edit, trace, train a probe
#
# flexmodel's C++ engine runs the architectures it knows (`flexmodel.from_pretrained`). A model it
# has never heard of — here a tiny vision transformer defined below, but equally a Transformers model
# already in memory, a LoRA-patched model or your own research model — gets the same FlexModel API
# from the "torch" engine, which runs the module in PyTorch and works through its module hooks:
#
#     python3 examples/python/wrap_any_module.py
#
# Steps: 1 the model and a toy task, 2 wrap and capture, 3 edit, 4 nnsight-style tracing,
# 5 a linear probe trained through an editing function, 6 restore. Each step asserts what it shows
# against plain PyTorch, so a broken engine fails loudly.

# %%
import time

import torch
from torch import nn

import flexmodel

START = time.time()
torch.manual_seed(0)


# %% [markdown]
# ## 1. A model flexmodel has no architecture for, and a toy task
#
# 8x8 images, 4x4 patches, a class token, two pre-norm blocks on `nn.MultiheadAttention` (whose output
# is a tuple: `(output, weights)`). The task: which quadrant of the image holds a bright square.

# %%
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        x = x + a
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, image=8, patch=4, d=32, heads=4, depth=2, classes=4):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(patch * patch, d)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.1)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images):                                   # [B, 8, 8] -> [B, classes]
        b, p = images.shape[0], self.patch
        patches = images.unfold(1, p, p).unfold(2, p, p).reshape(b, -1, p * p)
        x = torch.cat([self.cls.expand(b, -1, -1), self.embed(patches)], 1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def quadrant_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 8, 8, generator=g) * 0.3
    labels = torch.randint(0, 4, (n,), generator=g)
    for i, q in enumerate(labels.tolist()):
        r, c = divmod(q, 2)
        images[i, 4 * r + 1:4 * r + 3, 4 * c + 1:4 * c + 3] += 1.0
    return images, labels


model = TinyViT().eval()          # random weights: the mechanics, not a trained classifier, are the point
train_x, train_y = quadrant_images(256, seed=1)
test_x, test_y = quadrant_images(128, seed=2)

# %% [markdown]
# ## 2. Wrap it and capture every module
#
# `FlexModel` takes the module as it is; `fm.engine` says which engine runs it. Captures land in the
# output dict on the CPU, keyed by module name, exactly as flexmodel's engine keys them.

# %%
out = {}
fm = flexmodel.FlexModel(model, out)
assert fm.engine == "torch"
fm.create_hook_group("mlps", "mlp")                            # one capture hook per module named *mlp*
fm.register_forward_hook(flexmodel.HookFunction("blocks.1.attn", expected_shape=(None, 4, 5, 5), unpack_idx=1))
with torch.no_grad():
    logits = fm(test_x[:8])
print(f"{len(out)} captures, e.g. blocks.0.mlp {tuple(out['blocks.0.mlp'].shape)}, "
      f"blocks.1.attn (its attention weights) {tuple(out['blocks.1.attn'].shape)}")

plain = {}
handle = model.blocks[0].mlp.register_forward_hook(lambda m, a, o: plain.update(mlp=o.clone()))
with torch.no_grad():
    model(test_x[:8])                                          # the wrapped model's own call runs fm's hooks too
handle.remove()
fm.take_captures()                                             # (those captures are not a forward of fm's)
assert torch.equal(out["blocks.0.mlp"], plain["mlp"])

# %% [markdown]
# ## 3. Edit: zero one attention head's contribution
#
# An editing function gets the module, the activation, a save context and the trainable modules, and
# returns the activation to go on with. Here: block 1's attention output with the class token's update
# removed.

# %%
fm.restore()
ablate = flexmodel.HookFunction("blocks.1.attn", editing_function=lambda m, x, ctx, mods: x * torch.tensor(
    [0.0] + [1.0] * 4).view(1, 5, 1))
fm.register_forward_hook(ablate)
with torch.no_grad():
    edited = fm(test_x[:8])
fm.restore()
handle = model.blocks[1].attn.register_forward_hook(
    lambda m, a, o: (o[0] * torch.tensor([0.0] + [1.0] * 4).view(1, 5, 1), o[1]))
with torch.no_grad():
    want = model(test_x[:8])
handle.remove()
assert torch.allclose(edited, want, atol=1e-6) and not torch.allclose(edited, logits, atol=1e-4)
print(f"ablation moved the logits by up to {(edited - logits).abs().max():.3f}")

# %% [markdown]
# ## 4. nnsight-style tracing
#
# Inside `with fm.trace(x)`, attribute and index access follow the module tree; `.output` / `.input`
# are proxies that can be saved, computed with and edited in place. The model runs once, on exit;
# saved proxies are then the tensors themselves.

# %%
with torch.no_grad(), fm.trace(test_x[:8]) as tracer:
    weights = fm.blocks[0].attn.output[1].save()              # the tuple's second element
    fm.blocks[1].mlp.output[:, 0] = 0                          # in place, at that module's hook
    cls_in = fm.blocks[1].input[:, 0].save()
assert isinstance(weights, torch.Tensor) and weights.shape == (8, 4, 5, 5)
assert torch.allclose(weights.sum(-1), torch.ones(8, 4, 5), atol=1e-5)   # attention rows sum to 1
print(f"traced: attention weights {tuple(weights.shape)}, class token into block 1 {tuple(cls_in.shape)}")

# %% [markdown]
# ## 5. A linear probe trained through an editing function
#
# The probe is registered as a trainable module; the editing function runs it on block 0's class token
# and leaves the activation alone, so the model is unchanged and only the probe learns.

# %%
probe = nn.Linear(32, 4)
fm.register_trainable_module("probe", probe)
model.requires_grad_(False)


def read_out(module, x, save_ctx, modules):
    save_ctx.probe_logits = modules["probe"](x[:, 0])
    return x


fm.register_forward_hook(flexmodel.HookFunction("blocks.0", editing_function=read_out, save=False))
opt = torch.optim.Adam(probe.parameters(), lr=0.05)
for epoch in range(60):
    opt.zero_grad()
    fm(train_x)
    loss = nn.functional.cross_entropy(fm.save_ctx.probe_logits, train_y)
    loss.backward()
    opt.step()
with torch.no_grad():
    fm(test_x)
    accuracy = (fm.save_ctx.probe_logits.argmax(-1) == test_y).float().mean().item()
print(f"probe on blocks.0's class token: train loss {loss.item():.3f}, held-out accuracy {accuracy:.2f}")
assert accuracy > 0.8, accuracy

# %% [markdown]
# ## 6. Restore
#
# `restore()` takes every hook off and gives the module back as it was.

# %%
assert fm.restore() is model
assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
with torch.no_grad():
    assert torch.equal(model(test_x[:8]), logits)
print(f"done in {time.time() - START:.1f} s")
