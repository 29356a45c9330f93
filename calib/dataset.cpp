#include "calib/dataset.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "io/json.h"

namespace strata {

namespace {

namespace fs = std::filesystem;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound] by rejection.
uint64_t uniform_upto(uint64_t& state, uint64_t bound) {
  const uint64_t range = bound + 1;
  if (range == 0) return splitmix64(state);
  const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
  while (true) {
    uint64_t x = splitmix64(state);
    if (x >= threshold) return x % range;
  }
}

std::vector<int64_t> shuffled(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(n);
  for (int64_t i = 0; i < n; ++i)
    p[i] = i;
  uint64_t state = seed;
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(uniform_upto(state, static_cast<uint64_t>(i)));
    std::swap(p[i], p[j]);
  }
  return p;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f, path, ": cannot open calibration data for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool blank(std::string_view s) {
  for (char c : s) {
    if (c != ' ' && c != '\t' && c != '\r' && c != '\n' && c != '\f' && c != '\v') return false;
  }
  return true;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct Record {
  bool is_ids =
      false;  // ids used as given (token-id JSONL) or already content tokens (text windows)
  bool add_specials = false;
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<int32_t> ids_from_json(const Json& list, const std::string& where, int64_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (const Json& v : list) {
    STRATA_CHECK(v.is_number_integer(), where, ": token ids must be integers");
    int64_t id = v.get<int64_t>();
    STRATA_CHECK(id >= 0 && id < vocab, where, ": token id ", id,
                 " is outside the tokenizer's vocabulary (0..", vocab - 1,
                 "); was this file made with another tokenizer?");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<Record> read_jsonl(const std::string& path, const std::string& field, int64_t vocab) {
  const std::string text = read_file(path);
  std::vector<Record> out;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (blank(line)) continue;
    const std::string where = str(path, ":", line_no);
    Json j = json_parse_strict(line, where);
    Record r;
    if (j.is_array()) {
      r.is_ids = true;
      r.ids = ids_from_json(j, where, vocab);
    } else if (j.is_object() && j.contains(field)) {
      STRATA_CHECK(j[field].is_string(), where, ": field \"", field, "\" must be a string");
      r.text = j[field].get<std::string>();
      r.add_specials = true;
    } else if (j.is_object() && j.contains("input_ids") && j["input_ids"].is_array()) {
      r.is_ids = true;
      r.ids = ids_from_json(j["input_ids"], where, vocab);
    } else {
      fail(where, ": no text field \"", field,
           "\" and no \"input_ids\"; name the text field with --calib_text_field or give a list of "
           "token ids");
    }
    out.push_back(std::move(r));
  }
  return out;
}

// A plain-text source (a file, or a directory of *.txt files in name order) as windows of content
// tokens.
std::vector<Record> read_text_windows(const std::string& path, const Tokenizer& tok,
                                      int64_t content_len) {
  std::string text;
  if (fs::is_directory(path)) {
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.is_regular_file() && e.path().extension() == ".txt") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    STRATA_CHECK(!files.empty(), path, ": directory has no *.txt files to calibrate on");
    for (const std::string& f : files) {
      if (!text.empty()) text += "\n\n";
      text += read_file(f);
    }
  } else {
    text = read_file(path);
  }
  const std::vector<int32_t> ids = tok.encode(text, false);
  std::vector<Record> out;
  for (size_t off = 0; off < ids.size(); off += static_cast<size_t>(content_len)) {
    Record r;
    r.is_ids = true;
    r.add_specials = true;
    size_t end = std::min(ids.size(), off + static_cast<size_t>(content_len));
    r.ids.assign(ids.begin() + off, ids.begin() + end);
    out.push_back(std::move(r));
  }
  return out;
}

int64_t parse_count(const std::string& s, const std::string& option) {
  int64_t v = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  STRATA_CHECK(ec == std::errc() && end == s.data() + s.size() && v >= 0, option, ": '", s,
               "' is not a non-negative sample count");
  return v;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t c = s.find(',', pos);
    out.push_back(s.substr(pos, c == std::string::npos ? std::string::npos : c - pos));
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return out;
}

}  // namespace

std::vector<CalibSource> parse_calib_sources(const std::string& data, const std::string& sizes) {
  std::vector<std::string> paths = split_commas(data), counts = split_commas(sizes);
  for (const std::string& p : paths)
    STRATA_CHECK(!p.empty(), "--calib_data: empty path in '", data, "'");
  STRATA_CHECK(counts.size() == 1 || counts.size() == paths.size(), "--calib_size: ", counts.size(),
               " sizes for ", paths.size(), " datasets; give one size for all or one per dataset");
  std::vector<CalibSource> out;
  for (size_t i = 0; i < paths.size(); ++i)
    out.push_back(
        {paths[i], parse_count(counts.size() == 1 ? counts[0] : counts[i], "--calib_size")});
  return out;
}

std::string bundled_calib_path() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path installed = exe.parent_path().parent_path() / "share" / "strata" / "calib";
    if (fs::is_directory(installed)) return installed.string();
  }
#ifdef STRATA_SOURCE_DIR_FOR_DATA
  fs::path source = fs::path(STRATA_SOURCE_DIR_FOR_DATA) / "data" / "calib";
  if (fs::is_directory(source)) return source.string();
#endif
  fail("the bundled calibration corpus (data/calib) was not found; pass --calib_data");
}

