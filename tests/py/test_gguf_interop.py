#!/usr/bin/env python3
"""GGUF interoperability with llama.cpp's own Python package `gguf` (PyPI).

1. Files we write (oomb-convert-hf on the qwen2 fixtures, the shipped vocab, and a sample with every
   metadata value type and tensor type from test-gguf) read back in gguf.GGUFReader with the same
   keys, names, shapes, types and values.
2. Files gguf.GGUFWriter writes (every value type, nested arrays, custom alignment, F32/F16/BF16
   tensors and Q8_0/Q4_0/Q4_1 tensors from gguf.quants) read correctly in ours (through
   `oomb-gguf-dump --json --data`).

Exit 77 (skipped) when numpy/gguf or the tools are missing. Finds tools via $OOMB_BIN_DIR.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFValueType as V
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

BIN = os.environ.get("OOMB_BIN_DIR", "build/bin")
SRC = os.environ.get("OOMB_SOURCE_DIR", ".")
FIX = os.environ.get("OOMB_FIXTURES") or os.environ.get("OOMB_FIXTURES_DEFAULT") or os.path.join(SRC, "..", "shared", "fixtures")
TOOLS = {t: os.path.join(BIN, t) for t in ("oomb-convert-hf", "oomb-gguf-dump", "test-gguf")}
for t, p in TOOLS.items():
    if not os.access(p, os.X_OK):
        print(f"skip: {p} not built")
        sys.exit(77)

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def run(*args, env=None):
    r = subprocess.run(list(args), capture_output=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{args} failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    return r.stdout


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], b[8 + n + s:8 + n + e])
    return out


def field_value(r, key):
    return r.fields[key].contents()


def gguf_name(hf):
    subs = [("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"), ("model.layers.", "blk."), ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"), ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"), ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")]
    for a, b in subs:
        hf = hf.replace(a, b)
    return hf


def test_converter_removes_stale_temp(tmp):
    """A conversion killed by SIGKILL leaves OUT.tmp.<pid>: the next oomb-convert-hf to OUT removes it (once that
    process is gone) with a note; another output's temp file is left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = os.path.join(tmp, "stale-check.gguf")
    stale, other = f"{out}.tmp.{dead.pid}", os.path.join(tmp, f"other.gguf.tmp.{dead.pid}")
    for f in (stale, other):
        with open(f, "wb") as fh:
            fh.write(b"partial")
    r = subprocess.run([TOOLS["oomb-convert-hf"], os.path.join(FIX, "qwen2-micro"), "-o", out], capture_output=True, text=True)
    check(r.returncode == 0 and not os.path.exists(stale) and os.path.exists(other)
          and f"oomb-convert-hf: note: removed {stale}" in r.stderr,
          f"oomb-convert-hf removes a dead process's OUT.tmp.<pid> with a note, keeps another's ({r.stderr.strip()[-300:]})")
    os.unlink(other)


