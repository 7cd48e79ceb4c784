"""Probes train from Python: a torch.nn.Module registered as trainable, applied in an editing function,
loss.backward() through the C++ model's graph, a torch optimizer; the model's parameters stay bitwise unchanged."""
import torch

import flexmodel
from conftest import DATA


def test_linear_probe_trains_and_leaves_the_model_unchanged():
    torch.manual_seed(0)
    model = flexmodel.from_pretrained(DATA / "models" / "llama")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    fm = flexmodel.FlexModel(model, {})
    fm.wrapped_module_requires_grad(False)
    d = model.config["hidden_size"]
    fm.register_trainable_module("probe", torch.nn.Linear(d, 2))
    # Task: is the token id even? Read from the residual stream after layer 0.
    ids = torch.randint(0, model.config["vocab_size"], (8, 12))
    labels = (ids % 2).flatten()

    def probe(module, x, save_ctx, modules):
        save_ctx.loss = torch.nn.functional.cross_entropy(modules["probe"](x.reshape(-1, d)), labels)
        return x

    fm.register_forward_hook(flexmodel.HookFunction("model.layers.0", editing_function=probe))
    opt = torch.optim.Adam(fm.trainable_modules.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        fm(ids)
        fm.save_ctx.loss.backward()
        opt.step()
        losses.append(fm.save_ctx.loss.item())
    assert losses[-1] < 0.7 * losses[0], f"probe loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), f"model parameter {n} changed"
        assert p.grad is None, f"model parameter {n} got a gradient"


def test_gradients_flow_through_the_cpp_model_to_an_edit_below():
    # A trainable scale applied at layer 0; a loss on the logits reaches it through every later C++ module.
    torch.manual_seed(1)
    model = flexmodel.from_pretrained(DATA / "models" / "gpt2")
    fm = flexmodel.FlexModel(model, {})
    fm.wrapped_module_requires_grad(False)
    scale = torch.nn.Parameter(torch.tensor(1.0))
    fm.register_forward_hook(flexmodel.HookFunction("transformer.h.0", editing_function=lambda m, x, c, mods: x * scale))
    ids = torch.randint(0, 256, (1, 5))
    fm(ids).sum().backward()
    g = scale.grad.item()
    # Finite difference through the same C++ model.
    eps = 1e-2
    with torch.no_grad():
        scale.fill_(1 + eps)
        up = fm(ids).sum().item()
        scale.fill_(1 - eps)
        down = fm(ids).sum().item()
    assert abs(g - (up - down) / (2 * eps)) <= 1e-2 * max(1.0, abs(g)), (g, (up - down) / (2 * eps))
