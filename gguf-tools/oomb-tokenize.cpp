// oomb-tokenize: tokenizes a file with the tokenizer of a GGUF model (or vocab-only) file.
//
//   oomb-tokenize -m MODEL.gguf -f TEXT_FILE           ids of the file's exact bytes, space separated
//   oomb-tokenize -m MODEL.gguf -f IDS_FILE --decode   the exact bytes of space separated ids
//   oomb-tokenize -m MODEL.gguf -f CASES.jsonl --jsonl one line of ids per JSON line ({"text": ...}
//                                                      objects or JSON strings), for batch checks
// Added/special tokens written in the text (<|im_start|>, ...) are matched as whole tokens, as HF
// does, unless --no-special is given.
#include "tokenizer.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace oomb;

namespace {

bool read_file(const std::string& path, std::string* out, std::string* err) {
    FILE* f = path == "-" ? stdin : fopen(path.c_str(), "rb");
    if (!f) { *err = path + ": cannot open: " + strerror(errno); return false; }
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, k);
    const bool bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad) { *err = path + ": read error"; return false; }
    return true;
}

void print_ids(const std::vector<int32_t>& ids, std::string& out) {
    for (size_t i = 0; i < ids.size(); i++) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
    }
    out += '\n';
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"Tokenize a file (or decode ids) with the tokenizer stored in a GGUF file."};
    std::string model, file;
    bool decode = false, jsonl = false, no_special = false;
    app.add_option("-m,--model", model, "GGUF file with tokenizer.ggml.* metadata (model or vocab-only)")->required();
    app.add_option("-f,--file", file, "input file ('-' for stdin): text, or ids with --decode")->required();
    app.add_flag("--decode", decode, "read space-separated ids and write their exact text bytes");
    app.add_flag("--jsonl", jsonl, "input holds one JSON string or {\"text\": ...} object per line; print one line of ids per line");
    app.add_flag("--no-special", no_special, "tokenize added/special token text as plain text");
    CLI11_PARSE(app, argc, argv);

    auto fail = [](const std::string& m) {
        fprintf(stderr, "oomb-tokenize: error: %s\n", m.c_str());
        return 1;
    };
    std::string err, input;
    Tokenizer tok;
    if (tok.load_file(model, &err)) return fail(err);
    if (!read_file(file, &input, &err)) return fail(err);

    std::string out;
    if (decode) {
        std::vector<int32_t> ids;
        const char* p = input.c_str();
        const char* end = p + input.size();
        while (true) {
            while (p < end && isspace((unsigned char)*p)) p++;
            if (p >= end) break;
            char* q;
            errno = 0;
            const long long v = strtoll(p, &q, 10);
            if (q == p || (q < end && !isspace((unsigned char)*q)) || errno == ERANGE || v < INT32_MIN || v > INT32_MAX)
                return fail(file + ": not a token id at byte " + std::to_string(p - input.c_str()) + ": '" +
                            std::string(p, std::min<size_t>(20, (size_t)(end - p))) + "'");
            ids.push_back((int32_t)v);
            p = q;
        }
        if (tok.decode(ids.data(), ids.size(), &out, &err)) return fail(err);
    } else if (jsonl) {
        size_t start = 0, line_no = 0;
        std::vector<int32_t> ids;
        while (start < input.size()) {
            size_t nl = input.find('\n', start);
            if (nl == std::string::npos) nl = input.size();
            const std::string line = input.substr(start, nl - start);
            start = nl + 1;
            line_no++;
            if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
            nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
            std::string text;
            if (j.is_string()) text = j.get<std::string>();
            else if (j.is_object() && j.contains("text") && j["text"].is_string()) text = j["text"].get<std::string>();
            else return fail(file + ":" + std::to_string(line_no) + ": not a JSON string or {\"text\": ...} object");
            ids.clear();
            if (tok.encode(text, &ids, &err, !no_special)) return fail(err);
            print_ids(ids, out);
        }
    } else {
        std::vector<int32_t> ids;
        if (tok.encode(input, &ids, &err, !no_special)) return fail(err);
        print_ids(ids, out);
    }
    if (fwrite(out.data(), 1, out.size(), stdout) != out.size() || fflush(stdout) != 0)
        return fail(std::string("cannot write output: ") + strerror(errno));
    return 0;
}
