#pragma once
// flexmodel features: what a sparse dictionary's features do on a corpus.
// cmd_features.cpp runs the corpus with the dictionary spliced (observe) and
// gathers the numbers below; features_html.cpp draws them as one
// self-contained page (and embeds them as JSON for programs).
#include <cstdint>
#include <string>
#include <vector>

namespace flex::cli::features {

/// A window of a context around one token where the feature fires.
struct Example {
  int64_t context = 0, position = 0;  // in the corpus's contexts; the token's offset
  double value = 0;                   // the feature's activation there
  int64_t first = 0;                  // offset of tokens[0] in the context
  std::vector<std::string> tokens;    // as shown
  std::vector<double> acts;           // the feature's activation at each of them
};

struct TokenEffect {
  std::string token;
  int64_t id = 0;
  double logit = 0;
};

struct Feature {
  int64_t index = 0;
  int64_t count = 0;       // tokens where it is active (> 0)
  double density = 0;      // count / tokens
  double max = 0, mean = 0;  // over the tokens where it is active
  double bin_width = 0;    // histogram of the active values: bins [i*w, (i+1)*w)
  std::vector<int64_t> histogram;
  std::vector<Example> examples;  // strongest first, one per token
  bool has_logits = false;        // the decoder row lives in the residual stream
  std::vector<TokenEffect> promoted, suppressed;  // W_dec[f] . W_U, largest / smallest
};

struct Page {
  std::string sae, model, dataset, hook, place, architecture;
  int64_t d_in = 0, d_sae = 0;
  int64_t tokens = 0, contexts = 0, context_len = 0;
  double mean_l0 = 0;        // active features per token
  int64_t dead = 0;          // features never active on these tokens
  std::string selection;     // "requested" / "most frequent"
  std::vector<Feature> features;
};

/// The page: HTML with inline CSS, no script or network needed to read it;
/// the numbers also as JSON in <script type="application/json" id="feature-data">.
std::string render_html(const Page& page);

}  // namespace flex::cli::features