std::string bundled_heldout_path() {
  const fs::path p = fs::path(bundled_calib_path()) / "heldout";
  STRATA_CHECK(fs::is_directory(p), p.string(),
               ": the bundled held-out corpus was not found; pass --tokens or --text");
  return p.string();
}

std::vector<std::vector<int32_t>> read_token_file(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK(in, path, ": cannot open for reading");
  std::vector<std::vector<int32_t>> seqs;
  std::string line;
  for (int64_t lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string what = str(path, ":", lineno);
    Json j = json_parse_strict(line, what);
    STRATA_CHECK(j.is_array(), what, ": expected a JSON list of token ids");
    std::vector<int32_t> seq;
    for (const Json& v : j) {
      STRATA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                   what, ": token ids must be non-negative integers, got ", v.dump());
      seq.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    STRATA_CHECK(!seq.empty(), what, ": empty sequence");
    seqs.push_back(std::move(seq));
  }
  STRATA_CHECK(!seqs.empty(), path, ": no sequences");
  return seqs;
}

std::string CalibReport::summary() const {
  std::ostringstream os;
  for (const CalibSourceReport& s : sources) {
    os << s.path << " (" << s.format << "): " << s.taken << "/" << s.requested << " sequences from "
       << s.records << " records, " << s.tokens << " tokens; skipped " << s.skipped_empty
       << " empty, " << s.skipped_short << " too short; truncated " << s.truncated << "\n";
  }
  os << "calibration: " << sequences << " sequences, " << tokens << " tokens";
  return os.str();
}

Calibration load_calibration(const CalibOptions& options, const Tokenizer& tok) {
  return load_calibration(options, &tok, tok.vocab_size());
}

Calibration load_calibration(const CalibOptions& options, const Tokenizer* tokp,
                             int64_t vocab_size) {
  static const std::vector<int32_t> kNone;
  const std::vector<int32_t>& prefix = tokp ? tokp->special_prefix() : kNone;
  const std::vector<int32_t>& suffix = tokp ? tokp->special_suffix() : kNone;
  auto need_tokenizer = [&](const std::string& path) -> const Tokenizer& {
    STRATA_CHECK(tokp, path,
                 ": text calibration data needs the model's tokenizer, and the model directory has "
                 "none (tokenizer.json or tiktoken.model); give token-id JSONL (one list of ids "
                 "per line) instead");
    return *tokp;
  };
  const int64_t n_special =
      options.add_special_tokens ? static_cast<int64_t>(prefix.size() + suffix.size()) : 0;
  STRATA_CHECK(options.seq_len > n_special, "--calib_seq ", options.seq_len,
               " leaves no room for text after the tokenizer's ", n_special,
               " special tokens; raise it");
  const int64_t content_len = options.seq_len - n_special;

  std::vector<CalibSource> sources = options.sources;
  if (sources.empty()) sources.push_back({bundled_calib_path(), options.default_count});

  Calibration cal;
  for (size_t si = 0; si < sources.size(); ++si) {
    const CalibSource& src = sources[si];
    CalibSourceReport rep;
    rep.path = src.path;
    rep.requested = src.count;
    STRATA_CHECK(fs::exists(src.path), src.path,
                 ": calibration data not found; check --calib_data");
    const bool jsonl = !fs::is_directory(src.path) && ends_with(src.path, ".jsonl");
    rep.format = jsonl ? "jsonl" : "text";
    std::vector<Record> records =
        jsonl ? read_jsonl(src.path, options.text_field, vocab_size)
              : read_text_windows(src.path, need_tokenizer(src.path), content_len);
    rep.records = static_cast<int64_t>(records.size());

    const uint64_t seed = options.seed ^ (0x9E3779B97F4A7C15ull * (si + 1));
    for (int64_t idx : shuffled(rep.records, seed)) {
      if (rep.taken >= src.count) break;
      Record& r = records[idx];
      std::vector<int32_t> content;
      if (r.is_ids) {
        content = std::move(r.ids);
      } else if (!blank(r.text)) {
        content = need_tokenizer(src.path).encode(r.text, false);
      }
      const bool wrap = r.add_specials && options.add_special_tokens;
      const int64_t limit = wrap ? content_len : options.seq_len;
      if (content.empty()) {
        ++rep.skipped_empty;
        continue;
      }
      if (static_cast<int64_t>(content.size()) > limit) {
        content.resize(limit);
        ++rep.truncated;
      }
      std::vector<int32_t> seq;
      if (wrap) {
        seq.reserve(content.size() + n_special);
        seq.insert(seq.end(), prefix.begin(), prefix.end());
        seq.insert(seq.end(), content.begin(), content.end());
        seq.insert(seq.end(), suffix.begin(), suffix.end());
      } else {
        seq = std::move(content);
      }
      if (static_cast<int64_t>(seq.size()) < options.min_tokens) {
        ++rep.skipped_short;
        continue;
      }
      rep.tokens += static_cast<int64_t>(seq.size());
      ++rep.taken;
      cal.sequences.push_back(std::move(seq));
    }
    if (rep.taken < rep.requested) {
      log_warn(src.path, ": only ", rep.taken, " of ", rep.requested,
               " calibration sequences could be taken (", rep.records, " records, ",
               rep.skipped_empty, " empty, ", rep.skipped_short, " shorter than ",
               options.min_tokens, " tokens)");
    }
    cal.report.sequences += rep.taken;
    cal.report.tokens += rep.tokens;
    cal.report.sources.push_back(std::move(rep));
  }
  return cal;
}

}  // namespace strata
