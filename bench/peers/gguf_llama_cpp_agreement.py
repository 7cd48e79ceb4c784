"""llama.cpp's own reading of the test GGUFs, as a check that they are laid
out as llama.cpp expects (tests compare flexmodel with Transformers on
gguf-py's weights; this compares llama.cpp with the same reference).

For each tests/data/gguf/<arch>-tiny-q8_0.gguf written by
scripts/golden/make_gguf_archs.py: llama-cpp-python (pinned by
install-deps.sh --bench) evaluates the golden input ids with logits for every
position; printed: the largest |llama.cpp - Transformers| relative to the
largest logit, and how many positions' argmax agree. llama.cpp quantizes
activations to 8 bits for Q8_0 matrices, so ~1-4 % is its own rounding; a
misplaced tensor or an undone rewrite gives differences of order 100 %.

Then vocab-spm.gguf and vocab-gemma-spm.gguf: llama.cpp's tokenization of the golden strings against
Transformers' ids (the tokenizers_gguf_vocab reference), listing the strings
where the two differ.

    python bench/peers/gguf_llama_cpp_agreement.py
"""
import json
import os

import numpy as np
from llama_cpp import Llama
from safetensors.numpy import load_file

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "gguf")
ARCHS = ["gemma3", "olmo2", "gpt2", "gptneox", "qwen2moe", "qwen3moe", "deepseek2", "deepseek2-v3"]


def logits_agreement(arch):
    ref = load_file(os.path.join(DATA, f"{arch}-tiny-q8_0.logits.safetensors"))
    ids = ref["input_ids"][0].tolist()
    llm = Llama(model_path=os.path.join(DATA, f"{arch}-tiny-q8_0.gguf"), n_ctx=64, n_batch=64, logits_all=True,
                verbose=False, n_threads=2)
    llm.eval(ids)
    got = np.array(llm.scores[:len(ids)], dtype=np.float32)
    want = ref["logits"][0]
    scale = float(np.abs(want).max())
    diff = float(np.abs(got - want).max())
    agree = int((got.argmax(-1) == want.argmax(-1)).sum())
    print(f"{arch:10s} max|llama.cpp - Transformers| {diff:.3g} = {diff / scale:.2%} of max|logit| {scale:.3g}; "
          f"argmax agrees at {agree}/{len(ids)} positions")


def spm_agreement(name):
    e = json.load(open(os.path.join(DATA, f"{name}.expected.json"), encoding="utf-8"))
    llm = Llama(model_path=os.path.join(DATA, f"{name}.gguf"), vocab_only=True, verbose=False)
    same = 0
    for s, ids in zip(e["strings"], e["ids"]):
        got = llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)
        same += got == ids
        if got != ids:
            print(f"  {s!r}: llama.cpp {got} Transformers {ids}")
    print(f"{name}  llama.cpp's ids equal Transformers' for {same}/{len(e['strings'])} strings")


def main():
    import llama_cpp
    print(f"llama-cpp-python {llama_cpp.__version__}")
    for arch in ARCHS:
        logits_agreement(arch)
    spm_agreement("vocab-spm")
    spm_agreement("vocab-gemma-spm")  # (llama.cpp will not load vocab-phi3-spm.gguf: no phi3 hyperparameters)


if __name__ == "__main__":
    main()
