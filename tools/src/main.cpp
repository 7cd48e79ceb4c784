// flexmodel: the command line for the common jobs (inspect, capture,
// generate, convert). Errors are one line on stderr, "flexmodel: error: ...",
// with exit code 2 for command-line mistakes and 1 for everything else.
#include "cli.h"

#include <flex/hooks/errors.h>
#include <flex/kernels/memory_reuse.h>
#include <flex/sae/tl_hook_names.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace {

const char* kUsage =
    "usage: flexmodel COMMAND MODEL_DIR|CAPTURE [options]\n"
    "\n"
    "commands:\n"
    "  inspect    architecture, module sizes, tied parameters, the device map for a budget\n"
    "  capture    hooked forward pass; activations (and dictionary features) to a safetensors file\n"
    "  generate   text generation with steering, ablation, patching and feature edits\n"
    "  convert    re-shard, change dtype, or write an Accelerate offload folder\n"
    "  report     a capture file as one HTML page: attention, logit lens, norms, findings\n"
    "  features   a sparse dictionary's features on a corpus as one HTML page\n"
    "  train-sae  a sparse autoencoder or transcoder trained on captured activations\n"
    "  attribute  one prompt's attribution graph through per-layer transcoders, as graph JSON\n"
    "\n"
    "flexmodel --version prints the versions of flexmodel, libtorch, MPI and NCCL.\n"
    "flexmodel COMMAND --help shows a command's options. Log level: --log-level or\n"
    "$FLEXMODEL_LOG (error, warn, info, debug).\n";

/// One line: messages from deeper layers may span lines.
std::string one_line(std::string s) {
  for (auto& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

int fail(int code, const std::string& message) {
  // Under mpirun every failing rank reports; say which one it is.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const std::string who = rank && size && std::string(size) != "1" ? std::string("rank ") + rank + ": " : "";
  // One write per line: under mpirun the ranks share one stderr, and a line
  // written in pieces interleaves with another rank's ("flexmodel: error:
  // flexmodel: error: rank 0: ...").
  const std::string line = "flexmodel: error: " + who + one_line(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // Every command runs forward after forward (or training steps): freed
  // activations are reused rather than page-faulted in again (design 32).
  flex::keep_freed_memory();
  // TransformerLens hook names (blocks.3.hook_resid_post) wherever a module name is.
  flex::install_transformer_lens_names();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      std::cout << kUsage;
      return 0;
    }
    if (cmd == "--version" || cmd == "version") return flex::cli::run_version();
    if (cmd == "inspect") return flex::cli::run_inspect(args);
    if (cmd == "capture") return flex::cli::run_capture(args);
    if (cmd == "generate") return flex::cli::run_generate(args);
    if (cmd == "convert") return flex::cli::run_convert(args);
    if (cmd == "report") return flex::cli::run_report(args);
    if (cmd == "features") return flex::cli::run_features(args);
    if (cmd == "train-sae") return flex::cli::run_train_sae(args);
    if (cmd == "attribute") return flex::cli::run_attribute(args);
    return fail(2, "unknown command '" + cmd +
                       "' (use inspect, capture, generate, convert, report, features, train-sae or attribute; flexmodel --help)");
  } catch (const flex::cli::UsageError& e) {
    return fail(2, e.what());
  } catch (const c10::Error& e) {
    return fail(1, e.what_without_backtrace());  // libtorch's own checks (shape, dtype)
  } catch (const std::exception& e) {
    // flex::Error and the rest (libtorch's c10::Error included).
    return fail(1, e.what());
  }
}
