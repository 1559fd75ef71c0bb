// GGUF v3 reader (memory mapped) and streaming, atomic writer.
//
// The format is llama.cpp's: a header ("GGUF", version, tensor count, key/value count), typed
// metadata key/value pairs, tensor infos (name, dims, ggml type, offset), then the tensor data,
// each tensor aligned to `general.alignment` (default 32) bytes from the start of the data section.
//
// Dimensions follow ggml: ne[0] is the innermost (contiguous) dimension, so a PyTorch tensor of
// shape [out_features, in_features] is stored with ne = {in_features, out_features}.
//
// Errors never abort: every fallible function returns a gguf_status (GGUF_OK on success) and, when
// `err` is not null, stores a message naming the file, the item and the problem.
// Only little-endian hosts are supported (as by llama.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace oomb {

// Status codes of the GGUF and safetensors functions.
enum gguf_status {
    GGUF_OK = 0,
    GGUF_ERR_IO,          // cannot open, map, read, write or rename a file
    GGUF_ERR_FORMAT,      // the bytes are not a valid GGUF file (truncated, bad magic, ...)
    GGUF_ERR_UNSUPPORTED, // valid, but uses something this library does not handle (e.g. Q4_K)
    GGUF_ERR_NOT_FOUND,   // no such key or tensor
    GGUF_ERR_TYPE,        // the key or tensor exists but has another type / shape
    GGUF_ERR_ARG,         // invalid argument from the caller (buffer size, call order, ...)
};

// Types of metadata values, numbered as in the GGUF specification.
enum gguf_type : uint32_t {
    GGUF_TYPE_UINT8   = 0,
    GGUF_TYPE_INT8    = 1,
    GGUF_TYPE_UINT16  = 2,
    GGUF_TYPE_INT16   = 3,
    GGUF_TYPE_UINT32  = 4,
    GGUF_TYPE_INT32   = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL    = 7,
    GGUF_TYPE_STRING  = 8,
    GGUF_TYPE_ARRAY   = 9,
    GGUF_TYPE_UINT64  = 10,
    GGUF_TYPE_INT64   = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT,
};

// Tensor element types, numbered exactly as ggml's `ggml_type`. Only the ones named here can be
// read into memory; every other ggml type is recognised by name (for messages and for listing)
// but reading it is an error.
enum gguf_tensor_type : uint32_t {
    GGUF_TENSOR_F32  = 0,
    GGUF_TENSOR_F16  = 1,
    GGUF_TENSOR_Q4_0 = 2,
    GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q5_0 = 6,
    GGUF_TENSOR_Q5_1 = 7,
    GGUF_TENSOR_Q8_0 = 8,
    GGUF_TENSOR_Q2_K = 10,
    GGUF_TENSOR_Q3_K = 11,
    GGUF_TENSOR_Q4_K = 12,
    GGUF_TENSOR_Q5_K = 13,
    GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_BF16 = 30,
};

constexpr uint32_t GGUF_VERSION = 3;
constexpr uint32_t GGUF_DEFAULT_ALIGNMENT = 32;
constexpr int GGUF_MAX_DIMS = 4;
constexpr const char* GGUF_KEY_ALIGNMENT = "general.alignment";

// Name of a metadata value type ("uint32", "string", ...), or "unknown".
const char* gguf_type_name(uint32_t type);

// Name of a ggml tensor type as ggml spells it ("F32", "Q4_K", "BF16", ...), or null when the
// number is not a ggml type.
const char* gguf_tensor_type_name(uint32_t type);

// True for the tensor types this library reads (dequantized on read, bit-exact against gguf-py's
// gguf.quants.dequantize): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K. Every other ggml type (Q8_1, Q8_K, IQ*, TQ*, MXFP4, ...) is named in an error.
bool gguf_tensor_type_supported(uint32_t type);
// The supported types as a comma-separated list of ggml names, for error messages.
const char* gguf_tensor_types_supported_list();

// Elements per block (1 for float types, 32 for Q4_0..Q8_0, 256 for K-quants) and bytes per
// block of a ggml type. Both are 0 for numbers that are not ggml types.
int64_t gguf_tensor_type_block_size(uint32_t type);
size_t gguf_tensor_type_block_bytes(uint32_t type);

