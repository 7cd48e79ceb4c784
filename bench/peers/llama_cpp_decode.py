"""llama.cpp (llama-cpp-python) greedy decoding on a GGUF file, the peer of
bench_decode's GGUF comparison (bench_decode --models gguf).

Loads the file, prints {"ready": true, "versions": ...}, then for every line
"run" on stdin times a prompt forward and a greedy generate of N tokens the
way bench_decode times flexmodel (generate = the prompt forward, then N - 1
one-token steps; the next token is the argmax of the last logits), and
prints one JSON line {"prefill_ms", "total_ms", "tokens": [...]}.

    python llama_cpp_decode.py FILE.gguf --threads 2 --prompt 128 --new 65
"""
import argparse
import json
import sys
import time

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=65)
    a = p.parse_args()
    try:
        import llama_cpp
        llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=a.prompt + a.new + 16, n_batch=512, n_ubatch=512,
                              n_threads=a.threads, n_threads_batch=a.threads, logits_all=False, verbose=False)
    except Exception as e:  # not installed, or the file refused
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    vocab = llm.n_vocab()
    # The same deterministic prompt bench_decode builds.
    ids = [(i * 7919 + 13) % vocab for i in range(a.prompt)]
    print(json.dumps({"ready": True, "versions": {"llama-cpp-python": llama_cpp.__version__}}), flush=True)

    def last_argmax():
        # The last position's logits, straight from llama.cpp's output buffer
        # (llama-cpp-python keeps them in .scores only with logits_all).
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))))

    for line in sys.stdin:
        if line.strip() != "run":
            break
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        llm.reset()
        llm.eval(ids)
        tokens = [last_argmax()]
        while len(tokens) < a.new:
            llm.eval([tokens[-1]])
            tokens.append(last_argmax())
        t2 = time.perf_counter()
        print(json.dumps({"prefill_ms": (t1 - t0) * 1e3, "total_ms": (t2 - t1) * 1e3, "tokens": tokens}), flush=True)


if __name__ == "__main__":
    main()
