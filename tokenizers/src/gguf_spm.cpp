// Merges of a sentencepiece vocabulary rebuilt from its scores (gguf_spm.h).
#include "gguf_spm.h"

#include <algorithm>
#include <unordered_map>

namespace flex {
namespace gguf_vocab_impl {

namespace {

// Characters (code points) in UTF-8 `s`: bytes that do not continue a sequence.
size_t utf8_code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

struct SpmMerge {
  const std::string *left, *right;  // into `pieces` below (stable storage)
  double score;
  size_t left_chars, right_chars;
};

}  // namespace

std::vector<std::pair<std::string, std::string>> spm_merges(const std::vector<std::string>& tokens,
                                                            const std::vector<double>& scores) {
  // Python dict semantics of Transformers' vocab / scores: a repeated piece keeps
  // its first position, and its last id and score.
  std::unordered_map<std::string, int64_t> id;
  std::unordered_map<std::string, double> score;
  std::vector<const std::string*> order;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto [it, fresh] = id.insert_or_assign(tokens[i], static_cast<int64_t>(i));
    if (fresh) order.push_back(&it->first);
    score[tokens[i]] = scores[i];
  }
  std::vector<SpmMerge> all;
  std::vector<SpmMerge> local;
  for (const std::string* piece : order) {
    local.clear();
    const double s = score.at(*piece);
    for (size_t cut = 1; cut < piece->size(); ++cut) {
      if ((static_cast<unsigned char>((*piece)[cut]) & 0xC0) == 0x80) continue;  // inside a character
      auto l = id.find(piece->substr(0, cut));
      auto r = id.find(piece->substr(cut));
      if (l == id.end() || r == id.end()) continue;
      local.push_back({&l->first, &r->first, s, utf8_code_points(l->first), utf8_code_points(r->first)});
    }
    std::stable_sort(local.begin(), local.end(), [&](const SpmMerge& a, const SpmMerge& b) {
      const int64_t al = id.at(*a.left), bl = id.at(*b.left);
      return al != bl ? al < bl : id.at(*a.right) < id.at(*b.right);
    });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const SpmMerge& a, const SpmMerge& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.left_chars != b.left_chars) return a.left_chars > b.left_chars;
    return a.right_chars > b.right_chars;
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(all.size());
  for (const SpmMerge& m : all) out.emplace_back(*m.left, *m.right);
  return out;
}

}  // namespace gguf_vocab_impl
}  // namespace flex
