// Safetensors reader and writer. See ggml-oomb/safetensors.h.
#include "safetensors.h"

#include "../fp16.h"
#include "mapped-file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace oomb {

namespace {

void set_err(std::string* err, std::string msg) {
    if (err) *err = std::move(msg);
}

constexpr uint64_t kMaxHeader = 100u << 20; // as the reference implementation

std::string dirname_of(const std::string& p) {
    size_t k = p.rfind('/');
    if (k == std::string::npos) return ".";
    return k == 0 ? "/" : p.substr(0, k);
}

bool is_dir(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_file(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string& s, const std::string& suf) {
    return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

// Parses JSON like nlohmann::json::parse (no exceptions: a syntax error gives a discarded value),
// but notices a key repeated within one object, which nlohmann silently resolves by keeping the
// last one. The safetensors format makes duplicates an error: on the first one, *dup receives the
// key (escaped as JSON would, without quotes) and the result is discarded.
nlohmann::json parse_json_unique_keys(const uint8_t* first, const uint8_t* last, std::string* dup) {
    std::vector<std::unordered_set<std::string>> seen; // keys of each open object, innermost last
    dup->clear();
    auto cb = [&](int /*depth*/, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if (ev == E::object_start) seen.emplace_back();
        else if (ev == E::object_end && !seen.empty()) seen.pop_back();
        else if (ev == E::key && !seen.empty() && dup->empty() && !seen.back().insert(parsed.get<std::string>()).second) {
            const std::string quoted = parsed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
            *dup = quoted.substr(1, quoted.size() - 2);
        }
        return true;
    };
    nlohmann::json j = nlohmann::json::parse(first, last, cb, false);
    if (!dup->empty()) return nlohmann::json(nlohmann::json::value_t::discarded);
    return j;
}

template <class T> T load(const uint8_t* p) {
    T v;
    memcpy(&v, p, sizeof v);
    return v;
}

template <class Out> void convert_all(const SafetensorsTensor& t, Out* dst) {
    const int64_t n = t.numel();
    const uint8_t* p = t.data;
    switch (t.dtype) {
    case SafetensorsDtype::F32: for (int64_t i = 0; i < n; i++) dst[i] = (Out)load<float>(p + 4 * i); break;
    case SafetensorsDtype::F64: for (int64_t i = 0; i < n; i++) dst[i] = (Out)load<double>(p + 8 * i); break;
    case SafetensorsDtype::F16: for (int64_t i = 0; i < n; i++) dst[i] = (Out)fp16_to_fp32(load<uint16_t>(p + 2 * i)); break;
    case SafetensorsDtype::BF16: for (int64_t i = 0; i < n; i++) dst[i] = (Out)bf16_to_fp32(load<uint16_t>(p + 2 * i)); break;
    case SafetensorsDtype::I32: for (int64_t i = 0; i < n; i++) dst[i] = (Out)load<int32_t>(p + 4 * i); break;
    case SafetensorsDtype::I64: for (int64_t i = 0; i < n; i++) dst[i] = (Out)load<int64_t>(p + 8 * i); break;
    }
}

} // namespace

const char* safetensors_dtype_name(SafetensorsDtype t) {
    switch (t) {
    case SafetensorsDtype::F32: return "F32";
    case SafetensorsDtype::F64: return "F64";
    case SafetensorsDtype::F16: return "F16";
    case SafetensorsDtype::BF16: return "BF16";
    case SafetensorsDtype::I32: return "I32";
    case SafetensorsDtype::I64: return "I64";
    }
    return "?";
}

size_t safetensors_dtype_size(SafetensorsDtype t) {
    switch (t) {
    case SafetensorsDtype::F16: case SafetensorsDtype::BF16: return 2;
    case SafetensorsDtype::F32: case SafetensorsDtype::I32: return 4;
    case SafetensorsDtype::F64: case SafetensorsDtype::I64: return 8;
    }
    return 0;
}

bool safetensors_dtype_from_name(const std::string& s, SafetensorsDtype* out) {
    static const std::pair<const char*, SafetensorsDtype> names[] = {
        {"F32", SafetensorsDtype::F32}, {"F64", SafetensorsDtype::F64}, {"F16", SafetensorsDtype::F16},
        {"BF16", SafetensorsDtype::BF16}, {"I32", SafetensorsDtype::I32}, {"I64", SafetensorsDtype::I64}};
    for (auto& n : names)
        if (s == n.first) { *out = n.second; return true; }
    return false;
}

int64_t SafetensorsTensor::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

gguf_status safetensors_read_f32(const SafetensorsTensor& t, std::vector<float>* out, std::string* err) {
    out->resize((size_t)t.numel());
    convert_all(t, out->data());
    return GGUF_OK;
}

gguf_status safetensors_read_f64(const SafetensorsTensor& t, std::vector<double>* out, std::string* err) {
    out->resize((size_t)t.numel());
    convert_all(t, out->data());
    return GGUF_OK;
}

// ---------------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile() = default;
SafetensorsFile::~SafetensorsFile() { close(); }
SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
    if (this != &o) {
        close();
        path_ = std::move(o.path_);
        map_ = o.map_; map_size_ = o.map_size_;
        tensors_ = std::move(o.tensors_); index_ = std::move(o.index_); metadata_ = std::move(o.metadata_);
        o.map_ = nullptr; o.map_size_ = 0;
    }
    return *this;
}

void SafetensorsFile::close() {
    if (map_) munmap(map_, map_size_);
    map_ = nullptr;
    map_size_ = 0;
    tensors_.clear();
    index_.clear();
    metadata_.clear();
}

gguf_status SafetensorsFile::open(const std::string& path, std::string* err) {
    close();
    path_ = path;
    auto fail = [&](gguf_status s, const std::string& msg) {
        set_err(err, path + ": " + msg);
        close();
        return s;
    };
    // O_NONBLOCK: a FIFO is refused below instead of blocking the open (a regular file ignores the flag)
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(GGUF_ERR_IO, std::string("cannot open: ") + strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        return fail(GGUF_ERR_IO, std::string("cannot stat: ") + strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        return fail(GGUF_ERR_IO, std::string("not a regular file (") + file_kind_name(st.st_mode) + ")");
    }
    const size_t size = (size_t)st.st_size;
    if (size < 8) {
        ::close(fd);
        return fail(GGUF_ERR_FORMAT, "file is truncated: too short for a safetensors header");
    }
    void* m = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) return fail(GGUF_ERR_IO, std::string("cannot mmap: ") + strerror(errno));
    map_ = m;
    map_size_ = size;
    const uint8_t* base = (const uint8_t*)m;
    const uint64_t hlen = load<uint64_t>(base);
    if (hlen > kMaxHeader) return fail(GGUF_ERR_FORMAT, "header length " + std::to_string(hlen) + " is absurd (not safetensors?)");
    if (hlen > size - 8) return fail(GGUF_ERR_FORMAT, "file is truncated: header runs past the end of the file");
    const uint8_t* data = base + 8 + hlen;
    const size_t data_size = size - 8 - (size_t)hlen;

    std::string dup;
    nlohmann::json h = parse_json_unique_keys(base + 8, base + 8 + hlen, &dup);
    if (!dup.empty()) return fail(GGUF_ERR_FORMAT, "header holds the key '" + dup + "' twice (duplicate keys are an error)");
    if (h.is_discarded() || !h.is_object()) return fail(GGUF_ERR_FORMAT, "header is not a JSON object");
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto it = h.begin(); it != h.end(); ++it) {
        const std::string& name = it.key();
        const nlohmann::json& e = it.value();
        if (name == "__metadata__") {
            if (!e.is_object()) return fail(GGUF_ERR_FORMAT, "__metadata__ is not an object");
            for (auto m2 = e.begin(); m2 != e.end(); ++m2) {
                if (!m2.value().is_string()) return fail(GGUF_ERR_FORMAT, "__metadata__ value of '" + m2.key() + "' is not a string");
                metadata_[m2.key()] = m2.value().get<std::string>();
            }
            continue;
        }
        const std::string nm = "tensor '" + name + "'";
        if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
            return fail(GGUF_ERR_FORMAT, nm + ": entry needs dtype, shape and data_offsets");
        const nlohmann::json& jd = e["dtype"];
        const nlohmann::json& js = e["shape"];
        const nlohmann::json& jo = e["data_offsets"];
        if (!jd.is_string()) return fail(GGUF_ERR_FORMAT, nm + ": dtype is not a string");
        SafetensorsTensor t;
        t.name = name;
        t.file = path;
        if (!safetensors_dtype_from_name(jd.get<std::string>(), &t.dtype))
            return fail(GGUF_ERR_UNSUPPORTED, nm + ": dtype " + jd.get<std::string>() +
                                                  " is not supported (F32, F64, F16, BF16, I32, I64)");
        if (!js.is_array()) return fail(GGUF_ERR_FORMAT, nm + ": shape is not an array");
        int64_t n = 1;
        for (auto& d : js) {
            if (!d.is_number_unsigned()) return fail(GGUF_ERR_FORMAT, nm + ": shape holds a non-integer or negative dimension");
            const uint64_t v = d.get<uint64_t>();
            if (v > (uint64_t)INT64_MAX || __builtin_mul_overflow(n, (int64_t)v, &n))
                return fail(GGUF_ERR_FORMAT, nm + ": shape overflows");
            t.shape.push_back((int64_t)v);
        }
        if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
            return fail(GGUF_ERR_FORMAT, nm + ": data_offsets must be two non-negative integers");
        const uint64_t b = jo[0].get<uint64_t>(), en = jo[1].get<uint64_t>();
        if (b > en || en > data_size)
            return fail(GGUF_ERR_FORMAT, nm + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                                             ") outside the " + std::to_string(data_size) + " data bytes (file truncated?)");
        uint64_t need;
        // an element count whose byte size overflows 64 bits is named as such (its wrapped product would read as a size)
        if (__builtin_mul_overflow((uint64_t)n, (uint64_t)safetensors_dtype_size(t.dtype), &need))
            return fail(GGUF_ERR_FORMAT, nm + ": the byte size of shape x dtype (" + std::to_string(n) + " elements of " +
                                             std::to_string(safetensors_dtype_size(t.dtype)) + " bytes) overflows 64 bits");
        if (need != en - b)
            return fail(GGUF_ERR_FORMAT, nm + ": holds " + std::to_string(en - b) + " bytes, shape x dtype needs " + std::to_string(need));
        t.data = data + b;
        t.nbytes = (size_t)(en - b);
        ranges.emplace_back(b, en);
        tensors_.push_back(std::move(t));
    }
    // Overlaps: sorted by (begin, end), every non-empty tensor must start at or after the end of
    // all non-empty tensors before it (`reach`, the furthest end so far). Zero-size tensors
    // (begin == end, checked above to lie inside the data) alias nothing and take no part: they
    // must not hide an overlap between their neighbours.
    std::vector<size_t> order(tensors_.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
    uint64_t reach = 0;
    size_t reach_of = SIZE_MAX;
    for (size_t i : order) {
        const auto& q = ranges[i];
        if (q.first == q.second) continue;
        if (reach_of != SIZE_MAX && q.first < reach)
            return fail(GGUF_ERR_FORMAT, "tensors '" + tensors_[reach_of].name + "' and '" + tensors_[i].name + "' overlap");
        if (q.second > reach) { reach = q.second; reach_of = i; }
    }
    std::vector<SafetensorsTensor> sorted;
    sorted.reserve(order.size());
    for (size_t i : order) sorted.push_back(std::move(tensors_[i]));
    tensors_ = std::move(sorted);
    for (size_t i = 0; i < tensors_.size(); i++) index_[tensors_[i].name] = i; // JSON object keys are unique
    return GGUF_OK;
}

void SafetensorsFile::release(const void* p, size_t n) const { mapped_release(map_, map_size_, p, n); }

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------------------------

gguf_status SafetensorsModel::open(const std::string& path, std::string* err) {
    files_.clear();
    tensors_.clear();
    index_.clear();
    std::string index_path, single;
    if (is_dir(path)) {
        if (is_file(path + "/model.safetensors.index.json")) index_path = path + "/model.safetensors.index.json";
        else if (is_file(path + "/model.safetensors")) single = path + "/model.safetensors";
        else {
            set_err(err, path + ": no model.safetensors or model.safetensors.index.json in this directory");
            return GGUF_ERR_NOT_FOUND;
        }
    } else if (ends_with(path, ".json")) {
        index_path = path;
    } else {
        single = path;
    }
    std::map<std::string, std::string> weight_map; // tensor -> shard file
    std::vector<std::string> shards;
    if (!index_path.empty()) {
        if (struct stat ist; stat(index_path.c_str(), &ist) == 0 && !S_ISREG(ist.st_mode)) {  // a FIFO would block fopen
            set_err(err, index_path + ": not a regular file (" + file_kind_name(ist.st_mode) + ")");
            return GGUF_ERR_IO;
        }
        FILE* f = fopen(index_path.c_str(), "rb");
        if (!f) { set_err(err, index_path + ": cannot open: " + strerror(errno)); return GGUF_ERR_IO; }
        std::string text;
        char buf[65536];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, k);
        fclose(f);
        std::string dup;
        nlohmann::json j = parse_json_unique_keys((const uint8_t*)text.data(), (const uint8_t*)text.data() + text.size(), &dup);
        if (!dup.empty()) {
            set_err(err, index_path + ": holds the key '" + dup + "' twice (duplicate keys are an error)");
            return GGUF_ERR_FORMAT;
        }
        if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
            set_err(err, index_path + ": not a safetensors index (needs a \"weight_map\" object)");
            return GGUF_ERR_FORMAT;
        }
        const std::string dir = dirname_of(index_path);
        for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
            if (!it.value().is_string()) {
                set_err(err, index_path + ": weight_map entry '" + it.key() + "' is not a file name");
                return GGUF_ERR_FORMAT;
            }
            const std::string file = it.value().get<std::string>();
            if (file.find('/') != std::string::npos || file == "..") {
                set_err(err, index_path + ": weight_map entry '" + it.key() + "' names a file outside the directory: " + file);
                return GGUF_ERR_FORMAT;
            }
            weight_map[it.key()] = dir + "/" + file;
            if (std::find(shards.begin(), shards.end(), dir + "/" + file) == shards.end()) shards.push_back(dir + "/" + file);
        }
        std::sort(shards.begin(), shards.end());
    } else {
        shards.push_back(single);
    }
    for (const std::string& s : shards) {
        auto f = std::make_unique<SafetensorsFile>();
        if (gguf_status st = f->open(s, err)) return st;
        for (const SafetensorsTensor& t : f->tensors()) {
            if (index_.count(t.name)) {
                set_err(err, s + ": tensor '" + t.name + "' also appears in " + index_[t.name]->file);
                return GGUF_ERR_FORMAT;
            }
            index_[t.name] = &t;
        }
        files_.push_back(std::move(f));
    }
    for (auto& kv : weight_map) {
        auto it = index_.find(kv.first);
        if (it == index_.end() || it->second->file != kv.second) {
            set_err(err, index_path + ": tensor '" + kv.first + "' is listed in " + kv.second + " but not found there");
            return GGUF_ERR_FORMAT;
        }
    }
    for (auto& kv : index_) tensors_.push_back(kv.second);
    return GGUF_OK;
}

