"""Precise mode: each worker's KV cache events keep an exact index of what it stores.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``)
publishes, after every scheduler step that changed its prefix cache, one ZMQ message
``(topic, seq, payload)``: ``seq`` an 8-byte big-endian counter from 0 per process, ``payload``
a msgpack ``[ts, [event, ...], dp_rank?]`` (``vllm/distributed/kv_events.py``). Events:

- ``BlockStored {block_hashes, parent_block_hash, token_ids, block_size, medium, extra_keys,
  group_idx, ...}``: full blocks of ``block_size`` tokens entered the prefix cache;
- ``BlockRemoved {block_hashes, medium, ...}``: blocks were evicted;
- ``AllBlocksCleared``: the cache was reset.

SGLang (``--kv-events-config``, same keys) publishes the same three events on the same
sockets, with the same framing and replay protocol; its schema
(``python/sglang/srt/disaggregation/kv_events.py``, ``mem_cache/events.py``) differs from
vLLM's in ways :func:`decode_batch` and :func:`apply_events` accept:

- events are msgspec ``array_like`` tagged structs, i.e. arrays: ``["BlockStored",
  block_hashes, parent_block_hash, token_ids, block_size, lora_id(, medium)(, metadata)]``,
  ``["BlockRemoved", block_hashes(, medium)]``, ``["AllBlocksCleared"]`` (vLLM 0.32 sends
  maps tagged by ``type``; vLLM's older array form has the same leading field order). Newer
  SGLang versions append ``medium`` and, for salted requests, ``metadata {cache_salt}``;
  anything set after ``medium`` marks the block as one a plain request never matches;
- block hashes are *signed* 64-bit ints (the first 8 bytes of a SHA-256 chain as int64),
  vLLM's unsigned ints or bytes: opaque here either way;
- one ``BlockStored`` per page (``page_size`` tokens, default 1: a token-granular index),
  each naming the previous page as parent (newer versions coalesce a chain into one event);
  vLLM: one event per run of blocks;
- ``medium`` is ``GPU``, ``CPU_PINNED``, ``DISK`` or ``EXTERNAL`` (HiCache tiers); vLLM
  ``GPU`` / ``CPU`` (the OffloadingConnector's host tier, published when a store completes
  and at a CPU eviction), LMCache ``cpu``. ``GPU`` (or none) is the index; the CPU media
  (:data:`CPU_MEDIA`) are the worker's CPU tier (:meth:`KVIndex.cpu_match`): their
  stored events carry no token ids, so each block's key is the one its GPU copy was stored
  under (a write-through tier stores a block while the GPU still holds it); a block whose
  GPU copy the index never saw is counted in ``cpu_unknown`` and left out. Other media are
  skipped;
- no ``lora_name``, ``extra_keys``, ``group_idx`` (vLLM 0.32's hybrid-model and multimodal
  fields); ``lora_id`` is always null;
- the batch's third element is ``attn_dp_rank`` (vLLM: ``data_parallel_rank``); with DP
  attention each rank publishes on the endpoint's port + rank, and only rank 0's port is
  subscribed here.

The sockets that receive the events live in :mod:`router.fleet.kv_events`; this module is
the pure part (index, decoding, sequence bookkeeping), shared with anything that has events.

The index (:class:`KVIndex`) is kept at **vLLM's block size**, keyed by the router's own
chained hash: ``xxh3_64(block's uint32 token bytes, seed=parent's key)``, the same function
:func:`router.cache.block_hash.hash_blocks` applies to a request's tokens at that block size. vLLM's
own hashes (sha256 of pickled tuples, or their 64-bit folding) are only used to find a stored
block's parent and to remove blocks; the router never has to reproduce them, so a vLLM
version or hash-algorithm change cannot silently break matching. A block whose vLLM hash used
extra keys (LoRA, multimodal, ``cache_salt``) gets a key the request side never computes: it
never matches, as vLLM would not match it for a plain request either. The estimate of a
request is the longest run of its leading blocks present, capped like vLLM's own lookup at
``floor((prompt_len - 1) / block_size)`` blocks. Present: stored, or booked by a request in
flight there (a burst of one prefix stays together before the worker's events arrive), or
booked by a request that finished less than :data:`PIN_GRACE_S` ago and whose stored event
has not arrived yet (vLLM's events can trail its responses by up to a second under load).

Synchronisation (:class:`KVEventFeed`). The index is *synced* once it has seen a complete
history: a process's batches from ``seq`` 0, or everything since an ``AllBlocksCleared``.
Only a synced index answers estimates; otherwise the worker's shadow does (the estimate).

- the first batch seen after subscribing, or a gap (``seq`` > last + 1, e.g. ZMQ dropped
  batches or the router started late): the missed batches are asked from the replay socket
  (from 0 when nothing was seen yet, rebuilding the index from scratch); live batches wait
  meanwhile. If the replay cannot fill the gap (no replay socket, buffer rolled over) the
  index goes unsynced and keeps applying events, until an ``AllBlocksCleared`` or a restart;
- a restarted worker numbers from 0 again: a ``seq`` at or below the last one with a newer
  timestamp starts a new history (cleared index; synced if it is ``seq`` 0, else replayed);
  older duplicates (replay overlapping live) are ignored;
- a worker that comes back after being out (:meth:`router.fleet.pool.WorkerPool.record_success`)
  forgets its history the same way.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import xxhash

from router.cache.block_hash import TextBytes, hash_blocks, token_bytes

END_SEQ = -1
"""The replay socket's end-of-replay marker (``seq`` -1, signed)."""
REPLAY_TIMEOUT_S = 3.0
"""A replay answers within this long and never pauses longer (else it counts as no answer)."""
REPLAY_MAX_S = 60.0
"""Longest a whole replay may stream (vLLM buffers up to 10,000 batches)."""
PIN_GRACE_S = 5.0
"""A finished request's blocks count as present this long, or until their stored event
arrives: vLLM publishes a step's events from a thread of its engine process, and under load
they reach the router after the response did (vLLM CPU here, 3 workers on 2 cores: up to
about 1 s, ``lag_s_max`` in ``GET /workers``)."""
_xxh3 = xxhash.xxh3_64_intdigest

