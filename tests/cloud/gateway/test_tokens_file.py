"""The device tokens file re-read by itself when it changes (``auth.tokens_poll_s``), as kubelet
updates a mounted Secret: a revoked token is refused and a new one accepted without SIGHUP or a
restart; a half-written or invalid file leaves the tokens in force, logged once per change.

Real files laid out and swapped the way kubelet does it, a real gateway on port 0 in front of a
real gRPC worker server, a real gRPC client; no signal anywhere (the gateway runs in-process,
without ``serve``'s signal handlers).
"""

from __future__ import annotations

import asyncio
import builtins
import errno
import logging
import os

import grpc

from cloud.gateway.server import Gateway
from cloud.gateway.settings import load_settings
from edgewise import filereads, filewatch
from edgewise.errors import ConfigError
from edgewise.filereads import file_identity
from edgewise.filewatch import ReloadDecision, identities_of
from edgewise.v1 import service_pb2_grpc
from tests.cloud.gateway.workers import TestWorker, request, serving
from tests.secretvolume import SecretVolume
from tests.waiting import async_wait_until


def test_a_kubelet_swap_is_a_change_even_with_the_same_times_and_size(tmp_path):
    """The tokens file follows the TLS files' rule (``ReloadDecision``): each change is read once,
    one whose read fails (the file gone) is reported once, and a kubelet swap to a file of the
    same size and times is a change."""
    vol = SecretVolume(tmp_path / "auth", {"tokens.yaml": "- {device: cam-1, token: aaaa}\n"})
    path = str(vol.root / "tokens.yaml")
    watch: ReloadDecision[str] = ReloadDecision(identities_of((path,)), 0.0, interval_s=0.0)
    reads = []

    def read() -> str:
        try:
            with open(path) as f:
                reads.append(f.read())
        except OSError as exc:
            raise ConfigError(f"{path}: {exc.strerror}") from None
        return reads[-1]

    def look() -> tuple:
        out = watch.look(1.0, lambda: identities_of((path,)), read)
        return out.files, out.problem

    assert look() == (None, None) and reads == []
    before = os.stat(path)
    vol.update({"tokens.yaml": "- {device: cam-1, token: bbbb}\n"})  # same size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same modification time
    assert look() == ("- {device: cam-1, token: bbbb}\n", None)
    assert look() == (None, None) and len(reads) == 1  # read once
    os.unlink(path)
    assert look()[1].endswith("No such file or directory")
    assert look() == (None, None)  # said once
    os.symlink("..data/tokens.yaml", path)  # back: the file in force, nothing to read
    assert look() == (None, None) and len(reads) == 1
    vol.update({"tokens.yaml": "- {device: cam-2, token: cccc}\n"})
    assert look()[0] == "- {device: cam-2, token: cccc}\n"
    assert file_identity("") is None  # no tokens file: nothing to look at (not the working folder)


IGNORED = "reload ignored, the tokens in force stay (they are read again when they change, and tried again every 60 s)"


