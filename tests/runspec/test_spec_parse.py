"""Spec parsing: valid specs become the expected dataclasses; YAML quirks are handled."""

from __future__ import annotations

from pathlib import Path

import pytest

from headwise.config import PRESETS, ModelConfig
from headwise.errors import SpecError
from headwise.heads import Head
from headwise.runspec import load_spec
from headwise.training.config import TrainConfig

FULL = """
name: full
model: {preset: tiny, n_layers: 2}
data:
  tasks:
    copy: {length: 3, weight: 2}
    backwards: {task: reverse, length: 3}
  eval_examples: 64
  eval_seed: 7
train: {steps: 5, batch_size: 8, lr: 3e-3, betas: [0.8, 0.9]}
heads:
  L0.H0: {mask: previous_token}
  L0.H1: {mask: {local: {window: 2}}, entropy: {at_most: 0.8, weight: 0.5}}
  L0.H2: {objective: {target: induction, kind: kl, weight: 0.25}}
  L1.H0: {tasks: [copy]}
  L1.H1: {tasks: backwards, trainable: true}
  L1.*: {diversity: 0.1}
contract:
  - {head: L0.H0, score: previous_token, at_least: 0.99}
"""


def test_full_spec_parses_into_dataclasses() -> None:
    spec = load_spec(FULL)
    assert spec.model.preset == "tiny"
    assert spec.model.config == PRESETS["tiny"].replace(n_layers=2)
    assert spec.data.names == ("copy", "backwards")
    copy, back = spec.data.tasks
    # copy and reverse share an input format, but task gates (heads.*.tasks) tell them apart:
    # no markers under task_tokens: auto, and the tasks get the whole vocabulary.
    vocab = PRESETS["tiny"].vocab_size
    assert spec.data.markers == ()
    assert (copy.task, copy.weight, dict(copy.kwargs)) == (
        "copy", 2.0, {"length": 3, "vocab_size": vocab})
    assert back.task == "reverse"
    assert (spec.data.eval_examples, spec.data.eval_seed) == (64, 7)
    assert spec.train == TrainConfig(steps=5, batch_size=8, lr=3e-3, betas=(0.8, 0.9))
    rules = {r.selector: r for r in spec.heads}
    assert rules["L0.H0"].mask is not None and rules["L0.H0"].mask.name == "previous_token"
    local = rules["L0.H1"].mask
    assert local is not None and (local.name, dict(local.params)) == ("local", {"window": 2})
    entropy = rules["L0.H1"].entropy
    assert entropy is not None and (entropy.at_least, entropy.at_most, entropy.weight) == (
        None, 0.8, 0.5)
    obj = rules["L0.H2"].objective
    assert obj is not None and (obj.target, obj.kind, obj.weight) == ("induction", "kl", 0.25)
    assert rules["L1.H0"].tasks == ("copy",)
    assert rules["L1.H1"].tasks == ("backwards",) and rules["L1.H1"].trainable
    assert rules["L1.*"].heads == tuple(Head(1, h) for h in range(3))
    assert spec.gates is not None and spec.gates.kind == "fixed"  # implied by tasks
    assert spec.contract.to_list() == [{"head": "L0.H0", "score": "previous_token",
                                       "at_least": 0.99}]
    assert spec.contract[0].kind == "score" and str(spec.contract[0].head) == "L0.H0"
    # what a forecaster reads against the range of runs it was fit on
    assert spec.forecast_context == {
        "n_layers": 2, "n_heads": PRESETS["tiny"].n_heads, "tasks": ["copy", "reverse"],
        "levers": ["diversity", "entropy", "gate", "mask", "objective", "trainable"]}


def test_load_from_file_resolves_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("hello world, " * 50)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text("model: {vocab_size: 256, max_seq_len: 16}\n"
                         "data: {tasks: {lm: {task: text, path: corpus.txt, seq_len: 8}}}\n")
    spec = load_spec(spec_path)
    assert spec.data.tasks[0].kwargs["path"] == str(tmp_path / "corpus.txt")
    assert "vocab_size" not in spec.data.tasks[0].kwargs  # text tasks bring their own
    assert spec.text == spec_path.read_text()


def test_yaml_exponent_without_dot_is_a_float() -> None:
    spec = load_spec("model: {}\ndata: {tasks: [copy]}\ntrain: {lr: 1e-4, weight_decay: 0}\n")
    assert spec.train.lr == 1e-4 and isinstance(spec.train.lr, float)


def test_defaults_when_sections_absent() -> None:
    spec = load_spec("model: {}\ndata: {tasks: [copy, sort]}\n")
    assert spec.model.config == ModelConfig()
    assert spec.train == TrainConfig()
    assert spec.heads == () and spec.gates is None and spec.adapters == ()
    assert len(spec.contract) == 0 and not spec.contract
    assert spec.head_levers == []


