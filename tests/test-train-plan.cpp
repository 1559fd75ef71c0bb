// oomb-train's memory plan, the parts that need no device (examples/train-offload.h): the LM head's
// logits block the plan raises where the device has room (lm_head_block_cap), on a device of 80 GiB
// with the usage at, below and past the edge; the host-side limits the plan reads (address_space_left) and the
// small outputs' writer (write_file_atomic: links, FIFOs, devices, folders).
#include "train-offload.h"
#include "train-common.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <thread>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

// ulimit -v: the address space left under RLIMIT_AS (the plan refuses a CPU run that would not fit, rather than
// letting OpenBLAS retry a failed allocation forever); unlimited: SIZE_MAX. In a child, so the limit stays there.
TEST(TrainPlan, AddressSpaceLeftFollowsTheLimit) {
    struct rlimit rl;
    ASSERT_EQ(getrlimit(RLIMIT_AS, &rl), 0);
    if (rl.rlim_cur == RLIM_INFINITY) EXPECT_EQ(address_space_left(), SIZE_MAX);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        struct rlimit lim = {(rlim_t) 8ull << 30, rl.rlim_max};
        if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
        const size_t left = address_space_left();
        _exit(left > 0 && left < (8ull << 30) ? 0 : 4);
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
}

// The small outputs (train.jsonl is appended; --json, loss.png and the PEFT config are replaced whole): a symbolic
// link is followed (was: replaced by a regular file), a FIFO or a device is written in place (was: replaced by the
// rename, /dev/full turned into a file as root; now its ENOSPC is the error), a folder is named.
TEST(TrainPlan, WriteFileAtomicThroughLinksAndSpecialFiles) {
    const std::string dir = std::string(getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/oomb-test-plan-" +
                            std::to_string(getpid());
    ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
    auto read_all = [](const std::string & p) {
        std::ifstream f(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    };
    std::string err;
    const std::string target = dir + "/target.json", link = dir + "/link.json";
    ASSERT_TRUE(write_file_atomic(target, "old", &err)) << err;
    ASSERT_EQ(symlink("target.json", link.c_str()), 0);  // relative: resolved from the link's folder
    ASSERT_TRUE(write_file_atomic(link, "new", &err)) << err;
    struct stat ls;
    ASSERT_EQ(lstat(link.c_str(), &ls), 0);
    EXPECT_TRUE(S_ISLNK(ls.st_mode));
    EXPECT_EQ(read_all(target), "new");
    const std::string fifo = dir + "/out.fifo";
    ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
    std::string got;
    std::thread reader([&] { got = read_all(fifo); });
    ASSERT_TRUE(write_file_atomic(fifo, "through the fifo", &err)) << err;
    reader.join();
    EXPECT_EQ(got, "through the fifo");
    ASSERT_EQ(lstat(fifo.c_str(), &ls), 0);
    EXPECT_TRUE(S_ISFIFO(ls.st_mode));
    if (access("/dev/full", W_OK) == 0) {
        EXPECT_FALSE(write_file_atomic("/dev/full", "x", &err));
        EXPECT_NE(err.find("/dev/full"), std::string::npos) << err;
        struct stat ds;
        ASSERT_EQ(stat("/dev/full", &ds), 0);
        EXPECT_TRUE(S_ISCHR(ds.st_mode)) << "/dev/full is still a device";
    }
    EXPECT_FALSE(write_file_atomic(dir, "x", &err));
    EXPECT_NE(err.find("is a directory"), std::string::npos) << err;
    unlink(link.c_str());
    unlink(target.c_str());
    unlink(fifo.c_str());
    rmdir(dir.c_str());
}
