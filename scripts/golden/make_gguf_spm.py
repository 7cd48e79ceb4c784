"""A sentencepiece ("llama") vocabulary in GGUF, written by make_gguf.py last:

  vocab-spm.gguf          tokenizer-only GGUF as llama.cpp's converter writes a
                          sentencepiece vocabulary (_set_vocab_sentencepiece):
                          tokenizer.ggml.model "llama", tokens with scores and
                          token types (<unk> UNKNOWN, <s> </s> CONTROL, the 256
                          <0xNN> BYTE tokens, a USER_DEFINED token, NORMAL
                          pieces), no merges, add_bos_token, add_space_prefix.
                          The pieces: every character of a small corpus except
                          a few (so those fall back to bytes), then the most
                          frequent adjacent pairs merged 80 times, scored by
                          merge order (a sentencepiece BPE model's scores)
  vocab-spm.expected.json Transformers 5.23's tokenizer for that file
                          (AutoTokenizer with gguf_file: merges rebuilt from the
                          scores, Metaspace, byte fallback): ids with special
                          tokens and decoding, for a set of strings
  fuzz/corpus/gguf/vocab-spm.gguf  the same file, a seed for fuzz_gguf
  vocab-gemma-spm.gguf    those pieces as Gemma 3's converter writes them, and
    .expected.json        Transformers' (GemmaTokenizer's) tokenization
  vocab-phi3-spm.gguf     vocab-spm.gguf's vocabulary under arch phi3 (a "▁"
    .expected.json        prepended per piece by Transformers) and its tokenization
"""

import collections
import json
import os
import shutil

import gguf

from make_gguf import OUT, ROOT, write_and_close

SP = "\u2581"

CORPUS = ("the quick brown fox jumps over the lazy dog . hello world , hello there ! the world is wide and the "
          "sea is deep ; they said it is 1234 or 567 . caf\u00e9 na\u00efve \u00fcber \u65e5\u672c the end of the "
          "story is near , and then another story begins with the same words over and over again")
# Characters left out of the vocabulary: text with them falls back to <0xNN> bytes.
NOT_IN_VOCAB = set("zq\u672c")

STRINGS = [
    "Hello world", "hello there, the world!", "  leading spaces and   gaps  ", "digits 1234567 and 3.14",
    "line one\nline two", "unicode: caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F642 \u00d1", "zebra quiz",
    "tabs\tand\r\nCRLF", "<s> inside text </s>", "the <mask> token", "", " ", "a", "over and over",
]


