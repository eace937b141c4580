// Measures the figures of the analytic cost model's device profiles
// (passes/Cost.cpp, docs/design/partition.md) on this machine, as
// `--device-profile host` measures them when cleavec starts
// (tools/HostProfile.h: the runtime's own f32 GEMM on 1024^3 over the CPU
// backend's pool, a STREAM-like triad over 64 MiB arrays, the fused
// attention kernels; best of several runs each, so a busy neighbour lowers
// the figures less). The fixed `cpu` profile's figures came from here.
//   build/tests/cleave-bench-device-profile [THREADS]
#include "tools/HostProfile.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1])
                         : int(std::thread::hardware_concurrency());
  cleave::passes::DeviceProfile p = cleave::tools::measureHostProfile(threads);
  std::printf("threads            %d\n", threads);
  std::printf("sgemm 1024^3       %.3g FLOP/s\n", p.peakFlops);
  std::printf("fused attention    %.3g FLOP/s\n", p.attentionFlops);
  std::printf("triad 64 MiB       %.3g bytes/s\n", p.memBandwidth);
  return 0;
}
