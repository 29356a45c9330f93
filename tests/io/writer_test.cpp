#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <memory>

#include "io/checkpoint.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;
using test::read_bytes;
using test::TempDir;

Tensor u8_tensor(Shape shape, uint8_t first) {
  Tensor t = Tensor::zeros(DType::kU8, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i)
    t.mutable_data<uint8_t>()[i] = static_cast<uint8_t>(first + i);
  return t;
}

TEST(WriteSafetensors, ExactBytes) {
  TempDir dir;
  NamedTensors tensors;
  tensors.emplace_back("b", u8_tensor({3}, 1));
  tensors.emplace_back("a", Tensor::scalar_f32(1.0f));
  write_safetensors(dir.file("x.safetensors"), tensors, {{"format", "pt"}});

  // Hand-written expectation: data contiguous (the reference safetensors library rejects gaps),
  // widest elements first, so "a" (f32) precedes "b" (u8); header keys in data order after
  // __metadata__.
  std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7]}}";
  ASSERT_EQ(header.size(), 136u);  // already a multiple of 8: no padding
  const std::string data("\x00\x00\x80\x3F\x01\x02\x03", 7);
  const std::string expected = std::string("\x88\0\0\0\0\0\0\0", 8) + header + data;
  EXPECT_EQ(read_bytes(dir.file("x.safetensors")), expected);
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"x.safetensors"}));  // no temp left
}

// The header is written directly, not through a JSON tree: it must equal nlohmann's compact
// dump of the same object (the reference here), also for names that need escapes (quotes,
// backslashes, control characters: \n and \u0001), multi-byte UTF-8, DEL, and metadata.
TEST(WriteSafetensors, HeaderEqualsJsonDump) {
  const std::vector<std::string> names = {"model.layers.0.mlp.experts.17.gate_proj.weight",
                                          "q\"uote",
                                          "back\\slash",
                                          "new\nline\ttab",
                                          std::string("ctl\x01\x1f", 5),
                                          "caf\xc3\xa9 \xe2\x82\xac",
                                          "del\x7f"};
  for (bool with_metadata : {false, true}) {
    std::vector<TensorSpec> specs;
    for (size_t i = 0; i < names.size(); ++i)
      specs.push_back({names[i], i % 2 ? DType::kBF16 : DType::kU8, {static_cast<int64_t>(i), 3}});
    specs.push_back({"scalar", DType::kF32, {}});
    std::map<std::string, std::string> metadata;
    if (with_metadata) metadata = {{"format", "pt"}, {"k\"ey", "v\\al\n"}};
    const SafetensorsLayout layout = safetensors_layout(specs, metadata, "h.safetensors");

    Json want = Json::object();
    if (with_metadata) {
      Json m = Json::object();
      for (const auto& [k, v] : metadata)
        m[k] = v;
      want["__metadata__"] = m;
    }
    // Data order: widest elements first (F32, then BF16, then U8), given order within a width.
    std::vector<size_t> order;
    for (int bits : {32, 16, 8}) {
      for (size_t i = 0; i < specs.size(); ++i) {
        if (dtype_bits(specs[i].dtype) == bits) order.push_back(i);
      }
    }
    uint64_t offset = 0;
    for (size_t i : order) {
      Json shape = Json::array();
      for (int64_t d : specs[i].shape)
        shape.push_back(d);
      want[specs[i].name] =
          Json::object({{"dtype", std::string(dtype_safetensors_name(specs[i].dtype))},
                        {"shape", shape},
                        {"data_offsets", Json::array({offset, offset + specs[i].nbytes()})}});
      offset += specs[i].nbytes();
    }
    std::string text = want.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    ASSERT_GE(layout.head.size(), 8u);
    EXPECT_EQ(layout.head.substr(8), text) << with_metadata;
    uint64_t n = 0;
    for (int b = 0; b < 8; ++b)
      n |= uint64_t{static_cast<uint8_t>(layout.head[static_cast<size_t>(b)])} << (8 * b);
    EXPECT_EQ(n, text.size());
    EXPECT_EQ(layout.file_size, layout.head.size() + offset);
  }
  expect_error(
      [] {
        (void)safetensors_layout(std::vector<TensorSpec>{{"\xff", DType::kU8, {1}}}, {},
                                 "b.safetensors");
      },
      {"b.safetensors", "not valid UTF-8"});
  expect_error(
      [] {
        (void)safetensors_layout(std::vector<TensorSpec>{{"a", DType::kU8, {1}}}, {{"\xc3", "v"}},
                                 "m.safetensors");
      },
      {"m.safetensors", "not valid UTF-8"});
}

