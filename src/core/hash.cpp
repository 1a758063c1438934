#include "core/hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <vector>

#include "core/error.h"

namespace moesq {

namespace {
std::string to_hex(const unsigned char* d, unsigned n) {
  static const char* k = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (unsigned i = 0; i < n; ++i) {
    s[2 * i] = k[d[i] >> 4];
    s[2 * i + 1] = k[d[i] & 15];
  }
  return s;
}
}  // namespace

std::string sha256_hex(const void* data, size_t nbytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  MOESQ_CHECK(EVP_Digest(data, nbytes, md, &len, EVP_sha256(), nullptr) == 1, "SHA-256 failed");
  return to_hex(md, len);
}

std::string sha256_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  MOESQ_CHECK(f, "cannot open ", path, " for hashing");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<unsigned char> buf(1 << 20);
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) EVP_DigestUpdate(ctx, buf.data(), n);
  std::fclose(f);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  return to_hex(md, len);
}

}  // namespace moesq