def spm_vocab():
    words = [SP + w for w in CORPUS.split(" ")]
    chars = []
    for w in words:
        for c in w:
            if c not in chars and c not in NOT_IN_VOCAB:
                chars.append(c)
    seqs = [[c for c in w] for w in words]
    pieces = []
    for _ in range(80):  # deterministic BPE: most frequent pair, ties by first occurrence
        counts = collections.Counter()
        first = {}
        for s in seqs:
            for a, b in zip(s, s[1:]):
                if a + b == "" or (set(a + b) & NOT_IN_VOCAB):
                    continue
                counts[(a, b)] += 1
                first.setdefault((a, b), len(first))
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], -first[p]))
        pieces.append(best[0] + best[1])
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if (s[i], s[i + 1]) == best:
                    s[i:i + 2] = [best[0] + best[1]]
                i += 1
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [
        gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>"); scores.append(0.0); types.append(gguf.TokenType.BYTE)
    tokens.append("<mask>"); scores.append(0.0); types.append(gguf.TokenType.USER_DEFINED)
    for i, p in enumerate(pieces):  # sentencepiece BPE: score -rank
        tokens.append(p); scores.append(-float(i)); types.append(gguf.TokenType.NORMAL)
    for i, c in enumerate(chars):
        if c not in tokens:
            tokens.append(c); scores.append(-1000.0 - i); types.append(gguf.TokenType.NORMAL)
    return tokens, scores, types


def write_vocab_file(name, arch, title, tokens, scores, types, special, add_space_prefix=None):
    """A tokenizer-only GGUF as llama.cpp's converters write a sentencepiece
    vocabulary; special: bos, eos, unk (and pad) ids, in the order written."""
    w = gguf.GGUFWriter(os.path.join(OUT, name), arch)
    w.add_name(title)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    for kind, i in special.items():
        getattr(w, f"add_{kind}_token_id")(i)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    if add_space_prefix is not None:
        w.add_add_space_prefix(add_space_prefix)
    write_and_close(w)


def tokenize(name, strings):
    """Transformers' tokenizer for the GGUF `name`, and its ids and decodings of `strings`."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(OUT, gguf_file=name)
    ids = [tok(s)["input_ids"] for s in strings]
    return tok, {"strings": strings, "ids": ids,
                 "decoded": [tok.decode(i, skip_special_tokens=False) for i in ids],
                 "decoded_skip_special": [tok.decode(i, skip_special_tokens=True) for i in ids]}


def write_expected(name, expected):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")


def write_spm():
    tokens, scores, types = spm_vocab()
    write_vocab_file("vocab-spm.gguf", "llama", "flexmodel gguf sentencepiece vocabulary", tokens, scores, types,
                     {"bos": 1, "eos": 2, "unk": 0}, add_space_prefix=True)
    shutil.copyfile(os.path.join(OUT, "vocab-spm.gguf"),
                    os.path.join(ROOT, "fuzz", "corpus", "gguf", "vocab-spm.gguf"))  # a fuzz seed
    tok, expected = tokenize("vocab-spm.gguf", STRINGS)
    ids = expected["ids"]
    # The test is worth its name only if byte fallback and merges both happen.
    assert any(tokens[i].startswith("<0x") for i in ids[5]), ids[5]
    assert any(len(tokens[i]) > 3 and not tokens[i].startswith("<") for i in ids[0])
    write_expected("vocab-spm.expected.json", expected)
    return tok


def write_gemma_spm():
    """vocab-gemma-spm.gguf: the same pieces as Gemma 3's converter writes a
    sentencepiece vocabulary (arch gemma3, <pad> <eos> <bos> <unk> first,
    add_space_prefix false, whitespace tokens spelled with real spaces), with
    scores that run against the file order (Transformers ranks Gemma's merges
    by position), and Transformers' tokenization of it."""
    tokens, _, types = spm_vocab()
    pieces = [t for t, k in zip(tokens, types) if k in (gguf.TokenType.NORMAL, gguf.TokenType.BYTE)]
    kinds = [k for k in types if k in (gguf.TokenType.NORMAL, gguf.TokenType.BYTE)]
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "  ", "   "] + pieces
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.UNKNOWN, gguf.TokenType.USER_DEFINED] + \
        [gguf.TokenType.NORMAL] * 2 + kinds
    scores = [float(i) for i in range(len(tokens))]  # against the file order
    write_vocab_file("vocab-gemma-spm.gguf", "gemma3", "flexmodel gguf gemma sentencepiece vocabulary", tokens, scores,
                     types, {"bos": 2, "eos": 1, "unk": 3, "pad": 0}, add_space_prefix=False)
    tok, expected = tokenize("vocab-gemma-spm.gguf", STRINGS + ["<bos>twice <eos>", "<pad> and <unk>"])
    assert 5 in expected["ids"][2], expected["ids"][2]  # the two-space token
    write_expected("vocab-gemma-spm.expected.json", expected)
    return tok


def write_phi3_spm():
    """vocab-phi3-spm.gguf: vocab-spm.gguf's vocabulary under arch phi3, which
    Transformers builds with a Prepend("▁") + Replace normalizer instead of
    Metaspace, and Transformers' tokenization of it."""
    tokens, scores, types = spm_vocab()
    write_vocab_file("vocab-phi3-spm.gguf", "phi3", "flexmodel gguf phi3 sentencepiece vocabulary", tokens, scores, types,
                     {"bos": 1, "eos": 2, "unk": 0})
    tok, expected = tokenize("vocab-phi3-spm.gguf", STRINGS)
    write_expected("vocab-phi3-spm.expected.json", expected)
    return tok


def main():
    write_spm()
    write_gemma_spm()
    write_phi3_spm()


if __name__ == "__main__":
    write_spm()
    write_gemma_spm()
    print(write_phi3_spm().backend_tokenizer.to_str()[:1200])
