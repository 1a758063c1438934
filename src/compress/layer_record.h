// The bytes of one layer's compressed experts: what ranks exchange after compressing their share
// (pipeline.cpp) and what the resume work dir commits per finished layer (work_dir.h). One codec for
// both, so a gathered or resumed expert is the very bits its rank computed: packed tensors verbatim,
// doubles by their bit pattern, the report's method-specific JSON as CBOR (doubles exact).
// Layout (host byte order, little-endian on x86-64/aarch64): "MQLREC01", layer, the two hashes,
// the expert count, per expert its report row then its 3 projections; then the hex SHA-256 of all
// bytes before it, so a truncated or damaged file is an error, never a wrong expert.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compress/packed_expert.h"
#include "compress/pipeline.h"

namespace moesq::compress {

// One expert's compressed projections with its report row (report.layer/expert say which expert).
struct ExpertResult {
  PackedExpert packed;
  ExpertReport report;
};

struct LayerRecord {
  int64_t layer = 0;
  std::string run_sha256;          // work dir: SHA-256 of the run manifest (work_dir.h); "" in a gather
  std::string next_inputs_sha256;  // work dir: SHA-256 of H_{l+1} (states_sha256 in pipeline.cpp); ""
  std::vector<ExpertResult> experts;  // a committed layer: every expert in id order; a gather: one rank's share
};

std::string encode_layer_record(const LayerRecord& r);
// Error naming `what` (a file, "rank 3") when the bytes are truncated, damaged or not a record.
LayerRecord decode_layer_record(const std::string& bytes, const std::string& what);

}  // namespace moesq::compress
