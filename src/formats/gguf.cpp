// GGUF v3 reader and writer. See ggml-oomb/gguf.h.
#include "gguf.h"

#include "../fp16.h"
#include "quants.h"
#include "quantize.h"
#include "mapped-file.h"

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace oomb {

namespace {

void set_err(std::string* err, std::string msg) {
    if (err) *err = std::move(msg);
}

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

struct TypeTraits {
    const char* name;
    int64_t block;
    size_t bytes;
};

// ggml's type table (ggml.h / gguf-py constants.GGML_QUANT_SIZES). Gaps are removed types.
const TypeTraits kTypes[] = {
    {"F32", 1, 4},          // 0
    {"F16", 1, 2},          // 1
    {"Q4_0", 32, 18},       // 2
    {"Q4_1", 32, 20},       // 3
    {nullptr, 0, 0},        // 4 (Q4_2, removed)
    {nullptr, 0, 0},        // 5 (Q4_3, removed)
    {"Q5_0", 32, 22},       // 6
    {"Q5_1", 32, 24},       // 7
    {"Q8_0", 32, 34},       // 8
    {"Q8_1", 32, 36},       // 9
    {"Q2_K", 256, 84},      // 10
    {"Q3_K", 256, 110},     // 11
    {"Q4_K", 256, 144},     // 12
    {"Q5_K", 256, 176},     // 13
    {"Q6_K", 256, 210},     // 14
    {"Q8_K", 256, 292},     // 15
    {"IQ2_XXS", 256, 66},   // 16
    {"IQ2_XS", 256, 74},    // 17
    {"IQ3_XXS", 256, 98},   // 18
    {"IQ1_S", 256, 50},     // 19
    {"IQ4_NL", 32, 18},     // 20
    {"IQ3_S", 256, 110},    // 21
    {"IQ2_S", 256, 82},     // 22
    {"IQ4_XS", 256, 136},   // 23
    {"I8", 1, 1},           // 24
    {"I16", 1, 2},          // 25
    {"I32", 1, 4},          // 26
    {"I64", 1, 8},          // 27
    {"F64", 1, 8},          // 28
    {"IQ1_M", 256, 56},     // 29
    {"BF16", 1, 2},         // 30
    {nullptr, 0, 0},        // 31 (Q4_0_4_4, removed)
    {nullptr, 0, 0},        // 32 (Q4_0_4_8, removed)
    {nullptr, 0, 0},        // 33 (Q4_0_8_8, removed)
    {"TQ1_0", 256, 54},     // 34
    {"TQ2_0", 256, 66},     // 35
    {nullptr, 0, 0},        // 36 (IQ4_NL_4_4, removed)
    {nullptr, 0, 0},        // 37 (IQ4_NL_4_8, removed)
    {nullptr, 0, 0},        // 38 (IQ4_NL_8_8, removed)
    {"MXFP4", 32, 17},      // 39
    {"NVFP4", 64, 36},      // 40
    {"Q1_0", 128, 18},      // 41
};
constexpr uint32_t kNumTypes = sizeof(kTypes) / sizeof(kTypes[0]);

const TypeTraits* traits(uint32_t t) {
    if (t >= kNumTypes || !kTypes[t].name) return nullptr;
    return &kTypes[t];
}

// Size in bytes of a scalar metadata type (0 for STRING/ARRAY/unknown).
size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

bool is_int_type(uint32_t t) {
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16:
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64:
        return true;
    default: return false;
    }
}

// Decodes a scalar from `bytes` (little endian). Integers: *is_neg, *mag hold sign and magnitude.
struct Scalar {
    bool neg = false;
    uint64_t mag = 0;
    double f = 0;
};

Scalar decode_scalar(uint32_t t, const uint8_t* p) {
    Scalar s;
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: s.mag = p[0]; break;
    case GGUF_TYPE_INT8: { int8_t v; memcpy(&v, p, 1); s.neg = v < 0; s.mag = v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v; break; }
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); s.mag = v; break; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, p, 2); s.neg = v < 0; s.mag = v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v; break; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); s.mag = v; break; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, p, 4); s.neg = v < 0; s.mag = v < 0 ? (uint64_t)(-(int64_t)v) : (uint64_t)v; break; }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); s.mag = v; break; }
    case GGUF_TYPE_INT64: {
        int64_t v; memcpy(&v, p, 8); s.neg = v < 0;
        s.mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v; break;
    }
    case GGUF_TYPE_FLOAT32: { float v; memcpy(&v, p, 4); s.f = v; break; }
    case GGUF_TYPE_FLOAT64: { double v; memcpy(&v, p, 8); s.f = v; break; }
    default: break;
    }
    if (is_int_type(t) || t == GGUF_TYPE_BOOL) s.f = s.neg ? -(double)s.mag : (double)s.mag;
    return s;
}

bool scalar_to_i64(uint32_t t, const uint8_t* p, int64_t* out) {
    if (!is_int_type(t)) return false;
    Scalar s = decode_scalar(t, p);
    if (s.neg) {
        if (s.mag > (uint64_t)INT64_MAX + 1) return false;
        *out = (int64_t)(0 - s.mag);
    } else {
        if (s.mag > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)s.mag;
    }
    return true;
}

std::string escape(const std::string& s, size_t max_chars) {
    std::string o;
    size_t n = std::min(s.size(), max_chars);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') o += "\\\\";
        else if (c == '"') o += "\\\"";
        else if (c == '\n') o += "\\n";
        else if (c == '\t') o += "\\t";
        else if (c == '\r') o += "\\r";
        else if (c < 0x20 || c == 0x7f) o += fmt("\\x%02x", c);
        else o += (char)c;
    }
    if (s.size() > max_chars) o += "...";
    return o;
}

std::string scalar_to_string(uint32_t t, const uint8_t* p) {
    Scalar s = decode_scalar(t, p);
    switch (t) {
    case GGUF_TYPE_BOOL: return p[0] ? "true" : "false";
    case GGUF_TYPE_FLOAT32: return fmt("%.9g", s.f);
    case GGUF_TYPE_FLOAT64: return fmt("%.17g", s.f);
    default: return (s.neg ? "-" : "") + std::to_string(s.mag);
    }
}

// Bounds-checked little-endian reader over a byte range.
struct Cursor {
    const uint8_t* p;
    size_t size;
    size_t pos = 0;
    size_t left() const { return size - pos; }
    bool bytes(void* dst, size_t n) {
        if (n > left()) return false;
        if (n) memcpy(dst, p + pos, n);
        pos += n;
        return true;
    }
    bool u32(uint32_t* v) { return bytes(v, 4); }
    bool u64(uint64_t* v) { return bytes(v, 8); }
};

// In-memory metadata is bounded by the file size: a file of millions of empty arrays or keys
// (12-13 bytes each on disk, ~150-200 bytes each as GGUFValue / key / index entries) would
// otherwise take >10x its size in RAM. The reader counts the bytes its metadata and tensor infos
// take (object sizes plus string and array payloads) and refuses a file past
// kMetaMemPerFileByte x file size + kMetaMemSlack. Real files stay far below: a vocabulary's
// token strings take ~2x their file bytes, and the tensor data of a model is most of its size.
constexpr uint64_t kMetaMemPerFileByte = 4;
constexpr uint64_t kMetaMemSlack = 1u << 20;

struct MemBudget {
    uint64_t used = 0;
    uint64_t limit = 0;
    // Accounts `n` more bytes; false when past the limit.
    bool take(uint64_t n) {
        if (n > limit - used) { used = limit; return false; }
        used += n;
        return true;
    }
    static uint64_t string_bytes(uint64_t len) { return sizeof(std::string) + (len > 15 ? len + 1 : 0); }
};

