#pragma once
// A heatmap as an SVG file, written by hand (no library): rows x columns of
// cells coloured by a value in [0, 1] (white -> dark blue), optional text in
// each cell, row and column labels, a title. Written to a temporary name and
// renamed, like every output of this project.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace flex_examples {

struct Heatmap {
  std::string title;
  std::vector<std::string> row_labels, col_labels;
  std::vector<std::vector<double>> values;        // [rows][cols], in [0, 1]
  std::vector<std::vector<std::string>> text;      // optional, same shape
  std::string value_label = "probability";
};

inline std::string svg_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += (static_cast<unsigned char>(c) < 0x20) ? '?' : c;
    }
  }
  return o;
}

/// White (0) to dark blue (1).
inline std::string heat_colour(double v) {
  v = std::clamp(v, 0.0, 1.0);
  const int r = static_cast<int>(255 - v * (255 - 8)), g = static_cast<int>(255 - v * (255 - 48)),
            b = static_cast<int>(255 - v * (255 - 107));
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", r, g, b);
  return buf;
}

inline void write_heatmap_svg(const std::string& path, const Heatmap& h) {
  const int cell_w = 56, cell_h = 26, left = 150, top = 60, legend = 40;
  const int rows = static_cast<int>(h.values.size());
  const int cols = rows ? static_cast<int>(h.values[0].size()) : 0;
  const int width = left + cols * cell_w + 20, height = top + rows * cell_h + legend + 30;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"monospace\" font-size=\"11\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"10\" y=\"22\" font-size=\"15\">" << svg_escape(h.title) << "</text>\n";
  for (int c = 0; c < cols; ++c)
    s << "<text x=\"" << left + c * cell_w + cell_w / 2 << "\" y=\"" << top - 8 << "\" text-anchor=\"middle\">"
      << svg_escape(c < static_cast<int>(h.col_labels.size()) ? h.col_labels[c] : std::to_string(c)) << "</text>\n";
  for (int r = 0; r < rows; ++r) {
    const int y = top + r * cell_h;
    s << "<text x=\"" << left - 6 << "\" y=\"" << y + cell_h / 2 + 4 << "\" text-anchor=\"end\">"
      << svg_escape(r < static_cast<int>(h.row_labels.size()) ? h.row_labels[r] : std::to_string(r)) << "</text>\n";
    for (int c = 0; c < cols; ++c) {
      const double v = h.values[r][c];
      const int x = left + c * cell_w;
      s << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell_w << "\" height=\"" << cell_h << "\" fill=\""
        << heat_colour(v) << "\" stroke=\"#ccc\"><title>" << v << "</title></rect>\n";
      if (r < static_cast<int>(h.text.size()) && c < static_cast<int>(h.text[r].size()))
        s << "<text x=\"" << x + cell_w / 2 << "\" y=\"" << y + cell_h / 2 + 4 << "\" text-anchor=\"middle\" fill=\""
          << (v > 0.5 ? "white" : "black") << "\">" << svg_escape(h.text[r][c]) << "</text>\n";
    }
  }
  // Legend: 0 .. 1.
  const int ly = top + rows * cell_h + 20;
  for (int i = 0; i <= 10; ++i)
    s << "<rect x=\"" << left + i * 20 << "\" y=\"" << ly << "\" width=\"20\" height=\"12\" fill=\"" << heat_colour(i / 10.0)
      << "\"/>\n";
  s << "<text x=\"" << left - 6 << "\" y=\"" << ly + 10 << "\" text-anchor=\"end\">" << svg_escape(h.value_label)
    << " 0</text>\n<text x=\"" << left + 11 * 20 + 4 << "\" y=\"" << ly + 10 << "\">1</text>\n</svg>\n";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << s.str();
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

}  // namespace flex_examples
