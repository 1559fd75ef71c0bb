// Removal of the writers' temporary files when the process is stopped by a signal. See gguf.h
// (install_temp_file_cleanup).
//
// The registry is a fixed table of slots, so that the signal handler only reads memory that is
// always there and calls only async-signal-safe functions (unlink, sigaction, raise). Slot states:
//   0 free, 1 being filled by register, 2 registered, 3 claimed by the handler (never reused).
// register: 0 -> 1 (CAS), copy the path, 1 -> 2 (release). unregister: 2 -> 0 (CAS; when the
// handler has claimed the slot, it stays claimed). handler: 2 -> 3 (CAS), unlink the path.
#include "gguf.h"

#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>

#include <algorithm>
#include <cstdlib>
#include <dirent.h>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace oomb {

namespace {

constexpr int kSlots = 64;
constexpr size_t kPathMax = PATH_MAX;

struct Slot {
    std::atomic<int> state{0};
    char path[kPathMax];
};

static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");
Slot g_slots[kSlots];

const int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

void remove_all() {
    for (Slot& s : g_slots) {
        int expected = 2;
        if (s.state.compare_exchange_strong(expected, 3, std::memory_order_acq_rel)) unlink(s.path);
    }
}

extern "C" void cleanup_handler(int sig) {
    const int saved_errno = errno;
    remove_all();
    // Re-raise with the default action, so that the exit status says which signal ended us. The
    // signal is blocked while its handler runs: it is delivered (and kills) when we return.
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
    raise(sig);
    errno = saved_errno;
}

} // namespace

std::string output_target(const std::string& path, bool allow_special, std::string* target, bool* special) {
    *target = path;
    *special = false;
    struct stat st, ls;
    const bool is_link = lstat(path.c_str(), &ls) == 0 && S_ISLNK(ls.st_mode);
    if (stat(path.c_str(), &st) == 0) {  // exists (links followed)
        if (S_ISDIR(st.st_mode)) return path + " is a directory: give the output file's path";
        if (!S_ISREG(st.st_mode)) {  // written through path itself (/proc/self/fd/1 and the like are no file names)
            *special = true;
            return allow_special ? "" : path + " is not a regular file (a device, FIFO or socket): write the output to a file";
        }
        if (is_link) {
            char buf[PATH_MAX];
            if (realpath(path.c_str(), buf)) *target = buf;
        }
        return "";
    }
    // a dangling link: the file it names is created
    std::string p = path;
    for (int hops = 0; hops < 40 && lstat(p.c_str(), &ls) == 0 && S_ISLNK(ls.st_mode); hops++) {
        char buf[PATH_MAX];
        const ssize_t n = readlink(p.c_str(), buf, sizeof buf - 1);
        if (n <= 0) break;
        std::string t(buf, (size_t) n);
        if (t[0] != '/') {
            const size_t sl = p.rfind('/');
            if (sl != std::string::npos) t = p.substr(0, sl + 1) + t;
        }
        p = t;
    }
    *target = p;
    return "";
}

std::string temp_file_create_error(const std::string& path, const std::string& tmp, int errnum) {
    const size_t sl = path.rfind('/');
    const std::string dir = sl == std::string::npos ? "." : sl == 0 ? "/" : path.substr(0, sl);
    struct stat st;
    if (errnum == ENOENT && stat(dir.c_str(), &st) != 0)
        return "cannot create " + path + ": its folder " + dir + " does not exist (create it first)";
    if (errnum == ENOTDIR || (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)))
        return "cannot create " + path + ": " + dir + " is not a folder";
    return "cannot create " + path + " (its temporary file " + tmp + "): " + strerror(errnum);
}

int temp_file_register(const std::string& path) {
    std::string abs = path;
    if (abs.empty()) return -1;
    if (abs[0] != '/') { // the process may change directory before a signal comes
        char cwd[kPathMax];
        if (getcwd(cwd, sizeof cwd)) abs = std::string(cwd) + "/" + abs;
    }
    if (abs.size() + 1 > kPathMax) return -1;
    for (int i = 0; i < kSlots; i++) {
        int expected = 0;
        if (g_slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
            memcpy(g_slots[i].path, abs.c_str(), abs.size() + 1);
            g_slots[i].state.store(2, std::memory_order_release);
            return i;
        }
    }
    return -1; // table full: this file is not removed on a signal
}

void temp_file_unregister(int id) {
    if (id < 0 || id >= kSlots) return;
    int expected = 2;
    g_slots[id].state.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
}

void remove_temp_files() { remove_all(); }

std::vector<std::string> remove_orphan_temp_files(const std::string& dir, const std::vector<std::string>& bases) {
    std::vector<std::string> removed;
    const std::string d = dir.empty() ? "." : dir;
    DIR* dp = opendir(d.c_str());
    if (!dp) return removed;
    std::vector<std::string> names;
    while (dirent* e = readdir(dp)) names.push_back(e->d_name);
    closedir(dp);
    std::sort(names.begin(), names.end());
    for (const std::string& n : names) {
        const size_t t = n.rfind(".tmp.");
        if (t == std::string::npos || t + 5 >= n.size()) continue;
        const std::string base = n.substr(0, t), num = n.substr(t + 5);
        if (num.find_first_not_of("0123456789") != std::string::npos || num.size() > 9) continue;
        if (std::find(bases.begin(), bases.end(), base) == bases.end()) continue;
        const long pid = std::atol(num.c_str());
        if (pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; // alive (or not ours to judge: EPERM)
        const std::string p = d + "/" + n;
        if (unlink(p.c_str()) == 0) removed.push_back(p);
    }
    return removed;
}

void install_temp_file_cleanup() {
    for (int sig : kSignals) {
        struct sigaction old;
        if (sigaction(sig, nullptr, &old) != 0) continue;
        // Leave ignored signals ignored (nohup) and the program's own handlers in place.
        // (Installing twice is harmless: the second call finds our handler and keeps it.)
        if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = cleanup_handler;
        sigemptyset(&sa.sa_mask);
        for (int s : kSignals) sigaddset(&sa.sa_mask, s); // one cleanup at a time
        sa.sa_flags = SA_RESTART;
        sigaction(sig, &sa, nullptr);
    }
    // A file-size limit (ulimit -f) reached: SIGXFSZ's default action kills the process in the middle of a write,
    // leaving its temporary files and no message. Ignored (where it is at its default), the write fails with EFBIG
    // instead, which the writers report ("cannot write OUT: File too large") and clean up after.
    struct sigaction old;
    if (sigaction(SIGXFSZ, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_DFL) signal(SIGXFSZ, SIG_IGN);
}

} // namespace oomb
