"""The SandboxFusion backend against a small real server on 127.0.0.1 that speaks the same API
(/run_code, /submit with CommonOJDataset) and really runs the code (in subprocesses)."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fastcrit.sandbox import Job, RemoteSandbox, SandboxConfig, make_pool
from fastcrit.sandbox.compare import stdout_matches
from fastcrit.sandbox.pool import new_event_loop


def _run(code, stdin, timeout):
    try:
        p = subprocess.run(
            [sys.executable, "-I", "-c", code], input=stdin, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {
            "status": "TimeLimitExceeded",
            "execution_time": timeout,
            "return_code": None,
            "stdout": "",
            "stderr": "",
        }
    return {
        "status": "Finished",
        "execution_time": 0.0,
        "return_code": p.returncode,
        "stdout": p.stdout,
        "stderr": p.stderr,
    }


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fail_first=0):
        super().__init__(("127.0.0.1", 0), Handler)
        self.fail_first = fail_first
        self.lock = threading.Lock()
        self.requests = 0
        self.active = 0
        self.max_active = 0


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _answer(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        srv = self.server
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.requests += 1
            n = srv.requests
            srv.active += 1
            srv.max_active = max(srv.max_active, srv.active)
        code, answer = self._handle(req, n)
        with srv.lock:  # before answering: the client may send its next request at once
            srv.active -= 1
        self._answer(code, answer)

    def _handle(self, req, n):
        srv = self.server
        if n <= srv.fail_first:
            return 503, {"detail": "busy"}
        time.sleep(0.02)  # let concurrent requests overlap
        if self.path == "/run_code":
            if req.get("language") != "python":
                return 200, {"status": "SandboxError", "message": "language"}
            rr = _run(req["code"], req.get("stdin", ""), req["run_timeout"])
            ok = rr["status"] == "Finished" and rr["return_code"] == 0
            return 200, {"status": "Success" if ok else "Failed", "message": "", "run_result": rr}
        if self.path == "/submit":
            cfg = req["config"]
            assert cfg["dataset_type"] == "CommonOJDataset"
            code = req["completion"].split("```python\n", 1)[1].rsplit("```", 1)[0]
            tests, accepted = [], True
            for t in cfg["provided_data"]["test"]:
                if not accepted and not cfg.get("extra", {}).get("run_all_cases", True):
                    break
                rr = _run(code, t["input"]["stdin"], cfg["run_timeout"])
                passed = (
                    rr["status"] == "Finished"
                    and rr["return_code"] == 0
                    and stdout_matches(rr["stdout"], t["output"]["stdout"])
                )
                accepted &= passed
                tests.append({"passed": passed, "exec_info": {"status": "Success", "run_result": rr}})
            return 200, {"id": req["id"], "accepted": accepted, "tests": tests}
        return 404, {"detail": "not found"}


@pytest.fixture
def server():
    srv = Server()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def run(coro):
    loop = new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


JOBS = [
    Job(code="def f(x):\n    return x * 2\n", kind="assert", tests=["assert f(2) == 4", "assert f(3) == 7"], id="a"),
    Job(code="print(int(input()) + 1)\n", kind="stdio", tests=[["1\n", "2\n"], ["5\n", "7\n"]], id="s"),
    Job(
        code="def g(a, b):\n    return [a, b / 2]\n",
        kind="call",
        tests=[[[1, 3], [1, 1.5]], [[1, 3], [1, 2]]],
        entry_point="g",
        id="c",
    ),
    Job(code="import os\nos._exit(0)\n", kind="call", tests=[[[1], 1]], entry_point="f", id="exit"),
    Job(code="while True: pass\n", kind="assert", tests=["pass"], timeout_s=0.5, id="t"),
]


def test_remote_backend_results(server):
    cfg = SandboxConfig(backend="remote", remote_url=f"http://127.0.0.1:{server.server_port}", remote_concurrency=3)

    async def go():
        async with make_pool(cfg) as pool:
            assert isinstance(pool, RemoteSandbox)
            return await pool.run_many(JOBS)

    res = {r.id: r for r in run(go())}
    assert [t.status for t in res["a"].tests] == ["passed", "failed"]
    assert [t.status for t in res["s"].tests] == ["passed", "failed"]
    assert [t.status for t in res["c"].tests] == ["passed", "failed"]
    assert res["exit"].passed == 0 and res["exit"].status == "error"
    assert res["t"].status == "timeout"


def test_remote_retries_and_concurrency_cap(server):
    server.fail_first = 4
    url = f"http://127.0.0.1:{server.server_port}"
    jobs = [Job(code=f"print({i})", kind="stdio", tests=[["", f"{i}\n"]], id=i) for i in range(12)]

    async def go():
        async with RemoteSandbox(SandboxConfig(backend="remote"), url=url, concurrency=2, retries=5) as pool:
            res = await pool.run_many(jobs)
            return res, pool.stats()

    res, stats = run(go())
    assert all(r.all_passed for r in res), [(r.id, r.message) for r in res if not r.all_passed]
    assert stats["retried"] >= 4 and server.requests == 12 + 4
    assert server.max_active <= 2 and stats["max_in_flight"] <= 2


def test_remote_gives_up_with_an_error_not_a_pass():
    # nothing listens on this port: every attempt fails, the result is an error naming the endpoint
    async def go():
        async with RemoteSandbox(SandboxConfig(backend="remote"), url="http://127.0.0.1:9", retries=1) as pool:
            return await pool.run(JOBS[0])

    r = run(go())
    assert r.passed == 0 and r.status == "error" and "/run_code failed after 2 attempts" in r.message


def test_remote_return_values_are_results(server):
    """A value nested past the client's stack, a float against an int beyond the float range:
    each is a verdict from run(), not an exception."""
    cfg = SandboxConfig(backend="remote", remote_url=f"http://127.0.0.1:{server.server_port}")
    nested = "def f():\n    v = 1\n    for _ in range(990):\n        v = [v]\n    return v\n"
    jobs = [
        Job(code=nested, kind="call", tests=[[[], [1]]], entry_point="f", id="deep"),
        Job(code="def f():\n    return 1e308\n", kind="call", tests=[[[], 10**400]], entry_point="f", id="big"),
        Job(code="def f():\n    return 8 / 2\n", kind="call", tests=[[[], 4]], entry_point="f", id="float"),
    ]

    async def go():
        async with make_pool(cfg) as pool:
            return [await pool.run(j) for j in jobs]

    deep, big, flt = run(go())
    assert deep.status == "error" and deep.tests[0].message == "unparseable return value"
    assert big.status == "failed" and flt.status == "failed"


def test_remote_empty_assert_test_is_an_error(server):
    """As with the local judge: a test with no statement checks nothing, so it never passes."""
    cfg = SandboxConfig(backend="remote", remote_url=f"http://127.0.0.1:{server.server_port}")
    job = Job(code="def f():\n    return 0\n", kind="assert", tests=["# nothing\n", "assert f() == 0"], id="e")

    async def go():
        async with make_pool(cfg) as pool:
            return await pool.run(job)

    r = run(go())
    assert [t.status for t in r.tests] == ["error", "passed"] and "empty" in r.tests[0].message
