// The compression methods as one table: one row (a `Method`) per method, defined in its own file under
// compress/methods/ (the adapter from the pipeline to the method's solver: validate, options JSON,
// compress one expert). Parsing, naming, validation, the resume manifest, report.json and the
// per-expert dispatch all read the row, so a new method is one file there plus one line in
// kMethods (method.cpp) and its declaration below (plus its options struct in CompressOptions if it
// has options).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compress/packed_expert.h"
#include "model/decoder.h"

namespace moesq::io {
struct ModelSpec;
}

namespace moesq::compress {

struct CompressOptions;
struct ExpertCalib;
struct ExpertReport;

// Device copies of one expert's calibration rows (compress --device cuda; compress/expert_cuda.h):
// X [n, H] the raw inputs and Y [n, H] the original expert's outputs on them, fp32, in GPU memory of
// the worker thread that runs the expert (valid for that expert's task).
struct DeviceRows {
  const float* X = nullptr;
  const float* Y = nullptr;
};

// One expert as every method gets it (built once by compress_expert).
struct ExpertJob {
  const model::ExpertWeights& w;  // original weights: gate/up [I, H], down [H, I] fp32
  int64_t H = 0, I = 0;
  const ExpertCalib& calib;        // its calibration rows X [n, H] and router weights g [n]
  const std::vector<float>& y_ref;  // [n, H] the original expert's outputs (the refinement's targets)
  model::ExpertVariant variant;    // the family's biases and activation (gpt-oss), plain SwiGLU otherwise
  float gs_gu = 0, gs_d = 0;       // tensor scales γ: gate and up share one (DESIGN.md §3), down its own
  std::string names[3];            // the three tensor names (errors), io::ExpertProj order
  const DeviceRows* dev = nullptr;  // the rows on the GPU (GPU runs; then y_ref may be empty), else null

  // Projection p's weights [N, K] with N, K and its tensor scale: (I, H, γ_gu) for gate and up,
  // (H, I, γ_d) for down.
  const float* weights(int p) const { return p == 0 ? w.gate.data() : p == 1 ? w.up.data() : w.down.data(); }
  int64_t N(int p) const { return p < 2 ? I : H; }
  int64_t K(int p) const { return p < 2 ? H : I; }
  float tensor_scale(int p) const { return p < 2 ? gs_gu : gs_d; }
};

// A row names only what differs from these defaults (designated initializers).
struct Method {
  const char* name = nullptr;  // --method value; "method" in report.json, the resume manifest, config.json
  const char* help = nullptr;  // its part of `moesq compress --help`
  bool sparse = true;          // paired 4:8 NVFP4 (activation block 32); false: dense NVFP4 (block 16)
  bool refines = false;        // reports refinement losses (init → refined) in report.json and the loss table
  // The method's own option checks (moesq::Error naming the option); compress::validate runs the
  // shared ones (threads, SGPTQ) and then this. nullptr: no options of its own.
  void (*validate)(const CompressOptions& opt) = nullptr;
  // The method's own options as JSON, written once for both files: the resume manifest's
  // "options".<manifest_key> and report.json's <report_key>. nullptr: no options of its own.
  nlohmann::json (*options_json)(const CompressOptions& opt) = nullptr;
  const char* manifest_key = nullptr;
  const char* report_key = nullptr;
  // A part of the reference method this implementation leaves out, recorded in report.json's
  // <report_key> as `<omitted>: false` (nullptr: none).
  const char* omitted = nullptr;
  // Compresses one expert; fallbacks and notes (and method-specific extras) go to rep.
  PackedExpert (*compress)(const ExpertJob& job, const CompressOptions& opt, ExpertReport& rep) = nullptr;
};

namespace methods {
extern const Method kRtnNvfp4;  // methods/rtn_nvfp4.cpp
extern const Method kMagnitude;  // methods/magnitude.cpp
extern const Method kSgptq;      // methods/sgptq.cpp
extern const Method kMoesq;      // methods/moesq.cpp
extern const Method kJsq;        // methods/jsq.cpp
extern const Method kObr;        // methods/obr.cpp
}  // namespace methods

// Every method, in the order --help and errors list them.
std::span<const Method* const> all_methods();
// The method called `s`; Error naming --method and listing every method otherwise.
const Method* parse_method(const std::string& s);

}  // namespace moesq::compress
