// oomb-train's checkpoints (see train-checkpoint.h).
#include "train-checkpoint.h"

#include "gguf.h"
#include "safetensors.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace oomb {
namespace train {

using json = nlohmann::json;

namespace {

const char * PROG = TRAIN_PROG;
constexpr const char * STATE_FORMAT = "oomb-train-state-1";
constexpr size_t kStateSlice = (size_t) 64 << 20;  // resume: optimizer state copied to its buffers 64 MiB at a time

std::string path(const Options & o, const std::string & name) { return o.out + "/" + name; }

// adapter_model.safetensors' metadata key holding the weights hash of the adapter it was saved with
constexpr const char * kPeftHashKey = "oomb_weights_hash";

// --resume of a LoRA run: makes OUT's PEFT files those of the adapter resumed from (hash wh). A save
// killed between their rename and adapter.gguf's leaves them one save ahead (or a checkpoint of an
// older version, without the hash, may lack them): they are then rewritten from the adapter, with a
// note, so the pair never stays mixed.
void sync_peft_files(const Options & o, const Qwen2Model & m, const std::string & wh) {
    const std::string st = path(o, "adapter_model.safetensors"), cfg = path(o, "adapter_config.json");
    std::string why, err;
    SafetensorsFile f;
    if (!is_file(st)) why = "is missing";
    else if (f.open(st, &err) != GGUF_OK) why = "cannot be read (" + err + ")";
    else if (!f.metadata().count(kPeftHashKey)) why = std::string("has no ") + kPeftHashKey;
    else if (f.metadata().at(kPeftHashKey) != wh) why = "belongs to other adapter weights (a save interrupted between the PEFT files and adapter.gguf)";
    if (why.empty()) return;
    f = SafetensorsFile();
    if (!lora_save_peft_safetensors(m, st, &err, {{kPeftHashKey, wh}}) || !write_file_atomic(cfg, lora_peft_config_json(m.lora->cfg, o.model), &err))
        fail(PROG, "--resume: cannot rewrite the PEFT files: " + err);
    printf("resume: %s %s: rewrote it and adapter_config.json from %s\n", st.c_str(), why.c_str(), path(o, "adapter.gguf").c_str());
}

// Index of the first NaN or infinite value among the n / es values (f32 when es is 4, bf16 when 2, f16 when 2 and f16) at
// p; -1 when all are finite. The exponent bits decide (all ones), so nothing is converted.
int64_t first_non_finite(const uint8_t * p, size_t n, size_t es, bool f16 = false) {
    const uint16_t exp16 = f16 ? 0x7c00u : 0x7f80u;
    for (size_t i = 0; i + es <= n; i += es) {
        bool bad;
        if (es == 4) {
            uint32_t u;
            memcpy(&u, p + i, 4);
            bad = (u & 0x7f800000u) == 0x7f800000u;
        } else {
            uint16_t u;
            memcpy(&u, p + i, 2);
            bad = (u & exp16) == exp16;
        }
        if (bad) return (int64_t) (i / es);
    }
    return -1;
}

// Index of the first negative value (sign bit set, not -0) among the n / es values (f32 or bf16, as first_non_finite) at
// p; -1 when none. Adam's second moments are sums of squares: a negative one is damage (and its square root a NaN).
int64_t first_negative(const uint8_t * p, size_t n, size_t es) {
    for (size_t i = 0; i + es <= n; i += es) {
        uint32_t u = 0;
        if (es == 4) memcpy(&u, p + i, 4);
        else { uint16_t h; memcpy(&h, p + i, 2); u = (uint32_t) h << 16; }
        if ((u >> 31) && (u & 0x7fffffffu)) return (int64_t) (i / es);
    }
    return -1;
}

// "NaN", "inf" or "-inf" for the non-finite value at p (f32, bf16 or f16, as first_non_finite)
const char * non_finite_name(const uint8_t * p, size_t es, bool f16 = false) {
    uint32_t u = 0;
    if (es == 4) memcpy(&u, p, 4);
    else { uint16_t h; memcpy(&h, p, 2); u = (uint32_t) h << 16; }
    return (u & (f16 ? 0x03ff0000u : 0x007fffffu)) ? "NaN" : (u >> 31) ? "-inf" : "inf";
}

} // namespace

std::vector<int64_t> torch_shape(const oomb_tensor * t) {
    std::vector<int64_t> s;
    for (int i = oomb_n_dims(t) - 1; i >= 0; i--) s.push_back(t->ne[i]);
    return s;
}

// Copies bytes [off, off + n) of t's data to dst: a fill for the streaming writers.
static TensorChunkFill tensor_bytes(const oomb_tensor * t) {
    return [t](void * dst, uint64_t off, size_t n, std::string *) {
        oomb_tensor_get(t, dst, (size_t) off, n);
        return GGUF_OK;
    };
}

// Hash of every weight's bytes, in GGUF order, as a model file of `saved` type loads them back (see
// train-checkpoint.h). Read in chunks of a multiple of 8 bytes (but the last), which hash64 chains
// to the same value as one call over the whole tensor.
uint64_t weights_hash(const Qwen2Model & m, gguf_tensor_type saved) {
    // with an adapter, the checkpoint's model file is the adapter (the base is not written)
    uint64_t h = m.lora ? hash64("lora", 4) : hash64("qwen2", 5);
    auto sink = [&h](const void * p, size_t n, std::string *) {
        h = hash64(p, n, h);
        return GGUF_OK;
    };
    const std::vector<oomb_tensor *> & ts = m.lora ? m.lora->params : m.params;
    for (size_t i = 0; i < ts.size(); i++) {
        const oomb_tensor * t = ts[i];
        h = hash64(t->name, strlen(t->name), h);
        const gguf_tensor_type ft = m.lora ? GGUF_TENSOR_F32 : qwen2_saved_type(m, i, saved);
        const uint32_t mt = t->type == OOMB_TYPE_F32 ? GGUF_TENSOR_F32 : t->type == OOMB_TYPE_BF16 ? GGUF_TENSOR_BF16 : GGUF_TENSOR_F16;
        if (ft == GGUF_TENSOR_F32 || ft == mt) {  // the file holds t's values exactly
            stream_chunks(oomb_nbytes(t), 8, tensor_bytes(t), sink, nullptr);
            continue;
        }
        // t's values rounded to the file's type and back into t's type, 32 values per granule
        const size_t bb = gguf_tensor_type_block_bytes(ft) * (size_t) (32 / gguf_tensor_type_block_size(ft));
        const size_t es = oomb_type_size(t->type);
        std::vector<float> f;
        std::vector<uint8_t> back;
        auto fill = [t, ft](void * dst, uint64_t off, size_t n, std::string *) {
            qwen2_tensor_read_as(t, ft, dst, off, n);
            return GGUF_OK;
        };
        const uint64_t file_bytes = (uint64_t) (oomb_nelements(t) / gguf_tensor_type_block_size(ft)) * gguf_tensor_type_block_bytes(ft);
        stream_chunks(file_bytes, bb, fill, [&](const void * p, size_t n, std::string * e) {
            const int64_t ne = (int64_t) (n / gguf_tensor_type_block_bytes(ft)) * gguf_tensor_type_block_size(ft);
            f.resize((size_t) ne);
            back.resize((size_t) ne * es);
            gguf_convert(ft, p, GGUF_TENSOR_F32, f.data(), ne, e);
            gguf_convert(GGUF_TENSOR_F32, f.data(), mt, back.data(), ne, e);
            return sink(back.data(), back.size(), e);
        }, nullptr);
    }
    return h;
}

// Fingerprint of a LoRA run's frozen base (see train-checkpoint.h): for -m, every tensor's name,
// type, shape and three samples of its bytes (start, middle, end; 4 KiB each, so a 7B file costs a
// few MiB of reads, not a pass over it); for a random --preset base, the preset and, for a block
// --base-type, that type (the seed is checked with the options). "" when -m cannot be read.
std::string lora_base_fingerprint(const Options & o) {
    if (o.model.empty()) {
        const std::string d = "preset " + o.preset + " " + (base_type_is_block(o.base_type) ? o.base_type : std::string("dense"));
        return hex64(hash64(d.data(), d.size()));
    }
    GGUFReader r;
    std::string err;
    if (r.open(o.model, &err) != GGUF_OK) return "";
    uint64_t h = hash64("lora-base", 9);
    for (const GGUFTensorInfo & t : r.tensors()) {
        h = hash64(t.name.data(), t.name.size(), h);
        const uint64_t head[3] = {t.type, t.n_dims, t.nbytes};
        h = hash64(head, sizeof(head), h);
        h = hash64(t.ne, sizeof(t.ne), h);
        const uint8_t * d = r.tensor_data(t);
        const uint64_t w = std::min<uint64_t>(4096, t.nbytes);
        for (const uint64_t at : {(uint64_t) 0, (t.nbytes - w) / 2, t.nbytes - w}) h = hash64(d + at, (size_t) w, h);
    }
    return hex64(h);
}

// Removes temporary files of saves that a killed process left in `out` ("<name>.tmp.<pid>" of our
// output files, e.g. model.gguf.saving.tmp.1234) whose process no longer exists.
void remove_stale_temp_files(const std::string & out) {
    static const std::vector<std::string> bases = {"model.gguf.saving", "adapter.gguf.saving", "adapter_model.safetensors.saving",
                                                   "adapter_config.json.saving", "state.safetensors.saving", "loss.png", "train.jsonl"};
    for (const std::string & p : remove_orphan_temp_files(out, bases))
        printf("note: removed %s, left by an interrupted save of process %s (no longer running)\n", p.c_str(),
               p.substr(p.rfind(".tmp.") + 5).c_str());
}

void lock_output_folder(const std::string & out) {
    const std::string lp = out + "/.lock";
    const int fd = open(lp.c_str(), O_RDWR | O_CREAT, 0644);
    if (fd < 0) fail(PROG, "cannot open " + lp + ": " + strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char b[32] = {0};
        const ssize_t n = pread(fd, b, sizeof(b) - 1, 0);
        const long pid = n > 0 ? std::atol(b) : 0;
        fail(PROG, "output folder " + out + " is in use by another oomb-train" + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : ""));
    }
    const std::string me = std::to_string((long) getpid()) + "\n";
    if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != (ssize_t) me.size()) { /* the pid is informative only */ }
    // fd stays open (and locked) for the run's lifetime.
}

