"""train(): learns copy, logs parseable per-task metrics, follows its schedule, honours levers."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from headwise.config import ModelConfig
from headwise.control.objective import Objective
from headwise.data import CopyTask, Mixture, ModularAdditionTask, SortTask, TextTask
from headwise.errors import ConfigError
from headwise.model import build_model
from headwise.training import TrainConfig, TrainState, evaluate, train

CFG = ModelConfig(n_layers=2, n_heads=2, d_model=32, d_ff=48, vocab_size=12, max_seq_len=12)


def _copy() -> Mixture:
    return Mixture({"copy": CopyTask(length=4, vocab_size=12)})


def test_short_run_learns_copy(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = build_model(CFG, seed=0)
    data = _copy()
    before = evaluate(model, data, batch_size=64, n_batches=2, seed=123)
    result = train(model, data, TrainConfig(steps=250, batch_size=32, lr=3e-3, warmup_steps=20,
                                            eval_every=125, eval_batches=2),
                   out_dir=tmp_path, progress=False)
    after = evaluate(model, data, batch_size=64, n_batches=2, seed=123)
    assert before["tasks"]["copy"]["loss"] > math.log(8) - 0.3  # ~uniform over 8 symbols
    assert after["tasks"]["copy"]["loss"] < 0.5 * before["tasks"]["copy"]["loss"]
    assert after["tasks"]["copy"]["accuracy"] > 0.6
    assert result.step == 250 and result.weights_path == tmp_path / "model.safetensors"
    assert result.metrics["kind"] == "eval" and result.metrics["step"] == 250
    saved = json.loads((tmp_path / "config.json").read_text())
    assert ModelConfig.from_dict(saved) == CFG


def test_metrics_lines_parse_with_per_task_accuracy(tmp_path: Path) -> None:
    data = Mixture({"copy": CopyTask(length=4, vocab_size=12),
                    "add": ModularAdditionTask(modulus=5, vocab_size=12)}, {"copy": 1, "add": 1})
    config = TrainConfig(steps=12, batch_size=16, warmup_steps=4, log_every=3, eval_every=6,
                         eval_batches=1, lr=2e-3, min_lr_ratio=0.2)
    train(build_model(CFG, seed=0), data, config, out_dir=tmp_path, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == [
        ("train", 3), ("train", 6), ("eval", 6), ("train", 9), ("train", 12), ("eval", 12)]
    for r in lines:
        assert set(r["tasks"]) == {"copy", "add"}
        for stats in r["tasks"].values():
            assert 0.0 <= stats["accuracy"] <= 1.0 and stats["loss"] > 0
            assert 0.0 <= stats["exact"] <= stats["accuracy"] + 1e-9  # equal targets per row
        if r["kind"] == "train":
            assert r["lr"] == pytest.approx(config.lr_at(r["step"] - 1))
            assert sum(s["examples"] for s in r["tasks"].values()) == 3 * 16


def test_lr_schedule_matches_formula() -> None:
    c = TrainConfig(steps=110, batch_size=1, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert [c.lr_at(s) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert c.lr_at(10) == pytest.approx(1.0)
    assert c.lr_at(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert c.lr_at(110) == pytest.approx(0.1)


class _Recorder(torch.nn.Module):
    """Wraps a model and records the keyword arguments of each call."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.calls: list[dict[str, Any]] = []

    def forward(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        self.calls.append(kwargs)
        return self.inner(tokens, **kwargs)

    def hooks(self, *hooks: Any) -> Any:
        return self.inner.hooks(*hooks)


def test_task_ids_and_masks_reach_the_model_and_callbacks_stop() -> None:
    model = _Recorder(build_model(CFG, seed=0))
    data = Mixture({"copy": CopyTask(length=4, vocab_size=12),
                    "add": ModularAdditionTask(modulus=5, vocab_size=12)})
    seen: list[int] = []

    def stop_at_4(state: TrainState) -> None:
        seen.append(state.step)
        state.stop = state.step >= 4

    result = train(model, data, TrainConfig(steps=20, batch_size=8, eval_every=2,
                                            eval_batches=1), callbacks=[stop_at_4],
                   progress=False)
    assert seen == [2, 4] and result.stopped_early and result.step == 4
    call = model.calls[0]
    assert set(call) == {"attention_mask", "task_ids"}
    assert call["task_ids"].shape == (8,) and set(call["task_ids"].tolist()) <= {0, 1}
    assert call["attention_mask"] is not None  # add (T=5) is padded to copy's T=10


def test_frozen_parameters_stay_bitwise_and_decay_only_matrices() -> None:
    model = build_model(CFG, seed=0)
    model.blocks[0].attn.q_proj.weight.requires_grad_(False)
    frozen = model.blocks[0].attn.q_proj.weight.clone()
    groups: list[list[dict[str, Any]]] = []

    def grab(opt: torch.optim.Optimizer) -> None:
        groups.append(opt.param_groups)

    train(model, _copy(), TrainConfig(steps=3, batch_size=4, weight_decay=0.5),
          optimizer_hooks=[grab], progress=False)
    assert torch.equal(model.blocks[0].attn.q_proj.weight, frozen)
    decay, no_decay = groups[0]
    assert decay["weight_decay"] == 0.5 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() == 1 for p in no_decay["params"])
    n_trainable = sum(p.requires_grad for p in model.parameters())
    assert len(decay["params"]) + len(no_decay["params"]) == n_trainable


