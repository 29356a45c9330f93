#include "engine/gpu_ranks.h"

#include <algorithm>

#include "core/error.h"

#if STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace strata {

int gpu_rank_device(const Comm& comm, int devices) {
  STRATA_ASSERT(devices > 0, "no CUDA device");
  return comm.local_rank() % devices;
}

int gpu_rank_sharers(const Comm& comm, int devices) {
  STRATA_ASSERT(devices > 0, "no CUDA device");
  const int mine = gpu_rank_device(comm, devices);
  int n = 0;
  for (int r = 0; r < comm.local_size(); ++r)
    n += r % devices == mine ? 1 : 0;
  return std::max(n, 1);
}

void set_cuda_device(int device) {
#if STRATA_WITH_CUDA
  const cudaError_t e = cudaSetDevice(device);
  STRATA_CHECK(e == cudaSuccess, "--device cuda: cannot use GPU ", device, ": ",
               cudaGetErrorString(e), "; check CUDA_VISIBLE_DEVICES");
#else
  (void)device;
#endif
}

BlobShare plan_share(const Checkpoint& ckpt, const LayerBlob& blob,
                     const std::function<int(const std::string&)>& reader) {
  struct Item {
    const std::string* name;
    uint64_t buffer_offset, bytes, file_offset;
    const std::string* path;
  };
  std::vector<Item> items;
  items.reserve(blob.items.size());
  for (const auto& [name, it] : blob.items) {
    const SafetensorsFile& f = ckpt.shard_of(name);
    items.push_back(
        {&name, it.offset, it.bytes, f.header().data_offset + ckpt.entry(name).begin, &f.path()});
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.buffer_offset < b.buffer_offset; });
  BlobShare share;
  for (const Item& it : items) {
    const int r = reader(*it.name);
    if (!share.runs.empty()) {
      BlobShare::Run& run = share.runs.back();
      const uint64_t end = run.buffer_offset + run.length;
      // Same reader, same shard, the same buffer-to-file shift (one range of the blob), and a
      // gap no larger than the reader would read anyway.
      if (run.reader == r && run.path == *it.path && it.buffer_offset >= end &&
          it.buffer_offset - end <= LayerReader::kMergeGapBytes &&
          it.file_offset >= run.file_offset &&
          it.file_offset - run.file_offset == it.buffer_offset - run.buffer_offset) {
        run.length = it.buffer_offset + it.bytes - run.buffer_offset;
        run.items.push_back(*it.name);
        continue;
      }
    }
    share.runs.push_back({r, *it.path, it.file_offset, it.buffer_offset, it.bytes, {*it.name}});
  }
  return share;
}

uint64_t read_share(const Checkpoint& ckpt, const BlobShare& share, int rank, uint8_t* dst,
                    int threads) {
  std::vector<FileRead> reads;
  uint64_t total = 0;
  for (const BlobShare::Run& run : share.runs) {
    if (run.reader != rank) continue;
    reads.push_back({run.path, run.file_offset, run.buffer_offset, run.length});
    total += run.length;
  }
  read_files(reads, dst, threads, /*direct=*/false, /*whole_pages=*/false);  // exact lengths
  // What this process took from the files (Checkpoint::bytes_read counts each tensor once per
  // process): tensor() marks it; the view itself is not touched.
  for (const BlobShare::Run& run : share.runs) {
    if (run.reader != rank) continue;
    for (const std::string& n : run.items)
      (void)ckpt.tensor(n);
  }
  return total;
}

void exchange_share(Comm& comm, const BlobShare& share, uint8_t* dst) {
  if (comm.size() == 1) return;
  for (const BlobShare::Run& run : share.runs)
    comm.broadcast(dst + run.buffer_offset, run.length, run.reader);
}

void exchange_share(ThreadChannel& channel, const BlobShare& share, uint8_t* dst) {
  for (const BlobShare::Run& run : share.runs)
    channel.broadcast(dst + run.buffer_offset, run.length, run.reader);
}

#ifdef STRATA_HAVE_MPI
// engine/gpu_ranks_mpi.cpp.
std::unique_ptr<ThreadChannel> make_mpi_thread_channel(Comm& comm);
#endif

std::unique_ptr<ThreadChannel> make_thread_channel(Comm& comm) {
  if (comm.size() == 1) return nullptr;
#ifdef STRATA_HAVE_MPI
  return make_mpi_thread_channel(comm);
#else
  return nullptr;
#endif
}

bool any_rank(Comm& comm, bool v) {
  uint64_t n = v ? 1 : 0;
  comm.allreduce_sum(&n, 1);
  return n > 0;
}

}  // namespace strata
