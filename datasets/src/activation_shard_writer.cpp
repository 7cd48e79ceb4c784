#include <flex/datasets/activation_shards.h>

#include "shard_format.h"

#include <flex/dispatch/atomic_file.h>
#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

namespace fs = std::filesystem;

namespace flex {

const std::vector<std::string>& activation_index_names() {
  static const std::vector<std::string> names = {"token_ids", "document", "position", "context", "offset"};
  return names;
}

namespace {

using activation_shards::kFormat;
using activation_shards::shard_file_name;

// The settings a run chose, without what the writer adds itself.
nlohmann::json chosen(nlohmann::json j) {
  for (const char* k : {"format", "version", "shapes"}) j.erase(k);
  return j;
}

}  // namespace

struct ActivationShardWriter::State {
  std::string dir;
  nlohmann::json settings;
  ActivationShardWriterOptions o;
  std::vector<std::string> hooks;
  std::vector<std::vector<int64_t>> shapes;  // per-token shape of each hook (empty until known)
  std::vector<at::ScalarType> dtypes;        // each hook's stored dtype: o.dtype, or its own if integer
  int64_t next_shard = 0;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<ActivationBatch> queue;
  bool closing = false;
  std::exception_ptr error;
  bool error_delivered = false;  // add() rethrew it already: finish() stays quiet
  std::thread thread;

  // Writer thread only: the shard being filled.
  std::vector<at::Tensor> bufs;   // per hook [capacity, ...] in its stored dtype
  std::vector<at::Tensor> index;  // per index name [capacity] int64
  int64_t fill = 0, capacity = 0;
  int64_t first_context = -1, end_context = 0;
  std::string cursor;
  std::atomic<int64_t> tokens_written{0};
  std::atomic<uint64_t> bytes_written{0};

  uint64_t bytes_per_token() const {
    uint64_t b = 8 * activation_index_names().size();
    for (size_t i = 0; i < shapes.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      b += static_cast<uint64_t>(n) * c10::elementSize(dtypes[i]);
    }
    return b;
  }

  void write_settings() {
    nlohmann::json j = settings;
    j["format"] = kFormat;
    j["version"] = 1;
    if (!shapes.empty()) {
      j["shapes"] = nlohmann::json::object();
      for (size_t i = 0; i < hooks.size(); ++i) j["shapes"][hooks[i]] = shapes[i];
    }
    write_file_atomic((fs::path(dir) / "dataset.json").string(), j.dump(1));
  }

  void reserve(int64_t tokens) {
    if (fill + tokens <= capacity) return;
    const int64_t limit = static_cast<int64_t>(o.max_shard_bytes / std::max<uint64_t>(1, bytes_per_token())) + 1;
    const int64_t cap = std::max(fill + tokens, limit + tokens);
    auto grow = [&](at::Tensor& t, std::vector<int64_t> shape, at::ScalarType dtype) {
      shape.insert(shape.begin(), cap);
      at::Tensor n = at::empty(shape, at::TensorOptions().dtype(dtype));
      if (t.defined() && fill > 0) n.narrow(0, 0, fill).copy_(t.narrow(0, 0, fill));
      t = n;
    };
    bufs.resize(hooks.size());
    index.resize(activation_index_names().size());
    for (size_t i = 0; i < hooks.size(); ++i) grow(bufs[i], shapes[i], dtypes[i]);
    for (auto& t : index) grow(t, {}, at::kLong);
    capacity = cap;
  }

  void append(const ActivationBatch& b) {
    const int64_t n = b.keep.defined() ? b.keep.numel() : b.token_ids.numel();
    reserve(n);
    auto put = [&](at::Tensor& buf, const at::Tensor& src) {
      at::Tensor rows = b.keep.defined() ? src.index_select(0, b.keep.to(src.device())) : src;
      buf.narrow(0, fill, n).copy_(rows);  // casts to the storage dtype, and to the CPU
    };
    for (size_t i = 0; i < hooks.size(); ++i) put(bufs[i], b.activations[i]);
    const at::Tensor* idx[] = {&b.token_ids, &b.document, &b.position, &b.context, &b.offset};
    for (size_t k = 0; k < index.size(); ++k) put(index[k], *idx[k]);
    fill += n;
    if (first_context < 0) first_context = b.first_context;
    end_context = b.end_context;
    cursor = b.cursor;
    if (static_cast<uint64_t>(fill) * bytes_per_token() >= o.max_shard_bytes) write_shard();
  }