// Converts `n` consecutive elements of type `src_type` (any supported type; for block types `n`
// must be a multiple of the block size) into `dst_type`, which must be F32, F16, BF16, Q8_0,
// Q5_0 (then `n` must be a multiple of 32), Q4_K, Q5_K or Q6_K (a multiple of 256): GGUF_ERR_ARG
// otherwise. Rounding is to nearest-even for the float types; Q8_0 quantizes as ggml's
// quantize_row_q8_0_ref and gguf-py's gguf.quants do (d = max|x| / 127 in f16, q =
// round-half-away-from-zero(x / d)), Q5_0 as ggml's quantize_row_q5_0_ref (bit-exact with gguf-py),
// the K-quants by the per-sub-block scale/min search of ggml's reference quantizers (no
// importance matrix; src/formats/quantize.h). Into a quantized type, a NaN or infinite value is
// GGUF_ERR_ARG naming the element index, and so is a block whose f16 scale would overflow.
// Converting a type into itself copies the bytes.
gguf_status gguf_convert(uint32_t src_type, const void* src, uint32_t dst_type, void* dst,
                         int64_t n, std::string* err);

// Checks that n f32 values x[0..n) stay finite in dst_type: false + *err ("element <index_base + i> is
// NaN" / "is inf" / "is 1e+06, beyond F16's range (+-65504)") for the first that is NaN or infinite,
// or, for F16 and BF16, a finite value that the rounding turns into an infinity. Writers of model files
// call it before gguf_convert (which writes such values into F16 / BF16 / F32 as they are; the quantized
// types refuse them and an overflowing block scale themselves): a file whose weights evaluate to NaN is
// never written. The one check of oomb-export and oomb-train's checkpoints.
bool gguf_check_finite_as(const float* x, int64_t n, int64_t index_base, uint32_t dst_type, std::string* err);

// What a file system entry of st_mode `mode` is, for errors about a path that should be a regular file:
// "a regular file", "a folder", "a FIFO", "a socket", "a character device", "a block device" (or "not a
// regular file"). The readers (GGUFReader, SafetensorsFile) open with O_NONBLOCK and refuse anything but
// a regular file with it, so a FIFO given as a model or state file is an error, not a blocked open.
const char* file_kind_name(unsigned mode);

// ---------------------------------------------------------------------------------------------
// A metadata value: a scalar, a string, or an array (of scalars, of strings, or of arrays).
class GGUFValue {
public:
    GGUFValue() = default; // uint8 0

    static GGUFValue u8(uint8_t v);
    static GGUFValue i8(int8_t v);
    static GGUFValue u16(uint16_t v);
    static GGUFValue i16(int16_t v);
    static GGUFValue u32(uint32_t v);
    static GGUFValue i32(int32_t v);
    static GGUFValue f32(float v);
    static GGUFValue boolean(bool v);
    static GGUFValue u64(uint64_t v);
    static GGUFValue i64(int64_t v);
    static GGUFValue f64(double v);
    static GGUFValue string(std::string v);

    // Array of numbers or bools: `elem_type` is a scalar type, `data` holds `n` little-endian
    // elements packed back to back (bool: one byte each, 0 or 1).
    static GGUFValue array(gguf_type elem_type, const void* data, size_t n);
    template <class T> static GGUFValue array(const std::vector<T>& v);
    static GGUFValue string_array(std::vector<std::string> v);
    // Array whose elements are arrays (each element must itself be an ARRAY value).
    static GGUFValue array_of_arrays(std::vector<GGUFValue> v);

    gguf_type type() const { return type_; }
    bool is_array() const { return type_ == GGUF_TYPE_ARRAY; }
    bool is_integer() const; // any of the 8 integer types
    bool is_float() const { return type_ == GGUF_TYPE_FLOAT32 || type_ == GGUF_TYPE_FLOAT64; }

