#pragma once
// Headless Chromium for the tests of the HTML views (report, features,
// attribution graph): the DOM after the page's scripts ran, and screenshots.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli_util.h"

namespace cli_test {

class HeadlessChromium {
 public:
  /// Finds the browser; its profile lives in `profile_dir` (a test's own folder).
  explicit HeadlessChromium(const std::string& profile_dir) {
    for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
      if (std::filesystem::exists(p)) binary_ = p;
    flags_ = " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars --user-data-dir=" +
             quote(profile_dir);
  }
  /// False where none is installed (the test skips: scripts/install-deps.sh --tests installs it).
  bool found() const { return !binary_.empty(); }
  /// Writes the DOM of `url` after its scripts ran to `out`; the exit status (0: done).
  int dump_dom(const std::string& url, const std::string& out) const {
    return std::system(("timeout 120 " + binary_ + flags_ + " --dump-dom " + quote(url) + " >" + quote(out) +
                        " 2>/dev/null").c_str());
  }
  /// A `width` x `height` PNG of `url` at `png`; the exit status (0: done).
  int screenshot(const std::string& url, const std::string& png, int width, int height) const {
    return std::system(("timeout 120 " + binary_ + flags_ + " --window-size=" + std::to_string(width) + "," +
                        std::to_string(height) + " --screenshot=" + quote(png) + " " + quote(url) +
                        " >/dev/null 2>&1").c_str());
  }

 private:
  std::string binary_, flags_;
};

/// How many times `what` occurs in `text`.
inline size_t count_occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace cli_test
