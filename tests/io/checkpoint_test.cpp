#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "io/checkpoint.h"
#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;
using test::st_bytes;
using test::TempDir;
using test::write_bytes;

// A shard holding U8 tensors of one byte each, named `names`, the byte of tensor i being i+1.
std::string u8_shard(const std::vector<std::string>& names) {
  std::string header = "{";
  std::string data;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) header += ",";
    header += "\"" + names[i] + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" +
              std::to_string(i) + "," + std::to_string(i + 1) + "]}";
    data += static_cast<char>(i + 1);
  }
  return st_bytes(header + "}", data);
}

std::string index_json(const std::map<std::string, std::string>& weight_map) {
  std::string s = "{\"metadata\":{\"total_size\":3},\"weight_map\":{";
  bool first = true;
  for (const auto& [t, f] : weight_map) {
    if (!first) s += ",";
    first = false;
    s += "\"" + t + "\":\"" + f + "\"";
  }
  return s + "}}";
}

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

// Two shards: {a, b} and {c}, with a matching index.
void write_good_checkpoint(const TempDir& dir) {
  write_bytes(dir.file(kShard1), u8_shard({"b", "a"}));
  write_bytes(dir.file(kShard2), u8_shard({"c"}));
  write_bytes(dir.file(kIndex), index_json({{"a", kShard1}, {"b", kShard1}, {"c", kShard2}}));
}

TEST(Checkpoint, ShardedWithIndex) {
  TempDir dir;
  write_good_checkpoint(dir);
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c.shards().size(), 2u);
  EXPECT_TRUE(c.has("a"));
  EXPECT_FALSE(c.has("d"));
  // "b" was written first in shard 1 (byte 1), "a" second (byte 2), "c" alone in shard 2.
  EXPECT_EQ(c.tensor("b").item_f32(), 1.0f);
  EXPECT_EQ(c.tensor("a").item_f32(), 2.0f);
  EXPECT_EQ(c.tensor("c").item_f32(), 1.0f);
  EXPECT_EQ(c.entry("a").dtype, DType::kU8);
  EXPECT_NE(c.shard_of("c").path().find(kShard2), std::string::npos);
  const uint64_t expected =
      std::filesystem::file_size(dir.file(kShard1)) + std::filesystem::file_size(dir.file(kShard2));
  EXPECT_EQ(c.bytes_on_disk(), expected);
  expect_error([&] { c.tensor("d"); }, {"no tensor 'd'"});
  expect_error([&] { c.entry("d"); }, {"no tensor 'd'"});
}

TEST(Checkpoint, SingleFile) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"), u8_shard({"x", "y"}));
  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c.tensor("y").item_f32(), 2.0f);
}

// tensor_names_with_prefix is tensor_names() filtered by the prefix, in its order: layer 1's
// names are not layer 10's, and a prefix past every name or matching none gives none.
TEST(Checkpoint, NamesWithPrefix) {
  TempDir dir;
  write_bytes(dir.file("model.safetensors"),
              u8_shard({"m.layers.10.w", "m.layers.1.b", "m.layers.1.a", "m.layers.2.a",
                        "m.layers.1", "m.norm"}));
  Checkpoint c = Checkpoint::open(dir.path());
  using V = std::vector<std::string>;
  EXPECT_EQ(c.tensor_names_with_prefix("m.layers.1."), (V{"m.layers.1.a", "m.layers.1.b"}));
  EXPECT_EQ(c.tensor_names_with_prefix("m.layers.1"),
            (V{"m.layers.1", "m.layers.1.a", "m.layers.1.b", "m.layers.10.w"}));
  EXPECT_EQ(c.tensor_names_with_prefix("m.layers.3."), V{});
  EXPECT_EQ(c.tensor_names_with_prefix("z"), V{});
  EXPECT_EQ(c.tensor_names_with_prefix(""), c.tensor_names());
}

TEST(Checkpoint, OneOtherSafetensorsFile) {
  TempDir dir;
  write_bytes(dir.file("weights.safetensors"), u8_shard({"x"}));
  write_bytes(dir.file("config.json"), "{}");
  EXPECT_EQ(Checkpoint::open(dir.path()).tensor_names(), (std::vector<std::string>{"x"}));
}

TEST(Checkpoint, DirectoryErrors) {
  TempDir dir;
  expect_error([&] { Checkpoint::open(dir.path()); },
               {dir.path(), "no model.safetensors.index.json, model.safetensors",
                "expected a Hugging Face checkpoint directory"});
  expect_error([&] { Checkpoint::open(dir.file("nope")); }, {"nope", "not a directory"});
  write_bytes(dir.file("a.safetensors"), u8_shard({"x"}));
  write_bytes(dir.file("b.safetensors"), u8_shard({"y"}));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"2 .safetensors files but no model.safetensors.index.json"});
}

