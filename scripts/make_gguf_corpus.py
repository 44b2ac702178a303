#!/usr/bin/python3
"""Writes the GGUF fuzz corpus / reader test table: tests/fuzz/corpus/gguf/*.gguf.

A few small VALID files (valid_*.gguf: the reader must open them) and many hand-broken ones, each a valid
file with exactly one field corrupted. tests/unit/test_gguf.c maps every broken file name to a substring
its error message must contain, so a renamed or added case here needs a row there.

The encoder is written from the format description (little endian: magic, u32 version, u64 n_tensors,
u64 n_kv, kv pairs, tensor infos, padding to the alignment, data), independently of src/engine/gguf/gguf_writer.c,
so the corpus also checks the C writer and reader against a second implementation.

Usage: /usr/bin/python3 scripts/make_gguf_corpus.py [OUTDIR]
"""
import os
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
              U64: "<Q", I64: "<q", F64: "<d"}
# dtype: (block elems, block bytes)
F32T, F16T, Q4_0T, Q8_0T, Q5_KT = 0, 1, 2, 8, 13
BLOCK = {F32T: (1, 4), F16T: (1, 2), Q4_0T: (32, 18), Q8_0T: (32, 34), Q5_KT: (256, 176)}


def gstr(s):
    if isinstance(s, str):
        s = s.encode()
    return struct.pack("<Q", len(s)) + s


def value(vtype, v):
    """Serialized value (without the type tag)."""
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        etype, items = v
        out = struct.pack("<IQ", etype, len(items))
        return out + b"".join(value(etype, x) for x in items)
    return struct.pack(SCALAR_FMT[vtype], v)


def kv(key, vtype, v):
    return {"key": key, "type": vtype, "raw": value(vtype, v)}


def nbytes(t):
    if not t["ne"]:
        return 0
    be, bb = BLOCK.get(t["type"], (1, 4))
    n = 1
    for d in t["ne"][1:]:
        n *= d
    return t["ne"][0] // be * bb * n


def tensor(name, ttype, ne):
    return {"name": name, "type": ttype, "ne": list(ne), "n_dims": len(ne)}


class Model:
    def __init__(self, version=3, alignment=32):
        self.version = version
        self.alignment = alignment
        self.kvs = []
        self.tensors = []

    def layout(self):
        """Assigns offsets in declaration order (keeping any a case set) and returns the data length, capped
        so that a case with an absurd shape still makes a small file (it fails before the data is reached)."""
        off = 0
        for t in self.tensors:
            if "offset" not in t:
                t["offset"] = off
            off += (min(nbytes(t), 4096) + self.alignment - 1) // self.alignment * self.alignment
        return off

    def encode(self, n_tensors=None, n_kv=None, magic=b"GGUF", version_bytes=None):
        data_len = self.layout()
        out = bytearray(magic)
        out += version_bytes if version_bytes is not None else struct.pack("<I", self.version)
        out += struct.pack("<QQ", len(self.tensors) if n_tensors is None else n_tensors,
                           len(self.kvs) if n_kv is None else n_kv)
        for p in self.kvs:
            out += p.get("rawkey", gstr(p["key"])) + struct.pack("<I", p["type"]) + p["raw"]
        for t in self.tensors:
            out += gstr(t["name"]) + struct.pack("<I", t["n_dims"])
            out += b"".join(struct.pack("<Q", d) for d in t["ne"])
            out += struct.pack("<IQ", t["type"], t["offset"])
        if self.tensors:
            out += b"\0" * ((-len(out)) % self.alignment)
            # deterministic non-zero pattern so data reads are visible
            out += bytes((i * 7 + 3) & 0xFF for i in range(data_len))
        return bytes(out)


