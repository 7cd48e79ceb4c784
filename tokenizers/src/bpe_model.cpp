// The BPE model: characters -> initial symbols -> merges by rank.
#include <flex/hooks/errors.h>
#include <flex/tokenizers/bpe.h>
#include <flex/tokenizers/unicode.h>

#include "message.h"

#include <queue>

namespace flex {
namespace {

constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = 100000;
// Ids index a table: a vocabulary may leave ids unused (added tokens fill
// them), but one stray large id must not size a table of gigabytes.
constexpr int64_t kMaxUnusedIds = 1 << 20;

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string describe_unit(const std::string& word, size_t pos, const unicode::Utf8Unit& u) {
  if (u.valid) return cat("U+", hex(u.cp, 4));
  std::string bytes;
  for (size_t k = 0; k < u.len; ++k) bytes += cat(k ? " " : "", hex(static_cast<uint8_t>(word[pos + k]), 2));
  return "invalid UTF-8 bytes " + bytes;
}

}  // namespace

BpeModel::BpeModel(const BpeSpec& spec)
    : source_(spec.source),
      byte_fallback_(spec.byte_fallback),
      fuse_unk_(spec.fuse_unk),
      ignore_merges_(spec.ignore_merges) {
  int64_t max_id = -1;
  for (const auto& [tok, id] : spec.vocab) {
    if (id < 0 || id > INT32_MAX) {
      throw FileFormatError(cat(source_, ": model.vocab: token '", tok, "' has id ", id, " (must be 0..2^31-1)"));
    }
    if (id >= static_cast<int64_t>(spec.vocab.size()) + kMaxUnusedIds) {
      throw FileFormatError(cat(source_, ": model.vocab: token '", tok, "' has id ", id, ", but the vocabulary has ", spec.vocab.size(), " tokens (at most ", kMaxUnusedIds, " ids may be left unused)"));
    }
    max_id = std::max(max_id, id);
  }
  tokens_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_token_.assign(tokens_.size(), false);
  for (const auto& [tok, id] : spec.vocab) {
    if (has_token_[id]) {
      throw FileFormatError(cat(source_, ": model.vocab: id ", id, " is given to both '", tokens_[id], "' and '", tok, "'"));
    }
    if (!vocab_.emplace(tok, static_cast<int32_t>(id)).second) {
      throw FileFormatError(cat(source_, ": model.vocab: token '", tok, "' appears twice"));
    }
    tokens_[id] = tok;
    has_token_[id] = true;
    const unicode::Utf8Unit u = tok.empty() ? unicode::Utf8Unit{} : unicode::decode_utf8(tok, 0);
    if (!tok.empty() && u.valid && u.len == tok.size()) char_ids_[u.cp] = static_cast<int32_t>(id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(cat("<0x", hex(b, 2), ">"));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  if (spec.unk_token) {
    auto it = vocab_.find(*spec.unk_token);
    if (it == vocab_.end()) {
      throw FileFormatError(cat(source_, ": model.unk_token '", *spec.unk_token, "' is not in the vocabulary"));
    }
    unk_id_ = it->second;
  }
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    // Named references, not a structured binding: lambdas capturing bindings need C++20 (clang 14 refuses).
    const std::string& a = spec.merges[rank].first;
    const std::string& b = spec.merges[rank].second;
    const auto find = [&](const std::string& t) {
      auto it = vocab_.find(t);
      if (it == vocab_.end()) {
        throw FileFormatError(cat(source_, ": merge #", rank, " '", a, " ", b, "': token '", t, "' is not in the vocabulary"));
      }
      return it->second;
    };
    const int32_t ia = find(a), ib = find(b), merged = find(a + b);
    // A repeated pair takes its last rank, as GPT-2's dict(zip(merges, ranks)) does.
    merges_[pair_key(ia, ib)] = {static_cast<int32_t>(rank), merged};
  }
}

std::optional<int64_t> BpeModel::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  if (id < 0 || id >= size() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

void BpeModel::initial_symbols(const std::string& word, std::vector<int32_t>& syms) const {
  bool last_unk = false;
  for (size_t pos = 0; pos < word.size();) {
    const unicode::Utf8Unit u = unicode::decode_utf8(word, pos);
    if (u.valid) {
      auto it = char_ids_.find(u.cp);
      if (it != char_ids_.end()) {
        syms.push_back(it->second);
        last_unk = false;
        pos += u.len;
        continue;
      }
    }
    bool done = false;
    if (byte_fallback_) {
      bool all = true;
      for (size_t k = 0; k < u.len; ++k) all = all && byte_ids_[static_cast<uint8_t>(word[pos + k])] >= 0;
      if (all) {
        for (size_t k = 0; k < u.len; ++k) syms.push_back(byte_ids_[static_cast<uint8_t>(word[pos + k])]);
        last_unk = false;
        done = true;
      }
    }
    if (!done) {
      if (!unk_id_) {
        throw NotFoundError(cat(source_, ": ", describe_unit(word, pos, u), " has no token and the model defines no unk_token"));
      }
      if (!(fuse_unk_ && last_unk)) syms.push_back(*unk_id_);
      last_unk = true;
    }
    pos += u.len;
  }
}

void BpeModel::merge(std::vector<int32_t>& syms) const {
  const int n = static_cast<int>(syms.size());
  if (n < 2) return;
  // Symbols form a linked list; candidate pairs wait in a heap ordered by
  // (rank, position), so the lowest-ranked pair merges first and equal ranks go
  // left to right, the same result as GPT-2's "merge every occurrence of the best
  // bigram, left to right" loop, in O(n log n) instead of O(n^2).
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  const auto push = [&](int l) {
    const int r = next[l];
    if (r < 0) return;
    auto it = merges_.find(pair_key(syms[l], syms[r]));
    if (it != merges_.end()) heap.push({it->second.first, l, syms[l], syms[r], it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    // Stale entries: a symbol only ever changes by growing, so equal ids at the
    // same positions mean the pair is still there.
    if (!alive[c.pos] || syms[c.pos] != c.left) continue;
    const int r = next[c.pos];
    if (r < 0 || syms[r] != c.right) continue;
    syms[c.pos] = c.merged;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    if (prev[c.pos] >= 0) push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int i = 0; i >= 0; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_word(const std::string& word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms;
  syms.reserve(word.size());
  initial_symbols(word, syms);
  merge(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(word, std::move(syms));
  }
}

}  // namespace flex