std::string budget_message(const MemBudget& b, size_t file_size) {
    return fmt("metadata would take more than %" PRIu64 " bytes of memory (limit: %" PRIu64
               "x the file size of %zu bytes + %" PRIu64 " bytes): a corrupt or hostile file "
               "(e.g. millions of empty arrays or keys)",
               b.limit, kMetaMemPerFileByte, file_size, kMetaMemSlack);
}

const char* kTruncated = "file is truncated";
const char* kTruncOrCorrupt = " (file truncated, or a corrupt length)";

} // namespace

// ---------------------------------------------------------------------------------------------
// Types

const char* gguf_type_name(uint32_t t) {
    static const char* names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                  "bool", "string", "array", "uint64", "int64", "float64"};
    return t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

const char* gguf_tensor_type_name(uint32_t t) {
    const TypeTraits* tr = traits(t);
    return tr ? tr->name : nullptr;
}

bool gguf_tensor_type_supported(uint32_t t) {
    switch (t) {
    case GGUF_TENSOR_F32: case GGUF_TENSOR_F16: case GGUF_TENSOR_BF16:
    case GGUF_TENSOR_Q8_0: case GGUF_TENSOR_Q4_0: case GGUF_TENSOR_Q4_1:
    case GGUF_TENSOR_Q5_0: case GGUF_TENSOR_Q5_1:
    case GGUF_TENSOR_Q2_K: case GGUF_TENSOR_Q3_K: case GGUF_TENSOR_Q4_K:
    case GGUF_TENSOR_Q5_K: case GGUF_TENSOR_Q6_K:
        return true;
    default: return false;
    }
}

const char* gguf_tensor_types_supported_list() {
    return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";
}

int64_t gguf_tensor_type_block_size(uint32_t t) {
    const TypeTraits* tr = traits(t);
    return tr ? tr->block : 0;
}

size_t gguf_tensor_type_block_bytes(uint32_t t) {
    const TypeTraits* tr = traits(t);
    return tr ? tr->bytes : 0;
}

static std::string tensor_type_desc(uint32_t t) {
    const char* n = gguf_tensor_type_name(t);
    return n ? fmt("%s (ggml type %u)", n, t) : fmt("unknown ggml type %u", t);
}

// ---- block dequantization: quants.h (the one truth for the layouts, shared with the core) ----
namespace {

// Q8_0 quantization of one block, ggml's quantize_row_q8_0_ref (= gguf-py's gguf.quants Q8_0):
// d = max|x| / 127 (stored f16), q = round-half-away(x / d) with 1/d computed once.
void quant_q8_0(const float* x, uint8_t* b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = fp32_to_fp16(d);
    memcpy(b, &dh, 2);
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)std::round(x[j] * id);
}

float f16_at(const uint8_t* p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_fp32(h); }

} // namespace

// Dequantizes/converts n elements of src_type (a supported type; n a multiple of its block) into f32.
static void to_f32(uint32_t src_type, const uint8_t* src, float* dst, int64_t n) {
    switch (src_type) {
    case GGUF_TENSOR_F32: memcpy(dst, src, (size_t)n * 4); return;
    case GGUF_TENSOR_F16:
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, src + 2 * i, 2); dst[i] = fp16_to_fp32(h); }
        return;
    case GGUF_TENSOR_BF16:
        for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, src + 2 * i, 2); dst[i] = bf16_to_fp32(h); }
        return;
    default: break;
    }
    const int64_t blk = gguf_tensor_type_block_size(src_type);
    dequantize_blocks(src_type, src, dst, n / blk); // callers check gguf_tensor_type_supported
}

gguf_status gguf_convert(uint32_t src_type, const void* src_v, uint32_t dst_type, void* dst_v,
                         int64_t n, std::string* err) {
    if (!gguf_tensor_type_supported(src_type)) {
        set_err(err, "cannot convert from tensor type " + tensor_type_desc(src_type) +
                         ": supported types are " + gguf_tensor_types_supported_list());
        return GGUF_ERR_UNSUPPORTED;
    }
    if (dst_type != GGUF_TENSOR_F32 && dst_type != GGUF_TENSOR_F16 && dst_type != GGUF_TENSOR_BF16 &&
        dst_type != GGUF_TENSOR_Q8_0 && !quantize_type_supported(dst_type)) {
        set_err(err, "cannot convert to tensor type " + tensor_type_desc(dst_type) +
                         ": the output type must be F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q5_K or Q6_K");
        return GGUF_ERR_ARG;
    }
    const int64_t blk = gguf_tensor_type_block_size(src_type);
    if (n < 0 || n % blk != 0) {
        set_err(err, fmt("cannot convert %" PRId64 " elements of %s: not a multiple of its block size %" PRId64,
                         n, gguf_tensor_type_name(src_type), blk));
        return GGUF_ERR_ARG;
    }
    const int64_t dst_blk = gguf_tensor_type_block_size(dst_type);
    if (n % dst_blk != 0) {
        set_err(err, fmt("cannot convert %" PRId64 " elements to %s: not a multiple of its block size %" PRId64,
                         n, gguf_tensor_type_name(dst_type), dst_blk));
        return GGUF_ERR_ARG;
    }
    if (n == 0) return GGUF_OK;
    const uint8_t* src = (const uint8_t*)src_v;
    if (src_type == dst_type) {
        memcpy(dst_v, src, (size_t)n * gguf_tensor_type_block_bytes(src_type));
        return GGUF_OK;
    }
    if (dst_type == GGUF_TENSOR_F32) {
        to_f32(src_type, src, (float*)dst_v, n);
        return GGUF_OK;
    }
    // 16-bit and block-quantized output: go through f32 in chunks. Quantized output refuses NaN and
    // infinity (naming the element) instead of writing blocks that decode to garbage.
    constexpr int64_t kChunk = 4096; // multiple of every supported block size
    float tmp[kChunk];
    uint16_t* dst = (uint16_t*)dst_v;
    const size_t src_bytes_per_chunk = (size_t)(kChunk / blk) * gguf_tensor_type_block_bytes(src_type);
    const size_t dst_block_bytes = gguf_tensor_type_block_bytes(dst_type);
    for (int64_t i = 0; i < n; i += kChunk) {
        const int64_t m = std::min(kChunk, n - i);
        to_f32(src_type, src + (size_t)(i / kChunk) * src_bytes_per_chunk, tmp, m);
        if (dst_type == GGUF_TENSOR_Q8_0 || quantize_type_supported(dst_type)) {
            if (!quantize_check_finite(tmp, m, i, dst_type, err)) return GGUF_ERR_ARG;
        }
        if (quantize_type_supported(dst_type)) {
            const gguf_status st = quantize_blocks(dst_type, tmp, (uint8_t*)dst_v + (size_t)(i / dst_blk) * dst_block_bytes,
                                                   m, i, err);
            if (st != GGUF_OK) return st;
        } else if (dst_type == GGUF_TENSOR_Q8_0) {
            for (int64_t j = 0; j < m; j += 32) {
                uint8_t* b = (uint8_t*)dst_v + (size_t)((i + j) / 32) * 34;
                quant_q8_0(tmp + j, b);
                if (!std::isfinite(f16_at(b))) {
                    set_err(err, fmt("cannot quantize elements %" PRId64 "..%" PRId64 " to Q8_0: their scale overflows f16 "
                                     "(values too large for this type)", i + j, i + j + 31));
                    return GGUF_ERR_ARG;
                }
            }
        } else if (dst_type == GGUF_TENSOR_F16) {
            for (int64_t j = 0; j < m; j++) dst[i + j] = fp32_to_fp16(tmp[j]);
        } else {
            for (int64_t j = 0; j < m; j++) dst[i + j] = fp32_to_bf16(tmp[j]);
        }
    }
    return GGUF_OK;
}

const char* file_kind_name(unsigned mode) {
    return S_ISREG(mode) ? "a regular file" : S_ISDIR(mode) ? "a folder" : S_ISCHR(mode) ? "a character device"
           : S_ISBLK(mode) ? "a block device" : S_ISFIFO(mode) ? "a FIFO" : S_ISSOCK(mode) ? "a socket" : "not a regular file";
}

