// oomb-train's chat data (see train-chat.h).
#include "train-chat.h"
#include "train-common.h"

#include "gguf.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <regex>

namespace oomb {
namespace train {

namespace {

const char * PROG = TRAIN_PROG;
const char * IM_START = "<|im_start|>";
const char * IM_END = "<|im_end|>";

// The template with the two-character escape \n turned into a newline (templates write either).
std::string unescape_newlines(const std::string & s) {
    std::string r;
    r.reserve(s.size());
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
            r += '\n';
            i++;
        } else {
            r += s[i];
        }
    }
    return r;
}

} // namespace

bool chat_template_recognise(const std::string * tmpl, const std::string & source, ChatTemplate * t, std::string * err) {
    *t = ChatTemplate();
    if (!tmpl) {
        t->source = "no chat template (" + source + " has no tokenizer.chat_template): ChatML without a default system message";
        return true;
    }
    const std::string s = unescape_newlines(*tmpl);
    // the per-message expression of ChatML: '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'
    static const std::regex per_message(
        R"(['"]<\|im_start\|>['"]\s*\+\s*message(\[\s*['"]role['"]\s*\]|\.role)\s*\+\s*['"]\n['"]\s*\+\s*)"
        R"(message(\[\s*['"]content['"]\s*\]|\.content)\s*\+\s*['"]<\|im_end\|>(['"]\s*\+\s*['"])?\n['"])");
    if (!std::regex_search(s, per_message)) {
        const std::string first = tmpl->substr(0, std::min(tmpl->find('\n'), (size_t) 80));
        *err = source + ": tokenizer.chat_template is not ChatML (no '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n' in it), which is the only chat format oomb-train renders; the template begins '" + first +
               "' (" + std::to_string(tmpl->size()) + " characters, hash " + hex64(hash64(tmpl->data(), tmpl->size())) + ")";
        return false;
    }
    // the default system message: a whole system turn as one literal (SmolLM2, Qwen2, Qwen2.5)
    static const std::regex default_system(R"(['"]<\|im_start\|>system\n([^'"<]*)<\|im_end\|>\n['"])");
    std::smatch m;
    if (std::regex_search(s, m, default_system)) {
        t->has_default_system = true;
        t->default_system = m[1].str();
    }
    t->source = source + "'s tokenizer.chat_template (ChatML" +
                (t->has_default_system ? ", default system message \"" + t->default_system + "\")" : ", no default system message)");
    return true;
}

bool read_chat_template(const std::string & gguf_path, std::string * tmpl, bool * has, std::string * err) {
    GGUFReader r;
    GGUFReadOptions ro;
    if (r.open(gguf_path, err, ro) != GGUF_OK) return false;
    const GGUFValue * v = r.find("tokenizer.chat_template");
    *has = v != nullptr;
    if (!v) return true;
    if (v->type() != GGUF_TYPE_STRING) {
        *err = gguf_path + ": tokenizer.chat_template is not a string";
        return false;
    }
    *tmpl = v->str();
    return true;
}

bool parse_chat_line(const std::string & line, bool need_assistant, std::vector<ChatMessage> * msgs, std::string * err) {
    msgs->clear();
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) {  // say why when the bytes are not text (JSON strings must be UTF-8)
        const std::string why = not_text_reason(line);
        *err = why.empty() ? "not JSON" : "not JSON: " + why;
        return false;
    }
    if (!j.is_object() || !j.contains("messages")) { *err = "no \"messages\" (each line must be {\"messages\": [...]})"; return false; }
    const auto & ms = j["messages"];
    if (!ms.is_array()) { *err = "\"messages\" is not an array"; return false; }
    if (ms.empty()) { *err = "an empty conversation (\"messages\" has no message)"; return false; }
    bool any_assistant = false;
    for (size_t i = 0; i < ms.size(); i++) {
        const auto & m = ms[i];
        const std::string at = "message " + std::to_string(i + 1);
        if (!m.is_object()) { *err = at + " is not an object"; return false; }
        if (!m.contains("role") || !m["role"].is_string()) { *err = at + " has no \"role\" string"; return false; }
        const std::string role = m["role"].get<std::string>();
        if (role != "system" && role != "user" && role != "assistant") {
            *err = at + " has role \"" + role + "\" (must be system, user or assistant)";
            return false;
        }
        if (!m.contains("content")) { *err = at + " has no \"content\""; return false; }
        if (!m["content"].is_string()) { *err = at + ": \"content\" is not a string (" + std::string(m["content"].type_name()) + ")"; return false; }
        any_assistant |= role == "assistant";
        msgs->push_back({role, m["content"].get<std::string>()});
    }
    if (need_assistant && !any_assistant) {
        *err = "no assistant turn (--train-on assistant has nothing to learn from it; use --train-on all)";
        return false;
    }
    return true;
}