std::string non_finite_weight(const Qwen2Model & m) {
    std::vector<const oomb_tensor *> ts(m.params.begin(), m.params.end());
    if (m.lora) ts.insert(ts.end(), m.lora->params.begin(), m.lora->params.end());
    std::vector<uint8_t> buf(16u << 20);
    for (const oomb_tensor * t : ts) {
        if (t->type != OOMB_TYPE_F32 && t->type != OOMB_TYPE_BF16 && t->type != OOMB_TYPE_F16) continue;
        const size_t es = oomb_type_size(t->type), nb = oomb_nbytes(t);
        for (size_t off = 0; off < nb; off += buf.size()) {
            const size_t n = std::min(buf.size(), nb - off);
            oomb_tensor_get(t, buf.data(), off, n);
            const bool f16 = t->type == OOMB_TYPE_F16;
            const int64_t bad = first_non_finite(buf.data(), n, es, f16);
            if (bad < 0) continue;
            const char * what = non_finite_name(buf.data() + (size_t) bad * es, es, f16);
            return std::string("'") + t->name + "' (" + what + " at element " + std::to_string((int64_t) (off / es) + bad) + ")";
        }
    }
    return "";
}

// As tensor_bytes for an optimizer moment, refusing a NaN or infinite value (which --resume would refuse: a save
// must not write a checkpoint that cannot be resumed). Errors name the value and its element index (the writer adds the
// file and the tensor).
static TensorChunkFill moment_bytes(const oomb_tensor * t) {
    return [t](void * dst, uint64_t off, size_t n, std::string * err) {
        oomb_tensor_get(t, dst, (size_t) off, n);
        const size_t es = t->type == OOMB_TYPE_BF16 ? 2 : 4;
        if (const int64_t bad = first_non_finite((const uint8_t *) dst, n, es); bad >= 0) {
            *err = std::string("a non-finite optimizer moment (") +
                   non_finite_name((const uint8_t *) dst + (size_t) bad * es, es) + " at element " +
                   std::to_string((int64_t) (off / es) + bad) + "): the optimizer state diverged (try a lower --lr)";
            return GGUF_ERR_ARG;
        }
        return GGUF_OK;
    };
}