const SafetensorsTensor* SafetensorsModel::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second;
}

// ---------------------------------------------------------------------------------------------

gguf_status SafetensorsWriter::add(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape,
                                   const void* data, std::string* err) {
    if (name.empty() || name == "__metadata__") { set_err(err, "safetensors: invalid tensor name '" + name + "'"); return GGUF_ERR_ARG; }
    for (auto& e : entries_)
        if (e.name == name) { set_err(err, "safetensors: duplicate tensor name '" + name + "'"); return GGUF_ERR_ARG; }
    int64_t n = 1;
    for (int64_t d : shape)
        if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
            set_err(err, "safetensors: tensor '" + name + "' has a negative or overflowing shape");
            return GGUF_ERR_ARG;
        }
    entries_.push_back({name, dtype, shape, data, (size_t)n * safetensors_dtype_size(dtype), nullptr, nullptr});
    return GGUF_OK;
}

gguf_status SafetensorsWriter::add_stream(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape,
                                          TensorChunkFill fill, std::string* err) {
    if (!fill) { set_err(err, "safetensors: tensor '" + name + "' has no fill function"); return GGUF_ERR_ARG; }
    if (gguf_status s = add(name, dtype, shape, nullptr, err)) return s;
    entries_.back().fill = std::move(fill);
    return GGUF_OK;
}

