// flexmodel report on a real capture of the golden GPT-2 and Llama fixtures:
// the head scores in the page equal an independent loop over the captured
// probabilities, the logit lens's last block equals the model's own output,
// every tensor is listed; then the page is opened in headless Chromium: the
// script draws every head, and a screenshot is not blank.
#include "cli_util.h"
#include "headless_chromium.h"

#include <flex/dispatch/safetensors.h>
#include <flex/models/auto_model.h>

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

using cli_test::run;
namespace fs = std::filesystem;

namespace {

/// Repeated random tokens: [2, 1 + 2 * 9], BOS-free.
at::Tensor repeated_ids(int64_t vocab) {
  at::manual_seed(5);
  at::Tensor half = at::randint(vocab, {2, 9}, at::kLong);
  return at::cat({at::randint(vocab, {2, 1}, at::kLong), half, half}, 1);
}

struct Scores {
  double previous = 0, first = 0, induction = 0;
};

/// Independent head scores: explicit loops over every row and position.
std::vector<Scores> loop_scores(const at::Tensor& probs, const at::Tensor& ids) {
  const int64_t B = probs.size(0), H = probs.size(1), T = probs.size(2);
  auto p = probs.to(at::kDouble).contiguous();
  auto a = p.accessor<double, 4>();
  auto id = ids.accessor<int64_t, 2>();
  std::vector<Scores> out(H);
  for (int64_t h = 0; h < H; ++h) {
    double prev = 0, first = 0, ind = 0;
    int64_t n = 0, nind = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 1; i < T; ++i) {
        prev += a[b][h][i][i - 1], first += a[b][h][i][0], ++n;
        int64_t j = -1;  // latest earlier occurrence of token i
        for (int64_t k = i - 1; k >= 0 && j < 0; --k)
          if (id[b][k] == id[b][i]) j = k;
        if (j >= 0 && j + 1 < i) ind += a[b][h][i][j + 1], ++nind;
      }
    out[h] = {prev / n, first / n, nind ? ind / nind : 0};
  }
  return out;
}

/// The page's head-score table: layer -> head -> the three numbers.
std::map<std::string, std::map<int, Scores>> page_scores(const std::string& html) {
  std::map<std::string, std::map<int, Scores>> out;
  std::regex row(R"(<tr><td>(layer \d+)</td><td class="num">(\d+)</td><td[^>]*>([0-9.]+)</td><td[^>]*>([0-9.]+)</td><td[^>]*>([0-9.]+|n/a)</td></tr>)");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), row); it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    out[m[1]][std::stoi(m[2])] = {std::stod(m[3]), std::stod(m[4]), m[5] == "n/a" ? -1 : std::stod(m[5])};
  }
  return out;
}

/// One logit-lens row of the page: its label's cells' tokens.
std::vector<std::string> lens_row(const std::string& html, const std::string& label) {
  const auto start = html.find("<tr><th>" + label + "</th>", html.find("id=\"logit-lens\""));
  if (start == std::string::npos) return {};
  const auto end = html.find("</tr>", start);
  std::vector<std::string> cells;
  std::regex cell(R"(<td [^>]*>([^<]*)</td>)");
  const std::string tr = html.substr(start, end - start);
  for (auto it = std::sregex_iterator(tr.begin(), tr.end(), cell); it != std::sregex_iterator(); ++it) cells.push_back((*it)[1]);
  return cells;
}

struct Captured {
  flex_test::TempDir dir;
  std::string capture, html, out;
};

/// capture (--hook all plus the attention probabilities) then report.
std::unique_ptr<Captured> capture_and_report(const std::string& model) {
  auto c = std::make_unique<Captured>();
  const auto cfg = flex::load_config(model);
  flex::save_safetensors(c->dir.str("ids.safetensors"), {{"input_ids", repeated_ids(cfg.vocab_size)}});
  c->capture = c->dir.str("cap.safetensors");
  auto r = run({"capture", model, "--input-ids", c->dir.str("ids.safetensors"), "--hook", "all", "--hook", "*.hook_attn_probs",
                "--out", c->capture});
  EXPECT_EQ(r.code, 0) << r.err;
  r = run({"report", c->capture, "--out", c->dir.str("report.html")});
  EXPECT_EQ(r.code, 0) << r.err;
  c->out = r.out;
  c->html = cli_test::slurp(c->dir.str("report.html"));
  return c;
}

class CliReport : public ::testing::TestWithParam<std::string> {};

