#!/usr/bin/env python3
"""The FP8 seeds of the checkpoint fuzz target, made from its "mistral" seed (one layer, hidden 8):

  fuzz/corpus/checkpoint/fp8_tensor_static   quant_method "fp8", activation_scheme static: each projection
                                             F8_E4M3 codes, weight_scale and input_scale F32 [] (AutoFP8)
  fuzz/corpus/checkpoint/fp8_ct_channel      compressed-tensors float-quantized, strategy channel:
                                             weight_scale BF16 [out, 1], dynamic inputs

The codes are torch's float8_e4m3fn cast of w / scale (scale = max|w| / 448 per tensor or row).
Run from the repository root: python3 fuzz/data/make_fp8_checkpoint_seeds.py
"""
import json
import struct

import torch

SEP = b"\n#####\n"
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DT = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}
NP = {"BF16": torch.bfloat16, "F32": torch.float32}


def read_st(b):
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    out = {}
    for k, v in h.items():
        raw = bytearray(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[k] = torch.frombuffer(raw, dtype=NP[v["dtype"]]).reshape(v["shape"]).clone()
    return out


def write_st(t):
    hdr, data = {}, bytearray()
    for k in sorted(t):
        b = t[k].contiguous().view(torch.uint8).numpy().tobytes() if t[k].dim() else \
            t[k].reshape(1).view(torch.uint8).numpy().tobytes()
        hdr[k] = {"dtype": DT[t[k].dtype], "shape": list(t[k].shape), "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + bytes(data)


def make(src, channel):
    cfg, index, shard = src.split(SEP)[:3]
    cfg = json.loads(cfg)
    out = {}
    for k, w in read_st(shard).items():
        base = k[:-len(".weight")]
        if not base.endswith(PROJ):
            out[k] = w
            continue
        w = w.float()
        s = (w.abs().amax(dim=1, keepdim=True) if channel else w.abs().max()) / 448
        if channel:
            s = s.to(torch.bfloat16)
        out[k] = (w / s.float()).clamp(-448, 448).to(torch.float8_e4m3fn)
        out[base + ".weight_scale"] = s
        if not channel:
            out[base + ".input_scale"] = torch.tensor(0.01, dtype=torch.float32)
    if channel:
        f = {"num_bits": 8, "type": "float", "symmetric": True}
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "float-quantized", "weights": dict(f, strategy="channel"),
                "input_activations": dict(f, strategy="token", dynamic=True)}}}
    else:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    return SEP.join([json.dumps(cfg).encode(), index, write_st(out)])


def main():
    src = open("fuzz/corpus/checkpoint/mistral", "rb").read()
    open("fuzz/corpus/checkpoint/fp8_tensor_static", "wb").write(make(src, False))
    open("fuzz/corpus/checkpoint/fp8_ct_channel", "wb").write(make(src, True))


if __name__ == "__main__":
    main()
