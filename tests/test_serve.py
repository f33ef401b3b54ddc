"""`translate serve`: through a real HTTP client against a real listening socket, and in process
(create_app over an engine, or over a stub of one, through Starlette's TestClient)."""

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.conftest import FIXTURES, run_cli
from translate.batcher import QueueFull
from translate.engine import Engine
from translate.errors import UserError
from translate.options import SearchOptions, ServingLimits

pytest.importorskip("starlette", reason="translate serve needs the [serve] extra (starlette, uvicorn)")
pytest.importorskip("uvicorn", reason="translate serve needs the [serve] extra (starlette, uvicorn)")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx (the [dev] extra)")
from starlette.testclient import TestClient  # noqa: E402

from translate.pool import DecodingFailed  # noqa: E402
from translate.serve import create_app, listen, parse_request, translate_request  # noqa: E402

SENTENCES = (FIXTURES / "bible.test.en").read_text(encoding="utf-8").splitlines()


class Server:
    """`translate serve CKPT --port 0 ...` in a subprocess; its stderr is collected in `lines`."""

    def __init__(self, checkpoint, *options: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "translate", "serve", str(checkpoint), "--port", "0", *options],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if line.startswith("serving "):
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(timeout=120)
        found = [m for line in self.lines if (m := re.search(r"on (http://127\.0\.0\.1:\d+)", line))]
        if not found:  # not left running behind the failed test
            self.proc.kill()
            self.proc.wait(timeout=60)
        assert found, "the server did not start:\n" + "\n".join(self.lines)
        self.url = found[0].group(1)

    def post(self, body: bytes | str | dict, timeout: float = 300) -> tuple[int, str]:
        """(status, response body) of POST /translate (`timeout`: a bound for a hung server, not a
        speed: a loaded machine answers 200 requests of 16 threads slowly)."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        data = data.encode() if isinstance(data, str) else data
        request = urllib.request.Request(self.url + "/translate", data=data, method="POST")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=120) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def half_body(self, length: int, timeout: float) -> socket.socket:
        """A connection that has sent a POST /translate announcing `length` bytes and only the start of them."""
        host, port = self.url.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)), timeout=timeout)
        client.sendall(
            b"POST /translate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {length}\r\n\r\n".encode()
            + b'{"text": "In the'
        )
        return client

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


@pytest.fixture(scope="module")
def decoded(checkpoint, tmp_path_factory):
    """`translate decode` of the fixture sentences: what the server must answer."""
    src = tmp_path_factory.mktemp("serve") / "test.en"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = run_cli("decode", checkpoint, "-i", src).stdout.splitlines()
    assert len(out) == len(SENTENCES)
    return dict(zip(SENTENCES, out))


@pytest.fixture(scope="module")
def server(checkpoint):
    server = Server(checkpoint, "--max-texts", "8", "--max-request-bytes", "4096")
    yield server
    assert server.stop() == 0


def test_concurrent_requests_all_answered_as_decode_does(server, decoded):
    sentences = [SENTENCES[i % len(SENTENCES)] for i in range(200)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda s: server.post({"text": s}), sentences))
    assert all(status == 200 for status, _ in answers), answers
    assert [json.loads(body)["translation"] for _, body in answers] == [decoded[s] for s in sentences]
    status, body = server.get("/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


def test_concurrent_requests_with_other_options_get_what_decode_gives_them(server, decoded, checkpoint, tmp_path):
    """Requests of several search options at once, each joining its own running search (greedy
    ones decoded at once): every answer is `translate decode`'s with the same --beam."""
    src = tmp_path / "test.en"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    expected = {None: decoded}
    for beam in (1, 2):
        out = run_cli("decode", checkpoint, "-i", src, "--beam", str(beam)).stdout.splitlines()
        expected[beam] = dict(zip(SENTENCES, out, strict=True))
    asks = [(SENTENCES[i % len(SENTENCES)], (None, 1, 2)[i % 3]) for i in range(90)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda a: server.post({"text": a[0]} | ({"beam_size": a[1]} if a[1] else {})), asks))
    assert all(status == 200 for status, _ in answers), answers
    assert [json.loads(body)["translation"] for _, body in answers] == [expected[beam][s] for s, beam in asks]