BlockHash = int | bytes
"""vLLM's external block hash: 64-bit int (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``) or bytes."""


_memo: tuple[bytes, int, list[int]] | None = None


def request_keys(tokens: bytes, block_size: int) -> list[int]:
    """The request's chained keys at ``block_size``; the last answer is memoized because the
    picker asks every worker's index about the same request in a row."""
    global _memo
    memo = _memo
    if memo is not None and memo[0] is tokens and memo[1] == block_size:
        return memo[2]
    keys = hash_blocks(tokens, block_size)
    _memo = (tokens, block_size, keys)
    return keys


@dataclass
class KVIndexStats:
    """What the events did to one index (exported in ``GET /workers``)."""

    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    unknown_parent: int = 0
    skipped: int = 0  # other media / cache groups, malformed events
    replays: int = 0
    gaps: int = 0
    restarts: int = 0
    desyncs: int = 0
    cpu_stored: int = 0
    cpu_removed: int = 0
    cpu_unknown: int = 0  # CPU-tier blocks whose GPU copy was never seen (no key)


class KVIndex:
    """One worker's stored blocks, as its KV events tell, at the worker's block size.

    Besides the stored blocks it counts two kinds of blocks as present, so a request can hit
    a prefix whose events have not arrived yet: blocks of requests booked there and still in
    flight (``_inflight``), and blocks of requests that finished less than
    :data:`PIN_GRACE_S` ago and were not confirmed stored since (``_unconfirmed``). A stored
    event confirms a block (it leaves ``_unconfirmed``), so a later removal is never masked.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock  # the simulator passes its virtual time; None: time.monotonic
        self.block_size: int | None = None
        self.synced = False
        self._blocks: dict[BlockHash, list[int]] = {}  # vLLM hash -> [our key, copies]
        self._keys: dict[int, int] = {}  # our key -> stored copies
        self._inflight: dict[int, int] = {}  # our key -> pins of booked requests
        self._unconfirmed: dict[int, int] = {}  # our key -> finished requests awaiting events
        self._grace: deque[tuple[float, list[int]]] = deque()  # (expiry, keys), oldest first
        self._cpu: dict[BlockHash, int] = {}  # the CPU tier: engine hash -> our key
        self._cpu_keys: dict[int, int] = {}  # our key -> copies in the CPU tier
        self.stats = KVIndexStats()

    def __len__(self) -> int:
        return len(self._blocks)

    # ---- events ----------------------------------------------------------------------------

    def key_of(self, block_hash: BlockHash) -> int | None:
        entry = self._blocks.get(block_hash)
        return entry[0] if entry is not None else None

    def store(self, block_hash: BlockHash, key: int) -> None:
        entry = self._blocks.get(block_hash)
        if entry is None:
            self._blocks[block_hash] = [key, 1]
        else:  # vLLM may cache two blocks with the same content (and hash)
            entry[1] += 1
        self._keys[key] = self._keys.get(key, 0) + 1
        self._unconfirmed.pop(key, None)
        self.stats.stored += 1

    def remove(self, block_hash: BlockHash) -> None:
        entry = self._blocks.get(block_hash)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del self._blocks[block_hash]
        key = entry[0]
        left = self._keys.get(key, 0) - 1
        if left > 0:
            self._keys[key] = left
        else:
            self._keys.pop(key, None)
        self.stats.removed += 1

    def store_cpu(self, block_hash: BlockHash) -> None:
        """The worker copied ``block_hash`` to its CPU tier (keyed as its GPU copy)."""
        if block_hash in self._cpu:
            return
        key = self.key_of(block_hash)
        if key is None:
            self.stats.cpu_unknown += 1
            return
        self._cpu[block_hash] = key
        self._cpu_keys[key] = self._cpu_keys.get(key, 0) + 1
        self.stats.cpu_stored += 1

    def remove_cpu(self, block_hash: BlockHash) -> None:
        key = self._cpu.pop(block_hash, None)
        if key is None:
            return
        left = self._cpu_keys[key] - 1
        if left > 0:
            self._cpu_keys[key] = left
        else:
            del self._cpu_keys[key]
        self.stats.cpu_removed += 1

    @property
    def cpu_blocks(self) -> int:
        return len(self._cpu)

    def cpu_match(self, keys: Sequence[int], start: int) -> int:
        """Consecutive ``keys`` from index ``start`` that the CPU tier holds."""
        held = self._cpu_keys
        n = 0
        for key in keys[start:]:
            if key not in held:
                break
            n += 1
        return n

    def estimate_cpu(self, tokens: bytes | None, input_length: int, gpu_hit: int) -> int | None:
        """Tokens the worker would load from its CPU tier after a GPU hit of ``gpu_hit``
        (index tokens); None when the index cannot tell."""
        if not self.synced or tokens is None:
            return None
        keys = self.keys(tokens)
        if keys is None:
            return None
        size = self.block_size or 1
        start = gpu_hit // size
        limit = max(0, input_length - 1) // size  # vLLM's lookup cap, as for the GPU
        blocks = min(start + self.cpu_match(keys, start), limit)
        return max(0, blocks * size - gpu_hit)

    def clear(self) -> None:
        """Forget every stored block, in both tiers, and every finished request's blocks
        (pins of requests in flight belong to their bookings and stay)."""
        self._blocks.clear()
        self._keys.clear()
        self._cpu.clear()
        self._cpu_keys.clear()
        self._unconfirmed.clear()
        self._grace.clear()

    # ---- requests --------------------------------------------------------------------------

    def keys(self, tokens: bytes) -> list[int] | None:
        """The request's keys at this worker's block size (None if unknown or approximate)."""
        if self.block_size is None or isinstance(tokens, TextBytes):
            return None
        return request_keys(tokens, self.block_size)

    def match(self, keys: Sequence[int]) -> int:
        """Leading ``keys`` present (stored, in flight, or finished and not yet confirmed)."""
        stored, inflight, unconfirmed = self._keys, self._inflight, self._unconfirmed
        n = 0
        for key in keys:
            if key not in stored and key not in inflight and key not in unconfirmed:
                break
            n += 1
        return n

    def estimate(self, tokens: bytes | None, input_length: int) -> int | None:
        """Tokens vLLM will find cached for this prompt; None when the index cannot tell."""
        if not self.synced or tokens is None:
            return None
        keys = self.keys(tokens)
        if keys is None:
            return None
        if self._grace:
            self.expire()
        size = self.block_size or 1
        blocks = min(self.match(keys), max(0, input_length - 1) // size)
        return blocks * size

    def pin(self, tokens: bytes | None) -> list[int]:
        """Count the request's blocks as present until :meth:`unpin` (the booking's end)."""
        keys = self.keys(tokens) if tokens is not None else None
        if not keys:
            return []
        inflight = self._inflight
        for key in keys:
            inflight[key] = inflight.get(key, 0) + 1
        return keys

    def unpin(self, keys: Sequence[int]) -> None:
        """The booking ended: blocks not confirmed stored yet stay counted for
        :data:`PIN_GRACE_S` (or until their stored event arrives)."""
        inflight, stored, unconfirmed = self._inflight, self._keys, self._unconfirmed
        waiting = []
        for key in keys:
            left = inflight.get(key, 0) - 1
            if left > 0:
                inflight[key] = left
            else:
                inflight.pop(key, None)
            if key not in stored:
                unconfirmed[key] = unconfirmed.get(key, 0) + 1
                waiting.append(key)
        now = self.clock() if self.clock is not None else time.monotonic()
        if waiting:
            self._grace.append((now + PIN_GRACE_S, waiting))
        self.expire(now)

    def expire(self, now: float | None = None) -> None:
        """Stop counting finished requests' blocks whose grace is over."""
        grace, unconfirmed = self._grace, self._unconfirmed
        if now is None:
            now = self.clock() if self.clock is not None else time.monotonic()
        while grace and grace[0][0] <= now:
            for key in grace.popleft()[1]:
                left = unconfirmed.get(key, 0) - 1
                if left > 0:
                    unconfirmed[key] = left
                else:
                    unconfirmed.pop(key, None)

    @property
    def pinned_blocks(self) -> int:
        """Blocks pinned by requests in flight."""
        return len(self._inflight)

    def describe(self) -> dict[str, Any]:
        self.expire()
        s = self.stats
        return {
            "synced": self.synced,
            "block_size": self.block_size,
            "blocks": len(self._blocks),
            "inflight_blocks": len(self._inflight),
            "unconfirmed_blocks": len(self._unconfirmed),
            "batches": s.batches,
            "stored": s.stored,
            "removed": s.removed,
            "cleared": s.cleared,
            "unknown_parent": s.unknown_parent,
            "skipped": s.skipped,
            "replays": s.replays,
            "gaps": s.gaps,
            "restarts": s.restarts,
            "desyncs": s.desyncs,
            "cpu_blocks": len(self._cpu),
            "cpu_stored": s.cpu_stored,
            "cpu_removed": s.cpu_removed,
            "cpu_unknown": s.cpu_unknown,
        }