def small(version=3):
    """The valid base file every broken case starts from: a few keys of common types and 3 tensors."""
    m = Model(version)
    m.kvs = [
        kv("general.architecture", STR, "llama"),
        kv("general.name", STR, "corpus"),
        kv("llama.block_count", U32, 1),
        kv("llama.rope.freq_base", F32, 10000.0),
        kv("tokenizer.ggml.add_bos_token", BOOL, 1),
        kv("tokenizer.ggml.tokens", ARR, (STR, ["<unk>", "<s>", "</s>", "a"])),
        kv("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3, 1])),
    ]
    m.tensors = [
        tensor("output_norm.weight", F32T, [8]),
        tensor("blk.0.attn_q.weight", F16T, [32, 2]),
        tensor("blk.0.ffn_up.weight", Q8_0T, [32, 2]),
    ]
    return m


def all_types():
    m = Model()
    m.kvs = [
        kv("t.u8", U8, 200), kv("t.i8", I8, -100), kv("t.u16", U16, 60000), kv("t.i16", I16, -30000),
        kv("t.u32", U32, 4000000000), kv("t.i32", I32, -2000000000), kv("t.f32", F32, 1.5),
        kv("t.bool", BOOL, 0), kv("t.str", STR, "h\u00e9llo"), kv("t.empty_str", STR, ""),
        kv("t.u64", U64, 1 << 63), kv("t.i64", I64, -(1 << 62)), kv("t.f64", F64, -2.25),
        kv("t.arr_u8", ARR, (U8, [1, 2, 255])), kv("t.arr_i8", ARR, (I8, [-1, 0, 1])),
        kv("t.arr_u16", ARR, (U16, [65535])), kv("t.arr_i16", ARR, (I16, [-2, 2])),
        kv("t.arr_u32", ARR, (U32, [7, 8, 9])), kv("t.arr_i32", ARR, (I32, [-7])),
        kv("t.arr_f32", ARR, (F32, [0.5, -0.25])), kv("t.arr_bool", ARR, (BOOL, [1, 0, 1])),
        kv("t.arr_str", ARR, (STR, ["x", "", "yz"])), kv("t.arr_u64", ARR, (U64, [1 << 40])),
        kv("t.arr_i64", ARR, (I64, [-(1 << 40)])), kv("t.arr_f64", ARR, (F64, [3.0])),
        kv("t.arr_empty", ARR, (U32, [])),
    ]
    m.tensors = [tensor("t", F32T, [4, 3, 2, 1])]
    return m


def find_kv(m, key):
    return next(p for p in m.kvs if p["key"] == key)


def cases():
    """(file name, bytes). Broken files: one field corrupted each."""
    out = []

    def add(name, data):
        out.append((name, data))

    add("valid_small.gguf", small().encode())
    add("valid_v2.gguf", small(version=2).encode())
    add("valid_all_types.gguf", all_types().encode())
    m = small()
    m.tensors = []
    add("valid_no_tensors.gguf", m.encode())
    m = small()
    m.alignment = 64
    m.kvs.append(kv("general.alignment", U32, 64))
    add("valid_alignment64.gguf", m.encode())
    m = small()
    m.tensors.append(tensor("blk.0.ffn_down.weight", Q5_KT, [256, 2]))  # known to GGML, unsupported here
    add("valid_unsupported_type.gguf", m.encode())

    base = small().encode()
    add("empty.gguf", b"")
    add("truncated_magic.gguf", b"GG")
    add("bad_magic.gguf", b"GGML" + base[4:])
    add("truncated_header.gguf", base[:12])
    m = small()
    m.version = 1
    add("version1.gguf", m.encode())
    m = small()
    m.version = 99
    add("version99.gguf", m.encode())
    add("big_endian.gguf", small().encode(version_bytes=struct.pack(">I", 3)))
    add("huge_tensor_count.gguf", small().encode(n_tensors=1 << 60))
    add("huge_kv_count.gguf", small().encode(n_kv=(1 << 62) + 5))
    # first key's length field replaced by a length far past the end
    add("string_len_past_eof.gguf", base[:24] + struct.pack("<Q", 1 << 40) + base[32:])
    # cut inside the elements of the last kv ('tokenizer.ggml.token_type', 4 x i32)
    cut = base.index(b"tokenizer.ggml.token_type") + len("tokenizer.ggml.token_type") + 4 + 12 + 6
    add("truncated_kv.gguf", base[:cut])

    m = small()
    find_kv(m, "llama.block_count")["type"] = 13
    add("bad_value_type.gguf", m.encode())
    m = small()
    m.kvs.insert(2, {"key": "x.nested", "type": ARR, "raw": struct.pack("<IQ", ARR, 1) + value(ARR, (U8, [1]))})
    add("nested_array.gguf", m.encode())
    m = small()
    m.kvs.insert(2, {"key": "x.badarr", "type": ARR, "raw": struct.pack("<IQ", 99, 1) + b"\0"})
    add("bad_array_type.gguf", m.encode())
    m = small()
    p = find_kv(m, "tokenizer.ggml.token_type")
    p["raw"] = struct.pack("<IQ", I32, 1 << 50) + p["raw"][12:]
    add("array_len_past_eof.gguf", m.encode())
    m = small()
    p = find_kv(m, "tokenizer.ggml.tokens")
    p["raw"] = struct.pack("<IQ", STR, 1 << 40) + p["raw"][12:]
    add("string_array_huge.gguf", m.encode())
    m = small()
    p = find_kv(m, "tokenizer.ggml.tokens")
    # element 2's length points past the end of the file
    items = [gstr("<unk>"), gstr("<s>"), struct.pack("<Q", 1 << 33) + b"</s>", gstr("a")]
    p["raw"] = struct.pack("<IQ", STR, 4) + b"".join(items)
    add("string_array_elem_past_eof.gguf", m.encode())
    m = small()
    m.kvs.append(kv("general.name", STR, "again"))
    add("duplicate_key.gguf", m.encode())
    m = small()
    m.kvs.insert(1, kv("", U32, 1))
    add("empty_key.gguf", m.encode())
    m = small()
    find_kv(m, "tokenizer.ggml.add_bos_token")["raw"] = b"\x02"
    add("bad_bool.gguf", m.encode())
    m = small()
    m.kvs.append(kv("general.alignment", U32, 48))
    add("bad_alignment.gguf", m.encode())
    m = small()
    m.kvs.append(kv("general.alignment", U32, 0))
    add("zero_alignment.gguf", m.encode())
    m = small()
    m.kvs.append(kv("general.alignment", U64, 32))
    add("alignment_wrong_type.gguf", m.encode())

    def tcase(name, fn):
        m = small()
        fn(m, m.tensors[1])
        add(name, m.encode())

    tcase("zero_dim.gguf", lambda m, t: t.update(ne=[32, 0]))
    tcase("too_many_dims.gguf", lambda m, t: t.update(n_dims=5, ne=[32, 2, 1, 1, 1]))
    tcase("zero_dims.gguf", lambda m, t: t.update(n_dims=0, ne=[]))
    tcase("dims_overflow.gguf", lambda m, t: t.update(n_dims=3, ne=[1 << 32, 1 << 32, 4], offset=64))
    tcase("ne_negative.gguf", lambda m, t: t.update(ne=[32, 1 << 63], offset=64))
    tcase("bytes_overflow.gguf", lambda m, t: t.update(type=F32T, ne=[1 << 62], n_dims=1, offset=64))
    tcase("unknown_tensor_type.gguf", lambda m, t: t.update(type=4))
    tcase("bad_block_multiple.gguf", lambda m, t: t.update(type=Q8_0T, ne=[33, 2]))
    tcase("misaligned_offset.gguf", lambda m, t: t.update(offset=36))
    tcase("tensor_offset_huge.gguf", lambda m, t: t.update(offset=1 << 63))
    tcase("overlapping_tensors.gguf", lambda m, t: t.update(offset=0))
    tcase("duplicate_tensor.gguf", lambda m, t: t.update(name="output_norm.weight"))
    tcase("empty_tensor_name.gguf", lambda m, t: t.update(name=""))
    tcase("tensor_name_nul.gguf", lambda m, t: t.update(name=b"blk.0\0attn_q.weight"))
    good = small().encode()
    add("tensor_past_eof.gguf", good[:len(good) - 40])
    # cut inside tensor 1's dims
    m = small()
    full = m.encode()
    hdr_end = 24 + sum(len(gstr(p["key"])) + 4 + len(p["raw"]) for p in m.kvs)
    t0 = len(gstr("output_norm.weight")) + 4 + 8 + 4 + 8
    add("truncated_tensor_info.gguf", full[:hdr_end + t0 + len(gstr("blk.0.attn_q.weight")) + 4 + 5])
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fuzz",
                                                                 "corpus", "gguf")
    os.makedirs(outdir, exist_ok=True)
    for name, data in cases():
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(cases())} files to {outdir}")


if __name__ == "__main__":
    main()
