// Byte-level BPE tokenizer with the pre-tokenizer chosen by tokenizer.ggml.pre. See
// ggml-oomb/tokenizer.h. Design: one BPE engine; what differs between model families (the regex
// list, NFC or not, ignore_merges) is data in kPreTokenizers.
#include "tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <queue>
#include <unordered_map>

namespace oomb {

namespace {

void set_err(std::string* err, std::string msg) {
    if (err) *err = std::move(msg);
}

// ---- GPT-2 byte-level alphabet ---------------------------------------------------------------
struct ByteLevelTables {
    uint32_t cp[256];     // byte -> code point
    int16_t rev[512];     // code point (< 512) -> byte, or -1
    std::string utf8[256];
    ByteLevelTables() {
        std::fill(rev, rev + 512, (int16_t)-1);
        int n = 0;
        for (int b = 0; b < 256; b++) {
            const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
            rev[cp[b]] = (int16_t)b;
            const uint32_t c = cp[b];
            if (c < 0x80) utf8[b] = std::string(1, (char)c);
            else { utf8[b] += (char)(0xC0 | (c >> 6)); utf8[b] += (char)(0x80 | (c & 0x3F)); }
        }
    }
};

const ByteLevelTables& byte_level() {
    static const ByteLevelTables t;
    return t;
}

// Strict UTF-8 decoding of one character (no overlongs, surrogates or values above U+10FFFF).
// Returns its length (1..4), or 0 when the bytes at p do not start a valid character.
int utf8_char(const uint8_t* p, size_t n, uint32_t* cp) {
    const uint8_t c = p[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (p[1] & 0xC0) != 0x80) return 0;
        *cp = ((uint32_t)(c & 0x1F) << 6) | (p[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        const uint32_t v = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
        if (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF)) return 0;
        *cp = v;
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        const uint32_t v = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
                           ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
        if (v < 0x10000 || v > 0x10FFFF) return 0;
        *cp = v;
        return 4;
    }
    return 0;
}

// ---- NFC in bounded segments ------------------------------------------------------------------
// utf8proc sorts each run of combining marks by insertion, so one call on a long run of marks
// ('a' + (U+0301 U+0316) x N) takes time quadratic in N. We normalize in segments instead, cut
// before "safe" code points: NFC(x + y) == NFC(x) + NFC(y) when y starts with one. A code point
// is safe when the first code point of its canonical decomposition is a starter (ccc 0) that
// never composes with a preceding character (it is not at a non-first position of any canonical
// decomposition, Hangul syllables included). Then canonical reordering (which stops at starters)
// and composition (blocked by the starter) cannot cross the cut. The table is derived from
// utf8proc's own data at first use, so it follows utf8proc's Unicode version.
class NfcSafeStarts {
public:
    NfcSafeStarts() : unsafe_(kMaxCp / 64 + 1, 0) {
        std::vector<uint8_t> second(kMaxCp + 1, 0); // at a non-first position of a decomposition
        std::vector<std::pair<uint32_t, uint32_t>> first; // (code point, first of its decomposition)
        utf8proc_int32_t buf[32];
        for (uint32_t cp = 0; cp <= kMaxCp; cp++) {
            const bool hangul = cp >= 0xAC00 && cp <= 0xD7A3; // decomposed algorithmically
            if (!hangul && utf8proc_get_property((utf8proc_int32_t)cp)->decomp_seqindex == UINT16_MAX) continue;
            int bc = 0;
            const utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, buf, 32, UTF8PROC_DECOMPOSE, &bc);
            if (n < 1 || n > 32) continue;
            for (utf8proc_ssize_t i = 1; i < n; i++) second[(uint32_t)buf[i]] = 1;
            first.emplace_back(cp, (uint32_t)buf[0]);
        }
        auto ccc = [](uint32_t c) { return utf8proc_get_property((utf8proc_int32_t)c)->combining_class; };
        auto mark = [&](uint32_t c) { unsafe_[c / 64] |= 1ull << (c % 64); };
        for (uint32_t cp = 0; cp <= kMaxCp; cp++)
            if (ccc(cp) != 0 || second[cp]) mark(cp);
        for (auto& f : first)
            if (ccc(f.second) != 0 || second[f.second]) mark(f.first);
    }
    bool safe(uint32_t cp) const { return cp <= kMaxCp && !(unsafe_[cp / 64] >> (cp % 64) & 1); }

private:
    static constexpr uint32_t kMaxCp = 0x10FFFF;
    std::vector<uint64_t> unsafe_;
};

const NfcSafeStarts& nfc_safe_starts() {
    static const NfcSafeStarts t;
    return t;
}

// NFC of the valid UTF-8 bytes [p, p + n) appended to `out`, in segments of at most
// TOKENIZER_NFC_MAX_SEGMENT code points, each cut at the last safe code point before it fills.
// A segment that fills without one is cut where it is full (see tokenizer.h).
void nfc_valid_utf8(const uint8_t* p, size_t n, std::string& out) {
    auto flush = [&](size_t a, size_t b) {
        if (b <= a) return;
        utf8proc_uint8_t* dst = nullptr;
        const utf8proc_ssize_t r = utf8proc_map(p + a, (utf8proc_ssize_t)(b - a), &dst,
                                                (utf8proc_option_t)(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        if (r >= 0) out.append((const char*)dst, (size_t)r);
        else out.append((const char*)p + a, b - a);
        free(dst);
    };
    const NfcSafeStarts& safe = nfc_safe_starts();
    size_t s = 0;        // segment start
    size_t last = 0;     // last safe cut in the segment (> s), or s when none
    size_t n_cp = 0;     // code points in [s, q)
    size_t n_after = 0;  // code points in [last, q)
    for (size_t q = 0; q < n;) {
        uint32_t cp = 0;
        int len = utf8_char(p + q, n - q, &cp);
        if (len <= 0) len = 1; // not reached: the caller passes valid UTF-8
        if (q > s && safe.safe(cp)) { last = q; n_after = 0; }
        if (n_cp == TOKENIZER_NFC_MAX_SEGMENT) {
            const size_t cut = last > s ? last : q;
            flush(s, cut);
            n_cp = cut == q ? 0 : n_after;
            s = last = cut;
        }
        n_cp++;
        n_after++;
        q += (size_t)len;
    }
    flush(s, n);
}

// ---- Pre-tokenizers -------------------------------------------------------------------------
// The regexes llama.cpp's src/llama-vocab.cpp uses for each tokenizer.ggml.pre, in the forms HF
// `tokenizers` runs, with \s spelled out as the Unicode White_Space property (what HF's Oniguruma
// matches), so the result does not depend on the PCRE2 version's idea of \s:
//   qwen2, llama-bpe: the tokenizer.json Split regex, with (?i:...) contractions (llama.cpp spells
//     them '[sS]|... since std::regex lacks (?i:); PCRE2 has it, as HF's Oniguruma);
//   gpt-2 (and the second step of smollm): HF ByteLevel(use_regex)'s regex, which ends in |\s+;
//     llama.cpp omits that last alternative, which changes nothing there since its unmatched text
//     also stays a piece;
//   smollm: \p{N} first (HF Digits(individual_digits = true): Rust's char::is_numeric is the N
//     categories), then the GPT-2 regex on each piece.
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define SPLIT_REGEX(DIGITS)                                                                      \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)"                                                               \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"                                                             \
    "|" DIGITS                                                                                   \
    "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*"                                                         \
    "|[" WS "]*[\\r\\n]+"                                                                        \
    "|[" WS "]+(?![^" WS "])"                                                                    \
    "|[" WS "]+"
const char* kQwen2Regex = SPLIT_REGEX("\\p{N}");
const char* kLlama3Regex = SPLIT_REGEX("\\p{N}{1,3}");
const char* kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d"
    "| ?\\p{L}+"
    "| ?\\p{N}+"
    "| ?[^" WS "\\p{L}\\p{N}]+"
    "|[" WS "]+(?![^" WS "])"
    "|[" WS "]+";
const char* kDigitRegex = "\\p{N}";
#undef SPLIT_REGEX
#undef WS

struct PreTokenizerSpec {
    const char* name;                  // canonical tokenizer.ggml.pre value
    std::vector<const char*> aliases;  // other values llama.cpp maps to the same regexes
    bool nfc;                          // HF tokenizer.json has an NFC normalizer
    bool ignore_merges;                // HF BPE ignore_merges: a piece that is a token is kept whole
    std::vector<const char*> regexes;  // applied in sequence
};

const std::vector<PreTokenizerSpec>& pre_tokenizers() {
    static const std::vector<PreTokenizerSpec> t = {
        {"qwen2", {}, true, false, {kQwen2Regex}},
        {"llama-bpe", {"llama3", "llama-v3"}, false, true, {kLlama3Regex}},
        {"smollm", {}, false, false, {kDigitRegex, kGpt2Regex}},
        {"gpt-2", {"gpt2"}, false, false, {kGpt2Regex}},
    };
    return t;
}

const PreTokenizerSpec* find_pre_tokenizer(const std::string& v) {
    for (const PreTokenizerSpec& p : pre_tokenizers()) {
        if (v == p.name) return &p;
        for (const char* a : p.aliases)
            if (v == a) return &p;
    }
    return nullptr;
}

// (left id, right id) -> (rank, merged id); open addressing, linear probing.
class MergeTable {
public:
    void init(size_t n) {
        size_t cap = 16;
        while (cap < n * 2 + 16) cap <<= 1;
        keys_.assign(cap, kEmpty);
        vals_.assign(cap, {0, 0});
        mask_ = cap - 1;
    }
    // Inserts unless present (the first, lowest rank, wins).
    void insert(int32_t a, int32_t b, int32_t rank, int32_t merged) {
        const uint64_t k = key(a, b);
        size_t i = slot(k);
        while (keys_[i] != kEmpty) {
            if (keys_[i] == k) return;
            i = (i + 1) & mask_;
        }
        keys_[i] = k;
        vals_[i] = {rank, merged};
    }
    // Rank of the pair (INT32_MAX when the pair does not merge); *merged gets the result.
    inline int32_t find(int32_t a, int32_t b, int32_t* merged) const {
        const uint64_t k = key(a, b);
        size_t i = slot(k);
        while (true) {
            const uint64_t kk = keys_[i];
            if (kk == k) { *merged = vals_[i].second; return vals_[i].first; }
            if (kk == kEmpty) return INT32_MAX;
            i = (i + 1) & mask_;
        }
    }

private:
    static constexpr uint64_t kEmpty = ~(uint64_t)0;
    static uint64_t key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
    size_t slot(uint64_t k) const { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }
    std::vector<uint64_t> keys_;
    std::vector<std::pair<int32_t, int32_t>> vals_;
    size_t mask_ = 0;
};

std::atomic<uint64_t> g_generation{1};

// Per-thread scratch: PCRE2 match data and JIT stack, the BPE word cache, buffers.
struct ThreadState {
    uint64_t generation = 0;
    pcre2_match_data* md = nullptr;
    pcre2_match_context* mc = nullptr;
    pcre2_jit_stack* js = nullptr;
    std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> cache; // word -> (offset, count)
    std::vector<int32_t> cache_ids;
    std::string norm;

    ~ThreadState() {
        if (md) pcre2_match_data_free(md);
        if (mc) pcre2_match_context_free(mc);
        if (js) pcre2_jit_stack_free(js);
    }
    void reset_cache() {
        cache.clear();
        cache_ids.clear();
    }
};

thread_local ThreadState t_state;

constexpr size_t kCacheMaxWords = 1 << 16;
constexpr size_t kCacheMaxWordLen = 128;

} // namespace

uint32_t byte_level_codepoint(uint8_t b) { return byte_level().cp[b]; }

std::string byte_level_encode(std::string_view bytes) {
    const ByteLevelTables& t = byte_level();
    std::string o;
    o.reserve(bytes.size() * 2);
    for (unsigned char c : bytes) o += t.utf8[c];
    return o;
}

bool byte_level_decode(std::string_view text, std::string* bytes) {
    const ByteLevelTables& t = byte_level();
    bytes->clear();
    const uint8_t* p = (const uint8_t*)text.data();
    size_t n = text.size(), i = 0;
    while (i < n) {
        uint32_t cp;
        int k = utf8_char(p + i, n - i, &cp);
        if (k == 0 || cp >= 512 || t.rev[cp] < 0) return false;
        *bytes += (char)t.rev[cp];
        i += (size_t)k;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
    std::vector<std::string> text;  // GGUF token text
    std::vector<std::string> bytes; // decoded bytes
    std::vector<int32_t> type;
    std::unordered_map<std::string, int32_t> text_to_id;
    std::unordered_map<std::string, int32_t> bpe_vocab; // bytes -> id of the normal tokens
    int32_t byte_id[256];  // -1: the vocabulary has no token for the byte (it is left out)
    bool missing_bytes = false;
    MergeTable merges;
    // Added tokens grouped by first byte, longest first.
    bool first_byte[256] = {false};
    std::vector<int32_t> by_first[256];
    bool has_added = false;
    const PreTokenizerSpec* spec = nullptr;
    std::string pre_name;
    bool pre_from_file = false;
    struct Regex {
        pcre2_code* code = nullptr;
        bool jit = false;
    };
    std::vector<Regex> re; // spec->regexes, compiled
    int32_t bos = -1, eos = -1, pad = -1;
    bool add_bos = false;
    uint64_t generation = 0;

    ~Impl() {
        for (Regex& r : re) pcre2_code_free(r.code);
    }

    ThreadState& state() const {
        ThreadState& s = t_state;
        if (s.generation != generation) {
            s.reset_cache();
            s.generation = generation;
        }
        if (!s.md) {
            s.md = pcre2_match_data_create(4, nullptr);
            s.mc = pcre2_match_context_create(nullptr);
            s.js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
            pcre2_jit_stack_assign(s.mc, nullptr, s.js);
        }
        return s;
    }

    void push_byte(uint8_t b, std::vector<int32_t>& out) const {
        if (byte_id[b] >= 0) out.push_back(byte_id[b]);
    }

    // BPE over the bytes of one pre-token; appends ids. Bytes without a token are left out before
    // merging (their neighbours become adjacent), as HF's BPE does without an unk_token.
    void bpe(const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
        if (n == 1) { push_byte(s[0], out); return; }
        if (spec->ignore_merges) {
            auto it = bpe_vocab.find(std::string((const char*)s, n));
            if (it != bpe_vocab.end()) { out.push_back(it->second); return; }
        }
        if (n <= 64) bpe_small(s, n, out);
        else bpe_large(s, n, out);
    }

    void bpe_small(const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
        int32_t ids[64], rk[64], res[64];
        int m = 0;
        for (size_t i = 0; i < n; i++)
            if (byte_id[s[i]] >= 0) ids[m++] = byte_id[s[i]];
        for (int i = 0; i + 1 < m; i++) rk[i] = merges.find(ids[i], ids[i + 1], &res[i]);
        while (m > 1) {
            int best = -1;
            int32_t br = INT32_MAX;
            for (int i = 0; i + 1 < m; i++)
                if (rk[i] < br) { br = rk[i]; best = i; }
            if (best < 0) break;
            ids[best] = res[best];
            // remove symbol best+1 and the pair that started there
            for (int i = best + 1; i + 1 < m; i++) ids[i] = ids[i + 1];
            for (int i = best + 1; i + 2 < m; i++) { rk[i] = rk[i + 1]; res[i] = res[i + 1]; }
            m--;
            if (best > 0) rk[best - 1] = merges.find(ids[best - 1], ids[best], &res[best - 1]);
            if (best + 1 < m) rk[best] = merges.find(ids[best], ids[best + 1], &res[best]);
        }
        out.insert(out.end(), ids, ids + m);
    }

    void bpe_large(const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
        struct Sym { int32_t id, prev, next; };
        struct Cand {
            int32_t rank, pos, left, right;
            bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
        };
        std::vector<Sym> sy;
        sy.reserve(n);
        for (size_t i = 0; i < n; i++)
            if (byte_id[s[i]] >= 0) sy.push_back({byte_id[s[i]], (int32_t)sy.size() - 1, (int32_t)sy.size() + 1});
        if (sy.empty()) return;
        sy.back().next = -1;
        n = sy.size();
        std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> q;
        auto push = [&](int32_t a) {
            const int32_t b = sy[a].next;
            if (b < 0) return;
            int32_t merged;
            const int32_t r = merges.find(sy[a].id, sy[b].id, &merged);
            if (r != INT32_MAX) q.push({r, a, sy[a].id, sy[b].id});
        };
        for (size_t i = 0; i + 1 < n; i++) push((int32_t)i);
        while (!q.empty()) {
            const Cand c = q.top();
            q.pop();
            Sym& a = sy[c.pos];
            if (a.id != c.left || a.next < 0 || sy[a.next].id != c.right) continue; // stale
            int32_t merged = 0;
            merges.find(c.left, c.right, &merged);
            const int32_t b = a.next;
            a.id = merged;
            a.next = sy[b].next;
            if (a.next >= 0) sy[a.next].prev = c.pos;
            sy[b].id = -1; // dead
            if (a.prev >= 0) push(a.prev);
            push(c.pos);
        }
        for (int32_t i = 0; i >= 0; i = sy[i].next) out.push_back(sy[i].id);
    }

    void bpe_cached(ThreadState& st, const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
        if (n == 1) { push_byte(s[0], out); return; }
        if (n > kCacheMaxWordLen) { bpe(s, n, out); return; }
        std::string key((const char*)s, n);
        auto it = st.cache.find(key);
        if (it != st.cache.end()) {
            const int32_t* p = st.cache_ids.data() + it->second.first;
            out.insert(out.end(), p, p + it->second.second);
            return;
        }
        const size_t before = out.size();
        bpe(s, n, out);
        if (st.cache.size() >= kCacheMaxWords) st.reset_cache();
        const uint32_t off = (uint32_t)st.cache_ids.size();
        st.cache_ids.insert(st.cache_ids.end(), out.begin() + (ptrdiff_t)before, out.end());
        st.cache.emplace(std::move(key), std::make_pair(off, (uint32_t)(out.size() - before)));
    }

    // NFC-normalizes `seg` into `out`. Only runs of non-ASCII bytes (with the ASCII character
    // before them, which may be a base that composes with what follows) go through utf8proc:
    // normalization never crosses the boundary before an ASCII character. Invalid UTF-8 bytes
    // are copied as they are and split the run. Long runs are normalized in bounded segments
    // (nfc_valid_utf8), so the time is linear in the length.
    static void nfc(std::string_view seg, std::string& out) {
        const uint8_t* p = (const uint8_t*)seg.data();
        const size_t n = seg.size();
        out.clear();
        size_t i = 0;
        while (i < n) {
            size_t j = i;
            while (j < n && p[j] < 0x80) j++;
            if (j == n) { out.append((const char*)p + i, n - i); break; }
            const size_t start = j > i ? j - 1 : j; // include the ASCII base character
            out.append((const char*)p + i, start - i);
            size_t k = j;
            while (k < n && p[k] >= 0x80) k++;
            // [start, k): normalize the valid stretches.
            size_t a = start;
            while (a < k) {
                size_t b = a;
                uint32_t cp;
                int len;
                while (b < k && (len = utf8_char(p + b, k - b, &cp)) > 0) b += (size_t)len;
                if (b > a) nfc_valid_utf8(p + a, b - a, out);
                if (b < k) { out += (char)p[b]; b++; } // an invalid byte
                a = b;
            }
            i = k;
        }
    }

    // Splits [s, s + n) with regex `level` and passes each piece (matches and the text between
    // them) to the next level; after the last, BPE. Each piece is its own subject, so lookaheads
    // do not see past it (as in HF, where each step splits the pieces of the previous one).
    bool split(ThreadState& st, size_t level, const uint8_t* s, size_t n, std::vector<int32_t>& out,
               std::string* err) const {
        if (level == re.size()) { bpe_cached(st, s, n, out); return true; }
        const Regex& r = re[level];
        size_t pos = 0;
        while (pos < n) {
            const int rc = r.jit ? pcre2_jit_match(r.code, s, n, pos, 0, st.md, st.mc)
                                 : pcre2_match(r.code, s, n, pos, 0, st.md, st.mc);
            if (rc == PCRE2_ERROR_NOMATCH) return split(st, level + 1, s + pos, n - pos, out, err); // unmatched tail
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                set_err(err, std::string("tokenizer: regex match failed: ") + (const char*)msg);
                return false;
            }
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
            const size_t ms = ov[0], me = ov[1];
            if (ms > pos && !split(st, level + 1, s + pos, ms - pos, out, err)) return false; // unmatched gap
            if (me > ms) {
                if (!split(st, level + 1, s + ms, me - ms, out, err)) return false;
                pos = me;
            } else {
                pos = ms + 1; // cannot happen with these patterns (no empty matches); avoid a loop
                if (ms < n && !split(st, level + 1, s + ms, 1, out, err)) return false;
            }
        }
        return true;
    }

    // Normalizes, pre-tokenizes and BPE-encodes text that holds no added tokens; adds the number
    // of bytes without a token to *n_dropped (when given).
    bool encode_plain(ThreadState& st, std::string_view seg, std::vector<int32_t>& out, std::string* err,
                      size_t* n_dropped) const {
        if (seg.empty()) return true;
        std::string_view text = seg;
        if (spec->nfc) {
            bool ascii = true;
            for (unsigned char c : seg) if (c >= 0x80) { ascii = false; break; }
            if (!ascii) {
                nfc(seg, st.norm);
                text = st.norm;
            }
        }
        if (missing_bytes && n_dropped)
            for (unsigned char c : text) *n_dropped += byte_id[c] < 0;
        return split(st, 0, (const uint8_t*)text.data(), text.size(), out, err);
    }
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

gguf_status Tokenizer::load_file(const std::string& path, std::string* err) {
    GGUFReader r;
    if (gguf_status s = r.open(path, err, GGUFReadOptions{true})) return s;
    return load(r, err);
}

gguf_status Tokenizer::load(const GGUFReader& r, std::string* err) {
    impl_.reset();
    auto I = std::make_unique<Impl>();
    const std::string& path = r.path();
    std::string model, pre;
    if (gguf_status s = r.get_string("tokenizer.ggml.model", &model, err)) return s;
    if (model != "gpt2") {
        set_err(err, path + ": tokenizer.ggml.model is '" + model + "'; only 'gpt2' (byte-level BPE) is supported");
        return GGUF_ERR_UNSUPPORTED;
    }
    if (r.find("tokenizer.ggml.pre")) {
        if (gguf_status s = r.get_string("tokenizer.ggml.pre", &pre, err)) return s;
        I->pre_from_file = true;
    } else {
        pre = "qwen2"; // see tokenizer.h: files without the key are read as before it was read
    }
    I->spec = find_pre_tokenizer(pre);
    if (!I->spec) {
        std::string list;
        for (const std::string& nm : tokenizer_pre_names()) list += (list.empty() ? "" : ", ") + nm;
        set_err(err, path + ": tokenizer.ggml.pre is '" + pre + "', a pre-tokenizer this tokenizer does not know; "
                         "supported: " + list);
        return GGUF_ERR_UNSUPPORTED;
    }
    I->pre_name = I->spec->name;
    if (gguf_status s = r.get_string_array("tokenizer.ggml.tokens", &I->text, err)) return s;
    const size_t n = I->text.size();
    if (n == 0 || n > (size_t)INT32_MAX) {
        set_err(err, path + ": tokenizer.ggml.tokens is empty or too large");
        return GGUF_ERR_FORMAT;
    }
    if (r.find("tokenizer.ggml.token_type")) {
        if (gguf_status s = r.get_i32_array("tokenizer.ggml.token_type", &I->type, err)) return s;
        if (I->type.size() != n) {
            set_err(err, path + ": tokenizer.ggml.token_type has " + std::to_string(I->type.size()) +
                             " entries for " + std::to_string(n) + " tokens");
            return GGUF_ERR_FORMAT;
        }
    } else {
        I->type.assign(n, GGUF_TOKEN_NORMAL);
    }
    std::vector<std::string> merges;
    if (gguf_status s = r.get_string_array("tokenizer.ggml.merges", &merges, err)) return s;

    // Token bytes and the BPE vocabulary (bytes -> id) of the normal tokens.
    I->bytes.resize(n);
    I->text_to_id.reserve(n * 2);
    std::unordered_map<std::string, int32_t>& bpe_vocab = I->bpe_vocab;
    bpe_vocab.reserve(n * 2);
    std::vector<int32_t> added;
    for (size_t i = 0; i < n; i++) {
        const int32_t id = (int32_t)i;
        const std::string& t = I->text[i];
        I->text_to_id.emplace(t, id);
        const int32_t ty = I->type[i];
        if (ty == GGUF_TOKEN_CONTROL || ty == GGUF_TOKEN_USER_DEFINED) {
            I->bytes[i] = t;
            if (!t.empty()) added.push_back(id);
        } else if (ty == GGUF_TOKEN_UNUSED) {
            // padding rows ([PAD<id>]): never produced, decode to nothing
        } else {
            if (!byte_level_decode(t, &I->bytes[i])) I->bytes[i] = t;
            bpe_vocab.emplace(I->bytes[i], id);
        }
    }
    for (int b = 0; b < 256; b++) { // a byte without a token is left out, as HF does (tokenizer.h)
        auto it = bpe_vocab.find(std::string(1, (char)b));
        I->byte_id[b] = it == bpe_vocab.end() ? -1 : it->second;
        I->missing_bytes = I->missing_bytes || I->byte_id[b] < 0;
    }
    I->merges.init(merges.size());
    std::string a, b;
    for (size_t k = 0; k < merges.size(); k++) {
        const std::string& m = merges[k];
        const size_t sp = m.find(' ', 1);
        auto bad = [&](const std::string& why) {
            set_err(err, path + ": tokenizer.ggml.merges[" + std::to_string(k) + "] '" + m + "': " + why);
            return GGUF_ERR_FORMAT;
        };
        if (sp == std::string::npos) return bad("not two tokens separated by a space");
        if (!byte_level_decode(std::string_view(m).substr(0, sp), &a) ||
            !byte_level_decode(std::string_view(m).substr(sp + 1), &b))
            return bad("not byte-level text");
        auto ia = bpe_vocab.find(a), ib = bpe_vocab.find(b), iab = bpe_vocab.find(a + b);
        if (ia == bpe_vocab.end() || ib == bpe_vocab.end() || iab == bpe_vocab.end())
            return bad("a part or the merged token is not in the vocabulary");
        I->merges.insert(ia->second, ib->second, (int32_t)k, iab->second);
    }

    // Added tokens: matched in the text longest first.
    std::sort(added.begin(), added.end(), [&](int32_t x, int32_t y) {
        return I->bytes[x].size() != I->bytes[y].size() ? I->bytes[x].size() > I->bytes[y].size() : x < y;
    });
    for (int32_t id : added) {
        const uint8_t f = (uint8_t)I->bytes[id][0];
        I->first_byte[f] = true;
        I->by_first[f].push_back(id);
    }
    I->has_added = !added.empty();

    auto special = [&](const char* key, int32_t* out) -> gguf_status {
        if (!r.find(key)) return GGUF_OK;
        uint32_t v;
        if (gguf_status s = r.get_u32(key, &v, err)) return s;
        if (v >= n) {
            set_err(err, path + ": " + key + " = " + std::to_string(v) + " is not a token id (vocabulary of " +
                             std::to_string(n) + ")");
            return GGUF_ERR_FORMAT;
        }
        *out = (int32_t)v;
        return GGUF_OK;
    };
    if (gguf_status s = special("tokenizer.ggml.bos_token_id", &I->bos)) return s;
    if (gguf_status s = special("tokenizer.ggml.eos_token_id", &I->eos)) return s;
    if (gguf_status s = special("tokenizer.ggml.padding_token_id", &I->pad)) return s;
    if (r.find("tokenizer.ggml.add_bos_token"))
        if (gguf_status s = r.get_bool("tokenizer.ggml.add_bos_token", &I->add_bos, err)) return s;

    for (const char* pattern : I->spec->regexes) {
        int ec;
        PCRE2_SIZE eo;
        Impl::Regex rx;
        rx.code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, nullptr);
        if (!rx.code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(ec, msg, sizeof msg);
            set_err(err, std::string("tokenizer: cannot compile the ") + I->pre_name + " pre-tokenizer regex: " +
                             (const char*)msg);
            return GGUF_ERR_UNSUPPORTED;
        }
        rx.jit = pcre2_jit_compile(rx.code, PCRE2_JIT_COMPLETE) == 0;
        I->re.push_back(rx);
    }
    I->generation = g_generation.fetch_add(1);
    impl_ = std::move(I);
    return GGUF_OK;
}

gguf_status Tokenizer::encode(std::string_view text, std::vector<int32_t>* ids, std::string* err,
                              bool parse_special, size_t* n_dropped) const {
    if (!impl_) { set_err(err, "tokenizer: not loaded"); return GGUF_ERR_ARG; }
    const Impl& I = *impl_;
    ThreadState& st = I.state();
    const uint8_t* p = (const uint8_t*)text.data();
    const size_t n = text.size();
    size_t seg = 0;
    if (parse_special && I.has_added) {
        size_t i = 0;
        while (i < n) {
            if (!I.first_byte[p[i]]) { i++; continue; }
            int32_t hit = -1;
            for (int32_t id : I.by_first[p[i]]) {
                const std::string& t = I.bytes[id];
                if (t.size() <= n - i && memcmp(p + i, t.data(), t.size()) == 0) { hit = id; break; }
            }
            if (hit < 0) { i++; continue; }
            if (!I.encode_plain(st, text.substr(seg, i - seg), *ids, err, n_dropped)) return GGUF_ERR_ARG;
            ids->push_back(hit);
            i += I.bytes[hit].size();
            seg = i;
        }
    }
    if (!I.encode_plain(st, text.substr(seg), *ids, err, n_dropped)) return GGUF_ERR_ARG;
    return GGUF_OK;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> ids;
    encode(text, &ids, nullptr, parse_special);
    return ids;
}

gguf_status Tokenizer::decode(const int32_t* ids, size_t n, std::string* out, std::string* err) const {
    if (!impl_) { set_err(err, "tokenizer: not loaded"); return GGUF_ERR_ARG; }
    const Impl& I = *impl_;
    for (size_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || (size_t)id >= I.bytes.size()) {
            set_err(err, "tokenizer: id " + std::to_string(id) + " (position " + std::to_string(i) +
                             ") is outside the vocabulary of " + std::to_string(I.bytes.size()) + " tokens");
            return GGUF_ERR_ARG;
        }
        *out += I.bytes[id];
    }
    return GGUF_OK;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string s;
    if (!impl_) return s;
    for (int32_t id : ids)
        if (id >= 0 && (size_t)id < impl_->bytes.size()) s += impl_->bytes[id];
    return s;
}

