#!/usr/bin/env python3
"""Seeds for fuzz_tuning (fuzz/corpus/tuning/): tuning sections written from the
layout in format/kiln_tuning.h (independently of kiln's writer), valid ones and
one broken per reader rule.  python3 fuzz/data/make_tuning_seeds.py"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus", "tuning")


def gemm(m, n, k, flags=0, us=10.0, heur=12.0, cand=12, pick=0, algo=b""):
    e = struct.pack("<IIIIffII", m, n, k, flags, us, heur, cand, pick) + bytes(32)
    return e + (algo + bytes(64))[:64]


def record(sm=90, device=b"NVIDIA H200", gemms=(), drv=13000, lt=130100, thr=(8, 32, 64), waves=2.0, secs=1.0):
    h = struct.pack("<IiQ", sm, drv, lt) + (device + bytes(128))[:128]
    h += struct.pack("<IIIIff", len(gemms), *thr, waves, secs) + bytes(24)
    assert len(h) == 192
    return h + b"".join(gemms)


def section(records, version=1, n=None):
    return b"KTUN" + struct.pack("<III", version, len(records) if n is None else n, 0) + b"".join(records)


def main():
    os.makedirs(OUT, exist_ok=True)
    g = [gemm(64, 4096, 4096, 0, algo=bytes(range(64))), gemm(64, 4096, 14336, 4, 20.0, -1.0, 9, 3),
         gemm(2048, 28672, 4096, 0, 300.0, 310.0, 12, 11), gemm(8, 32000, 4096, 2, 50.0, 50.5, 4, 0)]
    seeds = {
        "empty.tun": section([]),
        "one.tun": section([record(gemms=g)]),
        "two_gpus.tun": section([record(gemms=g[:2]), record(80, b"NVIDIA A100-SXM4-80GB", g[2:], lt=120900)]),
        "no_gemms.tun": section([record(gemms=[], thr=(0, 0, 0), waves=0.0)]),
        "bad_magic.tun": b"KTUX" + section([record(gemms=g)])[4:],
        "bad_version.tun": section([record(gemms=g)], version=2),
        "too_many_records.tun": section([], n=33),
        "short_record.tun": section([record(gemms=g)])[:100],
        "trailing.tun": section([record(gemms=g)]) + b"\0" * 8,
        "bad_sm.tun": section([record(sm=7, gemms=g)]),
        "device_unterminated.tun": section([record(device=b"A" * 128, gemms=g)]),
        "huge_count.tun": section([record(gemms=g)[:0]])[:16] + record(gemms=g)[:144] + struct.pack("<I", 0xFFFFFFFF)
                          + record(gemms=g)[148:],
        "bad_flags.tun": section([record(gemms=[gemm(64, 4096, 4096, 8)])]),
        "zero_time.tun": section([record(gemms=[gemm(64, 4096, 4096, 0, 0.0)])]),
        "bad_pick.tun": section([record(gemms=[gemm(64, 4096, 4096, 0, cand=3, pick=3)])]),
        "dup_shape.tun": section([record(gemms=[g[0], g[0]])]),
        "dup_gpu.tun": section([record(gemms=g[:1]), record(gemms=g[1:2])]),
        "nan_waves.tun": section([record(gemms=g, waves=float("nan"))]),
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
