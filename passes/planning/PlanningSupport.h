// What the planning passes share (passes/Planning.h): reading the
// --schedule CSV, the stage shape a schedule asks for, partitioning for it,
// scheduling a partition, and the partition the stage tags give. Internal
// to passes/planning/.
#pragma once

#include "passes/Planning.h"

#include "llvm/ADT/Twine.h"

#include <optional>
#include <string_view>

namespace cleave::passes::planning {

namespace sched = schedule;

llvm::Error planningError(const llvm::Twine &msg);

// --schedule csv:FILE read, or nullopt for a named schedule.
llvm::Expected<std::optional<sched::Schedule>>
readCsv(const PlanningOptions &o);

// The stages in all and the microbatches a plan with `chunks` stages per
// rank has: the CSV's own, or the options'.
llvm::Error stageShape(const PipelineModule &m,
                       const std::optional<sched::Schedule> &csv, int &chunks,
                       int &stages, int64_t &microbatches);

// Partitions the module's graph into `stages` stages, `chunks` per rank: by
// search, by --split-at, or (followTags) as the ops' stage tags say.
llvm::Expected<PartitionResult>
partitionFor(const PipelineModule &m,
             const std::optional<sched::Schedule> &csv, int chunks,
             int stages, int64_t microbatches, bool followTags);

struct Scheduled {
  sched::Schedule schedule;
  sched::SimResult sim;
};

// The schedule for a partition: generated (or the CSV's) with the
// activations each stage may hold under the cap, counted as the
// partitioner counted them, validated and simulated.
llvm::Expected<Scheduled> scheduleFor(const PipelineModule &m,
                                      std::optional<sched::Schedule> csv,
                                      const PartitionResult &part,
                                      int chunks);

// Writes the partition's stage of every op into its tag.
void tagOps(PipelineModule &m);

// The partition the stage tags give, for a pass run on a module printed
// after `partition`; nothing when the module has one.
llvm::Error ensurePartition(PipelineModule &m, std::string_view pass);

} // namespace cleave::passes::planning