def test_texts_keep_their_order_and_nbest_gives_lists(server, decoded):
    texts = SENTENCES[:5] + [""]
    status, body = server.post({"texts": texts})
    assert status == 200
    assert json.loads(body) == {"translations": [decoded[s] for s in SENTENCES[:5]] + [""]}
    status, body = server.post({"texts": SENTENCES[:3], "nbest": 2, "beam_size": 3})
    answer = json.loads(body)
    assert status == 200 and [len(n) for n in answer["translations"]] == [2, 2, 2]
    assert [n[0] for n in answer["translations"]] == [decoded[s] for s in SENTENCES[:3]]  # the config's beam is 3
    assert all(a >= b for scores in answer["scores"] for a, b in zip(scores, scores[1:]))
    status, body = server.post({"text": SENTENCES[0], "beam_size": 1})
    assert status == 200 and isinstance(json.loads(body)["translation"], str)


@pytest.mark.parametrize(
    "body, status",
    [
        (b"{not json", 400),
        (b"", 400),
        (b"\xff\xfe", 400),
        (b"[1, 2]", 400),
        ({"text": 3}, 400),
        ({"texts": "one"}, 400),
        ({"texts": ["a", 1]}, 400),
        ({"text": "a", "texts": ["b"]}, 400),
        ({"sentence": "a"}, 400),
        ({"text": "a", "beam_size": 0}, 400),
        ({"text": "a", "beam_size": True}, 400),
        ({"text": "a", "nbest": 4, "beam_size": 2}, 400),
        ({"text": "a", "length_penalty": "x"}, 400),
        ({"texts": ["a"] * 9}, 413),
        ({"text": "a" * 5000}, 413),
    ],
)
def test_bad_requests_get_one_line_and_the_server_goes_on(server, decoded, body, status):
    got, text = server.post(body)
    assert got == status
    assert "\n" not in text.strip() and set(json.loads(text)) == {"error"} and json.loads(text)["error"]
    status, text = server.post({"text": SENTENCES[1]})
    assert status == 200 and json.loads(text) == {"translation": decoded[SENTENCES[1]]}


def test_a_client_gone_while_sending_its_body_is_499_not_a_server_fault(server):
    with server.half_body(1000, timeout=30):
        time.sleep(0.2)  # the server has begun reading the body
    deadline = time.monotonic() + 30
    while not any("POST /translate 499 ? texts 1000 bytes" in line for line in server.lines):
        assert time.monotonic() < deadline, "\n".join(server.lines)
        time.sleep(0.05)
    assert not any("POST /translate 500" in line for line in server.lines)


def test_a_body_that_stalls_is_408_and_holds_sigterm_no_longer(checkpoint):
    """A client that sends half its body and waits: 408 after --body-timeout-s, and a SIGTERM meanwhile
    exits once that is answered (the drain waited for it forever)."""
    server = Server(checkpoint, "--workers", "1", "--body-timeout-s", "3")
    with server.half_body(40, timeout=60) as client:
        time.sleep(0.5)  # the server has begun reading the body
        start = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        answer = b""
        while chunk := client.recv(4096):  # to the end: the server closes the connection it could not read
            answer += chunk
        answer = answer.decode()
        assert answer.startswith("HTTP/1.1 408") and "did not arrive within 3 s (--body-timeout-s)" in answer, answer
        assert server.proc.wait(timeout=60) == 0
    assert time.monotonic() - start < 30
    assert any("POST /translate 408 ? texts 40 bytes" in line for line in server.lines), server.lines


def test_unknown_path_and_method_are_json_errors(server):
    assert server.get("/nope")[0] == 404 and "error" in json.loads(server.get("/nope")[1])
    assert server.get("/translate")[0] == 405


def test_request_text_is_logged_only_when_asked(server):
    server.post({"text": "a secret sentence"})
    logged = [line for line in server.lines if line.startswith("POST /translate 200")]
    assert logged and re.search(r"1 texts \d+ bytes [\d.]+ ms", logged[-1])
    assert not any("secret" in line for line in server.lines)


def test_a_refused_request_is_logged_with_its_size_not_a_count_of_zero(caplog):
    client = client_of(StubEngine(), max_texts=2, max_request_bytes=200)
    with caplog.at_level("INFO", logger="translate"):
        client.post("/translate", content=b'{"texts": ["a", "b", "c"]}')
        client.post("/translate", content=b'{"text": "' + b"a" * 300 + b'"}')
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("POST /translate 413")]
    assert [re.sub(r" [\d.]+ ms$", "", line) for line in refused] == [
        "POST /translate 413 ? texts 26 bytes",
        "POST /translate 413 ? texts 312 bytes",
    ]