namespace {
// The messages as rendered: the default system message first when the template inserts it.
std::vector<ChatMessage> with_default_system(const ChatTemplate & t, const std::vector<ChatMessage> & msgs) {
    std::vector<ChatMessage> r;
    if (t.has_default_system && (msgs.empty() || msgs[0].role != "system")) r.push_back({"system", t.default_system});
    r.insert(r.end(), msgs.begin(), msgs.end());
    return r;
}
} // namespace

std::string render_chat_text(const ChatTemplate & t, const std::vector<ChatMessage> & msgs) {
    std::string s;
    for (const auto & m : with_default_system(t, msgs)) s += std::string(IM_START) + m.role + "\n" + m.content + IM_END + "\n";
    return s;
}

bool tokenize_chat(const Tokenizer & tok, const ChatTemplate & t, const std::vector<ChatMessage> & msgs, bool assistant_only,
                   ChatTokens * out, std::string * err) {
    const int32_t im_start = tok.find_token(IM_START), im_end = tok.find_token(IM_END);
    if (im_start < 0 || im_end < 0) {
        *err = std::string("the tokenizer has no ") + (im_start < 0 ? IM_START : IM_END) + " token, which ChatML needs";
        return false;
    }
    out->ids.clear();
    out->target.clear();
    const std::vector<int32_t> nl = tok.encode("\n");
    auto push = [&](int32_t id, bool target) {
        out->ids.push_back(id);
        out->target.push_back(target ? 1 : 0);
    };
    for (const auto & m : with_default_system(t, msgs)) {
        const bool turn = assistant_only ? m.role == "assistant" : true;
        push(im_start, !assistant_only);
        // "{role}\n{content}" is one piece between special tokens, as HF tokenizes the rendered text
        const std::vector<int32_t> piece = tok.encode(m.role + "\n" + m.content), head = tok.encode(m.role + "\n");
        size_t n_head = 0;  // leading tokens equal to the header's own: a token across the boundary is content
        while (n_head < head.size() && n_head < piece.size() && piece[n_head] == head[n_head]) n_head++;
        if (n_head < head.size()) n_head = std::min(n_head, piece.size());
        for (size_t j = 0; j < piece.size(); j++) push(piece[j], !assistant_only || (turn && j >= n_head));
        push(im_end, turn);
        for (int32_t id : nl) push(id, !assistant_only);
    }
    if (!out->target.empty()) out->target[0] = 0;  // the first token has nothing to be predicted from
    return true;
}

namespace {
// Closes the sequence in progress: padding, labels, appended unless it has no target.
void close_sequence(const ChatLayout & L, ChatTokens * cur, ChatSequences * s) {
    if (cur->ids.empty()) return;
    const int64_t n = (int64_t) cur->ids.size();
    std::vector<int32_t> lab((size_t) L.ctx, L.ignore_index);
    int64_t n_t = 0;
    for (int64_t i = 0; i + 1 < n; i++) {
        if (cur->target[(size_t) i + 1]) {
            lab[(size_t) i] = cur->ids[(size_t) i + 1];
            n_t++;
        }
    }
    if (n_t == 0) {
        s->n_no_target++;
    } else {
        s->ids.insert(s->ids.end(), cur->ids.begin(), cur->ids.end());
        s->ids.insert(s->ids.end(), (size_t) (L.ctx - n), L.pad);
        s->labels.insert(s->labels.end(), lab.begin(), lab.end());
        s->n_seqs++;
        s->n_targets += n_t;
        s->n_real += n;
    }
    cur->ids.clear();
    cur->target.clear();
}
} // namespace

