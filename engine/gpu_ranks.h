// GPU ranks (docs/SCALEOUT.md "GPU ranks and NCCL"): what the GPU layer loop
// (engine/gpu_runner.h) does differently when it runs as one of several ranks under MPI.
//
// - Each rank uses GPU local_rank mod the device count (ranks may share a GPU).
// - Each rank runs its own micro-batches (b mod N, as CPU ranks; engine/parallel.h).
// - A layer's blob (io/layer_reader.h: its tensors in one pinned buffer) is read once in total:
//   each tensor is read from the file by one rank, the rank that writes it
//   (ModeloptExporter::owner_of), into its place in that rank's blob buffer; then each tensor is
//   broadcast from its reader to the others over the host communicator, into their buffers at the
//   same offset (host memory: MPI's transport). Every rank then copies the whole blob to its GPU.
//
//   blob buffer (offsets of plan()):  | q k v o (rank 0 reads) | experts 0..3 (rank 1) | ... |
//   read_share():                     rank r preads the runs of items it owns, exact lengths
//   exchange_share():                 per run, one broadcast from its reader to every rank
//
// The exchange of layer l+1 runs on the reader thread, over its own communicator
// (make_thread_channel), while layer l computes; without MPI_THREAD_MULTIPLE, on the main thread
// between two layers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm.h"
#include "io/checkpoint.h"
#include "io/layer_reader.h"

namespace strata {

// The CUDA device of rank `comm` among `devices` devices: local_rank mod devices.
int gpu_rank_device(const Comm& comm, int devices);
// How many ranks on this host use that device.
int gpu_rank_sharers(const Comm& comm, int devices);
// Makes `device` current on the calling thread (cudaSetDevice); without CUDA a no-op.
void set_cuda_device(int device);

// A blob's items split among the ranks. A run is a maximal sequence of items adjacent in the
// buffer, read by the same rank, lying in one range of the blob (so the buffer is a plain image
// of the file between them: buffer offset - file offset is constant).
struct BlobShare {
  struct Run {
    int reader = 0;              // the rank that reads it from the file
    std::string path;            // shard file
    uint64_t file_offset = 0;    // of the run's first item
    uint64_t buffer_offset = 0;  // in the blob buffer
    uint64_t length = 0;         // to the end of its last item
    std::vector<std::string> items;
  };
  std::vector<Run> runs;  // in buffer order
};

// `reader(name)`: the rank that reads item `name` (every rank must compute the same).
BlobShare plan_share(const Checkpoint& ckpt, const LayerBlob& blob,
                     const std::function<int(const std::string&)>& reader);
// This rank's runs into `dst` (the blob's buffer): preads of at most LayerReader::kReadChunkBytes
// spread over `threads` threads, exact lengths (no byte outside this rank's runs is written).
// The items read are marked as read by this process (Checkpoint::bytes_read). Returns the bytes
// read. Throws strata::Error naming the shard on a failed or short read.
uint64_t read_share(const Checkpoint& ckpt, const BlobShare& share, int rank, uint8_t* dst,
                    int threads = 4);
// The reader thread's own channel to the other ranks (a duplicate of the world's MPI
// communicator), so that it can broadcast layer l+1 while the main thread runs layer l's
// collectives on the world. Null on every rank without MPI, when MPI lacks MPI_THREAD_MULTIPLE
// on some rank (the exchange then runs on the main thread; so it does when the GPU loop is given
// --test_gpu_ranks_exchange main and asks for no channel). Collective.
class ThreadChannel {
 public:
  virtual ~ThreadChannel() = default;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
};
std::unique_ptr<ThreadChannel> make_thread_channel(Comm& comm);

// Every run from its reader to every rank, into `dst` at its buffer offset: one broadcast per
// run, in run order. Collective over `comm` (or the channel's ranks).
void exchange_share(Comm& comm, const BlobShare& share, uint8_t* dst);
void exchange_share(ThreadChannel& channel, const BlobShare& share, uint8_t* dst);

// Whether `v` holds on any rank (the same answer on every rank). Collective.
bool any_rank(Comm& comm, bool v);

}  // namespace strata
