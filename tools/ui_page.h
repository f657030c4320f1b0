// The dashboard page `shoal ui` serves at / (tools/ui_server.h): one self-contained HTML file,
// its script and style inline, with no external resource (the machines it runs on are often
// offline, and the page must not leak which runs are looked at to a CDN).
//
// What it shows, and the ids and data attributes the browser test reads:
//   #runs tbody tr[data-run]        one row per run (name, status, ranks, start, duration, git)
//     input.run-select               ticked: the run is compared (the newest 4 are at first)
//   #metric                          the metric drawn
//   #overlay                         every compared run's mean-over-ranks curve on one chart
//   .panel[data-run]                 one per compared run, side by side:
//     canvas.curve[data-run][data-metric][data-points][data-ranks]  the curve per rank and mean;
//                                    data-points counts the points received so far
//     .breakdown[data-run][data-ranks]  per rank, mean over its last 50 steps: the step time in
//                                    three parts (Note [Step-time breakdown], train/trainer.h)
//       .brow[data-rank][data-compute-s][data-comm-s][data-wait-s]  one rank's row, a stacked
//                                    bar of span.compute, span.comm, span.wait (compute is
//                                    step_time_s less communication_s and waiting_s; a run
//                                    logging only comm_wait_s shows it as communication);
//                                    with data-straggler="1" and a "straggler"
//                                    label when its compute is above 1.3x the median rank's
//                                    (tools/run_summary.h, Note [Stragglers]); its last
//                                    compute_ratio when the run logs one
//     details.configuration[data-run][data-entries]  run.json's configuration
//                                    (run/run_configuration.h), a row tr[data-key] per entry
//     canvas.timeline[data-run][data-steps]  each rank's steps of the timeline window on a
//                                    time axis; data-steps counts the bars drawn,
//       [data-first-step][data-last-step]  the first and last step drawn (empty: none),
//       [data-from-step][data-window]      the window asked for (from-step empty: the last
//                                    #window steps)
//   #from-step, #window              the window: steps from..from+window-1, or (from-step
//                                    empty) the last #window steps; the page's address
//                                    carries them (?from_step=S&steps=N) both ways
//   #window-reset                    back to the last 20 steps
//   #window-error[data-error]        one line naming a bad input ("1" while there is one)
// Dragging across a timeline sets the window to the steps under the dragged span.
// The page polls /api/runs/NAME/series?after=LAST_ID every second, so curves advance while a
// job runs. A ?token=T in the page's address is sent with every API call (Authorization).
#pragma once

#include <string_view>

namespace shoal::tools {

// The page's bytes (static storage).
std::string_view uiPage();

}  // namespace shoal::tools
