"""A worker model driven to completion against hand-computed timelines (the worker model's
tests and its CPU tier's share it)."""

from __future__ import annotations

from traces.sim.worker_model import SimRequest, WorkerModel, WorkerModelConfig


class Driver:
    """Runs a model to completion, recording first-token and finish times."""

    def __init__(self, config: WorkerModelConfig, events: bool = False) -> None:
        self.first: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.model = WorkerModel(
            config,
            on_first_token=lambda r, t: self.first.__setitem__(r.tag, t),
            on_finish=lambda r, t: self.done.__setitem__(r.tag, t),
            events=events,
        )

    def run(self, arrivals: list[tuple[float, SimRequest]], until: float = 1e9) -> None:
        arrivals = sorted(arrivals, key=lambda a: a[0])
        for _ in range(100_000):
            nxt = self.model.next_event
            if arrivals and (nxt is None or arrivals[0][0] < nxt):
                t, r = arrivals.pop(0)
                self.model.submit(r, t)
            elif nxt is not None and nxt <= until:
                self.model.advance(nxt)
            else:
                return
        raise AssertionError("model did not settle")


def req(tag: str, blocks: tuple[int, ...], input_length: int, output: int = 1) -> SimRequest:
    return SimRequest(blocks, input_length, output, tag=tag)
