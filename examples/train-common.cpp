#include "train-common.h"
#include "gguf.h"  // file_kind_name
#include "../gguf-tools/tool-cli.h"  // add_strict_value_checks

#include <algorithm>
#include <charconv>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <map>
#include <thread>
#include <unistd.h>
#include <zlib.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include "stb_image_write.h"
#include "stb_easy_font.h"

namespace oomb {
namespace train {

namespace {
const char * g_prog = "oomb";
int g_code = 1;

void exit_handler(const char * msg, void *) {
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\n", g_prog, msg);
    fflush(stderr);
    _exit(g_code);
}
} // namespace

void install_error_handler(const char * prog, int code) {
    g_prog = prog;
    g_code = code;
    oomb_set_error_handler(exit_handler, nullptr);
}

void need_in_range(const char * prog, bool ok, const char * name, double v, const std::string & range) {
    if (ok) return;
    char b[64];
    snprintf(b, sizeof(b), "%.10g", v);
    fail(prog, std::string(name) + " " + b + " is out of range: it must be " + range);
}

void check_chunk_options(const char * prog, const CLI::App & app, int64_t ctx, int64_t chunk, int page, int threads, double rope_theta) {
    need_in_range(prog, ctx >= 2, "--ctx", (double) ctx, ">= 2");
    need_in_range(prog, chunk >= 1, "--chunk", (double) chunk, ">= 1");
    need_in_range(prog, page >= 1, "--page", page, ">= 1");
    if (app.count("--page"))
        need_in_range(prog, page <= ctx, "--page", page, "at most --ctx (" + std::to_string(ctx) + "): the page size is too large");
    if (app.count("--threads")) {
        need_in_range(prog, threads >= 1, "--threads", threads, ">= 1");
        const unsigned hw = std::thread::hardware_concurrency();
        if (hw > 0 && (unsigned) threads > hw)
            fprintf(stderr, "%s: warning: --threads %d is more than this machine's %u hardware threads: the CPU kernels will "
                            "time-share the cores (much slower); the default takes them all\n", prog, threads, hw);
    }
    if (app.count("--rope-theta"))
        need_in_range(prog, std::isfinite(rope_theta) && rope_theta > 0, "--rope-theta", rope_theta, "a finite number > 0");
}

int threads_default(int n) {
    if (n > 0) return n;
    const unsigned h = std::thread::hardware_concurrency();
    return h ? (int) h : 1;
}

int parse_command_line(CLI::App & app, int argc, char ** argv, const char * prog, const CLI::App * sibling) {
    oomb::tools::add_strict_value_checks(app);  // empty values, whole numbers out of their type's range (gguf-tools/tool-cli.h)
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp & e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp & e) {
        return app.exit(e);
    } catch (const CLI::ParseError & e) {
        // an option of the sibling tool (oomb-train's given to oomb-eval): say whose it is
        for (int i = 1; sibling && i < argc; i++) {
            std::string a = argv[i];
            if (a == "--") break;
            if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') || a[1] == '.') continue;  // a value (-1, -.5)
            if (const size_t eq = a.find('='); eq != std::string::npos) a.resize(eq);
            if (app.get_option_no_throw(a) || !sibling->get_option_no_throw(a)) continue;
            print_error(prog, a + " is an option of " + sibling->get_name() + ", not of " + prog + " (see " + prog + " --help)");
            return 1;
        }
        print_error(prog, std::string(e.what()) + " (see --help)");
        return 1;
    }
    return -1;
}

void print_error(const char * prog, const std::string & msg) {
    fflush(stdout);
    fprintf(stderr, "%s: error: %s\n", prog, msg.c_str());
    fflush(stderr);
}

void fail(const char * prog, const std::string & msg, int code) {
    print_error(prog, msg);
    // _exit after the streams are flushed, not exit: exit runs the libraries' teardown, and OpenBLAS's joins worker
    // threads that may be stuck retrying an allocation that failed (under ulimit -v: a hang instead of this error)
    fflush(nullptr);
    _exit(code);
}

std::string exe_dir() {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) return "";
    buf[n] = 0;
    std::string p(buf);
    const size_t s = p.rfind('/');
    return s == std::string::npos ? "" : p.substr(0, s);
}