    // Scalar readers. They return false when the value is not of a compatible type or does not fit
    // (to_i64/to_u64 accept every integer type; to_f64 accepts floats and integers).
    bool to_i64(int64_t* out) const;
    bool to_u64(uint64_t* out) const;
    bool to_f64(double* out) const;
    bool to_bool(bool* out) const;
    const std::string& str() const { return str_; } // STRING value (empty otherwise)

    // Arrays.
    gguf_type array_type() const { return elem_type_; } // element type when is_array()
    size_t array_size() const { return n_; }
    const uint8_t* array_data() const { return raw_.data(); }       // scalar elements, packed
    const std::vector<std::string>& strings() const { return strs_; } // STRING elements
    const std::vector<GGUFValue>& arrays() const { return arrs_; }    // ARRAY elements
    // Element i of a scalar array as integer / double (false when not convertible).
    bool array_i64(size_t i, int64_t* out) const;
    bool array_f64(size_t i, double* out) const;

    // Human readable form; arrays show at most `max_elems` elements, strings at most
    // `max_chars` characters (escaped).
    std::string to_string(size_t max_elems = 8, size_t max_chars = 200) const;

    bool operator==(const GGUFValue& o) const;
    bool operator!=(const GGUFValue& o) const { return !(*this == o); }

private:
    friend struct GGUFValueIO;
    gguf_type type_ = GGUF_TYPE_UINT8;
    gguf_type elem_type_ = GGUF_TYPE_UINT8;
    uint64_t bits_ = 0;              // scalar payload (little-endian bytes, zero-extended)
    std::string str_;                // STRING
    size_t n_ = 0;                   // array element count
    std::vector<uint8_t> raw_;       // scalar array elements
    std::vector<std::string> strs_;  // string array elements
    std::vector<GGUFValue> arrs_;    // array array elements
};

// Maps a C++ element type to its GGUF value type (for GGUFValue::array<T>).
template <class T> struct gguf_type_of;
template <> struct gguf_type_of<uint8_t>  { static constexpr gguf_type value = GGUF_TYPE_UINT8; };
template <> struct gguf_type_of<int8_t>   { static constexpr gguf_type value = GGUF_TYPE_INT8; };
template <> struct gguf_type_of<uint16_t> { static constexpr gguf_type value = GGUF_TYPE_UINT16; };
template <> struct gguf_type_of<int16_t>  { static constexpr gguf_type value = GGUF_TYPE_INT16; };
template <> struct gguf_type_of<uint32_t> { static constexpr gguf_type value = GGUF_TYPE_UINT32; };
template <> struct gguf_type_of<int32_t>  { static constexpr gguf_type value = GGUF_TYPE_INT32; };
template <> struct gguf_type_of<float>    { static constexpr gguf_type value = GGUF_TYPE_FLOAT32; };
template <> struct gguf_type_of<uint64_t> { static constexpr gguf_type value = GGUF_TYPE_UINT64; };
template <> struct gguf_type_of<int64_t>  { static constexpr gguf_type value = GGUF_TYPE_INT64; };
template <> struct gguf_type_of<double>   { static constexpr gguf_type value = GGUF_TYPE_FLOAT64; };

template <class T> GGUFValue GGUFValue::array(const std::vector<T>& v) {
    return array(gguf_type_of<T>::value, v.data(), v.size());
}
template <> inline GGUFValue GGUFValue::array<bool>(const std::vector<bool>& v) {
    std::vector<uint8_t> b(v.begin(), v.end());
    return array(GGUF_TYPE_BOOL, b.data(), b.size());
}

// ---------------------------------------------------------------------------------------------
// One tensor of a GGUF file.
struct GGUFTensorInfo {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[GGUF_MAX_DIMS] = {1, 1, 1, 1}; // ggml order: ne[0] is the contiguous dimension
    uint32_t type = GGUF_TENSOR_F32;           // ggml type number
    uint64_t offset = 0;                       // from the start of the data section
    uint64_t nbytes = 0;

    int64_t nelements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    // Shape in PyTorch / numpy order (outermost first): the reverse of ne[0..n_dims).
    std::vector<int64_t> shape() const;
};

