"""`compare --a/--b KEY=VALUE` reads its settings through the settings' own parser: `false` is
False (it used to be `bool("false")`, True), and an unknown key or a bad value stops the command
with exit 2 and a message naming it, before any model loads."""

from __future__ import annotations

import pytest

from vlservice.tools import compare


def test_overrides_are_typed_like_the_environment(monkeypatch):
    monkeypatch.setenv("VL_QUEUE_SIZE", "5")
    s = compare.configuration(["warmup=false", "VL_MALLOC_TRIM=off", "vision_backend=torch", "max_aspect_ratio=9"])
    assert (s.warmup, s.malloc_trim, s.vision_backend, s.max_aspect_ratio) == (False, False, "torch", 9.0)
    assert s.queue_size == 5  # the environment's, under the overrides
    # caches that would let B reuse A's work are off, unless asked for
    assert (s.disk_cache_mb, s.result_cache_entries, s.kv_cache_mb) == (0, 0, 0)
    assert compare.configuration(["kv_cache_mb=64"]).kv_cache_mb == 64


@pytest.mark.parametrize("side, pair, message", [
    ("--a", "vision_backed=torch", "unknown setting 'vision_backed'"),
    ("--b", "warmup=perhaps", "VL_WARMUP must be one of"),
    ("--b", "llm_quant=int3", "VL_LLM_QUANT must be empty, int8 or int4"),
    ("--a", "threads", "expected KEY=VALUE"),
])
def test_bad_configurations_exit_2_before_loading(tmp_path, capsys, side, pair, message):
    (tmp_path / "x.png").write_bytes(b"not read: the command stops first")
    with pytest.raises(SystemExit) as info:
        compare.main(["--images", str(tmp_path), side, pair])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
