#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "io/json.h"
#include "io/plain_json.h"

namespace strata {

namespace {

// Largest dimension accepted: 2^53, the largest integer every JSON reader holds exactly.
constexpr uint64_t kMaxDim = uint64_t{1} << 53;

// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
// Sets *bad to the offset of the first bad byte otherwise.
bool valid_utf8(std::string_view s, size_t* bad) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    uint32_t min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      *bad = i;
      return false;
    }
    if (n - i < len) {
      *bad = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      const unsigned cc = p[i + k];
      if ((cc & 0xC0) != 0x80) {
        *bad = i;
        return false;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      *bad = i;
      return false;
    }
    i += len;
  }
  return true;
}

// A JSON value that is a non-negative integer no larger than `max` (floats such as 1.0 and
// integers too large for uint64, which the parser reads as floats, are not).
bool json_uint(const Json& v, uint64_t max, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;  // negative integers parse as signed
  const uint64_t x = v.get<uint64_t>();
  if (x > max) return false;
  *out = x;
  return true;
}

// Reads one tensor entry {"dtype", "shape", "data_offsets"}; `data_size` is the data section's
// length. Every failure names the tensor.
TensorEntry parse_entry(const std::string& what, const std::string& name, const Json& v,
                        uint64_t data_size) {
  const std::string where = str(what, ": tensor '", name, "'");
  STRATA_CHECK(v.is_object(), where, ": entry must be a JSON object, got ", v.type_name());
  for (const auto& [key, value] : v.items()) {
    (void)value;
    STRATA_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", where,
                 ": unexpected key \"", key,
                 "\" (an entry has exactly dtype, shape, data_offsets)");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    STRATA_CHECK(v.contains(key), where, ": missing key \"", key, "\"");
  }

  TensorEntry e;
  e.name = name;
  const Json& dtype = v["dtype"];
  STRATA_CHECK(dtype.is_string(), where, ": dtype must be a string, got ", dtype.type_name());
  const auto parsed_dtype = dtype_from_safetensors_name(dtype.get_ref<const std::string&>());
  STRATA_CHECK(parsed_dtype.has_value(), where, ": unknown dtype \"",
               dtype.get_ref<const std::string&>(), "\"");
  e.dtype = *parsed_dtype;

  const Json& shape = v["shape"];
  STRATA_CHECK(shape.is_array(), where, ": shape must be an array, got ", shape.type_name());
  // numel in 128 bits so that no product of 2^53-bounded dims can wrap before we check it.
  unsigned __int128 numel = 1;
  bool too_big = false;
  for (const Json& d : shape) {
    uint64_t dim = 0;
    STRATA_CHECK(json_uint(d, kMaxDim, &dim), where, ": shape ", shape.dump(),
                 " must hold non-negative integers no larger than 2^53, found ", d.dump());
    e.shape.push_back(static_cast<int64_t>(dim));
    numel *= dim;
    if (numel > static_cast<unsigned __int128>(INT64_MAX)) too_big = true;
    if (too_big) numel = 1;  // keep checking the remaining dims, but never overflow
  }
  STRATA_CHECK(!too_big, where, ": shape ", shape_str(e.shape),
               " has more elements than fit in 64 bits");

  const Json& offsets = v["data_offsets"];
  uint64_t begin = 0;
  uint64_t end = 0;
  STRATA_CHECK(offsets.is_array() && offsets.size() == 2 &&
                   json_uint(offsets[0], UINT64_MAX, &begin) &&
                   json_uint(offsets[1], UINT64_MAX, &end),
               where, ": data_offsets must be two non-negative integers, got ", offsets.dump());
  STRATA_CHECK(begin <= end, where, ": data_offsets [", begin, ", ", end, "] begin after end");
  STRATA_CHECK(end <= data_size, where, ": data_offsets [", begin, ", ", end,
               "] end past the data section, which holds ", data_size, " bytes");
  e.begin = begin;
  e.end = end;

  // Expected byte count: bits per element x numel / 8; F4 (e2m1) packs two per byte.
  const int bits = dtype_bits(e.dtype);
  const auto n = static_cast<uint64_t>(numel);
  STRATA_CHECK(bits % 8 == 0 || n % 2 == 0, where, ": shape ", shape_str(e.shape), " has ", n,
               " elements, but ", dtype_safetensors_name(e.dtype),
               " packs two per byte and needs an even count");
  const unsigned __int128 nbytes = static_cast<unsigned __int128>(numel) * bits / 8;
  if (nbytes != end - begin) {
    fail(where, ": shape ", shape_str(e.shape), " × ", dtype_name(e.dtype), " is ",
         nbytes > UINT64_MAX ? std::string("more than 2^64") : str(static_cast<uint64_t>(nbytes)),
         " bytes but data_offsets span ", end - begin);
  }
  return e;
}

}  // namespace

