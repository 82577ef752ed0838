#!/bin/bash
# The earlier rounds' reproductions (../shared/repro/, read-only) run against this checkout, each
# with a verdict: one `OK name: detail` or `DEFECT name: detail` line per script, exit 1 if any
# DEFECT (exit 3: a fixed port was busy, nothing run).
#
#   PATH=$PWD/.venv/bin:$PATH PYTHONPATH=$PWD bash bench/reliability/earlier_repros.sh
#
# The scripts print a defect's symptom, not a verdict; the checks below read their output for the
# fixed behaviour (what each header comment says was wrong, the opposite must show):
#   repro_dns_aaaa.sh       the A answer is kept though the AAAA query is REFUSED: the worker is
#                           in /workers/discovery and /health is 200 with a healthy worker
#   repro_split_id.sh       a response id split across two reads is learned: the router's GET is
#                           200 (control: an unknown id is the router's 404 response_not_found)
#   repro_pd_garbage.sh     a prefill 200 with garbage is the router's own error ("gave no usable
#                           prefill answer"), counted against the prefill (consecutive_failures);
#                           bad_prefill.py's no_kv and kv_not_dict modes (a copy of the script
#                           with the mode swapped and its `cut -c1-120` dropped): 502
#                           bad_prefill_response
#   repro_pd_health.sh      the last prefill worker stays in: generations are 502 (never 503),
#                           /health 200 with a healthy prefill and decode worker
#   load.py                 every non-200 a JSON error, every stream ended by [DONE], on sim
#                           workers and on a P/D fleet with a cutting prefill beside a good one
#   repro_epp_double_eos.py a second end_of_stream books nothing: in flight and pending prefill
#                           tokens back to 0, requests_total up by at most one per stream
#   epp_responses.py        a GET of a response id (while its create streams; split across two
#                           response_body messages) goes to the create's worker (control: an
#                           unknown id is an immediate 404)
#   repro_epp_unbounded_body.py  the full-duplex body is refused 413 request_too_large past
#                           --max-body-bytes and the EPP's peak RSS (sampled every 0.2 s while it
#                           runs) stays under +96 MiB, short of the 100 MiB sent.
#                           With the fix the script never prints its "after ... sent" lines: its
#                           generator is not drained once the EPP ends the stream, so it waits on
#                           for ever; it runs under a 30 s timeout here.
#   epp_maxinflight.py      an EPP with --max-inflight 5 holds 5 of 20 streams (in flight 5, the
#                           rest 429) and is back to 0 after they are cancelled
# bad_prefill.py, split_resp_worker.py and epp_lib.py are helpers, exercised through the above.
# ../shared/repro/flow_cli/ prints its own verdicts and is not run here.
#
# The shell scripts wait with fixed sleeps (2, 4, 8 s) that a loaded 2-core machine outlasts
# (serve took 4-7 s to answer): they run verbatim, but with a `sleep` on PATH that, at its n-th
# call, first waits (up to 60 s) for the n-th group of URLs to answer, then sleeps the given time.
# Each script runs in its own session and is waited for until all of its processes are gone.
# The EPP scripts talk to EPPs started here (29002/29090; 29003/29091 with --max-inflight 5).
# CR (cache-router), PY (python) and REPRO (../shared/repro) may be overridden.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
REPRO=${REPRO:-$(cd "$ROOT/.." && pwd)/shared/repro}
export CR=${CR:-cache-router} PY=${PY:-python3}
WORK=$(mktemp -d /tmp/earlier_repros.XXXXXX)
PIDS=()
DEFECTS=0

ok() { echo "OK $1: $2"; }
defect() { echo "DEFECT $1: $2"; DEFECTS=$((DEFECTS + 1)); }

