// Command-line parsing of the gguf-tools (and the bench programs): CLI11_PARSE with the project's
// exit codes (--help: 0, a bad option or value: 1 with CLI11's message; CLI11's own codes are 100
// and up); checks of the output path (not a folder, not one of the inputs, room on its file system);
// and the clean-up of an earlier killed write of the tool's output file.
#pragma once

#include "gguf.h"

#include <CLI/CLI.hpp>

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace oomb {
namespace tools {

// A run killed by SIGKILL (no signal handler runs) leaves OUT.tmp.<pid> beside out_path: removes
// those whose process is gone (remove_orphan_temp_files), with a note on stderr naming each.
inline void remove_orphan_outputs(const char * prog, const std::string & out_path) {
    if (out_path.empty() || out_path.back() == '/') return;  // no file name (the tools refuse it: output_path_error)
    const size_t sl = out_path.rfind('/');
    const std::string dir = sl == std::string::npos ? "." : sl == 0 ? "/" : out_path.substr(0, sl);
    for (const std::string & p : remove_orphan_temp_files(dir, {out_path.substr(sl == std::string::npos ? 0 : sl + 1)}))
        fprintf(stderr, "%s: note: removed %s, left by an interrupted write of process %s (no longer running)\n", prog, p.c_str(),
                p.substr(p.rfind(".tmp.") + 5).c_str());
}

// "" when out_path can name the output file, else why not (empty, ending in '/', an existing folder); opt names the
// option in the message.
inline std::string output_path_error(const std::string & out_path, const std::string & opt = "-o/--output") {
    if (out_path.empty()) return opt + " is empty";
    if (out_path.back() == '/') return opt + " " + out_path + " ends in '/': give the output file's path, not a folder";
    if (struct stat st; stat(out_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        return opt + " " + out_path + " is a directory: give the output file's path";
    return "";
}

// True when a and b both exist and are the same file: the same device and inode, so also through
// another spelling of the path, a symbolic link or a hard link.
inline bool same_file(const std::string & a, const std::string & b) {
    struct stat sa, sb;
    return !a.empty() && !b.empty() && stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

// "" when the output `out_path` (given to option `opt`) is none of `inputs`, else the error naming
// the input. The outputs are written to OUT.tmp.<pid> and renamed over OUT at the end, so an output
// naming an input would silently replace it (also when the input is still being read).
inline std::string output_is_input_error(const std::string & opt, const std::string & out_path,
                                         const std::vector<std::string> & inputs) {
    for (const std::string & in : inputs)
        if (same_file(out_path, in))
            return opt + " " + out_path + " is the input " + in + ": write the result to another file";
    return "";
}

// "" when the file system of out_path has room for `bytes` more (statvfs: the blocks an unprivileged
// writer may use), else the error. A file system that cannot be asked is not refused (the write
// itself then reports a full disk).
inline std::string disk_space_error(const std::string & out_path, uint64_t bytes) {
    const size_t sl = out_path.rfind('/');
    const std::string dir = sl == std::string::npos ? "." : sl == 0 ? "/" : out_path.substr(0, sl);
    struct statvfs fs;
    if (statvfs(dir.c_str(), &fs) != 0) return "";
    const uint64_t avail = (uint64_t) fs.f_bavail * (uint64_t) fs.f_frsize;
    if (bytes <= avail) return "";
    char b[256];
    snprintf(b, sizeof b, "%s needs %.2f GB but its file system (%s) has %.2f GB free", out_path.c_str(), bytes / 1e9,
             dir.c_str(), avail / 1e9);
    return b;
}

// The exit status of a tool whose result went to stdout: 0 when everything printed reached it, else 1 with
// "PROG: error: cannot write output: REASON" (a full disk, a closed pipe, a file-size limit: the output is
// incomplete, which an exit status of 0 would hide).
inline int finish_stdout(const char * prog) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    const int e = errno;
    fprintf(stderr, "%s: error: cannot write output: %s\n", prog, e ? strerror(e) : "write error");
    return 1;
}

// Checks every option value of app as a string before CLI11 converts it: an empty value is an error (not "the
// default"), and a whole-number option takes only a decimal whole number in the range of its type (CLI11 would
// saturate 1e20 or 2^63 into an int64, wrap -1 into an unsigned option, and read 0x10 as hex). Call it after the
// options are added, before parsing (OOMB_TOOL_PARSE and oomb-train's parser do).
inline void add_strict_value_checks(CLI::App & app) {
    for (CLI::Option * opt : app.get_options()) {
        if (opt->get_type_size() == 0) continue;  // a flag
        const std::string tn = opt->get_type_name();
        opt->check(CLI::Validator(
            [tn](std::string & v) -> std::string {
                if (v.empty()) return "an empty value";
                if (tn == "INT" || tn == "UINT") {
                    const char * b = v.data(), * e = v.data() + v.size();
                    bool ok;
                    if (tn == "UINT") {
                        uint64_t x;
                        const auto r = std::from_chars(b, e, x);
                        ok = r.ec == std::errc() && r.ptr == e;
                    } else {
                        int64_t x;
                        const auto r = std::from_chars(b, e, x);
                        ok = r.ec == std::errc() && r.ptr == e;
                    }
                    if (!ok) return "'" + v + "' is not a whole number" + (tn == "UINT" ? " >= 0" : "") + " in range";
                }
                return "";
            },
            "", "strict"));
    }
}

// The exit status of a failed parse (CLI11's message printed): 0 for --help, else 1. CLI11 checks
// the required options before the unexpected arguments, so a misspelt option (--ouput) would be
// reported as "--output is required": the unexpected arguments are named first.
inline int parse_error_exit(const CLI::App & app, const CLI::ParseError & e) {
    if (dynamic_cast<const CLI::RequiredError *>(&e) && !app.get_allow_extras() && !app.remaining().empty())
        return app.exit(CLI::ExtrasError(app.remaining())) == 0 ? 0 : 1;
    return app.exit(e) == 0 ? 0 : 1;
}

}  // namespace tools
}  // namespace oomb

#define OOMB_TOOL_PARSE(app, argc, argv)                           \
    do {                                                           \
        oomb::tools::add_strict_value_checks(app);                 \
        try {                                                      \
            (app).parse((argc), (argv));                           \
        } catch (const CLI::ParseError & e_) {                     \
            return oomb::tools::parse_error_exit((app), e_);       \
        }                                                          \
    } while (0)
