#pragma once
// Running the flexmodel executable from a test: exit code, stdout, stderr.
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace cli_test {

struct Result {
  int code = -1;
  std::string out, err;
};

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs `flexmodel ARGS...` with stdout and stderr captured in files.
inline Result run(const std::vector<std::string>& args, const std::string& env = "") {
  static flex_test::TempDir io;
  std::string cmd = env + (env.empty() ? "" : " ") + quote(FLEXMODEL_EXE);
  for (const auto& a : args) cmd += " " + quote(a);
  const std::string o = io.str() + "/out.txt", e = io.str() + "/err.txt";
  cmd += " >" + quote(o) + " 2>" + quote(e);
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(o);
  r.err = slurp(e);
  return r;
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace cli_test
