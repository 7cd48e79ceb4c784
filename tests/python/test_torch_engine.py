"""FlexModel over any torch.nn.Module (the "torch" engine): captures, edits, pre-hooks, tuple outputs,
groups, gradients, probes, errors and restore(), each compared with plain PyTorch hooks or a manual
computation on the same module."""
import pytest
import torch
from torch import nn

import flexmodel
from conftest import assert_close
from tiny_modules import TinyViT, Twice


@pytest.fixture
def vit():
    torch.manual_seed(0)
    return TinyViT().eval()


@pytest.fixture
def images():
    g = torch.Generator().manual_seed(1)
    return torch.randn(3, 3, 8, 8, generator=g)


def first_tensor(v):
    if isinstance(v, torch.Tensor):
        return v
    for x in v:
        t = first_tensor(x)
        if t is not None:
            return t
    return None


def plain_capture(module, inputs):
    """Every named module's output (first tensor, as unpack_idx=0) by plain PyTorch forward hooks."""
    got, handles = {}, []
    for name, m in module.named_modules():
        if name:
            handles.append(m.register_forward_hook(
                lambda mod, a, out, name=name: got.setdefault(name, []).append(first_tensor(out).detach().clone())))
    with torch.no_grad():
        out = module(inputs)
    for h in handles:
        h.remove()
    return out, got


def test_engine_and_every_module_capture_equals_plain_hooks(vit, images):
    ref_out, ref = plain_capture(vit, images)
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    assert fm.engine == "torch" and isinstance(fm, flexmodel.FlexModel)
    fm.create_hook_group("every", "")
    with torch.no_grad():
        logits = fm(images)
    assert_close(logits, ref_out, 0, "logits with capture hooks")
    assert sorted(out) == sorted(ref), sorted(set(out) ^ set(ref))
    for key, want in ref.items():
        got = out[key]
        assert got.device.type == "cpu"
        assert_close(got, want[0], 0, key)
    assert len(out) >= 15  # every module that runs (ModuleList and attn.out_proj are never called)


def test_flexmodel_engine_reports_its_engine(data):
    fm = flexmodel.FlexModel(flexmodel.from_pretrained(data / "models" / "gpt2"), {})
    assert fm.engine == "flexmodel"


def test_module_called_twice_gives_a_list():
    torch.manual_seed(0)
    m = Twice()
    x = torch.randn(2, 6)
    _, ref = plain_capture(m, x)
    out = {}
    fm = flexmodel.FlexModel(m, out)
    fm.register_forward_hook(flexmodel.HookFunction("shared", expected_shape=(None, 6)))
    with torch.no_grad():
        fm(x)
    assert isinstance(out["shared"], list) and len(out["shared"]) == 2
    for i in range(2):
        assert_close(out["shared"][i], ref["shared"][i], 0, f"shared call {i}")


def test_edit_equals_a_plain_forward_hook_edit(vit, images):
    steer = torch.linspace(-1, 1, 16)

    def edit(x):
        y = x * 0.5 + steer
        y[:, 0] = 0.0
        return y
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    seen = {}

    def editing_function(module, x, save_ctx, modules):
        seen["module"] = module
        save_ctx.calls = getattr(save_ctx, "calls", 0) + 1
        return edit(x.clone())
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.mlp", expected_shape=(3, None, 16),
                                                    editing_function=editing_function))
    after = flexmodel.HookFunction("blocks.0.mlp.2", save_after_edit=True,
                                   editing_function=lambda m, x, ctx, mods: x + 1.0)
    fm.register_forward_hook(after)
    with torch.no_grad():
        got = fm(images)
    assert seen["module"] is vit.blocks[0].mlp and fm.save_ctx.calls == 1
    fm.restore()
    # The inner edit (x + 1 at mlp.2) runs before the outer one, which sees it: reproduce both.
    hs = [vit.blocks[0].mlp[2].register_forward_hook(lambda m, a, o: o + 1.0),
          vit.blocks[0].mlp.register_forward_hook(lambda m, a, o: edit(o.clone()))]
    with torch.no_grad():
        want = vit(images)
    for x in hs:
        x.remove()
    assert_close(got, want, 1e-6, "logits after two edits")
    # save_after_edit: mlp.2's capture is after its +1; mlp's capture is before its edit.
    _, ref = plain_capture(vit, images)
    assert_close(out["blocks.0.mlp.2"], ref["blocks.0.mlp.2"][0] + 1.0, 1e-6, "save_after_edit")
    assert_close(out["blocks.0.mlp"], ref["blocks.0.mlp"][0] + 1.0, 1e-6, "capture before the edit")