bool gguf_check_finite_as(const float* x, int64_t n, int64_t index_base, uint32_t dst_type, std::string* err) {
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        if (!std::isfinite(v)) {
            set_err(err, fmt("element %" PRId64 " is %s: a model with non-finite weights is not written", index_base + i,
                             std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf")));
            return false;
        }
        // the type's own rounding decides (F16: |x| >= 65520 becomes inf; BF16: just below FLT_MAX)
        const bool overflows = dst_type == GGUF_TENSOR_F16    ? !std::isfinite(fp16_to_fp32(fp32_to_fp16(v)))
                               : dst_type == GGUF_TENSOR_BF16 ? !std::isfinite(bf16_to_fp32(fp32_to_bf16(v)))
                                                              : false;
        if (overflows) {
            const bool f16 = dst_type == GGUF_TENSOR_F16;
            set_err(err, fmt("element %" PRId64 " is %g, beyond %s's range (+-%g): use --out-type %s", index_base + i, (double)v,
                             gguf_tensor_type_name(dst_type), f16 ? 65504.0 : 3.3895313892515355e38, f16 ? "bf16 or f32" : "f32"));
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// GGUFValue

GGUFValue GGUFValue::u8(uint8_t v) { GGUFValue r; r.type_ = GGUF_TYPE_UINT8; memcpy(&r.bits_, &v, 1); return r; }
GGUFValue GGUFValue::i8(int8_t v) { GGUFValue r; r.type_ = GGUF_TYPE_INT8; memcpy(&r.bits_, &v, 1); return r; }
GGUFValue GGUFValue::u16(uint16_t v) { GGUFValue r; r.type_ = GGUF_TYPE_UINT16; memcpy(&r.bits_, &v, 2); return r; }
GGUFValue GGUFValue::i16(int16_t v) { GGUFValue r; r.type_ = GGUF_TYPE_INT16; memcpy(&r.bits_, &v, 2); return r; }
GGUFValue GGUFValue::u32(uint32_t v) { GGUFValue r; r.type_ = GGUF_TYPE_UINT32; memcpy(&r.bits_, &v, 4); return r; }
GGUFValue GGUFValue::i32(int32_t v) { GGUFValue r; r.type_ = GGUF_TYPE_INT32; memcpy(&r.bits_, &v, 4); return r; }
GGUFValue GGUFValue::f32(float v) { GGUFValue r; r.type_ = GGUF_TYPE_FLOAT32; memcpy(&r.bits_, &v, 4); return r; }
GGUFValue GGUFValue::boolean(bool v) { GGUFValue r; r.type_ = GGUF_TYPE_BOOL; r.bits_ = v ? 1 : 0; return r; }
GGUFValue GGUFValue::u64(uint64_t v) { GGUFValue r; r.type_ = GGUF_TYPE_UINT64; r.bits_ = v; return r; }
GGUFValue GGUFValue::i64(int64_t v) { GGUFValue r; r.type_ = GGUF_TYPE_INT64; memcpy(&r.bits_, &v, 8); return r; }
GGUFValue GGUFValue::f64(double v) { GGUFValue r; r.type_ = GGUF_TYPE_FLOAT64; memcpy(&r.bits_, &v, 8); return r; }
GGUFValue GGUFValue::string(std::string v) { GGUFValue r; r.type_ = GGUF_TYPE_STRING; r.str_ = std::move(v); return r; }

GGUFValue GGUFValue::array(gguf_type elem_type, const void* data, size_t n) {
    GGUFValue r;
    r.type_ = GGUF_TYPE_ARRAY;
    r.elem_type_ = elem_type;
    r.n_ = n;
    const size_t sz = scalar_size(elem_type);
    if (sz && n) r.raw_.assign((const uint8_t*)data, (const uint8_t*)data + sz * n);
    return r;
}

GGUFValue GGUFValue::string_array(std::vector<std::string> v) {
    GGUFValue r;
    r.type_ = GGUF_TYPE_ARRAY;
    r.elem_type_ = GGUF_TYPE_STRING;
    r.n_ = v.size();
    r.strs_ = std::move(v);
    return r;
}

GGUFValue GGUFValue::array_of_arrays(std::vector<GGUFValue> v) {
    GGUFValue r;
    r.type_ = GGUF_TYPE_ARRAY;
    r.elem_type_ = GGUF_TYPE_ARRAY;
    r.n_ = v.size();
    r.arrs_ = std::move(v);
    return r;
}

bool GGUFValue::is_integer() const { return is_int_type(type_); }

bool GGUFValue::to_i64(int64_t* out) const {
    return scalar_to_i64(type_, (const uint8_t*)&bits_, out);
}

bool GGUFValue::to_u64(uint64_t* out) const {
    if (!is_int_type(type_)) return false;
    Scalar s = decode_scalar(type_, (const uint8_t*)&bits_);
    if (s.neg && s.mag) return false;
    *out = s.mag;
    return true;
}

bool GGUFValue::to_f64(double* out) const {
    if (!is_int_type(type_) && !is_float()) return false;
    *out = decode_scalar(type_, (const uint8_t*)&bits_).f;
    return true;
}

bool GGUFValue::to_bool(bool* out) const {
    if (type_ != GGUF_TYPE_BOOL) return false;
    *out = bits_ != 0;
    return true;
}

bool GGUFValue::array_i64(size_t i, int64_t* out) const {
    if (type_ != GGUF_TYPE_ARRAY || i >= n_ || !is_int_type(elem_type_)) return false;
    return scalar_to_i64(elem_type_, raw_.data() + i * scalar_size(elem_type_), out);
}

bool GGUFValue::array_f64(size_t i, double* out) const {
    if (type_ != GGUF_TYPE_ARRAY || i >= n_ || !scalar_size(elem_type_)) return false;
    *out = decode_scalar(elem_type_, raw_.data() + i * scalar_size(elem_type_)).f;
    return true;
}

std::string GGUFValue::to_string(size_t max_elems, size_t max_chars) const {
    if (type_ == GGUF_TYPE_STRING) return "\"" + escape(str_, max_chars) + "\"";
    if (type_ != GGUF_TYPE_ARRAY) return scalar_to_string(type_, (const uint8_t*)&bits_);
    std::string o = "[";
    const size_t m = std::min(n_, max_elems);
    for (size_t i = 0; i < m; i++) {
        if (i) o += ", ";
        if (elem_type_ == GGUF_TYPE_STRING) o += "\"" + escape(strs_[i], max_chars) + "\"";
        else if (elem_type_ == GGUF_TYPE_ARRAY) o += arrs_[i].to_string(max_elems, max_chars);
        else o += scalar_to_string(elem_type_, raw_.data() + i * scalar_size(elem_type_));
    }
    if (n_ > m) o += fmt(", ... (%zu elements)", n_);
    return o + "]";
}

bool GGUFValue::operator==(const GGUFValue& o) const {
    if (type_ != o.type_) return false;
    if (type_ == GGUF_TYPE_STRING) return str_ == o.str_;
    if (type_ != GGUF_TYPE_ARRAY) return bits_ == o.bits_;
    return elem_type_ == o.elem_type_ && n_ == o.n_ && raw_ == o.raw_ && strs_ == o.strs_ &&
           arrs_ == o.arrs_;
}

// Serialization of values (friend of GGUFValue).
struct GGUFValueIO {
    static constexpr int kMaxDepth = 16;

    static bool read_string(Cursor& c, std::string* s) {
        uint64_t len;
        if (!c.u64(&len) || len > c.left()) return false;
        s->assign((const char*)c.p + c.pos, (size_t)len);
        c.pos += (size_t)len;
        return true;
    }

    // Reads a value of type `t`; `why` receives the reason on failure. The value's own object is
    // accounted by the caller; its payload (strings, array elements) is taken from `mem`
    // before it is allocated.
    static bool read(Cursor& c, uint32_t t, GGUFValue* v, int depth, MemBudget& mem, size_t file_size, std::string* why) {
        if (t >= GGUF_TYPE_COUNT) { *why = fmt("unknown value type %u", t); return false; }
        v->type_ = (gguf_type)t;
        if (t == GGUF_TYPE_STRING) {
            if (!read_string(c, &v->str_)) { *why = std::string("string runs past the end of the file") + kTruncOrCorrupt; return false; }
            if (!mem.take(v->str_.size())) { *why = budget_message(mem, file_size); return false; }
            return true;
        }
        if (t != GGUF_TYPE_ARRAY) {
            const size_t sz = scalar_size(t);
            v->bits_ = 0;
            if (!c.bytes(&v->bits_, sz)) { *why = kTruncated; return false; }
            return true;
        }
        if (depth >= kMaxDepth) { *why = fmt("arrays nested deeper than %d levels", kMaxDepth); return false; }
        uint32_t et;
        uint64_t n;
        if (!c.u32(&et) || !c.u64(&n)) { *why = kTruncated; return false; }
        if (et >= GGUF_TYPE_COUNT) { *why = fmt("array of unknown value type %u", et); return false; }
        v->elem_type_ = (gguf_type)et;
        const size_t min_elem = et == GGUF_TYPE_STRING ? 8 : et == GGUF_TYPE_ARRAY ? 12 : scalar_size(et);
        if (n > c.left() / min_elem) {
            *why = fmt("array of %" PRIu64 " %s elements cannot fit in the %zu bytes left in the file%s",
                       n, gguf_type_name(et), c.left(), kTruncOrCorrupt);
            return false;
        }
        v->n_ = (size_t)n;
        const uint64_t elem_mem = et == GGUF_TYPE_STRING ? sizeof(std::string) : et == GGUF_TYPE_ARRAY ? sizeof(GGUFValue) : min_elem;
        if (!mem.take(n * elem_mem)) { *why = budget_message(mem, file_size); return false; }
        if (et == GGUF_TYPE_STRING) {
            v->strs_.resize(v->n_);
            for (size_t i = 0; i < v->n_; i++) {
                if (!read_string(c, &v->strs_[i])) { *why = fmt("array string %zu runs past the end of the file%s", i, kTruncOrCorrupt); return false; }
                if (!mem.take(MemBudget::string_bytes(v->strs_[i].size()) - sizeof(std::string))) { *why = budget_message(mem, file_size); return false; }
            }
        } else if (et == GGUF_TYPE_ARRAY) {
            v->arrs_.resize(v->n_);
            for (size_t i = 0; i < v->n_; i++)
                if (!read(c, GGUF_TYPE_ARRAY, &v->arrs_[i], depth + 1, mem, file_size, why)) return false;
        } else {
            v->raw_.resize(v->n_ * min_elem);
            if (!c.bytes(v->raw_.data(), v->raw_.size())) { *why = kTruncated; return false; }
        }
        return true;
    }

    static void put(std::string& o, const void* p, size_t n) { o.append((const char*)p, n); }
    static void put_u32(std::string& o, uint32_t v) { put(o, &v, 4); }
    static void put_u64(std::string& o, uint64_t v) { put(o, &v, 8); }
    static void put_str(std::string& o, const std::string& s) { put_u64(o, s.size()); o += s; }

    // Appends the value's payload (without its type tag).
    static void write(std::string& o, const GGUFValue& v) {
        if (v.type_ == GGUF_TYPE_STRING) { put_str(o, v.str_); return; }
        if (v.type_ != GGUF_TYPE_ARRAY) { put(o, &v.bits_, scalar_size(v.type_)); return; }
        put_u32(o, v.elem_type_);
        put_u64(o, v.n_);
        if (v.elem_type_ == GGUF_TYPE_STRING) for (auto& s : v.strs_) put_str(o, s);
        else if (v.elem_type_ == GGUF_TYPE_ARRAY) for (auto& a : v.arrs_) write(o, a);
        else if (!v.raw_.empty()) o.append((const char*)v.raw_.data(), v.raw_.size());
    }

    // Checks that a value built by the caller is well formed (array of arrays holds arrays, ...).
    static bool valid(const GGUFValue& v, std::string* why, int depth = 0) {
        if (v.type_ >= GGUF_TYPE_COUNT) { *why = fmt("unknown value type %u", v.type_); return false; }
        if (v.type_ != GGUF_TYPE_ARRAY) return true;
        if (depth >= kMaxDepth) { *why = "arrays nested too deeply"; return false; }
        if (v.elem_type_ >= GGUF_TYPE_COUNT) { *why = fmt("array of unknown value type %u", v.elem_type_); return false; }
        if (v.elem_type_ == GGUF_TYPE_ARRAY) {
            for (auto& a : v.arrs_) {
                if (a.type_ != GGUF_TYPE_ARRAY) { *why = "array of arrays holds a non-array element"; return false; }
                if (!valid(a, why, depth + 1)) return false;
            }
        }
        return true;
    }
};

// ---------------------------------------------------------------------------------------------
// GGUFTensorInfo

std::vector<int64_t> GGUFTensorInfo::shape() const {
    std::vector<int64_t> s;
    for (int i = (int)n_dims - 1; i >= 0; i--) s.push_back(ne[i]);
    return s;
}

// ---------------------------------------------------------------------------------------------
// GGUFReader

GGUFReader::GGUFReader() = default;
GGUFReader::~GGUFReader() { close(); }

GGUFReader::GGUFReader(GGUFReader&& o) noexcept { *this = std::move(o); }

GGUFReader& GGUFReader::operator=(GGUFReader&& o) noexcept {
    if (this != &o) {
        close();
        path_ = std::move(o.path_);
        data_ = o.data_; size_ = o.size_; map_ = o.map_; map_size_ = o.map_size_;
        version_ = o.version_; alignment_ = o.alignment_; data_offset_ = o.data_offset_;
        kv_ = std::move(o.kv_); tensors_ = std::move(o.tensors_);
        kv_index_ = std::move(o.kv_index_); tensor_index_ = std::move(o.tensor_index_);
        o.data_ = nullptr; o.size_ = 0; o.map_ = nullptr; o.map_size_ = 0;
    }
    return *this;
}

void GGUFReader::close() {
    if (map_) munmap(map_, map_size_);
    map_ = nullptr; map_size_ = 0; data_ = nullptr; size_ = 0;
    version_ = 0; alignment_ = GGUF_DEFAULT_ALIGNMENT; data_offset_ = 0;
    kv_.clear(); tensors_.clear(); kv_index_.clear(); tensor_index_.clear();
}

gguf_status GGUFReader::open(const std::string& path, std::string* err, const GGUFReadOptions& opt) {
    close();
    path_ = path;
    // O_NONBLOCK: opening a FIFO returns at once (the check below refuses it) instead of waiting for a
    // writer; a regular file ignores the flag
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        set_err(err, path + ": cannot open: " + strerror(errno));
        return GGUF_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        set_err(err, path + ": cannot stat: " + strerror(errno));
        ::close(fd);
        return GGUF_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, path + (S_ISDIR(st.st_mode) ? ": is a directory, not a GGUF file" : std::string(": not a regular file (") + file_kind_name(st.st_mode) + ")"));
        ::close(fd);
        return GGUF_ERR_IO;
    }
    if (st.st_size == 0) {
        ::close(fd);
        set_err(err, path + ": empty file (not GGUF)");
        return GGUF_ERR_FORMAT;
    }
    void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) {
        set_err(err, path + ": cannot mmap: " + strerror(errno));
        return GGUF_ERR_IO;
    }
    map_ = m;
    map_size_ = (size_t)st.st_size;
    data_ = (const uint8_t*)m;
    size_ = map_size_;
    gguf_status s = parse(err, opt);
    if (s != GGUF_OK) {
        std::string p = path_;
        close();
        path_ = p;
    }
    return s;
}

void GGUFReader::release(const void* p, size_t n) const { mapped_release(map_, map_size_, p, n); }

gguf_status GGUFReader::open_memory(const void* data, size_t size, std::string* err,
                                    const GGUFReadOptions& opt) {
    close();
    path_ = "<memory>";
    data_ = (const uint8_t*)data;
    size_ = size;
    gguf_status s = parse(err, opt);
    if (s != GGUF_OK) close();
    return s;
}

gguf_status GGUFReader::parse(std::string* err, const GGUFReadOptions& opt) {
    auto fail = [&](gguf_status s, const std::string& msg) {
        set_err(err, path_ + ": " + msg);
        return s;
    };
    Cursor c{data_, size_};
    char magic[4];
    if (!c.bytes(magic, 4)) return fail(GGUF_ERR_FORMAT, "file is truncated: too short for a GGUF header");
    if (memcmp(magic, "GGUF", 4) != 0)
        return fail(GGUF_ERR_FORMAT, fmt("bad magic %02x %02x %02x %02x: not a GGUF file",
                                         (uint8_t)magic[0], (uint8_t)magic[1], (uint8_t)magic[2], (uint8_t)magic[3]));
    if (!c.u32(&version_)) return fail(GGUF_ERR_FORMAT, "file is truncated in the header");
    if (version_ == 1) return fail(GGUF_ERR_UNSUPPORTED, "GGUF version 1 is not supported (only versions 2 and 3)");
    if (version_ != 2 && version_ != 3) {
        if ((version_ & 0xffff) == 0 && (version_ >> 24) >= 1 && (version_ >> 24) <= 3)
            return fail(GGUF_ERR_UNSUPPORTED, fmt("GGUF version 0x%08x looks like a big-endian file, which is not supported", version_));
        return fail(GGUF_ERR_FORMAT, fmt("bad GGUF version %u (supported: 2 and 3)", version_));
    }
    uint64_t n_tensors, n_kv;
    if (!c.u64(&n_tensors) || !c.u64(&n_kv)) return fail(GGUF_ERR_FORMAT, "file is truncated in the header");
    // Every key/value needs at least 13 bytes, every tensor info at least 24. Counts the rest of
    // the file cannot hold mean either a file cut short (a plausible count) or a corrupt count (one
    // no real file has: more than kMaxPlausibleCount).
    constexpr uint64_t kMaxPlausibleCount = 1ull << 24;
    if (n_kv > c.left() / 13 || n_tensors > c.left() / 24 || n_kv * 13 + n_tensors * 24 > c.left()) {
        if (n_kv > kMaxPlausibleCount && n_kv > c.left() / 13)
            return fail(GGUF_ERR_FORMAT, fmt("absurd metadata count %" PRIu64 " for a file of %zu bytes", n_kv, size_));
        if (n_tensors > kMaxPlausibleCount && n_tensors > c.left() / 24)
            return fail(GGUF_ERR_FORMAT, fmt("absurd tensor count %" PRIu64 " for a file of %zu bytes", n_tensors, size_));
        return fail(GGUF_ERR_FORMAT,
                    fmt("file is truncated: its header declares %" PRIu64 " metadata entries and %" PRIu64
                        " tensors, which need at least %" PRIu64 " bytes, but the file ends after %zu bytes",
                        n_kv, n_tensors, (uint64_t)c.pos + n_kv * 13 + n_tensors * 24, size_));
    }

    // Each entry: the (key, value) pair, its index entry and the key's copy in the index; each
    // tensor info and its index entry (names below). Taken before reserving.
    MemBudget mem;
    mem.limit = kMetaMemPerFileByte * (uint64_t)size_ + kMetaMemSlack;
    constexpr uint64_t kv_mem = sizeof(std::pair<std::string, GGUFValue>) + sizeof(std::pair<std::string, size_t>);
    constexpr uint64_t tensor_mem = sizeof(GGUFTensorInfo) + sizeof(std::pair<std::string, size_t>);
    if (!mem.take(n_kv * kv_mem) || !mem.take(n_tensors * tensor_mem)) return fail(GGUF_ERR_FORMAT, budget_message(mem, size_));
    kv_.reserve((size_t)n_kv);
    std::string why;
    for (uint64_t i = 0; i < n_kv; i++) {
        const size_t at = c.pos;
        std::string key;
        if (!GGUFValueIO::read_string(c, &key))
            return fail(GGUF_ERR_FORMAT, fmt("metadata entry %" PRIu64 " at byte %zu: key runs past the end of the file%s", i, at, kTruncOrCorrupt));
        if (!mem.take(2 * (MemBudget::string_bytes(key.size()) - sizeof(std::string))))
            return fail(GGUF_ERR_FORMAT, budget_message(mem, size_));
        uint32_t t;
        if (!c.u32(&t)) return fail(GGUF_ERR_FORMAT, fmt("metadata key '%s': file is truncated", escape(key, 100).c_str()));
        GGUFValue v;
        if (!GGUFValueIO::read(c, t, &v, 0, mem, size_, &why))
            return fail(GGUF_ERR_FORMAT, fmt("metadata key '%s' (byte %zu): %s", escape(key, 100).c_str(), at, why.c_str()));
        kv_.emplace_back(std::move(key), std::move(v));
    }
    kv_index_.reserve(kv_.size());
    for (size_t i = 0; i < kv_.size(); i++) kv_index_.emplace_back(kv_[i].first, i);
    std::sort(kv_index_.begin(), kv_index_.end());
    for (size_t i = 1; i < kv_index_.size(); i++)
        if (kv_index_[i].first == kv_index_[i - 1].first)
            return fail(GGUF_ERR_FORMAT, "duplicate metadata key '" + escape(kv_index_[i].first, 100) + "'");

    if (const GGUFValue* a = find(GGUF_KEY_ALIGNMENT)) {
        uint64_t al;
        if (a->type() != GGUF_TYPE_UINT32 || !a->to_u64(&al))
            return fail(GGUF_ERR_FORMAT, std::string("general.alignment must be uint32, not ") + gguf_type_name(a->type()));
        if (al == 0 || (al & (al - 1)) != 0)
            return fail(GGUF_ERR_FORMAT, fmt("general.alignment %" PRIu64 " is not a power of two", al));
        alignment_ = (uint32_t)al;
    }

    tensors_.reserve((size_t)n_tensors);
    for (uint64_t i = 0; i < n_tensors; i++) {
        GGUFTensorInfo t;
        const size_t at = c.pos;
        if (!GGUFValueIO::read_string(c, &t.name))
            return fail(GGUF_ERR_FORMAT, fmt("tensor info %" PRIu64 " at byte %zu: name runs past the end of the file%s", i, at, kTruncOrCorrupt));
        if (!mem.take(2 * (MemBudget::string_bytes(t.name.size()) - sizeof(std::string))))
            return fail(GGUF_ERR_FORMAT, budget_message(mem, size_));
        const std::string nm = "tensor '" + escape(t.name, 100) + "'";
        if (!c.u32(&t.n_dims)) return fail(GGUF_ERR_FORMAT, nm + ": file is truncated");
        if (t.n_dims == 0 || t.n_dims > (uint32_t)GGUF_MAX_DIMS)
            return fail(GGUF_ERR_FORMAT, nm + fmt(": %u dimensions (must be 1..%d)", t.n_dims, GGUF_MAX_DIMS));
        for (uint32_t d = 0; d < t.n_dims; d++) {
            uint64_t v;
            if (!c.u64(&v)) return fail(GGUF_ERR_FORMAT, nm + ": file is truncated");
            if (v > (uint64_t)INT64_MAX) return fail(GGUF_ERR_FORMAT, nm + fmt(": dimension %u is %" PRIu64 ", too large", d, v));
            t.ne[d] = (int64_t)v;
        }
        if (!c.u32(&t.type) || !c.u64(&t.offset)) return fail(GGUF_ERR_FORMAT, nm + ": file is truncated");
        const TypeTraits* tr = traits(t.type);
        if (!tr) return fail(GGUF_ERR_FORMAT, nm + ": " + tensor_type_desc(t.type));
        if (!gguf_tensor_type_supported(t.type) && !opt.allow_unsupported_types)
            return fail(GGUF_ERR_UNSUPPORTED, nm + " has type " + tensor_type_desc(t.type) +
                                                  ", which ggml-oomb cannot read (supported: " + gguf_tensor_types_supported_list() + ")");
        int64_t ne = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            if (__builtin_mul_overflow(ne, t.ne[d], &ne))
                return fail(GGUF_ERR_FORMAT, nm + ": element count overflows (shape too large)");
        if (t.ne[0] % tr->block != 0)
            return fail(GGUF_ERR_FORMAT, nm + fmt(": row length %" PRId64 " is not a multiple of the %s block size %" PRId64,
                                                  t.ne[0], tr->name, tr->block));
        uint64_t nbytes;
        if (__builtin_mul_overflow((uint64_t)(ne / tr->block), (uint64_t)tr->bytes, &nbytes))
            return fail(GGUF_ERR_FORMAT, nm + ": byte size overflows (shape too large)");
        t.nbytes = nbytes;
        tensors_.push_back(std::move(t));
    }
    tensor_index_.reserve(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); i++) tensor_index_.emplace_back(tensors_[i].name, i);
    std::sort(tensor_index_.begin(), tensor_index_.end());
    for (size_t i = 1; i < tensor_index_.size(); i++)
        if (tensor_index_[i].first == tensor_index_[i - 1].first)
            return fail(GGUF_ERR_FORMAT, "duplicate tensor name '" + escape(tensor_index_[i].first, 100) + "'");

    // Data section: aligned after the tensor infos.
    data_offset_ = ((uint64_t)c.pos + alignment_ - 1) / alignment_ * alignment_;
    const uint64_t data_size = data_offset_ <= size_ ? size_ - data_offset_ : 0;
    std::vector<size_t> order;
    for (size_t i = 0; i < tensors_.size(); i++) {
        const GGUFTensorInfo& t = tensors_[i];
        const std::string nm = "tensor '" + escape(t.name, 100) + "'";
        if (t.offset % alignment_ != 0)
            return fail(GGUF_ERR_FORMAT, nm + fmt(": data offset %" PRIu64 " is not a multiple of the alignment %u", t.offset, alignment_));
        uint64_t end;
        if (__builtin_add_overflow(t.offset, t.nbytes, &end) || end > data_size)
            return fail(GGUF_ERR_FORMAT, nm + fmt(": data [%" PRIu64 ", +%" PRIu64 ") runs past the end of the file "
                                                  "(data section holds %" PRIu64 " bytes): file truncated or offset corrupt",
                                                  t.offset, t.nbytes, data_size));
        if (t.nbytes) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); k++) {
        const GGUFTensorInfo& p = tensors_[order[k - 1]];
        const GGUFTensorInfo& q = tensors_[order[k]];
        if (q.offset < p.offset + p.nbytes)
            return fail(GGUF_ERR_FORMAT, "tensors '" + escape(p.name, 100) + "' and '" + escape(q.name, 100) +
                                             "' overlap in the data section");
    }
    return GGUF_OK;
}