bool is_dir(const std::string & p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string & p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string find_project_file(const std::string & rel) {
    const std::string d = exe_dir();
    std::vector<std::string> cands;
    if (!d.empty()) {
        cands.push_back(d + "/../../" + rel);
        cands.push_back(d + "/../" + rel);
    }
    cands.push_back(rel);
    for (const auto & c : cands) {
        if (!is_file(c)) continue;
        char real[4096];
        if (realpath(c.c_str(), real)) return real;
        return c;
    }
    return "";
}

bool make_dirs(const std::string & p, std::string * err) {
    if (p.empty() || is_dir(p)) return true;
    std::string cur;
    size_t i = 0;
    while (i <= p.size()) {
        size_t j = p.find('/', i);
        if (j == std::string::npos) j = p.size();
        cur = p.substr(0, j);
        if (!cur.empty() && !is_dir(cur)) {
            if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
                if (err) *err = "cannot create folder '" + cur + "': " + strerror(errno);
                return false;
            }
        }
        i = j + 1;
    }
    return true;
}

namespace {

// A folder walk: each folder entered once by device + inode (a link to a folder read already, or back up
// into a loop, is skipped with a note); every regular file with its device + inode and whether its own name is
// a symbolic link. list_files then keeps, of the files that pass its extension filter, each real file (hard
// links too: two names someone made on purpose) and drops a symbolic link to a file kept already, so text
// reached twice through links is read once. (The filter comes first: a link named train.jsonl to an
// extensionless blob, as the Hugging Face cache lays them out, is the one to keep.)
struct WalkFile {
    std::string path;
    std::pair<dev_t, ino_t> id;
    bool link;
};
struct WalkSeen {
    std::map<std::pair<dev_t, ino_t>, std::string> dirs;  // -> the path first entered
    std::vector<std::string> notes;                        // what was skipped, and why
};

// Folders the walk leaves out (data_exclude_folder): the run's --out, whose log and checkpoints are not training data
std::vector<std::string> g_excluded_folders;

// the excluded folder that dir is (by device + inode), or ""
std::string excluded_folder(const struct stat & st) {
    for (const std::string & x : g_excluded_folders) {
        struct stat xs;
        if (stat(x.c_str(), &xs) == 0 && xs.st_dev == st.st_dev && xs.st_ino == st.st_ino) return x;
    }
    return "";
}

void walk(const std::string & dir, std::vector<WalkFile> * out, WalkSeen * seen) {
    DIR * d = opendir(dir.c_str());
    if (!d) return;
    std::vector<std::string> names;
    while (dirent * e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        names.push_back(e->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto & n : names) {
        const std::string p = dir + "/" + n;
        struct stat st, lst;
        if (stat(p.c_str(), &st) != 0) continue;  // a dangling link
        const bool link = lstat(p.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
        const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
        if (S_ISDIR(st.st_mode)) {
            if (const std::string x = excluded_folder(st); !x.empty()) {
                seen->notes.push_back("skipping folder '" + p + "': the run's output folder (--out " + x + "), not training data");
                continue;
            }
            if (is_file(p + "/.lock") && is_file(p + "/train.jsonl")) {  // another oomb-train run's --out (a sweep's runs side by side)
                seen->notes.push_back("skipping folder '" + p + "': an oomb-train output folder (.lock, train.jsonl), not training data");
                continue;
            }
            auto [it, fresh] = seen->dirs.emplace(id, p);
            if (!fresh) {
                seen->notes.push_back("skipping folder '" + p + "': the same folder as '" + it->second +
                                      "' (reached again through a link), whose files are read once");
                continue;
            }
            walk(p, out, seen);
        } else if (S_ISREG(st.st_mode)) {
            out->push_back({p, id, link});
        }
    }
}

} // namespace

bool ends_with(const std::string & s, const std::string & suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string not_a_file(const std::string & p) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return "'" + p + "': no such file";
    return S_ISDIR(st.st_mode) ? "'" + p + "' is a folder, not a file" : "'" + p + "' is not a regular file (" + file_kind(st.st_mode) + ")";
}

std::string file_kind(unsigned mode) { return oomb::file_kind_name(mode); }

std::string not_a_file_or_folder(const std::string & p) {
    struct stat st;
    if (stat(p.c_str(), &st) != 0) return "'" + p + "': no such file or folder";
    return "'" + p + "' is not a regular file or folder (" + file_kind(st.st_mode) + ")";
}

void data_exclude_folder(const std::string & dir) { g_excluded_folders.push_back(dir); }

bool list_files(const std::string & path, std::vector<std::string> * out, std::string * err, const std::vector<std::string> & folder_exts,
                std::vector<std::string> * skipped) {
    if (is_file(path)) { out->push_back(path); return true; }
    if (!is_dir(path)) {
        if (err) *err = not_a_file_or_folder(path);
        return false;
    }
    std::vector<WalkFile> all;
    WalkSeen seen;
    struct stat st;
    if (stat(path.c_str(), &st) == 0) {
        if (const std::string x = excluded_folder(st); !x.empty()) {
            if (err) *err = "folder '" + path + "' is the run's output folder (--out " + x + "): its log and checkpoints are not training data; " +
                            "give the data another folder, or --out another one";
            return false;
        }
        seen.dirs.emplace(std::make_pair(st.st_dev, st.st_ino), path);
    }
    walk(path, &all, &seen);
    if (all.empty()) {
        for (const std::string & n : seen.notes) printf("note: %s\n", n.c_str());
        if (err) *err = "folder '" + path + "' holds no file";
        return false;
    }
    std::string names;  // the accepted extensions, for messages
    for (const auto & e : folder_exts) names += (names.empty() ? "" : " or ") + e;
    std::vector<const WalkFile *> accepted;
    for (const auto & f : all) {
        bool ok = folder_exts.empty();
        for (const auto & e : folder_exts) ok |= f.path.size() > e.size() && ends_with(f.path, e);
        if (ok) accepted.push_back(&f);
        else if (skipped) skipped->push_back(f.path);
    }
    // per file (device + inode): its real names, or else its first link, in sorted order
    std::map<std::pair<dev_t, ino_t>, std::pair<bool, std::string>> kept;  // -> (a real name seen, the path kept)
    for (const WalkFile * f : accepted) {
        auto [it, fresh] = kept.emplace(f->id, std::make_pair(!f->link, f->path));
        if (!fresh && !f->link && !it->second.first) it->second = {true, f->path};
    }
    const size_t n0 = out->size();
    for (const WalkFile * f : accepted) {
        const auto & k = kept.at(f->id);
        if (!f->link || (!k.first && k.second == f->path)) {
            out->push_back(f->path);
        } else {
            seen.notes.push_back("skipping '" + f->path + "': the same file as '" + k.second + "' (reached again through a link), read once");
        }
    }
    for (const std::string & n : seen.notes) printf("note: %s\n", n.c_str());
    if (!seen.notes.empty()) fflush(stdout);
    if (out->size() == n0) {
        if (err) *err = "folder '" + path + "' holds no " + names + " file (" + std::to_string(all.size()) + " other file(s), e.g. '" + all[0].path + "')";
        return false;
    }
    return true;
}

bool read_text_file(const std::string & path, std::string * out, std::string * err) {
    out->clear();
    if (!is_file(path)) {
        if (err) *err = not_a_file(path);
        return false;
    }
    const bool gz = path.size() > 3 && ends_with(path, ".gz");
    if (!gz) {
        FILE * f = fopen(path.c_str(), "rb");
        if (!f) {
            if (err) *err = "cannot open '" + path + "': " + strerror(errno);
            return false;
        }
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
        const bool bad = ferror(f);
        fclose(f);
        if (bad) {
            if (err) *err = "error reading '" + path + "'";
            return false;
        }
        return true;
    }
    // A ".gz" name must hold gzip data (magic 1f 8b): zlib would otherwise pass other bytes through.
    {
        FILE * m = fopen(path.c_str(), "rb");
        if (!m) {
            if (err) *err = "cannot open '" + path + "': " + strerror(errno);
            return false;
        }
        unsigned char mg[2] = {0, 0};
        const size_t nm = fread(mg, 1, 2, m);
        fclose(m);
        if (nm < 2 || mg[0] != 0x1f || mg[1] != 0x8b) {
            if (err) *err = "'" + path + "': corrupt gzip file (the name ends in .gz but the file does not start with the gzip magic bytes)";
            return false;
        }
    }
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) {
        if (err) *err = "cannot open '" + path + "'";
        return false;
    }
    gzbuffer(f, 1 << 17);
    std::vector<char> buf(1 << 17);
    auto gz_fail = [&](const char * what) {
        int e = 0;
        const char * m = gzerror(f, &e);
        if (err) *err = "'" + path + "': " + what + " gzip file (" + (m && *m ? m : "unexpected end of file") + ")";
        gzclose(f);
        out->clear();
        return false;
    };
    for (;;) {
        const int n = gzread(f, buf.data(), (unsigned) buf.size());
        if (n < 0) return gz_fail("corrupt");
        if (n == 0) break;
        out->append(buf.data(), (size_t) n);
    }
    int zerr = Z_OK;
    gzerror(f, &zerr);
    // A stream that breaks off (truncated file) reads as end-of-file with Z_BUF_ERROR.
    if (zerr == Z_BUF_ERROR) return gz_fail("truncated");
    if (zerr != Z_OK) return gz_fail("corrupt");
    const int rc = gzclose(f);
    if (rc != Z_OK) {
        if (err) *err = "'" + path + "': " + (rc == Z_BUF_ERROR ? "truncated" : "corrupt") + " gzip file (the compressed stream ends early)";
        out->clear();
        return false;
    }
    return true;
}

std::string not_text_reason(const std::string & text) {
    // the whole text, in one pass (a check of its start alone trained on NUL bytes or broken UTF-8 further on);
    // 8 ASCII bytes at a time where no byte has its high bit set and none is 0
    const unsigned char * p = (const unsigned char *) text.data();
    const size_t n = text.size();
    for (size_t i = 0; i < n;) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            const bool high = (w & 0x8080808080808080ull) != 0, zero = ((w - 0x0101010101010101ull) & ~w & 0x8080808080808080ull) != 0;
            if (!high && !zero) { i += 8; continue; }
        }
        const unsigned char c = p[i];
        if (c == 0) return "a NUL byte at offset " + std::to_string(i);
        const int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        if (len == 0 || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4) || i + len > n) return "invalid UTF-8 at offset " + std::to_string(i);
        for (int k = 1; k < len; k++)
            if ((p[i + k] & 0xc0) != 0x80) return "invalid UTF-8 at offset " + std::to_string(i);
        i += len;
    }
    return "";
}

