// Byte-level BPE tokenizer, built from the tokenizer metadata of a GGUF file
// (tokenizer.ggml.model = "gpt2": tokens, token_type, merges and the special token ids), with the
// pre-tokenizer chosen by tokenizer.ggml.pre, reproducing Hugging Face `tokenizers`:
//   1. added tokens (token types CONTROL and USER_DEFINED, e.g. <|im_start|>) written in the text
//      are matched as whole tokens (leftmost, then longest), as HF does for special,
//      non-normalized added tokens without lstrip/rstrip;
//   2. the rest is NFC-normalized (utf8proc) when the pre-tokenizer's HF tokenizer.json has an NFC
//      normalizer (qwen2 only),
//   3. split by the pre-tokenizer's regexes, applied in sequence (each splits the pieces of the
//      previous one; text a regex does not match stays a piece, as in HF's Split "Isolated"),
//      PCRE2, JIT compiled,
//   4. each piece is BPE-merged by merge rank over its bytes (byte-level BPE), with a word cache;
//      with ignore_merges (llama-bpe), a piece that is itself a token is that token.
// The pre-tokenizers (the regexes as llama.cpp's src/llama-vocab.cpp lists them, with HF's forms
// where they differ, see tokenizer.cpp; \s is the Unicode White_Space set):
//   qwen2                      NFC; Qwen2's Split regex (\p{N} single digits)
//   llama-bpe (llama3, llama-v3) Llama 3's Split regex (\p{N}{1,3}); ignore_merges
//   smollm                     \p{N} (HF Digits(individual_digits)), then the GPT-2 regex
//   gpt-2 (gpt2)               the GPT-2 regex (HF ByteLevel(use_regex))
// A file without tokenizer.ggml.pre gets qwen2 (what this tokenizer did before the key was read;
// llama.cpp would use its 'default' regexes instead); an unknown value is GGUF_ERR_UNSUPPORTED
// with a message naming it and the supported ones.
// Bytes with no token: a vocabulary may lack some byte tokens (SmolLM2's has none for 0x04, 0x06,
// 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1-0xff). HF's BPE (no unk_token) and llama.cpp leave such
// bytes out; so do we (encode reports how many through n_dropped), so for such text decode does
// not give the input back. Every other input decodes to itself (its NFC form for qwen2).
// Input bytes that are not valid UTF-8 are not an error: they are left out of normalization and
// of the regexes and encoded as byte tokens, so decode(encode(x)) == x for every byte string x
// without bytes that lack a token (with qwen2's NFC: every NFC string x, and any byte string that
// contains no non-NFC sequences).
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
    // (missing tokenizer.ggml.tokens / merges), GGUF_ERR_UNSUPPORTED (model other than gpt2, or a
    // tokenizer.ggml.pre not in tokenizer_pre_names()), GGUF_ERR_FORMAT (token_type length
    // mismatch, a merge whose parts or result are not tokens), GGUF_ERR_TYPE (wrong value types).
    gguf_status load(const GGUFReader& gguf, std::string* err);
    // Opens `path` (a model or vocab-only GGUF) and loads its tokenizer.
    gguf_status load_file(const std::string& path, std::string* err);

    // Appends the token ids of `text` (any bytes) to `ids`. With parse_special, added/special
    // tokens written in the text are matched as whole tokens (HF default); without, they are
    // tokenized as plain text. Thread-safe (per-thread caches). Error only on a regex engine
    // failure (GGUF_ERR_ARG with PCRE2's message). n_dropped (optional) gets the number of input
    // bytes left out because the vocabulary has no token for them (see above; 0 for most files).
    gguf_status encode(std::string_view text, std::vector<int32_t>* ids, std::string* err,
                       bool parse_special = true, size_t* n_dropped = nullptr) const;
    // Convenience: the ids of `text`; on the (unexpected) regex failure returns what was encoded.
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;

    // Appends the exact bytes of `ids` to `out` (added tokens as their text, UNUSED padding
    // tokens as nothing). Error GGUF_ERR_ARG naming the first id outside [0, n_vocab).
    gguf_status decode(const int32_t* ids, size_t n, std::string* out, std::string* err) const;
    std::string decode(const std::vector<int32_t>& ids) const; // invalid ids are skipped

    size_t n_vocab() const;
    // The pre-tokenizer in use, by its canonical name ("qwen2", "smollm", "gpt-2", "llama-bpe"),
    // and whether the file named it (false: tokenizer.ggml.pre was absent, qwen2 assumed).
    const std::string& pre() const;
    bool pre_from_file() const;
    // False when the vocabulary has no token for byte b (such bytes are left out by encode).
    bool has_byte_token(uint8_t b) const;
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

// The tokenizer.ggml.pre values load() accepts, aliases included (e.g. "gpt2" beside "gpt-2").
const std::vector<std::string>& tokenizer_pre_names();

// GPT-2 byte-level alphabet: the printable code point that stands for each byte.
uint32_t byte_level_codepoint(uint8_t b);
// Encodes raw bytes as their byte-level (GPT-2) UTF-8 text, e.g. " a" -> "Ġa".
std::string byte_level_encode(std::string_view bytes);
// Decodes byte-level text back to bytes; false if a character is not in the byte-level alphabet.
bool byte_level_decode(std::string_view text, std::string* bytes);

} // namespace oomb