TEST_P(CliReport, ScoresLensAndTensorsMatchTheCapture) {
  const std::string model = flex_test::fixture("models/" + GetParam());
  auto c = capture_and_report(model);
  ASSERT_FALSE(c->html.empty());
  auto f = flex::SafetensorsFile::open(c->capture);
  const at::Tensor ids = f->get("input_ids");
  const auto cfg = flex::load_config(model);

  // Head scores: every layer's hook_attn_probs against the loops (the page rounds to 2 decimals).
  const auto page = page_scores(c->html);
  ASSERT_EQ(page.size(), static_cast<size_t>(cfg.num_hidden_layers)) << c->html.substr(0, 2000);
  int layers_seen = 0;
  for (const auto& n : f->names()) {
    if (n.find("hook_attn_probs") == std::string::npos) continue;
    const std::smatch m = [&] {
      std::smatch s;
      std::regex_search(n, s, std::regex(R"(\.(\d+)\.)"));
      return s;
    }();
    const auto expected = loop_scores(f->get(n), ids);
    const auto& got = page.at("layer " + m[1].str());
    ASSERT_EQ(got.size(), expected.size()) << n;
    for (size_t h = 0; h < expected.size(); ++h) {
      EXPECT_NEAR(got.at(h).previous, expected[h].previous, 0.0051) << n << " head " << h;
      EXPECT_NEAR(got.at(h).first, expected[h].first, 0.0051) << n << " head " << h;
      EXPECT_NEAR(got.at(h).induction, expected[h].induction, 0.0051) << n << " head " << h;
    }
    ++layers_seen;
  }
  EXPECT_EQ(layers_seen, cfg.num_hidden_layers);

  // The lens of the last block is the model's own prediction (final norm + head),
  // and the output row is the argmax of the captured logits.
  const auto output = lens_row(c->html, "output");
  const auto last = lens_row(c->html, "layer " + std::to_string(cfg.num_hidden_layers - 1));
  ASSERT_EQ(output.size(), static_cast<size_t>(ids.size(1)));
  EXPECT_EQ(last, output);
  const at::Tensor top = f->get("logits")[0].argmax(-1);
  for (int64_t t = 0; t < ids.size(1); ++t)  // the fixtures have no tokenizer: ids
    EXPECT_EQ(output[t], "#" + std::to_string(top[t].item<int64_t>())) << "position " << t;

  // Every tensor listed, and the model folder found from the capture's metadata.
  for (const auto& n : f->names()) EXPECT_NE(c->html.find("<tr><td>" + n + "</td>"), std::string::npos) << n;
  EXPECT_NE(c->html.find("model " + model), std::string::npos);
  EXPECT_EQ(c->html.find("http"), std::string::npos) << "the page must not load anything";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CliReport, ::testing::Values("gpt2", "llama", "mixtral"));

