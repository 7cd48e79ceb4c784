#pragma once
// Shared by the SentencePiece-style tokenizer tests (Llama, Gemma): decoding
// what was encoded gives the text back, for random byte strings too.
#include <flex/tokenizers/tokenizer.h>

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace tokenizer_test {

/// 200 random strings of up to 29 bytes, drawn with `seed`, round-trip
/// (skipping special tokens on decode). Left out: the bytes of "▁" (E2 96 81),
/// which decode as a space by design, and '<', which could spell a special token.
inline void expect_random_bytes_round_trip(const flex::Tokenizer& tok, unsigned seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 30, '\0');
    for (char& ch : s) {
      do ch = static_cast<char>(rng() % 256);
      while (ch == '\xE2' || ch == '<');
    }
    EXPECT_EQ(tok.decode(tok.encode(s), true), s);
  }
}

}  // namespace tokenizer_test
