#pragma once
// The tiny GPT-2 folder (2 layers, 4 heads, seed 7, with a tokenizer) that
// the command-line tests run on: written once per test binary, removed at exit.
#include "hf_folder.h"
#include "test_util.h"

#include <string>

namespace cli_test {

inline const std::string& tiny_gpt2_folder() {
  static flex_test::TempDir dir;
  static const std::string path = [] {
    flex_examples::TinyGpt2Options o;
    o.n_layer = 2;
    o.seed = 7;
    flex_examples::write_tiny_gpt2(dir.str("gpt2"), o);
    return dir.str("gpt2");
  }();
  return path;
}

}  // namespace cli_test
