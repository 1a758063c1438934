// safetensors reader (mmap + full header validation) and atomic writer.
// Non-obvious decision: the writer lays the data section out like the reference writer — tensors
// sorted by element size (descending) then name, packed with no gaps — so every tensor lands on its
// natural alignment (the data section starts 8-aligned because the header is space-padded to a
// multiple of 8) AND the file passes the reference reader, which rejects any hole between ranges.
// The header's JSON keys are in name order.
//
// What the reader enforces (the format's rules, as the reference `safetensors` reader checks them;
// each is an Error naming the file and the tensor, tests/io/test_safetensors_strict.cpp):
//   1. u64 little-endian header length N with 8 + N <= file size, and N <= 100 MB (reference limit).
//   2. The header is exactly one JSON object: its first byte is '{', and after the object only
//      whitespace (the writer's space padding) may follow.
//   3. Keys are unique at every level: a name listed twice is an error (nlohmann keeps the last
//      one silently, so duplicates are caught by a parser callback while parsing).
//   4. Each entry is {dtype, shape, data_offsets: [begin, end]}, dtype known, shape entries
//      non-negative integers, numel × element size == end − begin (no overflow).
//   5. Ranges lie inside the data section, do not overlap, and the non-empty ones tile it exactly:
//      sorted by begin, the first starts at 0, each starts where the previous ended, the last ends
//      at the end of the file (no holes, no trailing bytes). Empty tensors take no bytes and may sit
//      at any offset inside the section.
//   6. `__metadata__`, when present, is an object of string → string.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/half.h"
#include "format/fp_codecs.h"

namespace moesq::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; the mmap reader reinterprets it in place");

namespace {

// The reference reader refuses headers above 100 MB; the same bound keeps a corrupt length from
// making us parse gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

template <typename T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // data may be unaligned; host is little-endian (static_assert)
  return v;
}

// numel of `shape`, or false on overflow of uint64.
bool checked_numel(const std::vector<int64_t>& shape, uint64_t* out) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

// A JSON number that is a non-negative integer fitting in int64 (shape entries, offsets).
bool json_nonneg_int(const nlohmann::json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = i;
    return true;
  }
  return false;
}

}  // namespace

// ---- dtypes --------------------------------------------------------------------------------

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F8_E4M3: return 1;
    case DType::I8: return 1;
    case DType::U8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  MOESQ_FAIL("dtype_size: invalid DType value ", static_cast<int>(dt));
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  MOESQ_FAIL("dtype_name: invalid DType value ", static_cast<int>(dt));
}

DType parse_dtype(const std::string& name) {
  static const DType kAll[] = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                               DType::I8,  DType::U8,  DType::I32,  DType::I64};
  for (DType dt : kAll) {
    if (name == dtype_name(dt)) return dt;
  }
  MOESQ_FAIL("unsupported dtype \"", name,
             "\" (moesq reads F32, F16, BF16, F8_E4M3, I8, U8, I32, I64)");
}

// ---- TensorView ----------------------------------------------------------------------------

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

std::vector<float> to_f32(const TensorView& t) {
  const int64_t n = t.numel();
  MOESQ_CHECK(static_cast<uint64_t>(n) * dtype_size(t.dtype) == t.nbytes, t.file, ": tensor ", t.name,
              " holds ", t.nbytes, " bytes, not ", t.shape_str(), " × ", dtype_name(t.dtype));
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = t.data;
  switch (t.dtype) {
    case DType::F32:
      if (n) std::memcpy(out.data(), p, t.nbytes);
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_le<uint16_t>(p + 2 * i));
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_le<uint16_t>(p + 2 * i));
      break;
    case DType::F8_E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = format::e4m3_decode(p[i]);  // the one E4M3 decoder (format/fp_codecs)
      break;
    case DType::I8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<int8_t>(p[i]));
      break;
    case DType::U8:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
      break;
    case DType::I32:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_le<int32_t>(p + 4 * i));
      break;
    case DType::I64:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(load_le<int64_t>(p + 8 * i));
      break;
  }
  return out;
}

