"""Tenants without a server: API keys named and unnamed, and the fair share of the server's
places (waiting or running) a tenant may hold while others are active."""

from __future__ import annotations

from vlservice.config import Settings
from vlservice.engine.batching import tenants as tenants_module
from vlservice.engine.batching.tenants import TenantShares
from vlservice.http.auth import tenant_keys


def test_keys_name_their_tenants():
    assert tenant_keys(Settings(api_key="k1")) == {"k1": "default"}
    assert tenant_keys(Settings(api_key="k1, k2")) == {"k1": "key1", "k2": "key2"}
    assert tenant_keys(Settings(api_key="k0", api_keys="alice:ka,bob:kb:with:colons")) == {
        "k0": "default", "ka": "alice", "kb:with:colons": "bob"}
    assert Settings(api_keys="alice:ka").auth and not Settings().auth


def test_alone_a_tenant_takes_every_place_and_others_get_their_share(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(tenants_module.time, "monotonic", lambda: clock[0])
    shares = TenantShares(places=4, window_s=60)
    assert [shares.enter("a") for _ in range(5)] == [4, 4, 4, 4, None]  # the fifth: a holds them all
    assert shares.enter("b") == 2  # b is active now: a's share is 2 ...
    shares.leave("a")
    assert shares.enter("a") is None  # ... so a cannot refill the place it freed while it holds 3
    for _ in range(2):
        shares.leave("a")
    assert shares.enter("a") == 2  # at 1 of its 2
    assert shares.in_flight() == {"a": 2, "b": 1}
    shares.leave("b")
    clock[0] = 61.0  # b idle for longer than the window: a alone again
    assert shares.enter("a") == 4
