// Gather throughput to rank 0 vs. a local memcpy of the same bytes.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 ./bench_gather [max_mb] [reps]
//
// Every rank holds an activation piece of S MB (float32); rank 0 gathers all
// pieces. "gather MB/s" counts the bytes rank 0 receives from the others,
// (n-1)*S, over the median time of Communicator::gather (header exchange,
// receive buffer allocation and the MPI transfer included). "gather_whole"
// adds re-assembly (a split along the last dim, so the pieces are
// interleaved into a new tensor). "memcpy MB/s" copies S MB between two
// warm buffers in one process. Without mpirun it runs on one rank and only
// the memcpy column means anything.
#include <flex/parallel/communicator.h>
#include <flex/parallel/shard_spec.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_ms(F&& f) {
  const auto t0 = clock_type::now();
  f();
  return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int max_mb = argc > 1 ? std::atoi(argv[1]) : 256;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  auto comm = flex::make_world_communicator();
  const int rank = comm->rank(), n = comm->size();
  if (rank == 0) {
    std::printf("bench_gather: %d rank(s), backend %s, %d reps, medians\n", n, comm->backend(), reps);
    std::printf("%8s %12s %12s %16s %12s %12s %10s\n", "MB/rank", "gather ms", "gather MB/s", "gather_whole ms",
                "memcpy ms", "memcpy MB/s", "ratio");
  }
  for (int mb = 1; mb <= max_mb; mb *= 2) {
    const int64_t bytes = int64_t(mb) << 20;
    const int64_t rows = 1024;
    const at::Tensor piece = at::full({rows, bytes / 4 / rows}, static_cast<float>(rank));
    std::vector<double> g, gw, mc;
    for (int i = 0; i < reps; ++i) {
      comm->barrier();
      g.push_back(time_ms([&] { comm->gather(piece, 0); }));
      comm->barrier();
      gw.push_back(time_ms([&] { flex::gather_whole(flex::ShardSpec::split(-1), piece, *comm, 0); }));
    }
    if (rank == 0) {
      std::vector<char> src(bytes, 1), dst(bytes, 0);
      for (int i = 0; i < reps; ++i) {
        mc.push_back(time_ms([&] { std::memcpy(dst.data(), src.data(), bytes); }));
        src[i % bytes] = static_cast<char>(dst[(i * 7) % bytes] + 1);  // keep the copy observable
      }
      const double gm = median(g), wm = median(gw), mm = median(mc);
      const double recv_mb = double(mb) * (n - 1);
      const double gbw = n > 1 ? recv_mb / (gm / 1e3) : 0.0, mbw = mb / (mm / 1e3);
      std::printf("%8d %12.2f %12.0f %16.2f %12.2f %12.0f %10.2f\n", mb, gm, gbw, wm, mm, mbw,
                  n > 1 ? mbw / gbw : 0.0);
      std::fflush(stdout);
    }
  }
  return 0;
}