def test_overload_answers_503_and_spares_the_queued_request(checkpoint, decoded):
    # a batching window far longer than the test: the first request stays queued until SIGTERM drains it
    server = Server(checkpoint, "--max-queue", "2", "--batch-window-ms", "600000", "--log-text")  # --max-texts: 2 too
    try:
        assert server.post({"texts": ["a", "b", "c"]}) == (
            413,
            '{"error":"3 texts in one request; at most 2 (--max-texts)"}',
        )
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(server.post, {"texts": SENTENCES[:2]}, 180)
            while json.loads(server.get("/health")[1])["queued"] < 2 and not first.done():
                time.sleep(0.05)
            status, text = server.post({"text": SENTENCES[2]})
            assert status == 503 and "busy" in json.loads(text)["error"]
            assert server.stop() == 0
            status, text = first.result()
            assert status == 200 and json.loads(text) == {"translations": [decoded[s] for s in SENTENCES[:2]]}
        assert any(SENTENCES[0] in line for line in server.lines)  # --log-text
    finally:
        assert server.stop() == 0


def test_sigterm_under_load_answers_every_accepted_request(checkpoint, decoded):
    server = Server(checkpoint, "--batch-window-ms", "50")
    answered = threading.Semaphore(0)
    statuses: list[int] = []
    wrong: list[str] = []

    def client(k: int) -> None:
        for i in range(1000):
            sentence = SENTENCES[(k + i) % len(SENTENCES)]
            try:
                status, body = server.post({"text": sentence})
            except (OSError, http.client.HTTPException):
                return  # not accepted: the server has stopped listening
            statuses.append(status)
            if status != 200 or json.loads(body)["translation"] != decoded[sentence]:
                wrong.append(body)
            answered.release()

    with ThreadPoolExecutor(16) as pool:
        for k in range(16):
            pool.submit(client, k)
        for _ in range(40):
            answered.acquire(timeout=60)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=120) == 0
    assert not wrong
    stopped = [line for line in server.lines if line.startswith("stopped: answered")]
    assert stopped and int(stopped[0].split()[2]) == len(statuses) >= 40


def test_without_the_extra_serve_says_what_to_install(checkpoint, tmp_path):
    (tmp_path / "uvicorn.py").write_text("raise ImportError('no uvicorn here')\n")
    result = run_cli("serve", checkpoint, check=False, env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.getcwd()}"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: translate serve needs starlette and uvicorn: pip install -e '.[serve]' in the project's checkout"
    ]


def test_port_in_use_is_one_line(checkpoint, server):
    port = server.url.rsplit(":", 1)[1]
    result = run_cli("serve", checkpoint, "--port", port, check=False)
    assert result.returncode == 2 and result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")