TEST(WriteSafetensors, RoundTripAllDtypes) {
  TempDir dir;
  NamedTensors tensors;
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32, DType::kF8E4M3,
                          DType::kE2M1, DType::kI32, DType::kU8};
  for (DType d : dtypes) {
    Tensor t = Tensor::zeros(d, {2, 4});
    for (size_t i = 0; i < t.nbytes(); ++i)
      t.mutable_bytes()[i] = static_cast<uint8_t>(i * 7 + 3);
    tensors.emplace_back("t." + std::string(dtype_name(d)), t);
  }
  tensors.emplace_back("empty", Tensor::zeros(DType::kF32, {0, 5}));
  write_safetensors(dir.file("r.safetensors"), tensors);
  SafetensorsFile f = SafetensorsFile::open(dir.file("r.safetensors"));
  EXPECT_TRUE(f.metadata().empty());
  ASSERT_EQ(f.entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    const TensorEntry* e = f.find(name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->dtype, t.dtype());
    EXPECT_EQ(e->shape, t.shape());
    EXPECT_EQ(e->begin % 8, 0u);
    Tensor back = f.tensor(*e);
    ASSERT_EQ(back.nbytes(), t.nbytes());
    EXPECT_EQ(std::memcmp(back.bytes(), t.bytes(), t.nbytes()), 0);
  }
  EXPECT_EQ(f.header().data_offset % 8, 0u);
}

TEST(WriteSafetensors, Deterministic) {
  TempDir dir;
  NamedTensors tensors;
  tensors.emplace_back("z", u8_tensor({5}, 9));
  tensors.emplace_back("y", Tensor::scalar_f32(-3.5f));
  write_safetensors(dir.file("1.safetensors"), tensors, {{"k", "v"}, {"format", "pt"}});
  write_safetensors(dir.file("2.safetensors"), tensors, {{"format", "pt"}, {"k", "v"}});
  EXPECT_EQ(read_bytes(dir.file("1.safetensors")), read_bytes(dir.file("2.safetensors")));
}

TEST(WriteSafetensors, BadInput) {
  TempDir dir;
  NamedTensors twice;
  twice.emplace_back("a", u8_tensor({1}, 0));
  twice.emplace_back("a", u8_tensor({1}, 0));
  expect_error([&] { write_safetensors(dir.file("d.safetensors"), twice); },
               {"d.safetensors", "tensor 'a' given twice"});
  NamedTensors undefined;
  undefined.emplace_back("u", Tensor());
  expect_error([&] { write_safetensors(dir.file("d.safetensors"), undefined); },
               {"tensor 'u' is undefined"});
  NamedTensors bad_utf8;
  bad_utf8.emplace_back("\xff", u8_tensor({1}, 0));
  expect_error([&] { write_safetensors(dir.file("d.safetensors"), bad_utf8); },
               {"d.safetensors", "not valid UTF-8"});
  EXPECT_TRUE(dir.list().empty());
}

