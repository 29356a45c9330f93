#include "io/json.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace strata {

namespace {

// Builds the Json of a SAX parse: values are appended where they belong (object keys with
// json_append, so the build is linear), a set per open object finds a duplicate key, and a
// container is refused past `max_depth` open ones.
class StrictBuilder {
 public:
  explicit StrictBuilder(int max_depth) : max_depth_(max_depth) {}

  bool null() { return value(Json(nullptr)); }
  bool boolean(bool v) { return value(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return value(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return value(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return value(Json(v)); }
  bool string(Json::string_t& v) { return value(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return value(Json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(Json::string_t& k) {
    if (!keys_.back().insert(k).second) {
      problem_ = str("duplicate key \"", k, "\"");
      return false;
    }
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    if (problem_.empty()) problem_ = e.what();
    return false;
  }

  Json& result() { return root_; }
  const std::string& problem() const { return problem_; }

 private:
  // The value goes to the open container (an object under the last key), or is the root.
  Json* put(Json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_object()) {
      json_append(parent, std::move(key_), std::move(v));
      return &parent.get_ref<Json::object_t&>().back().second;
    }
    parent.get_ref<Json::array_t&>().push_back(std::move(v));
    return &parent.get_ref<Json::array_t&>().back();
  }
  bool value(Json v) {
    put(std::move(v));
    return true;
  }
  bool open(Json container) {
    if (static_cast<int>(open_.size()) >= max_depth_) {
      problem_ = str("nesting deeper than ", max_depth_, " levels");
      return false;
    }
    open_.push_back(put(std::move(container)));
    keys_.emplace_back();
    return true;
  }
  bool close() {
    open_.pop_back();
    keys_.pop_back();
    return true;
  }

  int max_depth_;
  Json root_;
  std::vector<Json*> open_;  // the open containers, outermost first (each the last child of the
                             // one before: appending to a parent moves no open child)
  std::vector<std::set<std::string>> keys_;  // per open container (arrays: empty)
  std::string key_;
  std::string problem_;
};

}  // namespace

void json_append(Json& object, std::string key, Json value) {
  Json::object_t& o = object.get_ref<Json::object_t&>();
  static_cast<Json::object_t::Container&>(o).emplace_back(std::move(key), std::move(value));
}

Json json_parse_strict(std::string_view text, const std::string& what, int max_depth) {
  // nlohmann's lexer takes a NUL byte outside a string for the end of the input, so
  // "{}\0garbage" would parse. JSON never holds a raw NUL (inside strings it must be escaped).
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(what, ": invalid JSON: NUL byte at offset ", nul);
  }
  StrictBuilder b(max_depth);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &b);
  } catch (const nlohmann::json::exception& e) {
    if (b.problem().empty()) fail(what, ": invalid JSON: ", e.what());
  }
  if (!b.problem().empty()) fail(what, ": invalid JSON: ", b.problem());
  if (!ok) fail(what, ": invalid JSON");
  return std::move(b.result());
}

Json json_read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in, path, ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  STRATA_CHECK(!in.bad(), path, ": read error");
  return json_parse_strict(ss.str(), path);
}

}  // namespace strata
