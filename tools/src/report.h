#pragma once
// flexmodel report: what a capture file holds, summarised for reading in a
// browser. The analysis (report_analysis.cpp) reads the capture one tensor at
// a time through the safetensors mapping, so a capture larger than memory
// works; the page (report_html.cpp) is one self-contained HTML file.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flex::cli::report {

struct Options {
  std::string capture;                 // the safetensors file flexmodel capture wrote
  std::optional<std::string> model;    // folder for the logit lens (default: the capture's flexmodel.model)
  std::optional<std::string> tokenizer;  // folder for token labels (default: the model folder)
  int64_t row = 0;                     // the batch row the pictures show
  int64_t max_positions = 128;         // pictures show at most the first N positions
};

struct TensorRow {
  std::string name, dtype, shape;
  uint64_t bytes = 0;
};

/// Attention probabilities of one layer for the shown row, positions cut to
/// `positions`: probs[h][q][k] row-major as bytes (0..255 for 0..1).
struct AttentionLayer {
  std::string name, label;  // tensor name; "layer 3"
  int64_t heads = 0, positions = 0;
  std::vector<uint8_t> probs;
};

/// What each head does, averaged over every row of the capture (all positions).
struct HeadScore {
  std::string layer;  // "layer 3"
  int64_t layer_index = 0;  // 3
  int64_t head = 0;
  double previous_token = 0;  // attention from position i to i - 1
  double first_token = 0;     // attention from position i to 0
  std::optional<double> induction;  // from a repeated token to the token after its earlier copy
};

/// The residual stream of one block (or the final logits) decoded with the
/// final norm and unembedding: the top token and its probability per position.
struct LensRow {
  std::string label;
  std::vector<std::string> top_tokens;
  std::vector<double> top_probs;
};

/// Per-position L2 norms of one [B, T, D] capture for the shown row, and their mean.
struct NormRow {
  std::string name;
  std::vector<double> per_position;
  double mean = 0;
};

struct Report {
  std::string capture, model_dir, architecture;
  uint64_t capture_bytes = 0;
  std::vector<int64_t> ids;          // the shown row's tokens
  std::vector<std::string> tokens;   // their labels
  int64_t rows = 0, positions = 0;   // of input_ids
  int64_t row = 0;                   // the one shown
  std::vector<TensorRow> tensors;
  std::vector<AttentionLayer> attention;
  std::vector<HeadScore> heads;
  std::vector<LensRow> lens;         // empty: no block outputs, or no model to decode with
  std::string lens_note;             // why there is no lens, or how it was made
  std::vector<NormRow> norms;
  std::optional<double> loss_repeated, loss_other;  // next-token loss where the bigram occurred before / not
  std::vector<std::string> findings;  // sentences, most telling first
};

/// `v` with `digits` decimals ("0.57"), as the page and the findings print numbers.
std::string fixed(double v, int digits = 2);

/// Reads `options.capture` (FileFormatError / NotFoundError naming the file
/// or tensor at fault) and computes every section it can.
Report analyze(const Options& options);

/// The report as one self-contained HTML page (inline CSS and script, no
/// network).
std::string render_html(const Report& report);

}  // namespace flex::cli::report
