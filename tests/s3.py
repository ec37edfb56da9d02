"""A real S3 API for tests: moto's standalone server on 127.0.0.1 (a free port), one bucket per test."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"
STARTUP_SECONDS = 60.0
# moto accepts any key pair; tests pass them as storage options, never through the environment,
# so the options are what reaches delta-rs (driver and executors alike).
ACCESS_KEY_ID = "testing-key-id"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key="any",
        )

    def new_bucket(self) -> str:
        """A fresh bucket (tests sharing the server never see each other's tables)."""
        name = f"lake-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def storage_options(self, secret: str = "testing-secret") -> dict[str, str]:
        """delta-rs storage options reaching this server (``secret`` as the secret key)."""
        return {
            "aws_endpoint_url": self.endpoint,
            "aws_region": REGION,
            "aws_allow_http": "true",
            "aws_access_key_id": ACCESS_KEY_ID,
            "aws_secret_access_key": secret,
        }

    def unreachable_options(self) -> dict[str, str]:
        """This server's options with an endpoint where nothing listens (a store gone away), one try a request."""
        return {**self.storage_options(), "aws_endpoint_url": f"http://127.0.0.1:{free_port()}", "max_retries": "0"}

    def objects(self, bucket: str) -> dict[str, bytes]:
        """Every object of ``bucket``, by key."""
        client = self.client()
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                out[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return out


@contextmanager
def moto_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 in its own process; stop it however the block ends.

    A process, not moto's in-process thread: some delta-rs storage calls hold
    the GIL while they wait for the HTTP answer, which a server thread of the
    same interpreter could then never send.
    """
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto's S3 server did not start on port {port}") from None
                time.sleep(0.1)
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