  void write_shard() {
    if (first_context < 0) return;  // nothing since the last shard
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (size_t i = 0; i < hooks.size(); ++i)
      tensors.emplace_back(hooks[i], fill > 0 ? bufs[i].narrow(0, 0, fill) : at::empty({0}, dtypes[i]));
    for (size_t k = 0; k < activation_index_names().size(); ++k)
      tensors.emplace_back(activation_index_names()[k], fill > 0 ? index[k].narrow(0, 0, fill) : at::empty({0}, at::kLong));
    save_safetensors((fs::path(dir) / shard_file_name(next_shard)).string(), tensors,
                     {{"flexmodel.format", kFormat},
                      {"flexmodel.first_context", std::to_string(first_context)},
                      {"flexmodel.end_context", std::to_string(end_context)},
                      {"flexmodel.cursor", cursor}});
    ++next_shard;
    tokens_written += fill;
    bytes_written += static_cast<uint64_t>(fill) * bytes_per_token();
    fill = 0;
    first_context = -1;
  }

  void run() {
    try {
      while (true) {
        ActivationBatch b;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return !queue.empty() || closing; });
          if (queue.empty()) break;
          b = std::move(queue.front());
        }
        append(b);
        b = ActivationBatch();  // drop the activations before making room
        std::lock_guard<std::mutex> lock(mu);
        queue.pop_front();
        cv.notify_all();
      }
      write_shard();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
      queue.clear();
      cv.notify_all();
    }
  }
};

ActivationShardWriter::ActivationShardWriter(std::string dir, nlohmann::json settings,
                                             ActivationShardWriterOptions options)
    : dir_(std::move(dir)), state_(std::make_shared<State>()) {
  State& s = *state_;
  s.dir = dir_;
  s.o = options;
  if (options.queue_batches < 1) throw ConfigError("activation writer: queue_batches must be at least 1");
  if (!settings.contains("hooks") || !settings["hooks"].is_array() || settings["hooks"].empty())
    throw ConfigError("activation writer: settings need a non-empty \"hooks\" array");
  for (const auto& h : settings["hooks"]) {
    const std::string name = h.get<std::string>();
    for (const auto& reserved : activation_index_names())
      if (name == reserved) throw ConfigError("hook name '" + name + "' is reserved for a shard's index tensor");
    s.hooks.push_back(name);
  }
  settings["dtype"] = std::string(c10::toString(options.dtype));
  s.settings = settings;

  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) throw IOError(dir_ + ": cannot create the dataset directory: " + ec.message());
  // Leftovers of a killed run: temporary files that never became shards.
  for (const auto& ent : fs::directory_iterator(dir_))
    if (ent.path().filename().string().find(".tmp.") != std::string::npos) fs::remove(ent.path(), ec);
  int64_t shards = 0;
  while (fs::exists(fs::path(dir_) / shard_file_name(shards))) ++shards;
  for (const auto& ent : fs::directory_iterator(dir_)) {
    const std::string n = ent.path().filename().string();
    if (n.rfind("shard-", 0) == 0 && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") {
      int64_t k = -1;
      try {
        k = std::stoll(n.substr(6, n.size() - 18));
      } catch (const std::exception&) {
      }
      if (k < 0 || k >= shards)
        throw FileFormatError(dir_ + ": shard '" + n + "' does not follow the consecutive shards 0.." +
                              std::to_string(shards - 1));
    }
  }
  const fs::path meta = fs::path(dir_) / "dataset.json";
  if (shards > 0) {
    if (!fs::exists(meta)) throw FileFormatError(dir_ + ": holds shards but no dataset.json");
    nlohmann::json old;
    try {
      old = nlohmann::json::parse(read_file(meta.string()));
    } catch (const nlohmann::json::exception& e) {
      throw FileFormatError(meta.string() + ": not JSON: " + e.what());
    }
    const nlohmann::json a = chosen(old), b = chosen(settings);
    for (auto it = b.begin(); it != b.end(); ++it)
      if (!a.contains(it.key()) || a[it.key()] != it.value())
        throw ConfigError(dir_ + " holds a capture made with " + it.key() + " = " +
                          (a.contains(it.key()) ? a[it.key()].dump() : std::string("(unset)")) + ", not " +
                          it.value().dump() + ": resume with the same settings or choose another directory");
    for (auto it = a.begin(); it != a.end(); ++it)
      if (!b.contains(it.key()))
        throw ConfigError(dir_ + " holds a capture made with " + it.key() + " = " + it.value().dump() +
                          ": resume with the same settings or choose another directory");
    if (old.contains("shapes"))
      for (const auto& h : s.hooks) s.shapes.push_back(old["shapes"].at(h).get<std::vector<int64_t>>());
    auto last = SafetensorsFile::open((fs::path(dir_) / shard_file_name(shards - 1)).string());
    contexts_done_ = activation_shards::meta_int(*last, "flexmodel.end_context");
    resume_cursor_ = activation_shards::meta(*last, "flexmodel.cursor");
    s.next_shard = shards;
  }
  s.write_settings();
  s.thread = std::thread([st = state_] { st->run(); });
}

