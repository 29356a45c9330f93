#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;
using test::st_bytes;
using test::TempDir;

// Parses bytes held in memory, naming them "t.safetensors".
SafetensorsHeader parse_header(const std::string& bytes) {
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  "t.safetensors");
}

void expect_parse_error(const std::string& bytes, std::initializer_list<std::string> parts) {
  SCOPED_TRACE(bytes.size() > 8 ? bytes.substr(8, 200) : std::string("(short)"));
  std::vector<std::string> all = {"t.safetensors"};
  all.insert(all.end(), parts.begin(), parts.end());
  try {
    parse_header(bytes);
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : all) {
      EXPECT_NE(msg.find(p), std::string::npos)
          << "message \"" << msg << "\" lacks \"" << p << "\"";
    }
    return;
  }
  ADD_FAILURE() << "expected an error";
}

// One entry's JSON text.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

TEST(SafetensorsHeader, ValidFileSortedByOffset) {
  // Two tensors listed out of offset order, metadata, 4 bytes of header padding.
  const std::string header = "{\"__metadata__\":{\"format\":\"pt\"}," +
                             entry("w", "BF16", "[2,2]", "[4,12]") + "," +
                             entry("s", "F32", "[]", "[0,4]") + "}    ";
  const std::string bytes = st_bytes(header, std::string(12, '\x01'));
  SafetensorsHeader h = parse_header(bytes);
  EXPECT_EQ(h.data_offset, 8 + header.size());
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].name, "s");
  EXPECT_EQ(h.entries[0].dtype, DType::kF32);
  EXPECT_TRUE(h.entries[0].shape.empty());
  EXPECT_EQ(h.entries[1].name, "w");
  EXPECT_EQ(h.entries[1].dtype, DType::kBF16);
  EXPECT_EQ(h.entries[1].shape, (Shape{2, 2}));
  EXPECT_EQ(h.entries[1].begin, 4u);
  EXPECT_EQ(h.entries[1].end, 12u);
  ASSERT_EQ(h.metadata.size(), 1u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, GapsTrailingBytesAndEmptyTensorsAreAllowed) {
  // [0,4) a, [8,12) b, 4 trailing bytes, and an empty tensor whose offset sits inside a.
  const std::string header = "{" + entry("a", "U8", "[4]", "[0,4]") + "," +
                             entry("b", "I32", "[1]", "[8,12]") + "," +
                             entry("e", "F16", "[0,3]", "[2,2]") + "}";
  SafetensorsHeader h = parse_header(st_bytes(header, std::string(16, '\0')));
  EXPECT_EQ(h.entries.size(), 3u);
}

TEST(SafetensorsHeader, F4PacksTwoPerByte) {
  SafetensorsHeader h =
      parse_header(st_bytes("{" + entry("q", "F4", "[2,6]", "[0,6]") + "}", std::string(6, '\0')));
  ASSERT_EQ(h.entries.size(), 1u);
  EXPECT_EQ(h.entries[0].dtype, DType::kE2M1);
  expect_parse_error(st_bytes("{" + entry("q", "F4", "[2,6]", "[0,12]") + "}", std::string(12, 0)),
                     {"tensor 'q'", "is 6 bytes but data_offsets span 12"});
  expect_parse_error(st_bytes("{" + entry("q", "F4", "[3]", "[0,2]") + "}", std::string(2, 0)),
                     {"tensor 'q'", "even count"});
}

TEST(SafetensorsHeader, LengthPrefixErrors) {
  expect_parse_error(std::string("\x01\x00\x00", 3), {"3 bytes, too short"});
  expect_parse_error(std::string(), {"0 bytes, too short"});
  expect_parse_error(test::le64(0) + "{}", {"header length is 0"});
  expect_parse_error(test::le64(100'000'001) + "{}", {"header length 100000001", "limit"});
  expect_parse_error(test::le64(~uint64_t{0}) + "{}", {"limit"});
  expect_parse_error(test::le64(3) + "{}",
                     {"header length 3 runs past the end of the file (10 bytes)"});
}