# ---- decoding ------------------------------------------------------------------------------

# Field order of array-encoded events (tagged array_like structs): SGLang's, and older vLLM
# versions'. Elements past these are extensions (SGLang's metadata): kept as "trailing".
_ARRAY_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
    ),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def normalize_event(event: Any) -> dict[str, Any] | None:
    """An event as a dict with ``type`` (vLLM encodes tagged maps; SGLang and older vLLM
    versions arrays, see the module docstring)."""
    if isinstance(event, dict):
        return event if isinstance(event.get("type"), str) else None
    if isinstance(event, list | tuple) and event and isinstance(event[0], str):
        names = _ARRAY_FIELDS.get(event[0])
        if names is None:
            return None
        out = {"type": event[0], **dict(zip(names, event[1:], strict=False))}
        trailing = [v for v in event[1 + len(names) :] if v is not None]
        if trailing:
            out["trailing"] = trailing
        return out
    return None


def decode_batch(payload: bytes) -> tuple[float, list[dict[str, Any]]]:
    """``(ts, events)`` of one msgpack ``EventBatch`` payload (ValueError if malformed)."""
    try:
        batch = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise ValueError(f"undecodable KV event batch: {exc}") from None
    if isinstance(batch, dict):  # a map-encoded batch
        ts, events = batch.get("ts", 0.0), batch.get("events", [])
    elif isinstance(batch, list) and len(batch) >= 2:
        ts, events = batch[0], batch[1]
    else:
        raise ValueError("KV event batch is not [ts, events, ...]")
    if not isinstance(events, list):
        raise ValueError("KV event batch has no event list")
    out = [e for e in (normalize_event(ev) for ev in events) if e is not None]
    return float(ts or 0.0), out