const GGUFValue* GGUFReader::find(const std::string& key) const {
    auto it = std::lower_bound(kv_index_.begin(), kv_index_.end(), key,
                               [](const std::pair<std::string, size_t>& a, const std::string& k) { return a.first < k; });
    if (it == kv_index_.end() || it->first != key) return nullptr;
    return &kv_[it->second].second;
}

const GGUFTensorInfo* GGUFReader::find_tensor(const std::string& name) const {
    auto it = std::lower_bound(tensor_index_.begin(), tensor_index_.end(), name,
                               [](const std::pair<std::string, size_t>& a, const std::string& k) { return a.first < k; });
    if (it == tensor_index_.end() || it->first != name) return nullptr;
    return &tensors_[it->second];
}

const uint8_t* GGUFReader::tensor_data(const GGUFTensorInfo& t) const {
    return data_ + data_offset_ + t.offset;
}

namespace {
gguf_status lookup(const GGUFReader& r, const std::string& key, const GGUFValue** v, std::string* err) {
    *v = r.find(key);
    if (!*v) {
        set_err(err, r.path() + ": missing metadata key '" + key + "'");
        return GGUF_ERR_NOT_FOUND;
    }
    return GGUF_OK;
}
gguf_status type_error(const GGUFReader& r, const std::string& key, const GGUFValue& v, const char* want, std::string* err) {
    std::string got = gguf_type_name(v.type());
    if (v.is_array()) got += std::string(" of ") + gguf_type_name(v.array_type());
    set_err(err, r.path() + ": metadata key '" + key + "' has type " + got + " (value " + v.to_string(4, 60) +
                     "), expected " + want);
    return GGUF_ERR_TYPE;
}
} // namespace

