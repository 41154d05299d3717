#!/usr/bin/env bash
# gpu_tp_run.sh — tensor parallelism on the GPU machine: the GPU tests (the tensor-parallel one first),
# then, as the budget allows, Mistral-7B / Llama-3.1-8B / Llama-3.1-70B-shaped benchmarks of tp=1
# against tp=2 in one run (STEPS). With one GPU the tp=2 engines run with every rank on GPU 0 (a
# correctness check, not a speed figure); with two, a rank per GPU through NCCL.
#     BIN=.carry/bin OUT=$OUT STEPS="tests m7" bash bench/gpu_tp_run.sh
# steps: tests (test_gpu_exec's test_tensor_parallel), alltests (test_gpu_kernels, all of
#   test_gpu_exec), m7 (Mistral-7B tp1 and tp2: decode batch 1 and 64, prefill 2048), l8
#   (Llama-3.1-8B: 128 in / 128 out at the batch of highest throughput, tp1 and tp2), l70
#   (Llama-3.1-70B shapes with L70 layers, default 20: decode batch 1 at tp2), logits (tp2 logits
#   of 2-layer Mistral-7B shapes against HF fp32 at lengths 1, 17, 512, 4096: bench/gpu_logits)
set -u
BIN=${BIN:-build-dev}
OUT=${OUT:-out}
W=${WORK:-/tmp/kiln-tp}
BUDGET=${BUDGET:-560}
STEPS=${STEPS:-tests m7}
. bench/gpu_lib.sh
# NCCL: the pip wheel's library (the machine has no system libnccl); NVLink multicast stays off
NCCL_DIR=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -n "$NCCL_DIR" ] && export LD_LIBRARY_PATH=$NCCL_DIR:$LD_LIBRARY_PATH
export NCCL_NVLS_ENABLE=0
echo "NCCL from ${NCCL_DIR:-nowhere}" >>"$OUT/env.txt"
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
GPUS=0,1
[ "$NG" -ge 2 ] || GPUS=0,0
echo "GPUs: $NG, tp=2 runs on $GPUS" | tee -a "$S"
val() { grep "\"$1\"" | tail -1 | sed 's/.*"value":\([0-9.e+-]*\).*/\1/'; }
K=$BIN/kiln

# mk ARCH DIR [LAYERS]: a random checkpoint of ARCH's shapes (bench/make_checkpoint.py), once
mk() { [ -f "$2/config.json" ] || timeout 200 python3 bench/make_checkpoint.py --arch "$1" --out "$2" ${3:+--layers $3} >>"$OUT/mk.log" 2>&1; }
# engines DIR: DIR.tp1.kiln and DIR.tp2.kiln for sm_90
engines() {
    for tp in 1 2; do
        [ -f "$1.tp$tp.kiln" ] || timeout 200 "$K" compile "$1" -o "$1.tp$tp.kiln" --target sm_90 --tp $tp \
            >>"$OUT/compile.log" 2>&1 || echo "compile $1 tp$tp failed" | tee -a "$S"
    done
}
gpus_for() { [ "$1" = 2 ] && echo "--gpus $GPUS"; }

for step in $STEPS; do
    [ "$(left)" -gt 30 ] || { echo "out of budget before $step" | tee -a "$S"; break; }
    case $step in
    tests) KILN_TEST_ONLY=test_tensor_parallel part tp_tests 300 "$BIN/test_gpu_exec" ;;
    alltests)
        part kernels 200 "$BIN/test_gpu_kernels"
        part exec 300 "$BIN/test_gpu_exec" ;;
    m7)
        mk mistral-7b "$W/m7" && engines "$W/m7"
        for tp in 1 2; do
            [ $tp = 1 ] || [ "$NG" -ge 2 ] || { echo "mistral-7b tp2: not measured (one GPU)" | tee -a "$S"; break; }
            for b in 1 64; do
                echo "mistral-7b tp$tp decode batch $b: $(timeout 120 "$K" bench "$W/m7.tp$tp.kiln" $(gpus_for $tp) \
                    --batch $b --reps 3 --json 2>>"$OUT/bench.err" | val decode_tokens_per_s) tok/s" | tee -a "$S"
            done
            echo "mistral-7b tp$tp prefill 2048: $(timeout 120 "$K" bench "$W/m7.tp$tp.kiln" $(gpus_for $tp) --batch 1 \
                --input-len 2048 --output-len 1 --reps 3 --json 2>>"$OUT/bench.err" | val prefill_ms) ms" | tee -a "$S"
        done ;;
    l8)
        mk llama-3.1-8b "$W/l8" && engines "$W/l8"
        for tp in 1 2; do
            for b in 128 256; do
                j=$(timeout 150 "$K" bench "$W/l8.tp$tp.kiln" $(gpus_for $tp) --batch $b --input-len 128 \
                    --output-len 128 --reps 2 --json 2>>"$OUT/bench.err")
                echo "llama-3.1-8b tp$tp 128/128 batch $b: decode $(echo "$j" | val decode_tokens_per_s) tok/s," \
                    "end to end $(echo "$j" | val e2e_output_tokens_per_s) output tok/s" | tee -a "$S"
            done
        done ;;
    l70)
        mk llama-3.1-70b "$W/l70" "${L70:-20}"
        [ -f "$W/l70.tp2.kiln" ] || timeout 300 "$K" compile "$W/l70" -o "$W/l70.tp2.kiln" --target sm_90 --tp 2 \
            >>"$OUT/compile.log" 2>&1
        echo "llama-3.1-70b (${L70:-20} layers) tp2 decode batch 1: $(timeout 120 "$K" bench "$W/l70.tp2.kiln" \
            --gpus $GPUS --batch 1 --reps 3 --json 2>>"$OUT/bench.err" | val decode_tokens_per_s) tok/s" | tee -a "$S" ;;
    logits)
        mk mistral-7b "$W/m7l2" 2 && engines "$W/m7l2"
        L=1,17,512,4096
        mkdir -p "$W/lg"
        python3 bench/check_logits.py ids --out "$W/lg/ids.i32" --n 4098 --vocab 32000 >"$OUT/logits.log" 2>&1
        timeout 60 "$BIN/kiln_gpu_logits" "$W/m7l2.tp2.kiln" logits --gpus $GPUS --ids "$W/lg/ids.i32" --lengths $L \
            --decode 2 --chunk 2048 --out "$W/lg" >>"$OUT/logits.log" 2>&1 &
        k=$!
        timeout 170 python3 bench/check_logits.py hf --model "$W/m7l2" --ids "$W/lg/ids.i32" --lengths $L --decode 2 \
            --out "$W/lg" >>"$OUT/logits.log" 2>&1
        wait $k
        python3 bench/check_logits.py compare --dir "$W/lg" --lengths $L --vocab 32000 | tee "$OUT/logits.jsonl" \
            | tail -4 >>"$S" ;;
    *) echo "unknown step $step" | tee -a "$S" ;;
    esac
done
echo "done at $((SECONDS - t0)) s" | tee -a "$S"
