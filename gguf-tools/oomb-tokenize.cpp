// oomb-tokenize: tokenizes a file with the tokenizer of a GGUF model (or vocab-only) file.
//
//   oomb-tokenize -m MODEL.gguf -f TEXT_FILE           ids of the file's exact bytes, space separated
//   oomb-tokenize -m MODEL.gguf -f IDS_FILE --decode   the exact bytes of space separated ids
//   oomb-tokenize -m MODEL.gguf -f CASES.jsonl --jsonl one line of ids per JSON line ({"text": ...}
//                                                      objects or JSON strings; a blank line gives an empty
//                                                      one), for batch checks
// Added/special tokens written in the text (<|im_start|>, ...) are matched as whole tokens, as HF
// does, unless --no-special is given. --stats reports the encoding speed on stderr (the time
// spent encoding only, not loading or printing); --threads N encodes --jsonl lines in parallel.
// Any byte-level BPE GGUF whose tokenizer.ggml.pre the tokenizer supports works (qwen2, smollm,
// gpt-2, llama-bpe; see tokenizer.h). Input bytes the vocabulary has no token for (SmolLM2 has none
// for a few control bytes and for 0xf1-0xff) are left out, as HF does, with a warning on stderr
// that counts them: only then does --decode of the ids not give the input back.
#include "tokenizer.h"
#include "oomb-backend.h"

#include <CLI/CLI.hpp>
#include "tool-cli.h"
#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

using namespace oomb;

