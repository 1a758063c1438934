#!/usr/bin/env python3
"""Deterministic serving, checked end to end: N requests sent at once to a running `moesq serve`
(half streamed, mixed greedy and seeded sampling, different prompt and output lengths) must return
exactly the token ids `moesq generate` produces for each request alone.

Usage: serve_determinism.py --url http://127.0.0.1:PORT --moesq BIN --model DIR --device cuda
           [--requests 64] [--vocab 256] [--seed 0]
Prints one line per mismatch and a summary; exit 1 on any mismatch or failed request.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import urllib.request


def request(url, body, stream):
    body = dict(body, stream=stream, return_token_ids=True)
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        if not stream:
            return json.load(r)["choices"][0]["token_ids"]
        ids = []
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return ids
            ev = json.loads(data)
            for c in ev.get("choices", []):
                ids.extend(c.get("token_ids") or [])
        raise RuntimeError("stream ended without [DONE]")


def offline(args, body):
    with tempfile.NamedTemporaryFile("w", suffix=".ids", delete=False) as f:
        f.write(" ".join(map(str, body["prompt"])))
        path = f.name
    cmd = [args.moesq, "generate", args.model, "--prompt-ids", path, "--max-new-tokens", str(body["max_tokens"]),
           "--temperature", str(body["temperature"]), "--top-p", str(body["top_p"]), "--seed", str(body["seed"]),
           "--device", args.device, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, MOESQ_QUIET="1"))
    os.unlink(path)
    if out.returncode != 0:
        raise RuntimeError("generate failed: " + out.stderr[-500:])
    return json.loads(out.stdout)["generated_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--moesq", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--offline", type=int, default=16, help="how many of the requests to check against generate")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    bodies = []
    for i in range(args.requests):
        greedy = i % 2 == 0
        bodies.append({"prompt": [rng.randrange(args.vocab) for _ in range(rng.randrange(4, 48))],
                       "max_tokens": rng.randrange(4, 40), "temperature": 0.0 if greedy else 0.8,
                       "top_p": 1.0 if greedy else 0.9, "seed": rng.randrange(1 << 30)})
    got = [None] * len(bodies)
    errors = []

    def run(i):
        try:
            got[i] = request(args.url, bodies[i], stream=i % 4 >= 2)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            errors.append(f"request {i}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Alone, through the server: the first requests again, one at a time.
    mism = 0
    for i in range(min(args.offline, len(bodies))):
        if got[i] is None:
            continue
        alone = request(args.url, bodies[i], stream=False)
        ref = offline(args, bodies[i])
        if got[i] != ref or alone != ref:
            mism += 1
            print(f"MISMATCH request {i}: concurrent {got[i][:8]}… alone {alone[:8]}… generate {ref[:8]}…")
    for e in errors[:8]:
        print("FAILED", e)
    print(f"serve determinism: {len(bodies)} concurrent requests, {len(errors)} failed, "
          f"{min(args.offline, len(bodies))} checked against generate and alone: {mism} mismatches")
    sys.exit(1 if errors or mism else 0)


if __name__ == "__main__":
    main()
