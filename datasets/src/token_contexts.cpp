#include <flex/datasets/token_contexts.h>

#include <flex/dispatch/safetensors.h>
#include <flex/hooks/errors.h>
#include <flex/tokenizers/tokenizer.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace flex {

std::string ContextCursor::to_json() const {
  return nlohmann::json{{"context", context}, {"document", document}, {"byte_offset", byte_offset},
                        {"token_offset", token_offset}}
      .dump();
}

ContextCursor ContextCursor::from_json(const std::string& text, const std::string& where) {
  try {
    const auto j = nlohmann::json::parse(text);
    ContextCursor c;
    c.context = j.at("context").get<int64_t>();
    c.document = j.at("document").get<int64_t>();
    c.byte_offset = j.at("byte_offset").get<int64_t>();
    c.token_offset = j.at("token_offset").get<int64_t>();
    // document -1: the corpus ended.
    if (c.context < 0 || c.document < -1 || c.byte_offset < 0 || c.token_offset < 0) throw std::runtime_error("negative");
    return c;
  } catch (const std::exception& e) {
    throw FileFormatError(where + ": bad corpus cursor '" + text + "' (" + e.what() + ")");
  }
}

namespace {

struct Document {
  int64_t index = 0;
  int64_t byte_offset = 0;  // of its line
  std::vector<int64_t> tokens;
};

/// Documents in corpus order, from a start point.
class DocumentSource {
 public:
  virtual ~DocumentSource() = default;
  virtual std::optional<Document> next() = 0;
  /// Share of the corpus before token `used` of the document last returned.
  virtual double fraction(int64_t used, int64_t doc_tokens) const = 0;
};

/// Text lines or JSON Lines, tokenized and framed with BOS / EOS.
class LineSource : public DocumentSource {
 public:
  LineSource(const TokenContextsOptions& o, bool json, std::shared_ptr<const Tokenizer> tok, const ContextCursor& start)
      : path_(o.path), field_(o.text_field), json_(json), tok_(std::move(tok)),
        in_(o.path, std::ios::binary), index_(start.document) {
    if (!in_) throw IOError("cannot read dataset '" + path_ + "'");
    size_ = static_cast<int64_t>(fs::file_size(path_));
    if (start.byte_offset > size_)
      throw ConfigError(path_ + ": resume point (byte " + std::to_string(start.byte_offset) + ") lies past the end (" +
                        std::to_string(size_) + " bytes): the dataset changed since the capture began");
    in_.seekg(start.byte_offset);
    offset_ = start.byte_offset;
    if (start.byte_offset > 0) {
      // The cursor must sit at the start of a line.
      std::ifstream prev(path_, std::ios::binary);
      prev.seekg(start.byte_offset - 1);
      if (prev.get() != '\n')
        throw ConfigError(path_ + ": resume point (byte " + std::to_string(start.byte_offset) +
                          ") is not the start of a line: the dataset changed since the capture began");
    }
  }