def test_converted_models(tmp):
    for model in ("qwen2-micro", "qwen2-mini"):
        cfg = json.load(open(os.path.join(FIX, model, "config.json")))
        st = read_safetensors(os.path.join(FIX, model, "model.safetensors"))
        for outtype in (None, "f32"):
            out = os.path.join(tmp, f"{model}-{outtype}.gguf")
            run(TOOLS["oomb-convert-hf"], os.path.join(FIX, model), "-o", out, *(["--outtype", outtype] if outtype else []))
            r = gguf.GGUFReader(out)
            tag = f"{model}/{outtype or 'default'}"
            check(field_value(r, "general.architecture") == "qwen2", f"{tag}: architecture")
            for key, hf, vt in [("qwen2.block_count", "num_hidden_layers", V.UINT32),
                                ("qwen2.context_length", "max_position_embeddings", V.UINT32),
                                ("qwen2.embedding_length", "hidden_size", V.UINT32),
                                ("qwen2.feed_forward_length", "intermediate_size", V.UINT32),
                                ("qwen2.attention.head_count", "num_attention_heads", V.UINT32),
                                ("qwen2.attention.head_count_kv", "num_key_value_heads", V.UINT32)]:
                check(r.fields[key].types == [vt], f"{tag}: {key} type {r.fields[key].types}")
                check(field_value(r, key) == cfg[hf], f"{tag}: {key} = {field_value(r, key)} != {cfg[hf]}")
            check(r.fields["qwen2.rope.freq_base"].types == [V.FLOAT32], f"{tag}: freq_base type")
            check(field_value(r, "qwen2.rope.freq_base") == cfg["rope_parameters"]["rope_theta"], f"{tag}: freq_base")
            check(np.float32(field_value(r, "qwen2.attention.layer_norm_rms_epsilon")) == np.float32(cfg["rms_norm_eps"]), f"{tag}: eps")
            check(field_value(r, "general.file_type") == (0 if outtype == "f32" else 32), f"{tag}: file_type")
            names = {t.name: t for t in r.tensors}
            check(len(names) == len(st), f"{tag}: {len(names)} tensors, checkpoint has {len(st)}")
            for hf, (dtype, shape, raw) in st.items():
                t = names.get(gguf_name(hf))
                if t is None:
                    check(False, f"{tag}: {gguf_name(hf)} missing")
                    continue
                check(t.shape.tolist() == list(reversed(shape)), f"{tag}: {t.name} ne {t.shape.tolist()} vs torch shape {shape}")
                want = Q.F32 if (outtype == "f32" or len(shape) == 1) else Q.BF16
                check(t.tensor_type == want, f"{tag}: {t.name} type {t.tensor_type.name}")
                bits = np.frombuffer(raw, dtype=np.uint16)
                if want == Q.BF16:
                    check(t.data.tobytes() == raw, f"{tag}: {t.name} bytes differ")
                else:
                    ref = (bits.astype(np.uint32) << 16).view(np.float32).reshape(shape)
                    check(t.data.shape == tuple(shape) and np.array_equal(t.data.view(np.uint32), ref.view(np.uint32)),
                          f"{tag}: {t.name} f32 values differ")


def test_vocab():
    r = gguf.GGUFReader(os.path.join(SRC, "models", "qwen2.5-vocab.gguf"))
    tok = json.load(open(os.path.join(FIX, "qwen-tokenizer", "tokenizer.json")))
    vocab = {i: t for t, i in tok["model"]["vocab"].items()}
    for a in tok["added_tokens"]:
        vocab[a["id"]] = a["content"]
    tokens = field_value(r, "tokenizer.ggml.tokens")
    check(len(tokens) == 151665, f"vocab: {len(tokens)} tokens")
    check(tokens == [vocab[i] for i in range(len(vocab))], "vocab: token list differs from tokenizer.json")
    types = field_value(r, "tokenizer.ggml.token_type")
    check(r.fields["tokenizer.ggml.token_type"].types == [V.ARRAY, V.INT32], "vocab: token_type type")
    # llama.cpp: added tokens are CONTROL (3) when special or <|...|>, else USER_DEFINED (4)
    added = {a["id"]: 3 if a["special"] or (a["content"].startswith("<|") and a["content"].endswith("|>")) else 4
             for a in tok["added_tokens"]}
    check(types == [added.get(i, 1) for i in range(len(types))], "vocab: token types")
    check(sorted(i for i, t in enumerate(types) if t == 4) == [151657, 151658], "vocab: <tool_call> tokens are USER_DEFINED")
    merges = field_value(r, "tokenizer.ggml.merges")
    want = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    check(merges == want, "vocab: merges differ")
    check(field_value(r, "tokenizer.ggml.model") == "gpt2" and field_value(r, "tokenizer.ggml.pre") == "qwen2", "vocab: model/pre")
    check(field_value(r, "tokenizer.ggml.eos_token_id") == 151645, "vocab: eos")
    check(field_value(r, "tokenizer.ggml.padding_token_id") == 151643, "vocab: pad")
    check(field_value(r, "tokenizer.ggml.bos_token_id") == 151643, "vocab: bos")
    check(field_value(r, "tokenizer.ggml.add_bos_token") is False, "vocab: add_bos_token")
    check(len(r.tensors) == 0, "vocab: has tensors")


def dump(path):
    return json.loads(run(TOOLS["oomb-gguf-dump"], "--json", "--data", path))


