#pragma once
// Writing a small Hugging Face model folder from C++: a GPT-2 or a Llama
// (config.json, generation_config.json, model.safetensors with random
// weights) and a tiny
// byte-level BPE tokenizer (vocab.json + merges.txt: the 256 byte tokens, a
// few merges and <|endoftext|>). Used by run.sh's demo, the examples and the
// CLI tests, so nothing needs downloading.
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/module.h>
#include <flex/models/auto_model.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace flex_examples {

/// GPT-2's byte -> printable character table, as UTF-8 strings, indexed by byte.
inline std::vector<std::string> gpt2_byte_chars() {
  std::vector<int> bs, cs;
  for (int b = 33; b <= 126; ++b) bs.push_back(b);
  for (int b = 161; b <= 172; ++b) bs.push_back(b);
  for (int b = 174; b <= 255; ++b) bs.push_back(b);
  cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) bs.push_back(b), cs.push_back(256 + n++);
  std::vector<std::string> out(256);
  for (size_t i = 0; i < bs.size(); ++i) {
    const int cp = cs[i];
    std::string u;
    if (cp < 0x80) u += static_cast<char>(cp);
    else u += static_cast<char>(0xC0 | (cp >> 6)), u += static_cast<char>(0x80 | (cp & 0x3F));
    out[bs[i]] = u;
  }
  return out;
}

/// Ids of the tiny tokenizer: bytes 0..255 are ids 0..255 (id = byte value),
/// then the merged tokens, then <|endoftext|>.
inline const std::vector<std::pair<std::string, std::string>>& tiny_merges() {
  static const std::vector<std::pair<std::string, std::string>> m = {
      {"Ġ", "t"}, {"h", "e"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"o", "n"}, {"Ġt", "he"}, {"Ġ", "s"}};
  return m;
}
inline int64_t tiny_vocab_size() { return 256 + static_cast<int64_t>(tiny_merges().size()) + 1; }
inline int64_t tiny_eos_id() { return tiny_vocab_size() - 1; }

/// vocab.json + merges.txt of the tiny byte-level BPE into `dir`.
inline void write_byte_bpe_tokenizer(const std::string& dir) {
  const auto chars = gpt2_byte_chars();
  nlohmann::ordered_json vocab;
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  int64_t id = 256;
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : tiny_merges()) {
    vocab[a + b] = id++;
    merges += a + " " + b + "\n";
  }
  vocab["<|endoftext|>"] = id;
  std::ofstream(dir + "/vocab.json") << vocab.dump() << "\n";
  std::ofstream(dir + "/merges.txt") << merges;
}

/// `model`'s weights as dir/model.safetensors. A tied lm_head.weight is
/// stored once (under the input embedding's name), as Hugging Face does.
inline void save_weights(const std::string& dir, flex::Module& model, bool tied_head = true) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : flex::state_dict(model))
    if (!tied_head || name != "lm_head.weight") tensors.emplace_back(name, t.detach().contiguous());
  flex::save_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
}

/// vocab.json + merges.txt of a tokenizer whose tokens are the characters of
/// `alphabet` (printable ASCII, ids 0..n-1, no merges) and <|endoftext|> (id n).
inline void write_alphabet_tokenizer(const std::string& dir, const std::string& alphabet) {
  nlohmann::ordered_json vocab;
  int64_t id = 0;
  for (char c : alphabet) vocab[std::string(1, c)] = id++;
  vocab["<|endoftext|>"] = id;
  std::ofstream(dir + "/vocab.json") << vocab.dump() << "\n";
  std::ofstream(dir + "/merges.txt") << "#version: 0.2\n";
}

/// config.json, generation_config.json (`eos` as BOS and EOS) and the
/// tokenizer (the alphabet's, or the tiny byte-level BPE when it is empty)
/// into `dir`.
inline void write_config_and_tokenizer(const std::string& dir, const nlohmann::ordered_json& cfg, int64_t eos,
                                       const std::string& alphabet = "") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
  std::ofstream(dir + "/generation_config.json")
      << nlohmann::json{{"bos_token_id", eos}, {"eos_token_id", eos}}.dump(2) << "\n";
  if (alphabet.empty()) write_byte_bpe_tokenizer(dir);
  else write_alphabet_tokenizer(dir, alphabet);
}

struct TinyGpt2Options {
  int n_layer = 4, n_embd = 64, n_head = 4, n_positions = 128;
  uint64_t seed = 0;
};

/// A GPT-2 checkpoint folder with random weights and the tiny tokenizer.
inline void write_tiny_gpt2(const std::string& dir, const TinyGpt2Options& o = {}) {
  nlohmann::ordered_json cfg = {
      {"activation_function", "gelu_new"}, {"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})},
      {"bos_token_id", tiny_eos_id()},     {"eos_token_id", tiny_eos_id()},
      {"layer_norm_epsilon", 1e-5},        {"model_type", "gpt2"},
      {"n_embd", o.n_embd},                {"n_head", o.n_head},
      {"n_inner", nullptr},                {"n_layer", o.n_layer},
      {"n_positions", o.n_positions},      {"torch_dtype", "float32"},
      {"vocab_size", tiny_vocab_size()},   {"tie_word_embeddings", true}};
  write_config_and_tokenizer(dir, cfg, tiny_eos_id());
  at::manual_seed(o.seed);
  save_weights(dir, *flex::build_causal_lm(flex::load_config(dir)));
}

struct TinyLlamaOptions {
  int n_layer = 2, hidden = 64, n_head = 4, intermediate = 128, max_positions = 128;
  /// Non-empty: the vocabulary is these characters and <|endoftext|> (a model
  /// trained on them has no never-seen tokens in its softmax); empty: the
  /// tiny byte-level BPE.
  std::string alphabet;
  uint64_t seed = 0;
};

/// A Llama checkpoint folder (RoPE, RMSNorm, SwiGLU, tied embeddings) with
/// random weights and a tokenizer.
inline void write_tiny_llama(const std::string& dir, const TinyLlamaOptions& o = {}) {
  const int64_t vocab = o.alphabet.empty() ? tiny_vocab_size() : static_cast<int64_t>(o.alphabet.size()) + 1;
  nlohmann::ordered_json cfg = {
      {"architectures", nlohmann::ordered_json::array({"LlamaForCausalLM"})},
      {"model_type", "llama"},
      {"vocab_size", vocab},
      {"hidden_size", o.hidden},
      {"intermediate_size", o.intermediate},
      {"num_hidden_layers", o.n_layer},
      {"num_attention_heads", o.n_head},
      {"num_key_value_heads", o.n_head},
      {"head_dim", o.hidden / o.n_head},
      {"hidden_act", "silu"},
      {"max_position_embeddings", o.max_positions},
      {"rms_norm_eps", 1e-6},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", true},
      {"bos_token_id", vocab - 1},
      {"eos_token_id", vocab - 1},
      {"torch_dtype", "float32"}};
  write_config_and_tokenizer(dir, cfg, vocab - 1, o.alphabet);
  at::manual_seed(o.seed);
  save_weights(dir, *flex::build_causal_lm(flex::load_config(dir)));
}

}  // namespace flex_examples