bool layout_chat(const ChatLayout & L, const ChatTokens & c, ChatSequences * s, std::string * err) {
    ChatTokens & cur = s->open;
    const int64_t n = (int64_t) c.ids.size();
    int64_t off = 0;
    if (n > L.ctx) {
        if (L.long_mode == "skip") {
            s->n_skipped_long++;
            return true;
        }
        if (L.long_mode != "split") {
            *err = "the conversation has " + std::to_string(n) + " tokens, more than --ctx " + std::to_string(L.ctx) +
                   " (give --chat-long split or skip, or a larger --ctx)";
            return false;
        }
        s->n_split_long++;
        for (; n - off > L.ctx; off += L.ctx) {  // whole pieces are sequences of their own
            ChatTokens piece;
            piece.ids.assign(c.ids.begin() + off, c.ids.begin() + off + L.ctx);
            piece.target.assign(c.target.begin() + off, c.target.begin() + off + L.ctx);
            close_sequence(L, &piece, s);
        }
    }
    const int64_t m = n - off;
    if (!L.pack || (int64_t) cur.ids.size() + m > L.ctx) close_sequence(L, &cur, s);
    cur.ids.insert(cur.ids.end(), c.ids.begin() + off, c.ids.end());
    cur.target.insert(cur.target.end(), c.target.begin() + off, c.target.end());
    if (off > 0 && !cur.target.empty()) cur.target[cur.ids.size() - (size_t) m] = 0;  // a piece's first token: no context
    if (!L.pack) close_sequence(L, &cur, s);
    return true;
}

void layout_chat_finish(const ChatLayout & L, ChatSequences * s) {
    close_sequence(L, &s->open, s);
}

const std::vector<std::string> & chat_file_extensions() {
    static const std::vector<std::string> e = {".jsonl", ".jsonl.gz"};
    return e;
}

void read_chat_files(const std::vector<std::string> & paths, const char * opt, bool need_assistant, bool skip_bad_lines,
                     std::vector<std::vector<ChatMessage>> * convs, std::vector<std::string> * where, ChatFileStats * st) {
    std::string err;
    std::vector<std::string> files, skipped;
    for (const auto & p : paths) {
        const size_t s0 = skipped.size();
        if (!list_files(p, &files, &err, chat_file_extensions(), &skipped)) fail(PROG, std::string(opt) + ": " + err);
        if (skipped.size() > s0)
            printf("note: %s: folder '%s': skipped %zu file(s) that are not .jsonl or .jsonl.gz (e.g. '%s')\n", opt, p.c_str(),
                   skipped.size() - s0, skipped[s0].c_str());
    }
    for (const auto & f : files) {
        std::string text;
        if (!read_text_file(f, &text, &err)) fail(PROG, std::string(opt) + ": " + err);
        size_t a = 0;
        int64_t line_no = 0;
        while (a < text.size()) {
            size_t b = text.find('\n', a);
            if (b == std::string::npos) b = text.size();
            std::string line = text.substr(a, b - a);
            a = b + 1;
            line_no++;
            if (!line.empty() && line.back() == '\r') line.pop_back();
            if (line.find_first_not_of(" \t") == std::string::npos) continue;
            st->n_lines++;
            std::vector<ChatMessage> msgs;
            const std::string at = f + ":" + std::to_string(line_no);
            if (!parse_chat_line(line, need_assistant, &msgs, &err)) {
                st->n_bad++;
                if (!skip_bad_lines) fail(PROG, std::string(opt) + ": " + at + ": " + err + " (--skip-bad-lines skips such lines)");
                if (st->n_bad <= 10) printf("warning: skipping %s: %s\n", at.c_str(), err.c_str());
                continue;
            }
            convs->push_back(std::move(msgs));
            where->push_back(at);
            st->n_convs++;
        }
    }
}

} // namespace train
} // namespace oomb