bool save_checkpoint(const Options & o, const Qwen2Model & m, const std::string & vocab_src, oomb_optimizer_t opt, const Sampler & s,
                     uint64_t data_hash, const TrainProgress & p, std::string * err) {
    const std::string m_name = checkpoint_model_name(o);
    const std::string m_tmp = path(o, m_name + ".saving"), s_tmp = path(o, "state.safetensors.saving");
    std::string name = o.preset.empty() ? "oomb-train" : ("oomb-train " + o.preset);
    // with an adapter, also PEFT's files (renamed before the adapter, so that a complete checkpoint has them)
    const std::string peft_st = "adapter_model.safetensors", peft_cfg = "adapter_config.json";
    // A save that fails before the model file is renamed (a full disk, an I/O error) removes the
    // complete "*.saving" files it wrote: they would hold the space a retry needs and never be used
    // (the previous checkpoint stays as it was). After that rename the pending state must stay: it
    // is what --resume rolls forward to.
    std::vector<std::string> written;
    bool keep_pending = false;
    struct Cleanup {
        std::vector<std::string> * files;
        bool * keep;
        ~Cleanup() {
            if (*keep) return;
            for (const std::string & f : *files) unlink(f.c_str());
        }
    } cleanup{&written, &keep_pending};
    if (m.lora) written = {m_tmp, path(o, peft_st + ".saving"), path(o, peft_cfg + ".saving")};
    else written = {m_tmp};
    written.push_back(s_tmp);
    // "*.saving" files already there are a killed save's leftovers (--resume rolled a pending state
    // forward before any save): removed first, so that this save does not need their space too
    // (at 7B a model.gguf.saving is 15 GB)
    for (const std::string & f : written) unlink(f.c_str());
    // the weights as the model file holds them (rounded to --out-type): what --resume loads and hashes;
    // with an adapter also in PEFT's file, so that a reader (and --resume) can tell that the pair matches
    const std::string wh = hex64(weights_hash(m, m.lora ? GGUF_TENSOR_F32 : out_type_of(o)));
    if (m.lora) {
        if (!lora_save_gguf(m, m_tmp, "oomb-train LoRA", err)) return false;
        if (!lora_save_peft_safetensors(m, path(o, peft_st + ".saving"), err, {{kPeftHashKey, wh}})) return false;
        if (!write_file_atomic(path(o, peft_cfg + ".saving"), lora_peft_config_json(m.lora->cfg, o.model), err)) return false;
    } else if (!model_save_gguf(m, m_tmp, vocab_src, out_type_of(o), name, err)) {
        return false;
    }
    SafetensorsWriter w;
    // The raw f32 or bf16 moments (--opt-state), streamed from their buffers at write().
    for (int i = 0; i < oomb_opt_n_state(opt); i++) {
        const oomb_tensor * t = oomb_opt_state(opt, i);
        const SafetensorsDtype dt = t->type == OOMB_TYPE_BF16 ? SafetensorsDtype::BF16 : SafetensorsDtype::F32;
        if (w.add_stream(t->name, dt, torch_shape(t), moment_bytes(t), err) != GGUF_OK) return false;
    }
    w.set_metadata("format", STATE_FORMAT);
    w.set_metadata("step", std::to_string(p.step));
    w.set_metadata("opt_steps", std::to_string(oomb_opt_n_steps(opt)));
    w.set_metadata("epoch", std::to_string(s.epoch));
    w.set_metadata("seq_pos", std::to_string(s.pos));
    w.set_metadata("n_seqs", std::to_string(s.n));
    w.set_metadata("rng_epoch_start", s.rng_epoch_start);
    w.set_metadata("bad_steps", std::to_string(p.bad_run));
    w.set_metadata("tokens_seen", std::to_string(p.tokens_seen));
    char el[64];
    snprintf(el, sizeof(el), "%.17g", p.elapsed_s);
    w.set_metadata("elapsed_s", el);
    w.set_metadata("data_hash", hex64(data_hash));
    w.set_metadata("weights_hash", wh);
    w.set_metadata("config", config_json(o).dump());
    if (m.lora) {
        const std::string bh = lora_base_fingerprint(o);
        if (!bh.empty()) w.set_metadata("lora_base_hash", bh);
    }
    if (w.write(s_tmp, err) != GGUF_OK) return false;
    for (const std::string & f : {peft_st, peft_cfg}) {
        if (!m.lora) break;
        if (rename(path(o, f + ".saving").c_str(), path(o, f).c_str()) != 0) {
            *err = "cannot rename " + path(o, f + ".saving") + ": " + strerror(errno);
            return false;
        }
    }
    if (rename(m_tmp.c_str(), path(o, m_name).c_str()) != 0) {
        *err = "cannot rename " + m_tmp + ": " + strerror(errno);
        return false;
    }
    keep_pending = true;  // the model file is the new one: its state must survive (rolled forward by --resume)
    if (rename(s_tmp.c_str(), path(o, "state.safetensors").c_str()) != 0) {
        *err = "cannot rename " + s_tmp + ": " + strerror(errno);
        return false;
    }
    return true;
}