def _extra_seed(parent: int, extra: Any) -> int:
    return _xxh3(repr(extra).encode(), parent)


CPU_MEDIA = frozenset(("CPU", "CPU_PINNED", "cpu"))
"""Media naming a worker's host-memory tier: vLLM's OffloadingConnector (``CPU``), SGLang's
HiCache (``CPU_PINNED``), LMCache's CPU backend (``cpu``)."""


def apply_events(index: KVIndex, events: Iterable[dict[str, Any]]) -> None:
    """Apply one batch's events to ``index`` (stored blocks, removals, clears)."""
    stats = index.stats
    for event in events:
        kind = event.get("type")
        medium = event.get("medium")
        if medium in CPU_MEDIA and event.get("group_idx") in (None, 0):
            change = index.store_cpu if kind == "BlockStored" else index.remove_cpu
            if kind in ("BlockStored", "BlockRemoved"):
                for block_hash in event.get("block_hashes") or ():
                    change(_hashable(block_hash))
                continue
        if kind == "BlockStored":
            _apply_stored(index, event)
        elif kind == "BlockRemoved":
            if medium not in (None, "GPU") or event.get("group_idx") not in (None, 0):
                stats.skipped += 1
                continue
            for block_hash in event.get("block_hashes") or ():
                index.remove(_hashable(block_hash))
        elif kind == "AllBlocksCleared":
            index.clear()
            stats.cleared += 1
            index.synced = True  # an empty cache is a complete history
        else:
            stats.skipped += 1


