"""`python -m vlservice bench --replicas`: what session affinity and the shared Redis tier save.

Two replicas of the real server (Gunicorn, the real-size random-weight checkpoint) run behind a
real nginx with the shipped deploy/nginx template, as compose.scale.yaml runs them; the replicas
share no disk tier (`VL_DISK_CACHE_MB=0`). The run is made twice: the replicas without Redis, then
with a real redis-server (`VL_REDIS_URL`). Every round takes a new photo and a session that nginx
hashes onto one replica (found by asking: `/healthz` answers with `X-Served-By`), asks a first
question there, then measures first tokens through nginx:

- the follow-up (the first question, its answer and a new question) on the session's own replica
  (the conversation's KV cache is there) and on the other replica (a session hashed onto the other
  one: what a follow-up costs without affinity, or when its replica is gone);
- a second question about the same photo in a new conversation, on the own and on the other replica.

The result cache is off for every measured request (an identical greedy request would be answered
from it), so each number is the work a replica does. Reported: medians of first token (at the
client, through nginx), the replica's vision-encode and prompt times, and the tokens it took from
its KV cache, and the time it spent looking up vision features (memory, then Redis).
Every output names the CPU and the bandwidth measured in the same run.

Needs Debian's `redis-server` and `nginx` (apt-get install redis-server nginx).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

FIRST, FOLLOW, SECOND = "Describe this image.", "What colours does it have?", "What is in the picture?"
CASES = (  # (key, what it is)
    ("follow_up_own", "follow-up, on the session's replica (affinity)"),
    ("follow_up_other", "follow-up, on the other replica"),
    ("second_question_own", "same photo, new question, on the replica that saw it"),
    ("second_question_other", "same photo, new question, on the other replica"),
)


def ask(url: str, messages: list, session: str, tokens: int) -> dict:
    """One streamed greedy request through nginx: first token at the client, the replica that
    served it, its timings and the text."""
    import requests

    from .harness import sse_chunks

    body = {"model": "x", "messages": messages, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": tokens, "min_tokens": tokens, "temperature": 0, "result_cache": False}
    t0 = time.perf_counter()
    first, text, timings = None, [], {}
    with requests.post(url + "/v1/chat/completions", json=body, headers={"X-Session-Id": session},
                       stream=True, timeout=3600) as r:
        served_by = r.headers.get("X-Served-By")
        for chunk in sse_chunks(r):
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter() - t0
                text.append(chunk["choices"][0]["delta"]["content"])
            timings = chunk.get("timings") or timings
    return {"ttft_s": first, "served_by": served_by, "text": "".join(text),
            "cache_lookup_ms": timings.get("cache_lookup_ms", 0.0),
            "vision_encode_ms": timings.get("vision_encode_ms", 0.0), "prompt_ms": timings.get("prompt_ms", 0.0),
            "cache_n": timings.get("cache_n", 0)}


def sessions_by_replica(url: str, names: tuple, want: int) -> dict[str, list[str]]:
    """Session ids by the replica nginx hashes them onto, `want` each."""
    import requests

    found: dict[str, list[str]] = {n: [] for n in names}
    for i in range(1000):
        sid = f"bench-{i}"
        served = requests.get(url + "/healthz", headers={"X-Session-Id": sid}, timeout=10).headers["X-Served-By"]
        if len(found[served]) < want:
            found[served].append(sid)
        if all(len(v) >= want for v in found.values()):
            return found
    raise RuntimeError(f"nginx did not spread 1000 sessions over both replicas: {found}")


def image_part(jpeg: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()}}


def one_round(url: str, photos: tuple, own: str, other: str, tokens: int) -> dict:
    """First questions on `own`'s replica, then the four measured requests: the follow-ups about one
    photo, the second questions about another (a request on the other replica leaves that photo's
    features there, which would help the next request about it)."""
    def first(photo, question):
        return [{"role": "user", "content": [image_part(photo), {"type": "text", "text": question}]}]

    out = {"first": ask(url, first(photos[0], FIRST), own, tokens)}
    follow = first(photos[0], FIRST) + [{"role": "assistant", "content": out["first"]["text"]},
                                        {"role": "user", "content": FOLLOW}]
    # the other replica first: it must not be helped by what the own replica does next
    out["follow_up_other"] = ask(url, follow, other, 2)
    out["follow_up_own"] = ask(url, follow, own, 2)
    out["first_b"] = ask(url, first(photos[1], FIRST), own, tokens)
    out["second_question_other"] = ask(url, first(photos[1], SECOND), other, 2)
    out["second_question_own"] = ask(url, first(photos[1], SECOND), own, 2)
    return out


def measure_config(model_dir: Path, work: Path, redis_url: str | None, args) -> dict:
    from .harness import Server
    from .services import NginxProcess

    env = {"VL_MODEL": str(model_dir), "VL_LLM_QUANT": "" if args.llm == "float32" else args.llm,
           "VL_DISK_CACHE_MB": "0", "VL_QUEUE_TIMEOUT_S": "3600"}
    if redis_url:
        env["VL_REDIS_URL"] = redis_url
    label = "redis" if redis_url else "no-redis"
    replicas = {}
    try:
        for name in ("a", "b"):  # one after the other: two model loads at once would double the peak
            replicas[name] = Server({**env, "VL_REPLICA_NAME": name}, args.out / f"server-{label}-{name}.log")
            replicas[name].wait_ready()
        with NginxProcess(work / f"nginx-{label}", [f"127.0.0.1:{replicas[n].port}" for n in ("a", "b")]) as nginx:
            ids = sessions_by_replica(nginx.url, ("a", "b"), args.runs)
            rounds = []
            for i in range(args.runs + 1):  # the first round warms both replicas up and is not counted
                own_name = "ab"[i % 2]
                own, other = ids[own_name][i % args.runs], ids["ab"[1 - i % 2]][i % args.runs]
                seed = 5000 + 2 * i + (100 if redis_url else 0)  # new photos: nothing cached anywhere
                r = one_round(nginx.url, (photo_bytes(args, seed), photo_bytes(args, seed + 1)), own, other, args.tokens)
                served = {k: v["served_by"] for k, v in r.items()}
                expect = {"first": own_name, "first_b": own_name, "follow_up_own": own_name, "second_question_own": own_name,
                          "follow_up_other": "ab"[1 - i % 2], "second_question_other": "ab"[1 - i % 2]}
                if served != expect:
                    raise RuntimeError(f"nginx sent requests elsewhere than their sessions hash to: {served} vs {expect}")
                if i:
                    rounds.append(r)
                log.info("%s round %d: %s", label, i, {k: round(v["ttft_s"], 2) for k, v in r.items()})
    finally:
        for server in replicas.values():
            server.stop()
    return {key: {f: round(statistics.median(r[key][f] for r in rounds), 3 if f == "ttft_s" else 1)
                  for f in ("ttft_s", "cache_lookup_ms", "vision_encode_ms", "prompt_ms", "cache_n")} for key, _ in CASES}


def photo_bytes(args, seed: int) -> bytes:
    from .workloads import encode_jpeg, photo_like

    return encode_jpeg(photo_like(*((112, 112) if args.quick else (448, 448)), seed=seed))


def markdown(report: dict) -> str:
    from .harness import md_table

    cpu = report["cpu"]
    lines = [f"*{cpu['model']} ({', '.join(cpu['flags']) or 'no AVX-512'}), {cpu['threads']} threads per replica, "
             f"{report['limits']['bandwidth_gb_s']} GB/s measured in this run; {report['llm']} LLM; two replicas "
             f"behind nginx (deploy/nginx), medians of {report['runs']} rounds, two new {report['photo']} photos each.*", "",
             *md_table(["request", "Redis", "first token s", "feature lookup ms", "vision encode ms", "prompt ms",
                        "tokens from KV cache"],
                       [[what, "yes" if label == "redis" else "no", f"{row['ttft_s']:.2f}",
                         f"{row['cache_lookup_ms']:.1f}", f"{row['vision_encode_ms']:.0f}", f"{row['prompt_ms']:.0f}",
                         f"{row['cache_n']:.0f}"]
                        for key, what in CASES for label in ("no-redis", "redis")
                        for row in [report["configs"][label][key]]])]
    c = report["configs"]

    def ratio(num: tuple, den: tuple) -> float:
        return c[num[0]][num[1]]["ttft_s"] / c[den[0]][den[1]]["ttft_s"]

    lines += ["", f"- Affinity: a follow-up on its own replica starts "
              f"{ratio(('no-redis', 'follow_up_other'), ('no-redis', 'follow_up_own')):.1f}x sooner than on the other "
              f"one without Redis, {ratio(('redis', 'follow_up_other'), ('redis', 'follow_up_own')):.1f}x with it.",
              "- Redis: a second question about the same photo on the other replica starts "
              f"{ratio(('no-redis', 'second_question_other'), ('redis', 'second_question_other')):.1f}x sooner with "
              "Redis (its vision features come from Redis; without, the photo is encoded again)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from .harness import start_report
    from .services import RedisProcess

    ap = argparse.ArgumentParser(prog="python -m vlservice bench --replicas", description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm", default="float32", help="float32 (the default LLM) or int8")
    ap.add_argument("--runs", type=int, default=3, help="measured rounds per configuration")
    ap.add_argument("--tokens", type=int, default=16, help="the first answer's length (the follow-up's history)")
    ap.add_argument("--quick", action="store_true", help="the same code on a tiny checkpoint")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    missing = [b for b in ("redis-server", "nginx") if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())]
    if missing:
        print(f"bench --replicas needs {' and '.join(missing)}: apt-get install redis-server nginx")
        return 2
    _, model_dir, report = start_report(args)
    size = "112x112" if args.quick else "448x448"
    report.update({"llm": args.llm, "runs": args.runs, "photo": size, "configs": {}})
    with tempfile.TemporaryDirectory(prefix="vl-replicas-") as tmp:
        work = Path(tmp)
        report["configs"]["no-redis"] = measure_config(model_dir, work, None, args)
        with RedisProcess(work) as redis_proc:
            report["configs"]["redis"] = measure_config(model_dir, work, redis_proc.url, args)
    (args.out / "replicas.json").write_text(json.dumps(report, indent=2))
    (args.out / "replicas.md").write_text(markdown(report))
    print((args.out / "replicas.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
