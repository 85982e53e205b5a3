"""One frame-size rule: hand ``sequence_ai.observation()`` the camera's native frame, in either form.

- Model-less: the frame is encoded at its native size, long edge capped at 640 px, and keeps its
  native pixels (``sequence_ai.NativeJPEG``).
- Sent through a connected Policy whose deployment declares a size (the echo policy reads
  exterior_1 at 64x64), the frame is re-encoded once from the native pixels at exactly that size
  before it goes out: the worker takes it (the echo policy asserts 64x64 inside infer), where it
  refused the native frame before.
- With the policy given to ``observation()``, the frame is resampled once to the declared size.
- A native frame of another aspect ratio is refused locally, naming both ratios (crop first).
- A frame encoded by hand at the wrong size (no native pixels) is still refused by the worker,
  and its hint says to send the native frame, not to resize it.

Real gateway and worker processes on loopback.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import sequence_ai
from _core_support import ECHO, connect, unique


def _size(data: bytes) -> tuple:
    return Image.open(io.BytesIO(bytes(data))).size


def _native(w: int, h: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def echo(shared_module_gateway):
    name = unique("frame-size")
    assert shared_module_gateway.deploy(ECHO, name)["status"] == "ready"
    return name


def _obs(frame, model=None):
    return sequence_ai.observation(model, images={"exterior_1": frame}, joints=[0.0] * 7, gripper=[0.5],
                                   instruction="put the red cube on the green pad")


def test_the_model_less_form_keeps_the_native_size_capped_at_640_and_the_native_pixels():
    small = _obs(_native(200, 200)).images[0].data
    assert isinstance(small, sequence_ai.NativeJPEG) and _size(small) == (200, 200)
    big = _obs(_native(1280, 960)).images[0].data
    assert _size(big) == (640, 480) and big.pixels.shape == (960, 1280, 3)        # capped, native kept
    assert _size(big.at_size(64, 48)) == (64, 48)                                   # once, from native


def test_the_native_pixels_are_the_frame_observed_not_a_buffer_reused_later():
    buf = np.zeros((48, 64, 3), np.uint8)
    frame = _obs(buf).images[0].data
    buf[:] = 255                                    # the camera loop writes its next frame in place
    resent = np.asarray(Image.open(io.BytesIO(frame.at_size(64, 48))))
    assert resent.mean() < 5, resent.mean()          # the observed (black) frame, not the later one


@pytest.mark.parametrize("shape", [(0, 0, 3), (0, 10, 3), (10, 0)])
def test_an_empty_frame_is_refused_naming_its_shape(shape):
    with pytest.raises(ValueError, match="at least 1x1"):
        _obs(np.zeros(shape, np.uint8))

def test_a_connected_policy_sends_a_native_frame_at_the_declared_size(shared_module_gateway, echo):
    obs = _obs(_native(480, 480))                     # what the worker refused before: 480x480 for 64x64
    with connect(shared_module_gateway, echo) as policy:
        chunk = policy.predict(obs).action_chunk      # infer asserts the 64x64 frame it reads
        assert len(chunk) == 10
        bound = _obs(_native(480, 480), policy).images[0].data    # the policy-bound form: declared at once
        assert _size(bound) == (64, 64)
        assert len(policy.predict(_obs(_native(480, 480), policy)).action_chunk) == 10


def test_a_native_frame_of_another_aspect_ratio_is_refused_before_it_is_sent(shared_module_gateway, echo):
    with connect(shared_module_gateway, echo) as policy:
        with pytest.raises(ValueError, match=r"frame is 640x480 \(aspect 1\.3333\) but the model reads 64x64"):
            policy.predict(_obs(_native(640, 480)))


def test_a_hand_encoded_frame_of_the_wrong_size_is_refused_with_advice_to_send_the_native_one(shared_module_gateway, echo):
    wrong = sequence_ai.ImageFrame(view="exterior_1", data=sequence_ai.encode_jpeg(_native(128, 128)))
    obs = sequence_ai.Observation(images=[wrong], proprioception=sequence_ai.Proprioception(
        joint_positions=[0.0] * 7, gripper=[0.5]), instruction="put the red cube on the green pad")
    with connect(shared_module_gateway, echo, validate="off") as policy:
        with pytest.raises(sequence_ai.SequencesError) as err:
            policy.predict(obs)
    text = f"{err.value} {getattr(err.value, 'hint', '')}"
    assert "frame is 128x128, this policy reads 64x64" in text
    assert "native" in text and "resampled once" in text
