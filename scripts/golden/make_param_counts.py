"""Parameter counts of the published configurations in tests/data/configs, by Transformers 5.23.

Run:  $(bash scripts/golden/setup.sh) scripts/golden/make_param_counts.py [CONFIGS]
      (CONFIGS defaults to tests/data/configs; writes CONFIGS/param_counts.json)

Each config.json is read by 5.23 (AutoConfig, the native classes: auto_map is ignored) and the
model is built on the meta device, without its quantization_config (so MXFP4 / FP8 models count
as their dequantized form). Recorded per model:
- num_parameters: 5.23's model.num_parameters(), i.e. the sum of numel over model.parameters(),
  which yields a parameter shared by several modules once (tied lm_head / embed_tokens count once);
- num_parameters_untied: the same plus the tied copies counted again (what a checkpoint storing
  lm_head separately would hold);
- num_parameters_exclude_embeddings: model.num_parameters(exclude_embeddings=True);
- persistent_buffers: the numel of persistent buffers (not parameters; e.g. DeepSeek-V3's
  e_score_correction_bias), listed apart.
"""
import json
import os
import sys

import torch
import transformers as T

CONFIGS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "configs")
T.logging.set_verbosity_error()


def build(cls, cfg):
    with torch.device("meta"):
        if cls is None:
            return T.AutoModelForCausalLM.from_config(cfg)
        return cls(cfg)


def counts(model):
    seen, untied = set(), 0
    for _, p in model.named_parameters(remove_duplicate=False):
        untied += p.numel()
    persistent = 0
    for mod_name, mod in model.named_modules():
        for b_name, b in mod.named_buffers(recurse=False):
            if b_name not in mod._non_persistent_buffers_set:
                persistent += b.numel()
    return {
        "class": type(model).__name__,
        "num_parameters": model.num_parameters(),
        "num_parameters_untied": untied,
        "num_parameters_exclude_embeddings": model.num_parameters(exclude_embeddings=True),
        "persistent_buffers": persistent,
    }


def main():
    out = {"transformers": T.__version__, "torch": torch.__version__,
           "method": "config.json read by 5.23's AutoConfig without quantization_config; model built with "
                     "torch.device('meta'); num_parameters = model.num_parameters() (tied parameters once)",
           "models": {}}
    for name in sorted(os.listdir(CONFIGS)):
        path = os.path.join(CONFIGS, name, "config.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            raw = json.load(f)
        quant = raw.pop("quantization_config", None)
        raw.pop("auto_map", None)
        cfg = T.AutoConfig.for_model(**raw)
        entry = {"model_type": raw["model_type"], "dequantized_from": quant["quant_method"] if quant else None}
        if raw["model_type"] == "gemma3":
            entry["full"] = counts(build(T.Gemma3ForConditionalGeneration, cfg))
            entry["text_only"] = counts(build(T.Gemma3ForCausalLM, cfg.text_config))
        else:
            entry.update(counts(build(None, cfg)))
        out["models"][name] = entry
        print(name, json.dumps(entry))
    with open(os.path.join(CONFIGS, "param_counts.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