TEST(SafetensorsHeader, NotJsonOrNotAnObject) {
  expect_parse_error(st_bytes("{\"a\":\"\xff\"}"), {"not valid UTF-8", "byte 14"});
  expect_parse_error(st_bytes("{\"a\":\"\xc0\x80\"}"), {"not valid UTF-8"});      // overlong NUL
  expect_parse_error(st_bytes("{\"a\":\"\xed\xa0\x80\"}"), {"not valid UTF-8"});  // surrogate
  expect_parse_error(st_bytes("{\"a\":"), {"header: invalid JSON"});
  expect_parse_error(st_bytes("[1,2]"), {"header must be a JSON object, got array"});
  expect_parse_error(st_bytes("{}{}"), {"invalid JSON"});
  expect_parse_error(st_bytes(std::string("{}\0\0", 4)), {"invalid JSON"});
  // A duplicate key: the strict parser refuses it rather than letting the last one win.
  expect_parse_error(st_bytes("{" + entry("a", "U8", "[1]", "[0,1]") + "," +
                                  entry("a", "U8", "[1]", "[1,2]") + "}",
                              "xx"),
                     {"duplicate key \"a\""});
}

TEST(SafetensorsHeader, EntryShapeErrors) {
  const std::string data(8, '\0');
  expect_parse_error(st_bytes("{\"w\":[1]}", data), {"tensor 'w'", "must be a JSON object"});
  expect_parse_error(st_bytes("{\"w\":{\"dtype\":\"U8\",\"shape\":[1]}}", data),
                     {"tensor 'w'", "missing key \"data_offsets\""});
  expect_parse_error(
      st_bytes("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", data),
      {"tensor 'w'", "unexpected key \"x\""});
  expect_parse_error(st_bytes("{" + entry("w", "BF15", "[1]", "[0,2]") + "}", data),
                     {"tensor 'w'", "unknown dtype \"BF15\""});
  expect_parse_error(st_bytes("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", data),
                     {"tensor 'w'", "dtype must be a string"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "4", "[0,4]") + "}", data),
                     {"tensor 'w'", "shape must be an array"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[2.0,2]", "[0,4]") + "}", data),
                     {"tensor 'w'", "non-negative integers", "found 2.0"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[-1]", "[0,0]") + "}", data),
                     {"tensor 'w'", "found -1"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[\"4\"]", "[0,4]") + "}", data),
                     {"tensor 'w'", "found \"4\""});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[9007199254740993]", "[0,4]") + "}", data),
                     {"tensor 'w'", "2^53"});
  // Each dim within 2^53, but the product overflows 64 bits.
  expect_parse_error(
      st_bytes("{" + entry("w", "U8", "[9007199254740992,9007199254740992]", "[0,4]") + "}", data),
      {"tensor 'w'", "more elements than fit in 64 bits"});
}

TEST(SafetensorsHeader, DataOffsetErrors) {
  const std::string data(8, '\0');
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[1]", "[0]") + "}", data),
                     {"tensor 'w'", "data_offsets must be two non-negative integers"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[1]", "[0,1,2]") + "}", data),
                     {"tensor 'w'", "two non-negative integers"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[1]", "[-1,0]") + "}", data),
                     {"tensor 'w'", "two non-negative integers"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[1]", "[0.0,1]") + "}", data),
                     {"tensor 'w'", "two non-negative integers"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[1]", "{\"a\":1}") + "}", data),
                     {"tensor 'w'", "two non-negative integers"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[0]", "[3,2]") + "}", data),
                     {"tensor 'w'", "[3, 2] begin after end"});
  expect_parse_error(st_bytes("{" + entry("w", "U8", "[4]", "[6,10]") + "}", data),
                     {"tensor 'w'", "end past the data section, which holds 8 bytes"});
  expect_parse_error(
      st_bytes("{" + entry("w", "U8", "[1]", "[0,18446744073709551616]") + "}", data),
      {"tensor 'w'", "two non-negative integers"});
  // The message the brief asks for: shape x dtype vs. the span.
  expect_parse_error(
      st_bytes("{" + entry("model.layers.0.mlp.up_proj.weight", "BF16", "[2,2]", "[0,6]") + "}",
               data),
      {"tensor 'model.layers.0.mlp.up_proj.weight'",
       "shape [2, 2] × bf16 is 8 bytes but data_offsets span 6"});
}