  std::optional<Document> next() override {
    std::string line;
    while (true) {
      const int64_t at = offset_;
      if (!std::getline(in_, line)) return std::nullopt;
      offset_ = at + static_cast<int64_t>(line.size()) + (in_.eof() ? 0 : 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank: not a document
      Document d;
      d.index = index_++;
      d.byte_offset = at;
      doc_start_ = at;
      const std::string text = json_ ? field_of(line, d) : line;
      if (auto bos = tok_->bos_id()) d.tokens.push_back(*bos);
      const auto ids = tok_->encode(text, /*add_special_tokens=*/false);
      d.tokens.insert(d.tokens.end(), ids.begin(), ids.end());
      if (!tok_->bos_id())
        if (auto eos = tok_->eos_id()) d.tokens.push_back(*eos);
      if (d.tokens.empty()) continue;
      return d;
    }
  }

  double fraction(int64_t used, int64_t doc_tokens) const override {
    if (size_ <= 0) return 1.0;
    // The document's line [doc_start_, offset_), read in proportion to its tokens.
    const double within = doc_tokens > 0 ? double(used) / double(doc_tokens) : 1.0;
    return (double(doc_start_) + within * double(offset_ - doc_start_)) / double(size_);
  }

 private:
  std::string field_of(const std::string& line, const Document& d) const {
    const std::string where = path_ + ": document " + std::to_string(d.index) + " (byte " +
                              std::to_string(d.byte_offset) + ")";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      throw FileFormatError(where + " is not JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains(field_))
      throw FileFormatError(where + " has no field '" + field_ + "' (choose it with --text-field)");
    if (!j[field_].is_string()) throw FileFormatError(where + ": field '" + field_ + "' is not a string");
    return j[field_].get<std::string>();
  }

  std::string path_, field_;
  bool json_;
  std::shared_ptr<const Tokenizer> tok_;
  std::ifstream in_;
  int64_t index_, offset_ = 0, size_ = 0, doc_start_ = 0;
};

/// Rows of a safetensors "input_ids" tensor (a 1-D stream is one document).
class IdsSource : public DocumentSource {
 public:
  IdsSource(const TokenContextsOptions& o, const ContextCursor& start) : row_(start.document) {
    auto f = SafetensorsFile::open(o.path);
    if (!f->contains("input_ids"))
      throw NotFoundError(o.path + ": no tensor 'input_ids' (token ids: [tokens] or [documents, tokens])");
    at::Tensor t = f->get("input_ids");
    if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/false) || t.dim() < 1 || t.dim() > 2)
      throw ShapeError(o.path + ": 'input_ids' must be integer [tokens] or [documents, tokens], got " +
                       std::string(c10::toString(t.scalar_type())) + " with " + std::to_string(t.dim()) + " dims");
    ids_ = (t.dim() == 1 ? t.unsqueeze(0) : t).to(at::kLong);
    if (ids_.numel() > 0 && ids_.min().item<int64_t>() < 0) throw ConfigError(o.path + ": 'input_ids' holds negative ids");
    if (row_ > ids_.size(0))
      throw ConfigError(o.path + ": resume point (document " + std::to_string(row_) + ") lies past the last row (" +
                        std::to_string(ids_.size(0)) + "): the dataset changed since the capture began");
  }
  std::optional<Document> next() override {
    while (row_ < ids_.size(0)) {
      Document d;
      d.index = row_;
      at::Tensor r = ids_[row_++].contiguous();
      d.tokens.assign(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
      if (!d.tokens.empty()) return d;
    }
    return std::nullopt;
  }
  double fraction(int64_t used, int64_t) const override {
    // Rows have the same length: tokens before the current row, plus `used` of it.
    const double total = double(ids_.numel());
    return total > 0 ? (double(row_ - 1) * double(ids_.size(1)) + double(used)) / total : 1.0;
  }

 private:
  at::Tensor ids_;
  int64_t row_;
};

DatasetFormat resolve(const TokenContextsOptions& o) {
  if (o.format != DatasetFormat::Auto) return o.format;
  const std::string ext = fs::path(o.path).extension().string();
  if (ext == ".jsonl" || ext == ".json") return DatasetFormat::JsonLines;
  if (ext == ".safetensors") return DatasetFormat::TokenIds;
  return DatasetFormat::Text;
}

}  // namespace

struct TokenContexts::Impl {
  TokenContextsOptions o;
  DatasetFormat format;
  std::unique_ptr<DocumentSource> source;
  ContextCursor start;
  // Packing state: the current document and how much of it is used.
  std::optional<Document> doc;
  int64_t used = 0;
  int64_t context = 0;  // number of the next context
  bool done = false;
  int64_t dropped = 0;

  // Background thread and its bounded queue.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ContextBatch> queue;
  bool finished = false, stop = false;
  std::exception_ptr error;

  // The next document with tokens left, or false at the end of the corpus.
  bool ensure_doc() {
    while (!doc || used >= static_cast<int64_t>(doc->tokens.size())) {
      doc = source->next();
      used = 0;
      if (!doc) return false;
    }
    return true;
  }

  ContextCursor cursor() {
    ContextCursor c;
    c.context = context;
    // Between documents the next context starts in the next one (read now).
    if (!ensure_doc()) {
      c.document = -1;  // the end of the corpus
      return c;
    }
    c.document = doc->index;
    c.byte_offset = doc->byte_offset;
    c.token_offset = used;
    return c;
  }