// The tensor types of a quantized file (src/formats/quant-mix.cpp): one type id per tensor of
// `tensors` (only name, n_dims and ne[0] are read), in their order. 2-D tensors whose name ends in
// "weight" (not "_norm.weight") get `type`; every other tensor F32. q4_k_m_mix: llama.cpp's Q4_K_M
// mix (llama-quant.cpp, llama_tensor_get_type; `type` should then be Q4_K): Q4_K by default; Q6_K
// for output.weight (for token_embd.weight when there is no output.weight: tied embeddings); Q5_K
// for a fused attn_qkv; Q6_K for attn_v and ffn_down where gguf_use_more_bits(i, n) holds, i the
// index of that tensor among the n of its kind in the given order (= the layer). A row length
// (ne[0]) that is not a multiple of the block size falls back as llama.cpp does (Q4_K -> Q5_0,
// Q6_K / Q5_K -> Q8_0), one that is not a multiple of 32 (or a Q8_0 / Q5_0 that does not fit) to
// F16. Float types (F32, F16, BF16) are returned as given. Never fails.
std::vector<uint32_t> gguf_plan_weight_types(const std::vector<GGUFTensorInfo>& tensors, uint32_t type, bool q4_k_m_mix);
// llama.cpp's rule for the layers (i of n, integer division) whose attn_v / ffn_down get more bits
// in Q4_K_M / Q5_K_M: i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2.
bool gguf_use_more_bits(int64_t i, int64_t n);

// Options of GGUFReader::open.
struct GGUFReadOptions {
    // Accept tensors of ggml types that cannot be read (Q4_K, IQ2_XS, ...): they are listed and
    // validated, but read_tensor() on them fails. Used by the dump tool. Default: such a file is
    // an error naming the tensor and its type.
    bool allow_unsupported_types = false;
};

// Reads a GGUF file. open() validates the whole header and every tensor info; afterwards the
// object is immutable and its const methods may be called from several threads.
class GGUFReader {
public:
    GGUFReader();
    ~GGUFReader();
    GGUFReader(GGUFReader&&) noexcept;
    GGUFReader& operator=(GGUFReader&&) noexcept;
    GGUFReader(const GGUFReader&) = delete;
    GGUFReader& operator=(const GGUFReader&) = delete;

    // Memory-maps and parses `path`. Errors: GGUF_ERR_IO (cannot open/map), GGUF_ERR_FORMAT
    // (truncated file, bad magic or version, absurd counts, duplicate keys or tensor names,
    // a tensor with 0 or more than 4 dimensions, overflowing shapes, misaligned, overlapping or
    // out-of-range offsets, bad general.alignment, metadata and tensor infos that would take more
    // than 4x the file size + 1 MiB of memory, e.g. millions of empty arrays: checked before
    // anything is allocated for them),
    // GGUF_ERR_UNSUPPORTED (a tensor type that gguf_tensor_type_supported rejects).
    gguf_status open(const std::string& path, std::string* err, const GGUFReadOptions& opt = {});
    // Parses a file image held in memory (not copied: it must outlive the reader). Same errors.
    gguf_status open_memory(const void* data, size_t size, std::string* err,
                            const GGUFReadOptions& opt = {});
    void close();

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; } // file offset of the data section
    size_t file_size() const { return size_; }

    // Metadata, in file order.
    const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }
    const GGUFValue* find(const std::string& key) const; // null when absent

    // Typed getters. Errors: GGUF_ERR_NOT_FOUND (no key), GGUF_ERR_TYPE (wrong type, or an
    // integer that does not fit). Integers accept any integer type that fits; floats accept
    // FLOAT32 and FLOAT64.
    gguf_status get_u32(const std::string& key, uint32_t* out, std::string* err) const;
    gguf_status get_i64(const std::string& key, int64_t* out, std::string* err) const;
    gguf_status get_f32(const std::string& key, float* out, std::string* err) const;
    gguf_status get_bool(const std::string& key, bool* out, std::string* err) const;
    gguf_status get_string(const std::string& key, std::string* out, std::string* err) const;
    gguf_status get_string_array(const std::string& key, std::vector<std::string>* out,
                                 std::string* err) const;
    // Array of any integer type, widened to int32 (error when an element does not fit).
    gguf_status get_i32_array(const std::string& key, std::vector<int32_t>* out,
                              std::string* err) const;

    // Tensors, in file order.
    const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
    const GGUFTensorInfo* find_tensor(const std::string& name) const; // null when absent
    // Raw bytes of a tensor inside the mapping (t.nbytes of them).
    const uint8_t* tensor_data(const GGUFTensorInfo& t) const;
    // Gives the mapped pages of [p, p + n) (a range of tensor_data) back to the kernel: a loader that
    // copied those bytes elsewhere calls it so the file does not stay in the resident set; a later
    // read maps them again. No-op for open_memory readers.
    void release(const void* p, size_t n) const;

    // Reads a tensor converted to `out_type` (GGUF_TENSOR_F32, _F16 or _BF16) into `dst`, which
    // must hold exactly nelements * sizeof(element) bytes (`dst_bytes`). Quantized types are
    // dequantized; same-type reads are bit-exact copies. Errors: GGUF_ERR_NOT_FOUND,
    // GGUF_ERR_UNSUPPORTED (tensor type), GGUF_ERR_ARG (out_type or dst_bytes).
    gguf_status read_tensor(const std::string& name, uint32_t out_type, void* dst,
                            size_t dst_bytes, std::string* err) const;
    gguf_status read_tensor(const GGUFTensorInfo& t, uint32_t out_type, void* dst,
                            size_t dst_bytes, std::string* err) const;
    // Convenience: the tensor as f32 values (PyTorch row-major order, i.e. ne[0] fastest).
    gguf_status read_tensor_f32(const std::string& name, std::vector<float>* out,
                                std::string* err) const;