TEST(SafetensorsHeader, OverlappingTensors) {
  const std::string data(16, '\0');
  expect_parse_error(st_bytes("{" + entry("a", "U8", "[8]", "[0,8]") + "," +
                                  entry("b", "U8", "[8]", "[4,12]") + "}",
                              data),
                     {"tensor 'b' bytes [4, 12) overlap tensor 'a' bytes [0, 8)"});
  // Nested inside a larger one, and identical ranges.
  expect_parse_error(st_bytes("{" + entry("a", "U8", "[16]", "[0,16]") + "," +
                                  entry("b", "U8", "[2]", "[4,6]") + "}",
                              data),
                     {"overlap", "'a'", "'b'"});
  expect_parse_error(st_bytes("{" + entry("a", "U8", "[4]", "[0,4]") + "," +
                                  entry("b", "U8", "[4]", "[0,4]") + "}",
                              data),
                     {"overlap"});
  // Touching ranges do not overlap.
  EXPECT_NO_THROW(parse_header(st_bytes(
      "{" + entry("a", "U8", "[4]", "[0,4]") + "," + entry("b", "U8", "[4]", "[4,8]") + "}",
      data)));
}

TEST(SafetensorsHeader, MetadataErrors) {
  expect_parse_error(st_bytes("{\"__metadata__\":[\"pt\"]}"), {"__metadata__ must be an object"});
  expect_parse_error(st_bytes("{\"__metadata__\":{\"format\":1}}"),
                     {"__metadata__ value of \"format\" must be a string"});
  EXPECT_EQ(parse_header(st_bytes("{\"__metadata__\":{}}")).entries.size(), 0u);
}

// The outcome of one parse: the header's fields, or the error's message.
std::string outcome(const std::string& bytes, HeaderPath path) {
  try {
    const SafetensorsHeader h = parse_safetensors_header(
        reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "t.safetensors", path);
    std::string out = str("data at ", h.data_offset, " size ", h.data_size, ";");
    for (const TensorEntry& e : h.entries)
      out += str(" ", e.name, " ", dtype_name(e.dtype), " ", shape_str(e.shape), " [", e.begin, ",",
                 e.end, ")");
    out += "; by name";
    for (uint32_t i : h.by_name)
      out += str(" ", h.entries.at(i).name);
    out += "; metadata";
    for (const auto& [k, v] : h.metadata)
      out += str(" ", k, "=", v);
    return out;
  } catch (const Error& e) {
    return str("error: ", e.what());
  }
}