def _hashable(block_hash: Any) -> BlockHash:
    return bytes(block_hash) if isinstance(block_hash, bytearray | list) else block_hash


def _apply_stored(index: KVIndex, event: dict[str, Any]) -> None:
    stats = index.stats
    hashes = event.get("block_hashes") or []
    tokens = event.get("token_ids") or []
    size = event.get("block_size")
    if (
        event.get("medium") not in (None, "GPU")
        or event.get("group_idx") not in (None, 0)
        or not isinstance(size, int)
        or size <= 0
        or len(tokens) != len(hashes) * size
    ):
        stats.skipped += 1
        return
    if index.block_size != size:
        if index.block_size is not None:  # a worker restarted with another block size
            index.clear()
            index.synced = False
            stats.desyncs += 1
        index.block_size = size
    parent_hash = event.get("parent_block_hash")
    root = 0
    if parent_hash is not None:
        parent_hash = _hashable(parent_hash)
        known = index.key_of(parent_hash)
        if known is None:
            # a parent we never saw stored: keys that cannot match a request's
            stats.unknown_parent += 1
            root = _extra_seed(0x9E3779B97F4A7C15, parent_hash)
        else:
            root = known
    extras = event.get("extra_keys")
    if event.get("lora_name") or event.get("lora_id"):
        extras = [("lora", event.get("lora_name") or event.get("lora_id"))] * len(hashes)
    elif event.get("trailing") or event.get("cache_salt"):  # SGLang: salted, or newer fields
        extras = [("salt", repr(event.get("trailing") or event.get("cache_salt")))] * len(hashes)
    try:
        buf = token_bytes(tokens)
    except ValueError:
        stats.skipped += 1
        return
    if extras and any(e is not None for e in extras):
        keys = []
        parent = root
        step = size * 4
        for i in range(len(hashes)):
            extra = extras[i] if i < len(extras) else None
            seed = _extra_seed(parent, extra) if extra is not None else parent
            parent = _xxh3(buf[i * step : (i + 1) * step], seed)
            keys.append(parent)
    else:
        keys = hash_blocks(buf, size, root)
    for block_hash, key in zip(hashes, keys, strict=True):
        index.store(_hashable(block_hash), key)


