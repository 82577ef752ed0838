"""One view of the fleet for several router replicas, shared through Redis (``--state-url``).

Each replica (a process of ``--processes N``, or a pod) keeps its own full router state and
routes on it alone: Redis is never on a request's path. Beside it, this module trades what
the others need to know, in the background:

- **Bookings** (which worker got which prefix blocks, for which session): the hot path only
  appends to a local outbox; every ``state_flush_interval_s`` (5 ms) the outbox goes out as
  one msgpack batch on this replica's own capped Redis stream, and every replica reads the
  others' streams (one blocking XREAD over all of them; never its own) and applies their
  batches to its block shadows (unpinned, most recently used), its session bindings (sticky,
  unified, ttft) and the session footprints. Staleness: the flush interval plus one Redis
  round trip (a few ms). The radix shadow stays per replica (the streams carry block hashes,
  not tokens). A replica reads a peer's stream from its start when it first sees the peer, so
  a new replica starts warm; a dead replica's stream expires after ``STREAM_TTL_S``.
- **Load**: every ``state_load_interval_s`` (20 ms) each replica writes its own in-flight
  requests, pending prefill and decode tokens per worker (and its view of their health) to
  a hash that expires ``state_load_ttl_s`` (2 s) after its last write, and reads the
  others' in the same round trip. Their sum is added to each worker's counters, and a dead
  replica's load leaves the view within the TTL. A peer taking a worker out opens the
  circuit here too. Between two snapshots, each booking a peer makes reaches this replica's
  counters with the booking itself (flush interval, not load interval): a booking carries
  its prefill and decode tokens and the peer's booking count, and the snapshot says how many
  bookings it counts, so a booking's load is added once, until the snapshot that holds it.
  Without this, bursts split over two replicas went to the same worker, each replica blind
  to the other's last ~30 ms (bench/scale_out/scale_replay.py).
- **Response owners** (:mod:`router.fleet.response_owners`): the worker that stored each
  Responses API response goes out with the next flush as a key of its own (``SET``, expiring
  after ``RESPONSE_OWNER_TTL_S``); an id a replica does not know is read from there (``GET``,
  tried again a few times within ~0.15 s: the continuation of a response that just ended may
  arrive before its owner's flush), so a conversation may move between replicas.
- **Membership**: POST/DELETE /workers on one replica writes the shared worker set; every
  replica reconciles with it every 0.5 s. A starting replica adds its ``--worker`` flags to
  the set; a set lost with Redis's data is re-seeded from the replicas' own lists.

Faults never fail a request: when Redis is down or slow, each replica routes on its local
view, says so (``/health``, a warning, ``cache_router_state_sync_up 0``, error counters),
keeps a bounded outbox of bookings (``OUTBOX_MAX``, older ones dropped and counted), drops
the others' load once it is older than the TTL, and catches up when Redis is back. Unreadable
data under the key prefix is counted and skipped. Keys carry :data:`FORMAT` so another
version's data is never read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from policies.base import RequestFeatures
from router.cache.worker_state import Booking
from router.config import Settings, normalize_url
from router.fleet.pool import BOTH, ROLES, Worker, WorkerPool

log = logging.getLogger("cache_router.state_sync")

FORMAT = 2  # in every key: bump when the encoding changes
OUTBOX_MAX = 50_000  # bookings kept while Redis is unreachable
STREAM_MAXLEN = 20_000  # booking batches kept per replica (the backlog a new replica reads)
STREAM_TTL_S = 600  # a replica's stream outlives its last write this long
READ_COUNT = 500  # batches per stream read
READ_BLOCK_MS = 500  # a stream read waits this long for news
MEMBERSHIP_INTERVAL_S = 0.5
RETRY_S = 0.25  # pause of a loop after a failed Redis call
CALL_TIMEOUT_S = 1.0  # a Redis call slower than this counts as a failure
RESPONSE_OWNER_TTL_S = 24 * 3600  # a response owner's key outlives its last write this long
OWNER_LOOKUP_WAITS_S = (0.0, 0.01, 0.04, 0.1)  # before each GET of an unknown response id

_ALIVE = b"_"  # every load hash has it (a replica without workers is alive): its bookings count

# url, blocks, session, footprint tokens, prefill tokens, decode tokens, the replica's booking
# count with this one
Outgoing = tuple[str, Sequence[int], str | None, int, int, int, int]


def _block_bytes(blocks: Sequence[int]) -> bytes:
    tobytes = getattr(blocks, "tobytes", None)  # a numpy array of uint64 already is the wire
    return tobytes() if tobytes is not None else array("Q", blocks).tobytes()


class StateSync:
    """This replica's side of the shared state (start / stop with the app)."""

    def __init__(
        self,
        pool: WorkerPool,
        settings: Settings,
        *,
        on_worker_added: Callable[[Worker], None] | None = None,
        replica_id: str | None = None,
    ) -> None:
        if settings.state_url is None:
            raise ValueError("state sync needs --state-url")
        self.pool = pool
        self.settings = settings
        self.replica = replica_id or uuid.uuid4().hex[:12]
        self.on_worker_added = on_worker_added
        base = f"{settings.state_prefix}:v{FORMAT}"
        self.stream_prefix = f"{base}:bookings:"
        self.stream_key = self.stream_prefix + self.replica
        self.workers_key = f"{base}:workers"
        self.epoch_key = f"{base}:workers:epoch"
        self.replicas_key = f"{base}:replicas"
        self.load_prefix = f"{base}:load:"
        self.owner_prefix = f"{base}:response-owner:"
        self.stats = pool.stats.sync
        self.stats.enabled = True
        self.stats.replica = self.replica
        self.outbox: deque[Outgoing] = deque()
        self._owners_out: dict[str, str] = {}  # response id -> worker URL, to write out
        self._membership_ops: list[tuple[str, str, bytes]] = []  # (hset|hdel, url, meta)
        self._peer_health: dict[tuple[str, str], bool] = {}
        self._peers: list[str] = []  # other live replicas, from the last load exchange
        self._published: set[bytes] = set()  # the fields of our load hash
        self._last_load_read = 0.0
        self._client: aioredis.Redis | None = None
        self._exchange: Any = None  # the load exchange script (redis-py AsyncScript)
        self._reader: aioredis.Redis | None = None  # its own connection for blocking reads
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._last_ids: dict[str, bytes] = {}  # peer stream -> last entry read ("0": all)
        self._filled = asyncio.Event()  # set when the outbox gets its first booking
        self._booked = 0  # bookings made here (the count our load snapshots carry)
        self._peer_booked: dict[str, int] = {}  # peer -> the count its last snapshot holds
        # peer -> the load of its bookings newer than that snapshot: (count, url, prefill,
        # decode), already in the workers' counters and remote_load
        self._peer_newer: dict[str, deque[tuple[int, str, int, int]]] = {}

    # ---- the hot path --------------------------------------------------------------------

    def record(self, worker: Worker, request: RequestFeatures, booking: Booking) -> None:
        """A booking to share (``WorkerPool.on_book``): one append, nothing else."""
        outbox = self.outbox
        if len(outbox) >= OUTBOX_MAX:
            outbox.popleft()
            self.stats.dropped += 1
        self._booked += 1
        outbox.append(
            (
                worker.url,
                request.blocks,
                request.session_id,
                request.input_length + booking.decode_tokens,
                booking.new_prefill,
                booking.decode_tokens,
                self._booked,
            )
        )
        if len(outbox) == 1:  # the flush loop sleeps while there is nothing to send
            self._filled.set()

    # ---- response owners -----------------------------------------------------------------

    def share_owner(self, response_id: str, url: str) -> None:
        """A response stored on ``url`` (learned here): written out with the next flush."""
        self._owners_out[response_id] = url
        self._filled.set()

    async def owner_of(self, response_id: str) -> str | None:
        """The worker another replica saw store ``response_id``; None if none did (or
        Redis cannot say)."""
        client = self._client
        if client is None:
            return None
        for wait in OWNER_LOOKUP_WAITS_S:
            if wait:
                await asyncio.sleep(wait)
            try:
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    value = await client.get(self.owner_prefix + response_id)
            except (RedisError, OSError, TimeoutError) as exc:
                self._failed("owner_lookup", exc)
                return None
            if value is not None:
                return value.decode()
        return None

    # ---- membership changes made here (admin API) ----------------------------------------

    def worker_added(self, worker: Worker) -> None:
        self._membership_ops.append(("hset", worker.url, self._meta(worker)))

    def worker_removed(self, url: str) -> None:
        self._membership_ops.append(("hdel", url, b""))

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Connect and start the loops; a Redis that is down now only delays sharing."""
        url = self.settings.state_url
        assert url is not None
        self._client = aioredis.from_url(
            url, socket_timeout=CALL_TIMEOUT_S, socket_connect_timeout=CALL_TIMEOUT_S
        )
        self._exchange = self._client.register_script(_EXCHANGE_SCRIPT)  # EVALSHA, reloaded
        self._reader = aioredis.from_url(
            url,
            socket_timeout=CALL_TIMEOUT_S + READ_BLOCK_MS / 1000,
            socket_connect_timeout=CALL_TIMEOUT_S,
        )
        for url, _ in self.settings.roles():  # this replica's flags join the shared set
            worker = self.pool.get(url)
            if worker is not None:
                self.worker_added(worker)
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="state-sync-flush"),
            asyncio.create_task(self._read_loop(), name="state-sync-read"),
            asyncio.create_task(self._load_loop(), name="state-sync-load"),
        ]
        log.info("state sync: replica %s on %s", self.replica, self.settings.state_prefix)

    async def stop(self) -> None:
        """Stop the loops (:meth:`_end_loops`); a last flush, and this replica's load leaves
        at once (bounded)."""
        await self._end_loops()
        client = self._client
        try:
            async with asyncio.timeout(2 * CALL_TIMEOUT_S):
                if client is not None:
                    await self._flush()
                    await client.delete(self.load_prefix + self.replica, self.stream_key)
                    await client.srem(self.replicas_key, self.replica)
        except (RedisError, OSError, TimeoutError):
            pass
        for c in (self._client, self._reader):
            if c is not None:
                try:
                    async with asyncio.timeout(CALL_TIMEOUT_S):
                        await c.aclose()
                except (RedisError, OSError, TimeoutError):
                    pass
        self._client = self._reader = None

    async def _end_loops(self) -> set[asyncio.Task]:
        """Cancel the loops and wait for them (bounded); the ones still running.

        The loops also check ``_stopping``: a cancellation that lands inside the Redis
        client can be absorbed there (seen with redis-py 8), and a loop must end anyway."""
        self._stopping = True
        self._filled.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if not tasks:
            return set()
        _, running = await asyncio.wait(tasks, timeout=2 * CALL_TIMEOUT_S + READ_BLOCK_MS / 1000)
        return running

    def describe(self) -> dict[str, Any]:
        """The ``/health`` detail."""
        s = self.stats
        return {
            "up": s.up,
            "replica": s.replica,
            "pid": os.getpid(),
            "peers": s.peers,
            "lag_ms": round(s.lag_s * 1000, 3),
            "outbox": len(self.outbox),
            "dropped": s.dropped,
            "errors": sum(s.errors.values()),
            "bad_entries": s.bad_entries,
        }

    # ---- health of the link --------------------------------------------------------------

    def _ok(self) -> None:
        if not self.stats.up:
            self.stats.up = True
            level = logging.WARNING if self.stats.outages else logging.INFO  # back after one
            log.log(level, "state sync up: sharing with the other replicas (%s)", self.replica)

    def _failed(self, op: str, exc: BaseException) -> None:
        self.stats.count(self.stats.errors, op)
        if self.stats.up:
            self.stats.up = False
            self.stats.outages += 1
            log.warning(
                "state sync down (%s: %s): routing on this replica's own view until Redis "
                "answers again",
                op,
                exc or type(exc).__name__,
            )

    async def _loop(
        self,
        op: str,
        step: Callable[[], Any],
        interval: float,
        ready: Callable[[], Any] | None = None,
    ) -> None:
        """Run ``step`` until stopped, every ``interval`` (after a failure: at least RETRY_S),
        once ``ready`` (if given) returns."""
        while not self._stopping:
            if ready is not None:
                await ready()
            pause = interval
            try:
                async with asyncio.timeout(CALL_TIMEOUT_S + READ_BLOCK_MS / 1000):
                    await step()
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError) as exc:
                self._failed(op, exc)
                pause = max(interval, RETRY_S)
            await asyncio.sleep(pause)

    # ---- bookings ------------------------------------------------------------------------

    async def _flush_loop(self) -> None:
        """A booking goes out at once, the next ones a batch per flush interval at most; an
        idle replica's loop waits on an event instead of waking every 5 ms (it was most of
        an idle replica's CPU with the load exchange)."""
        await self._loop(
            "publish", self._flush, self.settings.state_flush_interval_s, self._outbox_filled
        )

    async def _outbox_filled(self) -> None:
        while not self.outbox and not self._owners_out and not self._stopping:
            self._filled.clear()
            await self._filled.wait()

    async def _flush(self) -> None:
        if self._client is None:
            return
        if self._owners_out:
            await self._flush_owners()
        batch = self.outbox
        if not batch:
            return
        self.outbox = deque()
        entries = [(e[0], _block_bytes(e[1]), *e[2:]) for e in batch]
        payload = msgspec.msgpack.encode({"r": self.replica, "t": time.time(), "e": entries})
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.xadd(self.stream_key, {b"d": payload}, maxlen=STREAM_MAXLEN, approximate=True)
                pipe.expire(self.stream_key, STREAM_TTL_S)
                await pipe.execute()
        except BaseException:  # not sent: back in front of what came meanwhile, bounded
            batch.extend(self.outbox)
            while len(batch) > OUTBOX_MAX:
                batch.popleft()
                self.stats.dropped += 1
            self.outbox = batch
            raise
        self.stats.count(self.stats.published, "bookings", len(batch))
        self._ok()

    async def _flush_owners(self) -> None:
        owners, self._owners_out = self._owners_out, {}
        assert self._client is not None
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for response_id, url in owners.items():
                    pipe.set(self.owner_prefix + response_id, url, ex=RESPONSE_OWNER_TTL_S)
                await pipe.execute()
        except BaseException:  # not written: kept for the next flush (bounded)
            owners.update(self._owners_out)
            while len(owners) > OUTBOX_MAX:
                del owners[next(iter(owners))]
                self.stats.dropped += 1
            self._owners_out = owners
            raise
        self.stats.count(self.stats.published, "response_owners", len(owners))

    async def _read_loop(self) -> None:
        await self._loop("read", self._read, 0)

    async def _read(self) -> None:
        """One blocking read of every peer's stream, from where each was left."""
        reader = self._reader
        assert reader is not None
        streams = {self.stream_prefix + p: self._last_ids.get(p, b"0") for p in self._peers}
        if not streams:
            await asyncio.sleep(self.settings.state_load_interval_s)  # no peer (yet)
            return
        reply = await reader.xread(streams, READ_COUNT, READ_BLOCK_MS)
        self._ok()
        for key, entries in reply or ():
            peer = key.decode(errors="replace").removeprefix(self.stream_prefix)
            for entry_id, fields in entries:
                self._last_ids[peer] = entry_id
                self._apply_bookings(fields)

    def _apply_bookings(self, fields: dict) -> None:
        """Another replica's batch: blocks into the shadows, sessions bound, and the load of
        bookings its last load snapshot did not hold yet into the counters."""
        try:
            batch = msgspec.msgpack.decode(fields[b"d"])
            replica, sent, entries = str(batch["r"]), float(batch["t"]), batch["e"]
            if replica == self.replica:
                return
            decoded = [
                (str(url), array("Q", blocks), sid, int(tokens), int(p), int(d), int(k))
                for url, blocks, sid, tokens, p, d, k in entries
            ]
        except (KeyError, TypeError, ValueError, msgspec.DecodeError):
            self.stats.bad_entries += 1
            return
        workers = {w.url: (i, w) for i, w in enumerate(self.pool.workers)}
        sessions = getattr(self.pool.picker, "sessions", None)
        snapshot = self._peer_booked.get(replica)  # None: no snapshot yet (a backlog)
        newer = self._peer_newer.setdefault(replica, deque()) if snapshot is not None else None
        now = time.monotonic()
        applied = 0
        for url, blocks, sid, tokens, prefill, decode, count in decoded:
            found = workers.get(url)
            if found is None:
                continue  # a worker this replica does not have (yet)
            index, worker = found
            worker.state.blocks.insert(blocks)
            if isinstance(sid, str):
                worker.state.footprint.touch(sid, tokens, now)
                if sessions is not None:
                    sessions.bind(sid, index)
            if newer is not None and count > snapshot:
                newer.append((count, url, max(0, prefill), max(0, decode)))
                _add_remote(worker, 1, max(0, prefill), max(0, decode))
            applied += 1
        self.stats.count(self.stats.applied, "bookings", applied)
        self.stats.lag_s = max(0.0, time.time() - sent)

    # ---- load, health and membership -----------------------------------------------------

    async def _load_loop(self) -> None:
        self._next_membership = 0.0
        await self._loop("load", self._load, self.settings.state_load_interval_s)

    async def _load(self) -> None:
        client = self._client
        assert client is not None
        try:
            await self._exchange_load(client)
        finally:
            if time.monotonic() - self._last_load_read > self.settings.state_load_ttl_s:
                self._apply_remote_load({})  # too old to trust: route on the local load
        if time.monotonic() >= self._next_membership:
            await self._reconcile_membership(client)
            self._next_membership = time.monotonic() + MEMBERSHIP_INTERVAL_S

    async def _exchange_load(self, client: aioredis.Redis) -> None:
        """Write ours and read every other member's, in one script call (one round trip)."""
        own = self.load_prefix + self.replica
        mine: dict[bytes, bytes] = {_ALIVE: b"%d" % self._booked}
        for w in self.pool.workers:
            st, (rn, rp, rd) = w.state, w.remote_load
            mine[w.url.encode()] = b"%d %d %d %d" % (
                st.num_requests - rn,
                st.pending_prefill_tokens - rp,
                st.ongoing_decode_tokens - rd,
                st.healthy,
            )
        gone = self._published - mine.keys()  # workers removed since the last round
        args: list[Any] = [int(self.settings.state_load_ttl_s * 1000), self.replica]
        args += [self.load_prefix, len(gone), *gone, *(x for kv in mine.items() for x in kv)]
        # one script call: a pipeline of the same commands cost ~1 ms of client CPU a round
        reply = await self._exchange(keys=[own, self.replicas_key], args=args, client=client)
        self._published = set(mine)
        self._last_load_read = time.monotonic()
        self._ok()
        totals: dict[str, list[int]] = {}
        dead, alive = [], []
        for i in range(0, len(reply), 2):
            peer, flat = reply[i].decode(errors="replace"), reply[i + 1]
            if flat:
                alive.append(peer)
                self._add_peer_load(peer, dict(zip(flat[::2], flat[1::2], strict=True)), totals)
            else:
                dead.append(peer)
        for peer in dead:
            self._peer_booked.pop(peer, None)
            self._peer_newer.pop(peer, None)
        for newer in self._peer_newer.values():  # bookings no snapshot holds yet
            for _, url, prefill, decode in newer:
                total = totals.setdefault(url, [0, 0, 0])
                total[0] += 1
                total[1] += prefill
                total[2] += decode
        self._apply_remote_load(totals)
        if dead:  # its load hash expired: gone (a late one would simply re-add itself)
            await client.srem(self.replicas_key, *dead)
            self._peer_health = {k: v for k, v in self._peer_health.items() if k[0] not in dead}
            for peer in dead:
                self._last_ids.pop(peer, None)
        self._peers = sorted(alive)
        self.stats.peers = len(self._peers)

    def _add_peer_load(self, peer: str, load: dict, totals: dict[str, list[int]]) -> None:
        try:
            booked = int(load.get(_ALIVE, b""))
        except ValueError:
            self.stats.bad_entries += 1
        else:
            self._peer_booked[peer] = booked
            newer = self._peer_newer.get(peer)
            while newer and newer[0][0] <= booked:  # the snapshot holds it now
                newer.popleft()
        for key, value in load.items():
            if key == _ALIVE:
                continue
            try:
                url = key.decode()
                n, p, d, healthy = (int(x) for x in value.split())
            except (UnicodeDecodeError, ValueError):
                self.stats.bad_entries += 1
                continue
            total = totals.setdefault(url, [0, 0, 0])
            total[0] += max(0, n)
            total[1] += max(0, p)
            total[2] += max(0, d)
            was = self._peer_health.get((peer, url), True)
            self._peer_health[(peer, url)] = bool(healthy)
            if was and not healthy:  # the peer just took it out: so do we
                worker = self.pool.get(url)
                if worker is not None:
                    self.pool.take_out(worker, f"router replica {peer} took it out")

    def _apply_remote_load(self, totals: dict[str, list[int]]) -> None:
        """Swap each worker's previous remote load for ``totals`` in its counters."""
        if not totals:  # nothing to trust: the bookings' load goes with the snapshots
            self._peer_newer.clear()
        for w in self.pool.workers:
            n, p, d = totals.get(w.url, (0, 0, 0))
            rn, rp, rd = w.remote_load
            if (n, p, d) == (rn, rp, rd):
                continue
            st = w.state
            st.num_requests += n - rn
            st.pending_prefill_tokens += p - rp
            st.ongoing_decode_tokens += d - rd
            w.remote_load = (n, p, d)

    async def _reconcile_membership(self, client: aioredis.Redis) -> None:
        """Seed a missing set with ours, push this replica's changes, follow the set."""
        seed = [x for w in self.pool.workers for x in (w.url, self._meta(w))]
        ops, self._membership_ops = self._membership_ops, []
        try:
            await client.eval(_SEED_SCRIPT, 2, self.epoch_key, self.workers_key, *seed)
            async with client.pipeline(transaction=True) as pipe:
                for op, url, meta in ops:
                    if op == "hset":
                        pipe.hset(self.workers_key, url, meta)
                    else:
                        pipe.hdel(self.workers_key, url)
                pipe.hgetall(self.workers_key)
                *_, shared = await pipe.execute()
        except BaseException:
            self._membership_ops = ops + self._membership_ops  # retried next time
            raise
        wanted: dict[str, tuple[int | None, str, int | None]] = {}
        for key, meta in shared.items():
            try:
                url = normalize_url(key.decode())
                entry = orjson.loads(meta)
                capacity = entry.get("kv_capacity_tokens")
                role = entry.get("role", BOTH)
                port = entry.get("bootstrap_port")
            except (UnicodeDecodeError, ValueError, AttributeError):
                self.stats.bad_entries += 1
                continue
            if role not in ROLES:
                self.stats.bad_entries += 1
                continue
            wanted[url] = (
                capacity if isinstance(capacity, int) and capacity > 0 else None,
                role,
                port if isinstance(port, int) and 0 < port < 65536 else None,
            )
        for w in list(self.pool.workers):
            if w.url not in wanted:
                self.pool.remove(w.url)
                self.stats.count(self.stats.applied, "membership")
        for url, (capacity, role, port) in wanted.items():
            if self.pool.get(url) is None:
                worker = self.pool.add(url, capacity, role, port)
                self.stats.count(self.stats.applied, "membership")
                if self.on_worker_added is not None:
                    self.on_worker_added(worker)

    @staticmethod
    def _meta(worker: Worker) -> bytes:
        meta: dict[str, int | str] = {"kv_capacity_tokens": worker.capacity_tokens}
        if worker.role != BOTH:
            meta["role"] = worker.role
        if worker.bootstrap_port is not None:
            meta["bootstrap_port"] = worker.bootstrap_port
        return orjson.dumps(meta)


