"""Settings from text: the environment and tools' `KEY=VALUE` overrides go through one parser, and
a value that is not what its field needs is an error naming the variable, never a quiet default."""

from __future__ import annotations

import psutil
import pytest

from vlservice.config import Settings


@pytest.mark.parametrize("raw", ["false", "0", "no", "off", "FALSE", " Off ", "No"])
def test_false_words_are_false(raw):
    assert Settings.from_env(env={"VL_WARMUP": raw}).warmup is False


@pytest.mark.parametrize("raw", ["1", "true", "yes", "on", "TRUE", " Yes "])
def test_true_words_are_true(raw):
    assert Settings.from_env(env={"VL_MALLOC_TRIM": raw, "VL_WARMUP": "off"}).malloc_trim is True


@pytest.mark.parametrize("raw", ["flase", "2", "y", "enabled", "-"])
def test_any_other_switch_is_an_error_naming_the_variable(raw):
    with pytest.raises(ValueError, match="VL_WARMUP") as info:
        Settings.from_env(env={"VL_WARMUP": raw})
    assert repr(raw) in str(info.value)


@pytest.mark.parametrize("name, raw, value", [
    ("VL_QUEUE_SIZE", "3", 3), ("VL_QUEUE_SIZE", " 12 ", 12), ("VL_KV_CACHE_MB", "0", 0),
    ("VL_QUEUE_TIMEOUT_S", "2.5", 2.5), ("VL_MAX_ASPECT_RATIO", "50", 50.0),
    ("VL_VISION_BACKEND", "torch", "torch"), ("VL_API_KEY", "a,b", "a,b"),
    ("VL_GRACEFUL_TIMEOUT", "7", 7), ("VL_ACCESS_LOG", "/tmp/access.log", "/tmp/access.log"),
    ("VL_BIND", "127.0.0.1:9000", "127.0.0.1:9000"), ("VL_DEFER_START", "1", True),
])
def test_values_are_parsed_to_their_field_type(name, raw, value):
    got = getattr(Settings.from_env(env={name: raw}), name[3:].lower())
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("name, raw, kind", [
    ("VL_QUEUE_SIZE", "eight", "an integer"), ("VL_QUEUE_SIZE", "2.5", "an integer"),
    ("VL_WORKERS", "", None),  # empty means the default, not an error
    ("VL_QUEUE_TIMEOUT_S", "soon", "a number"), ("VL_QUEUE_TIMEOUT_S", "nan", "a number"),
    ("VL_MAX_ASPECT_RATIO", "inf", "a number"),
])
def test_bad_numbers_raise_naming_the_variable(name, raw, kind):
    if kind is None:
        assert Settings.from_env(env={name: raw}) == Settings.from_env(env={})
        return
    with pytest.raises(ValueError, match=f"{name} must be {kind}, got '{raw}'"):
        Settings.from_env(env={name: raw})


def test_empty_environment_gives_the_defaults():
    s = Settings.from_env(env={})
    assert (s.queue_size, s.warmup, s.bind, s.workers, s.http_threads, s.defer_start, s.access_log) == (
        8, True, "0.0.0.0:8000", 1, 16, False, "-")


@pytest.mark.parametrize("env, message", [
    ({"VL_VISION_BACKEND": "onnx"}, "VL_VISION_BACKEND must be one of onnx-int8, onnx-fp32, torch"),
    ({"VL_LLM_QUANT": "int3"}, "VL_LLM_QUANT must be empty, int8 or int4"),
    ({"VL_QUEUE_SIZE": "-1"}, "VL_QUEUE_SIZE must be >= 0, got -1"),
    ({"VL_QUEUE_TIMEOUT_S": "-0.5"}, "VL_QUEUE_TIMEOUT_S must be >= 0"),
    ({"VL_WORKERS": "0"}, "VL_WORKERS must be >= 1, got 0"),
    ({"VL_HTTP_THREADS": "0"}, "VL_HTTP_THREADS must be >= 1"),
    ({"VL_DEFAULT_MAX_TOKENS": "2000"}, "VL_DEFAULT_MAX_TOKENS must be between 1 and VL_MAX_TOKENS_CAP"),
    ({"VL_DEFAULT_MAX_TOKENS": "0"}, "VL_DEFAULT_MAX_TOKENS must be between 1"),
])
def test_validation_errors_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_env(env=env)


def test_overrides_win_over_the_environment_and_are_validated():
    assert Settings.from_env(env={"VL_QUEUE_SIZE": "3"}, queue_size=5).queue_size == 5
    with pytest.raises(ValueError, match="VL_QUEUE_SIZE"):
        Settings.from_env(env={}, queue_size=-2)


def test_threads_are_split_between_workers():
    cores = psutil.cpu_count(logical=False) or psutil.cpu_count()
    assert Settings(threads=3, workers=2).num_threads == 3  # set explicitly: taken as is
    assert Settings(workers=1).num_threads == cores
    assert Settings(workers=2).num_threads == max(1, cores // 2)
    assert Settings(workers=cores * 4).num_threads == 1  # never zero


def test_detail_pixels_are_the_budget_of_each_detail_level():
    s = Settings.from_env(env={"VL_DETAIL_LOW_PIXELS": "1000", "VL_DETAIL_HIGH_PIXELS": "9000"})
    assert (s.detail_pixels("low"), s.detail_pixels("auto"), s.detail_pixels("high")) == (1000, 768 * 32 * 32, 9000)
    with pytest.raises(KeyError):
        s.detail_pixels("ultra")


@pytest.mark.parametrize("pairs, expected", [
    (["warmup=false"], {"warmup": False}),  # not bool("false") == True
    (["VL_WARMUP=off", "queue_size=3"], {"warmup": False, "queue_size": 3}),
    (["Vision_Backend=torch"], {"vision_backend": "torch"}),
    (["queue_timeout_s=1.5", "api_key=a=b"], {"queue_timeout_s": 1.5, "api_key": "a=b"}),
    ([], {}),
])
def test_overrides_are_parsed_like_the_environment(pairs, expected):
    assert Settings.parse_overrides(pairs) == expected


@pytest.mark.parametrize("pairs, message", [
    (["warmpu=false"], "unknown setting 'warmpu'"),
    (["warmup"], "expected KEY=VALUE"),
    (["=1"], "expected KEY=VALUE"),
    (["warmup=maybe"], "VL_WARMUP must be one of"),
    (["queue_size=many"], "VL_QUEUE_SIZE must be an integer"),
])
def test_bad_overrides_are_errors(pairs, message):
    with pytest.raises(ValueError, match=message):
        Settings.parse_overrides(pairs)