def test_yaml_never_constructs_python_objects() -> None:
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec("model: !!python/object/apply:os.system ['echo hi']\ndata: {tasks: [copy]}\n")


def test_learned_gates_and_adapters() -> None:
    spec = load_spec("model: {n_layers: 2}\ndata: {tasks: [copy, reverse]}\n"
                     "gates: {kind: learned, layers: [1], l0_weight: 0.05}\n"
                     "adapters: {targets: [q, v], rank: 2, heads: L1.H0-1}\n")
    assert spec.gates is not None
    assert (spec.gates.kind, spec.gates.layers, spec.gates.l0_weight) == ("learned", (1,), 0.05)
    (adapter,) = spec.adapters
    assert adapter.targets == ("q", "v") and adapter.rank == 2 and adapter.alpha == 2.0
    assert adapter.heads == (Head(1, 0), Head(1, 1))
    assert spec.head_levers == ["adapter", "learned_gate"]


@pytest.mark.parametrize("text,message", [
    ("model: {}\ndata: {tasks: [copy]}\nheads: {L0.H0: {}}\n", "heads.L0.H0: got an empty"),
    ("model: {}\ndata: {tasks: [copy]}\nheads: {L0.H0-1: {diversity: 0.1}}\n",
     "heads.L0.H0-1.diversity: the diversity term acts on all heads of a layer"),
    ("model: {}\ndata: {tasks: [copy]}\nheads: {L0.H0: {freeze: true, trainable: true}}\n",
     "heads.L0.H0: freeze and trainable are both true"),
    ("model: {}\ndata: {tasks: [copy]}\nheads: {L0.H0: {entropy: {at_least: 0.9, at_most: 0.5}}}\n",
     "heads.L0.H0.entropy: at_least=0.9 > at_most=0.5"),
    ("model: {}\ndata: {tasks: [copy]}\nheads: {L0.H0: {entropy: {at_most: 1.5}}}\n",
     "heads.L0.H0.entropy.at_most: got 1.5, expected a number"),
    ("model: {}\ndata: {tasks: [copy]}\ngates: {kind: fixed}\n",
     "gates.kind: fixed gates need a task assignment"),
    ("model: {}\ndata: {tasks: [copy]}\nheads: {L0.H0: {freeze: true}}\n"
     "adapters: {targets: [q], rank: 2}\n", "heads.L0.H0.freeze: adapters freeze every base"),
    ("model: {}\ndata: {tasks: [copy]}\nadapters: [{targets: [q], rank: 2}, "
     "{targets: [v], rank: 2}]\n", "adapters: got 2 adapter sets"),
    ("model: {attn_only: true}\ndata: {tasks: [copy]}\nadapters: {targets: [up], rank: 2}\n",
     "adapters.targets: the model is attention-only"),
    ("model: {vocab_size: 8}\ndata: {tasks: {copy: {vocab_size: 9}}}\n",
     "data.tasks.copy: the task uses 9 token ids, more than model.vocab_size=8"),
    ("model: {}\ndata: {tasks: [copy]}\nname: 3\n", "name: got 3, expected a non-empty string"),
    ("model: {}\ndata: {tasks: [copy]}\nheads:\n  *.H0: {freeze: true}\n",
     "<spec>: not valid YAML (line 4, column 4"),
    ("model: {attn_only: true}\ndata: {tasks: [copy]}\nffn: {weight: 0.1}\n",
     "ffn: the model is attention-only"),
    ("model: {}\ndata: {tasks: [copy]}\nffn: {weight: 0.1, layers: [2]}\n",
     "ffn.layers[0]: got 2, expected an integer in [0, 1]"),
])
def test_more_errors_name_the_field(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        load_spec(text)
    assert str(info.value).startswith(message), str(info.value)


def test_unquoted_star_selector_gets_a_hint() -> None:
    with pytest.raises(SpecError, match=r"must be quoted, e.g. \"\*\.H0\""):
        load_spec("model: {}\ndata: {tasks: [copy]}\nheads:\n  *.H0: {freeze: true}\n")
    spec = load_spec("model: {}\ndata: {tasks: [copy]}\nheads:\n  '*.H0': {freeze: true}\n")
    assert len(spec.heads[0].heads) == 2


def test_compiled_levers_reach_the_model(tmp_path: Path) -> None:
    """Each spec lever ends up as the headwise.control object on the right heads."""
    import torch

    from headwise.control.gates import gate_table
    from headwise.control.masks import LayerMask
    from headwise.pipeline import compile_spec
    from headwise.training import train

    spec = load_spec("""
model: {n_layers: 2, n_heads: 4, d_model: 16, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}, rev: {task: reverse, length: 4}}, eval_examples: 16}
train: {steps: 3, batch_size: 8}
heads:
  L0.H0: {mask: {local: {window: 2}}}
  L0.H1: {objective: {target: self, kind: mse, weight: 0.5}, entropy: {at_most: 1.0}}
  L1.H0: {tasks: [copy]}
  L1.H1: {tasks: [rev]}
  L1.*: {diversity: 0.1}
  L0.H3: {freeze: true}
""")
    compiled = compile_spec(spec)
    model = compiled.model
    mask = model.blocks[0].attn.head_mask
    assert isinstance(mask, LayerMask)
    allowed = mask(4, None, torch.device("cpu"))  # (H, T, T)
    assert allowed[0].tolist() == [[abs(i - j) < 2 for j in range(4)] for i in range(4)]
    assert allowed[1:].all()
    names = [o.name for o in compiled.objectives]
    assert names == ["pattern[L0.H1]", "entropy[L0.H1]", "diversity[L1.*]"]
    assert compiled.objectives[0].kind == "mse" and compiled.objectives[0].weight == 0.5
    gates = gate_table(model, ["copy", "rev"]).values.tolist()
    assert gates[0][4:] == [1.0, 0.0, 1.0, 1.0] and gates[1][4:] == [0.0, 1.0, 1.0, 1.0]
    assert gates[0][:4] == [1.0] * 4  # layer 0 has no gate
    assert compiled.eval_batch.tokens.shape == (16, 10)
    q_before = model.blocks[0].attn.q_proj.weight.detach().clone()
    train(model, compiled.data, spec.train, objectives=compiled.objectives,
          optimizer_hooks=compiled.optimizer_hooks, progress=False)
    q_after = model.blocks[0].attn.q_proj.weight.detach()
    d = model.config.d_head
    assert torch.equal(q_after[3 * d:], q_before[3 * d:])  # frozen L0.H3: bitwise unchanged
    assert not torch.equal(q_after[:d], q_before[:d])  # L0.H0 trains


def test_compile_learned_gates_and_head_scoped_lora() -> None:
    from headwise.control.gates import LearnedGates
    from headwise.control.lora_layer import LoRALinear
    from headwise.pipeline import compile_spec

    spec = load_spec("""
model: {n_layers: 2, n_heads: 2, d_model: 8, vocab_size: 12, max_seq_len: 10}
data: {tasks: {copy: {length: 4}, sort: {length: 4}}}
gates: {kind: learned, layers: 1, l0_weight: 0.05}
adapters: {targets: [q, o], rank: 2, alpha: 4, heads: L1.H1}
""")
    compiled = compile_spec(spec)
    assert isinstance(compiled.gates, LearnedGates) and list(compiled.gates.gates) == [1]
    (penalty,) = compiled.objectives
    assert penalty.name == "l0" and penalty.weight == 0.05
    attn = compiled.model.blocks[1].attn
    assert isinstance(attn.q_proj, LoRALinear) and isinstance(attn.o_proj, LoRALinear)
    assert not isinstance(compiled.model.blocks[0].attn.q_proj, LoRALinear)
    trainable = {n for n, p in compiled.model.named_parameters() if p.requires_grad}
    assert trainable == {"blocks.1.attn.q_proj.lora_A", "blocks.1.attn.q_proj.lora_B",
                         "blocks.1.attn.o_proj.lora_A", "blocks.1.attn.o_proj.lora_B",
                         "blocks.1.attn.head_gate.log_alpha"}


def test_compile_ffn_penalty() -> None:
    from headwise.control.objectives import FFNPenalty
    from headwise.pipeline import compile_spec

    spec = load_spec("model: {n_layers: 2}\ndata: {tasks: [copy]}\n"
                     "ffn: {weight: 0.02, layers: 1}\n")
    (penalty,) = compile_spec(spec).objectives
    assert isinstance(penalty, FFNPenalty)
    assert (penalty.layers, penalty.kind, penalty.weight) == ([1], "l1", 0.02)


def test_a_file_task_split_in_a_spec_is_refused(tmp_path: Path) -> None:
    """A run reads each file's three splits itself: a split written in the spec would be
    silently replaced, so it is refused by name."""
    rows = tmp_path / "qa.jsonl"
    rows.write_text("".join(f'{{"prompt": "{i}", "completion": "{i % 7}"}}\n'
                            for i in range(60)))
    spec = (f"model: {{n_layers: 1, n_heads: 2, d_model: 16, vocab_size: 256, max_seq_len: 16}}\n"
            f"data: {{tasks: {{qa: {{task: pairs, path: {rows}, split: verify}}}}}}\n")
    with pytest.raises(SpecError, match=r"^data\.tasks\.qa\.split: not a spec key"):
        load_spec(spec)
