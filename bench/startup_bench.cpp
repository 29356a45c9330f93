// startup_bench CKPT [RECIPE]: the CPU time of what `strata quantize` does before its first layer
// and after its last, phase by phase, on a checkpoint already in the page cache. See
// bench/README.md.
//
// Phases, each timed alone (3 runs; wall and CPU seconds of each, and the best of each printed:
// on a busy machine the CPU time is the steadier number):
//   headers (tree)    every shard's header parsed by the JSON tree alone (HeaderPath::kTree)
//   headers           every shard's header parsed as strata parses it (the direct reader)
//   open              Checkpoint::open: the index, every header, the cross-checks
//   plan              make_plan: classification, source weights, the recipe's decisions
//   int4 shapes       every INT4 module's weight_shape against its packed tensors (a run does
//                     this on a helper thread beside its start)
//   exporter          ModeloptExporter's constructor: the export's layout (nothing written)
//   exclude_modules   the summary written into hf_quant_config.json at the end of the run
// RECIPE defaults to nvfp4_experts_only-kv_fp8 (bench/gpu_bench.sh's).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "export/modelopt.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "io/source_weights.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRepeats = 3;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Runs `fn` kRepeats times; prints each run's wall / CPU seconds and the best of each.
void time_phase(const char* name, const std::function<void()>& fn) {
  double best_wall = 1e30, best_cpu = 1e30;
  std::printf("%-16s", name);
  for (int r = 0; r < kRepeats; ++r) {
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    fn();
    const double cpu = cpu_seconds() - c0;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    best_wall = std::min(best_wall, wall);
    best_cpu = std::min(best_cpu, cpu);
    std::printf(" %6.3f/%6.3f", wall, cpu);
    std::fflush(stdout);
  }
  std::printf("   best wall %6.3f s, CPU %6.3f s\n", best_wall, best_cpu);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: startup_bench CKPT [RECIPE]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string recipe_name = argc > 2 ? argv[2] : "nvfp4_experts_only-kv_fp8";
  try {
    const strata::ModelConfig config = strata::read_model_config(dir);
    const strata::Recipe recipe = strata::load_recipe(recipe_name);
    std::vector<std::shared_ptr<const strata::MappedFile>> files;
    size_t tensors = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() == ".safetensors")
        files.push_back(strata::MappedFile::open(e.path().string()));
    }
    auto headers = [&](strata::HeaderPath path) {
      tensors = 0;
      for (const auto& f : files)
        tensors +=
            strata::parse_safetensors_header(f->data(), f->size(), f->path(), path).entries.size();
    };
    std::printf("%s: %zu shards; recipe %s; wall/CPU seconds of %d runs\n", dir.c_str(),
                files.size(), recipe_name.c_str(), kRepeats);
    time_phase("headers (tree)", [&] { headers(strata::HeaderPath::kTree); });
    time_phase("headers", [&] { headers(strata::HeaderPath::kAny); });
    std::printf("(%zu tensors)\n", tensors);
    strata::Checkpoint ckpt;
    time_phase("open", [&] { ckpt = strata::Checkpoint::open(dir); });
    strata::QuantPlan plan;
    time_phase("plan", [&] { plan = strata::make_plan(config, ckpt, recipe); });
    // Beside the run's start, not before it (io/source_weights.h): after a dropped page cache its
    // first run reads every INT4 weight_shape cold.
    time_phase("int4 shapes", [&] {
      const std::string wrong = strata::int4_shape_mismatch(ckpt);
      if (!wrong.empty()) std::fprintf(stderr, "%s\n", wrong.c_str());
    });
    const std::string out =
        (std::filesystem::temp_directory_path() / "strata_startup_bench_out").string();
    std::filesystem::create_directories(out);  // the exporter writes nothing here
    time_phase("exporter", [&] {
      strata::ModeloptExporter exporter(plan, config, ckpt, out, strata::ExportOptions{});
    });
    size_t entries = 0;
    time_phase("exclude_modules",
               [&] { entries = strata::ModeloptExporter::exclude_modules(plan).size(); });
    std::printf("(%zu planned modules, %zu exclude_modules entries)\n", plan.modules.size(),
                entries);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "startup_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
