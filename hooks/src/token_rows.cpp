#include <flex/hooks/token_rows.h>

#include <vector>

namespace flex {

namespace {
thread_local std::vector<TokenRows> g_rows;
}

ScopedTokenRows::ScopedTokenRows(TokenRows rows) { g_rows.push_back(std::move(rows)); }
ScopedTokenRows::~ScopedTokenRows() { g_rows.pop_back(); }

const TokenRows* current_token_rows() { return g_rows.empty() ? nullptr : &g_rows.back(); }

}  // namespace flex
