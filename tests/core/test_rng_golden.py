"""Golden values of ``perturb.rng``: key derivation and the first values of every keyed stream.

Every record, split and augmentation replays from these numbers, so any change to the canonical
string, the BLAKE2b derivation, the stream sub-keys, the integer mixer, the uniform/normal
mappings or the inverse-CDF table must show up here (and then needs a new op version, not a
refreshed literal).

How the literals were made: computed once with the code of perturb/rng.py at commit 415e595
(``python -c "from perturb import rng; ..."`` calling the functions below with these arguments,
values printed with ``repr`` / ``.tolist()``) and pasted here. They are not recomputed by the test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from perturb import rng

KEY_ARGS = (7, "kvasir/cl8k2u1r.jpg", "gaussian_blur", 0, 3)
KEY = 15883436964501417458  # derive_key(*KEY_ARGS)

# First values of the stream "noise" of KEY.
NOISE_BITS = [2957616716, 3342521237, 4087425987, 2472959269, 1179143739, 1356955045]
NOISE_UNIFORM = [
    0.6886237859725952,
    0.7782413959503174,
    0.9516780376434326,
    0.5757807493209839,
    0.27454081177711487,
    0.3159407079219818,
]
NOISE_NORMAL = [
    0.38425371050834656,
    0.9404239654541016,
    -0.9504105448722839,
    -0.3481774628162384,
    0.4919467866420746,
    0.7662505507469177,
    1.6613961458206177,
]


@pytest.mark.parametrize(
    ("args", "text", "key", "hex_key"),
    [
        (
            (0, "a", "gaussian_noise", 0, 0),
            "0|a|gaussian_noise|0|0",
            1056952376046950971,
            "0eab0c9606c89a3b",
        ),
        (KEY_ARGS, "7|kvasir/cl8k2u1r.jpg|gaussian_blur|0|3", KEY, "dc6d4dc3e16a6df2"),
        (
            (2**40 + 5, "ünïcode key", "jpeg", 5, 1),
            "1099511627781|ünïcode key|jpeg|5|1",
            9579405238874592301,
            "84f0e24f96a2d42d",
        ),
    ],
)
def test_canonical_string_derived_key_and_hex(
    args: tuple[int, str, str, int, int], text: str, key: int, hex_key: str
) -> None:
    assert rng.canonical(*args) == text
    assert rng.derive_key(*args) == key
    assert rng.key_to_hex(key) == hex_key
    assert rng.key_from_hex(hex_key) == key


def test_variant_defaults_to_zero() -> None:
    assert rng.derive_key(0, "a", "gaussian_noise", 0) == 1056952376046950971


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        ("noise", 14814063829946383085),
        ("field", 11644200960232622375),
        ("", 12024731773585138622),
    ],
)
def test_sub_keys(stream: str, expected: int) -> None:
    assert rng.sub_key(KEY, stream) == expected


def test_host_streams() -> None:
    assert rng.hash_numpy(KEY, "noise", 6).tolist() == NOISE_BITS
    assert rng.uniform_numpy(KEY, "noise", 6).tolist() == NOISE_UNIFORM
    assert rng.normal_numpy(KEY, "noise", 7).tolist() == NOISE_NORMAL
    other = rng.derive_key(0, "a", "gaussian_noise", 0, 0)
    assert rng.hash_numpy(other, "grain", 4).tolist() == [
        2574716646,
        3349852167,
        3520696671,
        82637221,
    ]
    assert rng.uniform_numpy(other, "grain", 4).tolist() == [
        0.5994728803634644,
        0.7799482345581055,
        0.8197261095046997,
        0.019240468740463257,
    ]
    assert rng.normal_numpy(other, "grain", 4).tolist() == [
        -1.5700249671936035,
        0.4890996813774109,
        0.2520005404949188,
        0.7720087170600891,
    ]


def test_counter_based_values_far_into_a_stream() -> None:
    expected = [0.6886237859725952, 0.3159407079219818, 0.20941665768623352]
    assert rng.uniform_numpy_at(KEY, "noise", np.array([0, 5, 1_000_003])).tolist() == expected
    assert rng.uniform_numpy(KEY, "noise", 1_000_004)[[0, 5, 1_000_003]].tolist() == expected


def test_torch_streams_on_cpu() -> None:
    bits = rng.hash_bits(KEY, "noise", 6)
    assert bits.dtype == torch.int64 and bits.tolist() == NOISE_BITS
    uniform = rng.uniform_field(KEY, "noise", (2, 3))
    assert uniform.dtype == torch.float32 and uniform.flatten().tolist() == NOISE_UNIFORM
    normal = rng.normal_field(KEY, "noise", (7,))
    assert normal.dtype == torch.float32 and normal.tolist() == NOISE_NORMAL


def test_torch_integer_mixer_gives_the_same_bits() -> None:
    """The int64 torch mixer (the code path CUDA runs) on CPU: the same 32-bit values."""
    k = rng.sub_key(KEY, "noise")
    counter = torch.arange(6, dtype=torch.int64)
    assert rng.mix_torch(counter, k & 0xFFFFFFFF, k >> 32).tolist() == NOISE_BITS


def test_inverse_cdf_table() -> None:
    table = rng.normal_lut_numpy()
    assert table.shape == (65536,) and table.dtype == np.float32
    assert table[[0, 1, 32767, 32768, 65535]].tolist() == [
        -4.3249192237854,
        -4.076206684112549,
        -1.912405605253298e-05,
        1.912405605253298e-05,
        4.3249192237854,
    ]


def test_scalar_generator() -> None:
    assert rng.scalar_rng(KEY).random(3).tolist() == [
        0.6636421177288868,
        0.5380180613069675,
        0.661508396906819,
    ]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_cuda_streams() -> None:
    assert rng.hash_bits(KEY, "noise", 6, "cuda").cpu().tolist() == NOISE_BITS
    assert rng.uniform_field(KEY, "noise", (6,), "cuda").cpu().tolist() == NOISE_UNIFORM
    assert rng.normal_field(KEY, "noise", (7,), "cuda").cpu().tolist() == NOISE_NORMAL
