#!/usr/bin/env bash
# gpu_serve_check.sh — the scheduler's and the server's GPU checks in one
# device command: the CUDA executor's tests (want_logits rows included), then
# tests/cli_serve.sh on the GPU (KILN_TEST_DEVICE=gpu: kjv-tiny compiled for
# sm_90, kiln serve against kiln run on the same GPU for greedy, stop
# strings, penalties, seeded n, logprobs, and preemption under a small KV
# memory). Writes $OUT/summary.txt (one line per part) and the logs.
#
#     BIN=.carry/bin bash bench/gpu_serve_check.sh
# BIN holds kiln, kiln-run, test_gpu_exec, test_gpu_nvrtc, test_gpu_kernels (Release,
# CUDA) and extra/ with libmicrohttpd and its GnuTLS libraries.
set -u
BIN=${BIN:-.carry/bin}
OUT=${OUT:-out}
. bench/gpu_lib.sh # part, S, LD_LIBRARY_PATH, $OUT/env.txt
part test_gpu_nvrtc 120 "$BIN/test_gpu_nvrtc"
part test_gpu_exec 300 "$BIN/test_gpu_exec"
part test_gpu_kernels 300 "$BIN/test_gpu_kernels"
KILN_TEST_DEVICE=gpu KILN_TEST_TARGET=sm_90 part cli_serve_gpu 420 bash tests/cli_serve.sh "$BIN/kiln" . shared
cat "$S"
