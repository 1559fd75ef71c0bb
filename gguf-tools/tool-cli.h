// Command-line parsing of the gguf-tools: CLI11_PARSE with the project's exit codes (--help: 0,
// a bad option or value: 1 with CLI11's message; CLI11's own codes are 100 and up).
#pragma once

#include <CLI/CLI.hpp>

#define OOMB_TOOL_PARSE(app, argc, argv)                        \
    do {                                                        \
        try {                                                   \
            (app).parse((argc), (argv));                        \
        } catch (const CLI::ParseError & e_) {                  \
            return (app).exit(e_) == 0 ? 0 : 1;                 \
        }                                                       \
    } while (0)