private:
    gguf_status parse(std::string* err, const GGUFReadOptions& opt);

    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    void* map_ = nullptr;   // mmap base when we own a mapping
    size_t map_size_ = 0;
    uint32_t version_ = 0;
    uint32_t alignment_ = GGUF_DEFAULT_ALIGNMENT;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, GGUFValue>> kv_;
    std::vector<GGUFTensorInfo> tensors_;
    std::vector<std::pair<std::string, size_t>> kv_index_;     // sorted by key
    std::vector<std::pair<std::string, size_t>> tensor_index_; // sorted by name
};

// ---------------------------------------------------------------------------------------------
// ---- streaming tensor bytes (checkpoints with flat memory) ----------------------------------
// A writer asks for a tensor's serialized bytes chunk by chunk instead of holding them all: the
// caller's fill(dst, offset, n, err) stores bytes [offset, offset + n) of the tensor (as they go
// into the file) at dst and returns GGUF_OK, or an error status with *err set. Chunks come in
// order, each a multiple of the granule given with the fill (except the last).
using TensorChunkFill = std::function<gguf_status(void* dst, uint64_t offset, size_t n, std::string* err)>;

// Bytes staged at a time by the streaming writers (64 MiB): the peak memory one save adds.
constexpr size_t kStagingBytes = size_t(64) << 20;

// Produces nbytes through fill in chunks of stream_chunk_bytes(nbytes, granule) bytes, one staging
// buffer of that size (allocated once, freed on return), and hands each chunk to
// sink(data, n, err). Errors: the first non-OK status of fill or sink; GGUF_ERR_ARG if granule is 0.
gguf_status stream_chunks(uint64_t nbytes, size_t granule, const TensorChunkFill& fill,
                          const std::function<gguf_status(const void* data, size_t n, std::string* err)>& sink,
                          std::string* err);
// The chunk size stream_chunks uses: the largest multiple of granule <= kStagingBytes (at least one
// granule), capped at nbytes.
size_t stream_chunk_bytes(uint64_t nbytes, size_t granule);