void resume_checkpoint(const Options & o, const Qwen2Model & m, oomb_optimizer_t opt, uint64_t data_hash, int64_t n_seqs, int threads,
                       Sampler * sampler, TrainProgress * p, std::vector<LogEntry> * history) {
    std::string err;
    const std::string ckpt_model = path(o, checkpoint_model_name(o)), ckpt_state = path(o, "state.safetensors");
    SafetensorsFile sf;
    const uint64_t wh = weights_hash(m);
    auto state_hash = [&](const std::string & file, std::string * e) -> std::string {
        SafetensorsFile f;
        if (f.open(file, e) != GGUF_OK) return "";
        auto it = f.metadata().find("weights_hash");
        return it == f.metadata().end() ? "" : it->second;
    };
    std::string e1, e2;
    if (state_hash(ckpt_state, &e1) != hex64(wh)) {
        // An interrupted save may have replaced the model but not yet the state: roll forward.
        const std::string pending = path(o, "state.safetensors.saving");
        if (is_file(pending) && state_hash(pending, &e2) == hex64(wh)) {
            if (rename(pending.c_str(), ckpt_state.c_str()) != 0) fail(PROG, "--resume: cannot rename " + pending);
            printf("resume: completed an interrupted save (%s -> %s)\n", pending.c_str(), ckpt_state.c_str());
        } else if (!is_file(ckpt_state)) {
            fail(PROG, "--resume: " + not_a_file(ckpt_state));
        } else if (!e1.empty()) {
            fail(PROG, "--resume: " + e1);
        } else {
            fail(PROG, "--resume: " + ckpt_state + " does not belong to " + ckpt_model + " (weights hash differs)");
        }
    }
    if (sf.open(ckpt_state, &err) != GGUF_OK) fail(PROG, "--resume: " + err);
    const auto & md = sf.metadata();
    auto get = [&](const char * k) -> std::string {
        auto it = md.find(k);
        if (it == md.end()) fail(PROG, "--resume: " + ckpt_state + " lacks metadata '" + k + "'");
        return it->second;
    };
    // Numbers are parsed whole and range-checked: an edited or damaged field is an error naming it,
    // never a silent restart or a negative step.
    auto get_int = [&](const char * k, int64_t lo, int64_t hi) -> int64_t {
        const std::string v = get(k);
        int64_t x = 0;
        const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
        if (r.ec != std::errc() || r.ptr != v.data() + v.size() || x < lo || x > hi)
            fail(PROG, "--resume: " + ckpt_state + ": metadata '" + k + "' is '" + v + "', expected an integer in [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]");
        return x;
    };
    auto get_seconds = [&](const char * k) -> double {
        const std::string v = get(k);
        char * end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !std::isfinite(x) || x < 0)
            fail(PROG, "--resume: " + ckpt_state + ": metadata '" + k + "' is '" + v + "', expected a finite number of seconds >= 0");
        return x;
    };
    if (get("format") != STATE_FORMAT) fail(PROG, "--resume: " + ckpt_state + " has format '" + get("format") + "', expected " + STATE_FORMAT);
    json saved = json::parse(get("config"), nullptr, false);
    if (saved.is_discarded() || !saved.is_object()) fail(PROG, "--resume: bad config metadata in " + ckpt_state + " (not a JSON object)");
    const json now = config_json(o);
    auto opt_name = [](std::string k) {   // config key -> the option's spelling
        for (char & c : k) if (c == '_') c = '-';
        return "--" + k;
    };
    for (const char * k : {"ctx", "seqs_per_step", "seed", "trainable", "opt_state", "data_format", "train_on", "chat_pack", "chat_long",
                           "lora_rank", "lora_alpha", "lora_targets"}) {
        const std::string key = k;
        if (!saved.contains(k) && key == "opt_state") continue;  // older checkpoints: f32 (the dtype check below)
        const json sv = saved.contains(k) ? saved[k] : json(), nv = now.contains(k) ? now.at(k) : json();
        if (!saved.contains(k) && key == "data_format" && nv == "text") continue;  // older checkpoints: text
        if (sv != nv)
            fail(PROG, "--resume: " + opt_name(k) + " differs from the checkpoint's (" + sv.dump() + " vs " + nv.dump() + ")");
    }
    // after the options that shape the data (a changed one is named above), the data themselves
    if (get("data_hash") != hex64(data_hash))
        fail(PROG, "--resume: the training data differ from the checkpoint's (data hash " + hex64(data_hash) + " vs " +
                       get("data_hash") + "): give the same --data/--data-bin, --ctx, --eval-* and chat options (--data-format, --train-on, --chat-pack, --chat-long)");
    // a LoRA adapter belongs to its base: another base file (another quantization of it included) is refused
    if (m.lora && md.count("lora_base_hash") && md.at("lora_base_hash") != lora_base_fingerprint(o)) {
        const std::string was = saved.contains("model") && saved["model"].is_string() && !saved["model"].get<std::string>().empty()
                                    ? "-m " + saved["model"].get<std::string>()
                                    : "--preset " + (saved.contains("preset") ? saved["preset"].dump() : std::string("?")) + " --base-type " +
                                          (saved.contains("base_type") ? saved["base_type"].dump() : std::string("?"));
        fail(PROG, "--resume: the frozen base differs from the one the checkpoint's adapter was trained on (" + was + "): " +
                       (o.model.empty() ? "--preset " + o.preset + " --base-type " + o.base_type
                                        : "-m " + o.model + " has other tensor types, shapes or data") +
                       "; give the same base model");
    }
    for (auto it = now.begin(); it != now.end(); ++it) {
        if (saved.contains(it.key()) && saved[it.key()] != it.value() && it.key() != "threads" && it.key() != "threads_used")
            printf("resume: note: %s changed from %s to %s\n", opt_name(it.key()).c_str(), saved[it.key()].dump().c_str(), it.value().dump().c_str());
    }
    if (saved.contains("threads_used") && saved["threads_used"].is_number_integer() && saved["threads_used"].get<int>() != threads)
        printf("resume: note: the checkpoint was trained with %d thread(s), this run uses %d; a bit-exact continuation needs the same "
               "thread count (--threads %d)\n", saved["threads_used"].get<int>(), threads, saved["threads_used"].get<int>());
    if ((int) sf.tensors().size() != oomb_opt_n_state(opt))
        fail(PROG, "--resume: " + ckpt_state + " holds " + std::to_string(sf.tensors().size()) + " optimizer tensors, expected " +
                       std::to_string(oomb_opt_n_state(opt)));
    for (int i = 0; i < oomb_opt_n_state(opt); i++) {
        oomb_tensor * t = oomb_opt_state(opt, i);
        const SafetensorsTensor * st = sf.find(t->name);
        if (!st || st->shape != torch_shape(t))
            fail(PROG, std::string("--resume: optimizer tensor '") + t->name + "' is missing or misshapen in " + ckpt_state);
        const SafetensorsDtype want = t->type == OOMB_TYPE_BF16 ? SafetensorsDtype::BF16 : SafetensorsDtype::F32;
        if (st->dtype != want)
            fail(PROG, std::string("--resume: optimizer tensor '") + t->name + "' is " + safetensors_dtype_name(st->dtype) + " in " +
                           ckpt_state + ", this run keeps " + safetensors_dtype_name(want) + " moments (--opt-state)");
        // in slices, each given back to the kernel once copied: the state file never becomes resident whole.
        // Every value is checked first: a NaN or an infinite moment would turn the first update's weights into
        // NaN (then saved as a good checkpoint), so a damaged state is refused here, naming the tensor.
        const size_t es = want == SafetensorsDtype::BF16 ? 2 : 4;
        for (size_t off = 0; off < st->nbytes; off += kStateSlice) {
            const size_t len = std::min(kStateSlice, st->nbytes - off);
            if (const int64_t bad = first_non_finite(st->data + off, len, es); bad >= 0) {
                const int64_t at = (int64_t) (off / es) + bad;
                fail(PROG, std::string("--resume: optimizer tensor '") + t->name + "' in " + ckpt_state + " holds a non-finite value (" +
                               non_finite_name(st->data + (size_t) at * es, es) + " at element " + std::to_string(at) +
                               "): the state is damaged; resume from another checkpoint or start afresh");
            }
            if (ends_with(t->name, ".adam_v")) {
                if (const int64_t neg = first_negative(st->data + off, len, es); neg >= 0)
                    fail(PROG, std::string("--resume: optimizer tensor '") + t->name + "' in " + ckpt_state +
                                   " holds a negative second moment (element " + std::to_string((int64_t) (off / es) + neg) +
                                   "): the state is damaged; resume from another checkpoint or start afresh");
            }
            oomb_tensor_set(t, st->data + off, off, len);
            sf.release(st->data + off, len);
        }
    }
    const int64_t I64 = std::numeric_limits<int64_t>::max();
    p->step = get_int("step", 0, std::numeric_limits<int>::max());
    const int64_t opt_steps = get_int("opt_steps", 0, I64);
    // every update is a step (a skipped non-finite step is a step without one): more updates than steps is a damaged state
    if (opt_steps > p->step)
        fail(PROG, "--resume: metadata 'opt_steps' (" + std::to_string(opt_steps) + ") exceeds 'step' (" + std::to_string(p->step) + ") in " +
                       ckpt_state + ": the state is damaged; resume from another checkpoint or start afresh");
    oomb_opt_set_n_steps(opt, opt_steps);
    p->bad_run = (int) get_int("bad_steps", 0, std::numeric_limits<int>::max());
    p->tokens_seen = get_int("tokens_seen", 0, I64);
    p->elapsed_s = get_seconds("elapsed_s");
    if (get_int("n_seqs", 0, I64) != n_seqs) fail(PROG, "--resume: the number of sequences differs from the checkpoint's");
    if (!sampler->restore(n_seqs, get_int("epoch", 0, I64), get_int("seq_pos", 0, I64), get("rng_epoch_start")))
        fail(PROG, "--resume: bad data position / RNG state in " + ckpt_state);
    // The log keeps the entries up to the checkpoint (oomb-train refused a train.jsonl that is not a regular file already).
    std::ifstream in(path(o, "train.jsonl"));
    std::string line, kept;
    while (std::getline(in, line)) {
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
            j["step"].get<int64_t>() > p->step)
            continue;
        kept += line + "\n";
        if (j.contains("loss") && j["loss"].is_number()) history->push_back({j["step"].get<int64_t>(), j["loss"].get<double>(), false});
        if (j.contains("eval_loss") && j["eval_loss"].is_number())
            history->push_back({j["step"].get<int64_t>(), j["eval_loss"].get<double>(), true});
    }
    in.close();
    if (!write_file_atomic(path(o, "train.jsonl"), kept, &err)) fail(PROG, err);
    if (m.lora) sync_peft_files(o, m, hex64(wh));
    printf("resume: from step %" PRId64 " (epoch %" PRId64 ", sequence %" PRId64 "/%" PRId64 ")\n", p->step, sampler->epoch,
           sampler->pos, sampler->n);
}

} // namespace train
} // namespace oomb