bool tokenize_paths(const Tokenizer & tok, const std::vector<std::string> & paths, int32_t eos, int n_threads,
                    std::vector<int32_t> * ids, size_t * n_bytes, std::string * err) {
    std::vector<std::string> files;
    std::vector<char> explicit_file;
    for (const auto & p : paths) {
        if (!list_files(p, &files, err)) return false;
        explicit_file.resize(files.size(), is_file(p) ? 1 : 0);
    }
    size_t n_skipped = 0;
    static const std::string sep = "<|endoftext|>";
    size_t total = 0;
    for (size_t fi = 0; fi < files.size(); fi++) {
        const std::string & f = files[fi];
        std::string text;
        if (!read_text_file(files[fi], &text, err)) return false;
        const std::string why = not_text_reason(text);
        if (!why.empty()) {
            if (explicit_file[fi]) {
                if (err) *err = "'" + f + "' is not a text file (" + why + ")";
                return false;
            }
            printf("note: skipping '%s': not a text file (%s)\n", f.c_str(), why.c_str());
            n_skipped++;
            continue;
        }
        total += text.size();
        std::vector<std::string_view> docs;
        std::string_view sv(text);
        size_t b = 0;
        for (;;) {
            const size_t e = sv.find(sep, b);
            if (e == std::string_view::npos) { docs.push_back(sv.substr(b)); break; }
            docs.push_back(sv.substr(b, e - b));
            b = e + sep.size();
        }
        // A trailing separator does not start an empty document.
        if (docs.size() > 1 && docs.back().empty()) docs.pop_back();
        std::vector<std::vector<int32_t>> out(docs.size());
        std::atomic<size_t> next{0};
        std::atomic<bool> failed{false};
        std::string first_err;
        auto work = [&]() {
            for (;;) {
                const size_t i = next.fetch_add(1);
                if (i >= docs.size()) return;
                std::string e;
                if (tok.encode(docs[i], &out[i], &e, true) != GGUF_OK) {
                    if (!failed.exchange(true)) first_err = f + ": " + e;
                    return;
                }
            }
        };
        const int nt = std::max(1, std::min<int>(n_threads, (int) docs.size()));
        std::vector<std::thread> th;
        for (int t = 1; t < nt; t++) th.emplace_back(work);
        work();
        for (auto & t : th) t.join();
        if (failed) {
            if (err) *err = first_err;
            return false;
        }
        for (const auto & d : out) {
            ids->insert(ids->end(), d.begin(), d.end());
            ids->push_back(eos);
        }
    }
    if (n_skipped) {
        printf("note: skipped %zu non-text file(s) of %zu\n", n_skipped, files.size());
        if (n_skipped == files.size()) {
            if (err) *err = "no text file among the " + std::to_string(files.size()) + " file(s) given";
            return false;
        }
    }
    fflush(stdout);
    if (n_bytes) *n_bytes = total;
    return true;
}

