// GPU ranks' split of a layer's reads (engine/gpu_ranks.h), on the host: every tensor of the blob
// is read by exactly one rank, lands where LayerReader puts it, with the file's bytes; a rank
// writes nothing outside its own runs; the ranks' Checkpoint::bytes_read add up to the blob's
// tensors. The device choice of a rank from its local rank.
#include "engine/gpu_ranks.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cli/launcher.h"
#include "tests/engine/fake_comm.h"

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe";

std::vector<std::string> layer_names(const Checkpoint& ckpt, int layer) {
  std::vector<std::string> out;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  for (const std::string& n : ckpt.tensor_names())
    if (n.starts_with(p)) out.push_back(n);
  return out;
}

TEST(GpuRanks, SharesCoverTheBlobOnceWithTheFilesBytes) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  LayerReader reader(ckpt);
  const std::vector<std::string> names = layer_names(ckpt, 0);
  ASSERT_GT(names.size(), 10u);
  const LayerBlob blob = reader.plan(names);
  std::vector<uint8_t> full(blob.bytes + 4096);
  reader.read(blob, full.data());
  uint64_t item_bytes = 0;
  for (const auto& [n, it] : blob.items)
    item_bytes += it.bytes;
  for (int ranks : {1, 2, 3}) {
    // Readers by name order, i mod ranks: many short runs, items of one rank far apart.
    std::map<std::string, int> who;
    int i = 0;
    for (const auto& [n, it] : blob.items)
      who[n] = (i++ / 3) % ranks;
    const BlobShare share = plan_share(ckpt, blob, [&](const std::string& n) { return who.at(n); });
    std::map<std::string, int> covered;
    uint64_t prev_end = 0;
    for (const BlobShare::Run& run : share.runs) {
      EXPECT_GE(run.buffer_offset, prev_end) << "runs overlap or are out of order";
      prev_end = run.buffer_offset + run.length;
      for (const std::string& n : run.items) {
        EXPECT_EQ(who.at(n), run.reader) << n;
        ++covered[n];
        const LayerBlob::Item& it = blob.items.at(n);
        EXPECT_GE(it.offset, run.buffer_offset);
        EXPECT_LE(it.offset + it.bytes, run.buffer_offset + run.length);
      }
    }
    EXPECT_EQ(covered.size(), blob.items.size());
    for (const auto& [n, c] : covered)
      EXPECT_EQ(c, 1) << n;
    uint64_t read_sum = 0;
    for (int r = 0; r < ranks; ++r) {
      const Checkpoint own = Checkpoint::open(kModel);  // this rank's accounting
      std::vector<uint8_t> buf(blob.bytes + 4096, 0xA5);
      read_share(own, share, r, buf.data(), 3);
      read_sum += own.bytes_read();
      // Inside this rank's runs: the file's bytes, where LayerReader puts them; elsewhere nothing
      // written.
      std::vector<bool> in_run(buf.size(), false);
      for (const BlobShare::Run& run : share.runs) {
        if (run.reader != r) continue;
        for (uint64_t b = run.buffer_offset; b < run.buffer_offset + run.length; ++b)
          in_run[b] = true;
        EXPECT_EQ(0, std::memcmp(buf.data() + run.buffer_offset, full.data() + run.buffer_offset,
                                 run.length));
      }
      for (size_t b = 0; b < buf.size(); ++b) {
        if (in_run[b]) continue;
        ASSERT_EQ(buf[b], 0xA5) << "rank " << r << " of " << ranks << " wrote byte " << b;
      }
    }
    EXPECT_EQ(read_sum, item_bytes) << ranks << " ranks";
  }
}

// Under mpirun (ctest engine.gpu_ranks_mpi): each rank reads its share of a layer, then the
// shares are exchanged on a thread over the reader's channel while the main thread runs
// collectives on the world, as the GPU loop does; every rank must end with LayerReader's bytes of
// every tensor, and the ranks' reads must add up to the tensors once. Skipped as one process.
TEST(GpuRanksMpi, ExchangeGivesEveryRankTheLayer) {
  Comm& comm = world(cli::launcher_from_environment());
  if (comm.size() < 2) GTEST_SKIP() << "run under mpirun";
  const Checkpoint ckpt = Checkpoint::open(kModel);
  LayerReader reader(ckpt);
  const LayerBlob blob = reader.plan(layer_names(ckpt, 0));
  std::vector<uint8_t> full(blob.bytes);
  reader.read(blob, full.data());
  std::map<std::string, int> who;
  int i = 0;
  for (const auto& [n, it] : blob.items)
    who[n] = (i++ / 2) % comm.size();
  const BlobShare share = plan_share(ckpt, blob, [&](const std::string& n) { return who.at(n); });
  std::unique_ptr<ThreadChannel> channel = make_thread_channel(comm);
  EXPECT_TRUE(channel) << "MPI without MPI_THREAD_MULTIPLE: the exchange runs on the main thread";
  for (int round = 0; round < 3; ++round) {
    const Checkpoint own = Checkpoint::open(kModel);
    std::vector<uint8_t> buf(blob.bytes, 0xA5);
    read_share(own, share, comm.rank(), buf.data());
    if (channel) {
      std::thread t([&]() { exchange_share(*channel, share, buf.data()); });
      for (int k = 0; k < 20; ++k) {
        uint64_t one = 1;
        comm.allreduce_sum(&one, 1);
        EXPECT_EQ(one, static_cast<uint64_t>(comm.size()));
      }
      t.join();
    } else {
      exchange_share(comm, share, buf.data());
    }
    for (const auto& [n, it] : blob.items)
      EXPECT_EQ(0, std::memcmp(buf.data() + it.offset, full.data() + it.offset, it.bytes)) << n;
    uint64_t read = own.bytes_read(), items = 0;
    comm.allreduce_sum(&read, 1);
    for (const auto& [n, it] : blob.items)
      items += it.bytes;
    EXPECT_EQ(read, items);
  }
  channel.reset();  // its communicator goes before MPI does
  comm.barrier();
  comm_finalize();  // this test runs alone in its processes (mpirun ... --gtest_filter)
}

TEST(GpuRanks, DeviceIsLocalRankModDevices) {
  // 5 ranks on a host with 2 GPUs: ranks 0, 2, 4 on GPU 0, ranks 1, 3 on GPU 1.
  const int expect_device[5] = {0, 1, 0, 1, 0};
  const int expect_sharers[5] = {3, 2, 3, 2, 3};
  for (int r = 0; r < 5; ++r) {
    const FakeRank c(r, 5, /*one_host=*/true);
    EXPECT_EQ(gpu_rank_device(c, 2), expect_device[r]);
    EXPECT_EQ(gpu_rank_sharers(c, 2), expect_sharers[r]);
  }
  EXPECT_EQ(gpu_rank_device(FakeRank(1, 2, true), 1), 0);  // two ranks on one GPU
  EXPECT_EQ(gpu_rank_sharers(FakeRank(1, 2, true), 1), 2);
  EXPECT_EQ(gpu_rank_sharers(FakeRank(1, 2, true), 8), 1);  // more GPUs than ranks
}

}  // namespace
}  // namespace strata