def test_accepted_connections_send_without_delay():
    """uvicorn serves `listen`'s socket through asyncio, which sets TCP_NODELAY only on TCP sockets
    that say so. Without it each response's body, written after its headers, waits for the
    client's delayed ACK of them (Nagle): about 40 ms a request."""
    import asyncio
    import socket

    from translate.serve import listen

    sock = listen("127.0.0.1", 0)

    async def accept_one() -> int:
        loop = asyncio.get_running_loop()
        nodelay = loop.create_future()

        class Accept(asyncio.Protocol):
            def connection_made(self, transport) -> None:
                nodelay.set_result(
                    transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                )
                transport.close()

        server = await loop.create_server(Accept, sock=sock)
        client = socket.create_connection(sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(nodelay, 30)
        finally:
            client.close()
            server.close()

    assert asyncio.run(accept_one())


def decoding_processes(pid: int) -> list[int]:
    """The server's decoding processes (multiprocessing's spawned children), from /proc."""
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            children += [int(c) for c in f.read().split()]
    return [c for c in children if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()]


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="finds the decoding processes in /proc")
def test_a_decoding_process_that_ends_spares_the_server(checkpoint, decoded):
    """On a CPU each decoding worker is a process: when one is killed, the server logs it and the
    other answers every request after it."""
    server = Server(checkpoint, "--workers", "2", "--device", "cpu")
    try:
        children = decoding_processes(server.proc.pid)
        assert len(children) == 2
        os.kill(children[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not any("decoding process" in line and "ended" in line for line in server.lines):
            assert time.monotonic() < deadline, "the server did not notice:\n" + "\n".join(server.lines)
            time.sleep(0.05)
        for sentence in SENTENCES[:6]:
            status, text = server.post({"text": sentence})
            assert status == 200 and json.loads(text) == {"translation": decoded[sentence]}
        assert server.get("/health")[0] == 200
        os.kill(children[1], signal.SIGKILL)  # none left: /health says so, for a load balancer
        while sum("decoding process" in line and "ended" in line for line in server.lines) < 2:
            assert time.monotonic() < deadline + 60, "the server did not notice:\n" + "\n".join(server.lines)
            time.sleep(0.05)
        status, body = server.get("/health")
        assert status == 503 and json.loads(body)["status"] == "unavailable"
        assert json.loads(body)["error"] == "no decoding process left"
        assert server.post({"text": SENTENCES[0]})[0] == 503
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("workers, format", [(1, "text"), (2, "text"), (2, "html")])  # threads; processes
def test_a_request_whose_client_hangs_up_is_dropped_not_decoded(checkpoint, workers, format):
    """A client that gives up while its sentences wait is logged 499 at once, and its sentences leave
    the queue: the requests ahead of it (one per worker) are answered after it, nothing left queued."""
    options = [
        "--workers",
        str(workers),
        "--device",
        "cpu",
        "--max-batch",
        "1",
        "--max-texts",
        "2000",
        "--max-queue",
        "5000",
    ]
    server = Server(checkpoint, *options)
    try:
        ahead = [
            threading.Thread(target=server.post, args=({"texts": SENTENCES * 50},), kwargs={"timeout": 600})
            for _ in range(workers)
        ]  # each taken whole into a search of its own worker, which then takes no more (--max-batch 1)
        for thread in ahead:
            thread.start()
            time.sleep(0.3)
        host, port = server.url.removeprefix("http://").split(":")
        client = http.client.HTTPConnection(host, int(port), timeout=0.5)
        body = {"texts": SENTENCES} if format == "text" else {"text": "<p>" + " ".join(SENTENCES), "format": format}
        client.request("POST", "/translate", json.dumps(body), {"Content-Type": "application/json"})
        with pytest.raises(TimeoutError):
            client.getresponse()
        client.close()  # gone while its sentences wait
        deadline = time.monotonic() + 30
        while json.loads(server.get("/health")[1])["queued"] or not any(" 499 " in line for line in server.lines):
            assert time.monotonic() < deadline, "the request's sentences stayed queued:\n" + "\n".join(server.lines)
            time.sleep(0.05)
        assert all(thread.is_alive() for thread in ahead)  # out of the queue while the requests ahead still run
        for thread in ahead:
            thread.join(timeout=600)
        log = [line for line in server.lines if "POST /translate" in line]
        assert [line.split()[2] for line in log] == ["499"] + ["200"] * workers, log
        assert f"499 {len(SENTENCES) if format == 'text' else 1} texts" in log[0]
        assert json.loads(server.get("/health")[1])["queued"] == 0
    finally:
        assert server.stop() == 0


# ---------------------------------------------------------------------------- in process: Starlette's TestClient


class StubEngine:
    """A TranslationEngine whose submit does what it is told: the HTTP layer's view of an engine."""

    def __init__(self, outcome: Exception | None = None) -> None:
        self.defaults, self.queued, self.unavailable, self.outcome = SearchOptions(beam_size=2), 0, None, outcome
        self.submitted: list[tuple[list[str], object]] = []  # (texts, glossary) of each submit

    def submit(self, texts: list[str], options: SearchOptions | None = None, glossary=None) -> Future:
        self.submitted.append((texts, glossary))
        if isinstance(self.outcome, QueueFull):
            raise self.outcome
        future: Future = Future()
        if self.outcome is not None:
            future.set_exception(self.outcome)
        else:
            future.set_result([[(f"{t} ({(options or self.defaults).beam_size})", -1.0)] for t in texts])
        return future


def test_in_process_paragraphs_documents_and_glossaries_reach_the_engine():
    engine = StubEngine()
    client = client_of(engine)
    assert client.post("/translate", json={"text": "One here. Two there."}).json() == {
        "translation": "One here. (2) Two there. (2)"
    }  # the sentences of a text submitted apart, joined with the space between them
    assert engine.submitted[-1][0] == ["One here.", "Two there."]
    assert client.post("/translate", json={"text": "One here. Two there.", "split": False}).json() == {
        "translation": "One here. Two there. (2)"
    }
    html = client.post("/translate", json={"text": "<p>Hello there.</p>", "format": "html"}).json()["translation"]
    assert html == "<p>Hello there. (2)</p>"
    client.post("/translate", json={"text": "The cat sleeps.", "glossary": {"cat": "chat"}})
    glossary = engine.submitted[-1][1]
    assert len(glossary) == 1 and [span.output for span in glossary.find("The cat sleeps.")] == ["chat"]
    for bad, field in (
        ({"format": "pdf"}, '"format"'),
        ({"glossary": ["cat"]}, '"glossary"'),
        ({"split": 1}, '"split"'),
    ):
        response = client.post("/translate", json={"text": "a", **bad})
        assert response.status_code == 400 and field in response.json()["error"]
    response = client.post("/translate", json={"text": "<p>a</p>", "format": "html", "beam_size": 2, "nbest": 2})
    assert response.status_code == 400 and "nbest" in response.json()["error"]
    response = client.post("/translate", json={"text": "# Hello there.", "format": "markdown", "nbest": 1})
    assert response.json() == {"translation": "# Hello there. (2)"}  # a document, not a list with a made-up score
    front = "\ufeff---\ntitle: Hello\n---\n\n# Hello there.\n"  # a byte order mark first, as decode reads a file
    response = client.post("/translate", json={"text": front, "format": "markdown"})
    assert response.json() == {"translation": "---\ntitle: Hello\n---\n\n# Hello there. (2)\n"}


def test_a_document_submitted_as_its_client_hangs_up_leaves_the_queue():
    """The client of a document hangs up while the document's thread is queueing its sentences:
    what that submit queued is cancelled too, not left for a search to decode."""
    entered, futures = threading.Event(), []

    class SlowEngine(StubEngine):
        def submit(self, texts, options=None, glossary=None) -> Future:
            entered.set()
            time.sleep(0.3)  # the client hangs up meanwhile
            futures.append(future := Future())
            answer = [[(text, -1.0)] for text in texts]
            threading.Timer(3, lambda: future.done() or future.set_result(answer)).start()  # a search, later
            return future

    engine = SlowEngine()
    body = json.dumps({"text": "<p>One here. Two there.</p>", "format": "html"}).encode()
    request = parse_request(body, engine.defaults, ServingLimits())

    async def hang_up() -> None:
        task = asyncio.ensure_future(translate_request(engine, request))
        await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(hang_up())  # returns once the document's thread has ended
    assert len(futures) == 1 and futures[0].cancelled()


def test_a_port_out_of_range_is_one_line():
    for port in (-1, 65536):
        with pytest.raises(UserError, match=f"--port must be from 0 to 65535.*got {port}"):
            listen("127.0.0.1", port)
    with pytest.raises(UserError, match=r"cannot listen on nosuchhost.invalid:0: (?!Unknown error)\w"):
        listen("nosuchhost.invalid", 0)  # the resolver's reason, not its error number


def client_of(engine, **limits) -> TestClient:
    return TestClient(create_app(engine, ServingLimits(**limits), info={"device": "test"}))


@pytest.fixture(scope="module")
def tiny_engine(model, tokenizer):
    engine = Engine.from_model(model, tokenizer, SearchOptions(beam_size=3, max_len_a=1.0, max_len_b=3))
    yield engine
    engine.stop()


def test_in_process_answers_are_the_engines_translations(tiny_engine):
    client = client_of(tiny_engine, max_texts=4)
    texts = ["the cat sees a bird", "", "dog"]
    expected = list(tiny_engine.translate(texts))
    response = client.post("/translate", json={"texts": texts})
    assert response.status_code == 200 and response.json() == {"translations": [n[0][0] for n in expected]}
    response = client.post("/translate", json={"text": texts[0], "nbest": 2, "beam_size": 3})
    nbest = list(tiny_engine.translate(texts[:1], tiny_engine.defaults.given(nbest=2)))[0]
    assert response.json()["translation"] == [text for text, _ in nbest]
    assert response.json()["scores"] == pytest.approx([round(s, 4) for _, s in nbest], abs=1e-3)
    two = "the cat sees a bird. the dog runs."  # "nbest": 1 given: the line whole, with its real score
    whole = list(tiny_engine.translate([two]))[0]
    response = client.post("/translate", json={"text": two, "nbest": 1}).json()
    assert response["translation"] == [whole[0][0]] and response["scores"] == [pytest.approx(whole[0][1], abs=1e-3)]
    health = client.get("/health").json()
    assert health == {"status": "ok", "queued": 0, "answered": 3, "device": "test"}


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"text": "a", "beam_size": 9}, 400, "from 1 to 8"),
        ({"text": "a", "beam_size": 2, "nbest": 3}, 400, "nbest"),
        ({"text": "a", "length_penalty": -1}, 400, "length_penalty"),
        ({"text": "a", "length_penalty": True}, 400, "length_penalty"),
        (b'{"text": "a", "length_penalty": Infinity}', 400, "finite"),  # Python's json reads it
        (b'{"text": "a\\ud800 b"}', 400, "lone surrogate"),
        (b'{"text": "a", "text": "Hello."}', 400, "the body gives 'text' twice in one object"),
        (b'{"text": "a", "glossary": {"cloud": "nuage", "cloud": "nue"}}', 400, "gives 'cloud' twice"),
        ({"texts": ["a", "b", "c"]}, 413, "at most 2 (--max-texts)"),
        ({"text": "a" * 300_000}, 413, "--max-request-bytes"),
        ({"sentence": "a"}, 400, "unknown field 'sentence'"),
        (b'{"text": "a", "glossary": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "nested too deeply"),
        (b'{"text": "a", "beam_size": 1' + b"0" * 5000 + b"}", 400, "not valid JSON"),
    ],
)
def test_in_process_limits_and_checks(body, status, message):
    engine = StubEngine()
    client = client_of(engine, max_texts=2, max_request_bytes=300_000, max_beam=8)
    response = (
        client.post("/translate", content=body) if isinstance(body, bytes) else client.post("/translate", json=body)
    )
    assert response.status_code == status and message in response.json()["error"]


