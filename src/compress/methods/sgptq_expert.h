// The SGPTQ solution of one expert (methods/sgptq.cpp), also the starting point of the moesq
// refinement (methods/moesq.cpp).
#pragma once
#include "compress/method.h"
#include "compress/sgptq.h"

namespace moesq::compress {

// gate/up: SGPTQ on the Hessian of the expert inputs; down: on the Hessian of ITS inputs as produced
// by the compressed gate/up (sequential GPTQ), so down corrects the error gate/up left behind.
// proj in io::ExpertProj order. A fallback of any projection sets rep.fallback and rep.note.
struct SgptqExpert {
  SgptqResult proj[3];
};
// Runs on opt.device when it is set (the GPU solver, compress/sgptq_cuda.h), else on the CPU.
SgptqExpert sgptq_expert(const ExpertJob& job, const SgptqOptions& opt, ExpertReport& rep);
// A fallback of any projection → rep.fallback and rep.note (gate's reason first, then down's, then up's).
void note_sgptq_fallbacks(const SgptqExpert& s, ExpertReport& rep);

}  // namespace moesq::compress
