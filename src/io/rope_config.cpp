// The non-obvious decision: when both rope_parameters and rope_scaling are present (transformers 5
// keeps the hub's rope_scaling and adds rope_parameters), a "default" rope_parameters type yields to
// rope_scaling's type, as transformers' standardisation does; two different non-default types are an
// error.
#include "io/rope_config.h"

#include <cmath>

#include "core/error.h"
#include "io/config_keys.h"

namespace moesq::io {

using nlohmann::json;
using namespace config_keys;

double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

// Where the RoPE settings live: rope_parameters (transformers >= 5, holds rope_theta too) and/or
// rope_scaling (hub configs). Both may be present (transformers 5 merges them); their types must agree.
RopeSpec parse_rope_config(const json& j, const std::string& src) {
  RopeSpec r;
  const json* params = find(j, "rope_parameters");
  const json* scaling = find(j, "rope_scaling");
  for (const json* o : {params, scaling})
    MOESQ_CHECK(!o || o->is_object(), src, ": key \"", o == params ? "rope_parameters" : "rope_scaling",
                "\" must be an object, got ", o->dump());
  auto type_of = [&](const json* o, const char* name) -> std::string {
    if (!o) return "";
    for (const char* k : {"rope_type", "type"})
      if (const json* t = find(*o, k)) return get_string(*t, std::string(name) + "." + k, src);
    return "";
  };
  const std::string tp = type_of(params, "rope_parameters"), ts = type_of(scaling, "rope_scaling");
  MOESQ_CHECK(tp.empty() || ts.empty() || tp == ts || tp == "default", src, ": rope_parameters type \"", tp,
              "\" and rope_scaling type \"", ts, "\" disagree");
  r.type = !ts.empty() ? ts : (!tp.empty() ? tp : "default");
  MOESQ_CHECK(r.type == "default" || r.type == "yarn", src, ": RoPE type \"", r.type,
              "\" is not supported (default or yarn)");

  const json* theta_top = find(j, "rope_theta");
  const json* theta_par = params ? find(*params, "rope_theta") : nullptr;
  MOESQ_CHECK(theta_top || theta_par, src, ": missing key \"rope_theta\" (or \"rope_parameters.rope_theta\")");
  if (theta_top) r.theta = get_double(*theta_top, "rope_theta", src);
  if (theta_par) {
    const double v = get_double(*theta_par, "rope_parameters.rope_theta", src);
    MOESQ_CHECK(!theta_top || v == r.theta, src, ": rope_theta = ", r.theta, " and rope_parameters.rope_theta = ", v,
                " disagree");
    r.theta = v;
  }
  MOESQ_CHECK(std::isfinite(r.theta) && r.theta > 0, src, ": rope_theta must be positive");
  if (r.type != "yarn") return r;

  const json& y = (ts == "yarn") ? *scaling : *params;
  const std::string yn = (ts == "yarn") ? "rope_scaling." : "rope_parameters.";
  const json* factor = find(y, "factor");
  MOESQ_CHECK(factor, src, ": missing key \"", yn, "factor\" (YaRN)");
  r.factor = get_double(*factor, yn + "factor", src);
  MOESQ_CHECK(r.factor > 0, src, ": ", yn, "factor must be positive, got ", r.factor);
  auto num = [&](const char* k, double fallback) {
    const json* v = find(y, k);
    return v ? get_double(*v, yn + k, src) : fallback;
  };
  r.beta_fast = num("beta_fast", 32.0);
  r.beta_slow = num("beta_slow", 1.0);
  // transformers: `beta_fast or 32` — an explicit 0 means the default too.
  if (r.beta_fast == 0) r.beta_fast = 32.0;
  if (r.beta_slow == 0) r.beta_slow = 1.0;
  r.mscale = num("mscale", 0.0);
  r.mscale_all_dim = num("mscale_all_dim", 0.0);
  r.attention_factor = num("attention_factor", -1.0);
  if (const json* v = find(y, "original_max_position_embeddings")) {
    r.original_max_position_embeddings = get_int(*v, yn + "original_max_position_embeddings", src);
    MOESQ_CHECK(r.original_max_position_embeddings > 0, src, ": ", yn, "original_max_position_embeddings must be positive");
  }
  if (const json* v = find(y, "truncate")) r.truncate = get_bool(*v, yn + "truncate", src);
  return r;
}

}  // namespace moesq::io
