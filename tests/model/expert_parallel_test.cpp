// Expert parallelism in the forward (model/forward.h ExpertExchange): N ranks simulated by N
// threads that exchange rows through shared memory. Every rank runs its micro-batches (b mod N)
// through all layers of a MoE fixture with only its range of routed experts loaded; the hidden
// states must equal the single-process forward bit for bit, and the observed statistics merged
// over the ranks (amax: max, rows: sum) must equal one process's exactly.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"

namespace strata {
namespace {

const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/";

// amax and row count per name, as the calibrator keeps them.
class StatObserver : public Observer {
 public:
  void observe(std::string_view name, const float* x, int64_t rows, int64_t cols) override {
    float m = 0.0f;
    for (int64_t i = 0; i < rows * cols; ++i)
      m = std::max(m, std::fabs(x[i]));
    Stat& s = stats[std::string(name)];
    s.amax = std::max(s.amax, m);
    s.rows += rows;
  }
  struct Stat {
    float amax = 0.0f;
    int64_t rows = 0;
    bool operator==(const Stat&) const = default;
  };
  std::map<std::string, Stat> stats;
};

// The ranks' shared mailbox: every rank posts its rows, all meet, each takes the rows sent to
// it, all meet again before the next exchange may overwrite the posts.
struct Mailbox {
  explicit Mailbox(int ranks) : sync(ranks), posts(static_cast<size_t>(ranks)) {}
  struct Post {
    const std::vector<uint8_t>* rows = nullptr;
    const std::vector<int64_t>* counts = nullptr;
  };
  std::barrier<> sync;
  std::vector<Post> posts;
};

class ThreadExchange final : public ExpertExchange {
 public:
  ThreadExchange(Mailbox& box, int rank) : box_(box), rank_(rank) {}
  int rank() const override { return rank_; }
  int ranks() const override { return static_cast<int>(box_.posts.size()); }
  std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& send,
                                      const std::vector<int64_t>& send_counts, size_t row_bytes,
                                      std::vector<int64_t>* recv_counts) override {
    box_.posts[static_cast<size_t>(rank_)] = {&send, &send_counts};
    box_.sync.arrive_and_wait();
    std::vector<uint8_t> out;
    recv_counts->assign(box_.posts.size(), 0);
    for (size_t src = 0; src < box_.posts.size(); ++src) {
      const Mailbox::Post& p = box_.posts[src];
      int64_t before = 0;  // rows src sends to ranks below this one
      for (int r = 0; r < rank_; ++r)
        before += (*p.counts)[static_cast<size_t>(r)];
      const int64_t n = (*p.counts)[static_cast<size_t>(rank_)];
      (*recv_counts)[src] = n;
      if (n == 0) continue;
      const uint8_t* first = p.rows->data() + before * static_cast<int64_t>(row_bytes);
      out.insert(out.end(), first, first + n * static_cast<int64_t>(row_bytes));
    }
    box_.sync.arrive_and_wait();
    ++exchanges;
    return out;
  }
  int exchanges = 0;

