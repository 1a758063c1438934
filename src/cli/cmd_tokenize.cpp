// `moesq tokenize PATH (--text T | --text-file F | --decode-ids IDS | --decode-ids-file F)` — the
// debugging view of the tokenizer that --calib / eval --data / generate use on real checkpoints.
// Non-obvious decision: a checkpoint directory goes through io::load_tokenizer_for_checkpoint, the
// same function the pipelines call, so what this prints is what they feed the model (including the
// byte-identity fallback of the tiny byte-level models).
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/tokenizer.h"

namespace moesq::cli {

namespace {

struct TokenizeArgs {
  std::string path;
  std::string text, text_file, decode_ids, decode_ids_file;
  bool json = false;
  bool no_special = false;
  int num_modes = 0;      // how many of the four input flags were given (an empty --text counts)
  bool decoding = false;  // --decode-ids or --decode-ids-file
};

std::string read_file(const std::string& path, const char* flag) {
  std::error_code ec;
  MOESQ_CHECK(std::filesystem::exists(path, ec), flag, ": ", path, ": no such file");
  MOESQ_CHECK(std::filesystem::is_regular_file(path, ec), flag, ": ", path, ": not a regular file");
  std::ifstream f(path, std::ios::binary);
  MOESQ_CHECK(f, flag, ": ", path, ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "1,2,3", "1 2 3", or the JSON that `tokenize --json` prints ({"ids": [...]}) or a bare [...].
std::vector<int32_t> parse_ids(const std::string& s, const std::string& what) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  std::vector<int32_t> ids;
  if (first != std::string::npos && (s[first] == '{' || s[first] == '[')) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(s);
    } catch (const nlohmann::json::exception& e) {
      MOESQ_FAIL(what, ": not valid JSON (", e.what(), ")");
    }
    if (j.is_object() && j.contains("ids")) j = j["ids"];
    MOESQ_CHECK(j.is_array(), what, ": expected a list of ids or {\"ids\": [...]}");
    for (size_t i = 0; i < j.size(); ++i) {
      MOESQ_CHECK(j[i].is_number_integer() && j[i].get<int64_t>() >= 0 && j[i].get<int64_t>() <= INT32_MAX, what,
                  ": item ", i, " (", j[i].dump(), ") is not a token id");
      ids.push_back(j[i].get<int32_t>());
    }
    return ids;
  }
  std::string word;
  const auto flush = [&] {
    if (word.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MOESQ_CHECK(used == word.size() && v >= 0 && v <= INT32_MAX, what, ": \"", word, "\" (item ", ids.size(),
                ") is not a token id");
    ids.push_back(static_cast<int32_t>(v));
    word.clear();
  };
  for (const char c : s) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) flush();
    else word += c;
  }
  flush();
  return ids;
}

io::Tokenizer load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    if (std::filesystem::exists(std::filesystem::path(path) / "tokenizer.json", ec)) return io::load_tokenizer(path);
    io::Tokenizer t = io::load_tokenizer_for_checkpoint(path);
    if (!std::getenv("MOESQ_QUIET"))
      std::fprintf(stderr, "moesq: %s has no tokenizer.json; config.json vocab_size 256: byte-level identity "
                           "(byte value = token id)\n", path.c_str());
    return t;
  }
  return io::load_tokenizer(path);
}

void run_tokenize(const TokenizeArgs& a) {
  MOESQ_CHECK(a.num_modes == 1, "tokenize: give exactly one of --text, --text-file, --decode-ids, --decode-ids-file");
  const io::Tokenizer tok = load(a.path);
  const auto dump = [](const nlohmann::json& j) {
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  };

  if (a.decoding) {
    const std::vector<int32_t> ids = !a.decode_ids_file.empty()
                                         ? parse_ids(read_file(a.decode_ids_file, "--decode-ids-file"),
                                                     "--decode-ids-file " + a.decode_ids_file)
                                         : parse_ids(a.decode_ids, "--decode-ids");
    const std::string text = tok.decode(ids, {.skip_special_tokens = a.no_special});
    if (a.json) {
      dump({{"text", text}});
    } else {
      std::fwrite(text.data(), 1, text.size(), stdout);  // not printf: the text may hold NUL bytes
      std::fputc('\n', stdout);
    }
    return;
  }
  const std::string text = a.text_file.empty() ? a.text : read_file(a.text_file, "--text-file");
  const std::vector<int32_t> ids = tok.encode(text, {.add_special_tokens = !a.no_special});
  if (a.json) {
    nlohmann::json tokens = nlohmann::json::array();
    for (const int32_t id : ids) tokens.push_back(tok.id_to_token(id).value_or(""));
    dump({{"ids", ids}, {"tokens", tokens}});
    return;
  }
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  auto* cmd = app.add_subcommand(
      "tokenize",
      "Text → token ids (or ids → text with --decode-ids) with a checkpoint's tokenizer, as the\n"
      "Hugging Face `tokenizers` library computes them: BPE tokenizer.json files (byte-level like\n"
      "Qwen3/DeepSeek, or byte-fallback like Mistral/Llama), special tokens, the post-processor's BOS.\n"
      "PATH: a checkpoint or tokenizer directory holding tokenizer.json, or the file itself. A\n"
      "checkpoint without tokenizer.json whose config.json says vocab_size 256 is byte-level (byte\n"
      "value = token id, like the embedded tiny model); any other one needs its tokenizer.json.\n"
      "Prints the ids on one line (or {\"ids\": [...], \"tokens\": [...]} with --json); decoding\n"
      "prints the text (or {\"text\": ...}). Example:\n"
      "  moesq tokenize CKPT --text 'Hello, world!' --json\n"
      "  moesq tokenize CKPT --decode-ids 1,594,530");
  cmd->add_option("PATH", args->path, "checkpoint / tokenizer directory, or a tokenizer.json file")->required();
  CLI::Option* modes[] = {
      cmd->add_option("--text", args->text, "the text to encode (UTF-8)"),
      cmd->add_option("--text-file", args->text_file, "encode this file's bytes (UTF-8 text)"),
      cmd->add_option("--decode-ids", args->decode_ids, "ids to decode: \"1,2,3\" or \"1 2 3\""),
      cmd->add_option("--decode-ids-file", args->decode_ids_file,
                      "decode the ids in this file (separated by commas/whitespace, or the JSON --json prints)")};
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_flag("--no-special", args->no_special,
                "encode: no post-processor (no BOS); decode: drop special tokens (skip_special_tokens)");
  cmd->callback([args, modes] {
    args->num_modes = 0;
    for (const CLI::Option* o : modes) args->num_modes += o->count() > 0;
    args->decoding = modes[2]->count() > 0 || modes[3]->count() > 0;
    run_tokenize(*args);
  });
}

}  // namespace moesq::cli