// Writes a GGUF v3 file without holding tensor data in memory:
//   1. set() metadata and add_tensor() every tensor (name, type, dims),
//   2. open(path): writes header, metadata and tensor infos to `path.tmp.<pid>`,
//   3. write_data()/write_tensor(): the tensors' bytes in add order, in pieces of any size
//      (padding between tensors is inserted automatically),
//   4. finish(): flush, fsync, rename to `path` (atomic), fsync the directory.
// Destroying the writer (or abort()) before finish() removes the temporary file, and so does a
// SIGINT/SIGTERM in a program that called install_temp_file_cleanup() (below).
class GGUFWriter {
public:
    GGUFWriter();
    ~GGUFWriter();
    GGUFWriter(const GGUFWriter&) = delete;
    GGUFWriter& operator=(const GGUFWriter&) = delete;

    // Sets a metadata value (replaces an existing key, keeping its position). Setting
    // general.alignment also sets the data alignment (must be a UINT32 power of two).
    gguf_status set(const std::string& key, GGUFValue v, std::string* err = nullptr);
    void set_u32(const std::string& key, uint32_t v) { set(key, GGUFValue::u32(v)); }
    void set_i32(const std::string& key, int32_t v) { set(key, GGUFValue::i32(v)); }
    void set_f32(const std::string& key, float v) { set(key, GGUFValue::f32(v)); }
    void set_bool(const std::string& key, bool v) { set(key, GGUFValue::boolean(v)); }
    void set_string(const std::string& key, std::string v) { set(key, GGUFValue::string(std::move(v))); }
    bool has(const std::string& key) const;
    void remove(const std::string& key);
    const std::vector<std::pair<std::string, GGUFValue>>& metadata() const { return kv_; }

    // Sets the data alignment (power of two); written as general.alignment unless it is 32.
    gguf_status set_alignment(uint32_t alignment, std::string* err = nullptr);

    // Declares a tensor. `ne` is in ggml order (ne[0] contiguous), 1..4 dims, each >= 0; for block
    // types ne[0] must be a multiple of the block size. Errors: GGUF_ERR_ARG (duplicate name,
    // bad dims, overflow, unknown type, already opened).
    gguf_status add_tensor(const std::string& name, uint32_t type, const std::vector<int64_t>& ne,
                           std::string* err = nullptr);
    const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }

    gguf_status open(const std::string& path, std::string* err);
    // Appends tensor bytes (in the order the tensors were added). May span tensors.
    gguf_status write_data(const void* data, size_t n, std::string* err);
    // Writes all bytes of the next tensor, which must be called `name`.
    gguf_status write_tensor(const std::string& name, const void* data, size_t nbytes,
                             std::string* err);
    // Writes all bytes of the next tensor, which must be called `name`, from fill (see
    // TensorChunkFill) through one staging buffer of at most max(granule, kStagingBytes) bytes.
    // Errors: as write_tensor, and fill's.
    gguf_status write_tensor_chunks(const std::string& name, size_t granule, const TensorChunkFill& fill,
                                    std::string* err);
    gguf_status finish(std::string* err);
    void abort();

    // Bytes written so far (header + data), for progress reports.
    uint64_t bytes_written() const { return written_; }

private:
    gguf_status put(const void* p, size_t n, std::string* err);
    gguf_status pad_to(uint64_t multiple, std::string* err);
    // Checks that `name` is the next tensor to write (skipping empty ones); *nbytes: its size.
    gguf_status next_tensor(const std::string& name, uint64_t* nbytes, std::string* err);
    void layout();

    std::vector<std::pair<std::string, GGUFValue>> kv_;
    std::vector<GGUFTensorInfo> tensors_;
    uint32_t alignment_ = GGUF_DEFAULT_ALIGNMENT;
    std::string path_, tmp_path_;
    void* file_ = nullptr; // FILE*
    uint64_t written_ = 0;
    uint64_t data_start_ = 0;  // file offset of the data section
    size_t cur_tensor_ = 0;    // tensor being written
    uint64_t cur_done_ = 0;    // bytes of it written
    bool opened_ = false;
    int tmp_id_ = -1;          // temp_file_register id of tmp_path_
};