gguf_status GGUFReader::get_u32(const std::string& key, uint32_t* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    uint64_t u;
    if (!v->to_u64(&u) || u > UINT32_MAX) return type_error(*this, key, *v, "an unsigned integer that fits in 32 bits", err);
    *out = (uint32_t)u;
    return GGUF_OK;
}

gguf_status GGUFReader::get_i64(const std::string& key, int64_t* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    if (!v->to_i64(out)) return type_error(*this, key, *v, "an integer", err);
    return GGUF_OK;
}

gguf_status GGUFReader::get_f32(const std::string& key, float* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    double d;
    if (!v->is_float() || !v->to_f64(&d)) return type_error(*this, key, *v, "float32 or float64", err);
    *out = (float)d;
    return GGUF_OK;
}

gguf_status GGUFReader::get_bool(const std::string& key, bool* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    if (!v->to_bool(out)) return type_error(*this, key, *v, "bool", err);
    return GGUF_OK;
}

gguf_status GGUFReader::get_string(const std::string& key, std::string* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    if (v->type() != GGUF_TYPE_STRING) return type_error(*this, key, *v, "string", err);
    *out = v->str();
    return GGUF_OK;
}

gguf_status GGUFReader::get_string_array(const std::string& key, std::vector<std::string>* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    if (!v->is_array() || v->array_type() != GGUF_TYPE_STRING) return type_error(*this, key, *v, "array of string", err);
    *out = v->strings();
    return GGUF_OK;
}