  std::optional<ContextBatch> make_batch() {
    if (done) return std::nullopt;
    const int64_t n = o.context_len;
    std::vector<int64_t> ids, docs, pos;
    ContextBatch b;
    b.first_context = context;
    int64_t rows = 0;
    while (rows < o.batch_size && (o.max_contexts < 0 || context < o.max_contexts)) {
      const size_t row_start = ids.size();
      while (static_cast<int64_t>(ids.size() - row_start) < n && ensure_doc()) {
        const int64_t take = std::min<int64_t>(n - static_cast<int64_t>(ids.size() - row_start),
                                               static_cast<int64_t>(doc->tokens.size()) - used);
        for (int64_t k = 0; k < take; ++k) {
          ids.push_back(doc->tokens[used + k]);
          docs.push_back(doc->index);
          pos.push_back(used + k);
        }
        used += take;
      }
      if (static_cast<int64_t>(ids.size() - row_start) < n) {  // the corpus ended inside this context
        dropped = static_cast<int64_t>(ids.size() - row_start);
        ids.resize(row_start);
        docs.resize(row_start);
        pos.resize(row_start);
        done = true;
        break;
      }
      ++rows;
      ++context;
    }
    if (o.max_contexts >= 0 && context >= o.max_contexts) done = true;
    if (rows == 0) return std::nullopt;
    auto as_tensor = [&](std::vector<int64_t>& v) {
      return at::from_blob(v.data(), {rows, n}, at::kLong).clone();
    };
    b.input_ids = as_tensor(ids);
    b.document = as_tensor(docs);
    b.position = as_tensor(pos);
    b.next = cursor();
    b.corpus_fraction =
        done ? 1.0 : (doc ? source->fraction(used, static_cast<int64_t>(doc->tokens.size())) : 1.0);
    return b;
  }

  void run() {
    try {
      while (true) {
        auto b = make_batch();
        std::unique_lock<std::mutex> lock(mu);
        if (!b) break;
        cv.wait(lock, [&] { return stop || static_cast<int64_t>(queue.size()) < o.prefetch_batches; });
        if (stop) return;
        queue.push_back(std::move(*b));
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
    cv.notify_all();
  }
};

TokenContexts::TokenContexts(TokenContextsOptions options, std::shared_ptr<const Tokenizer> tokenizer,
                             ContextCursor start)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (options.context_len < 1) throw ConfigError("context length must be at least 1, got " + std::to_string(options.context_len));
  if (options.batch_size < 1) throw ConfigError("batch size must be at least 1, got " + std::to_string(options.batch_size));
  m.o = std::move(options);
  m.format = resolve(m.o);
  if (!fs::exists(m.o.path)) throw IOError("dataset '" + m.o.path + "' does not exist");
  if (m.format == DatasetFormat::TokenIds) {
    m.source = std::make_unique<IdsSource>(m.o, start);
  } else {
    if (!tokenizer)
      throw ConfigError("dataset '" + m.o.path + "' is text: the model folder needs a tokenizer (or give token ids as .safetensors)");
    m.source = std::make_unique<LineSource>(m.o, m.format == DatasetFormat::JsonLines, std::move(tokenizer), start);
  }
  m.start = start;
  m.context = start.context;
  if (start.document < 0) {
    m.done = true;  // the cursor of a finished corpus
  } else if (start.token_offset > 0) {
    if (!m.ensure_doc() || m.doc->index != start.document ||
        start.token_offset > static_cast<int64_t>(m.doc->tokens.size()))
      throw ConfigError(m.o.path + ": resume point (document " + std::to_string(start.document) + ", token " +
                        std::to_string(start.token_offset) +
                        ") does not fit the dataset: it changed since the capture began");
    m.used = start.token_offset;
  }
  if (m.o.max_contexts >= 0 && m.context >= m.o.max_contexts) m.done = true;
  if (m.o.prefetch_batches > 0) m.worker = std::thread([&m] { m.run(); });
}

TokenContexts::~TokenContexts() {
  if (impl_->worker.joinable()) {
    {
      std::lock_guard<std::mutex> lock(impl_->mu);
      impl_->stop = true;
    }
    impl_->cv.notify_all();
    impl_->worker.join();
  }
}

std::optional<ContextBatch> TokenContexts::next() {
  Impl& m = *impl_;
  if (!m.worker.joinable()) return m.make_batch();
  std::unique_lock<std::mutex> lock(m.mu);
  m.cv.wait(lock, [&] { return !m.queue.empty() || m.finished; });
  if (!m.queue.empty()) {
    ContextBatch b = std::move(m.queue.front());
    m.queue.pop_front();
    m.cv.notify_all();
    return b;
  }
  if (m.error) std::rethrow_exception(m.error);
  return std::nullopt;
}

int64_t TokenContexts::tokens_dropped() const { return impl_->dropped; }
DatasetFormat TokenContexts::format() const { return impl_->format; }

}  // namespace flex