ModelTokenizer load_model_tokenizer(const std::string & gguf, Tokenizer * tok, std::string * err) {
    std::string e;
    const gguf_status st = tok->load_file(gguf, &e);
    if (st == GGUF_OK) return ModelTokenizer::Loaded;
    if (st == GGUF_ERR_NOT_FOUND && e.find("tokenizer.ggml.model") != std::string::npos) return ModelTokenizer::Absent;
    *err = e;
    return ModelTokenizer::Failed;
}

bool read_ids_bin(const std::string & path, int64_t n_vocab, std::vector<int32_t> * ids, std::string * err) {
    if (!is_file(path)) {
        if (err) *err = not_a_file(path);
        return false;
    }
    FILE * f = fopen(path.c_str(), "rb");
    if (!f) {
        if (err) *err = "cannot open '" + path + "': " + strerror(errno);
        return false;
    }
    fseek(f, 0, SEEK_END);
    const long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (sz < 0 || sz % 4 != 0) {
        fclose(f);
        if (err) *err = "'" + path + "': size " + std::to_string(sz) + " bytes is not a multiple of 4 (little-endian uint32 ids expected)";
        return false;
    }
    std::vector<uint32_t> v((size_t) sz / 4);
    const size_t got = fread(v.data(), 4, v.size(), f);
    fclose(f);
    if (got != v.size()) {
        if (err) *err = "error reading '" + path + "'";
        return false;
    }
    const size_t n0 = ids->size();
    ids->reserve(n0 + v.size());
    for (size_t i = 0; i < v.size(); i++) {
        if ((int64_t) v[i] >= n_vocab) {
            if (err) *err = "'" + path + "': token id " + std::to_string(v[i]) + " at position " + std::to_string(i) +
                            " is outside the model's vocabulary (" + std::to_string(n_vocab) + " entries)";
            ids->resize(n0);
            return false;
        }
        ids->push_back((int32_t) v[i]);
    }
    return true;
}