ActivationShardWriter::~ActivationShardWriter() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::cerr << "flexmodel: could not finish the activation dataset in " << dir_ << ": " << e.what() << "\n";
  }
}

void ActivationShardWriter::add(ActivationBatch b) {
  State& s = *state_;
  const int64_t tokens = b.token_ids.numel();
  if (b.activations.size() != s.hooks.size())
    throw ConfigError("activation writer: " + std::to_string(b.activations.size()) + " activations for " +
                      std::to_string(s.hooks.size()) + " hooks");
  const bool first = s.shapes.empty();
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::ScalarType> dtypes;
  for (size_t i = 0; i < s.hooks.size(); ++i) {
    const at::Tensor& a = b.activations[i];
    if (!a.defined() || a.dim() < 1 || a.size(0) != tokens)
      throw ShapeError("hook '" + s.hooks[i] + "': activation " + (a.defined() ? shape_text(a.sizes()) : "(none)") +
                       " does not have one row per token (" + std::to_string(tokens) + ")");
    if (a.is_complex() || a.scalar_type() == at::kBool)
      throw ShapeError("hook '" + s.hooks[i] + "': activation is " + c10::toString(a.scalar_type()) +
                       " (floating point or integer stored)");
    std::vector<int64_t> per(a.sizes().begin() + 1, a.sizes().end());
    if (!first && per != s.shapes[i])
      throw ShapeError("hook '" + s.hooks[i] + "': per-token shape " + shape_text(per) + " differs from the dataset's " +
                       shape_text(s.shapes[i]));
    shapes.push_back(per);
    dtypes.push_back(a.is_floating_point() ? s.o.dtype : a.scalar_type());
    if (!s.dtypes.empty() && dtypes.back() != s.dtypes[i])
      throw ShapeError("hook '" + s.hooks[i] + "': stored as " + c10::toString(dtypes.back()) + ", the dataset's is " +
                       c10::toString(s.dtypes[i]));
  }
  std::unique_lock<std::mutex> lock(s.mu);
  auto deliver = [&] {
    s.error_delivered = true;
    std::rethrow_exception(s.error);
  };
  if (s.error) deliver();
  // A resumed dataset knows its shapes from dataset.json, its dtypes from this first batch.
  if (s.dtypes.empty()) s.dtypes = dtypes;
  if (first) {
    s.shapes = shapes;  // the writer thread reads them only after this batch is queued
    lock.unlock();
    s.write_settings();
    lock.lock();
  }
  s.cv.wait(lock, [&] { return static_cast<int64_t>(s.queue.size()) < s.o.queue_batches || s.error; });
  if (s.error) deliver();
  s.queue.push_back(std::move(b));
  s.cv.notify_all();
}

void ActivationShardWriter::finish() {
  State& s = *state_;
  if (s.thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.closing = true;
    }
    s.cv.notify_all();
    s.thread.join();
  }
  if (s.error && !s.error_delivered) {
    s.error_delivered = true;
    std::rethrow_exception(s.error);
  }
}

int64_t ActivationShardWriter::tokens_written() const { return state_->tokens_written; }
uint64_t ActivationShardWriter::bytes_written() const { return state_->bytes_written; }

}  // namespace flex
