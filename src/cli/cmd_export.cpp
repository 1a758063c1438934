// `moesq export SRC --format F --out OUT`: a compressed checkpoint rewritten in another layout
// (io/export_checkpoint.h, docs/FORMAT.md §8–§9). OUT is built in a temporary sibling and renamed into
// place (AtomicDir); nothing is left on failure.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "io/export_checkpoint.h"

namespace moesq::cli {

void register_export(CLI::App& app) {
  struct Args {
    std::string src, out, format, max_shard_size = "5GB";
    int scale_block = 0;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "export",
      "Rewrite a compressed checkpoint (moesq, or compressed-tensors NVFP4) in another layout; the\n"
      "dequantized weights stay bit-identical and every moesq command reads the result back.\n"
      "  compressed-tensors  quant_method compressed-tensors, format nvfp4-pack-quantized: per expert\n"
      "                      projection weight_packed U8 [N, K/2] (pruned weights = zero codes),\n"
      "                      weight_scale F8_E4M3 [N, K/32] and group_size 32 for paired 4:8 experts\n"
      "                      (the layout of the paper's reference, IST-DASLab/MoESQ, and its vLLM\n"
      "                      backend), or with --scale-block 16 [N, K/16], each 32-block scale written\n"
      "                      twice (what a stock server's dense NVFP4 path accepts; the default for a\n"
      "                      dense NVFP4 source),\n"
      "                      weight_global_scale / input_global_scale F32 divisors, and an ignore list of\n"
      "                      every module not compressed. A dense NVFP4 checkpoint (4.5 bits/weight)\n"
      "                      that vLLM / SGLang load as is (4.25 bits/weight, 4.5 at --scale-block 16).\n"
      "  moesq-pair-bitmask  the same, with weight_packed replaced by weight_sparse_packed U8 [N, K/4]\n"
      "                      (the 2 kept bytes of every 4) and weight_sparse_mask U8 [N, K/16] (one\n"
      "                      nibble per 4-byte chunk, bit i = byte i kept), and quantization_config.\n"
      "                      paired48_sparse = {layout: pair-bitmask, version: 1}; 2.75 bits/weight\n"
      "                      (2 values + 0.5 mask + 0.25 32-block scales; 3.0 at --scale-block 16).\n"
      "  moesq               moesq's own layout (docs/FORMAT.md §7), e.g. to convert an import back.");
  cmd->add_option("SRC", args->src, "compressed checkpoint directory")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--format", args->format, "compressed-tensors | moesq-pair-bitmask | moesq")->required();
  cmd->add_option("--out", args->out, "output checkpoint directory (replaced atomically; holds export.json)")
      ->required();
  cmd->add_option("--scale-block", args->scale_block,
                  "weight_scale group for compressed-tensors / moesq-pair-bitmask: 32 (default for paired 4:8, "
                  "the reference's layout) or 16 (duplicated scales)")
      ->check(CLI::IsMember({16, 32}));
  cmd->add_option("--max-shard-size", args->max_shard_size,
                  "largest safetensors shard: more tensors than this go to model-0000i-of-0000n.safetensors\n"
                  "files with model.safetensors.index.json, as hub checkpoints are (bytes, or with B, KB, MB,\n"
                  "GB, KiB, MiB, GiB)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print the summary as one JSON object on stdout");
  cmd->callback([args] {
    const io::ExportFormat f = io::parse_export_format(args->format);
    const size_t max_shard = io::parse_shard_size(args->max_shard_size);
    const nlohmann::json s =
        io::export_checkpoint(args->src, f, args->out, "export.json", args->scale_block, max_shard);
    if (args->json) {
      std::printf("%s\n", s.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else {
      std::printf("exported %s as %s: %lld projections (%lld paired 4:8), %.4f bits/expert weight -> %s\n",
                  args->src.c_str(), io::export_format_name(f), static_cast<long long>(s["projections"].get<int64_t>()),
                  static_cast<long long>(s["paired48_projections"].get<int64_t>()),
                  s["bits_per_expert_weight"].get<double>(), args->out.c_str());
    }
  });
}

}  // namespace moesq::cli