uint64_t hash64(const void * data, size_t n, uint64_t h) {
    const uint8_t * p = (const uint8_t *) data;
    const uint64_t prime = 0x100000001b3ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * prime;
        h ^= h >> 29;
    }
    for (; i < n; i++) h = (h ^ p[i]) * prime;
    return h;
}

std::string hex64(uint64_t h) {
    char b[32];
    snprintf(b, sizeof(b), "%016llx", (unsigned long long) h);
    return b;
}

size_t rss_bytes() {
    FILE * f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, res = 0;
    const int n = fscanf(f, "%lu %lu", &size, &res);
    fclose(f);
    if (n != 2) return 0;
    return (size_t) res * (size_t) sysconf(_SC_PAGESIZE);
}

std::string fmt_bytes(double b) {
    const char * u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) { b /= 1024.0; i++; }
    char s[32];
    snprintf(s, sizeof(s), i == 0 ? "%.0f %s" : "%.2f %s", b, u[i]);
    return s;
}

std::string gpu_memory_field(oomb_backend_t be) {
    size_t used = 0, total = 0;
    if (!oomb_backend_memory(be, &used, &total)) return "";
    return " | GPU " + fmt_bytes((double) used) + " of " + fmt_bytes((double) total);
}

std::string fmt_duration(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    const long t = (long) std::llround(s);
    char b[32];
    if (t >= 3600) snprintf(b, sizeof(b), "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(b, sizeof(b), "%ldm%02lds", t / 60, t % 60);
    else snprintf(b, sizeof(b), "%lds", t);
    return b;
}

oomb_backend_t make_backend(const std::string & device, int n_threads, std::string * err) {
    if (device == "cpu") return oomb_backend_cpu_init(n_threads);
    if (device == "cuda") {
        oomb_backend_t b = oomb_backend_cuda_init(0);
        if (!b && err) *err = "CUDA backend not available in this build / no GPU";
        return b;
    }
    if (err) *err = "unknown device '" + device + "' (choose cpu or cuda)";
    return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Loss-curve PNG
// ---------------------------------------------------------------------------------------------

namespace {

struct Image {
    int w, h;
    std::vector<uint8_t> px;
    Image(int w_, int h_) : w(w_), h(h_), px((size_t) w_ * h_ * 3, 255) {}
    void set(int x, int y, const uint8_t c[3]) {
        if (x < 0 || y < 0 || x >= w || y >= h) return;
        uint8_t * p = &px[((size_t) y * w + x) * 3];
        p[0] = c[0]; p[1] = c[1]; p[2] = c[2];
    }
    void rect(int x0, int y0, int x1, int y1, const uint8_t c[3]) {
        for (int y = std::max(0, y0); y < std::min(h, y1); y++)
            for (int x = std::max(0, x0); x < std::min(w, x1); x++) set(x, y, c);
    }
    void line(int x0, int y0, int x1, int y1, const uint8_t c[3], int thick = 1) {
        int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
        int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
        int e = dx + dy;
        for (;;) {
            rect(x0 - thick / 2, y0 - thick / 2, x0 - thick / 2 + thick, y0 - thick / 2 + thick, c);
            if (x0 == x1 && y0 == y1) break;
            const int e2 = 2 * e;
            if (e2 >= dy) { e += dy; x0 += sx; }
            if (e2 <= dx) { e += dx; y0 += sy; }
        }
    }
    // Text with stb_easy_font (quads), scaled by `s`; (x, y) is the top-left corner.
    void text(int x, int y, const std::string & t, const uint8_t c[3], int s = 2) {
        static char buf[60000];
        unsigned char col[4] = {0, 0, 0, 255};
        const int nq = stb_easy_font_print(0, 0, (char *) t.c_str(), col, buf, sizeof(buf));
        for (int q = 0; q < nq; q++) {
            const float * v = (const float *) (buf + q * 4 * 16);
            const float qx0 = v[0], qy0 = v[1];
            const float qx1 = ((const float *) (buf + q * 64 + 32))[0], qy1 = ((const float *) (buf + q * 64 + 32))[1];
            rect(x + (int) std::lround(qx0 * s), y + (int) std::lround(qy0 * s), x + (int) std::lround(qx1 * s),
                 y + (int) std::lround(qy1 * s), c);
        }
    }
    static int text_width(const std::string & t, int s = 2) { return stb_easy_font_width((char *) t.c_str()) * s; }
};

// "Nice" tick step for a range.
double nice_step(double range, int n) {
    if (!(range > 0)) return 1;
    const double raw = range / n;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

std::string tick_label(double v, double step) {
    char b[32];
    if (step >= 1) snprintf(b, sizeof(b), "%.0f", v);
    else if (step >= 0.1) snprintf(b, sizeof(b), "%.1f", v);
    else if (step >= 0.01) snprintf(b, sizeof(b), "%.2f", v);
    else snprintf(b, sizeof(b), "%.3g", v);
    return b;
}

} // namespace

bool write_loss_png(const std::string & path, const std::vector<CurvePoint> & train, const std::vector<CurvePoint> & eval,
                    const std::string & title, std::string * err) {
    const int W = 960, H = 600, L = 90, R = 30, T = 50, B = 70;
    Image img(W, H);
    const uint8_t black[3] = {0, 0, 0}, grey[3] = {225, 225, 225}, blue[3] = {31, 119, 180}, red[3] = {214, 39, 40};
    double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
    for (const auto * v : {&train, &eval})
        for (const auto & p : *v) {
            if (!std::isfinite(p.loss)) continue;
            x1 = std::max(x1, p.step);
            y0 = std::min(y0, p.loss);
            y1 = std::max(y1, p.loss);
        }
    if (!std::isfinite(y0)) { y0 = 0; y1 = 1; }
    if (y1 - y0 < 1e-6) { y0 -= 0.5; y1 += 0.5; }
    const double ystep = nice_step(y1 - y0, 6);
    y0 = std::floor(y0 / ystep) * ystep;
    y1 = std::ceil(y1 / ystep) * ystep;
    const double xstep = std::max(1.0, std::round(nice_step(x1 - x0, 8)));   // steps are integers
    x1 = std::ceil(x1 / xstep) * xstep;
    const int pw = W - L - R, ph = H - T - B;
    auto X = [&](double x) { return L + (int) std::lround((x - x0) / (x1 - x0) * pw); };
    auto Y = [&](double y) { return T + ph - (int) std::lround((y - y0) / (y1 - y0) * ph); };
    // grid, ticks and labels
    for (double y = y0; y <= y1 + ystep * 1e-6; y += ystep) {
        const int py = Y(y);
        img.line(L, py, L + pw, py, grey);
        img.line(L - 6, py, L, py, black);
        const std::string s = tick_label(y, ystep);
        img.text(L - 10 - Image::text_width(s), py - 6, s, black);
    }
    for (double x = x0; x <= x1 + xstep * 1e-6; x += xstep) {
        const int px = X(x);
        img.line(px, T, px, T + ph, grey);
        img.line(px, T + ph, px, T + ph + 6, black);
        const std::string s = tick_label(x, xstep);
        img.text(px - Image::text_width(s) / 2, T + ph + 12, s, black);
    }
    img.line(L, T, L, T + ph, black, 2);
    img.line(L, T + ph, L + pw, T + ph, black, 2);
    img.text(L + pw / 2 - Image::text_width("step") / 2, H - 28, "step", black);
    img.text(10, T - 30, "loss", black);
    img.text(L + pw / 2 - Image::text_width(title) / 2, 12, title, black);
    // curves
    bool have = false;
    int px = 0, py = 0;
    for (const auto & p : train) {
        if (!std::isfinite(p.loss)) { have = false; continue; }
        const int x = X(p.step), y = Y(p.loss);
        if (have) img.line(px, py, x, y, blue, 2);
        else img.rect(x - 1, y - 1, x + 2, y + 2, blue);
        px = x; py = y; have = true;
    }
    for (const auto & p : eval) {
        if (!std::isfinite(p.loss)) continue;
        const int x = X(p.step), y = Y(p.loss);
        img.rect(x - 4, y - 4, x + 5, y + 5, red);
    }
    // legend
    const int lx = L + pw - 170, ly = T + 12;
    img.line(lx, ly + 6, lx + 30, ly + 6, blue, 2);
    img.text(lx + 40, ly, "train loss", black);
    bool have_eval = false;
    for (const auto & p : eval) have_eval |= std::isfinite(p.loss) != 0;
    if (have_eval) {
        img.rect(lx + 11, ly + 26, lx + 20, ly + 35, red);
        img.text(lx + 40, ly + 24, "eval loss", black);
    }

    // encoded in memory, then written with every write checked (stbi_write_png ignores fwrite's errors: a full disk
    // left a truncated file and reported success)
    std::string png;
    auto append = [](void * ctx, void * data, int size) { ((std::string *) ctx)->append((const char *) data, (size_t) size); };
    if (!stbi_write_png_to_func(append, &png, W, H, 3, img.px.data(), W * 3)) {
        if (err) *err = "cannot encode the PNG image";
        return false;
    }
    return write_file_atomic(path, png, err);
}

bool write_file_atomic(const std::string & path_in, const std::string & data, std::string * err) {
    std::string path;  // (a symbolic link: the file it names is replaced)
    bool special = false;
    if (const std::string e = output_target(path_in, true, &path, &special); !e.empty()) {
        if (err) *err = e;
        return false;
    }
    auto write_all = [&](int fd, const std::string & name) {
        for (size_t off = 0; off < data.size();) {
            const ssize_t n = write(fd, data.data() + off, data.size() - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                if (err) *err = "cannot write " + name + ": " + strerror(n < 0 ? errno : ENOSPC);
                return false;
            }
            off += (size_t) n;
        }
        return true;
    };
    if (special) {  // a device (/dev/stdout) or a FIFO: written in place (a rename would replace the node)
        const int fd = open(path.c_str(), O_WRONLY);
        if (fd < 0) {
            if (err) *err = "cannot write " + path_in + ": " + strerror(errno);
            return false;
        }
        const bool ok = write_all(fd, path_in);
        close(fd);
        return ok;
    }
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        if (err) *err = temp_file_create_error(path, tmp, errno);
        return false;
    }
    bool ok = write_all(fd, path);
    if (ok && fsync(fd) != 0 && errno != EINVAL) {  // (EINVAL: a file system without fsync)
        if (err) *err = "cannot write " + path + ": " + strerror(errno);
        ok = false;
    }
    if (close(fd) != 0 && ok) {
        if (err) *err = "cannot write " + path + ": " + strerror(errno);
        ok = false;
    }
    if (!ok) {
        unlink(tmp.c_str());
        return false;
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        if (err) *err = "cannot write " + path + " (renaming its temporary file " + tmp + "): " + strerror(errno);
        unlink(tmp.c_str());
        return false;
    }
    return true;
}

} // namespace train
} // namespace oomb
