// RunTimes::describe: the summary's time lines list the phases that took time, in order, and
// what they leave of the total as "other" (values worked by hand).
#include "engine/run_times.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(RunTimes, ListsPhasesThatTookTimeAndTheRest) {
  RunTimes t;
  t.total = 10.0;
  t.startup = 1.0;
  t.embedding = 0.001;  // under 5 ms: left out
  t.layers = 8.0;
  t.read_wait = 2.0;
  t.compute = 5.0;
  t.hidden_writes = 0.5;
  t.hidden_write_count = 2;
  t.writer_busy = 3.0;
  EXPECT_EQ(t.describe(),
            "time 10.00 s = startup 1.00 + layers 8.00 + other 1.00\n"
            "layers 8.00 s = waiting for weights 2.00 + computing 5.00 + hidden states for resume "
            "(2x) 0.50 + other 0.50; writer thread busy 3.00 s\n");
  // The writer's parts, when measured.
  t.writer_write = 1.25;
  t.writer_sync = 0.5;
  EXPECT_EQ(t.describe(),
            "time 10.00 s = startup 1.00 + layers 8.00 + other 1.00\n"
            "layers 8.00 s = waiting for weights 2.00 + computing 5.00 + hidden states for resume "
            "(2x) 0.50 + other 0.50; writer thread busy 3.00 s (writing 1.25, fsync 0.50)\n");
  // The flusher thread's time, beside the writer's.
  t.writeback = 2.0;
  EXPECT_EQ(t.describe(),
            "time 10.00 s = startup 1.00 + layers 8.00 + other 1.00\n"
            "layers 8.00 s = waiting for weights 2.00 + computing 5.00 + hidden states for resume "
            "(2x) 0.50 + other 0.50; writer thread busy 3.00 s (writing 1.25, fsync 0.50); "
            "writeback requests on their own thread 2.00 s\n");
}

TEST(RunTimes, NoLayerLineWithoutALoop) {
  RunTimes t;
  t.total = 1.5;
  t.startup = 0.5;
  t.head = 0.5;
  t.finish = 0.5;
  EXPECT_EQ(t.describe(), "time 1.50 s = startup 0.50 + export head 0.50 + finish 0.50\n");
}

TEST(RunTimes, HeadThreadLineWhenTheHeadRanOnItsOwnThread) {
  RunTimes t;
  t.total = 4.0;
  t.startup = 1.0;
  t.layers = 3.0;
  t.writer_wait = 2.5;  // the loop's first write waited for the head
  t.head_write = 1.75;
  t.head_commit = 0.5;
  t.head_done_at = 3.25;
  t.head_wait = 2.25;
  EXPECT_EQ(t.describe(),
            "time 4.00 s = startup 1.00 + layers 3.00\n"
            "layers 3.00 s = waiting for the writer 2.50 + other 0.50\n"
            "export head on its own thread: written 1.75 s, synced and recorded 0.50 s, done "
            "3.25 s after the run's start; the loop waited 2.25 s for it\n");
}

TEST(PhaseTimer, LapAddsTheElapsedTime) {
  PhaseTimer p;
  double into = 1.0;
  const double s = p.lap(&into);
  EXPECT_GE(s, 0.0);
  EXPECT_DOUBLE_EQ(into, 1.0 + s);
  EXPECT_GE(p.lap(nullptr), 0.0);
}

}  // namespace
}  // namespace strata
