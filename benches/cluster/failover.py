#!/usr/bin/env python3
"""Unavailability after a leader kill, measured from outside on a local 3-node cluster.

Starts `sheetd cluster up` (the binary given), then N times: finds the leader, SIGKILLs it,
and times until a survivor acknowledges a write (a single-row bulkAdd sent round-robin to
the survivors, each attempt under its own Idempotency-Key); restarts the killed node with the
same flags and waits until it has caught up. Prints each kill's time and the median and max.

    python3 benches/cluster/failover.py target/release/sheetd [kills=20]
"""
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time, urllib.request, uuid

BIN = sys.argv[1]
KILLS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
PORT, ADMIN, RAFT = 28080, 28081, 29101


def call(method, url, token, body=None, idem=None, timeout=2):
    req = urllib.request.Request(url, method=method, data=body and json.dumps(body).encode())
    req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if idem:
        req.add_header("Idempotency-Key", idem)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, json.loads(res.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except Exception:
        return None, None


def main():
    d = tempfile.mkdtemp(prefix="sheetd-failover-")
    up = subprocess.Popen([BIN, "cluster", "up", "--nodes", "3", "--data-dir", d, "--port", str(PORT),
                           "--admin-port", str(ADMIN), "--raft-port", str(RAFT)],
                          stdout=subprocess.PIPE, text=True)
    token = key = None
    while key is None:
        line = up.stdout.readline()
        if line.startswith("Admin token:"):
            token = line.split()[-1]
        if " ada-write " in line:
            key = line.split()[-1]
    admin = lambda i: f"http://127.0.0.{i}:{ADMIN}/admin/v1"
    api = lambda i: f"http://127.0.0.{i}:{PORT}/api/v1"
    # The children of `cluster up`, by node id, from their command lines.
    def pids():
        out = {}
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if b"serve" in cmd and b"--node-id" in cmd and d.encode() in b" ".join(cmd):
                    out[int(cmd[cmd.index(b"--node-id") + 1])] = (int(p), [c.decode() for c in cmd if c])
        return out
    def leader():
        while True:
            for i in (1, 2, 3):
                s, h = call("GET", f"{admin(i)}/health", token, timeout=0.5)
                if s == 200 and h.get("cluster", {}).get("serving"):
                    return i
            time.sleep(0.02)
    times = []
    for k in range(KILLS):
        at = leader()
        pid, cmd = pids()[at]
        survivors = [i for i in (1, 2, 3) if i != at]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        n = 0
        while True:
            i = survivors[n % 2]
            s, _ = call("POST", f"{api(i)}/sheets/10/rows:bulkAdd", key,
                        {"rows": [{"cells": {"100": f"failover {k}"}}]}, idem=str(uuid.uuid4()), timeout=1)
            n += 1
            if s == 200:
                break
            time.sleep(0.005)
        took = time.monotonic() - killed
        times.append(took)
        print(f"kill {k + 1}: node {at}, first acknowledged write after {took * 1000:.0f} ms", flush=True)
        log = open(os.path.join(d, f"node{at}.log"), "a")
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        time.sleep(1.5)
    print(f"median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {len(times)} kills")
    up.send_signal(signal.SIGTERM)
    up.wait(timeout=30)
    for pid, _ in pids().values():
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