def test_a_token_revoked_in_a_mounted_secret_is_refused_without_a_signal(tmp_path, caplog):
    vol = SecretVolume(tmp_path / "auth", {
        "tokens.yaml": "- {device: cam-1, token: old-token}\n- {device: cam-2, token: two-token}\n"})
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    def lines(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = Gateway(load_settings(None, {
            "listen": "127.0.0.1:0", "metrics_port": -1, "discovery.static": [w.address],
            "auth.tokens_file": str(vol.root / "tokens.yaml"), "auth.tokens_poll_s": 0.05}, env={}))
        await gw.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)

                async def code(device: str, token: str) -> str:
                    try:
                        await stub.Detect(request(device=device), timeout=5,
                                          metadata=(("authorization", f"Bearer {token}"),))
                        return "OK"
                    except grpc.aio.AioRpcError as exc:
                        return exc.code().name

                assert (await code("cam-1", "old-token"), await code("cam-3", "new-token")) == \
                    ("OK", "UNAUTHENTICATED")
                # the operator revokes cam-1's token and adds cam-3 in the Secret; kubelet swaps the files
                vol.update({"tokens.yaml": "- {device: cam-2, token: two-token}\n"
                                           "- {device: cam-3, token: new-token}\n"})
                await async_wait_until(lambda: "cam-3" in gw.auth.tokens, 10, "the new tokens in force")
                assert (await code("cam-1", "old-token"), await code("cam-3", "new-token"),
                        await code("cam-2", "two-token")) == ("UNAUTHENTICATED", "OK", "OK")
                assert lines("device tokens reloaded: 2 devices (1 added, 1 removed, 0 changed)")

                # a half-written file: refused once, the tokens in force stay
                vol.update({"tokens.yaml": "- {device: cam-2, token: two-token}\n- {device: cam-4, tok"})
                await async_wait_until(lambda: lines("reload ignored"), 10, "the half-written file refused")
                await asyncio.sleep(0.5)  # about ten more looks at the same file
                assert len(lines(IGNORED)) == 1, lines("reload ignored")
                assert (await code("cam-3", "new-token"), await code("cam-1", "old-token")) == \
                    ("OK", "UNAUTHENTICATED")

                # emptied: never turns authentication off
                vol.update({"tokens.yaml": "[]\n"})
                await async_wait_until(lambda: lines("lists no device"), 10, "the empty file refused")
                await asyncio.sleep(0.5)
                assert len(lines(IGNORED)) == 2
                assert (await code("cam-3", "new-token"), await code("cam-9", "anything")) == \
                    ("OK", "UNAUTHENTICATED")

                # a named pipe put there: refused without opening it (a read would block the event loop)
                path = vol.root / "tokens.yaml"
                path.unlink()
                os.mkfifo(path)
                await async_wait_until(lambda: lines("is a named pipe (FIFO), expected the device tokens file"), 10,
                                       "the FIFO refused")
                assert (await code("cam-3", "new-token"), await code("cam-9", "anything")) == \
                    ("OK", "UNAUTHENTICATED")  # the gateway still answers, with the tokens in force
                path.unlink()
                path.symlink_to("..data/tokens.yaml")

                # fixed: in force again
                vol.update({"tokens.yaml": "- {device: cam-4, token: four-token}\n"})
                await async_wait_until(lambda: gw.auth.tokens == {"cam-4": "four-token"}, 10, "the fixed file")
                assert (await code("cam-4", "four-token"), await code("cam-3", "new-token")) == \
                    ("OK", "UNAUTHENTICATED")
        finally:
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_sighup_puts_a_new_poll_interval_in_force_and_names_what_it_does_not_apply(tmp_path, caplog):
    """``auth.tokens_poll_s`` was read once at start: a gateway started with 0 never looked at the
    file by itself even after its config said 0.2 and it got SIGHUP. And a SIGHUP re-reads the
    whole settings but applies only the workers and tokens; other keys changed silently did
    nothing. Now the interval follows, and the keys left for a restart are named."""
    import signal

    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("- {device: cam-1, token: one}\n")
    caplog.set_level(logging.INFO, logger="edgewise.gateway")
    said = lambda text: [r.getMessage() for r in caplog.records if text in r.getMessage()]  # noqa: E731

    async def main():
        w = TestWorker("w")
        await w.start()
        over = {"listen": "127.0.0.1:0", "metrics_port": -1, "discovery.static": [w.address],
                "auth.tokens_file": str(tokens), "auth.tokens_poll_s": 0}
        now = dict(over)
        try:
            task, gw = await serving(load_settings(None, over, env={}), lambda: load_settings(None, now, env={}))
            os.kill(os.getpid(), signal.SIGHUP)  # nothing changed: nothing to name
            await async_wait_until(lambda: said("device tokens reloaded"), 10, "the reload")
            tokens.write_text("- {device: cam-1, token: two}\n")
            await asyncio.sleep(0.6)
            assert gw.auth.tokens == {"cam-1": "one"}  # 0: looked at on SIGHUP only

            now.update({"auth.tokens_poll_s": 0.1, "limits.rate_per_device": 3.0, "shutdown_grace_s": 1.0})
            os.kill(os.getpid(), signal.SIGHUP)
            await async_wait_until(lambda: gw.auth.tokens == {"cam-1": "two"}, 10, "the SIGHUP's reload")
            await async_wait_until(lambda: said("looked at every 0.1 s from now on"), 10, "the new interval")
            tokens.write_text("- {device: cam-1, token: three}\n")  # no signal
            await async_wait_until(lambda: gw.auth.tokens == {"cam-1": "three"}, 10, "the file watched by itself")
            assert said("SIGHUP: shutdown_grace_s, limits.rate_per_device changed, which a reload does not apply")
            assert len(said("which a reload does not apply")) == 1  # not at the first, unchanged SIGHUP
            assert gw.limiter.rate == gw.settings.limits.rate_per_device != 3.0  # as the line says: not applied

            now["auth.tokens_poll_s"] = 0  # back to SIGHUP only
            os.kill(os.getpid(), signal.SIGHUP)
            await async_wait_until(lambda: said("on SIGHUP only (auth.tokens_poll_s: 0)"), 10, "the watch stopped")
            tokens.write_text("- {device: cam-1, token: four}\n")
            await asyncio.sleep(0.6)
            assert gw.auth.tokens == {"cam-1": "three"}
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(task, 30)
        finally:
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_new_token_met_by_a_read_error_that_passes_is_in_force_without_another_change(tmp_path, caplog,
                                                                                        monkeypatch):
    """The first read of a changed tokens file fails with EIO (a network volume's hiccup): refused
    once, logged once, and read again, unchanged, at the retry (a minute; 0.3 s here), where the
    new device's token goes in force. Before, it waited for the file's next change."""
    monkeypatch.setattr(filewatch, "RETRY_REFUSED_S", 0.3)
    vol = SecretVolume(tmp_path / "auth", {"tokens.yaml": "- {device: cam-1, token: one-token}\n"})
    path = str(vol.root / "tokens.yaml")
    failing = [0]

    def flaky_open(file, *args, **kwargs):
        if failing[0] and os.path.realpath(file) == os.path.realpath(path):
            failing[0] -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO), file)
        return builtins.open(file, *args, **kwargs)

    monkeypatch.setattr(filereads, "open", flaky_open, raising=False)
    caplog.set_level(logging.INFO, logger="edgewise.gateway")

    async def main():
        w = TestWorker("w")
        await w.start()
        gw = Gateway(load_settings(None, {
            "listen": "127.0.0.1:0", "metrics_port": -1, "discovery.static": [w.address],
            "auth.tokens_file": path, "auth.tokens_poll_s": 0.05}, env={}))
        await gw.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                failing[0] = 3  # the new file's first three reads fail
                vol.update({"tokens.yaml": "- {device: cam-1, token: one-token}\n- {device: cam-2, token: two-token}\n"})
                await async_wait_until(lambda: gw.auth.tokens.get("cam-2") == "two-token", 10, "the new token in force")
                assert failing[0] == 0
                await stub.Detect(request(device="cam-2"), timeout=5,
                                  metadata=(("authorization", "Bearer two-token"),))
        finally:
            await gw.stop(0)
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 60))
    refused = [r.getMessage() for r in caplog.records if "reload ignored" in r.getMessage()]
    assert len(refused) == 1 and refused[0].endswith("cannot read the tokens file: Input/output error"), refused


def test_a_tokens_file_rewritten_while_it_is_read_is_read_again_at_the_next_look(tmp_path, monkeypatch):
    """``check_tokens_file`` on a file replaced while the gateway reads it: what was read may be
    half old, half new, so nothing is put in force (nor logged as refused) and the next look
    reads the file as it is now."""
    vol = SecretVolume(tmp_path / "auth", {"tokens.yaml": "- {device: cam-1, token: one-token}\n"})
    path = str(vol.root / "tokens.yaml")
    gw = Gateway(load_settings(None, {"listen": "127.0.0.1:0", "metrics_port": -1,
                                      "discovery.static": ["127.0.0.1:1"], "auth.tokens_file": path, "auth.tokens_poll_s": 1}, env={}))
    real_open = builtins.open
    during_read = []

    def racing_open(file, *args, **kwargs):
        f = real_open(file, *args, **kwargs)
        if during_read and os.path.realpath(file) == os.path.realpath(path):
            vol.update({"tokens.yaml": during_read.pop()})  # kubelet swaps the folder meanwhile
        return f

    monkeypatch.setattr(filereads, "open", racing_open, raising=False)
    vol.update({"tokens.yaml": "- {device: cam-2, token: two-token}\n"})
    during_read.append("- {device: cam-3, token: three-token}\n")
    asyncio.run(gw.check_tokens_file())
    assert gw.auth.tokens == {"cam-1": "one-token"} and not during_read  # read while replaced: not taken
    asyncio.run(gw.check_tokens_file())
    assert gw.auth.tokens == {"cam-3": "three-token"}


