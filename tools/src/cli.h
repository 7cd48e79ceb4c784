#pragma once
// Internals of the `flexmodel` command line: argument parsing, logging,
// progress, and the subcommands. Not a public API (no include/ header).
#include <flex/quant/bnb_config.h>
#include <flex/sae/sparse_code.h>
#include <flex/sae/splice.h>
#include <flex/dispatch/memory.h>
#include <flex/models/causal_lm.h>
#include <flex/models/parallel_lm.h>
#include <flex/parallel/communicator.h>
#include <flex/parallel/device_mesh.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace flex::cli {

/// A mistake on the command line: exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A flag a subcommand accepts.
struct Flag {
  std::string name;       // "--hook"
  std::string metavar;    // "NAME" (empty: a switch without value)
  std::string help;
  bool repeatable = false;
};

/// One subcommand's command line: positionals and flag values, validated
/// against its flags (unknown flags, missing values, repeats -> UsageError).
class Args {
 public:
  Args(const std::string& command, const std::vector<Flag>& flags, const std::vector<std::string>& argv);
  bool help() const { return help_; }
  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  /// The value of a flag given once; nullopt when absent.
  std::optional<std::string> get(const std::string& flag) const;
  /// Every value of a repeatable flag, in order.
  std::vector<std::string> all(const std::string& flag) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  /// The single MODEL_DIR-like positional; UsageError when absent or extra.
  std::string one_positional(const std::string& metavar) const;
  /// A flag's value parsed as an integer / number (UsageError naming the flag).
  std::optional<int64_t> get_int(const std::string& flag) const;
  std::optional<double> get_double(const std::string& flag) const;

 private:
  std::string command_;
  bool help_ = false;
  std::vector<std::string> positionals_;
  std::map<std::string, std::vector<std::string>> values_;
};

/// Usage text of a subcommand.
std::string usage_text(const std::string& command, const std::string& synopsis, const std::vector<Flag>& flags,
                       const std::string& description);

// --- logging ------------------------------------------------------------------------
enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };
/// From --log-level, else $FLEXMODEL_LOG, else warn. UsageError for unknown names.
void set_log_level(const std::optional<std::string>& flag);
LogLevel log_level();
/// One line on stderr when `level` is enabled.
void log(LogLevel level, const std::string& message);

/// A progress bar on stderr, drawn only when stderr is a terminal. With a
/// unit ("tokens") it also shows the rate and an ETA, and where stderr is not
/// a terminal it prints the same as a line every 10 seconds.
class Progress {
 public:
  /// total <= 0: unknown (set() gives the fraction done).
  Progress(std::string what, int64_t total, std::string unit = "");
  ~Progress();
  void step(int64_t n = 1);
  /// `done` units so far; `fraction` of the whole work (0..1) for the bar and the ETA.
  void set(int64_t done, double fraction);

 private:
  void draw();
  std::string text() const;
  std::string what_, unit_;
  int64_t total_, done_ = 0, start_done_ = -1;
  double fraction_ = 0, start_fraction_ = 0;
  bool on_, lines_;
  double started_, last_line_;
};

// --- shared option parsing ----------------------------------------------------------
/// "0=200MB,cpu=1GiB,disk=10GB" -> budgets; UsageError naming the bad part.
MaxMemory parse_max_memory(const std::string& text);
/// f32|bf16|f16 (and their long names) -> dtype; UsageError otherwise.
at::ScalarType parse_dtype(const std::string& text);
/// Transformers' torch_dtype spelling of a dtype ("float32").
std::string torch_dtype_name(at::ScalarType t);
/// An integer flag's value (or `fallback`), at least `min` (UsageError naming the flag).
int64_t int_at_least(const Args& args, const std::string& flag, int64_t fallback, int64_t min);
/// "3,1" -> {3, 1}: non-negative integers; UsageError "option FLAG: 'x' is not WHAT" otherwise.
std::vector<int64_t> parse_index_list(const std::string& flag, const std::string& text, const std::string& what);
/// A size string ("200MB", "1GiB", bytes) -> bytes; UsageError naming the flag.
int64_t parse_size(const std::string& flag, const std::string& text);

/// IOError when `dir` is neither a model folder with config.json nor a GGUF file.
void require_model_dir(const std::string& dir);
/// IOError when a file cannot be created at `path` (missing or unwritable folder).
void require_writable_file(const std::string& path);
/// IOError when `dir` cannot be created or written.
void require_writable_dir(const std::string& dir);

/// The flags of model loading shared by capture and generate.
std::vector<Flag> loading_flags();
/// from_pretrained with --device-map, --max-memory, --offload-folder, --dtype.
/// --quantize int8|nf4|fp4 (nullopt when absent); UsageError otherwise.
std::optional<BnbQuantizationConfig> quantization_option(const Args& args);
std::shared_ptr<CausalLM> load_model(const std::string& dir, const Args& args);

