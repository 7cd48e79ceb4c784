// Crash-safe writes.
//  * A streaming capture (many small shards) is SIGKILLed by the parent at 20
//    random moments; each restart resumes. The result must equal, tensor by
//    tensor (checksums) and file by file, an uninterrupted capture.
//  * Writers hitting a full disk (RLIMIT_FSIZE in a child process, SIGXFSZ
//    ignored so write() fails with EFBIG) must throw IOError naming the file and
//    leave no temporary or corrupt file behind, and must not touch the file they
//    were replacing.
// Children are this test binary re-executed (fork + exec: libtorch's thread
// pools are not fork-safe) running ChildRole.RunsOnlyWhenSpawned.
#include "../flexcore/tiny_lm.h"

#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/device_map.h>
#include <flex/dispatch/offload_folder.h>
#include <flex/dispatch/safetensors.h>
#include <flex/dispatch/sharded_writer.h>
#include <flex/flexcore/flex_model.h>
#include <flex/flexcore/streaming_sink.h>
#include <flex/hooks/errors.h>

#include "test_util.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace flex;

namespace {

constexpr int kForwards = 400;          // forwards of the streamed capture
constexpr int kSlowMs = 5;              // per forward in the child: the capture lasts >= 2 s
constexpr int kKills = 20;
constexpr int kMaxKillDelayMs = 80;     // 20 kills stop it before it can finish (20 * 80 ms < 2 s)
constexpr uint64_t kShardBytes = 8192;  // ~3 forwards per shard: >100 shards

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// ---- spawning this binary in a child role -------------------------------------------------

struct Child {
  pid_t pid = -1;
  int ready_fd = -1;  // read end: the child writes one byte when its writer exists
};

Child spawn(const std::map<std::string, std::string>& vars, const std::string& stderr_file) {
  int p[2];
  if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
  std::string exe = fs::read_symlink("/proc/self/exe").string();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
    ::setenv("FLEX_RELIABILITY_READY_FD", std::to_string(p[1]).c_str(), 1);
    int out = ::open("/dev/null", O_WRONLY);
    ::dup2(out, 1);
    int err = ::open(stderr_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(err, 2);
    const char* argv[] = {exe.c_str(), "--gtest_filter=ChildRole.RunsOnlyWhenSpawned", nullptr};
    ::execv(exe.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(p[1]);
  return {pid, p[0]};
}

bool wait_ready(const Child& c) {
  char b;
  ssize_t n = ::read(c.ready_fd, &b, 1);
  ::close(c.ready_fd);
  return n == 1;
}

int wait_status(pid_t pid) {
  int st = 0;
  ::waitpid(pid, &st, 0);
  return st;
}

void signal_ready() {
  int fd = std::atoi(env("FLEX_RELIABILITY_READY_FD"));
  if (fd > 0) {
    char b = 'r';
    (void)!::write(fd, &b, 1);
    ::close(fd);
  }
}

// ---- the streamed capture ----------------------------------------------------------------

at::Tensor batch(int i) { return (at::arange(10, at::kLong).view({2, 5}) * (i + 3) + i) % 32; }

// Captures forwards [done, kForwards) into `dir`, resuming; slow_ms per forward.
void stream_capture(const std::string& dir, int slow_ms) {
  at::manual_seed(7);  // every process builds the same weights
  auto lm = std::make_shared<tiny::LM>();
  auto sink = std::make_shared<StreamingSink>(dir, StreamingSinkOptions{kShardBytes, true});
  FlexModel fm(lm);
  fm.register_forward_hook(std::make_shared<HookFunction>("h.0.mlp"));
  fm.register_forward_hook(std::make_shared<HookFunction>("h.2"));
  fm.register_forward_hook(std::make_shared<HookFunction>("lm_head"));
  fm.set_sink(sink);
  signal_ready();
  at::NoGradGuard ng;
  for (int64_t i = sink->forwards_done(); i < kForwards; ++i) {
    fm.forward(batch(static_cast<int>(i)));
    if (slow_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
  }
}

uint64_t checksum(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// (forward, key) -> checksum of every captured tensor.
std::map<std::pair<int64_t, std::string>, uint64_t> capture_checksums(const std::string& dir) {
  CaptureReader r(dir);
  std::map<std::pair<int64_t, std::string>, uint64_t> out;
  for (const auto& key : r.keys())
    for (int64_t f = 0; f < r.num_forwards(); ++f)
      if (r.contains(f, key)) out[{f, key}] = checksum(r.get(f, key));
  return out;
}

std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// ---- full-disk cases, run inside the limited child ----------------------------------------

constexpr rlim_t kFileLimit = 64 * 1024;

at::Tensor big() { return at::arange(64 * 1024, at::kFloat); }  // 256 KiB > the limit
at::Tensor small(int i) { return at::full({1024}, static_cast<float>(i)); }  // 4 KiB

void full_disk_case(const std::string& which, const std::string& dir) {
  if (which == "save_safetensors") {
    save_safetensors(dir + "/out.safetensors", {{"a", small(1)}, {"big", big()}});
  } else if (which == "sharded_writer") {
    save_sharded_safetensors(dir + "/ckpt", {{"a", small(1)}, {"b", small(2)}, {"c", small(3)}, {"z", big()}},
                             10 * 1024);
  } else if (which == "offload_folder") {
    offload_state_dict(dir + "/off", {{"a", small(1)}, {"big", big()}, {"c", small(3)}});
  } else if (which == "streaming_sink") {
    StreamingSink sink(dir + "/cap", StreamingSinkOptions{16 * 1024, true});
    for (int f = 0; f < 12; ++f) {
      sink.write("x", f, f == 9 ? big() : small(f));
      sink.end_forward(f);
    }
    sink.flush();
  } else if (which == "device_map") {
    DeviceMap m;
    for (int i = 0; i < 5000; ++i) m.set("model.layers." + std::to_string(i) + ".mlp", i % 2 ? "cpu" : "disk");
    m.save(dir + "/map.json");
  }
}

// What each case's directory must look like after the failed write.
void check_after_full_disk(const std::string& which, const std::string& dir) {
  EXPECT_TRUE(temp_files(dir).empty()) << which << ": temporary files left: " << temp_files(dir).size();
  // Every safetensors file left is complete.
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".safetensors") {
      EXPECT_NO_THROW(SafetensorsFile::open(e.path().string())) << e.path();
    }
  if (which == "save_safetensors") {
    auto f = SafetensorsFile::open(dir + "/out.safetensors");  // the previous file, untouched
    EXPECT_EQ(f->names(), std::vector<std::string>{"old"});
  } else if (which == "sharded_writer") {
    EXPECT_FALSE(fs::exists(dir + "/ckpt/model.safetensors.index.json")) << "index written although a shard failed";
  } else if (which == "offload_folder") {
    EXPECT_FALSE(fs::exists(dir + "/off/big.dat"));
    EXPECT_FALSE(fs::exists(dir + "/off/index.json")) << "index names tensors that were never written";
  } else if (which == "streaming_sink") {
    // The capture resumes from what reached the disk: whole shards only.
    CaptureReader r(dir + "/cap");
    EXPECT_GT(r.num_forwards(), 0);
    EXPECT_LT(r.num_forwards(), 10);
    for (int64_t f = 0; f < r.num_forwards(); ++f)
      EXPECT_TRUE(flex_test::equal(r.get(f, "x"), small(static_cast<int>(f))));
    if (fs::exists(dir + "/cap/index.json")) {
      auto j = nlohmann::json::parse(read_file(dir + "/cap/index.json"));
      EXPECT_EQ(j["forwards"].get<int64_t>(), r.num_forwards());
    }
    StreamingSink resumed(dir + "/cap");
    EXPECT_EQ(resumed.forwards_on_disk(), r.num_forwards());
  } else if (which == "device_map") {
    EXPECT_EQ(DeviceMap::load(dir + "/map.json"), (DeviceMap{{"old", "cpu"}}));
  }
}

}  // namespace

// The child side of the tests below; skipped in a normal run.
TEST(ChildRole, RunsOnlyWhenSpawned) {
  const std::string role = env("FLEX_RELIABILITY_ROLE"), dir = env("FLEX_RELIABILITY_DIR");
  if (role.empty()) GTEST_SKIP() << "only run as a child of the crash-safety tests";
  if (role == "stream") {
    stream_capture(dir, std::atoi(env("FLEX_RELIABILITY_SLOW_MS")));
    std::_Exit(0);
  }
  if (role == "full_disk") {
    struct rlimit lim{kFileLimit, kFileLimit};
    std::signal(SIGXFSZ, SIG_IGN);
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) std::_Exit(20);
    signal_ready();
    int code = 13;  // wrote everything: the limit did not bite
    try {
      full_disk_case(env("FLEX_RELIABILITY_CASE"), dir);
    } catch (const IOError& e) {
      std::fprintf(stderr, "IOError: %s\n", e.what());
      code = 10;
    } catch (const Error& e) {
      std::fprintf(stderr, "other flex error: %s\n", e.what());
      code = 11;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "untyped: %s\n", e.what());
      code = 12;
    }
    std::fflush(stderr);
    std::_Exit(code);
  }
  std::_Exit(21);
}

TEST(CrashSafeWrites, StreamingCaptureSurvivesTwentyRandomSigkills) {
  flex_test::TempDir tmp;
  const std::string killed = tmp.str("killed"), clean = tmp.str("clean"), err = tmp.str("child.err");

  // The uninterrupted reference, made the same way (another process, same seed).
  {
    Child c = spawn({{"FLEX_RELIABILITY_ROLE", "stream"}, {"FLEX_RELIABILITY_DIR", clean}, {"FLEX_RELIABILITY_SLOW_MS", "0"}}, err);
    wait_ready(c);
    int st = wait_status(c.pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_file(err);
  }

  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> delay(0, kMaxKillDelayMs);
  int killed_mid_run = 0;
  std::vector<int64_t> progress;
  for (int k = 0; k < kKills; ++k) {
    Child c = spawn({{"FLEX_RELIABILITY_ROLE", "stream"}, {"FLEX_RELIABILITY_DIR", killed},
                     {"FLEX_RELIABILITY_SLOW_MS", std::to_string(kSlowMs)}}, err);
    ASSERT_TRUE(wait_ready(c)) << "child did not start: " << read_file(err);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay(rng)));
    ::kill(c.pid, SIGKILL);
    int st = wait_status(c.pid);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ++killed_mid_run;
    else ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child failed: " << read_file(err);
    if (fs::exists(killed)) progress.push_back(CaptureReader(killed).num_forwards());
  }
  EXPECT_EQ(killed_mid_run, kKills) << "every kill should land while the capture runs";
  ASSERT_FALSE(progress.empty());
  EXPECT_LT(progress.back(), kForwards) << "the kills should interrupt the capture before its end";
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i], progress[i - 1]) << "a resume lost forwards";

  // Resume to the end.
  {
    Child c = spawn({{"FLEX_RELIABILITY_ROLE", "stream"}, {"FLEX_RELIABILITY_DIR", killed}, {"FLEX_RELIABILITY_SLOW_MS", "0"}}, err);
    wait_ready(c);
    int st = wait_status(c.pid);
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_file(err);
  }

  auto want = capture_checksums(clean), got = capture_checksums(killed);
  EXPECT_EQ(want.size(), static_cast<size_t>(kForwards) * 3);
  EXPECT_EQ(got, want) << "resumed capture differs from the uninterrupted one";
  EXPECT_TRUE(temp_files(killed).empty());
  // Shard boundaries depend only on the data, so the files match one for one.
  std::vector<std::string> names_clean, names_killed;
  for (const auto& e : fs::directory_iterator(clean)) names_clean.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(killed)) names_killed.push_back(e.path().filename().string());
  std::sort(names_clean.begin(), names_clean.end());
  std::sort(names_killed.begin(), names_killed.end());
  EXPECT_EQ(names_killed, names_clean);
  EXPECT_GT(names_clean.size(), 100u) << "the capture should span many shards";
  for (const auto& n : names_clean)
    if (fs::exists(killed + "/" + n)) {
      EXPECT_TRUE(read_file(killed + "/" + n) == read_file(clean + "/" + n)) << n << " differs after resuming";
    }
}