# ---- processes started here, stopped by PID --------------------------------------------------
start() {  # start LOGNAME CMD...: background, PID recorded (LAST_PID)
    local log=$1; shift
    "$@" >"$WORK/$log.log" 2>&1 &
    LAST_PID=$!
    PIDS+=("$LAST_PID")
}
stop() {  # stop PID...: SIGTERM, then wait (SIGKILL after 30 s)
    local p i
    for p in "$@"; do kill "$p" 2>/dev/null; done
    for p in "$@"; do
        for i in $(seq 1 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
}
cleanup() { [ ${#PIDS[@]} -gt 0 ] && stop "${PIDS[@]}"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

up() { [ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$1")" != 000 ]; }
wait_http() {  # wait_http URL [SECONDS]: any HTTP answer
    local end=$((SECONDS + ${2:-60}))
    while [ $SECONDS -lt $end ]; do up "$1" && return 0; sleep 0.3; done
    return 1
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

# ---- the fixed ports must be free ------------------------------------------------------------
TCP_PORTS="28600 28096 28120 28091 28109 28203 28084 29002 29090 29003 29091 28401 28402 28097 28110 28204 28205 28098"
busy=""
for p in $TCP_PORTS; do ss -Htln "sport = :$p" | grep -q . && busy+=" tcp/$p"; done
ss -Hunl "sport = :28653" | grep -q . && busy+=" udp/28653"
if [ -n "$busy" ]; then
    echo "ports in use:$busy (stop what holds them; nothing run)" >&2
    exit 3
fi
command -v dnsmasq >/dev/null || { echo "dnsmasq missing (apt-get install -y dnsmasq)" >&2; exit 3; }

# ---- the shell scripts: verbatim, a readiness-aware sleep on PATH, own session -----------------
mkdir -p "$WORK/bin"
REAL_SLEEP=$(command -v sleep)
cat >"$WORK/bin/sleep" <<EOF
#!/bin/bash
# n-th call: wait for the n-th '|'-separated group of READY_STAGES to answer, then sleep "\$@"
n=\$(( \$(cat "\$SHIM_STATE" 2>/dev/null || echo 0) + 1 )); echo \$n >"\$SHIM_STATE"
IFS='|' read -ra stages <<<"\${READY_STAGES:-}"
end=\$((SECONDS + 60))
for u in \${stages[\$((n - 1))]:-}; do
    while [ \$SECONDS -lt \$end ] && [ "\$(curl -s -o /dev/null -m 3 -w '%{http_code}' "\$u")" = 000 ]; do $REAL_SLEEP 0.3; done
done
exec $REAL_SLEEP "\$@"
EOF
chmod +x "$WORK/bin/sleep"

run_sh() {  # run_sh NAME SCRIPT STAGES: output in $WORK/NAME.out
    local name=$1 script=$2 pid i
    rm -f "$WORK/$name.state"
    READY_STAGES=$3 SHIM_STATE="$WORK/$name.state" PATH="$WORK/bin:$PATH" \
        setsid bash "$script" >"$WORK/$name.out" 2>&1 &
    pid=$!
    for i in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; "$REAL_SLEEP" 0.2; done
    kill -0 "$pid" 2>/dev/null && { echo "(timeout)" >>"$WORK/$name.out"; kill -- -"$pid" 2>/dev/null; }
    wait "$pid" 2>/dev/null
    # the script sends SIGTERM and exits at once: wait until its processes are gone (serve drains)
    for i in $(seq 1 150); do kill -0 -- -"$pid" 2>/dev/null || break; "$REAL_SLEEP" 0.2; done
    kill -0 -- -"$pid" 2>/dev/null && kill -9 -- -"$pid" 2>/dev/null
}

# repro_dns_aaaa.sh
run_sh dns "$REPRO/repro_dns_aaaa.sh" "http://127.0.0.2:28600/health http://127.0.0.1:28096/health"
r=$($PY - "$WORK/dns.out" <<'EOF'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
disc = [json.loads(l) for l in lines if l.startswith('{"sources"')]
health = [l for l in lines if l.startswith('{"status"')]
if not disc or not health:
    print("DEFECT no discovery/health answer: " + " | ".join(lines)[:300]); sys.exit()
src = disc[0]["sources"][0]
hbody, hcode = health[0].rsplit(" ", 1)
h = json.loads(hbody)
good = "http://127.0.0.2:28600" in src["workers"] and hcode == "200" and h.get("healthy_workers", 0) >= 1
print(("OK" if good else "DEFECT") + f" discovered workers {src['workers']} (errors {src.get('errors')}, "
      f"last_error {src.get('last_error', '')[-60:]!r}); /health {hcode} healthy_workers {h.get('healthy_workers')}")
EOF
)
[ "${r%% *}" = OK ] && ok repro_dns_aaaa.sh "${r#OK }" || defect repro_dns_aaaa.sh "${r#DEFECT }"

# repro_split_id.sh (+ control: an unknown id is the router's 404)
run_sh split "$REPRO/repro_split_id.sh" "http://127.0.0.1:28120/health http://127.0.0.1:28091/health"
mapfile -t L <"$WORK/split.out"
start split_ctl_worker "$PY" "$REPRO/split_resp_worker.py" 28120; cw=$LAST_PID
start split_ctl_serve "$CR" serve --port 28091 --worker http://127.0.0.1:28120; cs=$LAST_PID
wait_http http://127.0.0.1:28091/health
ctl=$(curl -s -w ' %{http_code}' localhost:28091/v1/responses/resp_never_stored)
stop "$cs" "$cw"
if [[ "${L[1]:-}" == *resp_split3*" 200" && "$ctl" == *response_not_found*" 404" ]]; then
    ok repro_split_id.sh "router GET /v1/responses/resp_split3 -> ${L[1]##* } (worker ${L[2]##* }); control: unknown id -> 404 response_not_found"
else
    defect repro_split_id.sh "router GET -> '${L[1]:-none}'; worker '${L[2]:-none}'; control unknown id -> '${ctl: -60}'"
fi

# repro_pd_garbage.sh (invalid_json), then bad_prefill.py's other garbage modes
PD_STAGES="http://127.0.0.1:28109/health http://127.0.0.1:28203/health|http://127.0.0.1:28084/health"
pd_check() {  # pd_check OUTFILE FULL(0|1): prints OK/DEFECT + detail
    $PY - "$1" "$2" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines(); full = sys.argv[2] == "1"
answers = [l for l in lines if l.startswith("{") or l.startswith(" ")]
workers = {l.split()[0]: l.split() for l in lines if l.startswith("http://")}
pre, dec = workers.get("http://127.0.0.1:28109"), workers.get("http://127.0.0.1:28203")
bad = []
if len(answers) != 6: bad.append(f"{len(answers)} answers, not 6")
if not all("gave no usable prefill answer" in a for a in answers): bad.append("an answer not the router's bad-prefill error")
if any("invalid_request_error" in a for a in answers): bad.append("invalid_request_error passed to the client")
if full and not all(a.endswith(" 502") and "bad_prefill_response" in a for a in answers): bad.append("not all 502 bad_prefill_response")
if not pre or int(pre[5]) < 6: bad.append(f"prefill not counted failing: {pre}")
if not dec or int(dec[5]) != 0: bad.append(f"decode blamed: {dec}")
codes = sorted({a.rsplit(" ", 1)[1] for a in answers if " " in a}) if full else ["(cut)"]
msg = answers[0][:100] if answers else ""
print(("DEFECT " + "; ".join(bad) + " | " if bad else "OK ") +
      f"6 answers {codes} {msg!r}...; prefill consecutive_failures {pre[5] if pre else '?'} healthy {pre[3] if pre else '?'}, decode {dec[5] if dec else '?'}")
EOF
}
run_sh pd_garbage "$REPRO/repro_pd_garbage.sh" "$PD_STAGES"
r=$(pd_check "$WORK/pd_garbage.out" 0)
[ "${r%% *}" = OK ] && ok repro_pd_garbage.sh "${r#OK }" || defect repro_pd_garbage.sh "${r#DEFECT }"
for mode in no_kv kv_not_dict; do
    mkdir -p "$WORK/$mode"; cp "$REPRO/bad_prefill.py" "$WORK/$mode/"
    sed -e "s/ invalid_json / $mode /" -e 's/ | cut -c1-120//' "$REPRO/repro_pd_garbage.sh" >"$WORK/$mode/repro_pd_garbage.sh"
    run_sh "pd_$mode" "$WORK/$mode/repro_pd_garbage.sh" "$PD_STAGES"
    r=$(pd_check "$WORK/pd_$mode.out" 1)
    [ "${r%% *}" = OK ] && ok "bad_prefill.py[$mode] (repro_pd_garbage.sh)" "${r#OK }" || defect "bad_prefill.py[$mode] (repro_pd_garbage.sh)" "${r#DEFECT }"
done

# repro_pd_health.sh
run_sh pd_health "$REPRO/repro_pd_health.sh" "$PD_STAGES"
mapfile -t L <"$WORK/pd_health.out"
codes=$(echo "${L[0]:-}" | xargs)
r=$($PY - "$codes" "${L[1]:-}" <<'EOF'
import json, sys
codes, h = sys.argv[1].split(), sys.argv[2]
try:
    body, code = h.rsplit(" ", 1); roles = json.loads(body).get("healthy_by_role", {})
except Exception:
    print(f"DEFECT no /health answer: {h!r}, generations {codes}"); sys.exit()
good = len(codes) == 5 and all(c == "502" for c in codes) and code == "200" and roles.get("prefill", 0) >= 1 and roles.get("decode", 0) >= 1
print(("OK" if good else "DEFECT") + f" generations {' '.join(codes)} (503 no_healthy_worker before); /health {code} healthy_by_role {roles}")
EOF
)
[ "${r%% *}" = OK ] && ok repro_pd_health.sh "${r#OK }" || defect repro_pd_health.sh "${r#DEFECT }"

# ---- load.py: a sim fleet, then a P/D fleet with a cutting prefill beside a good one -----------
start w1 "$CR" sim-worker --port 28401 --time-scale 5 --model-name m; W1=$LAST_PID
start w2 "$CR" sim-worker --port 28402 --time-scale 5 --model-name m; W2=$LAST_PID
wait_http http://127.0.0.1:28401/health; wait_http http://127.0.0.1:28402/health
load_check() {  # load_check NAME: reads $WORK/NAME.out
    r=$($PY - "$WORK/$1.out" <<'EOF'
import ast, re, sys
t = open(sys.argv[1]).read()
m = re.search(r"^(\d+) reqs in .*?: (\{.*\})$", t, re.M)
if not m: print("DEFECT no histogram: " + t[-300:].replace("\n", " | ")); sys.exit()
hist = ast.literal_eval(m.group(2))
bad = {k: v for k, v in hist.items() if not re.fullmatch(r"200|[1-5]\d\d \w+", k)}
print(("DEFECT malformed " + str(bad) + " | " if bad else "OK ") + m.group(0)[:200])
EOF
)
    [ "${r%% *}" = OK ] && ok "load.py[$2]" "${r#OK }" || defect "load.py[$2]" "${r#DEFECT }"
}
start serve_load "$CR" serve --port 28097 --worker http://127.0.0.1:28401 http://127.0.0.1:28402; S=$LAST_PID
wait_http http://127.0.0.1:28097/health
(cd "$WORK" && timeout 120 "$PY" "$REPRO/load.py" http://127.0.0.1:28097 200 32 0.5 16 >"$WORK/load_sim.out" 2>&1)
load_check load_sim "serve, 2 sim workers, 200 reqs x32"
stop "$S"
start pd_cut "$PY" "$REPRO/bad_prefill.py" 28110 cut; P1=$LAST_PID
start pd_pre "$CR" sim-worker --port 28205 --role prefill --time-scale 5 --model-name m; P2=$LAST_PID
start pd_dec "$CR" sim-worker --port 28204 --role decode --time-scale 5 --model-name m; P3=$LAST_PID
wait_http http://127.0.0.1:28205/health; wait_http http://127.0.0.1:28204/health
start serve_pd "$CR" serve --port 28098 --prefill http://127.0.0.1:28110 http://127.0.0.1:28205 \
    --decode http://127.0.0.1:28204 --pd-protocol vllm; S=$LAST_PID
wait_http http://127.0.0.1:28098/health
(cd "$WORK" && timeout 120 "$PY" "$REPRO/load.py" http://127.0.0.1:28098 100 16 0.5 8 >"$WORK/load_pd.out" 2>&1)
load_check load_pd "serve P/D, prefill 'cut' + good prefill, 100 reqs x16"
stop "$S" "$P3" "$P2" "$P1"

# ---- the EPP scripts -------------------------------------------------------------------------
start epp "$CR" epp --plaintext --port 29002 --http-port 29090 --worker http://127.0.0.1:28401 http://127.0.0.1:28402; EPP=$LAST_PID
start epp_mi "$CR" epp --plaintext --port 29003 --http-port 29091 --max-inflight 5 --worker http://127.0.0.1:28401 http://127.0.0.1:28402; EPP_MI=$LAST_PID
wait_http http://127.0.0.1:29090/health; wait_http http://127.0.0.1:29091/health
export EPP_GRPC=127.0.0.1:29002 EPP_HTTP=http://127.0.0.1:29090
total_requests() { curl -s "$EPP_HTTP/metrics" | awk '/^cache_router_requests_total/ {s += $2} END {print s + 0}'; }

# repro_epp_double_eos.py
before=$(total_requests)
timeout 120 "$PY" "$REPRO/repro_epp_double_eos.py" 20 >"$WORK/double_eos.out" 2>&1
after=$(total_requests)
pending=$(curl -s "$EPP_HTTP/metrics" | awk '/^cache_router_worker_pending_prefill_tokens/ {s += $2} END {print s + 0}')
r=$($PY - "$WORK/double_eos.out" "$before" "$after" "$pending" <<'EOF'
import ast, sys
t = open(sys.argv[1]).read(); before, after, pending = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
line = [l for l in t.splitlines() if l.startswith("after ")]
if not line: print("DEFECT no 'after' line: " + t[-300:].replace("\n", " | ")); sys.exit()
m = ast.literal_eval(line[0].split(":", 1)[1].strip())
stuck = {k: v for k, v in m.items() if float(v) != 0}
good = not stuck and pending == 0 and after - before <= 40
print(("OK" if good else "DEFECT") + f" after 20+20 double-eos streams: in flight {'all 0' if not stuck else stuck}, "
      f"pending prefill tokens {pending:g}, requests_total +{after - before:g} (<= 40: none booked twice)")
EOF
)
[ "${r%% *}" = OK ] && ok repro_epp_double_eos.py "${r#OK }" || defect repro_epp_double_eos.py "${r#DEFECT }"

# epp_responses.py (+ control: an unknown id is an immediate 404)
timeout 60 "$PY" "$REPRO/epp_responses.py" >"$WORK/responses.out" 2>&1
PYTHONPATH="$REPRO${PYTHONPATH:+:$PYTHONPATH}" timeout 30 "$PY" - >"$WORK/responses_ctl.out" 2>&1 <<'EOF'
import asyncio
from epp_lib import *
async def main():
    async with grpc.aio.insecure_channel(GRPC) as ch:
        st = pbg.ExternalProcessorStub(ch)
        print(summarize(await exchange(st, [hdrs(path="/v1/responses/resp_never_stored", method="GET", eos=True)])))
asyncio.run(main())
EOF
r=$($PY - "$WORK/responses.out" "$WORK/responses_ctl.out" <<'EOF'
import ast, sys
t = open(sys.argv[1]).read().splitlines(); ctl = open(sys.argv[2]).read()
pairs = []
for l in t:
    if l.startswith("create picked"):
        a, b = l[len("create picked "):].split(" | ", 1)
        what, got = b.split(" -> ", 1)
        got = ast.literal_eval(got)
        pairs.append((what, ast.literal_eval(a), got[0][1] if got and got[0][0] == "request_headers" else got))
ctl_ok = "'immediate_response', 404" in ctl
good = len(pairs) == 2 and all(a == g for _, a, g in pairs) and ctl_ok
print(("OK" if good else "DEFECT") + " " + "; ".join(f"{w}: create -> {a}, GET -> {g}" for w, a, g in pairs)
      + f"; control unknown id -> {'404' if ctl_ok else ctl.strip()[:80]}" + (f" | output: {' | '.join(t)[:300]}" if len(pairs) != 2 else ""))
EOF
)
[ "${r%% *}" = OK ] && ok epp_responses.py "${r#OK }" || defect epp_responses.py "${r#DEFECT }"

# repro_epp_unbounded_body.py (hangs once answered: 30 s timeout, see the header)
echo "$EPP" >"$WORK/epp.pid"
rss0=$(rss_kb "$EPP"); peak=$rss0
EPP_PIDFILE="$WORK/epp.pid" timeout 30 "$PY" "$REPRO/repro_epp_unbounded_body.py" 100 >"$WORK/unbounded.out" 2>&1 &
u=$!
while kill -0 "$u" 2>/dev/null; do r=$(rss_kb "$EPP"); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.2; done
wait "$u" 2>/dev/null
ans=$(grep -m1 '^answer:' "$WORK/unbounded.out")
delta=$(((peak - rss0) / 1024))
if [[ "$ans" == *"'immediate_response', 413"*request_too_large* ]] && [ "$delta" -lt 96 ]; then
    ok repro_epp_unbounded_body.py "100 MiB full-duplex, no eos -> 413 request_too_large; EPP RSS $((rss0 / 1024)) MiB, peak $((peak / 1024)) MiB (+$delta)"
else
    defect repro_epp_unbounded_body.py "answer '${ans:-none}'; EPP RSS $((rss0 / 1024)) MiB, peak $((peak / 1024)) MiB (+$delta); output: $(tr '\n' '|' <"$WORK/unbounded.out" | cut -c1-200)"
fi

# epp_maxinflight.py (its own EPP, --max-inflight 5)
timeout 60 "$PY" "$REPRO/epp_maxinflight.py" >"$WORK/maxinflight.out" 2>&1
r=$($PY - "$WORK/maxinflight.out" <<'EOF'
import ast, sys
t = open(sys.argv[1]).read().splitlines()
get = lambda p: ([ast.literal_eval(l.split(":", 1)[1].strip()) for l in t if l.startswith(p)] or [None])[0]
held, after = get("metrics while 20 held"), get("after")
ans = [l for l in t if l.startswith("answers:")]
if held is None or after is None or not ans: print("DEFECT incomplete output: " + " | ".join(t)[:300]); sys.exit()
n = float(held.get("cache_router_in_flight", -1)); refused = "429" in ans[0]
good = n == 5 and refused and all(float(v) == 0 for v in after.values())
print(("OK" if good else "DEFECT") + f" 20 streams held, --max-inflight 5: in flight {n:g}, 429 answered {refused}; "
      f"after cancel: {'all 0' if all(float(v) == 0 for v in after.values()) else after}")
EOF
)
[ "${r%% *}" = OK ] && ok epp_maxinflight.py "${r#OK }" || defect epp_maxinflight.py "${r#DEFECT }"

stop "$EPP_MI" "$EPP" "$W2" "$W1"
PIDS=()
echo "outputs: $WORK"
[ "$DEFECTS" -eq 0 ] || { echo "$DEFECTS DEFECT(s)"; exit 1; }
