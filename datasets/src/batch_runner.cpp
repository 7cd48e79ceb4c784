#include <flex/datasets/batch_runner.h>

#include <flex/dispatch/batch_size.h>
#include <flex/dispatch/big_modeling.h>
#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace flex {

namespace {

at::Tensor placed(const at::Tensor& t, const c10::Device& d) { return t.defined() && t.device() != d ? t.to(d) : t; }

// Rows [first, first + n) of a batch, unplaced.
LMInputs rows_of(const TokenBatch& batch, int64_t first, int64_t n) {
  LMInputs in;
  in.input_ids = batch.input_ids.narrow(0, first, n);
  if (batch.attention_mask.defined()) in.attention_mask = batch.attention_mask.narrow(0, first, n);
  return in;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

at::Tensor to_cpu_capture(const at::Tensor& t, std::optional<at::ScalarType> dtype) {
  at::Tensor c = t.detach().to(at::kCPU);
  if (dtype && c.is_floating_point()) c = c.to(*dtype);
  return c.contiguous();
}

BatchRunner::BatchRunner(FlexModel& fm, BatchRunnerOptions options)
    : fm_(fm), options_(std::move(options)), device_(flex::input_device(*fm.module())) {
  if (options_.batch_size_ < 0)
    throw ConfigError("batch size must be at least 1 (or 0 for the whole batch), got " + std::to_string(options_.batch_size_));
}

LMInputs BatchRunner::place(LMInputs in) const {
  in.input_ids = placed(in.input_ids, device_);
  in.attention_mask = placed(in.attention_mask, device_);
  in.position_ids = placed(in.position_ids, device_);
  return in;
}

Value BatchRunner::forward(LMInputs in) { return fm_.forward(place(std::move(in)).to_inputs()); }

int64_t BatchRunner::batch_size(const TokenBatch& batch) {
  if (!batch.input_ids.defined() || batch.input_ids.dim() != 2 || batch.input_ids.size(0) == 0)
    throw ShapeError("input_ids must be a non-empty [batch, seq] tensor, got " +
                     (batch.input_ids.defined() ? shape_text(batch.input_ids.sizes()) : std::string("undefined")));
  if (batch.attention_mask.defined() && batch.attention_mask.sizes() != batch.input_ids.sizes())
    throw ShapeError("attention_mask " + shape_text(batch.attention_mask.sizes()) + " must match input_ids " +
                     shape_text(batch.input_ids.sizes()));
  const int64_t rows = batch.input_ids.size(0);
  if (!options_.auto_batch_size_) {
    resolved_ = options_.batch_size_ > 0 ? std::min(options_.batch_size_, rows) : rows;
    return resolved_;
  }
  // Trial forwards on the first rows before any caller sees a forward: the
  // whole batch, then half, ... until one fits.
  at::NoGradGuard no_grad;
  resolved_ = find_executable_batch_size(
      [&](int64_t b) {
        forward(rows_of(batch, 0, b));
        fm_.clear();
        return b;
      },
      rows);
  return resolved_;
}

int64_t BatchRunner::num_forwards(int64_t rows) const {
  if (resolved_ < 1) throw ConfigError("BatchRunner: call batch_size() before num_forwards()");
  return (rows + resolved_ - 1) / resolved_;
}

void BatchRunner::run(const TokenBatch& batch, int64_t first_forward,
                      const std::function<void(const ForwardSlice&, Value&)>& each) {
  const int64_t bs = resolved_ > 0 ? resolved_ : batch_size(batch);
  const int64_t rows = batch.input_ids.size(0);
  at::NoGradGuard no_grad;
  for (int64_t f = first_forward; f * bs < rows; ++f) {
    ForwardSlice s;
    s.index = f;
    s.first_row = f * bs;
    s.rows = std::min(bs, rows - s.first_row);
    s.columns = batch.input_ids.size(1);
    s.inputs = place(rows_of(batch, s.first_row, s.rows));
    Value out = fm_.forward(s.inputs.to_inputs());
    each(s, out);
  }
}

std::vector<std::pair<std::string, at::Tensor>> BatchRunner::take_captures(const ForwardSlice& slice) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [key, list] : fm_.output())
    for (size_t k = 0; k < list.size(); ++k) {
      at::Tensor t = to_cpu_capture(list[k], options_.capture_dtype_);
      // An expert's row indices count tokens of this forward: shift them to
      // the whole batch's flattened row * T + t.
      if (ends_with(key, "#token_index")) t = t + slice.first_token();
      out.emplace_back(k == 0 ? key : key + "@" + std::to_string(k), std::move(t));
    }
  fm_.clear();
  return out;
}

}  // namespace flex
