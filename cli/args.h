// A small command-line parser shared by every subcommand: declared options with help text,
// `--name value` and `--name=value`, boolean switches, aliases (`--pyt_ckpt_path` for
// `--model`), positionals, hidden test hooks. Unknown options are errors that name the option and
// the subcommand.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace strata::cli {

class Args {
 public:
  Args(std::string command, std::string summary);

  // Declare before parse(). `names` is "--model,--pyt_ckpt_path" (first is canonical).
  void option(const std::string& names, const std::string& value_name, const std::string& help,
              std::optional<std::string> default_value = std::nullopt);
  void flag(const std::string& names, const std::string& help);
  // Test hooks: parsed like the others, left out of --help (documented where they are used).
  void hidden_option(const std::string& names, const std::string& value_name,
                     const std::string& help);
  void hidden_flag(const std::string& names, const std::string& help);
  void positional(const std::string& name, const std::string& help, bool required = true);

  // Parses argv (without the program and command names). Returns false when --help was given
  // (the help text has been printed). Throws strata::Error on bad usage.
  bool parse(const std::vector<std::string>& argv);

  std::string help() const;

  bool has(const std::string& name) const;  // option given or defaulted, or flag set
  bool flag_set(const std::string& name) const;
  std::string get(const std::string& name) const;  // throws when absent
  std::optional<std::string> get_optional(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  // The index of the option's value among `choices` ("a|b|c"); any other value is an error.
  int choice(const std::string& name, const std::string& choices) const;

 private:
  struct Spec {
    std::vector<std::string> names;
    std::string value_name;  // empty for a flag
    std::string help;
    std::optional<std::string> default_value;
    bool hidden = false;
  };
  struct Positional {
    std::string name;
    std::string help;
    bool required;
  };
  const Spec* find(const std::string& name) const;
  std::string canonical(const std::string& name) const;

  std::string command_;
  std::string summary_;
  std::vector<Spec> specs_;
  std::vector<Positional> positionals_;
  std::map<std::string, std::string> values_;  // canonical name -> value ("1" for flags)
};

}  // namespace strata::cli
