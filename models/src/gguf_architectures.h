#pragma once
// What llama.cpp calls things, per architecture: the Transformers config
// rebuilt from a GGUF file's `<arch>.*` metadata, and each GGUF tensor's
// place in the Transformers model, with the rewrites llama.cpp's converter
// made undone (q/k rows permuted for its rope, GPT-NeoX's q|k|v regrouped,
// GPT-2's Conv1D weights transposed, Gemma's norms stored as 1 + w, experts
// stacked into 3-D tensors). Internal to models/ (gguf_model.cpp loads).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace flex {

class GgufFile;

namespace gguf_detail {

/// One model tensor taken from a GGUF tensor.
struct GgufPiece {
  enum class Rows { Same, Unpermute, HeadsQkv };
  std::string name;          // Transformers' name
  int64_t expert = -1;       // >= 0: this index of dim 0 of a stacked [experts, rows, cols] tensor
  Rows rows = Rows::Same;    // row reorder (works on float rows and on stored block rows alike)
  int64_t heads = 0;         // for Unpermute / HeadsQkv
  bool transpose = false;    // GPT-2's Conv1D: [out, in] in the file, [in, out] in the model
  bool minus_one = false;    // Gemma's norms: the file holds 1 + w
  bool joined = false;       // one part of a tensor join_pieces assembles (DeepSeek's k_b / v_b)
  /// Whether the stored blocks can be kept (no float-only rewrite).
  bool keeps_blocks() const { return !transpose && !minus_one && !joined; }
};

/// The architecture of a GGUF file, read once.
class GgufLayout {
 public:
  /// UnsupportedError naming the file and general.architecture when
  /// flexmodel does not read it.
  explicit GgufLayout(const GgufFile& f);
  const nlohmann::json& config() const { return config_; }
  /// Where GGUF tensor `g` goes; UnsupportedError naming the file and the
  /// tensor when it has no counterpart.
  std::vector<GgufPiece> pieces(const GgufFile& f, const std::string& g) const;
  /// `t` (the whole GGUF tensor: float in its torch shape, or its stored
  /// bytes as [.., rows, row bytes]) cut and reordered for `p`; float-only
  /// rewrites apply when `is_float`.
  at::Tensor apply(const GgufFile& f, const std::string& g, const GgufPiece& p, at::Tensor t, bool is_float) const;
  /// Replaces the float parts of joined tensors in `tensors` (model name ->
  /// tensor) by the tensor they make (DeepSeek's kv_b_proj from k_b and v_b);
  /// `stored` (model name -> GGUF name, for messages) follows.
  void join_pieces(const GgufFile& f, std::map<std::string, at::Tensor>& tensors,
                   std::map<std::string, std::string>& stored) const;

 private:
  std::string arch_;
  nlohmann::json config_;
  bool permuted_qk_ = false, norms_plus_one_ = false;
  int64_t heads_ = 0, kv_heads_ = 0, experts_ = 0;
};

}  // namespace gguf_detail
}  // namespace flex
