// Test support: a 1-D int32 .npy file (numpy format v1.0) from token ids, the format `moesq eval
// --data` and `compress --calib` read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moesq::test {

// The bytes of a 1-D little-endian int32 .npy holding `ids`.
inline std::string npy_int32(const std::vector<int32_t>& ids) {
  std::string hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (" + std::to_string(ids.size()) + ",), }";
  while ((10 + hdr.size() + 1) % 64 != 0) hdr += ' ';  // magic + version + length + header + '\n' aligned to 64
  hdr += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes += static_cast<char>(hdr.size() & 0xff);
  bytes += static_cast<char>(hdr.size() >> 8);
  bytes += hdr;
  bytes.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  return bytes;
}

}  // namespace moesq::test
