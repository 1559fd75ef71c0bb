// Command-line parsing of the gguf-tools: CLI11_PARSE with the project's exit codes (--help: 0,
// a bad option or value: 1 with CLI11's message; CLI11's own codes are 100 and up); and the clean-up
// of an earlier killed write of the tool's output file.
#pragma once

#include "gguf.h"

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cstdio>
#include <string>

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

// "" when out_path can name the output file, else why not (empty, ending in '/', an existing folder).
inline std::string output_path_error(const std::string & out_path) {
    if (out_path.empty()) return "-o/--output is empty";
    if (out_path.back() == '/') return "-o/--output " + out_path + " ends in '/': give the output file's path, not a folder";
    if (struct stat st; stat(out_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        return "-o/--output " + out_path + " is a directory: give the output file's path";
    return "";
}

}  // namespace tools
}  // namespace oomb

#define OOMB_TOOL_PARSE(app, argc, argv)                        \
    do {                                                        \
        try {                                                   \
            (app).parse((argc), (argv));                        \
        } catch (const CLI::ParseError & e_) {                  \
            return (app).exit(e_) == 0 ? 0 : 1;                 \
        }                                                       \
    } while (0)