// ---------------------------------------------------------------------------------------------
// Temporary files and signals. GGUFWriter and SafetensorsWriter register their `*.tmp.<pid>`
// file while it exists; a program that calls install_temp_file_cleanup() at start then removes
// them when it is stopped by SIGINT (Ctrl-C), SIGTERM or SIGHUP, and dies of that signal as it
// would have (the handler is async-signal-safe: unlink, then the default action). The previous
// output file is never touched, since it is replaced only by the final rename.
//
// install_temp_file_cleanup() installs the handler only for signals whose disposition is the
// default: ignored signals (nohup) and the program's own handlers are left alone; such a handler
// may call remove_temp_files() (async-signal-safe) before it ends the process. Idempotent. It also ignores SIGXFSZ
// (where at its default): a file-size limit then fails the write (EFBIG), which the writers report and clean up after,
// instead of killing the process mid-write.
void install_temp_file_cleanup();
void remove_temp_files();
// Registers a temporary file (a relative path is made absolute) for removal on a signal; returns
// an id for temp_file_unregister, or -1 when it cannot be registered (table of 64 full, path too
// long). Unregister once the file is renamed or removed. Thread-safe.
int temp_file_register(const std::string& path);
void temp_file_unregister(int id);
// Where an atomic writer (temporary file, then rename) puts the output `path`: *target is the file a symbolic link
// names (links followed, so the link stays and the file it names is replaced; a dangling link's target is created),
// else path. *special: the target exists and is not a regular file (a device such as /dev/null or /dev/stdout, a
// FIFO, a socket), which a rename would replace. Returns "" or the error naming the output: a folder; with
// allow_special false, also a special file (the GGUF and safetensors writers; write_file_atomic writes into one in place).
std::string output_target(const std::string& path, bool allow_special, std::string* target, bool* special);
// The error for an output `path` whose temporary file `tmp` (path.tmp.<pid>) could not be created, errno `errnum`: names
// the output and, when its folder is missing or not a folder, that folder (the temporary file's name means nothing to a
// user); else the output, the temporary file and strerror. One wording for every writer (GGUF, safetensors, PNG, JSON).
std::string temp_file_create_error(const std::string& path, const std::string& tmp, int errnum);
// A process killed by SIGKILL (or a crash) runs no handler: its `<base>.tmp.<pid>` stays. Removes,
// in folder `dir` ("" or "."; the current one), every "<base>.tmp.<pid>" of the given base names
// (file names, no folder) whose process <pid> no longer exists; files of this process and of a
// live one are kept. Returns the paths removed (callers say so). Not thread-safe with a writer of
// the same names in this process (call it before writing).
std::vector<std::string> remove_orphan_temp_files(const std::string& dir, const std::vector<std::string>& bases);

// ---------------------------------------------------------------------------------------------
// Qwen2 hyperparameters as llama.cpp stores them (`qwen2.*` keys) plus facts read from tensors.
struct GGUFQwen2Hparams {
    uint32_t n_vocab = 0;        // rows of token_embd.weight
    uint32_t n_ctx_train = 0;    // qwen2.context_length
    uint32_t n_embd = 0;         // qwen2.embedding_length
    uint32_t n_ff = 0;           // qwen2.feed_forward_length
    uint32_t n_layer = 0;        // qwen2.block_count
    uint32_t n_head = 0;         // qwen2.attention.head_count
    uint32_t n_head_kv = 0;      // qwen2.attention.head_count_kv (defaults to n_head)
    float rope_freq_base = 10000.0f;  // qwen2.rope.freq_base
    float rms_norm_eps = 1e-6f;       // qwen2.attention.layer_norm_rms_epsilon
    bool tied_embeddings = false;     // no output.weight: the LM head reuses token_embd.weight
};

// Reads and checks the Qwen2 hyperparameters of a model file (general.architecture must be
// "qwen2"; token_embd.weight must exist with ne = {n_embd, n_vocab}). Errors name the key.
// A summary of qwen2_read_config(), defined with the Qwen2 layout in models/qwen2-layout.cpp
// (the one description of the qwen2.* keys and tensors); the checks are that function's.
gguf_status gguf_read_qwen2_hparams(const GGUFReader& r, GGUFQwen2Hparams* hp, std::string* err);

} // namespace oomb