size_t Tokenizer::n_vocab() const { return impl_ ? impl_->text.size() : 0; }

const std::string& Tokenizer::pre() const {
    static const std::string empty;
    return impl_ ? impl_->pre_name : empty;
}

bool Tokenizer::pre_from_file() const { return impl_ && impl_->pre_from_file; }

bool Tokenizer::has_byte_token(uint8_t b) const { return impl_ && impl_->byte_id[b] >= 0; }

const std::vector<std::string>& tokenizer_pre_names() {
    static const std::vector<std::string> names = [] {
        std::vector<std::string> v;
        for (const PreTokenizerSpec& p : pre_tokenizers()) {
            v.push_back(p.name);
            for (const char* a : p.aliases) v.push_back(a);
        }
        return v;
    }();
    return names;
}

const std::string& Tokenizer::token_text(int32_t id) const {
    static const std::string empty;
    return impl_ && id >= 0 && (size_t)id < impl_->text.size() ? impl_->text[id] : empty;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
    static const std::string empty;
    return impl_ && id >= 0 && (size_t)id < impl_->bytes.size() ? impl_->bytes[id] : empty;
}

int32_t Tokenizer::token_type(int32_t id) const {
    return impl_ && id >= 0 && (size_t)id < impl_->type.size() ? impl_->type[id] : 0;
}

int32_t Tokenizer::find_token(const std::string& text) const {
    if (!impl_) return -1;
    auto it = impl_->text_to_id.find(text);
    return it == impl_->text_to_id.end() ? -1 : it->second;
}

int32_t Tokenizer::bos_id() const { return impl_ ? impl_->bos : -1; }
int32_t Tokenizer::eos_id() const { return impl_ ? impl_->eos : -1; }
int32_t Tokenizer::pad_id() const { return impl_ ? impl_->pad : -1; }
bool Tokenizer::add_bos() const { return impl_ && impl_->add_bos; }

} // namespace oomb
