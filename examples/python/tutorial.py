# %% [markdown]
# # flexmodel from Python: a short interpretability tutorial
#
# Run it top to bottom as a script, or cell by cell (`# %%`) in an editor that
# understands cells (VS Code, Jupyter's jupytext, Spyder):
#
#     python3 examples/python/tutorial.py [MODEL_DIR]
#
# MODEL_DIR is a GPT-2 folder from Hugging Face (config.json + safetensors).
# Without it we build a small GPT-2-shaped model with random weights (4 blocks,
# width 128, GPT-2's real vocabulary and tokenizer), so the numbers below are
# those of an untrained network: the *mechanics* are what this shows. Each
# step ends with an `assert` that would catch a broken engine.
#
# Steps: 1 load, 2 the module tree, 3 the residual stream, 4 activation
# patching, 5 steering generation, 6 a linear probe trained from Python.

# %%
import pathlib
import sys
import tempfile
import time

import torch

import flexmodel

REPO = pathlib.Path(__file__).resolve().parents[2]
GPT2_TOKENIZER = REPO / "tests" / "data" / "tokenizers" / "gpt2"   # GPT-2's vocab.json + merges.txt
START = time.time()
torch.manual_seed(0)
torch.set_grad_enabled(False)   # inference everywhere except the probe (step 6), which turns it back on

# %% [markdown]
# ## 1. Load a model
#
# `flexmodel.from_pretrained` reads a Hugging Face folder into the C++ engine.
# The default model is made with Transformers (random weights, fixed seed) and
# saved the way Hugging Face saves any GPT-2, so the same code loads both.


# %%
def make_small_gpt2(folder):
    """A 4-block GPT-2 with random weights, plus GPT-2's tokenizer files, in `folder`."""
    import shutil

    import transformers
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=50257)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(GPT2_TOKENIZER / name, folder)


if len(sys.argv) > 1:
    model_dir = pathlib.Path(sys.argv[1])
else:
    workdir = tempfile.TemporaryDirectory(prefix="flexmodel-tutorial-")   # removed when the script ends
    model_dir = pathlib.Path(workdir.name)
    make_small_gpt2(model_dir)

model = flexmodel.from_pretrained(model_dir)
config = model.config                      # config.json as a dict
assert config["model_type"] == "gpt2", f"this tutorial names GPT-2's modules; {model_dir} is a {config['model_type']}"
n_layer, d_model, vocab = config["n_layer"], config["n_embd"], config["vocab_size"]
print(model, f"- {n_layer} blocks, width {d_model}, vocabulary {vocab}")

# %% [markdown]
# flexmodel runs the model but not the tokenizer: we use Hugging Face's
# `tokenizers`. A folder with tokenizer.json or vocab.json + merges.txt brings
# its own; a folder without one but with GPT-2's vocabulary size gets GPT-2's
# files from tests/data. Anything else falls back to raw UTF-8 bytes as token
# ids (so the tutorial still runs on, e.g., the test fixtures' 256-token GPT-2).


# %%
def load_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    folder = pathlib.Path(folder)
    if (folder / "tokenizer.json").exists():
        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    if not (folder / "vocab.json").exists() and vocab == 50257:
        folder = GPT2_TOKENIZER
    if not (folder / "vocab.json").exists():
        return None
    tok = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)   # GPT-2's byte-level BPE
    tok.decoder = decoders.ByteLevel()
    return tok


tokenizer = load_tokenizer(model_dir)
if tokenizer is None:
    print(f"no tokenizer in {model_dir}: token ids are the UTF-8 bytes of the text (mod {vocab})")


def encode(text):
    return tokenizer.encode(text).ids if tokenizer else [b % vocab for b in text.encode()]


def decode(ids):
    ids = [int(i) for i in ids]
    return tokenizer.decode(ids) if tokenizer else bytes(i % 256 for i in ids).decode("utf-8", "replace")


def as_batch(ids):
    return torch.tensor([ids])     # [1, T]: the models take a batch of token ids


ids = as_batch(encode("When Mary and John went to the store, John gave a drink to"))
logits = model(ids)                # [1, T, vocab]: the C++ forward, no hooks
print("input", tuple(ids.shape), "-> logits", tuple(logits.shape))
assert logits.shape == (1, ids.shape[1], vocab) and torch.isfinite(logits).all()

