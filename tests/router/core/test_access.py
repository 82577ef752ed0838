"""Access: client API keys, the admin key, which paths each guards, and keys never shown."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import httpx
import pytest

from router.config import load_settings
from router.core.access import Access, Need, Verdict

CLIENT, OTHER, ADMIN = "ck-1111", "ck-2222", "adm-9999"
BODY = {"model": "fake-model", "prompt": "hi"}


def access(**values) -> Access:
    return Access(load_settings(**values))


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", b"Bearer " + key.encode())]


def test_rules_without_any_key_leave_everything_open():
    a = access()
    for method, path in [("POST", "/workers"), ("GET", "/v1/models"), ("GET", "/metrics")]:
        assert a.check(a.need(method, path), []) is Verdict.OK
    assert a.client_ok(None)


def test_rules_with_client_and_admin_keys():
    a = access(api_keys=[CLIENT, OTHER], admin_key=ADMIN)
    assert a.client_ok(b"Bearer " + CLIENT.encode()) and a.client_ok(b"bearer " + OTHER.encode())
    assert a.client_ok(b"Bearer " + ADMIN.encode())  # the operator may use the fleet
    for auth in (None, b"", b"Bearer ", b"Bearer ck-111", b"Bearer ck-11111", CLIENT.encode()):
        assert not a.client_ok(auth), auth
    admin = a.need("POST", "/workers")
    assert admin is Need.ADMIN and a.need("DELETE", "/workers") is Need.ADMIN
    assert a.check(admin, bearer(ADMIN)) is Verdict.OK
    assert a.check(admin, [(b"x-admin-key", ADMIN.encode())]) is Verdict.OK
    assert a.check(admin, bearer(CLIENT)) is Verdict.UNAUTHORIZED  # a client key is not enough
    assert a.check(admin, []) is Verdict.UNAUTHORIZED
    assert a.check(a.need("GET", "/v1/models"), bearer(CLIENT)) is Verdict.OK
    assert a.check(a.need("GET", "/v1/models"), []) is Verdict.UNAUTHORIZED
    # observability stays open unless asked otherwise; /health always
    for path in ("/metrics", "/workers", "/dashboard/data", "/health", "/dashboard"):
        assert a.need("GET", path) is Need.NOTHING
    strict = access(api_keys=[CLIENT], admin_key=ADMIN, metrics_require_key=True)
    for path in ("/metrics", "/workers", "/dashboard/data"):
        need = strict.need("GET", path)
        assert strict.check(need, []) is Verdict.UNAUTHORIZED
        assert strict.check(need, bearer(CLIENT)) is Verdict.OK
        assert strict.check(need, bearer(ADMIN)) is Verdict.OK
    assert strict.need("GET", "/health") is Need.NOTHING


def test_client_keys_without_an_admin_key_switch_membership_changes_off():
    a = access(api_keys=[CLIENT])
    assert a.check(Need.ADMIN, bearer(CLIENT)) is Verdict.FORBIDDEN
    only_admin = access(admin_key=ADMIN)  # clients unchecked, changes need the key
    assert only_admin.client_ok(None)
    assert only_admin.check(Need.CLIENT, []) is Verdict.OK
    assert only_admin.check(Need.ADMIN, []) is Verdict.UNAUTHORIZED


def test_keys_come_from_the_environment_and_are_never_shown(monkeypatch):
    monkeypatch.setenv("CACHE_ROUTER_API_KEYS", f"{CLIENT},{OTHER}")
    monkeypatch.setenv("CACHE_ROUTER_ADMIN_KEY", ADMIN)
    monkeypatch.setenv("CACHE_ROUTER_WORKER_API_KEY", "wk-5555")
    s = load_settings()
    a = Access(s)
    assert a.client_ok(b"Bearer " + OTHER.encode()) and a.admin_key == ADMIN.encode()
    for text in (repr(s), str(s), s.model_dump_json(), str(s.model_dump())):
        for key in (CLIENT, OTHER, ADMIN, "wk-5555"):
            assert key not in text
    with pytest.raises(ValueError, match="must not be empty"):
        load_settings(api_keys=[" "])


def test_router_enforces_keys_end_to_end(fake_workers, router_server, caplog):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], api_keys=[CLIENT, OTHER], admin_key=ADMIN)
    caplog.set_level(logging.DEBUG)
    url = router.url
    with httpx.Client(base_url=url, timeout=10) as c:
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": CLIENT}):
            r = c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user"}]}, headers=headers
            )
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        ok = c.post("/v1/completions", json=BODY, headers={"authorization": f"Bearer {OTHER}"})
        assert ok.status_code == 200
        assert c.get("/v1/models").status_code == 401
        assert c.get("/v1/models", headers={"authorization": f"Bearer {CLIENT}"}).status_code == 200
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200
        assert c.get("/workers").status_code == 200
        new = {"url": "http://127.0.0.1:9"}
        for headers in ({}, {"authorization": f"Bearer {CLIENT}"}, {"x-admin-key": "nope"}):
            r = c.post("/workers", json=new, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
        assert c.post("/workers", json=new, headers={"x-admin-key": ADMIN}).status_code == 201
        r = c.request("DELETE", "/workers", json=new, headers={"authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 200
    # the worker saw only the accepted request
    assert len(worker.requests) == 1
    # no key in any log line of the router (debug level included)
    for key in (CLIENT, OTHER, ADMIN):
        assert key not in caplog.text


def test_membership_changes_refused_with_client_keys_only(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], api_keys=[CLIENT])
    headers = {"authorization": f"Bearer {CLIENT}"}
    r = httpx.post(router.url + "/workers", json={"url": "http://127.0.0.1:9"}, headers=headers)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"


def test_metrics_require_key(fake_workers, router_server):
    (worker,) = fake_workers(1)
    router = router_server(workers=[worker.url], api_keys=[CLIENT], metrics_require_key=True)
    with httpx.Client(base_url=router.url, timeout=10) as c:
        for path in ("/metrics", "/workers"):
            assert c.get(path).status_code == 401
            assert c.get(path, headers={"authorization": f"Bearer {CLIENT}"}).status_code == 200
        assert c.get("/health").status_code == 200


def test_serve_process_never_prints_keys(fake_workers, tmp_path):
    """The real command with keys from flags and the environment, at debug level."""
    (worker,) = fake_workers(1)
    env = {**os.environ, "CACHE_ROUTER_ADMIN_KEY": ADMIN, "CACHE_ROUTER_API_KEYS": OTHER}
    out = subprocess.run(
        [sys.executable, "-m", "router.cli", "serve", "--worker", worker.url, "--api-key", CLIENT,
         "--port", "-1", "--log-level", "debug"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2  # invalid port: settings are printed in the error
    for key in (CLIENT, OTHER, ADMIN):
        assert key not in out.stderr + out.stdout
