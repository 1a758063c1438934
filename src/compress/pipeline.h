// Paper Algorithm 1, layer by layer: route the calibration states once, cache each expert's inputs
// X_e and router weights g_e (and the dense targets Y_e), compress the experts of the layer in
// parallel, then propagate H_{l+1} = Block_l(H_l) through the COMPRESSED layer (W4A4 as deployed),
// so later layers calibrate on the inputs they will really see.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compress/calib.h"
#include "compress/jsq.h"
#include "compress/obr.h"
#include "compress/packed_expert.h"
#include "compress/refine/options.h"
#include "compress/sgptq.h"
#include "model/qwen3_moe.h"

namespace moesq::compress {

enum class Method { RtnNvfp4, Magnitude, Sgptq, Moesq, Jsq, Obr };
Method parse_method(const std::string& s);  // Error naming --method for unknown names
const char* method_name(Method m);
bool method_is_sparse(Method m);

struct CompressOptions {
  Method method = Method::Sgptq;
  SgptqOptions sgptq;
  RefineOptions refine;   // refinement options (method moesq)
  JsqOptions jsq;         // method jsq (compress/jsq.h)
  ObrOptions obr;         // method obr (compress/obr.h; percdamp and GPTQ block from `sgptq`)
  int threads = 0;        // 0: all cores
};

// What happened to one expert.
struct ExpertReport {
  int64_t layer = 0, expert = 0;
  int64_t tokens = 0;          // calibration rows routed to the expert
  double rel_error = 0;        // ‖Y − Ŷ‖²_F / ‖Y‖²_F on those rows, Ŷ under W4A4 (0 tokens → NaN → null)
  bool fallback = false;       // no/too few tokens: documented fallback used
  std::string note;
  nlohmann::json extra;        // method-specific (refinement curves, …)
};

struct CompressResult {
  std::vector<std::vector<PackedExpert>> experts;  // [L][E]
  std::vector<ExpertReport> reports;               // [L·E]
  double seconds = 0;
};

// Every option checked once (moesq::Error naming the option), before any work: the CLI calls it
// when it builds the options, compress_model again at its top.
void validate(const CompressOptions& opt);

// Compresses every routed expert of `m` (which must be the ORIGINAL model; it is modified in place:
// on return its experts hold the dequantized compressed weights; how it runs is never changed: every
// forward gets its model::ForwardOptions per call).
CompressResult compress_model(model::Qwen3Moe& m, const CalibSet& calib, const CompressOptions& opt);

}  // namespace moesq::compress