def test_requests_are_served_while_a_fleet_s_tokens_are_read_again(tmp_path):
    """A fleet's tokens file takes seconds to read (12,000 devices: about 2.5 s here). It was read
    on the gateway's event loop, at SIGHUP and when the file changed, and every request waited for
    it (20,000 devices: a request of 7 ms took 7.3 s; with the default 5 s deadline every call in
    flight expired). It is read in a thread: requests are answered meanwhile."""
    import signal
    import time

    tokens = tmp_path / "tokens.yaml"

    def write(salt: str) -> None:  # cam-00001's token stays; every other one changes
        text = "".join(f"- device: cam-{i:05d}\n  token: {salt if i != 1 else 'a'}{i:063x}\n" for i in range(12_000))
        (tmp_path / "new.yaml").write_text(text)
        os.replace(tmp_path / "new.yaml", tokens)

    write("a")

    async def main():
        w = TestWorker("w")
        await w.start()
        over = {"listen": "127.0.0.1:0", "metrics_port": -1, "discovery.static": [w.address],
                "auth.tokens_file": str(tokens), "auth.tokens_poll_s": 0}
        now = dict(over)
        try:
            task, gw = await serving(load_settings(None, over, env={}), lambda: load_settings(None, now, env={}))
            async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
                stub = service_pb2_grpc.EscalationStub(ch)
                token = (("authorization", f"Bearer a{1:063x}"),)

                async def while_reloading(trigger, salt: str) -> tuple[float, float]:
                    """(the reload's time, the longest request meanwhile)"""
                    longest = 0.0
                    write(salt)
                    began = time.perf_counter()
                    trigger()
                    while gw.auth.tokens["cam-00002"] != f"{salt}{2:063x}":
                        sent = time.perf_counter()
                        await stub.Detect(request(device="cam-00001"), timeout=30, metadata=token)
                        longest = max(longest, time.perf_counter() - sent)
                        assert time.perf_counter() - began < 30, "the reload never came"
                    return time.perf_counter() - began, longest

                await stub.Detect(request(device="cam-00001"), timeout=30, metadata=token)
                took, longest = await while_reloading(lambda: os.kill(os.getpid(), signal.SIGHUP), "b")
                assert longest < took / 3, (took, longest)

                now["auth.tokens_poll_s"] = 0.1  # the file watched by itself
                os.kill(os.getpid(), signal.SIGHUP)
                await async_wait_until(lambda: gw._tokens_from.auth.tokens_poll_s == 0.1, 20, "the new interval")
                took, longest = await while_reloading(lambda: None, "c")
                assert longest < took / 3, (took, longest)
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(task, 30)
        finally:
            await w.stop()

    asyncio.run(asyncio.wait_for(main(), 120))
