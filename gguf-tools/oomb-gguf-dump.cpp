// oomb-gguf-dump: prints the metadata and the tensor table of a GGUF file.
//
//   oomb-gguf-dump FILE.gguf                 human readable
//   oomb-gguf-dump FILE.gguf --json [--data] machine readable; --data adds every tensor's values
//                                            converted to f32 (quantized types dequantized)
#include "gguf.h"

#include <CLI/CLI.hpp>
#include "tool-cli.h"
#include <nlohmann/json.hpp>

#include <cinttypes>
#include <cstdio>

using namespace oomb;
using nlohmann::json;

namespace {

json scalar_json(const GGUFValue& v) {
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    if (v.to_bool(&b)) return b;
    if (v.is_float() && v.to_f64(&d)) return d;
    if (v.to_u64(&u)) return u;
    if (v.to_i64(&i)) return i;
    return nullptr;
}

json value_json(const GGUFValue& v) {
    if (v.type() == GGUF_TYPE_STRING) return v.str();
    if (!v.is_array()) return scalar_json(v);
    json a = json::array();
    if (v.array_type() == GGUF_TYPE_STRING) {
        for (auto& s : v.strings()) a.push_back(s);
    } else if (v.array_type() == GGUF_TYPE_ARRAY) {
        for (auto& e : v.arrays()) a.push_back(value_json(e));
    } else {
        for (size_t k = 0; k < v.array_size(); k++) {
            int64_t i;
            double d;
            if (v.array_type() == GGUF_TYPE_BOOL) a.push_back(v.array_data()[k] != 0);
            else if (v.array_type() == GGUF_TYPE_UINT64) {
                uint64_t u;
                memcpy(&u, v.array_data() + 8 * k, 8);
                a.push_back(u);
            } else if (v.array_i64(k, &i)) a.push_back(i);
            else if (v.array_f64(k, &d)) a.push_back(d);
        }
    }
    return a;
}

std::string type_str(const GGUFValue& v) {
    std::string t = gguf_type_name(v.type());
    const GGUFValue* e = &v;
    while (e->is_array()) {
        t += std::string("[") + gguf_type_name(e->array_type()) + "]";
        if (e->array_type() != GGUF_TYPE_ARRAY || e->arrays().empty()) break;
        e = &e->arrays()[0];
    }
    return t;
}

} // namespace

int main(int argc, char** argv) {
    CLI::App app{"Print the metadata and tensors of a GGUF file."};
    std::string path;
    bool as_json = false, data = false;
    size_t max_elems = 8;
    app.add_option("FILE", path, "GGUF file")->required();
    CLI::Option* json_opt = app.add_flag("--json", as_json, "print JSON (metadata values in full)");
    app.add_flag("--data", data, "with --json: include each tensor's values as f32")->needs(json_opt);  // (not ignored)
    app.add_option("--max-elems", max_elems, "array elements shown per metadata value (text output)")->check(CLI::Range((size_t) 1, (size_t) 1 << 40));
    OOMB_TOOL_PARSE(app, argc, argv);

    GGUFReader r;
    std::string err;
    GGUFReadOptions opt;
    opt.allow_unsupported_types = true;
    if (r.open(path, &err, opt)) {
        fprintf(stderr, "oomb-gguf-dump: error: %s\n", err.c_str());
        return 1;
    }

    if (as_json) {
        json j;
        j["version"] = r.version();
        j["alignment"] = r.alignment();
        j["data_offset"] = r.data_offset();
        json meta = json::object();
        json order = json::array();
        for (auto& kv : r.metadata()) {
            json e;
            e["type"] = gguf_type_name(kv.second.type());
            if (kv.second.is_array()) e["array_type"] = gguf_type_name(kv.second.array_type());
            e["value"] = value_json(kv.second);
            meta[kv.first] = e;
            order.push_back(kv.first);
        }
        j["metadata"] = meta;
        j["metadata_order"] = order;
        json ts = json::array();
        for (auto& t : r.tensors()) {
            json e;
            e["name"] = t.name;
            e["ne"] = std::vector<int64_t>(t.ne, t.ne + t.n_dims);
            e["shape"] = t.shape();
            const char* tn = gguf_tensor_type_name(t.type);
            e["type"] = tn ? tn : "?";
            e["type_id"] = t.type;
            e["nbytes"] = t.nbytes;
            e["offset"] = t.offset;
            if (data) {
                std::vector<float> v((size_t)t.nelements());
                if (r.read_tensor(t, GGUF_TENSOR_F32, v.data(), v.size() * 4, &err) == GGUF_OK) e["data"] = v;
                else { e["data"] = nullptr; e["error"] = err; }
            }
            ts.push_back(e);
        }
        j["tensors"] = ts;
        const std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
        fwrite(s.data(), 1, s.size(), stdout);
        return tools::finish_stdout("oomb-gguf-dump");
    }

    uint64_t total = 0;
    for (auto& t : r.tensors()) total += t.nbytes;
    printf("%s: GGUF v%u, %zu metadata keys, %zu tensors (%.2f MB of data), alignment %u, data at byte %" PRIu64 "\n",
           path.c_str(), r.version(), r.metadata().size(), r.tensors().size(), total / 1e6, r.alignment(), r.data_offset());
    printf("\nmetadata:\n");
    size_t w = 0;
    for (auto& kv : r.metadata()) w = std::max(w, kv.first.size());
    for (auto& kv : r.metadata())
        printf("  %-*s %-16s %s\n", (int)w, kv.first.c_str(), type_str(kv.second).c_str(),
               kv.second.to_string(max_elems, 120).c_str());
    printf("\ntensors:\n");
    size_t nw = 4;
    for (auto& t : r.tensors()) nw = std::max(nw, t.name.size());
    printf("  %5s  %-*s  %-24s %-24s %-8s %14s %14s\n", "#", (int)nw, "name", "shape (torch order)", "ne (ggml order)", "type",
           "bytes", "offset");
    for (size_t i = 0; i < r.tensors().size(); i++) {
        const GGUFTensorInfo& t = r.tensors()[i];
        std::string sh = "[", ne = "[";
        auto s = t.shape();
        for (size_t k = 0; k < s.size(); k++) sh += (k ? ", " : "") + std::to_string(s[k]);
        for (uint32_t k = 0; k < t.n_dims; k++) ne += (k ? ", " : "") + std::to_string(t.ne[k]);
        sh += "]";
        ne += "]";
        const char* tn = gguf_tensor_type_name(t.type);
        printf("  %5zu  %-*s  %-24s %-24s %-8s %14" PRIu64 " %14" PRIu64 "%s\n", i, (int)nw, t.name.c_str(), sh.c_str(),
               ne.c_str(), tn ? tn : "?", t.nbytes, t.offset, gguf_tensor_type_supported(t.type) ? "" : "  (unsupported)");
    }
    return tools::finish_stdout("oomb-gguf-dump");
}
