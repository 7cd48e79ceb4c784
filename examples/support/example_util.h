#pragma once
// Small helpers shared by the examples: command-line options (a model folder,
// --small, --steps N, --work DIR, --prompt TEXT, --svg FILE), a tiny GPT-2
// written on the spot when no model folder is given, and the names of the
// blocks and final norm of each architecture.
#include "hf_folder.h"

#include <flex/models/architecture.h>
#include <flex/models/causal_lm.h>

#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace flex_examples {

struct Options {
  std::string model_dir;  // positional; empty: a tiny GPT-2 in <work>/tiny-gpt2
  std::string work = "flexmodel-example-out";
  std::string prompt = "the cat sat on the mat and the cat sat on";
  std::string svg;
  bool small = false;
  int steps = -1;
  std::map<std::string, std::string> extra;  // --key value pairs an example reads itself
};

inline Options parse_options(int argc, char** argv, const std::string& usage) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "error: " << a << " needs a value\n" << usage << "\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::cout << usage << "\n";
      std::exit(0);
    } else if (a == "--small") {
      o.small = true;
    } else if (a == "--steps") {
      o.steps = std::stoi(value());
    } else if (a == "--work") {
      o.work = value();
    } else if (a == "--prompt") {
      o.prompt = value();
    } else if (a == "--svg") {
      o.svg = value();
    } else if (a.rfind("--", 0) == 0) {
      o.extra[a] = value();
    } else {
      o.model_dir = a;
    }
  }
  std::filesystem::create_directories(o.work);
  return o;
}

/// The model folder to use: the one given, or a tiny random GPT-2 written now.
inline std::string model_dir_or_tiny(const Options& o, int n_layer = 4) {
  if (!o.model_dir.empty()) return o.model_dir;
  const std::string dir = o.work + "/tiny-gpt2";
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    TinyGpt2Options t;
    t.n_layer = n_layer;
    write_tiny_gpt2(dir, t);
    std::cout << "wrote a tiny random GPT-2 (Hugging Face folder with tokenizer) to " << dir << "\n";
  }
  return dir;
}

/// Hook names of block i and of the final norm, per architecture.
inline std::string block_name(const flex::CausalLM& m, int i) {
  return flex::block_name(flex::architecture(m.config()), i);
}
inline std::string final_norm_name(const flex::CausalLM& m) { return flex::final_norm_name(flex::architecture(m.config())); }
inline std::string attention_name(const flex::CausalLM& m, int i) {
  return flex::attention_name(flex::architecture(m.config()), i);
}

}  // namespace flex_examples