TEST(WriteSafetensors, UnwritableDestinations) {
  TempDir dir;
  NamedTensors tensors;
  tensors.emplace_back("a", u8_tensor({4}, 0));
  expect_error([&] { write_safetensors(dir.file("missing/x.safetensors"), tensors); },
               {"missing/x.safetensors", "cannot create", "No such file or directory"});
  test::write_bytes(dir.file("plain"), "");
  expect_error([&] { write_safetensors(dir.file("plain/x.safetensors"), tensors); },
               {"plain/x.safetensors", "Not a directory"});
  // A read-only filesystem refuses even root.
  expect_error([&] { write_safetensors("/proc/strata-io-test.safetensors", tensors); },
               {"/proc/strata-io-test.safetensors", "cannot create"});
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"plain"}));

  // A read-only directory (root ignores permissions, so only as another user).
  if (::geteuid() != 0) {
    std::filesystem::create_directory(dir.file("ro"));
    std::filesystem::permissions(
        dir.file("ro"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    expect_error([&] { write_safetensors(dir.file("ro/x.safetensors"), tensors); },
                 {"ro/x.safetensors", "Permission denied"});
    expect_error([&] { write_file_atomic(dir.file("ro/x.json"), "{}"); }, {"ro/x.json"});
  }
}

// A write that fails halfway (the file-size limit stands in for a full disk: both make write(2)
// fail after some bytes went out) is an error naming the file, and no temporary is left.
TEST(WriteSafetensors, WriteErrorRemovesTemp) {
  TempDir dir;
  NamedTensors tensors;
  tensors.emplace_back("big", Tensor::zeros(DType::kU8, {1 << 16}));
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_safetensors(dir.file("big.safetensors"), tensors);
  } catch (const Error& e) {
    message = e.what();
  }
  try {
    write_file_atomic(dir.file("big.json"), std::string(10000, 'x'));
  } catch (const Error& e) {
    message += e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("big.safetensors: write failed: File too large"), std::string::npos)
      << message;
  EXPECT_NE(message.find("big.json: write failed"), std::string::npos) << message;
  EXPECT_TRUE(dir.list().empty());
}

TEST(WriteFileAtomic, WritesAndReplaces) {
  TempDir dir;
  write_file_atomic(dir.file("f.json"), "first");
  EXPECT_EQ(read_bytes(dir.file("f.json")), "first");
  write_file_atomic(dir.file("f.json"), "second, longer");
  EXPECT_EQ(read_bytes(dir.file("f.json")), "second, longer");
  write_file_atomic(dir.file("empty"), "");
  EXPECT_EQ(read_bytes(dir.file("empty")), "");
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"empty", "f.json"}));
}

// Tensors of 40, 40, 40, 100 and 8 bytes. With a 100-byte limit the shards are
// [40 40] (+40 would be 120), [40] (+100 would be 140), [100] (+8 would be 108), [8].
std::vector<std::pair<std::string, Tensor>> five() {
  return {{"m.w1", u8_tensor({40}, 1)},
          {"m.w0", u8_tensor({4, 10}, 2)},
          {"m.b", u8_tensor({40}, 3)},
          {"a.big", u8_tensor({10, 10}, 4)},
          {"z.small", u8_tensor({8}, 5)}};
}

std::vector<TensorSpec> specs_of(const std::vector<std::pair<std::string, Tensor>>& ts) {
  std::vector<TensorSpec> out;
  for (const auto& [n, t] : ts)
    out.push_back({n, t.dtype(), t.shape()});
  return out;
}

// The index of five() at a 100-byte limit, as transformers writes it (indent 2, keys sorted).
const char* const kFiveIndex =
    "{\n"
    "  \"metadata\": {\n"
    "    \"total_size\": 228\n"
    "  },\n"
    "  \"weight_map\": {\n"
    "    \"a.big\": \"model-00003-of-00004.safetensors\",\n"
    "    \"m.b\": \"model-00002-of-00004.safetensors\",\n"
    "    \"m.w0\": \"model-00001-of-00004.safetensors\",\n"
    "    \"m.w1\": \"model-00001-of-00004.safetensors\",\n"
    "    \"z.small\": \"model-00004-of-00004.safetensors\"\n"
    "  }\n"
    "}\n";

