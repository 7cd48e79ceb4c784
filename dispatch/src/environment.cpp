#include <flex/dispatch/environment.h>

#include <flex/hooks/errors.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/version.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <unistd.h>  // environ

namespace flex {

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::vector<long> parse_version(const std::string& v, const std::string& what) {
  std::string core = v.substr(0, v.find_first_of("+-"));
  std::vector<long> out;
  std::stringstream ss(core);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos)
      throw ConfigError(what + " '" + v + "' is not a version such as 2.1 or 1.13.0");
    out.push_back(std::stol(part));
  }
  if (out.empty()) throw ConfigError(what + " '" + v + "' is not a version such as 2.1 or 1.13.0");
  return out;
}

}  // namespace

PatchEnvironment::PatchEnvironment(const std::map<std::string, std::string>& vars) {
  for (const auto& [k, v] : vars) {
    const std::string name = upper(k);
    const char* old = std::getenv(name.c_str());
    saved_.push_back({name, {old != nullptr, old ? old : ""}});
    ::setenv(name.c_str(), v.c_str(), 1);
  }
}

PatchEnvironment::~PatchEnvironment() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second.first) ::setenv(it->first.c_str(), it->second.second.c_str(), 1);
    else ::unsetenv(it->first.c_str());
  }
}

ClearEnvironment::ClearEnvironment() {
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq) saved_[std::string(*e, static_cast<size_t>(eq - *e))] = eq + 1;
  }
  for (const auto& kv : saved_) ::unsetenv(kv.first.c_str());
}

ClearEnvironment::~ClearEnvironment() {
  std::vector<std::string> now;
  for (char** e = environ; e && *e; ++e)
    if (const char* eq = std::strchr(*e, '=')) now.emplace_back(*e, static_cast<size_t>(eq - *e));
  for (const auto& n : now) ::unsetenv(n.c_str());
  for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
}

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool is_torch_version(const std::string& op, const std::string& version) {
  static const char* ops[] = {"<", "<=", "==", "!=", ">=", ">"};
  if (std::find_if(std::begin(ops), std::end(ops), [&](const char* o) { return op == o; }) == std::end(ops))
    throw ConfigError("is_torch_version: unknown comparison '" + op + "' (use <, <=, ==, !=, >= or >)");
  std::vector<long> a = parse_version(torch_version(), "torch version"), b = parse_version(version, "version");
  const size_t n = std::max(a.size(), b.size());
  a.resize(n, 0);
  b.resize(n, 0);
  const int c = a < b ? -1 : (a > b ? 1 : 0);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == "==") return c == 0;
  if (op == "!=") return c != 0;
  if (op == ">=") return c >= 0;
  return c > 0;
}

bool is_cuda_available() { return at::globalContext().hasCUDA() && at::detail::getCUDAHooks().getNumGPUs() > 0; }

bool is_bf16_available() {
  if (!is_cuda_available()) return true;  // libtorch's CPU kernels handle bfloat16
  // libtorch's CUDA hooks (callable from this CPU-built library) answer
  // "compute capability >= 8.0" through their cuDNN v8 bfloat16 check.
  return at::detail::getCUDAHooks().supportsBFloat16ConvolutionWithCuDNNv8();
}

}  // namespace flex
