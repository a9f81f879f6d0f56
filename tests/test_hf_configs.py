"""GPTConfig.from_hf_config and the published config.json files of memfit/hf_configs/: the course GPT built from
each has exactly the published parameter count; configs it cannot represent and malformed files are refused with
messages that name the file, the field and the model_type; the course's own configs build the same models."""
import json
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

from memfit.gpt import (COURSE_CONFIGS, GPT, HF_CONFIG_DIR, LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B,
                        LLAMA_3_2_1B, GPTConfig, RMSNorm, n_params, n_params_of_config)

ROOT = Path(__file__).resolve().parent.parent

# The parameter counts the model cards and safetensors indexes publish.
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "gemma-2-9b": 9_241_705_984,
}


def hf_count(c: dict) -> int:
    """The parameters of the transformers model a config.json describes, counted from its fields by hand (not
    through GPTConfig): q/k/v/o projections (Qwen2's q/k/v biases), gate/up/down, two norms a layer (Gemma-2:
    four), the embedding, an untied head, the final norm."""
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    d = c.get("head_dim", h // heads)
    q, kv = heads * d, c["num_key_value_heads"] * d
    attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if c["model_type"] == "qwen2" else 0)
    norms = (4 if c["model_type"] == "gemma2" else 2) * h
    layer = attention + 3 * h * c["intermediate_size"] + norms
    tied = c.get("tie_word_embeddings", c["model_type"].startswith("gemma"))
    return layers * layer + c["vocab_size"] * h * (1 if tied else 2) + h


def shipped(name: str) -> dict:
    return json.loads((HF_CONFIG_DIR / f"{name}.json").read_text())


def test_every_shipped_config_has_a_published_count():
    assert sorted(p.stem for p in HF_CONFIG_DIR.glob("*.json")) == sorted(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_a_shipped_config_builds_the_published_parameter_count(name):
    cfg = GPTConfig.from_hf_config(HF_CONFIG_DIR / f"{name}.json")
    assert cfg.name == name
    with torch.device("meta"):  # shapes only: a 70B model costs no memory
        model = GPT(cfg)
    assert all(p.is_meta for p in model.parameters())
    assert n_params(model) == n_params_of_config(cfg) == hf_count(shipped(name)) == PUBLISHED[name]


def test_mistral_v0_3_is_v0_1_with_a_larger_vocabulary():
    v03 = dict(shipped("mistral-7b-v0.1"), vocab_size=32_768)
    assert n_params_of_config(GPTConfig.from_hf_config(v03)) == hf_count(v03) == 7_248_023_552


def test_the_llama_files_are_the_course_s_llama_configs():
    assert GPTConfig.from_hf_config(HF_CONFIG_DIR / "llama-3.1-8b.json") == LLAMA_3_1_8B
    assert GPTConfig.from_hf_config(HF_CONFIG_DIR / "llama-3.1-70b.json") == LLAMA_3_1_70B


def test_qwen2_has_qkv_biases_and_gemma2_its_heads_ties_and_four_norms():
    qwen = GPTConfig.from_hf_config(HF_CONFIG_DIR / "qwen2.5-7b.json")
    assert qwen.qkv_bias and qwen.head_dim_override is None and not qwen.post_norms and not qwen.tie_embeddings
    gemma = GPTConfig.from_hf_config(HF_CONFIG_DIR / "gemma-2-9b.json")
    assert (gemma.head_dim, gemma.q_dim, gemma.kv_dim) == (256, 4096, 2048) and gemma.d_model == 3584
    assert gemma.tie_embeddings and gemma.post_norms and not gemma.qkv_bias
    with torch.device("meta"):
        q_model, g_model = GPT(qwen), GPT(gemma)
    assert q_model.blocks[0].attn.wqkv.bias.shape == (3584 + 2 * 512,) and q_model.blocks[0].attn.wo.bias is None
    assert g_model.blocks[0].attn.wqkv.weight.shape == (4096 + 2 * 2048, 3584)
    assert g_model.blocks[0].attn.wo.weight.shape == (3584, 4096)
    norms = [name for name, m in g_model.blocks[0].named_modules() if isinstance(m, RMSNorm)]
    assert norms == ["norm1", "norm2", "attn_out_norm", "mlp_out_norm"]
    assert g_model.head.weight is g_model.embed.weight


def test_a_path_a_folder_and_a_dict_give_the_same_config(tmp_path):
    data = shipped("gemma-2-9b")
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(data))
    from_folder = GPTConfig.from_hf_config(tmp_path / "my-model")
    from_file = GPTConfig.from_hf_config(str(tmp_path / "my-model" / "config.json"))
    from_dict = GPTConfig.from_hf_config(data, name="mine")
    assert from_folder == from_file == from_dict
    assert (from_folder.name, from_file.name, from_dict.name) == ("my-model", "my-model", "mine")