// The expected output for five() at a 100-byte limit, made without PlannedShardWriter: each
// shard is the file write_safetensors writes for its tensors (grouped as worked out above, with
// the default metadata), and the index is the text above.
void write_reference(const std::string& out) {
  const auto ts = five();
  const std::vector<std::vector<size_t>> groups = {{0, 1}, {2}, {3}, {4}};
  for (size_t k = 0; k < groups.size(); ++k) {
    NamedTensors shard;
    for (size_t i : groups[k])
      shard.push_back(ts[i]);
    write_safetensors(out + "/model-0000" + std::to_string(k + 1) + "-of-00004.safetensors", shard,
                      {{"format", "pt"}});
  }
  write_file_atomic(out + "/model.safetensors.index.json", kFiveIndex);
}

// finish() with the index staged before and published after, as the exporter does; returns the
// shard names.
std::vector<std::string> finish_with_index(PlannedShardWriter& w, const std::string& out) {
  StagedFiles staged(out);
  const auto [index, text] = w.index_file();
  if (!index.empty()) staged.stage(index, text);
  std::vector<std::string> shards = w.finish();
  staged.publish();
  return shards;
}

// Writes five() in plan order in one go; returns the shard names.
std::vector<std::string> write_planned(const std::string& out, const ShardOptions& opt) {
  PlannedShardWriter w(out, specs_of(five()), opt);
  for (const auto& [n, t] : five())
    w.add(n, t);
  return finish_with_index(w, out);
}

TEST(PlannedShardWriter, ShardsIndexAndReadBack) {
  TempDir dir;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  const auto shards = write_planned(dir.path(), opt);
  const std::vector<std::string> expected_shards = {
      "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
      "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"};
  EXPECT_EQ(shards, expected_shards);
  std::vector<std::string> files = expected_shards;
  files.insert(files.begin() + 4, "model.safetensors.index.json");
  EXPECT_EQ(dir.list(), files);  // nothing else: no partial files
  EXPECT_EQ(read_bytes(dir.file("model.safetensors.index.json")), kFiveIndex);

  Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names(),
            (std::vector<std::string>{"a.big", "m.b", "m.w0", "m.w1", "z.small"}));
  EXPECT_EQ(c.shards().size(), 4u);
  EXPECT_EQ(c.tensor("m.w0").shape(), (Shape{4, 10}));
  EXPECT_EQ(c.tensor("m.w0").item_f32(39), 41.0f);  // first 2, last 2 + 39
  EXPECT_EQ(c.tensor("a.big").item_f32(99), 103.0f);
  EXPECT_EQ(c.shard_of("m.b").metadata().at("format"), "pt");
}

TEST(PlannedShardWriter, SameBytesAsWriteSafetensors) {
  TempDir ref, dir;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  write_reference(ref.path());
  PlannedShardWriter w(dir.path(), specs_of(five()), opt);
  EXPECT_EQ(w.shard_count(), 4u);
  for (const auto& [n, t] : five())
    w.add(n, t);
  finish_with_index(w, dir.path());
  ASSERT_EQ(dir.list(), ref.list());
  for (const std::string& f : ref.list())
    EXPECT_EQ(read_bytes(dir.file(f)), read_bytes(ref.file(f))) << f;
}

TEST(PlannedShardWriter, DeterministicAndPrefix) {
  TempDir a;
  TempDir b;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  opt.prefix = "part";
  const auto sa = write_planned(a.path(), opt);
  const auto sb = write_planned(b.path(), opt);
  ASSERT_EQ(sa, sb);
  EXPECT_EQ(sa.front(), "part-00001-of-00004.safetensors");
  ASSERT_EQ(a.list(), b.list());
  for (const std::string& f : a.list())
    EXPECT_EQ(read_bytes(a.file(f)), read_bytes(b.file(f))) << f;
  EXPECT_TRUE(std::filesystem::exists(a.file("part.safetensors.index.json")));
}

