// Command-line parsing for the flexmodel subcommands: `--flag VALUE`,
// `--flag=VALUE`, switches, positionals; every mistake is a UsageError
// naming the flag, so the user sees one line and exit code 2.
#include "cli.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace flex::cli {

namespace {
const Flag* find_flag(const std::vector<Flag>& flags, const std::string& name) {
  for (const auto& f : flags)
    if (f.name == name) return &f;
  return nullptr;
}
}  // namespace

Args::Args(const std::string& command, const std::vector<Flag>& flags, const std::vector<std::string>& argv)
    : command_(command) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a == "--") {  // everything after is positional
      for (++i; i < argv.size(); ++i) positionals_.push_back(argv[i]);
      break;
    }
    if (a.size() < 2 || a[0] != '-') {
      positionals_.push_back(a);
      continue;
    }
    std::string name = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    const Flag* f = find_flag(flags, name);
    if (!f) throw UsageError("unknown option '" + name + "' for '" + command + "' (see flexmodel " + command + " --help)");
    if (f->metavar.empty()) {
      if (inline_value) throw UsageError("option " + name + " takes no value");
      value = "1";
    } else if (!inline_value) {
      if (i + 1 >= argv.size()) throw UsageError("option " + name + " needs a value " + f->metavar);
      value = argv[++i];
    }
    auto& slot = values_[name];
    if (!slot.empty() && !f->repeatable) throw UsageError("option " + name + " given more than once");
    slot.push_back(value);
  }
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::all(const std::string& flag) const {
  auto it = values_.find(flag);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

std::string Args::one_positional(const std::string& metavar) const {
  if (positionals_.empty()) throw UsageError("missing " + metavar + " (see flexmodel " + command_ + " --help)");
  if (positionals_.size() > 1)
    throw UsageError("unexpected argument '" + positionals_[1] + "' (only one " + metavar + " is taken)");
  return positionals_[0];
}

std::optional<int64_t> Args::get_int(const std::string& flag) const {
  auto v = get(flag);
  if (!v) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0) throw UsageError("option " + flag + " expects an integer, got '" + *v + "'");
  return static_cast<int64_t>(x);
}

std::optional<double> Args::get_double(const std::string& flag) const {
  auto v = get(flag);
  if (!v) return std::nullopt;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0') throw UsageError("option " + flag + " expects a number, got '" + *v + "'");
  return x;
}

std::string usage_text(const std::string& command, const std::string& synopsis, const std::vector<Flag>& flags,
                       const std::string& description) {
  std::ostringstream os;
  os << "usage: flexmodel " << command << " " << synopsis << "\n\n" << description << "\n\noptions:\n";
  for (const auto& f : flags) {
    std::string left = "  " + f.name + (f.metavar.empty() ? "" : " " + f.metavar);
    if (left.size() < 34) left.resize(34, ' ');
    else left += "\n" + std::string(34, ' ');
    os << left << f.help << (f.repeatable ? " (repeatable)" : "") << "\n";
  }
  os << "  --help                          this text\n";
  return os.str();
}

}  // namespace flex::cli
