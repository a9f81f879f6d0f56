import pytest
import torch

import memfit
from memfit import hardware


def test_this_machine_has_a_profile():
    prof = memfit.profile()
    assert prof.name in ("cpu", "t4", "v100", "a100", "h100", "other")
    assert (prof.name == "cpu") == (not torch.cuda.is_available())
    assert prof.describe()


def test_cpu_means_interpreted_triton():
    if torch.cuda.is_available():
        pytest.skip("skipped: this machine has a GPU")
    assert memfit.INTERPRETED and memfit.profile().interpreted


@pytest.mark.parametrize("name, sm, smem, bf16", [("t4", (7, 5), 64 * 1024, False), ("v100", (7, 0), 96 * 1024, False),
                                                  ("a100", (8, 0), 163 * 1024, True), ("h100", (9, 0), 227 * 1024, True)])
def test_known_profiles(name, sm, smem, bf16):
    prof = hardware.profile_for(name)
    assert prof.capability == sm and prof.shared_memory_per_block == smem and prof.bf16_tensor_cores == bf16
    assert (torch.bfloat16 in prof.dtypes) == bf16


def test_names_from_the_driver():
    assert hardware._name_for("Tesla T4", (7, 5)) == "t4"
    assert hardware._name_for("NVIDIA H200", (9, 0)) == "h100"
    assert hardware._name_for("NVIDIA GeForce RTX 4090", (8, 9)) == "other"


def test_config_falls_back_from_profile_to_gpu_row():
    assert hardware.config("scaled_add", hardware.profile_for("t4")) == hardware.KERNEL_CONFIGS["scaled_add"]["gpu"]
    assert hardware.config("scaled_add", hardware.profile_for("cpu")) == hardware.KERNEL_CONFIGS["scaled_add"]["cpu"]


def test_unknown_names_are_errors():
    with pytest.raises(KeyError, match="no entry 'nope'"):
        hardware.config("nope")
    with pytest.raises(ValueError, match="unknown profile"):
        hardware.profile_for("tpu")