# ---- sequence numbers and synchronisation ----------------------------------------------------


@dataclass
class KVEventFeed:
    """Orders one worker's batches by ``seq`` and decides when the index can be trusted.

    Pure (no sockets): :class:`KVEventSubscriber` feeds it live batches, asks the replay
    socket when :meth:`live` returns a ``seq`` to replay from, and hands the replayed batches
    to :meth:`replayed`.
    """

    index: KVIndex
    last_seq: int | None = None
    last_ts: float = 0.0
    replaying: bool = False
    pending: list[tuple[int, float, list[dict[str, Any]]]] = field(default_factory=list)

    def reset(self) -> None:
        """Forget the history (the worker was out: it may have restarted)."""
        self.index.clear()
        self.index.synced = False
        self.last_seq = None
        self.pending.clear()

    def live(self, seq: int, ts: float, events: list[dict[str, Any]]) -> int | None:
        """A live batch; returns the ``seq`` to replay from when batches are missing."""
        if self.replaying:
            self.pending.append((seq, ts, events))
            return None
        last = self.last_seq
        if last is not None and seq <= last:
            if ts <= self.last_ts:
                return None  # a duplicate
            self.index.stats.restarts += 1  # a new process numbering from 0 again
            self.reset()
            last = None
        if last is None:
            if seq == 0:
                self._start_history()
                self._apply(seq, ts, events)
                return None
            self.pending.append((seq, ts, events))
            self.replaying = True
            return 0
        if seq == last + 1:
            self._apply(seq, ts, events)
            return None
        self.index.stats.gaps += 1
        self.pending.append((seq, ts, events))
        self.replaying = True
        return last + 1

    def replayed(
        self, from_seq: int, batches: list[tuple[int, float, list[dict[str, Any]]]] | None
    ) -> None:
        """The replay of ``from_seq`` (None: no answer), then the batches held meanwhile."""
        self.index.stats.replays += 1
        got = sorted(batches or [], key=lambda b: b[0])
        if from_seq == 0 and got and got[0][0] == 0:
            self._start_history()
        elif from_seq == 0 and batches is not None and not got and not self.pending:
            # nothing was ever published: an empty cache is a complete history
            self._start_history()
        items = sorted(got + self.pending, key=lambda b: b[0])
        self.pending = []
        self.replaying = False
        for seq, ts, events in items:
            last = self.last_seq
            if last is not None and seq <= last:
                continue
            if (last is None and seq != 0) or (last is not None and seq != last + 1):
                if self.index.synced:
                    self.index.stats.desyncs += 1
                self.index.synced = False  # the gap stays open: trust the estimate
            self._apply(seq, ts, events)

    def _start_history(self) -> None:
        self.index.clear()
        self.index.synced = True
        self.last_seq = -1

    def _apply(self, seq: int, ts: float, events: list[dict[str, Any]]) -> None:
        apply_events(self.index, events)
        self.index.stats.batches += 1
        self.last_seq = seq
        self.last_ts = max(self.last_ts, ts)
