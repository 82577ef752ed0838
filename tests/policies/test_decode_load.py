"""decode_load: fewest running requests among decode workers with KV room, then least held."""

from policies.decode_load import DecodeLoadPicker


def test_fewest_requests_then_least_held(worker, request_for):
    workers = [worker(3), worker(1), worker(1)]
    workers[1].held_tokens, workers[2].held_tokens = 9000, 4000
    pick = DecodeLoadPicker().pick(request_for(), workers)
    assert (pick.worker, pick.branch) == (2, "decode_load")


def test_a_worker_without_room_for_the_kv_is_passed_over(worker, request_for):
    workers = [worker(0), worker(5)]
    workers[0].held_tokens, workers[0].kv_capacity_tokens = 10_000, 11_000
    pick = DecodeLoadPicker().pick(request_for(input_length=2048), workers)
    assert pick.worker == 1  # idle, but the request's 2048 tokens do not fit beside 10k


def test_no_room_anywhere_falls_back_to_the_load_order(worker, request_for):
    workers = [worker(2), worker(1)]
    for w in workers:
        w.held_tokens, w.kv_capacity_tokens = 1000, 1000
    pick = DecodeLoadPicker().pick(request_for(), workers)
    assert (pick.worker, pick.branch) == (1, "decode_full")


def test_ties_go_round_robin_and_unhealthy_workers_are_skipped(worker, request_for):
    workers = [worker(0), worker(0, healthy=False), worker(0)]
    picker = DecodeLoadPicker()
    chosen = [picker.pick(request_for(), workers).worker for _ in range(4)]
    assert chosen == [0, 2, 0, 2]
    assert picker.pick(request_for(), workers).branch == "decode_tie"
