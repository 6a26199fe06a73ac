"""Resume rules a user can predict (issue 24): resuming from an older checkpoint starts a new branch that every
later save and `--resume auto` follows; the learning rate is a function of the step and the settings, so a new
--learning-rate or a larger budget takes effect; settings that break exactness are refused unless
--allow-change names them, the others are applied and recorded in metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from toy_training import toy_data, toy_loss, toy_model, train_losses

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.train import Resume, TrainConfig, fit
from bertkit.train import checkpoint as ckpt
from bertkit.train.reporting import METRICS_FILE, read_metrics

BASE = dict(micro_batch_size=4, learning_rate=1e-2, precision="fp32", warmup_steps=0, save_every=2, keep_last=10,
            log_every=1)


def config(**changes) -> TrainConfig:
    return TrainConfig(**{**BASE, "max_steps": 6, **changes})


def names(root: Path) -> list[str]:
    return [p.name for p in ckpt.list_checkpoints(root / "checkpoints")]


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def lrs(run_dir: Path) -> list[float]:
    return [r["lr"] for r in read_metrics(run_dir / METRICS_FILE) if r["kind"] == "train"]


def resume_records(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / METRICS_FILE) if r["kind"] == "resume"]


def test_resuming_an_older_checkpoint_moves_the_newer_ones_aside_and_follows_the_new_branch(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(), tmp_path)
    assert names(tmp_path) == ["step-00000002", "step-00000004", "step-00000006"]
    abandoned = weights(tmp_path / "checkpoints" / "step-00000006")
    step_2 = tmp_path / "checkpoints" / "step-00000002"

    # The branch: from step 2 with half the learning rate (an applied change).
    result = fit(toy_model(), toy_loss, toy_data(), config(learning_rate=5e-3), tmp_path, resume=step_2)
    assert result.step == 6
    assert names(tmp_path) == ["step-00000002", "step-00000004", "step-00000006"]
    assert result.checkpoint == tmp_path / "checkpoints" / "step-00000006"
    branch = weights(result.checkpoint)
    assert any(not torch.equal(branch[k], abandoned[k]) for k in branch)  # saved anew, not the old step 6
    aside = [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(ckpt.ABANDONED_PREFIX)]
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == ["step-00000004", "step-00000006"]
    assert all(torch.equal(weights(aside[0] / "step-00000006")[k], abandoned[k]) for k in abandoned)  # kept

    # metrics.jsonl reads as the branch: steps 1-2 of the first run, then 3-6 of the branch.
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert lrs(tmp_path)[2:] == pytest.approx([5e-3 * (6 - s) / 6 for s in range(2, 6)], abs=1e-15)

    # A later --resume auto continues the branch, not the abandoned run.
    result = fit(toy_model(), toy_loss, toy_data(), config(learning_rate=5e-3, max_steps=8), tmp_path, resume="auto")
    assert resume_records(tmp_path)[-1]["checkpoint"] == str(tmp_path / "checkpoints" / "step-00000006")
    assert result.step == 8


def test_resume_from_the_newest_checkpoint_moves_nothing(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(), tmp_path)
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=8), tmp_path,
        resume=tmp_path / "checkpoints" / "step-00000006")
    assert names(tmp_path) == ["step-00000002", "step-00000004", "step-00000006", "step-00000008"]
    assert not any(p.name.startswith(ckpt.ABANDONED_PREFIX) for p in (tmp_path / "checkpoints").iterdir())


def test_a_new_learning_rate_on_resume_is_applied_and_recorded(tmp_path):
    straight = tmp_path / "straight"
    fit(toy_model(), toy_loss, toy_data(), config(), straight)
    run = tmp_path / "run"
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=6, save_every=3), run, resume=Resume(overwrite=True))
    ckpt.move_newer_aside(run / "checkpoints" / "step-00000003", run / "checkpoints")  # as if stopped at 3
    fit(toy_model(), toy_loss, toy_data(), config(learning_rate=2e-2, save_every=3), run, resume="auto")
    expected = [2e-2 * (6 - s) / 6 for s in range(3, 6)]
    assert lrs(run)[3:] == pytest.approx(expected, abs=1e-15)
    assert lrs(run)[:3] == lrs(straight)[:3]
    record = resume_records(run)[-1]
    assert record["step"] == 3 and record["changed"]["learning_rate"] == [1e-2, 2e-2]
    assert record["lr"] == pytest.approx(expected[0])
    assert record["lr_last_step"] == pytest.approx(1e-2 * 4 / 6)


def test_changes_that_break_exactness_are_refused_unless_allowed(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path)
    for changed, name in ((dict(seed=7), "seed"), (dict(micro_batch_size=5), "global_batch_size"),
                          (dict(shuffle=False), "shuffle"), (dict(optimizer="lamb"), "optimizer")):
        with pytest.raises(BertkitError, match=f"{name} was .* is .*--allow-change {name}"):
            fit(toy_model(), toy_loss, toy_data(), config(max_steps=4, **changed), tmp_path, resume="auto")
    assert names(tmp_path) == ["step-00000002"]  # nothing trained or saved by the refused runs
    result = fit(toy_model(), toy_loss, toy_data(), config(max_steps=4, seed=7, allow_change=("seed",)), tmp_path,
                 resume="auto")
    assert result.step == 4
    assert resume_records(tmp_path)[-1]["changed"] == {"seed": [42, 7], "max_steps": [2, 4]}


def test_a_refused_branch_moves_nothing(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(), tmp_path)
    with pytest.raises(BertkitError, match="--allow-change seed"):
        fit(toy_model(), toy_loss, toy_data(), config(seed=3), tmp_path,
            resume=tmp_path / "checkpoints" / "step-00000002")
    assert names(tmp_path) == ["step-00000002", "step-00000004", "step-00000006"]
    assert not any(p.name.startswith(ckpt.ABANDONED_PREFIX) for p in (tmp_path / "checkpoints").iterdir())


def test_the_callers_identity_is_compared_too(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path,
        resume=Resume(identity={"data": "manifest aaa"}))
    with pytest.raises(BertkitError, match="data was 'manifest aaa' .* is 'manifest bbb'.*--allow-change data"):
        fit(toy_model(), toy_loss, toy_data(), config(max_steps=4), tmp_path,
            resume=Resume("auto", identity={"data": "manifest bbb"}))
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=4, allow_change=("data",)), tmp_path,
        resume=Resume("auto", identity={"data": "manifest bbb"}))
    assert json.loads((ckpt.list_checkpoints(tmp_path / "checkpoints")[-1] / "trainer_state.json").read_text()
                      )["identity"] == {"data": "manifest bbb"}


def test_micro_batch_split_may_change_when_the_global_batch_stays(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2, micro_batch_size=4), tmp_path)
    result = fit(toy_model(), toy_loss, toy_data(),
                 config(max_steps=4, global_batch_size=4, micro_batch_size=2, gradient_accumulation_steps=2),
                 tmp_path, resume="auto")
    assert result.step == 4
    changed = resume_records(tmp_path)[-1]["changed"]
    assert "global_batch_size" not in changed and changed["gradient_accumulation_steps"] == [None, 2]


def test_extending_a_finished_run_continues_on_the_schedule_of_the_new_budget(tmp_path):
    first = fit(toy_model(), toy_loss, toy_data(), config(max_steps=4), tmp_path)
    assert (first.stop_reason, first.step) == ("budget", 4)
    assert lrs(tmp_path)[-1] == pytest.approx(1e-2 * 1 / 4)
    result = fit(toy_model(), toy_loss, toy_data(), config(max_steps=8), tmp_path, resume="auto")
    assert (result.stop_reason, result.step) == ("budget", 8)
    # Steps 5-8 follow the schedule of an 8-step budget: the decay resumes from the new budget's point.
    assert lrs(tmp_path)[4:] == pytest.approx([1e-2 * (8 - s) / 8 for s in range(4, 8)], abs=1e-15)
    assert names(tmp_path)[-1] == "step-00000008"


def test_a_foreign_checkpoint_without_saved_settings_is_not_compared(tmp_path):
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path)
    checkpoint = ckpt.list_checkpoints(tmp_path / "checkpoints")[-1]
    state = ckpt.read_json(checkpoint / "trainer_state.json")
    for key in ("config", "identity", "schedule"):  # as an older bertkit wrote them
        state.pop(key)
    state["scheduler"] = {"last_epoch": 2}
    ckpt.write_json(checkpoint / "trainer_state.json", state)
    (checkpoint / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(checkpoint)
    result = fit(toy_model(), toy_loss, toy_data(), config(max_steps=3, seed=9), tmp_path, resume="auto")
    assert result.step == 3 and len(train_losses(tmp_path)) == 3


def test_allow_change_names_are_checked():
    with pytest.raises(BertkitError, match="--allow-change 'learning_rate'"):
        config(allow_change=("learning_rate",))


def test_pretrain_help_lists_allow_change(capsys):
    assert main(["pretrain", "--help"]) == 0
    assert "--allow-change" in capsys.readouterr().out


def test_a_checkpoint_written_before_the_rename_of_eps_resumes_and_reports_the_change(tmp_path):
    """Issue 36 gave the AdamW epsilon one name (adam_epsilon); checkpoints saved it as `eps` and still resume."""
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path)
    checkpoint = ckpt.list_checkpoints(tmp_path / "checkpoints")[-1]
    state = ckpt.read_json(checkpoint / "trainer_state.json")
    state["config"].pop("adam_epsilon")
    state["config"]["eps"] = 1e-5  # as an older bertkit wrote it, and another value
    ckpt.write_json(checkpoint / "trainer_state.json", state)
    (checkpoint / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(checkpoint)
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=3), tmp_path, resume="auto")
    assert resume_records(tmp_path)[-1]["changed"] == {"adam_epsilon": [1e-5, 1e-6], "max_steps": [2, 3]}


def test_a_checkpoint_that_saved_precision_auto_is_not_reported_as_changed(tmp_path):
    """Older runs saved the --precision setting (auto); runs now save what it resolved to."""
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path)
    checkpoint = ckpt.list_checkpoints(tmp_path / "checkpoints")[-1]
    state = ckpt.read_json(checkpoint / "trainer_state.json")
    state["config"]["precision"] = "auto"
    ckpt.write_json(checkpoint / "trainer_state.json", state)
    (checkpoint / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(checkpoint)
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=3), tmp_path, resume="auto")
    assert resume_records(tmp_path)[-1]["changed"] == {"max_steps": [2, 3]}


KERNELS = {"kernels": {"attention": {"fp32": [32], "bf16": [32, 64]}, "dropout": ["bf16"]}}


def test_the_callers_context_is_recorded_and_a_change_is_listed_not_refused(tmp_path, caplog):
    """`Resume.context` (the kernels the steps run): saved with each checkpoint; another value on resume (another
    probe chose other kernels) is applied and listed like a free setting, never refused."""
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path, resume=Resume(context=KERNELS))
    state = json.loads((ckpt.list_checkpoints(tmp_path / "checkpoints")[-1] / "trainer_state.json").read_text())
    assert state["context"] == KERNELS
    other = {"kernels": {"attention": {"fp32": [], "bf16": [32, 64]}, "dropout": "torch's"}}
    with caplog.at_level("INFO", logger="bertkit.train.resume"):
        fit(toy_model(), toy_loss, toy_data(), config(max_steps=3), tmp_path, resume=Resume("auto", context=other))
    assert resume_records(tmp_path)[-1]["changed"] == {"kernels.attention.fp32": [[32], []],
                                                       "kernels.dropout": [["bf16"], "torch's"], "max_steps": [2, 3]}
    assert 'kernels.dropout was ["bf16"] and is "torch\'s" now' in caplog.text
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=4), tmp_path, resume=Resume("auto", context=other))
    assert resume_records(tmp_path)[-1]["changed"] == {"max_steps": [3, 4]}  # the same kernels: nothing listed


def test_a_checkpoint_without_a_context_is_not_compared_on_it(tmp_path):
    """A checkpoint written before the kernels were recorded resumes without listing them."""
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path)
    checkpoint = ckpt.list_checkpoints(tmp_path / "checkpoints")[-1]
    state = ckpt.read_json(checkpoint / "trainer_state.json")
    assert state.pop("context") == {}
    ckpt.write_json(checkpoint / "trainer_state.json", state)
    (checkpoint / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(checkpoint)
    fit(toy_model(), toy_loss, toy_data(), config(max_steps=3), tmp_path, resume=Resume("auto", context=KERNELS))
    assert resume_records(tmp_path)[-1]["changed"] == {"max_steps": [2, 3]}


@pytest.mark.parametrize("context, message", [({"learning_rate": 1.0}, "names \\['learning_rate'\\] are settings"),
                                              ({"data": "x"}, "names \\['data'\\] are settings"),
                                              ({"kernels": object()}, "must be JSON")])
def test_a_context_that_would_shadow_a_compared_value_or_is_not_json_is_a_callers_bug(tmp_path, context, message):
    """A context named as a setting, an identity or a rule would shadow the value compared (or be refused where it
    should be listed); one that is not JSON would fail only at the first save: both refused before any step."""
    with pytest.raises(ValueError, match=message):
        fit(toy_model(), toy_loss, toy_data(), config(max_steps=2), tmp_path,
            resume=Resume(identity={"data": "manifest"} if "data" in context else {}, context=context))
    assert not (tmp_path / "checkpoints").exists() or names(tmp_path) == []


def test_a_nested_setting_an_older_record_lacks_is_not_compared_one_it_has_is():
    """A run recorded before its distillation kept the teacher's weights resumes; a teacher changed since is refused."""
    from bertkit.settings.rules import differences

    older = {"distillation": {"teacher": "t", "soft": 1.0}}
    now = {"distillation": {"teacher": "t", "teacher_weights": "ab", "soft": 1.0}}
    assert differences(older, now) == []
    found = differences({"distillation": {"teacher": "t", "teacher_weights": "cd"}}, now)
    assert [(d.name, d.then, d.now) for d in found] == [("distillation.teacher_weights", "cd", "ab")]
    assert [d.name for d in differences(now, older)] == ["distillation.teacher_weights"]  # dropped since: compared