std::vector<float> to_f32_finite(const TensorView& t) {
  std::vector<float> v = to_f32(t);
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) [[likely]] continue;
    std::ostringstream idx;  // [i0, i1, ...] of element i
    size_t rest = i;
    std::vector<int64_t> at(t.shape.size());
    for (size_t d = t.shape.size(); d-- > 0;) {
      at[d] = static_cast<int64_t>(rest % static_cast<size_t>(t.shape[d]));
      rest /= static_cast<size_t>(t.shape[d]);
    }
    for (size_t d = 0; d < at.size(); ++d) idx << (d ? ", " : "") << at[d];
    MOESQ_FAIL(t.file, ": tensor ", t.name, " ", t.shape_str(), " ", dtype_name(t.dtype), " holds a non-finite value (",
               v[i], ") at [", idx.str(), "]");
  }
  return v;
}

// ---- reader --------------------------------------------------------------------------------

namespace {

// Opens and maps `path` read-only (the mapping keeps the file alive after the fd is closed).
void* map_file(const std::string& path, uint64_t* size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MOESQ_CHECK(fd >= 0, "cannot open safetensors file ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MOESQ_FAIL(path, ": not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    MOESQ_FAIL(path, ": truncated safetensors file (", file_size, " bytes, less than the 8-byte header length)");
  }
  void* m = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  MOESQ_CHECK(m != MAP_FAILED, "cannot mmap ", path, ": ", std::strerror(errno));
  *size = file_size;
  return m;
}

// The 8-byte little-endian header length and the JSON header object after it.
nlohmann::json parse_header(const std::string& path, const uint8_t* base, uint64_t file_size,
                            uint64_t* header_len) {
  *header_len = load_le<uint64_t>(base);
  MOESQ_CHECK(*header_len <= file_size - 8, path, ": header length ", *header_len,
              " runs past the end of the file (", file_size, " bytes): truncated or not safetensors");
  MOESQ_CHECK(*header_len <= kMaxHeaderBytes, path, ": header length ", *header_len, " exceeds the ",
              kMaxHeaderBytes, "-byte limit");
  const std::string_view text(reinterpret_cast<const char*>(base + 8), *header_len);
  MOESQ_CHECK(!text.empty() && text.front() == '{', path, ": JSON header is not an object (it must start with '{')");
  // Rule 3: one set of keys per open object; a repeated key is remembered (the callback must not
  // throw through the parser) and reported after the parse.
  std::vector<std::set<std::string>> open_keys;
  std::string duplicate;
  int duplicate_depth = 0;
  const nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                           nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) open_keys.emplace_back();
    if (event == E::object_end && !open_keys.empty()) open_keys.pop_back();
    if (event == E::key && !open_keys.empty() && duplicate.empty() &&
        !open_keys.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
      duplicate_depth = depth;
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, on_event);  // strict: trailing non-whitespace is an error
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(path, ": malformed JSON header: ", e.what());
  }
  MOESQ_CHECK(duplicate.empty(), path, ": JSON header lists key \"", duplicate, "\" twice",
              duplicate_depth <= 1 ? " (tensor names must be unique)" : " inside one entry");
  MOESQ_CHECK(header.is_object(), path, ": JSON header is not an object");
  return header;
}

void read_metadata(const std::string& path, const nlohmann::json& v, std::map<std::string, std::string>& out) {
  MOESQ_CHECK(v.is_object(), path, ": __metadata__ is not an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    MOESQ_CHECK(it.value().is_string(), path, ": __metadata__ value of \"", it.key(), "\" is not a string");
    out[it.key()] = it.value().get<std::string>();
  }
}