// transformers' save_pretrained (ModelOpt's export) names a checkpoint that fits one shard
// model.safetensors and writes no index.
TEST(PlannedShardWriter, OneShardWhenEverythingFits) {
  TempDir dir;
  const auto shards = write_planned(dir.path(), {});
  EXPECT_EQ(shards, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"model.safetensors"}));
  TempDir ref;
  write_safetensors(ref.file("model.safetensors"), five(), {{"format", "pt"}});
  EXPECT_EQ(read_bytes(dir.file("model.safetensors")), read_bytes(ref.file("model.safetensors")));
  EXPECT_EQ(Checkpoint::open(dir.path()).tensor_names().size(), 5u);
}

// Ranks sharing the shards (engine/comm.h): each writes every third tensor and skips the rest;
// the last writer runs first, so shards are created by whichever writer touches them first.
TEST(PlannedShardWriter, SharedWritersGiveTheSameBytes) {
  TempDir ref, dir;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  write_reference(ref.path());
  const auto ts = five();
  std::vector<std::unique_ptr<PlannedShardWriter>> ws;
  for (int r = 0; r < 3; ++r) {
    ws.push_back(std::make_unique<PlannedShardWriter>(dir.path(), specs_of(ts), opt));
    ws.back()->set_shared(r == 0);
  }
  for (int r = 2; r >= 0; --r) {
    for (size_t i = 0; i < ts.size(); ++i) {
      if (static_cast<int>(i % 3) == r) {
        ws[static_cast<size_t>(r)]->add(ts[i].first, ts[i].second);
      } else {
        ws[static_cast<size_t>(r)]->skip(ts[i].first);
      }
    }
    ws[static_cast<size_t>(r)]->sync();
  }
  ws[1]->publish();  // not the publisher: renames nothing
  for (const std::string& f : dir.list())
    EXPECT_TRUE(f.ends_with(".partial")) << f;
  finish_with_index(*ws[0], dir.path());
  ASSERT_EQ(dir.list(), ref.list());
  for (const std::string& f : ref.list())
    EXPECT_EQ(read_bytes(dir.file(f)), read_bytes(ref.file(f))) << f;
}

TEST(PlannedShardWriter, ResumeAfterEveryTensorGivesTheSameBytes) {
  TempDir ref;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  write_reference(ref.path());
  const auto ts = five();
  for (size_t stop = 0; stop <= ts.size(); ++stop) {
    TempDir dir;
    {
      PlannedShardWriter w(dir.path(), specs_of(ts), opt);
      for (size_t i = 0; i < stop; ++i)
        w.add(ts[i].first, ts[i].second);
      w.sync();  // not published: the next writer's resume renames complete shards
      if (stop < ts.size()) w.add(ts[stop].first, u8_tensor(ts[stop].second.shape(), 99));
    }  // "killed": the last tensor was written with wrong bytes and never synced
    PlannedShardWriter w(dir.path(), specs_of(ts), opt);
    w.resume(stop);
    for (size_t i = stop; i < ts.size(); ++i)
      w.add(ts[i].first, ts[i].second);
    finish_with_index(w, dir.path());
    std::vector<std::string> files = dir.list();
    ASSERT_EQ(files, ref.list()) << "stop " << stop;
    for (const std::string& f : files)
      EXPECT_EQ(read_bytes(dir.file(f)), read_bytes(ref.file(f))) << f << " stop " << stop;
  }
}

// `dir` holds the files of `ref`, byte for byte.
void expect_same_files(const TempDir& dir, const TempDir& ref) {
  std::vector<std::string> files = dir.list();
  ASSERT_EQ(files, ref.list());
  for (const std::string& f : files)
    EXPECT_EQ(read_bytes(dir.file(f)), read_bytes(ref.file(f))) << f;
}