# %% [markdown]
# ## 2. The module tree
#
# Module names are Transformers' (`transformer.h.0.attn`), plus flexmodel's
# hook points: `hook_resid_pre/mid/post` on each block and the attention's
# `hook_attn_probs` / `hook_head_out`. Every name can be hooked.

# %%
names = [name for name, _ in model.named_modules()]
print(f"{len(names)} modules; the first block's, indented by depth:")
for name in names:
    if name.startswith("transformer.h.0"):
        print("   " + "  " * name.count(".") + name)
outside_blocks = [n for n in names if n and not n.startswith("transformer.h.")]
print("outside the blocks:", ", ".join(outside_blocks))
assert f"transformer.h.{n_layer - 1}.mlp" in names and f"transformer.h.{n_layer}" not in names

params = dict(model.named_parameters())   # tensors sharing storage with the C++ model
print(f"{len(params)} parameters, {sum(p.numel() for p in params.values()) / 1e6:.1f}M numbers; block 0's:")
for name, p in params.items():
    if name.startswith("transformer.h.0."):
        print(f"   {name:38s} {tuple(p.shape)}")
assert params["transformer.wte.weight"].shape == (vocab, d_model)

# %% [markdown]
# ## 3. The residual stream at every block
#
# A `FlexModel` wraps the model; a `HookFunction` without an editing function
# only captures (in C++). `expected_shape` is checked at every call (`None`
# matches any size): a wrong guess is a `flexmodel.ShapeError`, not a silent
# misread. Captures land in the dict given to FlexModel, keyed by module name.

# %%
blocks = [f"transformer.h.{i}" for i in range(n_layer)]
T = ids.shape[1]
captured = {}
fm = flexmodel.FlexModel(model, captured)
for name in blocks:
    fm.register_forward_hook(flexmodel.HookFunction(name, expected_shape=(None, None, d_model)))
hooked_logits = fm(ids)
fm.restore()          # removes the hooks: the model is as it was

print("mean |residual| per position after each block:")
norms = [captured[name][0].norm(dim=-1).mean().item() for name in blocks]
for name, norm in zip(blocks, norms):
    print(f"   {name:18s} {norm:8.2f}  " + "#" * round(30 * norm / max(norms)))
assert all(captured[name].shape == (1, T, d_model) for name in blocks)
assert torch.equal(hooked_logits, logits), "capture-only hooks must not change the output"

# %%
# Hook groups: create_hook_group hooks every module whose name contains a text (or, with regex=True,
# matches a pattern) under one tag; forward(groups=...) then runs only the hooks of those groups.
out = {}
fm = flexmodel.FlexModel(model, out)
fm.create_hook_group("mlps", r"transformer\.h\.\d+\.mlp", regex=True)
fm.create_hook_group("attns", r"transformer\.h\.\d+\.attn", regex=True)
fm(ids, groups="mlps")
fm.restore()
print("groups='mlps' captured:", ", ".join(out))
assert sorted(out) == [f"transformer.h.{i}.mlp" for i in range(n_layer)]

# %%
# The shape check in action: claim the block is 7 wide.
fm = flexmodel.FlexModel(model, {})
fm.register_forward_hook(flexmodel.HookFunction(blocks[0], expected_shape=(None, None, 7)))
try:
    fm(ids)
    raise AssertionError("a wrong expected_shape went unnoticed")
except flexmodel.ShapeError as e:
    print("ShapeError:", str(e).splitlines()[0][:110])
finally:
    fm.restore()

# %% [markdown]
# ## 4. Activation patching
#
# Indirect-object identification: the clean prompt should continue with
# " Mary", the corrupted one (one name swapped) with " John". We run the clean
# prompt once and keep every block's output, then re-run the corrupted prompt
# with ONE block's output at ONE position replaced by the clean one, and ask how
# much of the clean logit difference, logit(Mary) - logit(John) at the last
# position, comes back: 0 = none (corrupted), 1 = all (clean).

# %%
clean = as_batch(encode("When Mary and John went to the store, John gave a drink to"))
corrupt = as_batch(encode("When Mary and John went to the store, Mary gave a drink to"))
assert clean.shape == corrupt.shape, "patching position by position needs prompts of one length"
# The two answers' first differing tokens (single tokens " Mary" / " John" with GPT-2's tokenizer).
mary, john = next((a, b) for a, b in zip(encode(" Mary"), encode(" John")) if a != b)


def logit_diff(logits):
    return (logits[0, -1, mary] - logits[0, -1, john]).item()


captured = {}
fm = flexmodel.FlexModel(model, captured)
for name in blocks:
    fm.register_forward_hook(flexmodel.HookFunction(name, expected_shape=(1, T, d_model)))
clean_logits = fm(clean)
fm.restore()
clean_acts = {name: captured[name] for name in blocks}
clean_ld, corrupt_ld = logit_diff(clean_logits), logit_diff(model(corrupt))
print(f"logit(Mary) - logit(John): clean {clean_ld:+.4f}, corrupted {corrupt_ld:+.4f}")


def patch_each_position(source):
    """An editing function: row p of the batch gets position p of `source` (the clean run).

    It runs inside the C++ hook and gets (module, activation, save_ctx, trainable modules);
    what it returns replaces the activation for the rest of the forward."""
    def edit(module, x, save_ctx, modules):
        x = x.clone()
        rows = torch.arange(x.shape[0])
        x[rows, rows] = source[0, rows]
        return x
    return edit


def patched_logits(name, editing_function, input_ids):
    fm = flexmodel.FlexModel(model, {})
    fm.register_forward_hook(flexmodel.HookFunction(name, editing_function=editing_function, save=False))
    try:
        return fm(input_ids)
    finally:
        fm.restore()


# One patched run per (block, position). The T runs of one block go as one batch of T copies of the
# corrupted prompt, row p patched at position p: the same numbers as T separate runs, T times fewer calls.
recovered = torch.zeros(n_layer, T)
for layer, name in enumerate(blocks):
    batch_logits = patched_logits(name, patch_each_position(clean_acts[name]), corrupt.repeat(T, 1))
    ld = batch_logits[:, -1, mary] - batch_logits[:, -1, john]                  # [T]: one per patched position
    recovered[layer] = (ld - corrupt_ld) / (clean_ld - corrupt_ld)

tokens = [decode([t]).strip()[:5] for t in clean[0].tolist()]
print("fraction of the logit difference recovered (rows: block, columns: position patched)")
print(" " * 7 + "".join(f"{t:>6s}" for t in tokens))
for layer in range(n_layer):
    print(f"h.{layer:<4d}" + "".join(f"{v:6.2f}".replace("-0.00", " 0.00") for v in recovered[layer].tolist()))

# Checks. Before the first differing token the two runs are identical, so patching there does nothing;
# the last block at the last position is all the final logits read, so it recovers everything.
first_diff = int((clean[0] != corrupt[0]).nonzero()[0])
assert recovered[:, :first_diff].abs().max() < 1e-3, recovered[:, :first_diff]
assert abs(recovered[-1, -1] - 1) < 1e-3, recovered[-1, -1]
# Patching the whole of any block (here with the built-in edit, which runs in C++) gives the clean logits.
for name in blocks:
    whole = patched_logits(name, flexmodel.edits.patch(clean_acts[name]), corrupt)
    assert torch.equal(whole, clean_logits), name
print("patching a whole block gives the clean logits exactly: ok")

# %% [markdown]
# ## 5. Steering generation
#
# A steering vector: the mean output of a middle block on one prompt minus
# that on a contrasting prompt. `model.generate(steer={block: (vector, alpha)})`
# adds alpha * vector to the block's output at every position of every step
# (the built-in `flexmodel.edits.steer`, in C++).

# %%
middle = blocks[n_layer // 2]


def mean_activation(text):
    out = {}
    fm = flexmodel.FlexModel(model, out)
    fm.register_forward_hook(flexmodel.HookFunction(middle))
    fm(as_batch(encode(text)))
    fm.restore()
    return out[middle][0].mean(0)          # [d_model]: averaged over positions


vector = mean_activation("love love love happy joy") - mean_activation("hate hate hate sad anger")
alpha = 8.0
prompt = as_batch(encode("I think that you are"))
plain = model.generate(prompt, max_new_tokens=12)
steered = model.generate(prompt, max_new_tokens=12, steer={middle: (vector, alpha)})
print(f"steering {middle} with alpha {alpha} (vector norm {vector.norm():.2f})")
print("   plain:  ", repr(decode(prompt[0])), "->", repr(decode(plain[0, prompt.shape[1]:])))
print("   steered:", repr(decode(prompt[0])), "->", repr(decode(steered[0, prompt.shape[1]:])))
assert torch.equal(plain[:, :prompt.shape[1]], prompt) and plain.shape == (1, prompt.shape[1] + 12)
assert not torch.equal(plain, steered), "steering changed nothing"
# The built-in edit is just `x + alpha * vector`: the same edit written in Python gives the same logits.
by_python = patched_logits(middle, lambda module, x, save_ctx, modules: x + alpha * vector, prompt)
by_builtin = patched_logits(middle, flexmodel.edits.steer(vector, alpha), prompt)
assert torch.allclose(by_python, by_builtin, atol=1e-5)

# %% [markdown]
# ## 6. A linear probe, trained from Python
#
# Question: does the residual stream after a middle block still say whether
# the current token is an animal word? A `torch.nn.Linear` registered with
# `register_trainable_module` is handed to the editing function (`modules`);
# the function keeps the probe's prediction in `save_ctx` and returns the
# activation unchanged; the loss and the optimizer are plain PyTorch. The model's own weights are frozen
# (`wrapped_module_requires_grad(False)`): only the probe learns.

# %%
torch.set_grad_enabled(True)
animals = [" cat", " dog", " horse", " cow", " bird", " fish", " mouse", " sheep"]
others = [" table", " red", " run", " the", " of", " house", " blue", " seven", " and", " tree"]
animal_ids = {t for w in animals for t in encode(w)}
pool = torch.tensor(sorted({t for w in animals + others for t in encode(w)}))
is_animal = torch.tensor([t in animal_ids for t in pool.tolist()])


def sample(rows, length, generator):
    """Random sequences of words from the pool, and per token: 1 if it belongs to an animal word."""
    choice = torch.randint(len(pool), (rows, length), generator=generator)
    return pool[choice], is_animal[choice].long()


gen = torch.Generator().manual_seed(0)
train_ids, train_labels = sample(16, 12, gen)
test_ids, test_labels = sample(16, 12, gen)

before = {n: p.detach().clone() for n, p in model.named_parameters()}
fm = flexmodel.FlexModel(model, {})
fm.wrapped_module_requires_grad(False)
fm.register_trainable_module("probe", torch.nn.Linear(d_model, 2))


def probe_edit(module, x, save_ctx, modules):
    save_ctx.logits = modules["probe"](x.reshape(-1, d_model))   # [rows * length, 2]
    return x                                                      # the forward goes on unchanged


fm.register_forward_hook(flexmodel.HookFunction(middle, editing_function=probe_edit, save=False))
optimizer = torch.optim.Adam(fm.trainable_modules.parameters(), lr=0.1)
losses = []
for step in range(40):
    optimizer.zero_grad()
    fm(train_ids)
    loss = torch.nn.functional.cross_entropy(fm.save_ctx.logits, train_labels.flatten())
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
with torch.no_grad():
    fm(test_ids)
    accuracy = (fm.save_ctx.logits.argmax(-1) == test_labels.flatten()).float().mean().item()
fm.restore()
majority = max(test_labels.float().mean().item(), 1 - test_labels.float().mean().item())   # the best constant answer
print(f"probe on {middle}: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps; "
      f"held-out accuracy {accuracy:.1%} (majority class: {majority:.1%})")
assert losses[-1] < 0.5 * losses[0], losses
assert accuracy > majority, "the probe does no better than a constant answer"
unchanged = all(torch.equal(p, before[n]) and p.grad is None for n, p in model.named_parameters())
print("model weights unchanged, no gradients on them:", unchanged)
assert unchanged

# %%
print(f"tutorial done in {time.time() - START:.1f} s")