gguf_status GGUFReader::get_i32_array(const std::string& key, std::vector<int32_t>* out, std::string* err) const {
    const GGUFValue* v;
    if (gguf_status s = lookup(*this, key, &v, err)) return s;
    if (!v->is_array() || !is_int_type(v->array_type())) return type_error(*this, key, *v, "array of integers", err);
    out->resize(v->array_size());
    for (size_t i = 0; i < v->array_size(); i++) {
        int64_t x;
        if (!v->array_i64(i, &x) || x < INT32_MIN || x > INT32_MAX) {
            set_err(err, path_ + fmt(": metadata key '%s': element %zu does not fit in int32", key.c_str(), i));
            return GGUF_ERR_TYPE;
        }
        (*out)[i] = (int32_t)x;
    }
    return GGUF_OK;
}

gguf_status GGUFReader::read_tensor(const std::string& name, uint32_t out_type, void* dst, size_t dst_bytes,
                                    std::string* err) const {
    const GGUFTensorInfo* t = find_tensor(name);
    if (!t) {
        set_err(err, path_ + ": no tensor named '" + name + "'");
        return GGUF_ERR_NOT_FOUND;
    }
    return read_tensor(*t, out_type, dst, dst_bytes, err);
}

gguf_status GGUFReader::read_tensor(const GGUFTensorInfo& t, uint32_t out_type, void* dst, size_t dst_bytes,
                                    std::string* err) const {
    if (out_type != GGUF_TENSOR_F32 && out_type != GGUF_TENSOR_F16 && out_type != GGUF_TENSOR_BF16) {
        set_err(err, path_ + ": tensor '" + t.name + "': cannot read as " + tensor_type_desc(out_type) +
                         " (output type must be F32, F16 or BF16)");
        return GGUF_ERR_ARG;
    }
    if (!gguf_tensor_type_supported(t.type)) {
        set_err(err, path_ + ": tensor '" + t.name + "' has type " + tensor_type_desc(t.type) +
                         ", which ggml-oomb cannot read (supported: " + gguf_tensor_types_supported_list() + ")");
        return GGUF_ERR_UNSUPPORTED;
    }
    const size_t want = (size_t)t.nelements() * gguf_tensor_type_block_bytes(out_type);
    if (dst_bytes != want) {
        set_err(err, path_ + fmt(": tensor '%s': destination holds %zu bytes, the tensor needs %zu as %s",
                                 t.name.c_str(), dst_bytes, want, gguf_tensor_type_name(out_type)));
        return GGUF_ERR_ARG;
    }
    std::string e;
    if (gguf_convert(t.type, tensor_data(t), out_type, dst, t.nelements(), &e) != GGUF_OK) {
        set_err(err, path_ + ": tensor '" + t.name + "': " + e);
        return GGUF_ERR_UNSUPPORTED;
    }
    return GGUF_OK;
}