def test_pre_hook_key_capture_and_edit(vit, images):
    ref_in = {}
    h = vit.blocks[1].register_forward_pre_hook(lambda m, a: ref_in.update(x=a[0].detach().clone()))
    with torch.no_grad():
        vit(images)
    h.remove()
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    fm.register_forward_pre_hook(flexmodel.HookFunction("blocks.1", editing_function=lambda m, x, c, mods: x * 0.0))
    with torch.no_grad():
        got = fm(images)
    assert list(out) == ["blocks.1#input"]
    assert_close(out["blocks.1#input"], ref_in["x"], 0, "pre-hook capture")
    h = vit.blocks[1].register_forward_pre_hook(lambda m, a: (a[0] * 0.0,))
    with torch.no_grad():
        want = vit(images)
    h.remove()
    assert_close(got, want, 1e-6, "logits after zeroing blocks.1's input")


def test_unpack_idx_on_a_tuple_output(vit, images):
    ref = {}
    h = vit.blocks[0].attn.register_forward_hook(lambda m, a, o: ref.update(out=o[0].clone(), w=o[1].clone()))
    with torch.no_grad():
        clean = vit(images)
    h.remove()
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.attn", expected_shape=(3, 2, 5, 5), unpack_idx=1))
    fm.register_forward_hook(flexmodel.HookFunction("blocks.1.attn", unpack_idx=0,
                                                    editing_function=lambda m, x, c, mods: torch.zeros_like(x)))
    with torch.no_grad():
        got = fm(images)
    assert_close(out["blocks.0.attn"], ref["w"], 0, "attention weights (unpack_idx=1)")
    h = vit.blocks[1].attn.register_forward_hook(lambda m, a, o: (torch.zeros_like(o[0]), o[1]))
    with torch.no_grad():
        want = vit(images)
    h.remove()
    assert_close(got, want, 1e-6, "logits with blocks.1.attn's output zeroed")
    assert (got - clean).abs().max() > 1e-4
    fm.restore()
    fm = flexmodel.FlexModel(vit, {})
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.attn", unpack_idx=2))
    with pytest.raises(flexmodel.NotFoundError, match="unpack_idx 2.*only 2"):
        fm(images)


def test_typed_errors_name_the_module(vit, images):
    fm = flexmodel.FlexModel(vit, {})
    with pytest.raises(flexmodel.NotFoundError, match="blocks.7.mlp") as e:
        fm.register_forward_hook(flexmodel.HookFunction("blocks.7.mlp"))
    assert "'blocks.0.mlp'" in str(e.value) or "'blocks.1.mlp'" in str(e.value), str(e.value)
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.mlp", expected_shape=(3, None, 17)))
    with pytest.raises(flexmodel.ShapeError, match=r"blocks.0.mlp.*\[3, 5, 16\].*\[3, \*, 17\]"):
        fm(images)
    fm.restore()

    def raises(m, x, ctx, mods):
        raise KeyError("no such feature")
    fm.register_forward_hook(flexmodel.HookFunction("blocks.1", editing_function=raises))
    with pytest.raises(flexmodel.EditingFunctionError, match="blocks.1.*KeyError") as e:
        fm(images)
    assert isinstance(e.value.__cause__, KeyError)
    fm.restore()
    fm.register_forward_hook(flexmodel.HookFunction("blocks.1", editing_function=lambda m, x, c, mods: x[:, :2]))
    with pytest.raises(flexmodel.ShapeError, match="blocks.1.*returned shape"):
        fm(images)
    fm.restore()
    with pytest.raises(flexmodel.NotFoundError, match="no hook group named 'nope'"):
        fm(images, groups="nope")
    with pytest.raises(flexmodel.NotFoundError, match="hook group 'g'"):
        fm.create_hook_group("g", "no_such_module")
    with pytest.raises(flexmodel.NotFoundError, match="parameter"):
        fm.get_module_parameter("head.wieght")
    with pytest.raises(flexmodel.ShapeError):
        fm.get_module_parameter("head.weight", expected_shape=(5, 17))
    assert_close(fm.get_module_parameter("head.weight", expected_shape=(5, None)), vit.head.weight, 0, "param")
    with pytest.raises(flexmodel.UnsupportedError, match="pipeline"):
        flexmodel.FlexModel(vit, {}, pipeline_parallel_size=2)
    with pytest.raises(flexmodel.ConfigError, match="torch.distributed"):
        flexmodel.FlexModel(vit, {}, data_parallel_size=2)
    with pytest.raises(flexmodel.ConfigError, match="got builtins.str.*any torch.nn.Module"):
        flexmodel.FlexModel("gpt2", {})
    with pytest.raises(flexmodel.UnsupportedError, match="Python editing function"):
        fm.register_forward_hook(flexmodel.HookFunction("head", editing_function=flexmodel.edits.ablate()))