// One header entry → a view into the data section [data, data + data_size); every field checked
// (dtype, shape, offsets inside the data section, size = numel × element size). *begin, *end: its
// byte range, for the overlap check.
TensorView parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                       const uint8_t* data, uint64_t data_size, int64_t* begin, int64_t* end) {
  MOESQ_CHECK(!name.empty(), path, ": tensor with an empty name");
  MOESQ_CHECK(v.is_object(), path, ": tensor ", name, ": entry is not an object");
  MOESQ_CHECK(v.contains("dtype") && v["dtype"].is_string(), path, ": tensor ", name,
              ": missing or non-string \"dtype\"");
  MOESQ_CHECK(v.contains("shape") && v["shape"].is_array(), path, ": tensor ", name,
              ": missing or non-array \"shape\"");
  MOESQ_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2, path,
              ": tensor ", name, ": \"data_offsets\" must be [begin, end]");
  TensorView t;
  t.name = name;
  t.file = path;
  try {
    t.dtype = parse_dtype(v["dtype"].get<std::string>());
  } catch (const Error& e) {
    MOESQ_FAIL(path, ": tensor ", name, ": ", e.what());
  }
  for (const auto& d : v["shape"]) {
    int64_t dim = 0;
    MOESQ_CHECK(json_nonneg_int(d, &dim), path, ": tensor ", name, ": shape entry ", d.dump(),
                " is not a non-negative integer");
    t.shape.push_back(dim);
  }
  MOESQ_CHECK(json_nonneg_int(v["data_offsets"][0], begin) && json_nonneg_int(v["data_offsets"][1], end), path,
              ": tensor ", name, ": data_offsets ", v["data_offsets"].dump(), " are not non-negative integers");
  MOESQ_CHECK(*begin <= *end, path, ": tensor ", name, ": data_offsets [", *begin, ", ", *end, ") has begin > end");
  MOESQ_CHECK(static_cast<uint64_t>(*end) <= data_size, path, ": tensor ", name, ": data_offsets [", *begin, ", ",
              *end, ") run past the data section (", data_size, " bytes)");
  uint64_t numel = 0;
  MOESQ_CHECK(checked_numel(t.shape, &numel), path, ": tensor ", name, ": shape ", t.shape_str(), " overflows");
  const uint64_t nbytes = static_cast<uint64_t>(*end - *begin);
  const uint64_t esize = dtype_size(t.dtype);
  uint64_t need = 0;
  MOESQ_CHECK(!__builtin_mul_overflow(numel, esize, &need) && need == nbytes, path, ": tensor ", name, ": shape ",
              t.shape_str(), " × ", dtype_name(t.dtype), " (", esize, " B/element) does not match data_offsets [",
              *begin, ", ", *end, ") = ", nbytes, " bytes");
  t.data = data + *begin;
  t.nbytes = nbytes;
  return t;
}

struct ByteRange {
  uint64_t begin, end;
  const std::string* name;
};

// Rule 5: the non-empty ranges, sorted by begin, tile [0, data_size) exactly — no overlap, no hole,
// no trailing bytes. Empty ranges occupy nothing (their bounds were checked by parse_entry).
void check_ranges_tile_data(const std::string& path, std::vector<ByteRange> ranges, uint64_t data_size) {
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const ByteRange* prev = nullptr;
  for (const ByteRange& r : ranges) {
    if (r.begin == r.end) continue;
    if (prev) {
      MOESQ_CHECK(r.begin >= prev->end, path, ": tensors ", *prev->name, " [", prev->begin, ", ", prev->end,
                  ") and ", *r.name, " [", r.begin, ", ", r.end, ") overlap");
      MOESQ_CHECK(r.begin == prev->end, path, ": hole of ", r.begin - prev->end, " bytes in the data section between ",
                  *prev->name, " (ends at ", prev->end, ") and ", *r.name, " (begins at ", r.begin, ")");
    } else {
      MOESQ_CHECK(r.begin == 0, path, ": the data section does not start with a tensor: the first one, ", *r.name,
                  ", begins at ", r.begin);
    }
    prev = &r;
  }
  const uint64_t covered = prev ? prev->end : 0;
  MOESQ_CHECK(covered == data_size, path, ": ", data_size - covered, " bytes after the last tensor",
              prev ? " (" + *prev->name + ")" : std::string(), ": the data section is ", data_size,
              " bytes, the tensors cover ", covered);
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  uint64_t file_size = 0;
  map_ = map_file(path, &file_size);
  map_size_ = file_size;
  // From here on a throw must unmap: the destructor does not run for a half-built object.
  try {
    const auto* base = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    const nlohmann::json header = parse_header(path, base, map_size_, &header_len);
    const uint8_t* data = base + 8 + header_len;
    const uint64_t data_size = map_size_ - 8 - header_len;
    std::vector<ByteRange> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == kMetadataKey) {
        read_metadata(path, it.value(), metadata_);
        continue;
      }
      int64_t begin = 0, end = 0;
      TensorView t = parse_entry(path, it.key(), it.value(), data, data_size, &begin, &end);
      auto [pos, inserted] = tensors_.emplace(it.key(), std::move(t));
      (void)inserted;  // keys are unique: parse_header rejects a repeated one
      ranges.push_back({static_cast<uint64_t>(begin), static_cast<uint64_t>(end), &pos->first});
    }
    check_ranges_tile_data(path, std::move(ranges), data_size);
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  MOESQ_CHECK(it != tensors_.end(), "tensor ", name, " not found in ", path_);
  return it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;  // std::map: already sorted
}