gguf_status GGUFReader::read_tensor_f32(const std::string& name, std::vector<float>* out, std::string* err) const {
    const GGUFTensorInfo* t = find_tensor(name);
    if (!t) {
        set_err(err, path_ + ": no tensor named '" + name + "'");
        return GGUF_ERR_NOT_FOUND;
    }
    out->resize((size_t)t->nelements());
    return read_tensor(*t, GGUF_TENSOR_F32, out->data(), out->size() * sizeof(float), err);
}

// ---------------------------------------------------------------------------------------------
// GGUFWriter

GGUFWriter::GGUFWriter() = default;
GGUFWriter::~GGUFWriter() { abort(); }

gguf_status GGUFWriter::set(const std::string& key, GGUFValue v, std::string* err) {
    std::string why;
    if (!GGUFValueIO::valid(v, &why)) {
        set_err(err, "metadata key '" + key + "': " + why);
        return GGUF_ERR_ARG;
    }
    if (opened_) {
        set_err(err, "metadata key '" + key + "': cannot set metadata after open()");
        return GGUF_ERR_ARG;
    }
    if (key == GGUF_KEY_ALIGNMENT) {
        uint64_t a = 0;
        if (v.type() != GGUF_TYPE_UINT32 || !v.to_u64(&a) || a == 0 || (a & (a - 1)) != 0) {
            set_err(err, "general.alignment must be a uint32 power of two");
            return GGUF_ERR_ARG;
        }
        alignment_ = (uint32_t)a;
    }
    for (auto& kv : kv_)
        if (kv.first == key) { kv.second = std::move(v); return GGUF_OK; }
    kv_.emplace_back(key, std::move(v));
    return GGUF_OK;
}

bool GGUFWriter::has(const std::string& key) const {
    for (auto& kv : kv_) if (kv.first == key) return true;
    return false;
}

void GGUFWriter::remove(const std::string& key) {
    if (opened_) return;
    for (size_t i = 0; i < kv_.size(); i++)
        if (kv_[i].first == key) {
            kv_.erase(kv_.begin() + (ptrdiff_t)i);
            if (key == GGUF_KEY_ALIGNMENT) alignment_ = GGUF_DEFAULT_ALIGNMENT;
            return;
        }
}

gguf_status GGUFWriter::set_alignment(uint32_t a, std::string* err) {
    return set(GGUF_KEY_ALIGNMENT, GGUFValue::u32(a), err);
}

gguf_status GGUFWriter::add_tensor(const std::string& name, uint32_t type, const std::vector<int64_t>& ne,
                                   std::string* err) {
    const std::string nm = "tensor '" + name + "'";
    if (opened_) { set_err(err, nm + ": cannot add tensors after open()"); return GGUF_ERR_ARG; }
    const TypeTraits* tr = traits(type);
    if (!tr) { set_err(err, nm + ": " + tensor_type_desc(type)); return GGUF_ERR_ARG; }
    if (ne.empty() || ne.size() > (size_t)GGUF_MAX_DIMS) {
        set_err(err, nm + fmt(": %zu dimensions (must be 1..%d)", ne.size(), GGUF_MAX_DIMS));
        return GGUF_ERR_ARG;
    }
    for (auto& t : tensors_)
        if (t.name == name) { set_err(err, "duplicate tensor name '" + name + "'"); return GGUF_ERR_ARG; }
    GGUFTensorInfo t;
    t.name = name;
    t.type = type;
    t.n_dims = (uint32_t)ne.size();
    int64_t n = 1;
    for (size_t d = 0; d < ne.size(); d++) {
        if (ne[d] < 0) { set_err(err, nm + fmt(": negative dimension %" PRId64, ne[d])); return GGUF_ERR_ARG; }
        t.ne[d] = ne[d];
        if (__builtin_mul_overflow(n, ne[d], &n)) { set_err(err, nm + ": element count overflows"); return GGUF_ERR_ARG; }
    }
    if (t.ne[0] % tr->block != 0) {
        set_err(err, nm + fmt(": row length %" PRId64 " is not a multiple of the %s block size %" PRId64, t.ne[0], tr->name, tr->block));
        return GGUF_ERR_ARG;
    }
    if (__builtin_mul_overflow((uint64_t)(n / tr->block), (uint64_t)tr->bytes, &t.nbytes)) {
        set_err(err, nm + ": byte size overflows");
        return GGUF_ERR_ARG;
    }
    tensors_.push_back(std::move(t));
    return GGUF_OK;
}

void GGUFWriter::layout() {
    uint64_t off = 0;
    for (auto& t : tensors_) {
        off = (off + alignment_ - 1) / alignment_ * alignment_;
        t.offset = off;
        off += t.nbytes;
    }
}

gguf_status GGUFWriter::put(const void* p, size_t n, std::string* err) {
    if (n && fwrite(p, 1, n, (FILE*)file_) != n) {
        set_err(err, "cannot write " + path_ + ": " + strerror(errno));
        return GGUF_ERR_IO;
    }
    written_ += n;
    return GGUF_OK;
}

gguf_status GGUFWriter::pad_to(uint64_t multiple, std::string* err) {
    static const uint8_t zeros[256] = {0};
    uint64_t rem = (written_ - data_start_) % multiple;
    if (rem == 0) return GGUF_OK;
    uint64_t pad = multiple - rem;
    while (pad) {
        size_t k = (size_t)std::min<uint64_t>(pad, sizeof zeros);
        if (gguf_status s = put(zeros, k, err)) return s;
        pad -= k;
    }
    return GGUF_OK;
}

