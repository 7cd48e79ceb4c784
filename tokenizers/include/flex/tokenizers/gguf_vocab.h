#pragma once
// The tokenizer stored in a GGUF file's metadata (llama.cpp's tokenizer.ggml.*
// keys), for models that come as one .gguf file without a tokenizer.json.
// load_tokenizer(path) calls this when `path` is a GGUF file (and turns its
// UnsupportedError into an IOError: "no tokenizer it can read", as for a folder).
//
// Supported: tokenizer.ggml.model "gpt2" (byte-level BPE: tokens, token_type,
// merges) with tokenizer.ggml.pre "gpt-2", "llama-bpe" / "llama3" or "qwen2",
// the pre-tokenizer regexes of GPT-2, Llama 3 and Qwen2; and "llama"
// (sentencepiece: tokens, scores, token_type, <0xNN> byte tokens), tokenized
// as Transformers tokenizes such a file: merges rebuilt from the scores,
// Metaspace ("▁" prefix unless add_space_prefix is false), byte fallback, bos
// added unless add_bos_token is false; Gemma's (no prefix, spaces respelled,
// merges by file position) and Phi-3's (prefix by a normalizer) variants by
// general.architecture, as Transformers picks them. CONTROL tokens become special added
// tokens, USER_DEFINED ones plain added tokens; add_bos_token / add_eos_token
// put bos / eos around the sequence. Anything else (other models such as "t5",
// other pre families) throws flex::UnsupportedError naming the file, the key
// and its value. Torch-free: it reads only the metadata.
#include <flex/tokenizers/tokenizer.h>

#include <memory>
#include <string>

namespace flex {

/// Whether `path` is a regular file that starts with the GGUF magic.
bool is_gguf_tokenizer_file(const std::string& path);

/// The tokenizer of a GGUF file, with bos/eos/unk/pad from
/// tokenizer.ggml.{bos,eos,unknown,padding}_token_id. Unreadable file:
/// flex::IOError, as is a file without tokenizer.ggml.model; malformed metadata: flex::FileFormatError; see above for
/// flex::UnsupportedError. Messages name the file and the key.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path);

}  // namespace flex
