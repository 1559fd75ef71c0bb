// Safetensors reader (memory mapped; single files and sharded HF checkpoints) and atomic writer.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the tensor bytes (row-major, little endian); offsets are relative to the end of the header.
// Shapes are in PyTorch order (outermost first). Errors never abort: functions return a
// gguf_status (GGUF_OK on success) and store a message naming the file and the problem in `err`.
#pragma once

#include "gguf.h" // gguf_status

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace oomb {

// Element types handled by the reader and writer. Any other dtype in a file is an error naming it.
enum class SafetensorsDtype { F32, F64, F16, BF16, I32, I64 };

const char* safetensors_dtype_name(SafetensorsDtype t); // "F32", "BF16", ...
size_t safetensors_dtype_size(SafetensorsDtype t);      // bytes per element
// Parses a dtype name; false when it is not one of the six supported names.
bool safetensors_dtype_from_name(const std::string& name, SafetensorsDtype* out);

// One tensor of an open file. `data` points into the file mapping (not necessarily aligned).
struct SafetensorsTensor {
    std::string name;
    SafetensorsDtype dtype = SafetensorsDtype::F32;
    std::vector<int64_t> shape; // PyTorch order
    const uint8_t* data = nullptr;
    size_t nbytes = 0;
    std::string file; // path of the file holding it

    int64_t numel() const;
};

// Converts a tensor to f32 / f64 values (from any dtype; F64->F32 and I64->F32 round).
gguf_status safetensors_read_f32(const SafetensorsTensor& t, std::vector<float>* out, std::string* err);
gguf_status safetensors_read_f64(const SafetensorsTensor& t, std::vector<double>* out, std::string* err);

// One .safetensors file. Immutable after open(); const methods are thread-safe.
class SafetensorsFile {
public:
    SafetensorsFile();
    ~SafetensorsFile();
    SafetensorsFile(SafetensorsFile&&) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    // Maps and validates the file. Errors: GGUF_ERR_IO (open/map), GGUF_ERR_FORMAT (truncated,
    // bad header JSON, offsets out of range, two non-empty tensors overlapping (zero-size tensors
    // must have begin == end inside the data and never hide an overlap), size not matching
    // shape x dtype, a key repeated in any object of the header, named in the message),
    // GGUF_ERR_UNSUPPORTED (a dtype other than the six above).
    gguf_status open(const std::string& path, std::string* err);
    void close();

    const std::string& path() const { return path_; }
    const std::vector<SafetensorsTensor>& tensors() const { return tensors_; } // in offset order
    const SafetensorsTensor* find(const std::string& name) const;             // null when absent
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // Gives the mapped pages of [p, p + n) (a range of a tensor's data) back to the kernel once the
    // caller copied them elsewhere, so a multi-GB file does not stay resident; a later read maps them again.
    void release(const void* p, size_t n) const;

private:
    std::string path_;
    void* map_ = nullptr;
    size_t map_size_ = 0;
    std::vector<SafetensorsTensor> tensors_;
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> metadata_;
};

// A checkpoint that may be split over several files (HF `model.safetensors.index.json`).
class SafetensorsModel {
public:
    // `path` may be: a directory (uses model.safetensors.index.json if present, else
    // model.safetensors), an index .json file, or a single .safetensors file.
    // Errors as SafetensorsFile::open, plus GGUF_ERR_NOT_FOUND (no checkpoint in the directory),
    // GGUF_ERR_FORMAT (bad index, a tensor missing from its shard, a tensor in two shards).
    gguf_status open(const std::string& path, std::string* err);

    const std::vector<const SafetensorsTensor*>& tensors() const { return tensors_; } // by name
    const SafetensorsTensor* find(const std::string& name) const;
    const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

private:
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<const SafetensorsTensor*> tensors_;
    std::map<std::string, const SafetensorsTensor*> index_;
};

// Writes a .safetensors file atomically (`path.tmp.<pid>`, fsync, rename). Tensor data passed to
// add() is referenced, not copied (it must stay valid until write()), unless added with add_copy().
class SafetensorsWriter {
public:
    void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
    // Adds a tensor. Errors (GGUF_ERR_ARG): duplicate name, empty name, negative dimension.
    gguf_status add(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape,
                    const void* data, std::string* err = nullptr);
    gguf_status add_copy(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape,
                         const void* data, std::string* err = nullptr);
    gguf_status add_f32(const std::string& name, const std::vector<int64_t>& shape, const float* data,
                        std::string* err = nullptr) {
        return add(name, SafetensorsDtype::F32, shape, data, err);
    }
    // Adds a tensor whose bytes (nbytes = numel * dtype size, in dtype) are streamed from fill at
    // write() (see TensorChunkFill in gguf.h: chunks of at most kStagingBytes, multiples of the
    // dtype size), so that no copy of the tensor is held. fill is called only by write(), once
    // per write. Errors: as add().
    gguf_status add_stream(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape,
                           TensorChunkFill fill, std::string* err = nullptr);
    gguf_status write(const std::string& path, std::string* err) const;

private:
    struct Entry {
        std::string name;
        SafetensorsDtype dtype;
        std::vector<int64_t> shape;
        const void* data;
        size_t nbytes;
        std::shared_ptr<std::vector<uint8_t>> owned;
        TensorChunkFill fill; // set by add_stream (data is null then)
    };
    std::vector<Entry> entries_;
    std::map<std::string, std::string> metadata_;
};

} // namespace oomb
