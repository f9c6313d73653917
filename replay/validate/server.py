"""mlx-lm's server as a child process, for `replay validate`.

:class:`MlxServer` runs ``python -m mlx_lm.server`` on 127.0.0.1 in its own
process group, waits for ``/health``, posts JSON requests and times them, and
stops the whole group (SIGTERM, then SIGKILL). Failures meant for the user
(mlx not installed, port taken, server exited or died mid-run, timeouts) are
raised as :class:`ValidationError`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

INSTALL_HINT = "pip install 'prefix-replay[mlx]'"


class ValidationError(RuntimeError):
    """A failure with a message meant for the user."""


def mlx_available() -> str | None:
    """None when mlx and mlx-lm import, else the message to show."""
    missing = [m for m in ("mlx", "mlx_lm") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"{' and '.join(missing)} not installed; install the extra: {INSTALL_HINT}")
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent(parent: int) -> None:
    """In the server's process, before exec: the kernel kills it when the
    process that started it dies, even by SIGKILL, when ``stop`` never runs
    (its own session keeps it out of the terminal's Ctrl-C)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


@dataclass
class MlxServer:
    """``python -m mlx_lm.server`` as a child process in its own process group."""
    model: str
    port: int | None = None
    host: str = "127.0.0.1"
    prompt_cache_size: int | None = 10
    prompt_cache_bytes: int | None = None
    startup_timeout_s: float = 180.0
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "mlx_lm.server", "--model", str(self.model),
               "--host", self.host, "--port", str(self.port), "--log-level", "WARNING"]
        if self.prompt_cache_size is not None:
            cmd += ["--prompt-cache-size", str(self.prompt_cache_size)]
        if self.prompt_cache_bytes is not None:
            cmd += ["--prompt-cache-bytes", str(self.prompt_cache_bytes)]
        return cmd + list(self.extra_args)

    def log_tail(self, n: int = 15) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 20000))
            lines = f.read().decode("utf-8", "replace").splitlines()
        lines = [ln for ln in lines if "UserWarning" not in ln and "warnings.warn" not in ln
                 and "is deprecated" not in ln]
        return "\n".join(lines[-n:])

    # Once logged prompts have been sent, what the server answers or logs may quote
    # them: neither goes into the error message, which is printed and reported
    # (the server's own log is kept on an error, see `check.validate`).
    def _not_quoted(self, what: str) -> str:
        where = f"; the server's log: {self.log_path}" if self.log_path else ""
        return f"{what} not shown, as it may quote the prompt{where}"

    def start(self) -> "MlxServer":
        if self.port is None:
            self.port = free_port(self.host)
        elif not port_is_free(self.port, self.host):
            raise ValidationError(f"port {self.port} on {self.host} is already in use; "
                                  "pass another port or none to pick a free one")
        fd, self.log_path = tempfile.mkstemp(prefix="replay-mlx-server-", suffix=".log")
        log = os.fdopen(fd, "w")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=(functools.partial(_die_with_parent, os.getpid())
                                                     if sys.platform == "linux" else None))
        finally:
            log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ValidationError(f"mlx_lm.server exited with code {code} while starting "
                                      f"(model {self.model}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200 and json.loads(r.read()).get("status") == "ok":
                        return self
            except urllib.error.HTTPError as e:
                if e.code == 503:  # the generation thread died: the model failed to load
                    time.sleep(0.5)
                    raise ValidationError(
                        f"mlx_lm.server started but its model failed to load "
                        f"(model {self.model}):\n{self.log_tail()}") from None
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ValidationError(f"mlx_lm.server did not become ready within "
                                      f"{self.startup_timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after 5 s."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # whatever happened to the leader, make sure nothing of its group is left
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if p.poll() is None:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def cleanup_log(self) -> None:
        if self.log_path and os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    # -------------------------------------------------------------- requests
    def post(self, path: str, body: dict, timeout_s: float) -> tuple[dict, float]:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                payload = r.read()
        except (TimeoutError, socket.timeout):
            raise ValidationError(f"request timed out after {timeout_s:g} s") from None
        except urllib.error.HTTPError as e:
            raise ValidationError(f"mlx_lm.server answered HTTP {e.code} "
                                  f"({self._not_quoted('its answer is')})") from None
        except (urllib.error.URLError, ConnectionError, OSError) as e:
            reason = getattr(e, "reason", e)
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise ValidationError(f"request timed out after {timeout_s:g} s") from None
            time.sleep(0.2)
            if not self.alive():
                code = self.proc.poll() if self.proc else None
                raise ValidationError(f"mlx_lm.server died mid-run (exit code {code}; "
                                      f"{self._not_quoted('its output is')})") from None
            raise ValidationError(f"request failed: {reason}") from None
        dt = time.perf_counter() - t0
        return json.loads(payload), dt