def test_rope_theta_is_read_where_transformers_5_writes_it():
    data = {k: v for k, v in shipped("qwen2.5-7b").items() if k != "rope_theta"}
    assert GPTConfig.from_hf_config(data).rope_theta == 10_000.0  # Qwen2Config's default
    data["rope_parameters"] = {"rope_theta": 1_000_000.0, "rope_type": "default"}
    assert GPTConfig.from_hf_config(data) == GPTConfig.from_hf_config(HF_CONFIG_DIR / "qwen2.5-7b.json")


def test_a_head_dim_that_is_hidden_over_heads_is_no_override():
    cfg = GPTConfig.from_hf_config(dict(shipped("llama-3.1-8b"), head_dim=128))
    assert cfg.head_dim_override is None and cfg == LLAMA_3_1_8B


# Configs the course GPT cannot represent: the message names the field and the model_type.
MIXTRAL = dict(shipped("mistral-7b-v0.1"), architectures=["MixtralForCausalLM"], model_type="mixtral",
               num_local_experts=8, num_experts_per_tok=2)


@pytest.mark.parametrize("changes, words", [
    (MIXTRAL, ["num_local_experts=8", "'mixtral'", "mixture of experts"]),
    (dict(model_type="qwen2_moe", num_experts=60, moe_intermediate_size=1408), ["num_experts=60", "'qwen2_moe'"]),
    (dict(model_type="phi3"), ["model_type 'phi3'", "gemma2", "llama"]),
    (dict(attention_bias=True), ["attention_bias=true", "'llama'"]),
    (dict(mlp_bias=True), ["mlp_bias=true", "'llama'"]),
    (dict(architectures=["LlamaForSequenceClassification"]), ["architectures", "ForCausalLM", "'llama'"]),
])
def test_a_config_it_cannot_represent_is_refused_naming_field_and_model_type(changes, words):
    with pytest.raises(ValueError) as e:
        GPTConfig.from_hf_config({**shipped("llama-3.1-8b"), **changes})
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_malformed_file_is_refused_naming_the_file_and_the_problem(tmp_path):
    cases = {
        "truncated.json": ('{"model_type": "llama", "hidden_size": 40', "not a JSON file"),
        "list.json": ('[{"model_type": "llama"}]', "not a list"),
        "no_hidden.json": (json.dumps({k: v for k, v in shipped("llama-3.1-8b").items() if k != "hidden_size"}),
                           "the field hidden_size is missing (model_type 'llama')"),
        "no_type.json": (json.dumps({k: v for k, v in shipped("llama-3.1-8b").items() if k != "model_type"}),
                         "the field model_type is missing"),
        "bad_layers.json": (json.dumps(dict(shipped("llama-3.1-8b"), num_hidden_layers="32")),
                            "the field num_hidden_layers must be a positive int, not '32'"),
        "bad_tie.json": (json.dumps(dict(shipped("llama-3.1-8b"), tie_word_embeddings="no")),
                         "tie_word_embeddings must be true or false"),
    }
    for file, (text, problem) in cases.items():
        (tmp_path / file).write_text(text)
        with pytest.raises(ValueError) as e:
            GPTConfig.from_hf_config(tmp_path / file)
        assert str(tmp_path / file) in str(e.value) and problem in str(e.value), str(e.value)
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="binary.json: not a JSON file"):
        GPTConfig.from_hf_config(tmp_path / "binary.json")
    with pytest.raises(FileNotFoundError, match="missing.json: no such file"):
        GPTConfig.from_hf_config(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="config dict: the field vocab_size is missing"):
        GPTConfig.from_hf_config({k: v for k, v in shipped("qwen2.5-7b").items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="config dict: n_heads=28 is not a multiple of n_kv_heads=5 .*'qwen2'"):
        GPTConfig.from_hf_config(dict(shipped("qwen2.5-7b"), num_key_value_heads=5))
    with pytest.raises(ValueError, match=r"config dict: model_type \['llama'\] is not one"):
        GPTConfig.from_hf_config(dict(shipped("llama-3.1-8b"), model_type=["llama"]))
    with pytest.raises(TypeError, match="a path to a config.json or a dict, not int"):
        GPTConfig.from_hf_config(3)


# The course's own configs: the same reprs (they key the grader's reference values) and the same models.
COURSE_COUNTS = {"tiny": 918_144, "tiny-mha": 430_752, "small": 58_466_816, "medium": 200_827_904}


@pytest.mark.parametrize("name", sorted(COURSE_COUNTS))
def test_a_course_config_builds_the_model_it_built_before(name):
    cfg = COURSE_CONFIGS[name]
    assert (cfg.qkv_bias, cfg.head_dim_override, cfg.post_norms) == (False, None, False)
    assert cfg.q_dim == cfg.d_model and cfg.head_dim == cfg.d_model // cfg.n_heads
    assert n_params_of_config(cfg) == COURSE_COUNTS[name]
    with torch.device("meta"):
        model = GPT(cfg)
    assert not any(name.endswith("bias") or "_out_norm" in name for name, _ in model.named_parameters())


def test_course_reprs_are_unchanged():
    assert repr(COURSE_CONFIGS["tiny"]) == (
        "GPTConfig(vocab_size=2048, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=384, "
        "tie_embeddings=False, max_seq_len=512, norm_eps=1e-05, rope_theta=500000.0, name='course-tiny')")
    assert "head_dim_override=256" in repr(GPTConfig.from_hf_config(HF_CONFIG_DIR / "gemma-2-9b.json"))


def test_published_llama_counts_are_unchanged():
    assert [n_params_of_config(c) for c in (LLAMA_3_1_8B, LLAMA_3_1_70B, LLAMA_3_1_405B, LLAMA_3_2_1B)] == [
        8_030_261_248, 70_553_706_496, 405_853_388_800, 1_235_814_400]


def test_head_dim_override_is_checked():
    base = dict(vocab_size=64, d_model=40, n_layers=1, n_heads=3, n_kv_heads=1, ffn_hidden=64)
    with pytest.raises(ValueError, match="d_model=40 is not a multiple of n_heads=3"):
        GPTConfig(**base)
    assert GPTConfig(**base, head_dim_override=16).q_dim == 48
    with pytest.raises(ValueError, match="head_dim_override must be None or an even int"):
        GPTConfig(**base, head_dim_override=15)


def test_a_small_model_with_every_option_trains_and_recomputes_alike():
    cfg = GPTConfig(vocab_size=97, d_model=40, n_layers=2, n_heads=3, n_kv_heads=1, ffn_hidden=64, max_seq_len=32,
                    tie_embeddings=True, qkv_bias=True, head_dim_override=16, post_norms=True)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    results = []
    for mode in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = GPT(cfg, recompute=mode)
        loss = model(idx, idx)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    assert all(p.grad is not None for p in model.parameters())
    assert model.blocks[0].attn.wqkv.bias.grad.abs().sum() > 0
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        for g, g0 in zip(grads, results[0][1]):
            torch.testing.assert_close(g, g0)


def test_the_config_files_ship_with_the_package():
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for path in HF_CONFIG_DIR.glob("*.json"):
        relative = path.relative_to(ROOT / "memfit").as_posix()
        assert any(fnmatch(relative, glob) for glob in package_data["memfit"]), f"{relative} is not package data"


def test_selective_recomputation_keeps_a_biased_projection_s_output():
    """A projection with a bias runs as addmm, not mm: selective recomputation keeps it as it keeps the others."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                self.seen.append(func)
            return func(*args, **(kwargs or {}))

    cfg = GPTConfig(vocab_size=97, d_model=48, n_layers=1, n_heads=3, n_kv_heads=1, ffn_hidden=64, qkv_bias=True)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    recomputed = {}
    for mode in ("selective", "full"):
        loss = GPT(cfg, recompute=mode)(idx, idx)
        with Matmuls() as seen:
            loss.backward()
        recomputed[mode] = seen.seen.count(torch.ops.aten.addmm.default)
    assert recomputed == {"selective": 0, "full": 1}
