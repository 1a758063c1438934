#include "compress/layer_record.h"

#include <cstring>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/hash.h"

namespace moesq::compress {

namespace {

constexpr char kMagic[8] = {'M', 'Q', 'L', 'R', 'E', 'C', '0', '1'};
constexpr size_t kHashChars = 64;  // hex SHA-256 trailer

class Writer {
 public:
  template <typename T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>, "pod() copies the object representation");
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void bytes(const void* p, size_t n) {
    pod<uint64_t>(n);
    out_.append(static_cast<const char*>(p), n);
  }
  void bytes(const std::string& s) { bytes(s.data(), s.size()); }
  void bytes(const std::vector<uint8_t>& v) { bytes(v.data(), v.size()); }
  std::string take() { return std::move(out_); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const std::string& s, size_t end, const std::string& what) : s_(s), end_(end), what_(what) {}
  template <typename T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::vector<uint8_t> vec() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::vector<uint8_t> v(s_.begin() + static_cast<std::ptrdiff_t>(pos_),
                           s_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
    pos_ += n;
    return v;
  }
  bool done() const { return pos_ == end_; }

 private:
  void need(uint64_t n) const {
    MOESQ_CHECK(n <= end_ - pos_, "layer record ", what_, ": truncated (", n, " bytes needed at offset ", pos_,
                ", ", end_ - pos_, " left)");
  }
  const std::string& s_;
  size_t end_, pos_ = 0;
  const std::string& what_;
};

enum : uint8_t { kSparse48 = 1, kNvfp4 = 2 };

// Both tensor kinds: kind, N, K, γ, values, [meta: 4:8 only], scales.
template <typename Tensor>
void put_tensor(Writer& w, uint8_t kind, const Tensor& t) {
  w.pod<uint8_t>(kind);
  w.pod<int64_t>(t.N);
  w.pod<int64_t>(t.K);
  w.pod<float>(t.global_scale);
  w.bytes(t.values);
  if constexpr (std::is_same_v<Tensor, format::Sparse48Tensor>) w.bytes(t.meta);
  w.bytes(t.scales);
}

template <typename Tensor>
Tensor get_tensor(Reader& r) {
  Tensor t;
  t.N = r.pod<int64_t>();
  t.K = r.pod<int64_t>();
  t.global_scale = r.pod<float>();
  t.values = r.vec();
  if constexpr (std::is_same_v<Tensor, format::Sparse48Tensor>) t.meta = r.vec();
  t.scales = r.vec();
  return t;
}

void put_weight(Writer& w, const format::PackedWeight& p) {
  if (const format::Sparse48Tensor* t = p.sparse48()) return put_tensor(w, kSparse48, *t);
  put_tensor(w, kNvfp4, *p.nvfp4());
}

format::PackedWeight get_weight(Reader& r, const std::string& what) {
  const uint8_t kind = r.pod<uint8_t>();
  if (kind == kSparse48) return get_tensor<format::Sparse48Tensor>(r);
  MOESQ_CHECK(kind == kNvfp4, "layer record ", what, ": unknown weight kind ", int(kind));
  return get_tensor<format::Nvfp4Tensor>(r);
}

}  // namespace

std::string encode_layer_record(const LayerRecord& r) {
  Writer w;
  w.out().append(kMagic, sizeof kMagic);
  w.pod<int64_t>(r.layer);
  w.bytes(r.run_sha256);
  w.bytes(r.next_inputs_sha256);
  w.pod<uint64_t>(r.experts.size());
  for (const ExpertResult& x : r.experts) {
    const ExpertReport& rep = x.report;
    w.pod<int64_t>(rep.layer);
    w.pod<int64_t>(rep.expert);
    w.pod<int64_t>(rep.tokens);
    w.pod<double>(rep.rel_error);
    w.pod<uint8_t>(rep.fallback ? 1 : 0);
    w.bytes(rep.note);
    w.bytes(nlohmann::json::to_cbor(rep.extra));
    for (const format::PackedWeight& p : x.packed.proj) put_weight(w, p);
  }
  std::string out = w.take();
  out += sha256_hex(out.data(), out.size());
  return out;
}

LayerRecord decode_layer_record(const std::string& bytes, const std::string& what) {
  MOESQ_CHECK(bytes.size() >= sizeof kMagic + kHashChars && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0,
              "layer record ", what, ": not a moesq layer record (", bytes.size(), " bytes, magic missing)");
  const size_t body = bytes.size() - kHashChars;
  MOESQ_CHECK(sha256_hex(bytes.data(), body) == bytes.substr(body), "layer record ", what,
              ": checksum mismatch (truncated or damaged)");
  Reader rd(bytes, body, what);
  for (size_t i = 0; i < sizeof kMagic; ++i) rd.pod<char>();
  LayerRecord r;
  r.layer = rd.pod<int64_t>();
  r.run_sha256 = rd.str();
  r.next_inputs_sha256 = rd.str();
  const uint64_t n = rd.pod<uint64_t>();
  MOESQ_CHECK(n <= body, "layer record ", what, ": implausible expert count ", n);
  r.experts.resize(n);
  for (ExpertResult& x : r.experts) {
    ExpertReport& rep = x.report;
    rep.layer = rd.pod<int64_t>();
    rep.expert = rd.pod<int64_t>();
    rep.tokens = rd.pod<int64_t>();
    rep.rel_error = rd.pod<double>();
    rep.fallback = rd.pod<uint8_t>() != 0;
    rep.note = rd.str();
    const std::vector<uint8_t> cbor = rd.vec();
    rep.extra = nlohmann::json::from_cbor(cbor);
    for (format::PackedWeight& p : x.packed.proj) p = get_weight(rd, what);
  }
  MOESQ_CHECK(rd.done(), "layer record ", what, ": trailing bytes after ", n, " experts");
  return r;
}

}  // namespace moesq::compress
