"""Small torch.nn.Modules of architectures flexmodel has no C++ model for (tests of the torch engine)."""
import torch
from torch import nn


class Block(nn.Module):
    """A pre-norm transformer block on nn.MultiheadAttention (whose output is a tuple)."""

    def __init__(self, d, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h = self.norm1(x)
        a, _ = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        x = x + a
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """Patches of a [B, C, H, W] image -> blocks -> class logits [B, classes]."""

    def __init__(self, image=8, patch=4, channels=3, d=16, heads=2, depth=2, classes=5):
        super().__init__()
        self.patch = patch
        self.embed = nn.Linear(channels * patch * patch, d)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, d) * 0.1)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.1)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images):
        b, c, _, _ = images.shape
        p = self.patch
        patches = images.unfold(2, p, p).unfold(3, p, p)            # [B, C, h, w, p, p]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)
        x = torch.cat([self.cls.expand(b, -1, -1), self.embed(patches)], 1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


class Twice(nn.Module):
    """Calls one submodule twice in a forward (its captures are a list of two)."""

    def __init__(self, d=6):
        super().__init__()
        self.shared = nn.Linear(d, d)
        self.out = nn.Linear(d, 3)

    def forward(self, x):
        return self.out(self.shared(torch.tanh(self.shared(x))))