def _add_remote(worker: Worker, requests: int, prefill: int, decode: int) -> None:
    """A peer's load, into the worker's counters and its remote share of them."""
    st = worker.state
    st.num_requests += requests
    st.pending_prefill_tokens += prefill
    st.ongoing_decode_tokens += decode
    rn, rp, rd = worker.remote_load
    worker.remote_load = (rn + requests, rp + prefill, rd + decode)


# The load exchange, in one round trip: write this replica's load hash (KEYS[1]; ARGV: TTL ms,
# replica id, load key prefix, n, n fields removed, then field/value pairs), keep it alive,
# join the replica set (KEYS[2]), and answer every other member with its load hash (empty:
# expired, that replica is dead). The peers' hash keys are built here from the prefix, so the
# script suits one Redis, not a cluster (nor does the rest of the sharing).
_EXCHANGE_SCRIPT = """
local ttl, me, prefix, ngone = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if ngone > 0 then redis.call('HDEL', KEYS[1], unpack(ARGV, 5, 4 + ngone)) end
redis.call('HSET', KEYS[1], unpack(ARGV, 5 + ngone))
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('SADD', KEYS[2], me)
local out = {}
for _, member in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if member ~= me then
    out[#out + 1] = member
    out[#out + 1] = redis.call('HGETALL', prefix .. member)
  end
end
return out
"""

# The shared worker set exists once the epoch key does; a Redis that lost its data (or a
# first replica) has neither, and the caller's own workers seed it, atomically, so no replica
# ever reads an empty set as "every worker was removed".
_SEED_SCRIPT = """
if redis.call('SET', KEYS[1], '1', 'NX') then
  for i = 1, #ARGV, 2 do redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) end
  return 1
end
return 0
"""
