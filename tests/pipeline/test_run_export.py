"""``headwise export RUN --hf OUT`` on trained runs: LoRA merged, tokenizer copied, levers with
no HuggingFace equivalent refused (exit 2, one line naming the spec field)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from headwise import export_hf
from headwise.cli import main
from headwise.errors import ConfigError
from headwise.interop import load_hf
from headwise.interop.hf_export import export_hf as interop_export_hf
from headwise.pipeline.finished import load_compiled

transformers = pytest.importorskip("transformers")

LORA_SPEC = """
model: {pretrained: {path: LLAMA}}
data: {tasks: {copy: {length: 3}}, eval_examples: 16}
train: {steps: 4, batch_size: 8, lr: 0.05}
adapters: {targets: [q, k, v, o], rank: 2, alpha: 4, heads: L1.H2}
"""


def _pretrained_llama(where: Path) -> Path:
    """A tiny HF Llama with GQA (4 query heads on 2 kv heads) and a word-level tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, hidden_size=32, intermediate_size=44,
                                   vocab_size=30, max_position_embeddings=32)
    transformers.LlamaForCausalLM(cfg).save_pretrained(where)
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "there": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(where / "tokenizer.json"))
    return where


def _train(tmp_path: Path, spec_text: str) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text)
    run = tmp_path / "run"
    assert main(["train", str(spec), "--out", str(run), "--quiet"]) == 0
    return run


def test_lora_run_exports_merged_weights_with_its_tokenizer(tmp_path, capsys):
    base_dir = _pretrained_llama(tmp_path / "llama")
    # An absolute path: the run's spec.yaml is re-read from the run directory by load_compiled.
    run = _train(tmp_path, LORA_SPEC.replace("LLAMA", str(base_dir)))
    capsys.readouterr()
    out = tmp_path / "hf"
    assert main(["export", str(run), "--hf", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "LlamaForCausalLM" in printed and "tokenizer files: tokenizer.json" in printed
    assert (out / "tokenizer.json").read_bytes() == (base_dir / "tokenizer.json").read_bytes()

    compiled = load_compiled(run)  # the run's model, adapters unmerged
    model = compiled.model
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    tokens = torch.randint(0, 30, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(input_ids=tokens).logits, atol=1e-4, rtol=0)

    # The exported weights are W + B A * alpha / r, computed here from the run's factors, in
    # head 2's q/o slices and kv head 1's k/v rows of layer 1, and the base weights elsewhere.
    base, exported = load_hf(base_dir).state_dict(), load_hf(out).state_dict()
    for p in ("q", "k", "v", "o"):
        lora = model.blocks[1].attn.get_submodule(f"{p}_proj")
        delta = lora.lora_B.detach() @ lora.lora_A.detach() * (4 / 2)
        assert delta.abs().max() > 0  # training moved the adapter
        key = f"blocks.1.attn.{p}_proj.weight"
        expected = base[key].clone()
        rows = slice(16, 24) if p in ("q", "o") else slice(8, 16)  # head 2 / kv head 2 // 2
        if p == "o":
            expected[:, rows] += delta
        else:
            expected[rows] += delta
        torch.testing.assert_close(exported[key], expected, atol=1e-6, rtol=0)
        untouched = torch.ones_like(expected, dtype=torch.bool)
        if p == "o":
            untouched[:, rows] = False
        else:
            untouched[rows] = False
        assert torch.equal(exported[key][untouched], base[key][untouched])
    for key in base:
        if not key.startswith("blocks.1.attn."):
            assert torch.equal(exported[key], base[key]), key

    # --peft: the base weights unmerged (bitwise the pretrained ones) plus a PEFT adapter;
    # PEFT on transformers' model gives the run's logits.
    peft = pytest.importorskip("peft")
    assert main(["export", str(run), "--hf", str(tmp_path / "base"), "--peft",
                 str(tmp_path / "adapter")]) == 0
    assert _same(load_hf(tmp_path / "base").state_dict(), base)
    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base",
                                                                local_files_only=True)
    with_adapter = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), with_adapter(input_ids=tokens).logits,
                                   atol=1e-4, rtol=0)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


GATED_SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 3}, rev: {task: reverse, length: 3}}, eval_examples: 16}
train: {steps: 2, batch_size: 4}
heads: {L0.H0: {tasks: [copy]}}
"""
MASKED_SPEC = """
model: {n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 3}}, eval_examples: 16}
train: {steps: 2, batch_size: 4}
heads: {L0.H1: {mask: previous_token}}
"""


@pytest.mark.parametrize("spec,message", [
    (GATED_SPEC, "gates: the run routes tasks through task gates"),
    (MASKED_SPEC, "heads.L0.H1.mask: 'previous_token' is a structural mask"),
])
def test_runs_with_levers_hf_lacks_are_refused(tmp_path, capsys, spec, message):
    run = _train(tmp_path, spec)
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists()


def test_plain_run_exports_and_bad_outputs_exit_2(tmp_path, capsys):
    run = _train(tmp_path, MASKED_SPEC.replace("heads: {L0.H1: {mask: previous_token}}\n", ""))
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(run)]) == 2
    assert "is the run directory itself" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"holds a headwise run \(spec.yaml\)"):
        export_hf(load_compiled(run).model, run, overwrite=True)
    assert main(["export", str(tmp_path / "nowhere"), "--hf", str(tmp_path / "o")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    assert "GPT2LMHeadModel" in capsys.readouterr().out
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err  # the command's names, not the library's
    assert "--hf: " in err and "is not empty" in err and "pass --overwrite" in err
    assert "overwrite=True" not in err
    assert main(["export", str(run), "--hf", str(tmp_path / "hf"), "--overwrite"]) == 0
    assert main(["export", str(run), "--hf", str(tmp_path / "h2"), "--peft",
                 str(tmp_path / "p")]) == 2
    assert "error: --peft: the model has no LoRA adapters" in capsys.readouterr().err
    model = load_compiled(run).model
    back = load_hf(tmp_path / "hf")
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    # The public export_hf takes the run too; the model-level one in interop refuses a path.
    from_api = load_hf(export_hf(run, tmp_path / "api"))
    for key, value in model.state_dict().items():
        assert torch.equal(from_api.state_dict()[key], value), key
    with pytest.raises(ConfigError, match="expected a headwise Transformer"):
        interop_export_hf(run, tmp_path / "o2")  # type: ignore[arg-type]


def test_text_task_tokenizer_is_exported(tmp_path, capsys):
    """A run trained on text through a tokenizer exports that tokenizer; transformers' fast
    tokenizer from the export encodes as the run's data did."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    (tmp_path / "text.txt").write_text("the cat sat on the mat a dog sat on a cat " * 20)
    run = _train(tmp_path, f"""
model: {{n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 8, max_seq_len: 8}}
data: {{tasks: {{lm: {{task: text, path: {tmp_path / 'text.txt'}, seq_len: 6,
                     tokenizer: {tmp_path / 'tok'}}}}}, eval_examples: 8}}
train: {{steps: 2, batch_size: 4}}
""")
    capsys.readouterr()
    assert main(["export", str(run), "--hf", str(tmp_path / "hf")]) == 0
    assert "tokenizer files: tokenizer.json" in capsys.readouterr().out
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" /
                                                                   "tokenizer.json"))
    assert fast("the dog sat")["input_ids"] == [1, 7, 3]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                           local_files_only=True).eval()
    tokens = torch.tensor([[1, 7, 3, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(load_compiled(run).model(tokens), hf(input_ids=tokens).logits,
                                   atol=1e-4, rtol=0)
