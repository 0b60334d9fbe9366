"""A real S3-compatible server for tests: moto's standalone server on 127.0.0.1, plus a small
TCP proxy in front of it that can be stopped and started to make the archive unreachable
without losing moto's in-memory data."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


class MotoServer:
    def __init__(self) -> None:
        # This process binds the port and hands the listening socket to the server (werkzeug serves an inherited
        # one under WERKZEUG_RUN_MAIN): a free port passed by number could be taken by a parallel test first.
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        script = Path(__file__).with_name("moto_s3.py")  # moto, with S3's opaque ETags for KMS-encrypted objects
        env = {**os.environ, "WERKZEUG_RUN_MAIN": "true", "WERKZEUG_SERVER_FD": str(listener.fileno())}
        with listener:
            self.proc = subprocess.Popen([sys.executable, str(script), "-H", "127.0.0.1", "-p", str(self.port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                         pass_fds=(listener.fileno(),))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1)
                return
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class TcpProxy:
    """Forwards 127.0.0.1:port to a target; `down()` refuses and drops connections, `up()` resumes."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))  # bound here: no free port to lose to another test
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._up = True
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener.settimeout(0.2)
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def down(self) -> None:
        self._up = False
        with self._lock:
            for conn in self._conns:
                try:
                    conn.close()
                except OSError:
                    pass
            self._conns.clear()

    def up(self) -> None:
        self._up = True

    def close(self) -> None:
        self._closed = True
        self.down()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            if not self._up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass
