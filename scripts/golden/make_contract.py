"""The hook contract's golden data: every named module's output in Transformers 5.23.

Run:  $(bash scripts/golden/setup.sh) scripts/golden/make_contract.py [OUT]
      (OUT defaults to tests/data/contract)

For each architecture of tests/data/golden5 (both manifests; the MXFP4 and FP8 variants are the
same modules as their plain cases and are left out), the tiny model's configuration is loaded by
Transformers 5.23, given new random weights with another seed than golden5's, and written by its
save_pretrained to OUT/<case>/. A forward hook on every named module of the model records what
Transformers gives it (element 0 of a tuple; a module called k times per forward also gives
NAME@k), on a batch of 3 rows of 11 tokens whose second and third rows are left-padded by 2
and 4: OUT/<case>.contract.safetensors holds input_ids, attention_mask, logits, "out.<module>"
for every one and "in.<module>" for what a forward pre-hook sees (the first tensor the module is
called with, positional or keyword), and OUT/manifest.json, per case, every named module with its class, output
shapes and dtype (modules whose output is no tensor, or that did not run, are listed too, with
why). tests/models/test_module_contract.cpp compares flexmodel's captures of every module with
them. Single-threaded and seeded: the same files on every run.
"""
import json
import os
import sys

import torch
import transformers as T
import accelerate
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_golden_zoo3 import randomize  # noqa: E402  (weights that keep activations O(1))

GOLDEN5 = os.path.join(HERE, "..", "..", "tests", "data", "golden5")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "tests", "data", "contract")
torch.set_num_threads(1)
T.logging.set_verbosity_error()
SKIP = {"gpt_oss_mxfp4": "the same modules as gpt_oss", "deepseek_v3_fp8": "the same modules as deepseek_v3",
        "gemma3": "multimodal: its text decoder is gemma3_text's"}


def batch(vocab):
    g = torch.Generator().manual_seed(20261127)
    ids = torch.randint(3, min(vocab, 96), (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    for row, pad in ((1, 2), (2, 4)):
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return ids, mask


def cases():
    for manifest in ("manifest.json", "manifest_zoo3.json"):
        with open(os.path.join(GOLDEN5, manifest)) as f:
            for name in json.load(f)["cases"]:
                if name not in SKIP:
                    yield name


def main():
    os.makedirs(OUT, exist_ok=True)
    manifest = {"transformers": T.__version__, "torch": torch.__version__, "accelerate": accelerate.__version__,
                "attn_implementation": "eager", "experts_implementation": "eager", "dtype": "float32",
                "forward_call": "model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)",
                "left_out": SKIP, "cases": {}}
    for i, name in enumerate(cases()):
        cfg = T.AutoConfig.from_pretrained(os.path.join(GOLDEN5, name))
        torch.manual_seed(7000 + i)
        model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
        randomize(model)
        if getattr(model.config.get_text_config(), "tie_word_embeddings", False):
            model.tie_weights()
        folder = os.path.join(OUT, name)
        model.save_pretrained(folder, safe_serialization=True)
        gen = os.path.join(folder, "generation_config.json")
        if os.path.exists(gen):
            os.remove(gen)
        # What a user gets: the checkpoint loaded back by from_pretrained.
        model = T.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                       experts_implementation="eager").eval()
        ids, mask = batch(model.config.get_text_config().vocab_size)
        outputs, inputs, calls, kinds, handles = {}, {}, {}, {}, []
        classes = {n: type(m).__name__ for n, m in model.named_modules() if n}
        for n, m in model.named_modules():
            if not n:
                continue

            def hook(_m, _inp, out, n=n):
                k = calls.get(n, 0)
                calls[n] = k + 1
                t = out[0] if isinstance(out, tuple) and out else out
                if isinstance(t, torch.Tensor):
                    outputs[n if k == 0 else f"{n}@{k}"] = t.detach().clone().contiguous()
                else:
                    kinds[n] = type(t).__name__
            handles.append(m.register_forward_hook(hook))

            # A pre-hook's view: the first tensor the module is called with, positional or keyword
            # (5.23 passes hidden_states by keyword to some modules), per call as the outputs.
            def pre_hook(_m, args, kwargs, n=n):
                k = calls.get(n, 0)  # the forward hook counts the call after this
                for v in list(args) + list(kwargs.values()):
                    if isinstance(v, torch.Tensor):
                        inputs[n if k == 0 else f"{n}@{k}"] = v.detach().clone().contiguous()
                        break
            handles.append(m.register_forward_pre_hook(pre_hook, with_kwargs=True))
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        for h in handles:
            h.remove()
        tensors = {"input_ids": ids, "attention_mask": mask, "logits": logits.contiguous()}
        tensors.update({"out." + k: v for k, v in outputs.items()})
        tensors.update({"in." + k: v for k, v in inputs.items()})
        save_file(tensors, os.path.join(OUT, name + ".contract.safetensors"), metadata={"format": "pt"})
        modules = {}
        for n, cls in classes.items():
            entry = {"class": cls, "calls": calls.get(n, 0)}
            if n in outputs:
                entry["shape"] = list(outputs[n].shape)
                entry["dtype"] = str(outputs[n].dtype).replace("torch.", "")
            elif n in kinds:
                entry["output"] = kinds[n]
            if n in inputs:
                entry["input_shape"] = list(inputs[n].shape)
            modules[n] = entry
        manifest["cases"][name] = {"class": type(model).__name__, "modules": modules}
        print(f"{name}: {len(classes)} modules, {len(outputs)} tensor outputs")
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