// start_writeback between tensors (the GPU loop's non-durable steps) changes no byte and makes
// nothing durable: only sync() lets publish() rename a shard, and the finished files are the
// reference's.
TEST(PlannedShardWriter, StartWritebackIsNotASync) {
  TempDir ref, dir;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  write_reference(ref.path());
  const auto ts = five();
  PlannedShardWriter w(dir.path(), specs_of(ts), opt);
  w.add(ts[0].first, ts[0].second);
  w.add(ts[1].first, ts[1].second);  // shard 1 complete
  w.start_writeback();
  w.publish();
  EXPECT_EQ(w.vouched_files(), std::vector<std::string>{});  // nothing synced yet
  EXPECT_FALSE(std::filesystem::exists(dir.file("model-00001-of-00004.safetensors")));
  w.sync();
  w.publish();
  EXPECT_TRUE(std::filesystem::exists(dir.file("model-00001-of-00004.safetensors")));
  for (size_t i = 2; i < ts.size(); ++i) {
    w.add(ts[i].first, ts[i].second);
    w.start_writeback();
  }
  finish_with_index(w, dir.path());
  expect_same_files(dir, ref);
}

// A writer destroyed with a writeback request in flight (a run failing mid-layer) waits for its
// flusher before it closes the shards, and leaves them for a resume: a second writer resumes
// after the first two tensors and finishes to the reference's bytes.
TEST(PlannedShardWriter, DestroyedWithWritebackInFlight) {
  TempDir ref, dir;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  write_reference(ref.path());
  const auto ts = five();
  {
    PlannedShardWriter w(dir.path(), specs_of(ts), opt);
    w.add(ts[0].first, ts[0].second);
    w.add(ts[1].first, ts[1].second);
    w.sync();
    w.add(ts[2].first, ts[2].second);
    for (int i = 0; i < 8; ++i)
      w.start_writeback();
  }
  PlannedShardWriter w(dir.path(), specs_of(ts), opt);
  w.resume(2);
  for (size_t i = 2; i < ts.size(); ++i)
    w.add(ts[i].first, ts[i].second);
  finish_with_index(w, dir.path());
  expect_same_files(dir, ref);
}

// Staged files stay under hidden temporary names until publish() renames them all; staging a name
// again (a resumed run after a killed one) replaces what the earlier staging left; a file that
// cannot be created names its final path.
TEST(StagedFiles, HiddenUntilPublishedAndRestageable) {
  TempDir dir;
  {
    StagedFiles killed(dir.path());
    killed.stage("config.json", "stale");
  }  // never published
  StagedFiles staged(dir.path());
  staged.stage("config.json", "{\"a\": 1}\n");
  staged.stage("b.index.json", "{}\n");
  EXPECT_EQ(dir.list(), (std::vector<std::string>{".b.index.json.staged", ".config.json.staged"}));
  EXPECT_EQ(staged.publish(), (std::vector<std::string>{"config.json", "b.index.json"}));
  EXPECT_EQ(dir.list(), (std::vector<std::string>{"b.index.json", "config.json"}));
  EXPECT_EQ(read_bytes(dir.file("config.json")), "{\"a\": 1}\n");
  EXPECT_EQ(read_bytes(dir.file("b.index.json")), "{}\n");
  EXPECT_EQ(staged.publish(), std::vector<std::string>{});  // nothing left to publish
  StagedFiles nowhere(dir.file("missing"));
  expect_error([&] { nowhere.stage("config.json", "x"); },
               {"missing/config.json", "cannot create", "No such file or directory"});
}

TEST(PlannedShardWriter, Errors) {
  TempDir dir;
  ShardOptions opt;
  opt.max_shard_bytes = 100;
  PlannedShardWriter w(dir.path(), specs_of(five()), opt);
  expect_error([&] { w.resume(3); }, {"model-00001-of-00004.safetensors.partial", "--overwrite"});
  EXPECT_THROW(w.add("m.w0", u8_tensor({4, 10}, 2)), InternalError);  // out of plan order
  expect_error([&] { PlannedShardWriter(dir.file("missing"), specs_of(five())); },
               {"missing", "does not exist"});
  expect_error([&] { PlannedShardWriter(dir.path(), {}); }, {"no tensors"});
  const std::vector<TensorSpec> twice = {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}};
  expect_error([&] { PlannedShardWriter(dir.path(), twice); }, {"tensor 'a' given twice"});
}

}  // namespace
}  // namespace strata
