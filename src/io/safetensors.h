// safetensors: a memory-mapped, bounds-checked reader and an atomic writer.
// File layout: u64 little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {str: str}}, then the data.
// The reader validates every field before any tensor is touched (the rules are listed beside the
// reader in safetensors.cpp): header length inside the file and <= 100 MB, exactly one JSON object
// with unique keys, known dtype, shape × dtype size == byte range, ranges that tile the data
// section exactly (no overlap, hole or trailing bytes), __metadata__ string → string. Every error
// names the file (and the tensor).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace moesq::io {

enum class DType { F32, F16, BF16, F8_E4M3, I8, U8, I32, I64 };

size_t dtype_size(DType dt);                 // bytes per element
const char* dtype_name(DType dt);            // safetensors spelling, e.g. "BF16"
DType parse_dtype(const std::string& name);  // throws Error for unknown names

// A tensor inside a mapped file (or inside memory owned by the caller). Row-major.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // [nbytes], not necessarily aligned
  size_t nbytes = 0;
  std::string file;  // where it came from, for error messages

  int64_t numel() const;
  std::string shape_str() const;  // "[32, 128, 256]"
};

// Converts any floating or integer tensor to fp32 (bf16/f16/e4m3 decoded exactly).
std::vector<float> to_f32(const TensorView& t);
// to_f32 for model weights: a NaN or ±inf entry (float dtypes) is an Error naming the file, the
// tensor and the element's index. The model loaders read every weight through it, so a non-finite
// weight is caught where it enters, never turned finite by a quantizer downstream.
std::vector<float> to_f32_finite(const TensorView& t);

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws Error naming the file and the first bad field.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;  // Error names file + tensor if absent
  std::vector<std::string> names() const;                // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Collects tensors (copied) and writes one safetensors file atomically (temp file + rename).
// As the reference writer does: header JSON space-padded to a multiple of 8 bytes, keys in name
// order; data packed without gaps, ordered by element size (descending) then name, so every tensor
// sits at its natural alignment.
class SafetensorsWriter {
 public:
  void add(const std::string& name, DType dtype, const std::vector<int64_t>& shape, const void* data,
           size_t nbytes);  // Error if nbytes != numel × dtype size or the name repeats
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  size_t size() const { return tensors_.size(); }
  size_t data_bytes() const;
  void write(const std::string& path) const;

  // For sharding (checkpoint.h): names in order, per-tensor sizes, and writing a subset of the
  // tensors to one file with extra __metadata__ entries (the writer's own metadata wins on clashes).
  std::vector<std::string> names() const;     // sorted
  size_t nbytes(const std::string& name) const;
  int64_t numel(const std::string& name) const;
  void write_subset(const std::string& path, const std::vector<std::string>& names,
                    const std::map<std::string, std::string>& extra_metadata) const;

 private:
  struct Entry {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace moesq::io
