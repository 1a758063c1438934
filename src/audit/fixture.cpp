// The audit fixture (audit.h): routing of paper 000, layer shapes "qwen3" / "small", synthetic AWQ
// weights and inputs from one seed. Non-obvious: the identity hashes the bytes the layer reads, so the
// scorer can regenerate the fixture (without weights) and compare.
#include "audit/audit.h"

#include <set>
#include <sstream>

#include "core/error.h"
#include "core/hash.h"

namespace moesq::audit {

namespace {

struct FixtureShape {
  int64_t hidden, intermediate;
};
FixtureShape fixture_shape(const std::string& name) {
  if (name == "qwen3") return {2048, 768};  // Qwen3-Coder-30B-A3B: W13 (1536, 2048), W2 (2048, 768)
  if (name == "small") return {512, 128};
  MOESQ_FAIL("--fixture: unknown fixture '", name, "' (expected qwen3 or small)");
}

}  // namespace

std::string AuditFixture::identity() const {
  std::ostringstream os;
  os << name << '|' << seed << '|' << M << '|' << topk << '|' << num_experts << '|' << block_size << '|'
     << weights.hidden << '|' << weights.intermediate << '|';
  std::string s = os.str();
  s.append(reinterpret_cast<const char*>(topk_ids.data()), topk_ids.size() * 4);
  s.append(reinterpret_cast<const char*>(topk_weights.data()), topk_weights.size() * 4);
  s.append(reinterpret_cast<const char*>(x.data()), x.size() * 2);
  return sha256_hex(s.data(), s.size());
}

AuditFixture make_audit_fixture(const std::string& name, uint64_t seed, bool with_weights) {
  const FixtureShape sh = fixture_shape(name);
  AuditFixture f;
  f.name = name;
  f.seed = seed;
  f.M = ops::kFixtureM;
  f.topk = ops::kFixtureTopk;
  f.num_experts = ops::kFixtureExperts;
  f.block_size = ops::kFixtureBlock;
  f.topk_ids = ops::make_fixture_topk_ids(seed);
  f.topk_weights = ops::make_fixture_topk_weights(f.M, f.topk, seed + 1);
  f.x = make_random_f16(f.M, sh.hidden, seed + 2);
  if (with_weights) {
    std::set<int32_t> act(f.topk_ids.begin(), f.topk_ids.end());
    f.weights = make_synthetic_awq_moe(f.num_experts, sh.hidden, sh.intermediate, seed + 3, {act.begin(), act.end()});
  } else {
    f.weights.num_experts = f.num_experts;
    f.weights.hidden = sh.hidden;
    f.weights.intermediate = sh.intermediate;
  }
  return f;
}

}  // namespace moesq::audit
