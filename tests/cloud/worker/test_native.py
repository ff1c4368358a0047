"""Worker with native input and packed region payloads: real model with a symbolic height/width,
real gRPC, boxes mapped back into frame pixels tile by tile."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from cloud.worker.runner import ModelRunner
from edgewise import wire
from edgewise.detections import Detections
from edgewise.errors import InvalidInputError
from edgewise.regions import pack, tiles_to_frame
from edgewise.runtime.detector import Detector
from edgewise.v1 import detect_pb2
from tests.cloud.worker.test_server import CONF, call, make_settings, photo, running


def test_native_worker_maps_packed_regions_back_into_the_frame(native_model) -> None:
    frame = np.ascontiguousarray(np.tile(photo(), (2, 2, 1))[:720, :1000])  # bigger than the model's 160
    regions = [(100, 80, 420, 300), (600, 400, 900, 700)]
    packed, tiles = pack(frame, regions, low_width=320)
    img = wire.encode_image(packed, "png")  # lossless: the worker sees exactly these pixels
    img.source_width, img.source_height = 1000, 720
    img.tiles.extend(wire.tiles_to_proto(tiles))
    settings = make_settings(native_model)
    assert settings.input_size == "auto"
    det = Detector.from_file(native_model, conf_thres=CONF, threads=1, input_size="native")
    (on_packed,) = det.detect([packed])
    expected = tiles_to_frame(on_packed, tiles, (1000, 720))
    assert len(expected) > 0 and 0 < len(expected) <= len(on_packed)

    async def main():
        async with running(settings) as (server, stub, _ch):
            assert server.service.runner.detector.input_size == "native"
            req = detect_pb2.DetectRequest(device_id="cam", stream_id="s", frame_seq=3, image=img)
            out = await call(stub, req)
            # its time grows with the image: it reports its pixels/s, and the gateway weighs
            # requests by their pixels (docs/design/balancing.md#work-not-requests)
            load = await stub.Load(detect_pb2.LoadRequest(), timeout=5)
            assert load.pixel_rate > 0 and load.capacity > 0
            return out

    code, r = asyncio.run(main())
    assert code.name == "OK", r
    got = wire.detections_from_proto(list(r.detections), det.names, "cloud")
    assert len(got) == len(expected)
    np.testing.assert_allclose(np.sort(got.boxes, axis=0), np.sort(expected.boxes, axis=0), atol=0.05)
    assert (got.boxes[:, 2] <= 1000).all() and (got.boxes[:, 3] <= 720).all()


def test_images_of_different_native_sizes_share_a_batch(native_model) -> None:
    runner = ModelRunner(Detector.from_file(native_model, conf_thres=CONF, threads=1, input_size="native"))
    im = photo()
    a = runner.prepare_array(im[:200, :300])
    b = runner.prepare_array(im[:96, :128], offset=(10.0, 20.0), source_size=(512, 512))
    assert a.tensor.shape[2:] != b.tensor.shape[2:]
    out, _ = runner.run([a, b, a])
    assert all(isinstance(d, Detections) for d in out)
    (alone,) = runner.run([b])[0]
    assert isinstance(alone, Detections)
    np.testing.assert_allclose(out[1].boxes, alone.boxes)
    assert (out[1].boxes[:, 0] >= 10.0 - 1e-3).all()  # shifted by the crop offset


def test_tiles_are_validated_against_the_image() -> None:
    img = wire.encode_image(np.zeros((64, 96, 3), np.uint8), "png")
    img.tiles.add(x=0, y=0, width=96, height=64, scale=2.0)
    with pytest.raises(InvalidInputError, match=r"image.tiles: a packed image must say the frame .*source_width"):
        wire.check_image(img)  # without the frame's size nothing bounds where its boxes land
    img.source_width, img.source_height = 192, 128
    assert wire.check_image(img).width == 96
    img.tiles.add(x=50, y=0, width=96, height=64)
    with pytest.raises(InvalidInputError, match=r"image.tiles\[1\]: 96x64 at \(50,0\) is empty or outside"):
        wire.check_image(img)
    del img.tiles[1]
    img.tiles.add(x=0, y=0, width=8, height=8, scale=float("nan"))
    with pytest.raises(InvalidInputError, match=r"image.tiles\[1\].scale nan"):
        wire.check_image(img)
    del img.tiles[1]
    img.tiles.add(x=0, y=0, width=8, height=8, source_x=4_000_000_000)
    with pytest.raises(InvalidInputError, match=r"image.tiles\[1\]: source corner \(4000000000,0\) lies outside"):
        wire.check_image(img)


def test_native_peak_capacity_describes_the_frames_served_not_the_warmup_dummy(native_model) -> None:
    """Warm-up runs 160x160 dummies at batch 1 and 4; frames ~30x their pixels then arrive one
    at a time, so batch 4 never forms in service. The peak capacity the autoscaler divides by
    must follow those frames (it used to stay at the dummies' rate, several times too high)."""
    frame = np.ascontiguousarray(np.tile(photo(), (2, 2, 1))[:720, :1000])
    img = wire.encode_image(frame, "jpeg")
    settings = make_settings(native_model, max_batch_size=4, max_queue_delay_ms=0.0)

    async def main():
        async with running(settings) as (server, stub, _ch):
            assert server.service.runner.pixel_cost
            warm = await stub.Load(detect_pb2.LoadRequest(), timeout=5)
            for i in range(8):
                code, r = await call(stub, detect_pb2.DetectRequest(frame_seq=i, image=img), timeout=30)
                assert code.name == "OK", r
            return warm, await stub.Load(detect_pb2.LoadRequest(), timeout=5)

    warm, served = asyncio.run(main())
    assert served.capacity < warm.capacity / 3  # the frames are much slower than the dummies
    # batch 4 on this CPU gains little over batch 1: the peak stays near what batch 1 serves
    assert served.capacity * 0.5 < served.peak_capacity < served.capacity * 2.5, (warm, served)


def test_a_batch_of_different_native_sizes_counts_one_model_call_per_size(native_model) -> None:
    runner = ModelRunner(Detector.from_file(native_model, conf_thres=CONF, threads=1, input_size="native"))
    im = photo()
    a, b = runner.prepare_array(im[:200, :300]), runner.prepare_array(im[:96, :128])
    assert runner.call_sizes([a, b, a]) == [2, 1]
    assert runner.call_sizes([a, a, a]) == [3]