// The direct reader (HeaderPath::kAny) and the JSON tree (kTree) give the same header or the same
// error on every form: plain headers, JSON the direct reader leaves to the tree (escapes, other
// whitespace), and malformed ones.
TEST(SafetensorsHeader, DirectReaderAgreesWithTheJsonTree) {
  const std::string d16(16, '\x02');
  const std::string ab =
      entry("a", "U8", "[4]", "[0,4]") + "," + entry("b", "BF16", "[2,2]", "[4,12]");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{}", ""},
      {" { } \n\t\r ", ""},
      {"{" + ab + "}", d16},
      {"{\"__metadata__\":{\"format\":\"pt\",\"b\":\"\"}," + ab + "}    ", d16},
      {"{" + ab + ",\"__metadata__\":{}}", d16},
      {"{ \"b\" : { \"shape\" : [ 2 , 2 ] , \"data_offsets\" : [ 4 , 12 ] , \"dtype\" : \"BF16\" } "
       "}",
       d16},
      {"{\n  \"z\": {\"dtype\": \"F4\", \"shape\": [2, 6], \"data_offsets\": [0, 6]},\n"
       "  \"e\": {\"dtype\": \"F16\", \"shape\": [0, 3], \"data_offsets\": [2, 2]}\n}\n",
       d16},
      {"{" + entry("s", "F32", "[]", "[12,16]") + "," + ab + "}", d16},
      {"{" + entry("\xc3\xa9\xe2\x82\xac", "U8", "[1]", "[0,1]") + "}", d16},  // UTF-8 names
      {"{" + entry("", "U8", "[1]", "[0,1]") + "}", d16},                      // an empty name
      {"{" + entry("a\x7f", "U8", "[1]", "[0,1]") + "}", d16},                 // DEL is allowed
      // Escapes: only the tree decodes them.
      {"{" + entry("a\\u0062", "U8", "[1]", "[0,1]") + "}", d16},
      {"{" + entry("q\\\"t\\\\", "U8", "[1]", "[0,1]") + "}", d16},
      {"{\"__metadata__\":{\"k\\n\":\"v\\t\"}," + ab + "}", d16},
      {"{\"a\":{\"dtype\":\"U\\u0038\",\"shape\":[1],\"data_offsets\":[0,1]}}", d16},
      // Malformed: every one an error, the same from both paths.
      {"{" + entry("a", "U8", "[1]", "[0,1]") + "," + entry("a", "U8", "[1]", "[1,2]") + "}", d16},
      {"{" + entry("a", "U8", "[4]", "[0,4]") + "," + entry("a", "U8", "[4]", "[0,4]") + "}", d16},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", d16},
      {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", d16},
      {"{\"__metadata__\":{\"k\":1}}", d16},
      {"{\"__metadata__\":[]}", d16},
      {"{" + entry("a", "U8", "[01]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[00,1]") + "}", d16},
      {"{" + entry("a", "U8", "[1e0]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[1.0]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[-0]", "[0,0]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[0,-1]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[0,18446744073709551615]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[0,99999999999999999999]") + "}", d16},
      {"{" + entry("a", "U8", "[9007199254740993]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[9007199254740992,4]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[0,1,]") + "}", d16},
      {"{" + entry("a", "U8", "[1,]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[0,1]") + ",}", d16},
      {"{" + entry("a", "U8", "[1]", "[0,1]") + "} x", d16},
      {"{" + entry("a", "U8", "[1]", "[0,1]") + "}{}", d16},
      {std::string("{\"a\x00\":1}", 9), d16},
      {std::string("{}\0", 3), d16},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"dtype\":\"U8\"}}", d16},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", d16},
      {"{\"a\":{}}", d16},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":[]}}", d16},
      {"{\"a\":{\"dtype\":\"U9\",\"shape\":[1],\"data_offsets\":[0,1]}}", d16},
      {"{\"a\":{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}}", d16},
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", d16},
      {"{\"a\":[]}", d16},
      {"{\"a\":\"\t\"}", d16},  // a raw tab inside a string
      {"{" + entry("a", "U8", "[2]", "[0,1]") + "}", d16},
      {"{" + entry("a", "U8", "[1]", "[2,1]") + "}", d16},
      {"{" + entry("a", "U8", "[17]", "[0,17]") + "}", d16},
      {"{" + entry("a", "F4", "[3]", "[0,2]") + "}", d16},
      {"{" + entry("a", "U8", "[8]", "[0,8]") + "," + entry("b", "U8", "[8]", "[4,12]") + "}", d16},
      {"{" + entry("a", "U8", "[\"1\"]", "[0,1]") + "}", d16},
      {"{\"a\":\"\xff\"}", d16},
      {"[]", d16},
      {"{\"a\":", d16},
      {"{\"a\" 1}", d16},
      {"\"x\"", d16},
  };
  for (const auto& [header, data] : cases) {
    SCOPED_TRACE(header);
    const std::string bytes = st_bytes(header, data);
    EXPECT_EQ(outcome(bytes, HeaderPath::kAny), outcome(bytes, HeaderPath::kTree));
  }
  // A few of them by hand: what each path must give.
  EXPECT_EQ(outcome(st_bytes("{" + ab + "}", d16), HeaderPath::kAny),
            str("data at ", 8 + ab.size() + 2,
                " size 16; a u8 [4] [0,4) b bf16 [2, 2] [4,12); by name a b; metadata"));
  EXPECT_NE(
      outcome(st_bytes("{" + entry("a\\u0062", "U8", "[1]", "[0,1]") + "}", d16), HeaderPath::kAny)
          .find("; ab u8 [1] [0,1); by name ab;"),
      std::string::npos);
  EXPECT_NE(outcome(st_bytes("{" + entry("a", "U8", "[1]", "[0,1]") + "," +
                                 entry("a", "U8", "[1]", "[1,2]") + "}",
                             d16),
                    HeaderPath::kAny)
                .find("duplicate key \"a\""),
            std::string::npos);
}