def test_our_sample(tmp):
    path = os.path.join(tmp, "sample.gguf")
    env = dict(os.environ, OOMB_GGUF_SAMPLE_OUT=path)
    run(TOOLS["test-gguf"], "--gtest_filter=GGUFInterop.WriteSample", env=env)
    r = gguf.GGUFReader(path)
    expect = {
        "general.alignment": ([V.UINT32], 64), "test.u8": ([V.UINT8], 250), "test.i8": ([V.INT8], -100),
        "test.u16": ([V.UINT16], 65000), "test.i16": ([V.INT16], -32000), "test.u32": ([V.UINT32], 4000000000),
        "test.i32": ([V.INT32], -2000000000), "test.f32": ([V.FLOAT32], 3.25), "test.bool_true": ([V.BOOL], True),
        "test.bool_false": ([V.BOOL], False), "test.string": ([V.STRING], "héllo, wörld 🙂"),
        "test.string_nul": ([V.STRING], "a\0b"), "test.string_empty": ([V.STRING], ""),
        "test.u64": ([V.UINT64], 18000000000000000000), "test.i64": ([V.INT64], -9000000000000000000),
        "test.f64": ([V.FLOAT64], -1.0 / 3.0), "test.arr_u8": ([V.ARRAY, V.UINT8], [0, 1, 255]),
        "test.arr_i8": ([V.ARRAY, V.INT8], [-128, 0, 127]), "test.arr_u16": ([V.ARRAY, V.UINT16], [0, 65535]),
        "test.arr_i16": ([V.ARRAY, V.INT16], [-32768, 32767]), "test.arr_u32": ([V.ARRAY, V.UINT32], [1, 2, 4000000000]),
        "test.arr_i32": ([V.ARRAY, V.INT32], [-1, 0, 1]),
        "test.arr_f32": ([V.ARRAY, V.FLOAT32], [0.5, -2.0, float(np.float32(1e30))]),
        "test.arr_bool": ([V.ARRAY, V.BOOL], [True, False, True]),
        "test.arr_u64": ([V.ARRAY, V.UINT64], [0, 18446744073709551615]), "test.arr_i64": ([V.ARRAY, V.INT64], [-5, 5]),
        "test.arr_f64": ([V.ARRAY, V.FLOAT64], [1e-300, 2.5]),
        "test.arr_str": ([V.ARRAY, V.STRING], ["a", "", "ĠĠ", "<|im_start|>"]),
        "test.arr_empty": ([V.ARRAY], []),
    }
    for k, (types, val) in expect.items():
        f = r.fields.get(k)
        if f is None:
            check(False, f"sample: {k} missing in gguf-py")
            continue
        check(f.types == types, f"sample: {k} types {f.types} != {types}")
        check(f.contents() == val, f"sample: {k} = {f.contents()!r} != {val!r}")
    nested = r.fields.get("test.arr_nested")
    check(nested is not None and nested.types[:2] == [V.ARRAY, V.ARRAY], "sample: nested array not read by gguf-py")
    ours = {t["name"]: t for t in dump(path)["tensors"]}
    want_types = {"t.f32": Q.F32, "t.f16": Q.F16, "t.bf16": Q.BF16, "t.q8_0": Q.Q8_0, "t.q4_0": Q.Q4_0, "t.q4_1": Q.Q4_1, "t.empty": Q.F32}
    for t in r.tensors:
        check(t.tensor_type == want_types[t.name], f"sample: {t.name} type {t.tensor_type.name}")
        check(t.shape.tolist() == ours[t.name]["ne"], f"sample: {t.name} shape {t.shape.tolist()} vs ours {ours[t.name]['ne']}")
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        got = np.array(ours[t.name]["data"], dtype=np.float32)
        check(np.array_equal(ref, got), f"sample: {t.name}: our values differ from gguf.quants.dequantize")


