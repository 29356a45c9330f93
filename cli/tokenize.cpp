// strata tokenize --model DIR [--whole] [--add_special_tokens]
// Reads text on stdin and prints token ids as JSON lists: one per input line (the '\n' is not
// part of the line), or with --whole one list for all of stdin. Ill-formed UTF-8 is replaced by
// U+FFFD first, as Python's bytes.decode("utf-8", errors="replace") does.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

namespace {
void print_ids(const std::vector<int32_t>& ids, std::string& buf) {
  buf.clear();
  buf.push_back('[');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) buf += ", ";
    buf += std::to_string(ids[i]);
  }
  buf += "]\n";
  std::fwrite(buf.data(), 1, buf.size(), stdout);
}
}  // namespace

int cmd_tokenize(const std::vector<std::string>& argv) {
  Args args("tokenize",
            "print the token ids of text read on stdin, as the model's tokenizer gives them");
  args.option("--model,--pyt_ckpt_path", "DIR",
              "checkpoint directory holding tokenizer.json or tiktoken.model");
  args.flag("--whole", "tokenize all of stdin as one text (default: one list per line)");
  args.flag("--add_special_tokens",
            "add the BOS/EOS the model's tokenizer adds (post-processor, tokenizer_config.json)");
  if (!args.parse(argv)) return 0;
  const Tokenizer tok = Tokenizer::load(args.get("--model"));
  const bool special = args.flag_set("--add_special_tokens");

  std::ios::sync_with_stdio(false);
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::string buf;
  if (args.flag_set("--whole")) {
    print_ids(tok.encode(input, special), buf);
  } else {
    size_t pos = 0;
    while (pos < input.size()) {
      size_t eol = input.find('\n', pos);
      if (eol == std::string::npos) eol = input.size();
      print_ids(tok.encode(std::string_view(input).substr(pos, eol - pos), special), buf);
      pos = eol + 1;
    }
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace strata::cli