@pytest.mark.parametrize("bf16", [True, False])
def test_bf16_autocast_runs(bf16: bool) -> None:
    """With bf16 the projections compute in bfloat16 (autocast ran); weights stay float32."""
    model = build_model(CFG, seed=0)
    seen: set[torch.dtype] = set()
    hook = model.blocks[0].attn.q_proj.register_forward_hook(
        lambda mod, args, out: seen.add(out.dtype) if mod.training else None)
    result = train(model, _copy(), TrainConfig(steps=3, batch_size=4, bf16=bf16, log_every=1),
                   progress=False)
    hook.remove()
    assert seen == {torch.bfloat16 if bf16 else torch.float32}
    assert math.isfinite(result.metrics["loss"])
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_data_must_fit_the_model() -> None:
    data = Mixture({"sort": SortTask(length=4, vocab_size=20)})
    with pytest.raises(ConfigError, match="data.tasks.sort.vocab_size: got 20"):
        train(build_model(CFG), data, TrainConfig(steps=1, batch_size=2), progress=False)
    with pytest.raises(ConfigError, match="resume: got True without out_dir"):
        train(build_model(CFG), _copy(), TrainConfig(steps=1, batch_size=2), resume=True)
    with pytest.raises(ConfigError, match="objectives: name 'const' appears 2 times"):
        train(build_model(CFG), _copy(), TrainConfig(steps=1, batch_size=2),
              objectives=[_ConstObjective(1.0), _ConstObjective(2.0)])


def test_next_token_text_refuses_a_bidirectional_model(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("a few words of text\n" * 30)
    data = Mixture({"lm": TextTask(path=str(tmp_path / "c.txt"), seq_len=8)})
    encoder = build_model(ModelConfig(n_layers=1, n_heads=2, d_model=8, vocab_size=256,
                                      max_seq_len=8, causal=False))
    with pytest.raises(ConfigError, match=r"^data.tasks.lm.task: 'text' is next-token "
                                          r"prediction, which model.causal=false sees"):
        train(encoder, data, TrainConfig(steps=1, batch_size=2), progress=False)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"steps": 0}, "steps: got 0, expected an integer >= 1"),
    ({"batch_size": 2.5}, "batch_size: got 2.5"),
    ({"lr": -1}, "lr: got -1, expected a positive number"),
    ({"betas": (0.9,)}, "betas: got (0.9,)"),
    ({"min_lr_ratio": 2}, "min_lr_ratio: got 2"),
    ({"warmup_steps": 20, "steps": 10}, "warmup_steps: got 20, expected an integer <= steps"),
    ({"grad_clip": -0.1}, "grad_clip: got -0.1"),
    ({"bf16": "yes"}, "bf16: got 'yes', expected true or false"),
])
def test_config_errors_name_the_field(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**kwargs)


