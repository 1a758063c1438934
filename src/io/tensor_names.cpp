#include "io/tensor_names.h"

#include <cctype>

namespace moesq::io {

namespace {

// Reads the decimal digits at name[pos...] into *out; false if there are none.
bool read_index(const std::string& name, size_t& pos, int64_t* out) {
  const size_t start = pos;
  int64_t v = 0;
  while (pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos]))) {
    v = v * 10 + (name[pos] - '0');
    ++pos;
  }
  *out = v;
  return pos > start;
}

bool read_literal(const std::string& name, size_t& pos, const char* lit) {
  const std::string l(lit);
  if (name.compare(pos, l.size(), l) != 0) return false;
  pos += l.size();
  return true;
}

}  // namespace

std::string layer_tensor(int64_t layer, const std::string& rest) {
  return "model.layers." + std::to_string(layer) + "." + rest;
}

std::string expert_tensor_prefix(int64_t layer, int64_t expert, const char* proj) {
  return layer_tensor(layer, "mlp.experts." + std::to_string(expert) + "." + proj);
}

std::string expert_tensor_prefix(int64_t layer, int64_t expert, ExpertProj proj) {
  return expert_tensor_prefix(layer, expert, kExpertProjNames[static_cast<int>(proj)]);
}

std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name) {
  ExpertTensorName t;
  size_t pos = 0;
  if (!read_literal(name, pos, "model.layers.") || !read_index(name, pos, &t.layer) ||
      !read_literal(name, pos, ".mlp.experts.") || !read_index(name, pos, &t.expert) ||
      !read_literal(name, pos, "."))
    return std::nullopt;
  const size_t dot = name.find('.', pos);
  if (dot == std::string::npos || dot == pos) return std::nullopt;
  t.proj = name.substr(pos, dot - pos);
  t.suffix = name.substr(dot + 1);
  return t;
}

bool is_expert_tensor(const std::string& name) {
  const auto t = parse_expert_tensor(name);
  if (!t) return false;
  for (const char* p : kExpertProjNames)
    if (t->proj == p) return true;
  return false;
}

bool in_expert_container(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

}  // namespace moesq::io
