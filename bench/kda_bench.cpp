// The gated delta rule (Kimi Delta Attention's recurrence; Qwen3-Next's with one decay a head) at
// Kimi-Linear-48B's sizes: 32 heads of 128 (q/k and v), decay per key channel, from a zero state
// per sequence. Issue 22 asks whether it needs a chunked form; this measures the token-by-token
// forms strata has, in tokens per second through one KDA layer's recurrence:
//   cpu reference   ops::gated_delta_rule_reference, one element at a time (all cores over heads)
//   cpu             ops::gated_delta_rule, the same arithmetic vectorized (bit-identical)
//   gpu             ops::cuda::gated_delta_rule, one block per (sequence, head) (CUDA builds with
//                   a visible device), at each --chunk: the tokens a GPU chunk holds (whole
//                   sequences), device time per chunk between events, mean over --reps
// and projects each onto the calibration set (--calib tokens) over --layers KDA layers
// (Kimi-Linear-48B: 27 layers, 20 of them KDA).
//
//   kda_bench [--heads 32] [--dim 128] [--seq 512] [--cpu_tokens 2048] [--chunk 512,4096,32768]
//             [--reps 5] [--calib 262144] [--layers 20] [--head_decay]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/ops.h"
#if STRATA_WITH_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/kda.h"
#endif