TEST(Checkpoint, MissingShard) {
  TempDir dir;
  write_bytes(dir.file(kShard1), u8_shard({"a"}));
  write_bytes(dir.file(kIndex), index_json({{"a", kShard1}, {"c", kShard2}}));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {kIndex, "tensor 'c'", kShard2, "does not exist"});
}

TEST(Checkpoint, TensorListedTwiceInIndex) {
  TempDir dir;
  write_good_checkpoint(dir);
  write_bytes(dir.file(kIndex), "{\"weight_map\":{\"a\":\"" + std::string(kShard1) + "\",\"a\":\"" +
                                    kShard2 + "\"}}");
  expect_error([&] { Checkpoint::open(dir.path()); }, {kIndex, "duplicate key \"a\""});
}

TEST(Checkpoint, TensorListedButAbsentFromItsShard) {
  TempDir dir;
  write_good_checkpoint(dir);
  write_bytes(dir.file(kIndex),
              index_json({{"a", kShard1}, {"b", kShard1}, {"c", kShard2}, {"d", kShard2}}));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {kShard2, "tensor 'd'", "listed in model.safetensors.index.json but absent"});
}

TEST(Checkpoint, TensorInShardButNotInIndex) {
  TempDir dir;
  write_good_checkpoint(dir);
  write_bytes(dir.file(kIndex), index_json({{"a", kShard1}, {"c", kShard2}}));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {kShard1, "tensor 'b'", "not listed in model.safetensors.index.json"});
}

TEST(Checkpoint, TensorInTwoShards) {
  TempDir dir;
  write_bytes(dir.file(kShard1), u8_shard({"a", "b"}));
  write_bytes(dir.file(kShard2), u8_shard({"b"}));
  write_bytes(dir.file(kIndex), index_json({{"a", kShard1}, {"b", kShard2}}));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {"tensor 'b' is present in two shards", kShard1, kShard2});
}

TEST(Checkpoint, TensorInAnotherShardThanListed) {
  TempDir dir;
  write_bytes(dir.file(kShard1), u8_shard({"a", "b"}));
  write_bytes(dir.file(kShard2), u8_shard({"c"}));
  write_bytes(dir.file(kIndex), index_json({{"a", kShard1}, {"b", kShard2}, {"c", kShard2}}));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {kShard1, "tensor 'b'", "lists it in " + std::string(kShard2)});
}

TEST(Checkpoint, BadShardInsideCheckpointNamesIt) {
  TempDir dir;
  write_good_checkpoint(dir);
  write_bytes(dir.file(kShard2), st_bytes("{\"c\":{\"dtype\":\"U8\",\"shape\":[2],"
                                          "\"data_offsets\":[0,1]}}",
                                          "x"));
  expect_error([&] { Checkpoint::open(dir.path()); },
               {kShard2, "tensor 'c'", "is 2 bytes but data_offsets span 1"});
}

TEST(SafetensorsIndex, ParseAndValidate) {
  auto m = parse_safetensors_index(
      "{\"metadata\":{\"total_size\":10},\"weight_map\":{\"x\":\"s1.safetensors\","
      "\"a\":\"s2.safetensors\"}}",
      "idx.json");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("x"), "s1.safetensors");
  EXPECT_EQ(m.at("a"), "s2.safetensors");
  EXPECT_EQ(parse_safetensors_index("{\"weight_map\":{}}", "idx.json").size(), 0u);

  auto bad = [](const std::string& text, std::initializer_list<std::string> parts) {
    SCOPED_TRACE(text);
    std::vector<std::string> all = {"idx.json"};
    all.insert(all.end(), parts.begin(), parts.end());
    try {
      parse_safetensors_index(text, "idx.json");
    } catch (const Error& e) {
      for (const std::string& p : all)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "expected an error";
  };
  bad("[]", {"must be a JSON object"});
  bad("{\"metadata\":{}}", {"missing \"weight_map\""});
  bad("{\"weight_map\":[]}", {"\"weight_map\" must be an object"});
  bad("{\"metadata\":3,\"weight_map\":{}}", {"\"metadata\" must be an object"});
  bad("{\"weight_map\":{\"t\":1}}", {"tensor 't'", "must be a file name string"});
  bad("{\"weight_map\":{\"t\":\"../x.safetensors\"}}", {"tensor 't'", "path separator"});
  bad("{\"weight_map\":{\"t\":\"/etc/x.safetensors\"}}", {"tensor 't'", "path separator"});
  bad("{\"weight_map\":{\"t\":\"..\"}}", {"tensor 't'", "\"..\""});
  bad("{\"weight_map\":{\"t\":\"a..safetensors\"}}", {"\"..\""});
  bad("{\"weight_map\":{\"t\":\"\"}}", {"tensor 't'", "is empty"});
  bad("{\"weight_map\":{\"t\":\"pytorch_model-00001-of-00002.bin\"}}",
      {"does not end in .safetensors"});
  bad("{\"weight_map\":{\"t\":\"a.safetensors\",\"t\":\"b.safetensors\"}}",
      {"duplicate key \"t\""});
  bad("{\"weight_map\":{", {"invalid JSON"});
  // nlohmann alone would stop at the NUL and accept the text before it.
  bad(std::string("{\"weight_map\":{}}\0{\"x\":", 22), {"invalid JSON: NUL byte at offset 17"});
}