/// The ranks a command runs on. Outside mpirun: one local rank, no mesh.
/// Under mpirun the product tp*pp*dp must equal the number of ranks; every
/// rank runs the command (SPMD) and only rank 0 writes outputs. A failing
/// rank exits non-zero, which aborts the whole job (see mpi_communicator).
struct Ranks {
  std::shared_ptr<Communicator> world;
  std::shared_ptr<DeviceMesh> mesh;  // null when tp*pp*dp == 1
  int rank() const { return world->rank(); }
  bool writer() const { return world->rank() == 0; }
};
std::vector<Flag> parallel_flags();
/// --tp/--pp/--dp checked against the job: UsageError for values < 1, or a
/// product that differs from the number of ranks (naming both).
Ranks parallel_setup(const Args& args);
/// The tensor/pipeline/data-parallel model of `dir` over `mesh` (--dtype
/// honoured). The loading flags only the single-process model has
/// (--device-map, --max-memory, --offload-folder) are UsageErrors.
std::shared_ptr<ParallelCausalLM> load_parallel_model(const std::string& dir, const Args& args, const DeviceMesh& mesh);

/// `pattern` alone when it has no wildcard; else every module name (hook
/// points included) it matches with fnmatch ('*.hook_attn_probs'),
/// NotFoundError when none does.
std::vector<std::string> matching_hook_names(Module& model, const std::string& pattern);

/// A batch of token ids [B, T] (int64) and its attention mask (undefined:
/// no padding).
struct InputBatch {
  at::Tensor input_ids, attention_mask;
};
/// --input-ids FILE: tensor input_ids ([T] or [B, T]) and attention_mask if
/// present. NotFoundError / ShapeError naming the file otherwise.
InputBatch read_input_ids(const std::string& path);

/// Every hookable name of `model` that --hook all selects: each named module
/// except the root and the flex-only hook points ("...hook_resid_pre").
std::vector<std::string> all_hook_names(Module& model);

// --- HTML pages (report, features) -------------------------------------------------
/// & < > " as entities.
std::string html_escape(const std::string& s);
/// A token as shown: spaces and line breaks made visible, control bytes replaced.
std::string visible_token(const std::string& s);

// --- sparse dictionaries (sae_options.cpp) ------------------------------------------
/// --sae PATH[@HOOK] and --sae-mode, for capture and generate.
std::vector<Flag> sae_flags(const std::string& default_mode);
/// observe | replace | replace-with-error; UsageError otherwise.
SpliceMode parse_splice_mode(const std::string& text);
/// The dictionary at PATH (a SAELens folder, a Gemma Scope params.npz or its
/// folder) spliced into `fm`, at HOOK when given, else where it says it reads.
Splice splice_sae_spec(FlexModel& fm, const std::string& spec, SpliceMode mode);
/// Every --sae, in order, in --sae-mode (else `fallback`).
std::vector<Splice> splice_saes(FlexModel& fm, const Args& args, SpliceMode fallback);
/// --sae-features active|top:K -> width for strongest_features (0: active).
int64_t parse_feature_width(const std::string& text);

/// Each forward's features of one spliced dictionary (after the hooks on its
/// hook_sae_acts_post), as SparseDictionary::on_features gives them. Keys of
/// what capture stores: "<module>.sae.feature_indices" / "feature_values" / "l0".
class FeatureRecorder {
 public:
  /// `width`: what take() keeps per token (strongest_features; 0: every active
  /// feature). `mesh` (null for one process): what take_gathered collects over.
  explicit FeatureRecorder(const Splice& splice, int64_t width = 0, std::shared_ptr<const DeviceMesh> mesh = nullptr);
  ~FeatureRecorder();
  FeatureRecorder(const FeatureRecorder&) = delete;
  FeatureRecorder& operator=(const FeatureRecorder&) = delete;
  /// The forwards recorded since the last take, oldest first, as codes [N tokens, d_sae].
  std::vector<SparseCode> take_codes();
  /// The same, each cut to `width` features per token.
  std::vector<StrongestFeatures> take();
  /// Collective over the mesh (every rank, after the same forwards): take()'s
  /// features on rank 0, sent by the pipeline stage that ran the dictionary
  /// (its tensor- and data-parallel ranks all see the whole activation; one
  /// sends). Empty on the other ranks; take() without a mesh.
  std::vector<StrongestFeatures> take_gathered();
  std::string key(const std::string& what) const { return module_ + ".sae." + what; }
  int64_t width() const { return width_; }

 private:
  std::string module_;
  int64_t width_;
  at::ScalarType dtype_;
  std::shared_ptr<const DeviceMesh> mesh_;
  std::shared_ptr<std::deque<SparseCode>> got_;
  HookHandle handle_;
};

// --- subcommands (each returns the exit code) ---------------------------------------
int run_inspect(const std::vector<std::string>& argv);
int run_capture(const std::vector<std::string>& argv);
/// capture --dataset (cmd_capture_dataset.cpp), after run_capture parsed the flags.
int run_capture_dataset(const Args& args, const std::string& model_dir, const Ranks& ranks);
int run_generate(const std::vector<std::string>& argv);
int run_train_sae(const std::vector<std::string>& argv);
int run_convert(const std::vector<std::string>& argv);
int run_report(const std::vector<std::string>& argv);
/// flexmodel features: a page of what a dictionary's features do on a corpus.
int run_features(const std::vector<std::string>& argv);
/// flexmodel attribute: one prompt's attribution graph through transcoders, as graph JSON.
int run_attribute(const std::vector<std::string>& argv);
/// flexmodel --version: flexmodel's and libtorch's versions, the libtorch build, MPI and NCCL.
int run_version();

}  // namespace flex::cli