gguf_status GGUFWriter::open(const std::string& path, std::string* err) {
    if (opened_) { set_err(err, path + ": writer already open"); return GGUF_ERR_ARG; }
    std::string target;
    bool special = false;
    if (const std::string e = output_target(path, false, &target, &special); !e.empty()) {
        set_err(err, e);
        return GGUF_ERR_IO;
    }
    path_ = target;  // (a symbolic link: the file it names is replaced)
    tmp_path_ = target + ".tmp." + std::to_string(getpid());
    tmp_id_ = temp_file_register(tmp_path_); // before it exists: a signal may come at any time
    FILE* f = fopen(tmp_path_.c_str(), "wb");
    if (!f) {
        const int e = errno;
        temp_file_unregister(tmp_id_);
        tmp_id_ = -1;
        set_err(err, temp_file_create_error(target, tmp_path_, e));
        return GGUF_ERR_IO;
    }
    file_ = f;
    setvbuf(f, nullptr, _IOFBF, 1 << 22);
    opened_ = true;
    written_ = 0;
    data_start_ = 0;
    layout();

    std::string h;
    h.append("GGUF", 4);
    GGUFValueIO::put_u32(h, GGUF_VERSION);
    GGUFValueIO::put_u64(h, tensors_.size());
    GGUFValueIO::put_u64(h, kv_.size());
    for (auto& kv : kv_) {
        GGUFValueIO::put_str(h, kv.first);
        GGUFValueIO::put_u32(h, kv.second.type());
        GGUFValueIO::write(h, kv.second);
    }
    for (auto& t : tensors_) {
        GGUFValueIO::put_str(h, t.name);
        GGUFValueIO::put_u32(h, t.n_dims);
        for (uint32_t d = 0; d < t.n_dims; d++) GGUFValueIO::put_u64(h, (uint64_t)t.ne[d]);
        GGUFValueIO::put_u32(h, t.type);
        GGUFValueIO::put_u64(h, t.offset);
    }
    if (gguf_status s = put(h.data(), h.size(), err)) { abort(); return s; }
    if (gguf_status s = pad_to(alignment_, err)) { abort(); return s; }
    data_start_ = written_;
    cur_tensor_ = 0;
    cur_done_ = 0;
    return GGUF_OK;
}

gguf_status GGUFWriter::write_data(const void* data, size_t n, std::string* err) {
    if (!opened_) { set_err(err, "GGUF writer: write_data() before open()"); return GGUF_ERR_ARG; }
    const uint8_t* p = (const uint8_t*)data;
    while (true) {
        // Step over finished (or empty) tensors, padding after each.
        while (cur_tensor_ < tensors_.size() && cur_done_ == tensors_[cur_tensor_].nbytes) {
            if (gguf_status s = pad_to(alignment_, err)) return s;
            cur_tensor_++;
            cur_done_ = 0;
            if (n == 0) break;
        }
        if (n == 0) return GGUF_OK;
        if (cur_tensor_ >= tensors_.size()) {
            set_err(err, path_ + fmt(": %zu bytes of tensor data more than the tensors declared", n));
            return GGUF_ERR_ARG;
        }
        const GGUFTensorInfo& t = tensors_[cur_tensor_];
        const size_t take = (size_t)std::min<uint64_t>(n, t.nbytes - cur_done_);
        if (gguf_status s = put(p, take, err)) return s;
        p += take;
        n -= take;
        cur_done_ += take;
    }
}

gguf_status GGUFWriter::next_tensor(const std::string& name, uint64_t* nbytes, std::string* err) {
    if (!opened_) { set_err(err, "GGUF writer: write_tensor() before open()"); return GGUF_ERR_ARG; }
    // Skip empty tensors declared before this one.
    while (cur_tensor_ < tensors_.size() && cur_done_ == 0 && tensors_[cur_tensor_].nbytes == 0 &&
           tensors_[cur_tensor_].name != name) {
        cur_tensor_++;
    }
    if (cur_tensor_ >= tensors_.size() || tensors_[cur_tensor_].name != name || cur_done_ != 0) {
        set_err(err, path_ + ": tensor '" + name + "' written out of order (next expected: " +
                         (cur_tensor_ < tensors_.size() ? "'" + tensors_[cur_tensor_].name + "'" : std::string("none")) + ")");
        return GGUF_ERR_ARG;
    }
    *nbytes = tensors_[cur_tensor_].nbytes;
    return GGUF_OK;
}

gguf_status GGUFWriter::write_tensor(const std::string& name, const void* data, size_t nbytes, std::string* err) {
    uint64_t declared = 0;
    if (gguf_status s = next_tensor(name, &declared, err)) return s;
    if (nbytes != declared) {
        set_err(err, path_ + fmt(": tensor '%s': %zu bytes given, %" PRIu64 " declared", name.c_str(), nbytes, declared));
        return GGUF_ERR_ARG;
    }
    if (nbytes == 0) { cur_tensor_++; return GGUF_OK; }
    return write_data(data, nbytes, err);
}

gguf_status GGUFWriter::write_tensor_chunks(const std::string& name, size_t granule, const TensorChunkFill& fill,
                                            std::string* err) {
    uint64_t nbytes = 0;
    if (gguf_status s = next_tensor(name, &nbytes, err)) return s;
    if (nbytes == 0) { cur_tensor_++; return GGUF_OK; }
    return stream_chunks(nbytes, granule, fill,
                         [this](const void* p, size_t n, std::string* e) { return write_data(p, n, e); }, err);
}

size_t stream_chunk_bytes(uint64_t nbytes, size_t granule) {
    if (granule == 0) return 0;
    const size_t chunk = std::max(granule, kStagingBytes / granule * granule);
    return (size_t)std::min<uint64_t>(nbytes, chunk);
}

gguf_status stream_chunks(uint64_t nbytes, size_t granule, const TensorChunkFill& fill,
                          const std::function<gguf_status(const void* data, size_t n, std::string* err)>& sink,
                          std::string* err) {
    if (granule == 0) { set_err(err, "stream_chunks: granule 0"); return GGUF_ERR_ARG; }
    if (nbytes == 0) return GGUF_OK;
    const size_t chunk = stream_chunk_bytes(nbytes, granule);
    std::unique_ptr<uint8_t[]> stage(new uint8_t[chunk]); // uninitialized: fill writes every byte
    for (uint64_t off = 0; off < nbytes; off += chunk) {
        const size_t n = (size_t)std::min<uint64_t>(chunk, nbytes - off);
        if (gguf_status s = fill(stage.get(), off, n, err)) return s;
        if (gguf_status s = sink(stage.get(), n, err)) return s;
    }
    return GGUF_OK;
}

gguf_status GGUFWriter::finish(std::string* err) {
    if (!opened_) { set_err(err, "GGUF writer: finish() before open()"); return GGUF_ERR_ARG; }
    while (cur_tensor_ < tensors_.size() && cur_done_ == tensors_[cur_tensor_].nbytes) {
        if (gguf_status s = pad_to(alignment_, err)) { abort(); return s; }
        cur_tensor_++;
        cur_done_ = 0;
    }
    if (cur_tensor_ < tensors_.size()) {
        const GGUFTensorInfo& t = tensors_[cur_tensor_];
        set_err(err, path_ + fmt(": tensor '%s': only %" PRIu64 " of %" PRIu64 " bytes written (%zu tensors missing)",
                                 t.name.c_str(), cur_done_, t.nbytes, tensors_.size() - cur_tensor_));
        abort();
        return GGUF_ERR_ARG;
    }
    FILE* f = (FILE*)file_;
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) {
        set_err(err, "cannot write " + path_ + ": " + strerror(errno));
        abort();
        return GGUF_ERR_IO;
    }
    if (fclose(f) != 0) {
        file_ = nullptr;
        set_err(err, "cannot write " + path_ + " (closing it): " + strerror(errno));
        abort();
        return GGUF_ERR_IO;
    }
    file_ = nullptr;
    if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
        set_err(err, "cannot rename " + tmp_path_ + " to " + path_ + ": " + strerror(errno));
        abort();
        return GGUF_ERR_IO;
    }
    // Make the rename durable (best effort).
    std::string dir = path_.find('/') == std::string::npos ? "." : path_.substr(0, path_.rfind('/'));
    if (dir.empty()) dir = "/";
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); ::close(dfd); }
    temp_file_unregister(tmp_id_);
    tmp_id_ = -1;
    opened_ = false;
    tmp_path_.clear();
    return GGUF_OK;
}

void GGUFWriter::abort() {
    if (file_) { fclose((FILE*)file_); file_ = nullptr; }
    if (opened_ && !tmp_path_.empty()) unlink(tmp_path_.c_str());
    temp_file_unregister(tmp_id_);
    tmp_id_ = -1;
    opened_ = false;
    tmp_path_.clear();
}

} // namespace oomb