 private:
  Mailbox& box_;
  int rank_;
};

struct RunResult {
  std::vector<std::vector<float>> hidden;  // per micro-batch, [T, H] after the last layer
  std::map<std::string, StatObserver::Stat> stats;
  std::vector<uint64_t> bytes_read;  // per rank
  std::vector<int> exchanges;        // per rank
};

std::vector<Batch> make_batches(int64_t vocab, int count) {
  std::mt19937 rng(7);
  std::vector<Batch> batches;
  for (int b = 0; b < count; ++b) {
    std::vector<std::vector<int32_t>> seqs;
    for (int s = 0; s < 2; ++s) {
      std::vector<int32_t> seq(static_cast<size_t>(3 + (b * 2 + s) % 5));
      for (int32_t& t : seq)
        t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
      seqs.push_back(seq);
    }
    batches.push_back(Batch::from_sequences(seqs));
  }
  return batches;
}

// ranks == 0: one process without an exchange.
RunResult run(const std::string& model, const std::vector<Batch>& batches, int ranks) {
  const std::string dir = kFixtures + model;
  const ModelConfig config = read_model_config(dir);
  const int n = std::max(ranks, 1);
  RunResult out;
  out.hidden.resize(batches.size());
  out.bytes_read.resize(static_cast<size_t>(n));
  out.exchanges.resize(static_cast<size_t>(n));
  std::vector<StatObserver> observers(static_cast<size_t>(n));
  Mailbox box(n);
  auto rank_main = [&](int r) {
    Checkpoint ckpt = Checkpoint::open(dir);
    ThreadExchange exchange(box, r);
    ForwardOptions options;
    if (ranks > 0) options.experts = &exchange;
    auto fwd = ModelForward::create(config, ckpt, options);
    std::vector<std::unique_ptr<DecoderLayer>> layers;
    for (int64_t l = 0; l < fwd->num_layers(); ++l)
      layers.push_back(fwd->layer(l));
    const size_t rounds = (batches.size() + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
    for (size_t k = 0; k < rounds; ++k) {
      const size_t b = k * static_cast<size_t>(n) + static_cast<size_t>(r);
      const Batch empty = Batch::from_sequences({});
      const Batch& batch = b < batches.size() ? batches[b] : empty;
      std::vector<float> x(static_cast<size_t>(batch.n_tokens() * fwd->hidden_size()));
      if (batch.n_tokens() > 0) fwd->embed(batch, x.data());
      for (auto& layer : layers)
        layer->forward(batch, x.data(), &observers[static_cast<size_t>(r)]);
      if (b < batches.size()) out.hidden[b] = x;
    }
    out.bytes_read[static_cast<size_t>(r)] = ckpt.bytes_read();
    out.exchanges[static_cast<size_t>(r)] = exchange.exchanges;
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back(rank_main, r);
  for (std::thread& t : threads)
    t.join();
  for (const StatObserver& o : observers) {
    for (const auto& [name, s] : o.stats) {
      StatObserver::Stat& m = out.stats[name];
      m.amax = std::max(m.amax, s.amax);
      m.rows += s.rows;
    }
  }
  return out;
}

class ExpertParallel : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertParallel, RanksGiveOneProcessesBitsAndStatistics) {
  const std::string model = GetParam();
  const ModelConfig config = read_model_config(kFixtures + model);
  ASSERT_GT(config.num_experts, 0);
  const std::vector<Batch> batches = make_batches(config.vocab_size, 5);
  const RunResult one = run(model, batches, 0);
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(model + ", " + std::to_string(ranks) + " ranks");
    const RunResult ep = run(model, batches, ranks);
    for (size_t b = 0; b < batches.size(); ++b) {
      ASSERT_EQ(ep.hidden[b].size(), one.hidden[b].size());
      EXPECT_EQ(0, std::memcmp(ep.hidden[b].data(), one.hidden[b].data(),
                               one.hidden[b].size() * sizeof(float)))
          << "micro-batch " << b;
    }
    ASSERT_EQ(ep.stats.size(), one.stats.size());
    for (const auto& [name, s] : one.stats) {
      auto it = ep.stats.find(name);
      ASSERT_NE(it, ep.stats.end()) << name;
      EXPECT_EQ(it->second.amax, s.amax) << name;
      EXPECT_EQ(it->second.rows, s.rows) << name;
    }
    // Every rank exchanged (two per MoE layer and round), and each read less than one process:
    // the routed experts of the others stay unread.
    for (int r = 0; r < ranks; ++r) {
      EXPECT_GT(ep.exchanges[static_cast<size_t>(r)], 0) << "rank " << r;
      EXPECT_LT(ep.bytes_read[static_cast<size_t>(r)], one.bytes_read[0]) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExpertParallel,
                         ::testing::Values("qwen3_moe", "deepseek_v3", "kimi_linear", "mixtral",
                                           "gpt_oss", "gpt_oss_mxfp4", "glm4_moe", "minimax_m2",
                                           "qwen3_next", "qwen3_5_moe"));

TEST(ExpertParallel, OwnersAreContiguousRanges) {
  // 8 experts over 3 ranks: [0, 2), [2, 5), [5, 8).
  const int expect8[8] = {0, 0, 1, 1, 1, 2, 2, 2};
  for (int e = 0; e < 8; ++e)
    EXPECT_EQ(expert_owner(e, 8, 3), expect8[e]) << e;
  // Fewer experts than ranks: rank 0 holds none of 2 experts over 3 ranks ([0,0), [0,1), [1,2)).
  EXPECT_EQ(expert_owner(0, 2, 3), 1);
  EXPECT_EQ(expert_owner(1, 2, 3), 2);
  for (int e = 0; e < 5; ++e)
    EXPECT_EQ(expert_owner(e, 5, 1), 0);
}

}  // namespace
}  // namespace strata
