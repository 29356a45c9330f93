#include "engine/parallel.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "core/error.h"

namespace strata {

std::vector<bool> owned_batches(const Comm& comm, size_t batches) {
  std::vector<bool> owned(batches);
  for (size_t b = 0; b < batches; ++b)
    owned[b] = static_cast<int>(b % static_cast<size_t>(comm.size())) == comm.rank();
  return owned;
}

std::string encode_calibration(const MaxCalibrator& calib) {
  std::string out;
  // An empty vector's data() may be null: nothing is appended or copied for n == 0.
  auto put = [&](const void* p, size_t n) {
    if (n > 0) out.append(static_cast<const char*>(p), n);
  };
  for (const auto& [name, s] : calib.stats()) {
    const uint32_t len = static_cast<uint32_t>(name.size());
    put(&len, 4);
    put(name.data(), name.size());
    put(&s.amax, 4);
    put(&s.rows, 8);
    const uint32_t bins = static_cast<uint32_t>(s.hist.size());  // 0 or kHeadroomBins
    put(&bins, 4);
    put(s.hist.data(), s.hist.size() * sizeof(int64_t));
    put(&s.layout.heads, 8);
    put(&s.layout.head_dim, 8);
    put(&s.layout.pairs_from, 8);
    const uint64_t n_seqs = s.sequences.size();  // 0 unless the affine KV cache's
    put(&n_seqs, 8);
    for (const auto& [id, q] : s.sequences) {
      const uint64_t cols = q.sum.size();
      put(&id, 8);
      put(&q.tokens, 8);
      put(&cols, 8);
      put(q.sum.data(), cols * sizeof(double));
      put(q.max.data(), cols * sizeof(float));
      put(q.min.data(), cols * sizeof(float));
    }
  }
  return out;
}

void merge_calibration(const std::string& bytes, MaxCalibrator& calib) {
  size_t i = 0;
  auto get = [&](void* p, size_t n) {
    STRATA_ASSERT(i + n <= bytes.size(), "calibration statistics truncated");
    if (n > 0) std::memcpy(p, bytes.data() + i, n);
    i += n;
  };
  while (i < bytes.size()) {
    uint32_t len = 0;
    get(&len, 4);
    std::string name(len, '\0');
    get(name.data(), len);
    MaxCalibrator::Stat s;
    get(&s.amax, 4);
    get(&s.rows, 8);
    uint32_t bins = 0;
    get(&bins, 4);
    STRATA_ASSERT(bins == 0 || bins == static_cast<uint32_t>(kHeadroomBins),
                  "calibration histogram of ", bins, " bins");
    s.hist.resize(bins);
    get(s.hist.data(), bins * sizeof(int64_t));
    get(&s.layout.heads, 8);
    get(&s.layout.head_dim, 8);
    get(&s.layout.pairs_from, 8);
    uint64_t n_seqs = 0;
    get(&n_seqs, 8);
    for (uint64_t k = 0; k < n_seqs; ++k) {
      int64_t id = 0;
      uint64_t cols = 0;
      MaxCalibrator::SequenceStat q;
      get(&id, 8);
      get(&q.tokens, 8);
      get(&cols, 8);
      q.sum.resize(cols);
      q.max.resize(cols);
      q.min.resize(cols);
      get(q.sum.data(), cols * sizeof(double));
      get(q.max.data(), cols * sizeof(float));
      get(q.min.data(), cols * sizeof(float));
      s.sequences[id].merge(q);
    }
    calib.merge(name, s);  // histograms add, sequences by index: the pooled statistic
  }
}

void allreduce_calibration(Comm& comm, MaxCalibrator& calib) {
  if (comm.size() == 1) return;
  const std::vector<std::string> all = comm.allgather(encode_calibration(calib));
  MaxCalibrator merged(calib.block_histograms(), calib.sequence_stats());
  for (const std::string& bytes : all)
    merge_calibration(bytes, merged);
  calib = std::move(merged);
}

void share_tensors(Comm& comm, const Checkpoint& ckpt, const std::vector<std::string>& names,
                   const std::function<int(const std::string&)>& owner) {
  if (comm.size() == 1) return;
  // Per owner, its tensors back to back in `names` order: one broadcast per rank.
  for (int r = 0; r < comm.size(); ++r) {
    uint64_t total = 0;
    for (const std::string& n : names) {
      if (owner(n) != r) continue;
      const TensorEntry& e = ckpt.entry(n);
      total += e.end - e.begin;
    }
    if (total == 0) continue;
    std::vector<uint8_t> buf(total);
    if (r == comm.rank()) {
      uint64_t at = 0;
      for (const std::string& n : names) {
        if (owner(n) != r) continue;
        const Tensor t = ckpt.tensor(n);
        std::memcpy(buf.data() + at, t.bytes(), t.nbytes());
        at += t.nbytes();
      }
    }
    comm.broadcast(buf.data(), buf.size(), r);
    uint64_t at = 0;
    for (const std::string& n : names) {
      if (owner(n) != r) continue;
      const TensorEntry& e = ckpt.entry(n);
      const uint64_t nb = e.end - e.begin;
      auto copy = std::make_shared<std::vector<uint8_t>>(
          buf.begin() + static_cast<int64_t>(at), buf.begin() + static_cast<int64_t>(at + nb));
      ckpt.hold(n, std::move(copy));
      at += nb;
    }
  }
}

ResumeState agree_resume_state(const Comm& comm, const std::string& manifest,
                               const std::map<std::string, std::string>& identity) {
  std::optional<ResumeState> st = read_resume_manifest(manifest);
  STRATA_CHECK(st.has_value(), "rank ", comm.rank(), " of ", comm.size(), ": ", manifest,
               " that rank 0 wrote is not there; every rank must see the same --export_path and "
               "resume folder (a shared filesystem)");
  const std::string changed = identity_changes(st->identity, identity);
  STRATA_CHECK(changed.empty(), "rank ", comm.rank(), " of ", comm.size(),
               " runs another job than rank 0 (changed: ", changed,
               "); give every rank the same command and inputs");
  return *st;
}

void check_same_step(Comm& comm, int64_t next_step) {
  const std::vector<std::string> all = comm.allgather(std::to_string(next_step));
  for (size_t r = 0; r < all.size(); ++r) {
    STRATA_CHECK(all[r] == all[0], "rank ", r, " would resume at step ", all[r], ", rank 0 at ",
                 all[0], "; every rank must see the same --export_path and resume folder");
  }
}

std::vector<uint8_t> CommExpertExchange::alltoallv_rows(const std::vector<uint8_t>& send,
                                                        const std::vector<int64_t>& send_counts,
                                                        size_t row_bytes,
                                                        std::vector<int64_t>* recv_counts) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t r = 0; r < send_counts.size(); ++r) {
    if (static_cast<int>(r) != comm_.rank())
      traffic.bytes_sent += static_cast<uint64_t>(send_counts[r]) * row_bytes;
  }
  std::vector<uint8_t> out = comm_.alltoallv_rows(send, send_counts, row_bytes, recv_counts);
  traffic.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void test_fail_hook(const Comm& comm, int64_t layer, const TestHooks& hooks) {
  if (hooks.fail_rank != comm.rank() || hooks.fail_layer != layer) return;
  fail("test hook: rank ", comm.rank(), " fails at layer ", layer,
       " (--test_fail_rank/--test_fail_layer)");
}

}  // namespace strata
