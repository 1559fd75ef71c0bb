// oomb-train's memory plan, the parts that need no device (examples/train-offload.h): the LM head's
// logits block the plan raises where the device has room (lm_head_block_cap), on a device of 80 GiB
// with the usage at, below and past the edge.
#include "train-offload.h"

#include <gtest/gtest.h>

using namespace oomb::train;

namespace {
constexpr double GiB = 1024.0 * 1024.0 * 1024.0, MiB = 1024.0 * 1024.0;
constexpr double DEF = 1.25 * GiB;
} // namespace

TEST(TrainPlan, LmHeadBlockRaisedToFourTimesWithRoom) {
    // 80 GiB, 20 GiB held, margin 3.4 GiB: plenty of room -> 4 x 1.25 GiB
    EXPECT_EQ(lm_head_block_cap(80 * GiB, 20 * GiB, 3.4 * GiB, DEF), (size_t) (5 * GiB));
}

TEST(TrainPlan, LmHeadBlockRoundedDownTo256MiB) {
    // room beyond need + margin + 1 GiB: 700 MiB -> def + 512 MiB
    const double total = 80 * GiB, margin = 3 * GiB, need = total - margin - 1 * GiB - 700 * MiB;
    double room = 0;
    EXPECT_EQ(lm_head_block_cap(total, need, margin, DEF, &room), (size_t) (DEF + 512 * MiB));
    EXPECT_DOUBLE_EQ(room, 700 * MiB);  // the room the caller checks the new scratch against
    // exactly one step of room: raised by one step
    EXPECT_EQ(lm_head_block_cap(total, total - margin - 1 * GiB - 256 * MiB, margin, DEF), (size_t) (DEF + 256 * MiB));
}

TEST(TrainPlan, LmHeadBlockKeptAtTheEdge) {
    const double total = 80 * GiB, margin = 3 * GiB;
    // less than one 256 MiB step of room, none, or the plan already past the device: the default (0)
    EXPECT_EQ(lm_head_block_cap(total, total - margin - 1 * GiB - 255 * MiB, margin, DEF), 0u);
    EXPECT_EQ(lm_head_block_cap(total, total - margin - 1 * GiB, margin, DEF), 0u);
    EXPECT_EQ(lm_head_block_cap(total, total + 5 * GiB, margin, DEF), 0u);
    // the 1 GiB kept free beyond the margin is not lent
    EXPECT_EQ(lm_head_block_cap(total, total - margin - 0.9 * GiB, margin, DEF), 0u);
    // a zero default (no fused pass) is never raised
    EXPECT_EQ(lm_head_block_cap(total, 10 * GiB, margin, 0.0), 0u);
}