namespace {

// The length prefix's checks; returns N, the header's length.
uint64_t header_length(const uint8_t* data, size_t size, const std::string& what) {
  // Bytes [0, 8): header length N, little-endian u64.
  STRATA_CHECK(size >= 8, what, ": file is ", size,
               " bytes, too short for a safetensors file (needs an 8-byte header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | data[i];
  STRATA_CHECK(n != 0, what, ": header length is 0");
  STRATA_CHECK(n <= kMaxSafetensorsHeaderBytes, what, ": header length ", n, " is larger than the ",
               kMaxSafetensorsHeaderBytes, "-byte limit");
  STRATA_CHECK(n <= size - 8, what, ": header length ", n, " runs past the end of the file (", size,
               " bytes)");
  return n;
}

// The general path: the strict JSON parser builds the header's tree, then each entry is checked.
// Every problem a header can have is reported here.
void parse_tree(std::string_view text, uint64_t data_size, const std::string& what,
                SafetensorsHeader& h) {
  size_t bad = 0;
  STRATA_CHECK(valid_utf8(text, &bad), what, ": header is not valid UTF-8 (byte ", 8 + bad,
               " of the file)");
  const Json j = json_parse_strict(text, what + ": header");
  STRATA_CHECK(j.is_object(), what, ": header must be a JSON object, got ", j.type_name());
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      STRATA_CHECK(value.is_object(), what, ": __metadata__ must be an object, got ",
                   value.type_name());
      for (const auto& [mk, mv] : value.items()) {
        STRATA_CHECK(mv.is_string(), what, ": __metadata__ value of \"", mk,
                     "\" must be a string, got ", mv.type_name());
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    h.entries.push_back(parse_entry(what, key, value, data_size));
  }
}

// The fast path: a reader of the plain form writers produce, straight from the text into the
// entries, with no tree. It accepts a header only when the general path would accept it with the
// same entries and metadata: the grammar it takes is JSON's (whitespace, objects, arrays, strings
// without escapes or control characters, unsigned integers), and it makes every check of
// parse_entry. Anything else (an escape, a float, a duplicate key, a failed check) makes it give
// up, and the general path reads the header again and names the problem.
class PlainHeaderReader {
 public:
  PlainHeaderReader(std::string_view text, uint64_t data_size) : j_(text), data_size_(data_size) {}

  // True when the whole text is a plain header; fills `h`'s entries and metadata.
  bool read(SafetensorsHeader& h) {
    if (!j_.take('{')) return false;
    bool seen_metadata = false;
    if (!j_.take('}')) {
      do {
        std::string_view key;
        if (!string(&key) || !j_.take(':')) return false;
        if (key == "__metadata__") {
          if (seen_metadata || !metadata(h.metadata)) return false;
          seen_metadata = true;
        } else {
          h.entries.emplace_back();
          if (!entry(key, h.entries.back())) return false;
        }
      } while (j_.take(','));
      if (!j_.take('}')) return false;
    }
    return j_.at_end();
  }

 private:
  // The text is valid UTF-8 (checked before): strings may hold any of it.
  bool string(std::string_view* out) { return j_.string(out, true); }
  bool take(char c) { return j_.take(c); }
  bool uint(uint64_t max, uint64_t* out) { return j_.uint(max, out); }
  bool metadata(std::map<std::string, std::string>& out) {
    if (!take('{')) return false;
    if (take('}')) return true;
    do {
      std::string_view k, v;
      if (!string(&k) || !take(':') || !string(&v)) return false;
      if (!out.emplace(std::string(k), std::string(v)).second) return false;  // a duplicate
    } while (take(','));
    return take('}');
  }
  // {"dtype": .., "shape": [..], "data_offsets": [b, e]} in any order, each key once, and the
  // checks of parse_entry.
  bool entry(std::string_view name, TensorEntry& e) {
    if (!take('{')) return false;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    unsigned __int128 numel = 1;
    do {
      std::string_view key;
      if (!string(&key) || !take(':')) return false;
      if (key == "dtype" && !has_dtype) {
        std::string_view d;
        if (!string(&d)) return false;
        const std::optional<DType> dtype = dtype_from_safetensors_name(d);
        if (!dtype) return false;
        e.dtype = *dtype;
        has_dtype = true;
      } else if (key == "shape" && !has_shape) {
        if (!take('[')) return false;
        if (!take(']')) {
          do {
            uint64_t dim = 0;
            if (!uint(kMaxDim, &dim)) return false;
            e.shape.push_back(static_cast<int64_t>(dim));
            numel *= dim;
            if (numel > static_cast<unsigned __int128>(INT64_MAX)) return false;
          } while (take(','));
          if (!take(']')) return false;
        }
        has_shape = true;
      } else if (key == "data_offsets" && !has_offsets) {
        if (!take('[') || !uint(UINT64_MAX, &e.begin) || !take(',') || !uint(UINT64_MAX, &e.end) ||
            !take(']'))
          return false;
        has_offsets = true;
      } else {
        return false;
      }
    } while (take(','));
    if (!take('}') || !has_dtype || !has_shape || !has_offsets) return false;
    if (e.begin > e.end || e.end > data_size_) return false;
    const int bits = dtype_bits(e.dtype);
    if (bits % 8 != 0 && static_cast<uint64_t>(numel) % 2 != 0) return false;
    if (numel * static_cast<unsigned>(bits) / 8 != e.end - e.begin) return false;
    e.name = std::string(name);
    return true;
  }

  PlainJson j_;
  uint64_t data_size_;
};

// Sorts by byte range (name breaks ties, so the order never depends on the header's order).
void sort_entries(SafetensorsHeader& h) {
  std::sort(h.entries.begin(), h.entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
}

// Scans the sorted entries for overlaps. Empty tensors occupy no bytes and cannot overlap
// anything.
void check_overlaps(const std::string& what, const SafetensorsHeader& h) {
  uint64_t covered_end = 0;  // furthest end of any non-empty tensor seen so far
  const TensorEntry* furthest = nullptr;
  for (const TensorEntry& e : h.entries) {
    if (e.begin == e.end) continue;
    if (furthest != nullptr && e.begin < covered_end) {
      fail(what, ": tensor '", e.name, "' bytes [", e.begin, ", ", e.end, ") overlap tensor '",
           furthest->name, "' bytes [", furthest->begin, ", ", furthest->end, ")");
    }
    if (e.begin > covered_end) {
      log_debug(what, ": ", e.begin - covered_end, " unused bytes before tensor '", e.name, "'");
    }
    covered_end = e.end;
    furthest = &e;
  }
  if (covered_end < h.data_size) {
    log_debug(what, ": ", h.data_size - covered_end, " trailing bytes after the last tensor");
  }
}

// The entries' indices sorted by name; false when two share a name.
bool index_by_name(SafetensorsHeader& h) {
  h.by_name.resize(h.entries.size());
  for (size_t i = 0; i < h.entries.size(); ++i)
    h.by_name[i] = static_cast<uint32_t>(i);
  std::sort(h.by_name.begin(), h.by_name.end(),
            [&](uint32_t a, uint32_t b) { return h.entries[a].name < h.entries[b].name; });
  for (size_t i = 1; i < h.by_name.size(); ++i) {
    if (h.entries[h.by_name[i - 1]].name == h.entries[h.by_name[i]].name) return false;
  }
  return true;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size,
                                           const std::string& what, HeaderPath path) {
  const uint64_t n = header_length(data, size, what);
  // Bytes [8, 8+N): the JSON header; [8+N, size): the data section.
  const std::string_view text(reinterpret_cast<const char*>(data) + 8, static_cast<size_t>(n));
  SafetensorsHeader h;
  h.data_offset = 8 + n;
  h.data_size = size - h.data_offset;
  size_t bad = 0;
  bool plain = path == HeaderPath::kAny && valid_utf8(text, &bad) &&
               PlainHeaderReader(text, h.data_size).read(h);
  if (plain) {
    sort_entries(h);
    plain = index_by_name(h);  // a duplicate name: the general path names it
  }
  if (!plain) {
    h = SafetensorsHeader{};
    h.data_offset = 8 + n;
    h.data_size = size - h.data_offset;
    parse_tree(text, h.data_size, what, h);
    sort_entries(h);
    const bool unique = index_by_name(h);
    STRATA_ASSERT(unique, what, ": the JSON parser let a duplicate tensor name through");
  }
  check_overlaps(what, h);
  return h;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  f.header_ = parse_safetensors_header(f.file_->data(), f.file_->size(), path);
  return f;
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  const std::vector<TensorEntry>& entries = header_.entries;
  auto it = std::lower_bound(header_.by_name.begin(), header_.by_name.end(), name,
                             [&](uint32_t i, std::string_view n) { return entries[i].name < n; });
  return it != header_.by_name.end() && entries[*it].name == name ? &entries[*it] : nullptr;
}

Tensor SafetensorsFile::tensor(const TensorEntry& entry) const {
  STRATA_ASSERT(entry.begin <= entry.end && header_.data_offset + entry.end <= file_->size(),
                "entry '", entry.name, "' does not belong to ", path());
  const uint8_t* p = file_->data() + header_.data_offset + entry.begin;
  // The view's owner is the mapping itself: the bytes stay mapped while any view lives.
  return Tensor::view(entry.dtype, entry.shape, p, entry.end - entry.begin, file_);
}

Tensor SafetensorsFile::tensor(std::string_view name) const {
  const TensorEntry* e = find(name);
  STRATA_CHECK(e != nullptr, path(), ": no tensor '", name, "'");
  return tensor(*e);
}

}  // namespace strata
