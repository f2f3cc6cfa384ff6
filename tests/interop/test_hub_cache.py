"""Model ids resolved in a local HF cache built in the test (no network): present, absent,
revisions, environment variables, the CLI and the spec. The reference for where a snapshot
lives is ``huggingface_hub``'s own offline lookup."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from headwise.cli import main
from headwise.errors import CheckpointError, SpecError
from headwise.interop import load_hf
from headwise.interop.hub_cache import hub_cache_dir, resolve_model, snapshot_dir
from headwise.runspec import load_spec

transformers = pytest.importorskip("transformers")

MAIN, V2 = "a" * 40, "b" * 40


@pytest.fixture()
def cache(tmp_path, monkeypatch, hf_model_dir) -> Path:
    """``<tmp>/hub/models--org--tiny`` with ``main`` (the GPT-2 model) and tag ``v2`` (the
    untied ReLU GPT-2) as two snapshots, and ``HF_HUB_CACHE`` pointing at it."""
    root = tmp_path / "hub"
    repo = root / "models--org--tiny"
    for commit, family, ref in ((MAIN, "gpt2", "main"), (V2, "gpt2-untied-relu", "v2")):
        shutil.copytree(hf_model_dir(family)[1], repo / "snapshots" / commit)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes no newline
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("revision,commit", [(None, MAIN), ("main", MAIN), ("v2", V2),
                                             (V2, V2)])
def test_id_resolves_like_huggingface_hub(cache, revision, commit):
    from huggingface_hub import snapshot_download

    ours = snapshot_dir("org/tiny", revision)
    assert ours == cache / "models--org--tiny" / "snapshots" / commit
    ref = snapshot_download("org/tiny", revision=revision, cache_dir=cache,
                            local_files_only=True)
    assert Path(ref) == ours
    assert _same(load_hf("org/tiny", revision=revision), load_hf(ours))


def test_absent_id_and_revision_name_where_they_looked(cache):
    with pytest.raises(CheckpointError) as info:
        resolve_model("org/missing")
    assert str(cache / "models--org--missing") in str(info.value)
    with pytest.raises(CheckpointError) as info:
        snapshot_dir("org/tiny", "v3")
    assert f"--revision: 'v3' of 'org/tiny' is not in the local HuggingFace cache (looked for " \
           f"{cache / 'models--org--tiny' / 'refs' / 'v3'}" in str(info.value)
    with pytest.raises(CheckpointError, match=r"--revision: got '\.\./x'"):
        snapshot_dir("org/tiny", "../x")
    with pytest.raises(CheckpointError, match="expected a local directory or a model id"):
        resolve_model("a/b/c")


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hub_cache_dir() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert hub_cache_dir() == tmp_path / "direct"


def test_a_local_directory_wins_over_an_id(cache, tmp_path, monkeypatch, hf_model_dir):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(hf_model_dir("gpt2-untied-relu")[1], tmp_path / "org" / "tiny")
    assert resolve_model("org/tiny") == Path("org/tiny")
    with pytest.raises(CheckpointError, match="a revision applies only to a model id"):
        resolve_model("org/tiny", "v2")


def test_cli_convert_and_analyze_take_an_id(cache, tmp_path, capsys):
    import json

    from headwise.interop import load_converted

    assert main(["convert", "--hf", "org/tiny", "--revision", "v2", "--out",
                 str(tmp_path / "o")]) == 0
    assert "2 layers x 3 heads" in capsys.readouterr().out

    assert _same(load_converted(tmp_path / "o"), load_hf(cache / "models--org--tiny" /
                                                         "snapshots" / V2))
    assert main(["analyze", "--hf", "org/tiny", "--json", str(tmp_path / "a.json")]) == 0

    result = json.loads((tmp_path / "a.json").read_text())
    assert result["model"] == "org/tiny"
    assert result["path"] == str(cache / "models--org--tiny" / "snapshots" / MAIN)
    assert len(result["roles"]) == 2 * 3  # the main snapshot: 2 layers x 3 heads


@pytest.mark.parametrize("argv,message", [
    (["convert", "--hf", "org/missing", "--out", "{tmp}/o"], "--hf: 'org/missing' is neither "
                                                             "a local directory nor in the "
                                                             "local HuggingFace cache (looked "
                                                             "for {cache}/models--org--missing"),
    (["analyze", "--hf", "org/tiny", "--revision", "v9"], "--revision: 'v9' of 'org/tiny' is "
                                                          "not in the local HuggingFace cache"),
    (["analyze", "--hf", "gpt2"], "looked for {cache}/models--gpt2"),
])
def test_cli_missing_id_exits_2_naming_where_it_looked(cache, tmp_path, capsys, argv, message):
    args = [a.format(tmp=tmp_path) for a in argv]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message.format(cache=cache) in err and len(err.strip().splitlines()) == 1


SPEC = """
model: {pretrained: PRETRAINED}
data: {tasks: {copy: {length: 3}}, eval_examples: 16}
train: {steps: 2, batch_size: 4}
"""


def test_spec_pretrained_id_and_revision(cache):
    spec = load_spec(SPEC.replace("PRETRAINED", "{id: org/tiny, revision: v2}"))
    assert spec.model.pretrained is not None
    assert spec.model.pretrained.path == str(cache / "models--org--tiny" / "snapshots" / V2)
    assert (spec.model.pretrained.id, spec.model.pretrained.revision) == ("org/tiny", "v2")
    assert spec.model.config.activation == "relu"  # the v2 snapshot's config
    assert load_spec(SPEC.replace("PRETRAINED", "{id: org/tiny}")).model.config.activation == \
        "gelu_tanh"


@pytest.mark.parametrize("pretrained,message", [
    ("{id: org/missing}", "model.pretrained.id: 'org/missing' is neither a local directory nor "
                          "in the local HuggingFace cache (looked for {cache}/models--org--"
                          "missing"),
    ("{id: org/tiny, revision: v3}", "model.pretrained.revision: 'v3' of 'org/tiny' is not in "
                                     "the local HuggingFace cache"),
    ("{id: org/tiny, path: x}", "model.pretrained: expected exactly one of path"),
    ("{path: x, revision: v2}", "model.pretrained.revision: only used with id"),
    ("{id: 3}", "model.pretrained.id: got 3, expected a non-empty string"),
])
def test_spec_pretrained_errors(cache, pretrained, message):
    with pytest.raises(SpecError) as info:
        load_spec(SPEC.replace("PRETRAINED", pretrained))
    assert message.format(cache=cache) in str(info.value)