def test_config_from_dict() -> None:
    assert TrainConfig.from_dict({"steps": 5, "betas": [0.8, 0.9]}).betas == (0.8, 0.9)
    with pytest.raises(ConfigError, match=r"train.stpes: unknown field \(did you mean 'steps'"):
        TrainConfig.from_dict({"stpes": 5})
    with pytest.raises(ConfigError, match="train.lr: got 0"):
        TrainConfig.from_dict({"lr": 0})
    c = TrainConfig(steps=7)
    assert TrainConfig.from_dict(c.to_dict()) == c


def test_task_loss_matches_explicit_per_example_reference() -> None:
    from headwise.data import IGNORE
    from headwise.training import task_loss

    data = Mixture({"copy": CopyTask(length=3, vocab_size=12),
                    "add": ModularAdditionTask(modulus=5, vocab_size=12)})
    batch = data.sample(9, torch.Generator().manual_seed(0))
    logits = torch.randn(9, batch.tokens.shape[1], 12)
    loss, stats = task_loss(logits, batch, 2)
    per_example, correct, counts = [], [0, 0], [0, 0]
    for b in range(9):
        rows = [t for t in range(batch.tokens.shape[1]) if batch.targets[b, t] != IGNORE]
        ce = torch.nn.functional.cross_entropy(logits[b, rows], batch.targets[b, rows])
        per_example.append(float(ce))
        task = int(batch.task_ids[b])
        correct[task] += sum(int(logits[b, t].argmax() == batch.targets[b, t]) for t in rows)
        counts[task] += len(rows)
    assert float(loss) == pytest.approx(sum(per_example) / 9, rel=1e-6)
    assert stats[:, 1].tolist() == correct and stats[:, 2].tolist() == counts
    ids = batch.task_ids.tolist()
    for task in (0, 1):
        expected = sum(v for v, t in zip(per_example, ids, strict=True) if t == task)
        assert float(stats[task, 0]) == pytest.approx(expected, rel=1e-6)


class _ConstObjective(Objective):
    """A duck-typed objective with no hooks and a constant (weighted) value."""

    def __init__(self, value: float) -> None:
        self.name, self.weight, self.value = "const", 1.0, value

    def hooks(self) -> list[Any]:
        return []

    def loss(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None
             ) -> tuple[float, dict[str, float]]:
        return self.weight * self.value, {"L0.H0": self.value}


def test_objective_values_are_logged_and_nan_stops_with_a_clear_error(tmp_path: Path) -> None:
    train(build_model(CFG, seed=0), _copy(), TrainConfig(steps=2, batch_size=4, log_every=2),
          objectives=[_ConstObjective(0.5)], out_dir=tmp_path, progress=False)
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["objectives"] == {"const": {"loss": 0.5, "weight": 1.0,
                                              "heads": {"L0.H0": 0.5}}}
    assert record["loss"] == pytest.approx(record["task_loss"] + 0.5)
    with pytest.raises(FloatingPointError, match="loss is nan at step 1"):
        train(build_model(CFG, seed=0), _copy(), TrainConfig(steps=2, batch_size=4, log_every=1),
              objectives=[_ConstObjective(float("nan"))], progress=False)


def test_resuming_a_stopped_run_does_not_train_further(tmp_path: Path) -> None:
    def stop_at_4(state: TrainState) -> None:
        state.extra["seen"] = state.step
        state.stop = state.step >= 4

    config = TrainConfig(steps=20, batch_size=8, eval_every=2, eval_batches=1,
                         checkpoint_every=3)
    first = train(build_model(CFG, seed=0), _copy(), config, callbacks=[stop_at_4],
                  out_dir=tmp_path, progress=False)
    assert first.checkpoints == [3, 4] and first.stopped_early
    weights = load_file(tmp_path / "model.safetensors")
    again = train(build_model(CFG, seed=0), _copy(), config, callbacks=[stop_at_4],
                  out_dir=tmp_path, resume=True, progress=False)
    assert (again.step, again.stopped_early, again.extra) == (4, True, {"seen": 4})
    assert again.metrics["step"] == 4 and "copy" in again.metrics["tasks"]
    again_weights = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(weights[k], again_weights[k]) for k in weights)