// The index reader takes the plain form writers produce directly and leaves the rest of JSON to
// the strict parser: every spelling below reads as the same map, by hand, and malformed indexes
// that look plain to the direct reader up to their problem get the strict parser's error.
TEST(SafetensorsIndex, EverySpellingReadsTheSameMap) {
  const std::map<std::string, std::string> want = {{"a.w", "s1.safetensors"},
                                                   {"b.w", "s2.safetensors"}};
  for (const std::string& text : {
           std::string(
               "{\"metadata\":{\"total_size\":10},\"weight_map\":{\"a.w\":\"s1.safetensors\","
               "\"b.w\":\"s2.safetensors\"}}"),
           std::string("{\n  \"metadata\": {\n    \"total_size\": 10,\n    \"format\": \"pt\",\n"
                       "    \"x\": null\n  },\n  \"weight_map\": {\n    \"b.w\": "
                       "\"s2.safetensors\",\n    \"a.w\": \"s1.safetensors\"\n  }\n}\n"),
           std::string("{\"weight_map\":{\"a.w\":\"s1.safetensors\",\"b.w\":\"s2.safetensors\"},"
                       "\"metadata\":null}"),
           // Outside the direct reader's form: escapes, floats, nesting, other keys.
           std::string("{\"weight_map\":{\"a\\u002ew\":\"s1.safetensors\",\"b.w\":"
                       "\"s\\u0032.safetensors\"}}"),
           std::string("{\"metadata\":{\"total_size\":1.5e3,\"n\":{\"k\":[1]}},\"weight_map\":{"
                       "\"a.w\":\"s1.safetensors\",\"b.w\":\"s2.safetensors\"}}"),
           std::string("{\"other\":true,\"weight_map\":{\"a.w\":\"s1.safetensors\",\"b.w\":"
                       "\"s2.safetensors\"}}"),
       }) {
    SCOPED_TRACE(text);
    EXPECT_EQ(parse_safetensors_index(text, "idx.json"), want);
  }
  auto error_of = [](const std::string& text) {
    try {
      parse_safetensors_index(text, "idx.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // Each a problem the direct reader meets mid-way: the message is the strict parser's.
  EXPECT_NE(error_of("{\"weight_map\":{\"t\":\"a.safetensors\",\"t\":\"a.safetensors\"}}")
                .find("duplicate key \"t\""),
            std::string::npos);
  EXPECT_NE(error_of("{\"metadata\":{\"k\":1,\"k\":2},\"weight_map\":{}}").find("duplicate key"),
            std::string::npos);
  EXPECT_NE(error_of("{\"weight_map\":{},\"weight_map\":{}}").find("duplicate key"),
            std::string::npos);
  EXPECT_NE(error_of("{\"metadata\":{},\"metadata\":{},\"weight_map\":{}}").find("duplicate key"),
            std::string::npos);
  // A bad shard name first, invalid JSON after it: the JSON error wins, as the tree reads all.
  EXPECT_NE(error_of("{\"weight_map\":{\"t\":\"../x.safetensors\",}}").find("invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{\"weight_map\":{\"t\":\"../x.safetensors\"}}").find("path separator"),
            std::string::npos);
  EXPECT_NE(error_of("{\"weight_map\":{\"t\":\"a.safetensors\"}} x").find("invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{\"weight_map\":{\"t\":\"a.safetensors\"}}{}").find("invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{\"metadata\":nul,\"weight_map\":{}}").find("invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{\"metadata\":nullx,\"weight_map\":{}}").find("invalid JSON"),
            std::string::npos);
  EXPECT_NE(error_of("{\"metadata\":{\"n\":01},\"weight_map\":{}}").find("invalid JSON"),
            std::string::npos);
  // A negative metadata value is outside the direct reader's form; the tree accepts it.
  EXPECT_EQ(error_of("{\"metadata\":{\"n\":-1},\"weight_map\":{}}"), "no error");
  EXPECT_NE(error_of("{\"metadata\":{}}").find("missing \"weight_map\""), std::string::npos);
  EXPECT_NE(error_of("{}").find("missing \"weight_map\""), std::string::npos);
}

}  // namespace
}  // namespace strata
