// Route alignment (vLLM `moe_align_block_size` semantics, DESIGN.md §6, paper 000 §1).
//
// The router's top-k expert ids `[M, k]` are flattened row-major into route ids r = token·k + slot,
// r ∈ [0, M·k). Alignment groups the routes by expert (experts in ascending id order), pads each
// expert's region to a multiple of the block size b with the sentinel M·k, and emits the
// block → expert vector and the padded total. Only the ORDER of routes inside an expert is free:
//   native    — on the GPU the atomic order; on the CPU an order drawn from a `history` seed, so tests
//               can emulate "same inputs, different allocation history";
//   canonical — ascending route id inside each expert, i.e. sorted by (expert id, route id).
// The one non-obvious decision: a plan is plain data (sorted_ids + block_expert) that can be saved,
// injected into another run (its JSON form: audit/plan_json.h), and validated against the top-k ids — so an audit never has to trust
// the code that produced it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/splitmix64.h"

namespace moesq::ops {

enum class AlignOrder { Native, Canonical };
AlignOrder parse_align_order(const std::string& s);  // "native" | "canonical"; Error names --align
const char* align_order_name(AlignOrder o);

struct RouteAlignment {
  int64_t M = 0;           // tokens
  int topk = 0;            // k, routes per token
  int num_experts = 0;     // E
  int block_size = 0;      // b, rows per MoE block
  std::vector<int32_t> sorted_ids;    // [padded_total] route ids, sentinel = M·k on padding rows
  std::vector<int32_t> block_expert;  // [num_blocks] expert id of every MoE block, ascending
  int64_t padded_total() const { return static_cast<int64_t>(sorted_ids.size()); }
  int64_t num_blocks() const { return static_cast<int64_t>(block_expert.size()); }
  int32_t sentinel() const { return static_cast<int32_t>(M * topk); }
  int64_t num_routes() const { return M * topk; }
};

// Aligns `topk_ids` ([M, k] row-major, values in [0, E)). `history_seed` only matters for Native on
// the CPU: it seeds the permutation of each expert's routes (emulated atomic order).
RouteAlignment align_routes(const std::vector<int32_t>& topk_ids, int64_t M, int topk, int num_experts,
                            int block_size, AlignOrder order, uint64_t history_seed = 0);

// Block membership B(e, j): the valid routes of the j-th block of expert e, sorted (order ignored).
struct BlockMembership {
  int32_t expert = 0;
  int32_t local_block = 0;   // j: index of the block inside the expert's region
  int32_t global_block = 0;  // p: index in block_expert
  std::vector<int32_t> routes;  // sorted, sentinels excluded
};
// The mode identity: the ordered list of (e, j, sorted B(e, j)) over all blocks (paper 000).
std::vector<BlockMembership> block_membership(const RouteAlignment& a);
std::string mode_identity_string(const std::vector<BlockMembership>& m);  // "e:j:r,r,..;" per block
// SHA-256 of mode_identity_string: equal fingerprints ⇔ equal membership (up to order inside a block).
std::string route_block_fingerprint(const RouteAlignment& a);

// Global block index and row of a route inside the plan; Error if the route is absent.
struct RoutePosition {
  int64_t row = -1;    // index into sorted_ids
  int64_t block = -1;  // row / block_size
};
RoutePosition find_route(const RouteAlignment& a, int32_t route);

// Interventions (paper 000): swap two routes' rows. reorder: both must sit in the same block (the
// mode identity is unchanged); exchange: they must sit in two different blocks of the SAME expert
// (membership changes, the plan stays valid). Error names the routes and blocks otherwise.
void intervene_reorder(RouteAlignment& a, int32_t r1, int32_t r2);
void intervene_exchange(RouteAlignment& a, int32_t r1, int32_t r2);

// Checks that `a` is a valid alignment of `topk_ids`: sizes, block→expert vector non-decreasing with
// exactly ceil(count_e / b) blocks per expert ("expert block" errors), every route exactly once in a
// block of its own expert, sentinels only after an expert's valid routes ("route" errors).
// Throws Error whose message starts with "expert block:" or "route:".
void validate_alignment(const RouteAlignment& a, const std::vector<int32_t>& topk_ids);


// Paper 000 fixture: M = 21, k = 8, E = 128, b = 8; 168 routes align to 400 rows in 50 blocks with one
// expert (the 41st active one, id `kFixtureSpanExpert`) spanning blocks 40 and 41. Constructed
// deterministically from `seed` (which tokens/slots carry which experts), see align.cpp.
constexpr int64_t kFixtureM = 21;
constexpr int kFixtureTopk = 8;
constexpr int kFixtureExperts = 128;
constexpr int kFixtureBlock = 8;
constexpr int32_t kFixtureSpanExpert = 106;
std::vector<int32_t> make_fixture_topk_ids(uint64_t seed);  // [21, 8]
// Router weights for the fixture: positive, each token's k weights sum to 1 (renormalized top-k). [M, k]
std::vector<float> make_fixture_topk_weights(int64_t M, int topk, uint64_t seed);



// Native alignment on the device (route_align.cu): one thread per route claims its slot in its expert's
// region with atomicAdd (vLLM moe_align_block_size's scatter), so the order inside an expert is the
// atomic order. Same result type and regions as ops::align_routes; built only with CUDA.
ops::RouteAlignment align_routes_cuda(const std::vector<int32_t>& topk_ids, int64_t M, int topk, int num_experts,
                                      int block_size);

}  // namespace moesq::ops