def test_groups_and_complement(vit, images):
    _, ref = plain_capture(vit, images)
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    mlps = fm.create_hook_group("mlps", "mlp")
    norms = fm.create_hook_group("norms", r"blocks\.\d+\.norm\d", regex=True)
    assert {h.module_name for h in norms} == {"blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1", "blocks.1.norm2"}
    head = flexmodel.HookFunction("head")
    fm.register_forward_hook(head)
    with torch.no_grad():
        fm(images, groups="mlps")
    assert sorted(out) == sorted(h.module_name for h in mlps)
    with torch.no_grad():
        fm(images, groups=["mlps", "norms"], complement=True)
    assert sorted(out) == ["head"]
    fm.update_hook_groups(head, "mlps")
    fm.update_hook_groups("norm1", "firsts")
    assert fm.get_hook_function_groups(head) == {"all", "mlps"}
    assert {h.module_name for h in fm.get_group_hook_functions("firsts")} == {"blocks.0.norm1", "blocks.1.norm1"}
    with torch.no_grad():
        fm(images, groups="firsts")
    assert sorted(out) == ["blocks.0.norm1", "blocks.1.norm1"]
    assert_close(out["blocks.1.norm1"], ref["blocks.1.norm1"][0], 0, "group capture")
    fm.remove_hook_groups(head, "mlps")
    with torch.no_grad():
        fm(images, groups="mlps")
    assert "head" not in out and "blocks.0.mlp" in out
    with torch.no_grad():
        vit(images)  # called directly: the hooks of the last forward's groups run (as in flexmodel's engine)
    assert sorted(fm.take_captures()) == sorted(out)
    with pytest.raises(flexmodel.ConfigError):
        fm.remove_hook_groups(head, "all")


def test_restore_gives_back_the_untouched_module(vit, images):
    with torch.no_grad():
        clean = vit(images)
    fm = flexmodel.FlexModel(vit, {})
    fm.create_hook_group("every", "", editing_function=lambda m, x, c, mods: x * 1.5)
    fm.register_forward_pre_hook(flexmodel.HookFunction("blocks.0"))
    with torch.no_grad():
        assert (fm(images) - clean).abs().max() > 1e-3
    assert fm.restore() is vit
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in vit.modules())
    with torch.no_grad():
        assert torch.equal(vit(images), clean)


def test_gradient_hooks_equal_plain_autograd(vit, images):
    ref = {}
    h = vit.blocks[1].mlp.register_full_backward_hook(lambda m, gi, go: ref.update(gi=gi[0].clone(), go=go[0].clone()))
    vit.zero_grad()
    vit(images).square().sum().backward()
    h.remove()
    want_grad = vit.head.weight.grad.clone()
    vit.zero_grad()
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    fm.register_full_backward_hook(flexmodel.HookFunction("blocks.1.mlp"))
    fm.register_full_backward_pre_hook(flexmodel.HookFunction("blocks.1.mlp"))
    fm.register_hook(flexmodel.HookFunction("head.weight"))
    fm(images).square().sum().backward()
    got = fm.take_captures()  # the backward ran after forward returned
    assert_close(got["blocks.1.mlp#grad_input"][0], ref["gi"], 1e-6, "grad_input")
    assert_close(got["blocks.1.mlp#grad_output"][0], ref["go"], 1e-6, "grad_output")
    assert_close(got["head.weight#grad"][0], want_grad, 1e-6, "parameter gradient")


