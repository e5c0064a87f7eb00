"""200 sequential requests against a real ``qkv explain RUN_DIR --serve`` process on loopback.

Prints the status codes, the server's resident memory before and after (after 10 warm-up
requests), the answer to an input over the cap, to a traversal attempt, and how Ctrl-C ends it.

Usage: python benchmarks/explain_soak.py RUN_DIR "input text" [PORT]   (default port 8791)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main(run: str, text: str, port: int = 8791) -> None:
    qkv = str(Path(sys.executable).with_name("qkv"))
    proc = subprocess.Popen([qkv, "explain", run, "--serve", "--port", str(port)], stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/api/info", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    info = httpx.get(base + "/api/info").json()
    kind = info["kinds"][-1]
    with httpx.Client(base_url=base, timeout=60) as client:
        for i in range(10):
            client.post("/api/explain", json={"text": text, "seed": i})
        before, start, codes = rss_mib(proc.pid), time.perf_counter(), []
        for i in range(200):  # alternate explain and the step-through of every layer/head
            if i % 2:
                res = client.post("/api/explain", json={"text": text, "seed": i})
            else:
                res = client.post(
                    "/api/steps",
                    json={
                        "text": text,
                        "seed": i,
                        "kind": kind,
                        "layer": i % info["n_layers"],
                        "head": (i // 2) % info["n_heads"],
                    },
                )
            codes.append(res.status_code)
        seconds, after = time.perf_counter() - start, rss_mib(proc.pid)
        too_long = client.post("/api/explain", json={"text": "A" * (info["max_chars"] + 1)})
        traversal = client.get("/static/%2e%2e/server.py")
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=30)[1].decode().strip().splitlines()
    print(
        f"{run}: {codes.count(200)}/200 OK in {seconds:.1f} s ({1000 * seconds / 200:.0f} ms/request); "
        f"RSS {before:.0f} -> {after:.0f} MiB ({after - before:+.1f}); over the cap -> "
        f"{too_long.status_code} {too_long.json()['detail']!r}; traversal -> {traversal.status_code}; "
        f"Ctrl-C -> exit {proc.returncode}, {err[-1]!r}"
    )


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.splitlines()[-1])
    main(sys.argv[1], sys.argv[2], *(int(p) for p in sys.argv[3:]))
