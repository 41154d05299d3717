#!/usr/bin/env python3
"""make_ksec_seeds.py — small kernels sections (layout in
runtime/cuda/kiln_ksec.h) for fuzz/corpus/kernels_section/: valid ones
(modules with sources, a cubin and a PTX image) and one broken per rule.
Run: python3 fuzz/data/make_ksec_seeds.py (deterministic)."""
import os
import struct

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "kernels_section")
os.makedirs(out, exist_ok=True)


def section(modules, images, version=2, elem=0, block=16, pad=b""):
    """modules: [(name, cfg[8], source bytes)]; images: [(module, sm, kind, bytes)]"""
    data = b""
    mods = b""
    for name, cfg, src in modules:
        off = len(data)
        data += src
        mods += name.encode().ljust(48, b"\0")[:48] + struct.pack("<8i", *cfg) + struct.pack("<QQ", off, len(src))
    imgs = b""
    for mod, sm, kind, blob in images:
        while len(data) % 16:
            data += b"\0"
        off = len(data)
        data += blob
        imgs += struct.pack("<IIIIQQ", mod, sm, kind, 0, off, len(blob))
    head = b"KKRN" + struct.pack("<IIIIIII", version, len(modules), len(images), elem, block, 0, 0)
    return head + mods + imgs + data + pad


cfg = [128, 0, 0, 0, 0, 0, 0, 0]
mods = [("util", cfg, b"extern \"C\" __global__ void kiln_gather_rows() {}"),
        ("rmsnorm.e3727c5ac", cfg, b"// rmsnorm"),
        ("attn_decode.w0", [64, 4, 0, 0, 0, 0, 0, 0], b"// attention")]
imgs = [(0, 80, 0, b"\x7fELF" + b"\1" * 60), (1, 90, 1, b".version 8.0\n.target sm_90\n\0"),
        (2, 90, 1, b"// ptx\0")]
seeds = {
    "valid.ksec": section(mods, imgs),
    "sources_only.ksec": section(mods, []),
    "f32.ksec": section(mods[:1], imgs[:1], elem=1, block=256),
    "bad_version.ksec": section(mods, imgs, version=1),
    "dup_name.ksec": section([mods[0], mods[0]], []),
    "ptx_no_nul.ksec": section(mods[:1], [(0, 90, 1, b".version")]),
    "bad_block.ksec": section(mods, imgs, block=24),
}
# a source that lies outside the data
s = bytearray(section(mods[:1], []))
struct.pack_into("<Q", s, 32 + 80, 1 << 62)
seeds["source_outside.ksec"] = bytes(s)
# an image naming a module that does not exist
s = bytearray(section(mods[:1], imgs[:1]))
struct.pack_into("<I", s, 32 + 96, 7)
seeds["image_module.ksec"] = bytes(s)
for name, b in seeds.items():
    open(os.path.join(out, name), "wb").write(b)
print(len(seeds), "seeds in", out)
