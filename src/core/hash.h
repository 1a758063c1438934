// SHA-256 (OpenSSL) for fingerprints, build identity and audit surfaces.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace moesq {

// Lower-case hex SHA-256 of a byte range.
std::string sha256_hex(const void* data, size_t nbytes);
// Lower-case hex SHA-256 of a file's contents. Throws Error naming the file if unreadable.
std::string sha256_file(const std::string& path);

}  // namespace moesq
