// flexmodel report: a capture file as one self-contained HTML page
// (attention patterns, head scores, logit lens, activation norms, tensors),
// and its findings as lines on stdout.
#include "cli.h"
#include "report.h"

#include <flex/dispatch/atomic_file.h>

#include <iostream>

namespace flex::cli {

namespace {

const std::vector<Flag>& report_flags() {
  static const std::vector<Flag> flags = {
      {"--out", "FILE.html", "the report (one HTML file, no external resources)"},
      {"--tokenizer", "DIR", "folder whose tokenizer labels the tokens (default: the model folder)"},
      {"--model", "DIR", "model folder for the logit lens's final norm and unembedding (default: the folder the "
                         "capture records, when it still exists)"},
      {"--row", "B", "the batch row the pictures show (default 0)"},
      {"--max-positions", "N", "pictures show at most the first N positions (default 128)"},
      {"--log-level", "LEVEL", "error|warn|info|debug (default: $FLEXMODEL_LOG, else warn)"},
  };
  return flags;
}

}  // namespace

int run_report(const std::vector<std::string>& argv) {
  Args args("report", report_flags(), argv);
  if (args.help()) {
    std::cout << usage_text("report", "CAPTURE.safetensors --out FILE.html [options]", report_flags(),
                            "Writes what a capture from `flexmodel capture --out` holds as one HTML page: the\n"
                            "findings, attention patterns per layer and head with token labels, what each head\n"
                            "does (previous-token, first-token and induction scores), a logit lens of the block\n"
                            "outputs, activation norms per module and the list of tensors. Reads one tensor at a\n"
                            "time. Prints the findings on stdout.");
    return 0;
  }
  set_log_level(args.get("--log-level"));
  report::Options o;
  o.capture = args.one_positional("CAPTURE.safetensors");
  const auto out = args.get("--out");
  if (!out) throw UsageError("missing --out FILE.html");
  o.model = args.get("--model");
  o.tokenizer = args.get("--tokenizer");
  o.row = args.get_int("--row").value_or(0);
  o.max_positions = args.get_int("--max-positions").value_or(128);
  if (o.row < 0) throw UsageError("option --row must be >= 0");
  if (o.max_positions < 1) throw UsageError("option --max-positions must be at least 1");
  require_writable_file(*out);

  const report::Report r = report::analyze(o);
  write_file_atomic(*out, report::render_html(r));  // whole or nothing
  for (const auto& line : r.findings) std::cout << line << "\n";
  std::cout << "flexmodel: wrote " << *out << " (" << r.attention.size() << " attention layer(s), " << r.lens.size()
            << " logit-lens row(s), " << r.norms.size() << " activation norm(s), " << r.tensors.size() << " tensors)\n";
  return 0;
}

}  // namespace flex::cli