def test_clip_grad_norm_is_bitwise_torchs() -> None:
    from headwise.training.loop import clip_grad_norm

    a, b = build_model(CFG, seed=0), build_model(CFG, seed=0)
    x = torch.randint(0, 12, (3, 6))
    for m in (a, b):
        m(x).pow(2).sum().backward()
    ours = clip_grad_norm(list(a.parameters()), 0.5)
    ref = torch.nn.utils.clip_grad_norm_(list(b.parameters()), 0.5)
    assert torch.equal(ours, ref)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert (pa.grad is None and pb.grad is None) or torch.equal(pa.grad, pb.grad)


def test_objective_sums_average_tensor_logs_on_read() -> None:
    from headwise.training.distributed import DistContext
    from headwise.training.evaluate import ObjectiveSums

    obj = _ConstObjective(0.0)
    sums = ObjectiveSums([obj], torch.device("cpu"))
    for value in (1.0, 2.0, 6.0):
        sums.add([(torch.tensor(value), {"L0.H0": torch.tensor(value / 2),
                                         "L0.H1": torch.tensor(-value)})])
    record = sums.record(DistContext(), 3)
    assert record == {"const": {"loss": 3.0, "weight": 1.0,
                                "heads": {"L0.H0": 1.5, "L0.H1": -3.0}}}


def test_objective_hooks_are_detached_at_evaluation_points() -> None:
    from headwise.control.objectives import PatternObjective

    model = build_model(CFG, seed=0)
    objective = PatternObjective(model, "L1.H0", "previous_token")
    seen: list[bool] = []

    def probe(state: TrainState) -> None:
        seen.append(any(p.active for p in state.model.hook_points().values()))

    train(model, _copy(), TrainConfig(steps=4, batch_size=4, eval_every=2, eval_batches=1),
          objectives=[objective], callbacks=[probe], progress=False)
    assert seen == [False, False]
    assert not any(p.active for p in model.hook_points().values())


def test_signal_before_the_first_step_is_an_interrupt_without_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal that arrives before step 1 of a fresh run ends it with ``Interrupted`` naming
    no checkpoint (there is none to resume from), not an IndexError."""
    import signal
    from contextlib import contextmanager

    import headwise.training.loop as loop
    from headwise.training.interrupt import Interrupted, SignalFlag

    @contextmanager
    def signalled(*args: Any, **kwargs: Any) -> Any:
        yield SignalFlag(signal.SIGTERM)

    monkeypatch.setattr(loop, "catch_signals", signalled)
    with pytest.raises(Interrupted) as e:
        train(build_model(CFG, seed=0), _copy(), TrainConfig(steps=20, batch_size=8),
              out_dir=tmp_path, progress=False)
    assert e.value.step == 0 and e.value.checkpoint is None


def test_a_callback_with_its_own_cadence_runs_at_it_and_not_at_evaluation_points() -> None:
    """``call_every``: called every that many steps and at the last, with the last evaluation
    record; the others at evaluation points only (the enforcer measures at its own points)."""
    seen: dict[str, list[tuple[int, Any]]] = {"own": [], "eval": []}

    class Own:
        call_every = 4

        def __call__(self, state: TrainState) -> None:
            seen["own"].append((state.step, state.metrics.get("step")))

    def at_eval(state: TrainState) -> None:
        seen["eval"].append((state.step, state.metrics["kind"]))

    config = TrainConfig(steps=10, batch_size=8, log_every=5, eval_every=5, eval_batches=1)
    train(build_model(CFG, seed=0), _copy(), config, callbacks=[Own(), at_eval],
          progress=False)
    assert [s for s, _ in seen["own"]] == [4, 8, 10]
    assert seen["own"][0][1] is None  # nothing logged before step 5
    assert seen["own"][1][1] == 5 and seen["own"][2][1] == 10  # the last record it had
    assert seen["eval"] == [(5, "eval"), (10, "eval")]
