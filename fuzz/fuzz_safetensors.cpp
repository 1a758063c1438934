// libFuzzer target: the safetensors reader (header length, JSON header, entries, offsets) on
// arbitrary bytes. The reader maps a file, so each input is written to one scratch file first.
// Contract checked: a moesq::Error or success — never a crash, a sanitizer report, another
// exception type, or a view outside the mapped data.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/moesq_fuzz_safetensors." + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    const moesq::io::SafetensorsFile st(path);
    for (const std::string& name : st.names()) {
      const moesq::io::TensorView& t = st.get(name);
      volatile uint8_t sink = 0;
      if (t.nbytes) sink = sink + t.data[0] + t.data[t.nbytes - 1];  // first and last byte in bounds (ASan)
      if (t.nbytes <= (1u << 16)) (void)moesq::io::to_f32(t);
    }
  } catch (const moesq::Error&) {
  }
  return 0;
}