namespace {

bool read_file(const std::string& path, std::string* out, std::string* err) {
    FILE* f = path == "-" ? stdin : fopen(path.c_str(), "rb");
    if (!f) { *err = path + ": cannot open: " + strerror(errno); return false; }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { // fopen opens directories; reading fails
        if (f != stdin) fclose(f);
        *err = path + ": is a directory, not a file";
        return false;
    }
    char buf[1 << 16];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, k);
    const int saved = errno;
    const bool bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad) { *err = path + ": read error: " + strerror(saved); return false; }
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
    bool decode = false, jsonl = false, no_special = false, stats = false;
    int threads = 1;
    app.add_option("-m,--model", model, "GGUF file with tokenizer.ggml.* metadata (model or vocab-only)")->required();
    app.add_option("-f,--file", file, "input file ('-' for stdin): text, or ids with --decode")->required();
    CLI::Option* decode_opt = app.add_flag("--decode", decode, "read space-separated ids and write their exact text bytes");
    CLI::Option* jsonl_opt = app.add_flag("--jsonl", jsonl, "input holds one JSON string or {\"text\": ...} object per line (a blank "
                                                            "line: an empty one); print one line of ids per line")
        ->excludes(decode_opt);  // --decode reads ids, not JSON lines: never one of them ignored silently
    app.add_flag("--no-special", no_special, "tokenize added/special token text as plain text");
    app.add_flag("--stats", stats, "print bytes, tokens and encoding speed (MB/s) to stderr");
    app.add_option("-t,--threads", threads, "with --jsonl: encode lines on this many threads (default 1)")
        ->check(CLI::Range(1, OOMB_CPU_MAX_THREADS))  // the CPU backend's cap, as the other tools
        ->needs(jsonl_opt);                           // (one text is encoded on one thread: not ignored silently)
    OOMB_TOOL_PARSE(app, argc, argv);

    auto fail = [](const std::string& m) {
        fprintf(stderr, "oomb-tokenize: error: %s\n", m.c_str());
        return 1;
    };
    std::string err, input;
    Tokenizer tok;
    using clock = std::chrono::steady_clock;
    const auto t_load = clock::now();
    if (tok.load_file(model, &err)) return fail(err);
    const double load_s = std::chrono::duration<double>(clock::now() - t_load).count();
    size_t n_bytes = 0, n_tokens = 0, n_dropped = 0;
    double enc_s = 0;
    if (!read_file(file, &input, &err)) return fail(err);

    std::string out;
    if (decode) {
        std::vector<int32_t> ids;
        const char* p = input.c_str();
        const char* end = p + input.size();
        // Ids are plain decimal numbers: digits only (no sign, no "0x"), separated by white space.
        while (true) {
            while (p < end && isspace((unsigned char)*p)) p++;
            if (p >= end) break;
            const char* q = p;
            while (q < end && !isspace((unsigned char)*q)) q++;
            const std::string word(p, (size_t)(q - p));
            const std::string at = file + ": byte " + std::to_string(p - input.c_str()) + ": ";
            const std::string shown = "'" + word.substr(0, 40) + (word.size() > 40 ? "...'" : "'");
            if (word.find_first_not_of("0123456789") != std::string::npos)
                return fail(at + "not a token id: " + shown + " (ids are non-negative decimal integers)");
            if (word.size() > 10 || std::stoll(word) > INT32_MAX)
                return fail(at + "token id " + shown + " is out of range");
            ids.push_back((int32_t)std::stoll(word));
            p = q;
        }
        if (tok.decode(ids.data(), ids.size(), &out, &err)) return fail(err);
    } else if (jsonl) {
        std::vector<std::string> texts;
        size_t start = 0, line_no = 0;
        while (start < input.size()) {
            size_t nl = input.find('\n', start);
            if (nl == std::string::npos) nl = input.size();
            const std::string line = input.substr(start, nl - start);
            start = nl + 1;
            line_no++;
            if (line.find_first_not_of(" \t\r") == std::string::npos) {  // an empty line of ids: output line N is input line N
                texts.emplace_back();
                continue;
            }
            nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_string()) texts.push_back(j.get<std::string>());
            else if (j.is_object() && j.contains("text") && j["text"].is_string()) texts.push_back(j["text"].get<std::string>());
            else return fail(file + ":" + std::to_string(line_no) + ": not a JSON string or {\"text\": ...} object");
        }
        std::vector<std::vector<int32_t>> ids(texts.size());
        std::vector<size_t> dropped(texts.size(), 0);
        std::vector<std::string> errs((size_t)threads);
        std::atomic<size_t> next{0};
        auto work = [&](int k) {
            for (size_t i; (i = next.fetch_add(1)) < texts.size();)
                if (tok.encode(texts[i], &ids[i], &errs[(size_t)k], !no_special, &dropped[i])) return;
        };
        const auto t0 = clock::now();
        std::vector<std::thread> pool;
        for (int k = 1; k < threads; k++) pool.emplace_back(work, k);
        work(0);
        for (auto& th : pool) th.join();
        enc_s = std::chrono::duration<double>(clock::now() - t0).count();
        for (auto& e : errs) if (!e.empty()) return fail(e);
        for (size_t i = 0; i < texts.size(); i++) {
            n_bytes += texts[i].size();
            n_tokens += ids[i].size();
            n_dropped += dropped[i];
            print_ids(ids[i], out);
        }
    } else {
        std::vector<int32_t> ids;
        const auto t0 = clock::now();
        if (tok.encode(input, &ids, &err, !no_special, &n_dropped)) return fail(err);
        enc_s = std::chrono::duration<double>(clock::now() - t0).count();
        n_bytes = input.size();
        n_tokens = ids.size();
        print_ids(ids, out);
    }
    if (n_dropped)
        fprintf(stderr, "oomb-tokenize: warning: %zu input byte(s) have no token in %s's vocabulary and were left out "
                        "(as HF tokenizers does); decoding the ids does not give them back\n", n_dropped, model.c_str());
    if (stats && !decode)
        fprintf(stderr, "oomb-tokenize: %zu bytes -> %zu tokens in %.3f s on %d thread(s): %.2f MB/s (tokenizer load %.3f s, "
                        "pre-tokenizer %s%s)\n",
                n_bytes, n_tokens, enc_s, jsonl ? threads : 1, enc_s > 0 ? n_bytes / enc_s / 1e6 : 0.0, load_s,
                tok.pre().c_str(), tok.pre_from_file() ? "" : ", assumed: no tokenizer.ggml.pre");
    if (fwrite(out.data(), 1, out.size(), stdout) != out.size() || fflush(stdout) != 0)
        return fail(std::string("cannot write output: ") + strerror(errno));
    return 0;
}