def test_in_process_a_text_of_more_sentences_than_the_queue_holds_is_413(model, tokenizer):
    limits = ServingLimits(max_queue=2, max_texts=2)
    engine = Engine(model, tokenizer, SearchOptions(beam_size=2, max_len_a=1.0, max_len_b=3), limits=limits)
    try:
        client = client_of(engine, max_queue=2, max_texts=2)
        response = client.post("/translate", json={"text": "The cat sees a bird. The dog runs. A bird sings."})
        assert response.status_code == 413
        assert response.json() == {"error": "3 sentences in one request; at most 2 (--max-queue)"}
        assert client.post("/translate", json={"text": "The cat sees a bird. The dog runs."}).status_code == 200
        assert client.get("/health").json()["queued"] == 0
    finally:
        engine.stop()


def test_in_process_request_options_reach_the_engine():
    client = client_of(StubEngine())
    assert client.post("/translate", json={"text": "a"}).json() == {"translation": "a (2)"}
    assert client.post("/translate", json={"texts": ["a", "b"], "beam_size": 5}).json() == {
        "translations": ["a (5)", "b (5)"]
    }


def test_in_process_a_full_queue_is_503_and_a_failed_search_500():
    busy = client_of(StubEngine(QueueFull("server busy: 9 sentences queued")))
    response = busy.post("/translate", json={"text": "a"})
    assert response.status_code == 503 and response.json() == {"error": "server busy: 9 sentences queued"}
    failed = client_of(StubEngine(DecodingFailed("the decoding process ended"))).post("/translate", json={"text": "a"})
    assert failed.status_code == 500 and failed.json() == {"error": "the decoding process ended"}
    broken = client_of(StubEngine(RuntimeError("boom"))).post("/translate", json={"text": "a"})
    assert broken.status_code == 500 and broken.json() == {"error": "RuntimeError: boom"}
    refused = client_of(StubEngine(UserError("too much inline markup"))).post("/translate", json={"text": "a"})
    assert refused.status_code == 400 and refused.json() == {"error": "too much inline markup"}  # the request's fault


def test_in_process_unknown_paths_and_methods_are_json():
    client = client_of(StubEngine())
    assert client.get("/nope").status_code == 404 and "error" in client.get("/nope").json()
    assert client.get("/translate").status_code == 405 and "error" in client.get("/translate").json()
    assert client.get("/translate").headers["allow"] == "POST"  # what HTTP requires of a 405
    slash = client.post("/translate/", json={"text": "a"}, follow_redirects=False)
    assert slash.status_code == 404 and "error" in slash.json()  # another path, not a redirect