class FullDisk : public ::testing::TestWithParam<std::string> {};

TEST_P(FullDisk, ReportsIOErrorAndLeavesNoCorruptFile) {
  const std::string which = GetParam();
  flex_test::TempDir tmp;
  const std::string dir = tmp.str("d"), err = tmp.str("child.err");
  fs::create_directories(dir);
  // What the writer would replace: it must survive the failed write.
  if (which == "save_safetensors") save_safetensors(dir + "/out.safetensors", {{"old", small(0)}});
  if (which == "device_map") DeviceMap{{"old", "cpu"}}.save(dir + "/map.json");

  Child c = spawn({{"FLEX_RELIABILITY_ROLE", "full_disk"}, {"FLEX_RELIABILITY_CASE", which}, {"FLEX_RELIABILITY_DIR", dir}}, err);
  wait_ready(c);
  int st = wait_status(c.pid);
  const std::string msg = read_file(err);
  ASSERT_TRUE(WIFEXITED(st)) << "child crashed: " << msg;
  ASSERT_EQ(WEXITSTATUS(st), 10) << "expected an IOError; child said: " << msg;
  EXPECT_NE(msg.find(dir), std::string::npos) << "the error should name the file: " << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  check_after_full_disk(which, dir);
}

INSTANTIATE_TEST_SUITE_P(Writers, FullDisk,
                         ::testing::Values("save_safetensors", "sharded_writer", "offload_folder", "streaming_sink",
                                           "device_map"));