gguf_status SafetensorsWriter::add_copy(const std::string& name, SafetensorsDtype dtype, const std::vector<int64_t>& shape,
                                        const void* data, std::string* err) {
    if (gguf_status s = add(name, dtype, shape, data, err)) return s;
    Entry& e = entries_.back();
    e.owned = std::make_shared<std::vector<uint8_t>>((const uint8_t*)data, (const uint8_t*)data + e.nbytes);
    e.data = e.owned->data();
    return GGUF_OK;
}

gguf_status SafetensorsWriter::write(const std::string& path_in, std::string* err) const {
    nlohmann::json h = nlohmann::json::object();
    if (!metadata_.empty()) {
        nlohmann::json m = nlohmann::json::object();
        for (auto& kv : metadata_) m[kv.first] = kv.second;
        h["__metadata__"] = m;
    }
    uint64_t off = 0;
    for (auto& e : entries_) {
        h[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {off, off + e.nbytes}}};
        off += e.nbytes;
    }
    std::string hs = h.dump();
    while ((8 + hs.size()) % 8 != 0) hs += ' '; // data aligned to 8 bytes, as the reference writer
    std::string target;  // (a symbolic link: the file it names is replaced)
    bool special = false;
    if (const std::string e = output_target(path_in, false, &target, &special); !e.empty()) {
        set_err(err, e);
        return GGUF_ERR_IO;
    }
    const std::string& path = target;
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    // Removed by install_temp_file_cleanup()'s handler if a signal stops us while it exists.
    struct Registered {
        int id;
        ~Registered() { temp_file_unregister(id); }
    } reg{temp_file_register(tmp)};
    FILE* f = fopen(tmp.c_str(), "wb");
    if (!f) { set_err(err, temp_file_create_error(path, tmp, errno)); return GGUF_ERR_IO; }
    const uint64_t hlen = hs.size();
    bool ok = fwrite(&hlen, 8, 1, f) == 1 && fwrite(hs.data(), 1, hs.size(), f) == hs.size();
    std::string fill_err;
    bool fill_failed = false;
    gguf_status fill_status = GGUF_OK;
    auto sink = [f](const void* p, size_t n, std::string*) {
        return fwrite(p, 1, n, f) == n ? GGUF_OK : GGUF_ERR_IO;
    };
    for (auto& e : entries_) {
        if (!ok || !e.nbytes) continue;
        if (!e.fill) { ok = fwrite(e.data, 1, e.nbytes, f) == e.nbytes; continue; }
        fill_err.clear();
        const gguf_status s = stream_chunks(e.nbytes, safetensors_dtype_size(e.dtype), e.fill, sink, &fill_err);
        ok = s == GGUF_OK;
        fill_failed = !ok && !fill_err.empty();  // the sink sets no message: a write error
        if (fill_failed) fill_status = s;
        if (fill_failed) fill_err = "tensor '" + e.name + "': " + fill_err;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    const int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok) {
        unlink(tmp.c_str());
        set_err(err, fill_failed ? path + ": " + fill_err : "cannot write " + path + ": " + strerror(saved));
        return fill_failed ? fill_status : GGUF_ERR_IO;
    }
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        set_err(err, "cannot rename " + tmp + " to " + path + ": " + strerror(errno));
        unlink(tmp.c_str());
        return GGUF_ERR_IO;
    }
    int dfd = ::open(dirname_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { fsync(dfd); ::close(dfd); }
    return GGUF_OK;
}

} // namespace oomb
