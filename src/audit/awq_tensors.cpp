// AWQ checkpoint tensors (see awq_tensors.h): shapes and dtypes are checked on read, naming the file.
#include "audit/awq_tensors.h"

#include <cstring>

#include "core/error.h"

namespace moesq::audit {

void awq_add_tensors(io::SafetensorsWriter& w, const std::string& prefix, const format::AwqLinear& l) {
  const int64_t G = l.K / format::kAwqGroup;
  w.add(prefix + ".qweight", io::DType::I32, {l.K, l.N / format::kAwqPack}, l.qweight.data(), 4 * l.qweight.size());
  w.add(prefix + ".qzeros", io::DType::I32, {G, l.N / format::kAwqPack}, l.qzeros.data(), 4 * l.qzeros.size());
  w.add(prefix + ".scales", io::DType::F16, {G, l.N}, l.scales.data(), 2 * l.scales.size());
}

format::AwqLinear awq_read_tensors(const io::SafetensorsFile& f, const std::string& prefix) {
  const io::TensorView& qw = f.get(prefix + ".qweight");
  const io::TensorView& qz = f.get(prefix + ".qzeros");
  const io::TensorView& sc = f.get(prefix + ".scales");
  MOESQ_CHECK(qw.dtype == io::DType::I32 && qw.shape.size() == 2, f.path(), ": ", qw.name,
              " must be a 2-D I32 tensor [K, N/8], got ", io::dtype_name(qw.dtype), " ", qw.shape_str());
  format::AwqLinear l;
  l.K = qw.shape[0];
  l.N = qw.shape[1] * format::kAwqPack;
  format::awq_check_shape(l.N, l.K, f.path() + ": " + qw.name);
  const std::vector<int64_t> gshape_z = {l.K / format::kAwqGroup, l.N / format::kAwqPack}, gshape_s = {l.K / format::kAwqGroup, l.N};
  MOESQ_CHECK(qz.dtype == io::DType::I32 && qz.shape == gshape_z, f.path(), ": ", qz.name,
              " must be I32 [K/128, N/8] = [", gshape_z[0], ", ", gshape_z[1], "], got ", io::dtype_name(qz.dtype),
              " ", qz.shape_str());
  MOESQ_CHECK(sc.dtype == io::DType::F16 && sc.shape == gshape_s, f.path(), ": ", sc.name,
              " must be F16 [K/128, N] = [", gshape_s[0], ", ", gshape_s[1], "], got ", io::dtype_name(sc.dtype),
              " ", sc.shape_str());
  l.qweight.resize(qw.nbytes / 4);
  std::memcpy(l.qweight.data(), qw.data, qw.nbytes);
  l.qzeros.resize(qz.nbytes / 4);
  std::memcpy(l.qzeros.data(), qz.data, qz.nbytes);
  l.scales.resize(sc.nbytes / 2);
  std::memcpy(l.scales.data(), sc.data, sc.nbytes);
  return l;
}

}  // namespace moesq::audit