TEST(CliReportErrors, BadInputsAreTypedErrors) {
  flex_test::TempDir tmp;
  auto r = run({"report", tmp.str("missing.safetensors"), "--out", tmp.str("r.html")});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("missing.safetensors"), std::string::npos) << r.err;
  r = run({"report", tmp.str("x.safetensors")});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  flex::save_safetensors(tmp.str("x.safetensors"), {{"input_ids", at::zeros({1, 4}, at::kLong)}});
  r = run({"report", tmp.str("x.safetensors"), "--out", tmp.str("r.html"), "--row", "3"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--row 3"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.str("r.html")));
}

// ---- findings from hand-made attention --------------------------------------------

/// A capture with attention written by hand: one row of distinct tokens whose
/// span [a, a + L) is copied to [b, b + L). Layer 0 head 0 attends to the
/// previous token; layer 1 head 0 attends from each repeated token to the
/// token after its earlier occurrence (`induction_layer` 1), or that pattern
/// sits in layer 0 head 1 instead (`induction_layer` 0, where it can only be
/// found by offset). Every other row of every head is uniform.
void write_attention_capture(const std::string& path, int induction_layer) {
  const int64_t T = 40, H = 2, a = 5, L = 8, b = 23;
  at::Tensor ids = at::arange(100, 100 + T, at::kLong).unsqueeze(0);
  ids.narrow(1, b, L).copy_(ids.narrow(1, a, L));
  auto uniform = [&] {
    at::Tensor p = at::ones({1, H, T, T}).tril();
    return p / p.sum(-1, true);
  };
  at::Tensor l0 = uniform(), l1 = uniform();
  for (int64_t i = 1; i < T; ++i) {
    l0[0][0][i].zero_();
    l0[0][0][i][i - 1] = 1;
  }
  at::Tensor& ind = induction_layer == 1 ? l1 : l0;
  const int64_t ind_head = induction_layer == 1 ? 0 : 1;
  for (int64_t i = b; i < b + L; ++i) {  // token i repeats token i - (b - a); attend to that one's successor
    ind[0][ind_head][i].zero_();
    ind[0][ind_head][i][i - (b - a) + 1] = 1;
  }
  flex::save_safetensors(path, {{"input_ids", ids},
                                {"transformer.h.0.attn.hook_attn_probs", l0},
                                {"transformer.h.1.attn.hook_attn_probs", l1}});
}

TEST(CliReportFindings, NamesThePreviousTokenAndTheInductionHeadOfACircuit) {
  flex_test::TempDir tmp;
  write_attention_capture(tmp.str("c.safetensors"), 1);
  auto r = run({"report", tmp.str("c.safetensors"), "--out", tmp.str("r.html")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Induction circuit: layer 0 head 0 attends to the previous token (1.00), and layer 1 head 0 attends "
                       "from a repeated token to the token after its earlier occurrence (1.00)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Induction heads: layer 1 head 0 (1.00)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("No induction head"), std::string::npos) << r.out;
}

TEST(CliReportFindings, AFirstLayerHeadOnTheCopyIsFoundByPositionNotAnInductionHead) {
  flex_test::TempDir tmp;
  write_attention_capture(tmp.str("c.safetensors"), 0);
  auto r = run({"report", tmp.str("c.safetensors"), "--out", tmp.str("r.html")});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("Copy found by position: layer 0 head 1 (1.00)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No induction head"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Induction circuit"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Induction heads:"), std::string::npos) << r.out;
}

// ---- headless Chromium --------------------------------------------------------------

/// RGB(A) pixels of an 8-bit PNG (colour types 2 and 6), decoded with zlib.
struct Image {
  int64_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

Image read_png(const std::string& path) {
  const std::string s = cli_test::slurp(path);
  Image img;
  if (s.size() < 8 || s.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return img;
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
           uint32_t(uint8_t(s[at + 3]));
  };
  std::string idat;
  for (size_t at = 8; at + 8 <= s.size();) {
    const uint32_t len = be32(at);
    const std::string type = s.substr(at + 4, 4);
    if (at + 12 + len > s.size()) return {};
    if (type == "IHDR") {
      img.width = be32(at + 8), img.height = be32(at + 12);
      if (s[at + 16] != 8) return {};
      img.channels = s[at + 17] == 2 ? 3 : s[at + 17] == 6 ? 4 : 0;
    } else if (type == "IDAT") {
      idat += s.substr(at + 8, len);
    }
    at += 12 + len;
  }
  if (!img.channels) return {};
  const int64_t stride = img.width * img.channels;
  std::vector<uint8_t> raw(static_cast<size_t>((stride + 1) * img.height));
  uLongf n = raw.size();
  if (uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK) return {};
  img.pixels.assign(static_cast<size_t>(stride * img.height), 0);
  for (int64_t y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &img.pixels[y * stride];
    const uint8_t* up = y ? &img.pixels[(y - 1) * stride] : nullptr;
    for (int64_t x = 0; x < stride; ++x) {
      const int a = x >= img.channels ? out[x - img.channels] : 0, b = up ? up[x] : 0,
                c = up && x >= img.channels ? up[x - img.channels] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      else if (filter == 2) pred = b;
      else if (filter == 3) pred = (a + b) / 2;
      else if (filter == 4) {
        const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      out[x] = static_cast<uint8_t>(in[x] + pred);
    }
  }
  return img;
}

TEST(CliReportBrowser, HeadlessChromiumDrawsEveryHeadAndTheScreenshotIsNotBlank) {
  auto c = capture_and_report(flex_test::fixture("models/gpt2"));
  const cli_test::HeadlessChromium chromium(c->dir.str("profile"));
  if (!chromium.found()) GTEST_SKIP() << "no chromium (scripts/install-deps.sh --tests installs it)";
  const std::string page = "file://" + c->dir.str("report.html");
  // The DOM after the page's script ran.
  const std::string dom = c->dir.str("dom.html");
  ASSERT_EQ(chromium.dump_dom(page, dom), 0);
  const std::string html = cli_test::slurp(dom);
  const auto cfg = flex::load_config(flex_test::fixture("models/gpt2"));
  size_t thumbs = 0;
  for (size_t at = html.find("class=\"thumb"); at != std::string::npos; at = html.find("class=\"thumb", at + 1)) ++thumbs;
  EXPECT_EQ(thumbs, static_cast<size_t>(cfg.num_hidden_layers * cfg.num_attention_heads));
  EXPECT_TRUE(std::regex_search(html, std::regex(R"(<p id="attn-title">layer \d+ head \d+ \()"))) << "the enlarged head has no title";
  EXPECT_NE(html.find("<li>"), std::string::npos) << "no findings";
  EXPECT_NE(html.find("id=\"logit-lens\""), std::string::npos);

  // A screenshot: mostly white is blank; the heatmaps and tables make colour.
  const std::string shot = c->dir.str("shot.png");
  ASSERT_EQ(chromium.screenshot(page, shot, 1280, 1600), 0);
  const Image img = read_png(shot);
  ASSERT_EQ(img.width, 1280);
  ASSERT_EQ(img.height, 1600);
  int64_t non_white = 0;
  std::set<uint32_t> colours;
  for (int64_t i = 0; i < img.width * img.height; ++i) {
    const uint8_t* p = &img.pixels[i * img.channels];
    if (p[0] < 240 || p[1] < 240 || p[2] < 240) ++non_white;
    colours.insert((uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | p[2]);
  }
  EXPECT_GT(non_white, img.width * img.height / 50) << "the screenshot is (nearly) blank";
  EXPECT_GT(colours.size(), 64u);
}

}  // namespace
