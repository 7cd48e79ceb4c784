#include <flex/sae/npz.h>

#include <flex/hooks/errors.h>

#include <ATen/ATen.h>
#include <zip.h>

#include <cstring>
#include <memory>
#include <regex>
#include <vector>

namespace flex {

namespace {

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }  // read-only: nothing to write back
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

at::ScalarType npy_dtype(const std::string& descr, const std::string& where) {
  if (descr.size() < 3) throw FileFormatError(where + ": dtype '" + descr + "' is not a NumPy type string");
  const char order = descr[0];
  if (order == '>') throw UnsupportedError(where + ": big-endian data ('" + descr + "')");
  const std::string kind = descr.substr(1);
  if (kind == "f4") return at::kFloat;
  if (kind == "f8") return at::kDouble;
  if (kind == "f2") return at::kHalf;
  if (kind == "i8") return at::kLong;
  if (kind == "i4") return at::kInt;
  if (kind == "i2") return at::kShort;
  if (kind == "i1") return at::kChar;
  if (kind == "u1") return at::kByte;
  if (kind == "b1") return at::kBool;
  throw UnsupportedError(where + ": dtype '" + descr + "' is not supported");
}

// One .npy member: magic, version, header dict, then the data.
at::Tensor parse_npy(const std::vector<char>& bytes, const std::string& where) {
  static const char magic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0)
    throw FileFormatError(where + ": not a .npy array (no \\x93NUMPY magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw FileFormatError(where + ": truncated .npy header");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    offset = 12;
  } else {
    throw FileFormatError(where + ": .npy version " + std::to_string(major) + " is not 1, 2 or 3");
  }
  if (offset + header_len > bytes.size()) throw FileFormatError(where + ": truncated .npy header");
  const std::string header(bytes.data() + offset, header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr'\\s*:\\s*'([^']*)'")))
    throw FileFormatError(where + ": .npy header has no 'descr'");
  const at::ScalarType dtype = npy_dtype(m[1].str(), where);
  const bool fortran = std::regex_search(header, std::regex("'fortran_order'\\s*:\\s*True"));
  if (!std::regex_search(header, m, std::regex("'shape'\\s*:\\s*\\(([^)]*)\\)")))
    throw FileFormatError(where + ": .npy header has no 'shape'");
  std::vector<int64_t> shape;
  const std::string dims = m[1].str();
  const std::regex number("\\d+");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  const size_t data_at = offset + header_len;
  const size_t need = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (bytes.size() - data_at != need)
    throw FileFormatError(where + ": " + std::to_string(bytes.size() - data_at) + " data bytes for shape " +
                          std::to_string(numel) + " elements of " + c10::toString(dtype) + " (" + std::to_string(need) +
                          " bytes)");
  if (!fortran) {
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(dtype));
    std::memcpy(t.data_ptr(), bytes.data() + data_at, need);
    return t;
  }
  // Fortran order: the reversed shape in C order, transposed back.
  std::vector<int64_t> reversed(shape.rbegin(), shape.rend());
  at::Tensor t = at::empty(reversed, at::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), bytes.data() + data_at, need);
  std::vector<int64_t> perm;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) perm.push_back(i);
  return t.permute(perm).contiguous();
}

}  // namespace

std::map<std::string, at::Tensor> read_npz(const std::string& path) {
  int err = 0;
  std::unique_ptr<zip_t, ZipCloser> z(zip_open(path.c_str(), ZIP_RDONLY, &err));
  if (!z) {
    zip_error_t e;
    zip_error_init_with_code(&e, err);
    const std::string why = zip_error_strerror(&e);
    zip_error_fini(&e);
    if (err == ZIP_ER_OPEN || err == ZIP_ER_NOENT || err == ZIP_ER_READ) throw IOError(path + ": cannot open (" + why + ")");
    throw FileFormatError(path + ": not a zip archive (.npz) (" + why + ")");
  }
  std::map<std::string, at::Tensor> out;
  const zip_int64_t n = zip_get_num_entries(z.get(), 0);
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    if (zip_stat_index(z.get(), i, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_NAME))
      throw FileFormatError(path + ": member " + std::to_string(i) + " cannot be read");
    std::string name = st.name;
    const std::string where = path + " member '" + name + "'";
    std::unique_ptr<zip_file_t, ZipFileCloser> f(zip_fopen_index(z.get(), i, 0));
    if (!f) throw FileFormatError(where + ": cannot be opened (" + zip_strerror(z.get()) + ")");
    std::vector<char> bytes(st.size);
    if (zip_fread(f.get(), bytes.data(), st.size) != static_cast<zip_int64_t>(st.size))
      throw FileFormatError(where + ": truncated (" + zip_file_strerror(f.get()) + ")");
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    out[name] = parse_npy(bytes, where);
  }
  return out;
}

}  // namespace flex
