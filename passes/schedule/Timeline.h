// Pictures of a simulated step: a Chrome trace / Perfetto JSON file (one
// track per stage for F/B/W/BW spans named like `F3`, one per stage for the
// messages it sends), and an SVG Gantt chart for people: stages as rows,
// one colour per kind, microbatch numbers in the boxes, idle time as grey
// background, a legend and the step time. Both show one isolated step,
// every stage starting at time 0. The chart draws seconds as milliseconds,
// the unit of cleave-run's measured timeline (tools/MeasuredTimeline.h).
#pragma once

#include "passes/PipelineCosts.h"
#include "passes/schedule/Schedule.h"
#include "passes/schedule/Simulator.h"

#include <string>

namespace cleave::passes::schedule {

std::string chromeTrace(const Schedule &s, const SimResult &r,
                        const PipelineCosts &costs);

std::string ganttSvg(const Schedule &s, const SimResult &r,
                     const PipelineCosts &costs);

// Two charts, one above the other, at one time scale: cleave-run's
// predicted step (the plan's schedule simulated on its costs) over the
// measured one. Both must be in the same unit after seconds become
// milliseconds.
std::string ganttSvgPair(const Schedule &s1, const SimResult &r1,
                         const PipelineCosts &costs1, const Schedule &s2,
                         const SimResult &r2, const PipelineCosts &costs2);

} // namespace cleave::passes::schedule