def test_gguf_py_files(tmp):
    rng = np.random.default_rng(0)
    for align in (32, 64):
        path = os.path.join(tmp, f"pywritten-{align}.gguf")
        w = gguf.GGUFWriter(path, "qwen2")
        if align != 32:
            w.add_custom_alignment(align)
        w.add_uint8("p.u8", 200)
        w.add_int8("p.i8", -7)
        w.add_uint16("p.u16", 60000)
        w.add_int16("p.i16", -30000)
        w.add_uint32("p.u32", 3000000000)
        w.add_int32("p.i32", -123456)
        w.add_float32("p.f32", 0.1)
        w.add_uint64("p.u64", 2 ** 63 + 5)
        w.add_int64("p.i64", -(2 ** 62))
        w.add_float64("p.f64", 2.0 ** -40)
        w.add_bool("p.bool", True)
        w.add_string("p.str", "ünïcödé ✓")
        w.add_array("p.arr_int", [1, -2, 3])
        w.add_array("p.arr_float", [1.5, 2.5])
        w.add_array("p.arr_str", ["x", "yy", ""])
        w.add_array("p.arr_bool", [True, False])
        w.add_array("p.arr_nested", [[1, 2], [3, 4, 5]])
        w.add_key_value("p.arr_u8", [9, 8], V.ARRAY, sub_type=V.UINT8)
        tensors = {}
        f32 = rng.standard_normal((3, 5)).astype(np.float32)
        w.add_tensor("w.f32", f32)
        tensors["w.f32"] = (Q.F32, f32)
        f16 = rng.standard_normal((4, 2, 3)).astype(np.float16)
        w.add_tensor("w.f16", f16)
        tensors["w.f16"] = (Q.F16, f16.astype(np.float32))
        x = rng.standard_normal((2, 8)).astype(np.float32)
        bf = gguf.quants.quantize(x, Q.BF16)
        w.add_tensor("w.bf16", bf, raw_dtype=Q.BF16)
        tensors["w.bf16"] = (Q.BF16, gguf.quants.dequantize(bf, Q.BF16))
        for qt in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
            x = rng.standard_normal((3, 64)).astype(np.float32)
            q = gguf.quants.quantize(x, qt)
            w.add_tensor(f"w.{qt.name.lower()}", q, raw_dtype=qt)
            tensors[f"w.{qt.name.lower()}"] = (qt, gguf.quants.dequantize(q, qt))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

        d = dump(path)
        tag = f"gguf-py file (alignment {align})"
        check(d["alignment"] == align, f"{tag}: alignment {d['alignment']}")
        m = d["metadata"]
        expect = {"general.architecture": ("string", "qwen2"), "p.u8": ("uint8", 200), "p.i8": ("int8", -7),
                  "p.u16": ("uint16", 60000), "p.i16": ("int16", -30000), "p.u32": ("uint32", 3000000000),
                  "p.i32": ("int32", -123456), "p.f32": ("float32", float(np.float32(0.1))),
                  "p.u64": ("uint64", 2 ** 63 + 5), "p.i64": ("int64", -(2 ** 62)), "p.f64": ("float64", 2.0 ** -40),
                  "p.bool": ("bool", True), "p.str": ("string", "ünïcödé ✓"), "p.arr_int": ("array", [1, -2, 3]),
                  "p.arr_float": ("array", [1.5, 2.5]), "p.arr_str": ("array", ["x", "yy", ""]),
                  "p.arr_bool": ("array", [True, False]), "p.arr_nested": ("array", [[1, 2], [3, 4, 5]]),
                  "p.arr_u8": ("array", [9, 8])}
        for k, (ty, val) in expect.items():
            e = m.get(k)
            check(e is not None and e["type"] == ty and e["value"] == val, f"{tag}: {k} = {e} (want {ty} {val!r})")
        check(m["p.arr_u8"]["array_type"] == "uint8" and m["p.arr_nested"]["array_type"] == "array", f"{tag}: array types")
        ours = {t["name"]: t for t in d["tensors"]}
        for name, (qt, ref) in tensors.items():
            t = ours.get(name)
            if t is None:
                check(False, f"{tag}: {name} missing")
                continue
            check(t["type"] == qt.name, f"{tag}: {name} type {t['type']} != {qt.name}")
            check(t["shape"] == list(ref.shape), f"{tag}: {name} shape {t['shape']} != {list(ref.shape)}")
            got = np.array(t["data"], dtype=np.float32)
            check(np.array_equal(got, ref.astype(np.float32).reshape(-1)), f"{tag}: {name} values differ")


def main():
    with tempfile.TemporaryDirectory(prefix="oomb-py-gguf-") as tmp:
        test_converted_models(tmp)
        test_converter_removes_stale_temp(tmp)
        test_vocab()
        test_our_sample(tmp)
        test_gguf_py_files(tmp)
    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("ok: gguf interop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