def test_probe_trained_through_editing_function_equals_plain_training(vit, images):
    labels = torch.tensor([0, 1, 2])

    def train(get_features, steps=5):
        torch.manual_seed(3)
        probe = nn.Linear(16, 3)
        opt = torch.optim.SGD(probe.parameters(), lr=0.5)
        for _ in range(steps):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(probe(get_features(probe)), labels)
            loss.backward()
            opt.step()
        return probe

    def plain(probe):
        got = {}
        h = vit.blocks[0].register_forward_hook(lambda m, a, o: got.update(x=o.detach()[:, 0]))
        with torch.no_grad():
            vit(images)
        h.remove()
        return got["x"]
    want = train(plain)

    vit.requires_grad_(False)
    fm = flexmodel.FlexModel(vit, {})
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0", save=False, editing_function=lambda m, x, ctx, mods:
                                                    (setattr(ctx, "logits", mods["probe"](x[:, 0])), x)[1]))

    torch.manual_seed(3)
    probe = nn.Linear(16, 3)
    fm.register_trainable_module("probe", probe)
    assert "probe" in fm.all_modules_names
    opt = torch.optim.SGD(probe.parameters(), lr=0.5)
    for _ in range(5):
        opt.zero_grad()
        fm(images)
        nn.functional.cross_entropy(fm.save_ctx.logits, labels).backward()
        opt.step()
    vit.requires_grad_(True)
    assert_close(probe.weight, want.weight, 1e-6, "probe weight")
    assert_close(probe.bias, want.bias, 1e-6, "probe bias")


def test_transformers_model_wrapped_as_a_torch_module():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=32,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids, output_hidden_states=True)
    out = {}
    fm = flexmodel.FlexModel(hf, out, engine="torch")  # GPT-2 would run in flexmodel's engine without it
    assert fm.engine == "torch"
    fm.register_forward_hook(flexmodel.HookFunction("transformer.h.0", expected_shape=(2, 7, 32)))
    fm.register_forward_hook(flexmodel.HookFunction("transformer.h.1.attn", unpack_idx=0))
    with torch.no_grad():
        got = fm(ids)
    assert_close(got.logits, ref.logits, 0, "logits")
    assert_close(out["transformer.h.0"], ref.hidden_states[1], 0, "transformer.h.0 vs hidden_states[1]")
    assert out["transformer.h.1.attn"].shape == (2, 7, 32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available() is False)")
def test_a_cuda_module_gives_cpu_captures_and_edits_on_the_device(images):
    torch.manual_seed(0)
    vit = TinyViT().eval().cuda()
    x = images.cuda()
    ref = {}
    h = vit.blocks[0].mlp.register_forward_hook(lambda m, a, o: ref.update(mlp=o.detach().cpu()))
    with torch.no_grad():
        vit(x)
    h.remove()
    out = {}
    fm = flexmodel.FlexModel(vit, out)
    seen = {}
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.mlp"))
    fm.register_forward_hook(flexmodel.HookFunction("blocks.1", save=False, editing_function=lambda m, t, c, mods:
                                                    (seen.update(device=t.device.type), t * 0.0)[1]))
    with torch.no_grad():
        logits = fm(x)
    assert out["blocks.0.mlp"].device.type == "cpu" and seen["device"] == "cuda"
    assert_close(out["blocks.0.mlp"], ref["mlp"], 0, "capture of a CUDA module")
    fm.restore()
    h = vit.blocks[1].register_forward_hook(lambda m, a, o: o * 0.0)
    with torch.no_grad():
        want = vit(x)
    h.remove()
    assert_close(logits.cpu(), want.cpu(), 1e-6, "logits with blocks.1 zeroed on the device")