namespace {

struct Options {
  int64_t heads = 32, dim = 128, seq = 512, cpu_tokens = 2048, reps = 5, calib = 262144,
          layers = 20;
  std::vector<int64_t> chunks = {512, 4096, 32768};
  bool head_decay = false;
};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kda_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--heads")
      o.heads = std::atoll(next());
    else if (a == "--dim")
      o.dim = std::atoll(next());
    else if (a == "--seq")
      o.seq = std::atoll(next());
    else if (a == "--cpu_tokens")
      o.cpu_tokens = std::atoll(next());
    else if (a == "--chunk")
      o.chunks = parse_list(next());
    else if (a == "--reps")
      o.reps = std::atoll(next());
    else if (a == "--calib")
      o.calib = std::atoll(next());
    else if (a == "--layers")
      o.layers = std::atoll(next());
    else if (a == "--head_decay")
      o.head_decay = true;
    else {
      std::fprintf(stderr, "kda_bench: unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.heads < 1 || o.dim < 1 || o.dim > 256 || o.seq < 1 || o.cpu_tokens < o.seq) {
    std::fprintf(stderr, "kda_bench: need heads >= 1, 1 <= dim <= 256, cpu_tokens >= seq >= 1\n");
    std::exit(2);
  }
  return o;
}

// Inputs as the layer gives them: q and k L2-normed per head (q also scaled by dim^-1/2), v
// normal, the log decay in (-0.6, 0], beta in (0, 1).
struct Inputs {
  std::vector<float> q, k, v, g, beta;
};

Inputs make_inputs(const Options& o, int64_t T) {
  std::mt19937 rng(22);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Inputs in;
  const int64_t qk = T * o.heads * o.dim;
  in.q.resize(static_cast<size_t>(qk));
  in.k.resize(in.q.size());
  in.v.resize(in.q.size());
  for (size_t i = 0; i < in.q.size(); ++i) {
    in.q[i] = n(rng);
    in.k[i] = n(rng);
    in.v[i] = n(rng);
  }
  strata::ops::l2_norm(in.q.data(), T * o.heads, o.dim, 1e-6f);
  strata::ops::l2_norm(in.k.data(), T * o.heads, o.dim, 1e-6f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(o.dim));
  for (float& x : in.q)
    x *= scale;
  in.g.resize(static_cast<size_t>(o.head_decay ? T * o.heads : qk));
  for (float& x : in.g)
    x = -0.6f * u(rng);
  in.beta.resize(static_cast<size_t>(T * o.heads));
  for (float& x : in.beta)
    x = 0.05f + 0.9f * u(rng);
  return in;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void row(const char* what, int64_t chunk, double sec_per_token, const Options& o) {
  const double projected = sec_per_token * static_cast<double>(o.calib * o.layers);
  std::printf("%-15s %10lld %14.0f %14.3f %12.2f\n", what, static_cast<long long>(chunk),
              1.0 / sec_per_token, sec_per_token * 1e6, projected);
}

// CPU: sequences of --seq tokens one after another (as CpuBackend runs them), heads in parallel.
double cpu_per_token(const Options& o, const Inputs& in, bool reference, std::vector<float>& out) {
  const int64_t T = o.cpu_tokens, seqs = T / o.seq, H = o.heads, d = o.dim;
  const int64_t g_row = o.head_decay ? H : H * d;
  out.assign(static_cast<size_t>(T * H * d), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < seqs; ++s) {
    const int64_t b = s * o.seq;
    auto* f = reference ? &strata::ops::gated_delta_rule_reference : &strata::ops::gated_delta_rule;
    f(in.q.data() + b * H * d, in.k.data() + b * H * d, in.v.data() + b * H * d,
      in.g.data() + b * g_row, in.beta.data() + b * H, o.seq, H, d, d, out.data() + b * H * d,
      o.head_decay);
  }
  return seconds_since(t0) / static_cast<double>(seqs * o.seq);
}

#if STRATA_WITH_CUDA
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kda_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
T* upload(const std::vector<T>& h) {
  T* d = nullptr;
  ck(cudaMalloc(&d, h.size() * sizeof(T)), "cudaMalloc");
  ck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

// Device time per token at each chunk size, and where a chunk covers the CPU's tokens, the
// largest difference from the CPU's output over them (the same inputs: `in` starts with them).
void gpu_rows(const Options& o, const Inputs& in, const std::vector<float>& cpu_out) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("gpu             (no device visible)\n");
    return;
  }
  const int64_t most = static_cast<int64_t>(in.beta.size()) / o.heads;
  float *q = upload(in.q), *k = upload(in.k), *v = upload(in.v), *g = upload(in.g),
        *beta = upload(in.beta), *out = nullptr;
  const int64_t H = o.heads, d = o.dim;
  ck(cudaMalloc(&out, static_cast<size_t>(most * H * d) * 4), "cudaMalloc");
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int64_t chunk : o.chunks) {
    const int64_t seqs = chunk / o.seq;
    if (seqs < 1) continue;
    std::vector<int64_t> bounds;
    for (int64_t s = 0; s <= seqs; ++s)
      bounds.push_back(s * o.seq);
    int64_t* db = upload(bounds);
    auto launch = [&] {
      strata::ops::cuda::gated_delta_rule(q, k, v, g, beta, db, seqs, H, d, d, out, nullptr,
                                          o.head_decay);
    };
    launch();  // warm-up
    ck(cudaDeviceSynchronize(), "warm-up");
    ck(cudaEventRecord(a), "record");
    for (int64_t r = 0; r < o.reps; ++r)
      launch();
    ck(cudaEventRecord(b), "record");
    ck(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    row("gpu", seqs * o.seq, ms / 1e3 / static_cast<double>(o.reps * seqs * o.seq), o);
    if (seqs * o.seq >= o.cpu_tokens) {
      std::vector<float> h(static_cast<size_t>(o.cpu_tokens * H * d));
      ck(cudaMemcpy(h.data(), out, h.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
      double worst = 0, top = 0;
      for (size_t i = 0; i < h.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(h[i]) - cpu_out[i]));
        top = std::max(top, std::fabs(static_cast<double>(cpu_out[i])));
      }
      std::printf(
          "                largest |gpu - cpu| / max |cpu| over the first %lld tokens: "
          "%.2e\n",
          static_cast<long long>(o.cpu_tokens), top > 0 ? worst / top : worst);
    }
    cudaFree(db);
  }
  for (float* p : {q, k, v, g, beta, out})
    cudaFree(p);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::printf(
      "gated delta rule: %lld heads x %lld, decay per %s, sequences of %lld tokens; "
      "projection: %lld tokens x %lld layers\n",
      static_cast<long long>(o.heads), static_cast<long long>(o.dim),
      o.head_decay ? "head" : "key channel", static_cast<long long>(o.seq),
      static_cast<long long>(o.calib), static_cast<long long>(o.layers));
  std::printf("%-15s %10s %14s %14s %12s\n", "form", "tokens", "tokens/s", "us/token",
              "projected s");
  int64_t most = o.cpu_tokens;  // the inputs of the largest run; each run reads their start
  for (int64_t c : o.chunks)
    most = std::max(most, c / o.seq * o.seq);
  const Inputs in = make_inputs(o, most);
  std::vector<float> ref, fast;
  row("cpu reference", o.cpu_tokens, cpu_per_token(o, in, true, ref), o);
  row("cpu", o.cpu_tokens, cpu_per_token(o, in, false, fast), o);
  const bool same = std::memcmp(ref.data(), fast.data(), ref.size() * 4) == 0;
  std::printf("                cpu equals cpu reference bit for bit: %s\n", same ? "yes" : "NO");
#if STRATA_WITH_CUDA
  gpu_rows(o, in, fast);
#endif
  return same ? 0 : 1;
}
