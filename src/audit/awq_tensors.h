// AWQ int4 weights (format/awq_int4.h) as checkpoint tensors, named and shaped as AutoAWQ publishes them.
#pragma once
#include <string>

#include "format/awq_int4.h"
#include "io/safetensors.h"

namespace moesq::audit {

// Checkpoint tensors as published: `<prefix>.qweight`, `<prefix>.qzeros`, `<prefix>.scales`.
void awq_add_tensors(io::SafetensorsWriter& w, const std::string& prefix, const format::AwqLinear& lin);
// Reads and checks shapes/dtypes (Error names the file and tensor). N, K are taken from the tensors.
format::AwqLinear awq_read_tensors(const io::SafetensorsFile& f, const std::string& prefix);

}  // namespace moesq::audit
