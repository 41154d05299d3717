#!/usr/bin/env python3
"""make_ksec_seeds.py — small kernels sections (layout in
format/kiln_ksec.h) for fuzz/corpus/kernels_section/: valid ones
(modules with sources, a cubin and a PTX image, a module sharing another's
source and images) and one broken per rule.
Run: python3 fuzz/data/make_ksec_seeds.py (deterministic)."""
import os
import struct

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "kernels_section")
os.makedirs(out, exist_ok=True)


OWN = 0xFFFFFFFF  # a module's "shares" field: it owns its source and images
MODULE_SIZE = 104


def section(modules, images, version=3, elem=0, block=16, pad=b""):
    """modules: [(name, cfg[8], source bytes, or the index of the module it shares)];
    images: [(module, sm, kind, bytes)]"""
    data = b""
    mods = b""
    for name, cfg, src in modules:
        if isinstance(src, int):
            off, size, shares = 0, 0, src
        else:
            off, size, shares = len(data), len(src), OWN
            data += src
        mods += (name.encode().ljust(48, b"\0")[:48] + struct.pack("<8i", *cfg) +
                 struct.pack("<QQII", off, size, shares, 0))
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
# gemv modules: the second and third share the first's source and images
gemv = [("gemv.plain.64x64.m1", [16, 0, 1, 8, 1, 0, 0, 0], b"#define GEMV_WARPS 16\n"),
        ("gemv.plain.128x64.m1", [16, 0, 1, 8, 1, 0, 0, 0], 3),
        ("gemv.plain.64x64.mma", [16, 0, 1, 8, 1, 0, 0, 0], 3)]
shared_imgs = imgs + [(3, 80, 0, b"\x7fELF" + b"\2" * 60), (3, 90, 1, b"// gemv ptx\0")]
seeds = {
    "valid.ksec": section(mods, imgs),
    "sources_only.ksec": section(mods, []),
    "f32.ksec": section(mods[:1], imgs[:1], elem=1, block=256),
    "shared.ksec": section(mods + gemv, shared_imgs),
    "bad_version.ksec": section(mods, imgs, version=2),
    "share_out_of_range.ksec": section(mods + [("gemv.a", cfg, 9)], imgs),
    "share_self.ksec": section(mods + [("gemv.a", cfg, 3)], imgs),
    "share_forward.ksec": section(mods[:1] + [("gemv.a", cfg, 2)] + mods[1:], []),
    "share_chain.ksec": section(mods + gemv[:2] + [("gemv.c", cfg, 4)], shared_imgs),
    "image_on_sharer.ksec": section(mods + gemv, imgs + [(4, 80, 0, b"\x7fELF")]),
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
struct.pack_into("<I", s, 32 + MODULE_SIZE, 7)
seeds["image_module.ksec"] = bytes(s)
# a sharing module that stores a source of its own
s = bytearray(section(mods + gemv, shared_imgs))
struct.pack_into("<Q", s, 32 + 4 * MODULE_SIZE + 88, 4)
seeds["share_own_source.ksec"] = bytes(s)
for name, b in seeds.items():
    open(os.path.join(out, name), "wb").write(b)
print(len(seeds), "seeds in", out)
