#pragma once
// BatchRunner: how token batches go through a FlexModel, in one place for the
// command line, dataset capture, the SAE code and Python.
//
// It owns what every caller would otherwise redo:
//   - placement: input_ids, attention_mask and position_ids go to the device
//     of the module that consumes them (flex::input_device), whatever the
//     device map (one GPU, GPU + CPU + disk, quantized, a model on meta);
//   - batching: a batch of rows runs as forwards of batch_size rows, or, with
//     auto, the largest size that fits (halving from the whole batch);
//   - collection: each forward's captures come back on the CPU under the
//     keys `flexmodel capture` writes (NAME, NAME@k for a module's k-th call),
//     expert row indices (NAME#token_index) shifted to the whole batch.
//
//   flex::BatchRunner runner(fm, flex::BatchRunnerOptions().batch_size(8));
//   runner.run({ids, mask}, 0, [&](const flex::ForwardSlice& s, flex::Value& out) {
//     for (auto& [key, t] : runner.take_captures(s)) keep(key, t);
//   });
#include <flex/flexcore/flex_model.h>
#include <flex/models/causal_lm.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace flex {

/// Rows of token ids ([B, T]) and their optional attention mask ([B, T], 1 attends).
struct TokenBatch {
  at::Tensor input_ids;
  at::Tensor attention_mask;
};

struct BatchRunnerOptions {
  /// Rows per forward; 0 runs the whole batch at once.
  BatchRunnerOptions& batch_size(int64_t n) { batch_size_ = n; return *this; }
  /// The largest rows per forward that fit (Accelerate's find_executable_batch_size from the whole batch).
  BatchRunnerOptions& auto_batch_size(bool on) { auto_batch_size_ = on; return *this; }
  /// Captured floating tensors come back in this dtype (default: as captured).
  BatchRunnerOptions& capture_dtype(std::optional<at::ScalarType> d) { capture_dtype_ = d; return *this; }

  int64_t batch_size_ = 0;
  bool auto_batch_size_ = false;
  std::optional<at::ScalarType> capture_dtype_;
};

/// Where one forward sits in the whole batch.
struct ForwardSlice {
  int64_t index = 0;      // forward number within the batch
  int64_t first_row = 0;  // first row of the batch it runs
  int64_t rows = 0;
  int64_t columns = 0;    // tokens per row
  LMInputs inputs;        // placed on the input device
  /// Flattened index of this forward's first token in the whole batch (first_row * columns).
  int64_t first_token() const { return first_row * columns; }
};

class BatchRunner {
 public:
  explicit BatchRunner(FlexModel& fm, BatchRunnerOptions options = {});

  /// The device inputs go to (flex::input_device of the wrapped model), read at construction.
  const c10::Device& input_device() const { return device_; }
  /// `in` with its tensors (input_ids, attention_mask, position_ids) on input_device().
  LMInputs place(LMInputs in) const;
  /// One forward of `in`, placed, through the FlexModel's hooks.
  Value forward(LMInputs in);

  /// Rows per forward for `batch`: the option, or with auto the largest that
  /// fits, found by trial forwards on the first rows (their captures are
  /// dropped); 1 <= result <= rows.
  int64_t batch_size(const TokenBatch& batch);
  /// Forwards needed for `rows` rows at batch_size(): call batch_size first.
  int64_t num_forwards(int64_t rows) const;

  /// Runs forwards first_forward.. of `batch` (earlier ones are skipped, for a
  /// resumed run) under no-grad, calling `each(slice, output)` after each.
  void run(const TokenBatch& batch, int64_t first_forward,
           const std::function<void(const ForwardSlice&, Value&)>& each);

  /// The FlexModel's captures of the forward `slice` ran, on the CPU (floating
  /// ones in the capture dtype), keyed as `flexmodel capture` writes them,
  /// with NAME#token_index rows shifted by slice.first_token(); then clears them.
  std::vector<std::pair<std::string, at::Tensor>> take_captures(const ForwardSlice& slice);

  FlexModel& flex_model() { return fm_; }

 private:
  FlexModel& fm_;
  BatchRunnerOptions options_;
  c10::Device device_;
  int64_t resolved_ = 0;  // batch_size() once resolved
};

/// `t` detached on the CPU, floating tensors cast to `dtype` when given, contiguous.
at::Tensor to_cpu_capture(const at::Tensor& t, std::optional<at::ScalarType> dtype);

}  // namespace flex