TEST(SafetensorsFile, FindsEveryNameAndNoOther) {
  TempDir dir;
  std::string header = "{";
  for (int i = 0; i < 40; ++i)  // listed out of name order, 4 bytes each
    header += std::string(i ? "," : "") +
              entry(str("t.", (i * 7) % 40), "U8", "[4]", str("[", 4 * i, ",", 4 * i + 4, "]"));
  header += "}";
  test::write_bytes(dir.file("m.safetensors"), st_bytes(header, std::string(160, '\0')));
  const SafetensorsFile f = SafetensorsFile::open(dir.file("m.safetensors"));
  for (int i = 0; i < 40; ++i) {
    const TensorEntry* e = f.find(str("t.", i));
    ASSERT_NE(e, nullptr) << i;
    EXPECT_EQ(e->name, str("t.", i));
  }
  for (const char* absent : {"", "t", "t.", "t.40", "t.00", "u.1"})
    EXPECT_EQ(f.find(absent), nullptr) << absent;
}

TEST(SafetensorsFile, OpenViewsAndLifetime) {
  TempDir dir;
  // bf16 [1, 2] = {1.0, -2.0} (0x3F80, 0xC000), then f32 [] = 0.5 (0x3F000000), little-endian.
  const std::string data(
      "\x80\x3F\x00\xC0"
      "\x00\x00\x00\x3F",
      8);
  const std::string header = "{" + entry("a.weight", "BF16", "[1,2]", "[0,4]") + "," +
                             entry("a.scale", "F32", "[]", "[4,8]") + "}";
  test::write_bytes(dir.file("m.safetensors"), st_bytes(header, data));
  Tensor w;
  {
    SafetensorsFile f = SafetensorsFile::open(dir.file("m.safetensors"));
    EXPECT_EQ(f.file_size(), 8 + header.size() + 8);
    ASSERT_NE(f.find("a.weight"), nullptr);
    EXPECT_EQ(f.find("nope"), nullptr);
    w = f.tensor("a.weight");
    EXPECT_TRUE(w.read_only());
    EXPECT_EQ(w.bytes(), f.mapping()->data() + 8 + header.size());  // zero-copy
    EXPECT_EQ(f.tensor("a.scale").item_f32(), 0.5f);
    expect_error([&] { f.tensor("nope"); }, {"m.safetensors", "no tensor 'nope'"});
  }
  // The file object is gone; the view still holds the mapping.
  EXPECT_EQ(w.item_f32(0), 1.0f);
  EXPECT_EQ(w.item_f32(1), -2.0f);
}

TEST(SafetensorsFile, OpenErrorsNameThePath) {
  TempDir dir;
  expect_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); },
               {"missing.safetensors", "cannot open"});
  expect_error([&] { SafetensorsFile::open(dir.path()); }, {dir.path(), "not a regular file"});
  test::write_bytes(dir.file("empty.safetensors"), "");
  expect_error([&] { SafetensorsFile::open(dir.file("empty.safetensors")); },
               {"empty.safetensors", "too short"});
  test::write_bytes(dir.file("bad.safetensors"),
                    st_bytes("{" + entry("x", "F64", "[2]", "[0,8]") + "}", std::string(8, 0)));
  expect_error([&] { SafetensorsFile::open(dir.file("bad.safetensors")); },
               {"bad.safetensors", "tensor 'x'", "is 16 bytes but data_offsets span 8"});
}

TEST(MappedFile, MapsWholeFile) {
  TempDir dir;
  test::write_bytes(dir.file("f"), "hello");
  auto m = MappedFile::open(dir.file("f"));
  ASSERT_EQ(m->size(), 5u);
  EXPECT_EQ(std::memcmp(m->data(), "hello", 5), 0);
  m->will_need(0, 5);
  m->will_need(3, 1000);  // clamped, never faults
  m->will_need(100, 1);
  test::write_bytes(dir.file("e"), "");
  auto e = MappedFile::open(dir.file("e"));
  EXPECT_EQ(e->size(), 0u);
  EXPECT_EQ(e->data(), nullptr);
  e->will_need(0, 10);
}

}  // namespace
}  // namespace strata
