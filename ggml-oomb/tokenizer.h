// Qwen2 byte-level BPE tokenizer, built from the tokenizer metadata of a GGUF file
// (tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre = "qwen2", tokens, token_type, merges and the
// special token ids), reproducing Hugging Face `tokenizers` on Qwen2/2.5 tokenizer.json:
//   1. added tokens (token types CONTROL and USER_DEFINED, e.g. <|im_start|>) written in the text
//      are matched as whole tokens (leftmost, then longest), as HF does;
//   2. the rest is NFC-normalized (utf8proc),
//   3. split with the Qwen2 pre-tokenizer regex (PCRE2, JIT compiled),
//   4. each piece is BPE-merged by merge rank over its bytes (byte-level BPE), with a word cache.
// Input bytes that are not valid UTF-8 are not an error: they are left out of normalization and
// of the regex and encoded as byte tokens, so decode(encode(x)) == x for every NFC string x and
// for any byte string that contains no non-NFC sequences.
//
// NFC is computed in segments, so that its time is linear in the text length (utf8proc alone is
// quadratic in a run of combining marks). Segments are cut before code points that start a new
// normalization context (a starter that composes with nothing before it), where the result is
// byte-identical to NFC of the whole string. Only when TOKENIZER_NFC_MAX_SEGMENT (256) code
// points in a row hold no such point (in practice: more than 255 combining marks on one base, as
// in adversarial input; the Unicode stream-safe text format allows 30) the run is cut after 256
// code points and each piece is normalized on its own: marks are then not reordered or composed
// across the cut, and the ids can differ from HF's for such text. The bound keeps the cost of such
// a run at ~1 us per code point (1024 would be ~4x that).
//
// Known limit: Unicode version. The regex classes (\p{L}, \p{N}, \s) come from PCRE2's tables and
// NFC from utf8proc's; Debian 12 ships PCRE2 10.42 (Unicode 14.0) and utf8proc 2.8 (Unicode 15.0),
// while HF `tokenizers` has Unicode 16 data. Code points assigned in Unicode 15 or 16 (e.g.
// U+137C2, U+1E030, CJK Extension H) are not letters to PCRE2, so text where such a character
// meets punctuation can split differently from HF: U+137C2 followed by `"a` gives
// 124373 253 224 1 64 here, 124373 253 224 56693 in HF. The bytes decode identically; only the
// ids of such (rare) text differ. Newer PCRE2/utf8proc builds remove the limit
// (test Tokenizer.UnicodeVersionLimitPinned pins the current behaviour).
#pragma once

#include "gguf.h"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace oomb {

// Most code points NFC-normalized in one piece when no safe cut point occurs (see above).
constexpr size_t TOKENIZER_NFC_MAX_SEGMENT = 256;

// llama.cpp's token types (tokenizer.ggml.token_type).
enum gguf_token_type : int32_t {
    GGUF_TOKEN_NORMAL = 1,
    GGUF_TOKEN_UNKNOWN = 2,
    GGUF_TOKEN_CONTROL = 3,
    GGUF_TOKEN_USER_DEFINED = 4,
    GGUF_TOKEN_UNUSED = 5,
    GGUF_TOKEN_BYTE = 6,
};

class Tokenizer {
public:
    Tokenizer();
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Builds the tokenizer from the metadata of an open GGUF file. Errors: GGUF_ERR_NOT_FOUND
    // (missing tokenizer.ggml.tokens / merges), GGUF_ERR_UNSUPPORTED (model other than gpt2, or
    // pre-tokenizer other than qwen2), GGUF_ERR_FORMAT (token_type length mismatch, a merge whose
    // parts or result are not tokens, a missing byte token), GGUF_ERR_TYPE (wrong value types).
    gguf_status load(const GGUFReader& gguf, std::string* err);
    // Opens `path` (a model or vocab-only GGUF) and loads its tokenizer.
    gguf_status load_file(const std::string& path, std::string* err);

    // Appends the token ids of `text` (any bytes) to `ids`. With parse_special, added/special
    // tokens written in the text are matched as whole tokens (HF default); without, they are
    // tokenized as plain text. Thread-safe (per-thread caches). Error only on a regex engine
    // failure (GGUF_ERR_ARG with PCRE2's message).
    gguf_status encode(std::string_view text, std::vector<int32_t>* ids, std::string* err,
                       bool parse_special = true) const;
    // Convenience: the ids of `text`; on the (unexpected) regex failure returns what was encoded.
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

    // Appends the exact bytes of `ids` to `out` (added tokens as their text, UNUSED padding
    // tokens as nothing). Error GGUF_ERR_ARG naming the first id outside [0, n_vocab).
    gguf_status decode(const int32_t* ids, size_t n, std::string* out, std::string* err) const;
    std::string decode(const std::vector<int32_t>& ids) const; // invalid ids are skipped

    size_t n_vocab() const;
    const std::string& token_text(int32_t id) const; // as stored in GGUF (byte-level form)
    const std::string& token_bytes(int32_t id) const; // the bytes it decodes to
    int32_t token_type(int32_t id) const;
    int32_t find_token(const std::string& text) const; // id of a token by its GGUF text, or -1

    int32_t bos_id() const; // tokenizer.ggml.bos_token_id, or -1
    int32_t eos_id() const; // tokenizer.ggml.eos_token_id, or -1
    int32_t pad_id() const; // tokenizer.ggml.padding_token_id, or -1
    bool add_bos() const;   // tokenizer.ggml.add_bos_token (false when absent)

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// GPT-2 byte-level alphabet: the printable code point that stands for each byte.
uint32_t byte_level_codepoint(uint8_t b);
// Encodes raw bytes as their byte-level (GPT-2) UTF-8 text, e.g. " a" -> "Ġa".
std::string byte_level_encode(std::string_view bytes);
// Decodes byte-level text back to bytes; false if a character is not in the byte-level alphabet.
bool byte_level_decode(std::string_view text, std::string* bytes);

} // namespace oomb
