#pragma once
// Running the flexmodel executable from a test: exit code, stdout, stderr.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

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

/// Starts `flexmodel ARGS...` (stdout to /dev/null, stderr to `err`) without
/// waiting: for tests that kill it. fork is followed by exec at once.
inline pid_t spawn_flexmodel(const std::vector<std::string>& args, const std::string& err) {
  std::vector<std::string> argv = {FLEXMODEL_EXE};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_t pid = ::fork();  // exec follows at once: no libtorch code runs in the child
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY), e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(null, 1);
    ::dup2(e, 2);
    std::vector<char*> p;
    for (auto& a : argv) p.push_back(a.data());
    p.push_back(nullptr);
    ::execv(p[0], p.data());
    ::_exit(127);
  }
  return pid;
}

/// waitpid, retried on EINTR; the raw status.
inline int wait_for(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return st;
}


}  // namespace cli_test
