#include "cli/args.h"

#include <charconv>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace strata::cli {

namespace {
std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream ss(names);
  std::string item;
  while (std::getline(ss, item, ','))
    out.push_back(item);
  return out;
}
}  // namespace

Args::Args(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {
  flag("--help,-h", "show this help and exit");
}

void Args::option(const std::string& names, const std::string& value_name, const std::string& help,
                  std::optional<std::string> default_value) {
  specs_.push_back({split_names(names), value_name, help, std::move(default_value)});
}

void Args::flag(const std::string& names, const std::string& help) {
  specs_.push_back({split_names(names), "", help, std::nullopt});
}

void Args::hidden_option(const std::string& names, const std::string& value_name,
                         const std::string& help) {
  specs_.push_back({split_names(names), value_name, help, std::nullopt, true});
}

void Args::hidden_flag(const std::string& names, const std::string& help) {
  specs_.push_back({split_names(names), "", help, std::nullopt, true});
}

void Args::positional(const std::string& name, const std::string& help, bool required) {
  positionals_.push_back({name, help, required});
}

const Args::Spec* Args::find(const std::string& name) const {
  for (const Spec& s : specs_) {
    for (const std::string& n : s.names) {
      if (n == name) return &s;
    }
  }
  return nullptr;
}

std::string Args::canonical(const std::string& name) const {
  if (const Spec* s = find(name)) return s->names.front();
  if (const Spec* s = find("--" + name)) return s->names.front();
  return name;
}

bool Args::parse(const std::vector<std::string>& argv) {
  size_t next_positional = 0;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() > 1 && a[0] == '-' && a != "-") {
      std::string name = a, value;
      bool inline_value = false;
      if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
        name = a.substr(0, eq);
        value = a.substr(eq + 1);
        inline_value = true;
      }
      const Spec* s = find(name);
      STRATA_CHECK(s, "strata ", command_, ": unknown option ", name, " (see strata ", command_,
                   " --help)");
      if (s->value_name.empty()) {
        STRATA_CHECK(!inline_value, "strata ", command_, ": ", name, " takes no value");
        values_[s->names.front()] = "1";
        continue;
      }
      if (!inline_value) {
        STRATA_CHECK(i + 1 < argv.size(), "strata ", command_, ": ", name, " needs a value (",
                     s->value_name, ")");
        value = argv[++i];
      }
      values_[s->names.front()] = value;
    } else {
      STRATA_CHECK(next_positional < positionals_.size(), "strata ", command_,
                   ": unexpected argument '", a, "' (see strata ", command_, " --help)");
      values_[positionals_[next_positional++].name] = a;
    }
  }
  if (flag_set("--help")) {
    std::fputs(help().c_str(), stdout);
    return false;
  }
  for (size_t p = next_positional; p < positionals_.size(); ++p) {
    STRATA_CHECK(!positionals_[p].required, "strata ", command_, ": missing ", positionals_[p].name,
                 " (see strata ", command_, " --help)");
  }
  for (const Spec& s : specs_) {
    if (s.default_value && !values_.count(s.names.front()))
      values_[s.names.front()] = *s.default_value;
  }
  return true;
}

std::string Args::help() const {
  std::ostringstream os;
  os << "usage: strata " << command_;
  for (const Positional& p : positionals_)
    os << (p.required ? " " : " [") << p.name << (p.required ? "" : "]");
  os << " [options]\n\n" << summary_ << "\n";
  if (!positionals_.empty()) {
    os << "\narguments:\n";
    for (const Positional& p : positionals_)
      os << "  " << p.name << "\n      " << p.help << "\n";
  }
  os << "\noptions:\n";
  for (const Spec& s : specs_) {
    if (s.hidden) continue;
    os << "  ";
    for (size_t i = 0; i < s.names.size(); ++i)
      os << (i ? ", " : "") << s.names[i];
    if (!s.value_name.empty()) os << " " << s.value_name;
    os << "\n      " << s.help;
    if (s.default_value) os << " (default: " << *s.default_value << ")";
    os << "\n";
  }
  return os.str();
}

bool Args::has(const std::string& name) const {
  return values_.count(canonical(name)) > 0;
}
bool Args::flag_set(const std::string& name) const {
  return has(name);
}

std::string Args::get(const std::string& name) const {
  auto v = get_optional(name);
  STRATA_CHECK(v.has_value(), "strata ", command_, ": ", name, " is required (see strata ",
               command_, " --help)");
  return *v;
}

std::optional<std::string> Args::get_optional(const std::string& name) const {
  auto it = values_.find(canonical(name));
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

int64_t Args::get_int(const std::string& name) const {
  std::string v = get(name);
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  STRATA_CHECK(ec == std::errc() && ptr == v.data() + v.size(), "strata ", command_, ": ", name,
               " expects an integer, got '", v, "'");
  return out;
}

double Args::get_double(const std::string& name) const {
  std::string v = get(name);
  try {
    size_t pos = 0;
    double d = std::stod(v, &pos);
    if (pos == v.size()) return d;
  } catch (const std::exception&) {
  }
  fail("strata ", command_, ": ", name, " expects a number, got '", v, "'");
}

int Args::choice(const std::string& name, const std::string& choices) const {
  const std::string v = get(name);
  int i = 0;
  for (size_t at = 0;; ++i) {
    const size_t bar = choices.find('|', at);
    if (choices.substr(at, bar - at) == v) return i;
    if (bar == std::string::npos) break;
    at = bar + 1;
  }
  fail(name, " must be ", choices, ", not '", v, "'");
}

}  // namespace strata::cli