// ---- writer --------------------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            const void* data, size_t nbytes) {
  MOESQ_CHECK(!name.empty(), "safetensors writer: empty tensor name");
  MOESQ_CHECK(name != kMetadataKey, "safetensors writer: \"", name, "\" is reserved");
  MOESQ_CHECK(!tensors_.count(name), "safetensors writer: tensor ", name, " added twice");
  for (int64_t d : shape) {
    MOESQ_CHECK(d >= 0, "safetensors writer: tensor ", name, " has a negative dimension");
  }
  uint64_t numel = 0;
  MOESQ_CHECK(checked_numel(shape, &numel), "safetensors writer: tensor ", name, " shape overflows");
  MOESQ_CHECK(numel * dtype_size(dtype) == nbytes, "safetensors writer: tensor ", name, ": ", nbytes,
              " bytes given, shape × ", dtype_name(dtype), " needs ", numel * dtype_size(dtype));
  Entry e{dtype, shape, std::vector<uint8_t>(nbytes)};
  if (nbytes) std::memcpy(e.bytes.data(), data, nbytes);
  tensors_.emplace(name, std::move(e));
}

void SafetensorsWriter::add_f32(const std::string& name, const std::vector<int64_t>& shape,
                                const std::vector<float>& v) {
  add(name, DType::F32, shape, v.data(), v.size() * sizeof(float));
}

size_t SafetensorsWriter::data_bytes() const {
  size_t n = 0;
  for (const auto& [name, e] : tensors_) n += e.bytes.size();
  return n;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, e] : tensors_) out.push_back(name);
  return out;
}

size_t SafetensorsWriter::nbytes(const std::string& name) const {
  auto it = tensors_.find(name);
  MOESQ_CHECK(it != tensors_.end(), "safetensors writer: no tensor ", name);
  return it->second.bytes.size();
}

int64_t SafetensorsWriter::numel(const std::string& name) const {
  auto it = tensors_.find(name);
  MOESQ_CHECK(it != tensors_.end(), "safetensors writer: no tensor ", name);
  int64_t n = 1;
  for (int64_t d : it->second.shape) n *= d;
  return n;
}

void SafetensorsWriter::write(const std::string& path) const { write_subset(path, names(), {}); }

void SafetensorsWriter::write_subset(const std::string& path, const std::vector<std::string>& names,
                                     const std::map<std::string, std::string>& extra_metadata) const {
  // Data order: element size descending, then name (see the file comment).
  std::vector<const std::pair<const std::string, Entry>*> order;
  order.reserve(names.size());
  for (const std::string& name : names) {
    auto it = tensors_.find(name);
    MOESQ_CHECK(it != tensors_.end(), "safetensors writer: no tensor ", name, " (writing ", path, ")");
    order.push_back(&*it);
  }
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    const size_t sa = dtype_size(a->second.dtype), sb = dtype_size(b->second.dtype);
    return sa != sb ? sa > sb : a->first < b->first;
  });
  MOESQ_CHECK(std::adjacent_find(order.begin(), order.end()) == order.end(),
              "safetensors writer: a tensor is listed twice (writing ", path, ")");

  nlohmann::json header = nlohmann::json::object();  // std::map-backed: keys in name order
  std::map<std::string, std::string> meta = metadata_;
  for (const auto& [k, v] : extra_metadata) meta.emplace(k, v);
  if (!meta.empty()) header[kMetadataKey] = meta;
  uint64_t offset = 0;
  for (const auto* kv : order) {
    const Entry& e = kv->second;
    header[kv->first] = {{"dtype", dtype_name(e.dtype)},
                         {"shape", e.shape},
                         {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL("cannot write ", path, ": header JSON: ", e.what());  // e.g. a name that is not UTF-8
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data section starts 8-byte aligned

  std::string bytes;
  bytes.reserve(8 + text.size() + offset);
  const uint64_t header_len = text.size();
  bytes.append(reinterpret_cast<const char*>(&header_len), 8);
  bytes += text;
  for (const auto* kv : order) {
    bytes.append(reinterpret_cast<const char*>(kv->second.bytes.data()), kv->second.bytes.size());
  }
  write_file_atomic(path, bytes);
}

}  // namespace moesq::io
