// CPU twins of ops::embed and ops::gather_rows (embed.h): plain row copies.
#include "ops/embed/embed.h"

#include "core/error.h"
#include "core/half.h"

namespace moesq::ops {

void embed_ref(const EmbedArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.H > 0, "embed: bad sizes T=", a.T, " H=", a.H);
  for (int64_t t = 0; t < a.T; ++t) {
    const uint16_t* row = a.table + static_cast<int64_t>(a.ids[t]) * a.H;
    for (int64_t c = 0; c < a.H; ++c) a.out[t * a.H + c] = bf16_to_f32(row[c]);
  }
}

void gather_rows_ref(const GatherRowsArgs& a) {
  MOESQ_CHECK(a.n >= 0 && a.H > 0, "gather_rows: bad sizes n=", a.n, " H=", a.H);
  for (int64_t i = 0; i < a.n; ++i) {
    const uint16_t* src = a.in + static_cast<int64_t>(a.rows[i]) * a.H;
    for (int64_t c = 0; c < a.H; ++c) a.out[i * a.H + c] = src[c];
  }
}

}  // namespace moesq::ops
