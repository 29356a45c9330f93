// The subcommands of `strata`. Each takes its arguments (after the command name) and returns
// the process exit code; bad input is thrown as strata::Error and reported by main.
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

using CommandFn = int (*)(const std::vector<std::string>& argv);

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
};

// The table main() dispatches on, in the order `strata --help` lists them.
const std::vector<Command>& commands();

int cmd_version(const std::vector<std::string>& argv);
int cmd_eval(const std::vector<std::string>& argv);
int cmd_compare(const std::vector<std::string>& argv);
int cmd_quantize(const std::vector<std::string>& argv);
int cmd_inspect(const std::vector<std::string>& argv);
int cmd_tokenize(const std::vector<std::string>& argv);
int cmd_recipes(const std::vector<std::string>& argv);

}  // namespace strata::cli
