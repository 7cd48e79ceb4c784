"""TransformerLens hook names wherever a module name is (HookFunction, groups, tracing), on Transformers models
wrapped by flexmodel's engine, against what TransformerLens defines them as, computed here from Transformers
itself: blocks.L.hook_resid_pre is hidden_states[L] of output_hidden_states, hook_resid_post hidden_states[L + 1],
attn.hook_pattern the eager attention probabilities of output_attentions, attn.hook_q the q projection split into
heads, hook_embed the embedding lookup. Captures are stored under the name asked for."""
import pytest
import torch

import flexmodel
from conftest import assert_close
from test_from_transformers import hf_model

CASES = {"gpt2": "transformer.h", "llama": "model.layers"}


def reference(hf, ids):
    with torch.no_grad():
        return hf(input_ids=ids, use_cache=False, output_hidden_states=True, output_attentions=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_names_capture_what_transformer_lens_defines(case):
    hf = hf_model(case)
    n_layers = hf.config.num_hidden_layers
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(11))
    ref = reference(hf, ids)
    q_seen = {}
    q_proj = hf.get_submodule(f"{CASES[case]}.1.attn.c_attn" if case == "gpt2" else f"{CASES[case]}.1.self_attn.q_proj")
    handle = q_proj.register_forward_hook(lambda m, a, o: q_seen.update(q=o.detach().clone()))
    reference(hf, ids)
    handle.remove()

    out = {}
    fm = flexmodel.FlexModel(hf, out)
    assert fm.engine == "flexmodel"
    names = ["hook_embed", "blocks.1.attn.hook_q"]
    for layer in range(n_layers):
        names += [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.hook_resid_post", f"blocks.{layer}.attn.hook_pattern"]
    for name in names:
        fm.register_forward_hook(flexmodel.HookFunction(name))
    with torch.no_grad():
        fm(ids)
    assert set(out) == set(names), "captures are stored under the names asked for"
    for layer in range(n_layers):
        assert_close(out[f"blocks.{layer}.hook_resid_pre"], ref.hidden_states[layer], 1e-5, f"{case} resid_pre {layer}")
        if layer + 1 < n_layers:  # Transformers' last hidden state is after the final norm
            assert_close(out[f"blocks.{layer}.hook_resid_post"], ref.hidden_states[layer + 1], 1e-5,
                         f"{case} resid_post {layer}")
        assert_close(out[f"blocks.{layer}.attn.hook_pattern"], ref.attentions[layer], 1e-5, f"{case} pattern {layer}")
    heads = hf.config.num_attention_heads
    q = q_seen["q"][..., :hf.config.hidden_size] if case == "gpt2" else q_seen["q"]
    assert_close(out["blocks.1.attn.hook_q"], q.unflatten(-1, (heads, -1)), 1e-6, f"{case} hook_q")
    embed = hf.get_input_embeddings()(ids)
    assert_close(out["hook_embed"], embed, 0, f"{case} hook_embed")


def test_edits_groups_and_tracing_by_name():
    hf = hf_model("llama")
    ids = torch.randint(3, 96, (2, 9), generator=torch.Generator().manual_seed(12))
    vector = torch.randn(hf.config.hidden_size, generator=torch.Generator().manual_seed(13))
    handle = hf.model.layers[1].register_forward_hook(lambda m, a, o: (o[0] + vector,) + tuple(o[1:])
                                                      if isinstance(o, tuple) else o + vector)
    with torch.no_grad():
        want = hf(input_ids=ids, use_cache=False).logits
    handle.remove()
    ref = reference(hf, ids)

    out = {}
    fm = flexmodel.FlexModel(hf, out)
    steer = flexmodel.HookFunction("blocks.1.hook_resid_post", editing_function=lambda m, x, ctx, mods: x + vector)
    fm.register_forward_hook(steer)
    with torch.no_grad():
        got = fm(ids)
    assert_close(got, want, 1e-4, "steering blocks.1.hook_resid_post vs Transformers' layer 1 output + vector")
    assert_close(out["blocks.1.hook_resid_post"], ref.hidden_states[2], 1e-5, "captured before the edit")
    fm.restore()

    for layer in range(2):
        fm.register_forward_hook(flexmodel.HookFunction(f"blocks.{layer}.hook_resid_post"))
    fm.register_forward_hook(flexmodel.HookFunction("blocks.0.hook_mlp_out"))
    fm.update_hook_groups("hook_resid_post", "resid")
    assert {h.module_name for h in fm.get_group_hook_functions("resid")} == {"blocks.0.hook_resid_post",
                                                                              "blocks.1.hook_resid_post"}
    with torch.no_grad():
        fm(ids, groups="resid")
    assert set(out) == {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"}
    fm.restore()
    made = fm.create_hook_group("every_resid", r"blocks\.\d+\.hook_resid_pre", regex=True)
    assert [h.module_name for h in made] == [f"blocks.{i}.hook_resid_pre" for i in range(hf.config.num_hidden_layers)]
    with torch.no_grad():
        fm(ids, groups="every_resid")
    for i in range(hf.config.num_hidden_layers):
        assert_close(out[f"blocks.{i}.hook_resid_pre"], ref.hidden_states[i], 1e-5, f"group's blocks.{i}.hook_resid_pre")
    fm.restore()

    with torch.no_grad(), fm.trace(ids):
        h = fm.blocks[1].hook_resid_post.output.save()
        pattern = fm.blocks[0].attn.hook_pattern.output.save()
    assert_close(h, ref.hidden_states[2], 1e-5, "traced blocks[1].hook_resid_post")
    assert_close(pattern, ref.attentions[0], 1e-5, "traced blocks[0].attn.hook_pattern")


def test_names_without_a_value_are_typed_errors():
    fm = flexmodel.FlexModel(hf_model("llama"), {})
    with pytest.raises(flexmodel.UnsupportedError, match="blocks.0.attn.hook_attn_scores.*hook_pattern"):
        fm.register_forward_hook(flexmodel.HookFunction("blocks.0.attn.hook_attn_scores"))
    with pytest.raises(flexmodel.UnsupportedError, match="hook_pos_embed.*rotary"):
        fm.register_forward_hook(flexmodel.HookFunction("hook_pos_embed"))
    with pytest.raises(flexmodel.NotFoundError, match="blocks.0.hook_nonsense"):
        fm.register_forward_hook(flexmodel.HookFunction("blocks.0.hook_nonsense"))
    with pytest.raises(flexmodel.ConfigError, match="forward hook"):
        fm.register_forward_pre_hook(flexmodel.HookFunction("blocks.0.hook_resid_post"))
    # The torch engine runs PyTorch's modules: TransformerLens's names are not among them.
    torch_fm = flexmodel.FlexModel(hf_model("llama"), {}, engine="torch")
    with pytest.raises(flexmodel.NotFoundError):
        torch_fm.register_forward_hook(flexmodel.HookFunction("blocks.0.hook_resid_post"))


def test_capture_dataset_of_a_wrapped_transformers_model_by_name(tmp_path):
    """capture_dataset over FlexModel(hf_model) stores a TransformerLens-named hook under that name: every token's
    blocks.1.hook_resid_post is Transformers' hidden_states[2] at that token."""
    from safetensors.torch import save_file
    hf = hf_model("llama")
    ids = torch.randint(3, 96, (3, 16), generator=torch.Generator().manual_seed(14))
    save_file({"input_ids": ids}, str(tmp_path / "ids.safetensors"))
    fm = flexmodel.FlexModel(hf, {})
    flexmodel.capture_dataset(fm, tmp_path / "ids.safetensors", tmp_path / "acts", hooks=["blocks.1.hook_resid_post"],
                              context_len=8)
    data = flexmodel.ActivationDataset(tmp_path / "acts")
    batch = next(iter(data.loader(batch_tokens=len(data), shuffle=False)))
    contexts = ids.reshape(-1, 8)
    with torch.no_grad():
        want = hf(input_ids=contexts, output_hidden_states=True, use_cache=False).hidden_states[2]
    rows = want[batch["context"], batch["offset"]]
    assert torch.equal(batch["token_ids"], contexts[batch["context"], batch["offset"]])
    assert_close(batch["blocks.1.hook_resid_post"], rows, 1e-5, "stored blocks.1.hook_resid_post")
