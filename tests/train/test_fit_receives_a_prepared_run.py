"""Training applied from outside (issue 36): `fit` runs the model and the TrainConfig it is given; the workflow
resolves the precision and the learning rate, places the model and wraps it for DDP (workflows.prepare), and
fit refuses a run nobody prepared instead of preparing it itself."""

from __future__ import annotations

import inspect

import pytest
import torch
from toy_training import toy_data, toy_loss, toy_model

from bertkit.errors import BertkitError
from bertkit.train import DistributedContext, TrainConfig, fit
from bertkit.workflows.prepare import prepare_training

READY = dict(max_steps=1, micro_batch_size=4, learning_rate=1e-2, precision="fp32")


def test_fit_takes_at_most_eight_parameters():
    assert len(inspect.signature(fit).parameters) <= 8


@pytest.mark.parametrize("unresolved", [{"precision": "auto"}, {"learning_rate": None}])
def test_an_unresolved_config_is_refused(tmp_path, unresolved):
    with pytest.raises(ValueError, match="resolve precision 'auto' and an unset learning rate first"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**{**READY, **unresolved}), tmp_path)


def test_a_model_off_the_training_device_is_refused(tmp_path):
    meta = DistributedContext(device=torch.device("meta"))
    with pytest.raises(ValueError, match="place it"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**READY), tmp_path, ctx=meta)


def test_a_process_group_needs_the_model_wrapped(tmp_path):
    group = DistributedContext(world_size=2)
    with pytest.raises(ValueError, match="wrapped for DDP"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**READY), tmp_path, ctx=group)


def test_early_stopping_without_a_metric_is_refused(tmp_path):
    with pytest.raises(BertkitError, match="--early-stopping-patience needs an evaluation metric"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**READY, early_stopping_patience=2), tmp_path)


def test_prepare_resolves_places_and_fit_runs_it(tmp_path):
    model, config = prepare_training(toy_model(), TrainConfig(**READY), DistributedContext())
    assert config.precision == "fp32" and next(model.parameters()).device.type == "cpu"
    assert fit(model, toy_loss, toy_data(), config, tmp_path).step == 1
    with pytest.raises(ValueError, match="resolve the learning rate first"):
        prepare_training(toy_model(), TrainConfig(**{**READY, "learning_rate": None}), DistributedContext())


def test_rank0_decides_raises_what_rank_0_met():
    from bertkit.train.distributed import rank0_decides

    alone = DistributedContext()
    assert rank0_decides(lambda: {"seed": 1}, alone) == {"seed": 1}
    with pytest.raises(BertkitError, match="no such run"):
        rank0_decides(lambda: (_ for _ in ()).throw(BertkitError("no such run")), alone)
    with pytest.raises(PermissionError):  # not only BertkitError: any error is every rank's
        rank0_decides(lambda: (_ for _ in ()).throw(PermissionError("read-only")), alone)


def test_prepare_gives_every_encoder_the_measured_training_attention(monkeypatch, caplog):
    """On a CPU, each encoder on the plain dispatch gets this machine's measured choices (tests/conftest.py's AMD
    profile: bmm attention for training in bf16 at 32-256 tokens, fp32 at 32), said in one line; a fixed backend is
    left alone, and BERTKIT_CPU_KERNELS=0 leaves the plain dispatch."""
    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM
    from bertkit.model.accelerate import MeasuredDropout
    from bertkit.model.attention import Dispatch, PaddedSDPA
    from bertkit.runtime import probe

    config = preset("bert-debug", vocab_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    pair = torch.nn.ModuleDict({"student": BertForMaskedLM(config), "teacher": BertForMaskedLM(config)})
    pair["teacher"].bert.attention = PaddedSDPA()
    with caplog.at_level("INFO", logger="bertkit.workflows.prepare"):
        prepare_training(pair, TrainConfig(**READY), DistributedContext())
    assert pair["student"].bert.attention.cpu == probe.choices(config.hidden_size)
    assert repr(pair["teacher"].bert.attention) == "PaddedSDPA()"
    [line] = [r.getMessage() for r in caplog.records if "attention for training" in r.getMessage()]
    assert "fp32 bmm near 32 tokens, SDPA elsewhere; bf16 bmm near 32, 64, 128, 256 tokens, SDPA elsewhere" in line
    caplog.clear()
    dropped = BertForMaskedLM(preset("bert-debug", vocab_size=64))
    with caplog.at_level("INFO", logger="bertkit.workflows.prepare"):  # fine-tuning's dropout: its own verdicts
        prepare_training(dropped, TrainConfig(**READY), DistributedContext())
    assert "attention for training on this CPU: fp32 bmm near 32 tokens, SDPA elsewhere; bf16 bmm near 32, 64, 128 " \
           "tokens, SDPA elsewhere (bmm where its forward + backward with attention dropout 0.1" in caplog.text
    assert "dropout for training on this CPU: counter-based masks (bertkit.kernels.dropout) in fp32, bf16" \
        in caplog.text
    dropouts = [m for m in dropped.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(type(m) is MeasuredDropout and m.p == 0.1 for m in dropouts)
    monkeypatch.setenv("BERTKIT_CPU_KERNELS", "0")
    plain = BertForMaskedLM(preset("bert-debug", vocab_size=64))
    prepare_training(plain, TrainConfig(**READY), DistributedContext())
    assert repr(plain.bert.attention) == repr(Dispatch())
    assert all(type(m) is torch.nn.Dropout for m in plain.modules() if isinstance(m, torch.nn.Dropout))


def test_a_bf16_training_step_runs_bmm_attention_and_matches_sdpa(monkeypatch):
    """The prepared model's bf16 training step runs BatchedBmm in every layer, and its loss and gradients equal
    those of the same model on the plain dispatch (SDPA) within bf16 rounding."""
    from bertkit.config import preset
    from bertkit.kernels import attention as kernels
    from bertkit.model import BertForMaskedLM
    from bertkit.model.padding import Unpadded

    torch.manual_seed(0)
    measured = BertForMaskedLM(preset("bert-debug", vocab_size=64, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0))  # the same sums, no random masks
    plain = BertForMaskedLM(measured.config)
    plain.load_state_dict(measured.state_dict())
    prepare_training(measured, TrainConfig(**READY), DistributedContext())
    calls = []
    real_kernel = kernels.bmm_attention
    monkeypatch.setattr(kernels, "bmm_attention", lambda *a, **k: calls.append(1) or real_kernel(*a, **k))
    ids = torch.randint(5, 64, (4, 40))
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0
    results = []
    for model in (measured, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids, attention_mask=mask).logits.float().logsumexp(-1)[mask.bool()].mean()
        loss.backward()
        results.append((loss.detach(), model.bert.embeddings.word.weight.grad.clone()))
    assert len(calls) == measured.config.num_hidden_layers  # the measured model only
    torch.testing.assert_close(results[0][0], results[1][0], atol=2e-2, rtol=2e-2)
    assert (results[0][1] - results[1][1]).norm() <= 2e-2 * results[1][1].norm()  # bf16 rounding, not another sum
    calls.clear()
    mask[2:, 10:] = 0  # 56% real tokens: below MIN_BMM_FILL, SDPA over the real tokens
    with torch.autocast("cpu", dtype=torch.bfloat16):
        measured(ids, attention_mask=mask).logits.float().sum().backward()
        assert not calls
        # the same through a collator's layout (as pre-training passes it): the gate reads the layout's mask
        measured.bert(ids, layout=Unpadded.from_mask(mask.bool())).last_hidden_state.float().sum().backward()
        assert not calls
        mask[2:, 10:] = 1
        measured.bert(ids, layout=Unpadded.from_mask(mask.bool())).last_hidden_state.float().sum().backward()
        assert len(calls) == measured.config.num_hidden_layers


def test_what_training_attention_a_model_runs_is_said_as_recorded():
    """`training_attention` (pretrain_settings.json's "attention"): bmm where measured without attention dropout or
    with it (the verdicts for the model's dropout), and SDPA without measured choices; `training_dropout` ("dropout"):
    counter-based masks where measured faster, torch's without measured choices or on a GPU."""
    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM
    from bertkit.workflows.prepare import training_attention, training_dropout

    config = preset("bert-debug", vocab_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    still = BertForMaskedLM(config)
    assert training_attention(still, torch.device("cpu")).startswith("SDPA (no measured CPU attention choices")
    prepare_training(still, TrainConfig(**READY), DistributedContext())
    said = training_attention(still, torch.device("cpu"))
    assert said.startswith("fp32 bmm near 32 tokens, SDPA elsewhere; bf16 bmm near 32, 64, 128")
    dropped = BertForMaskedLM(preset("bert-debug", vocab_size=64))
    prepare_training(dropped, TrainConfig(**READY), DistributedContext())
    said = training_attention(dropped, torch.device("cpu"))
    assert said.startswith("fp32 bmm near 32 tokens, SDPA elsewhere; bf16 bmm near 32, 64, 128 tokens, SDPA")
    assert "with attention dropout 0.1 (bmm's mask counter-based)" in said
    assert said.endswith("on batches at least 87.5% real tokens)")
    assert training_attention(still, torch.device("cuda")).startswith("CUDA, as Dispatch picks per batch: flash")
    assert training_dropout(dropped, torch.device("cpu")).startswith("counter-based masks (bertkit.kernels.dropout) in "
                                                                     "fp32, bf16, torch's dropout otherwise")
    assert training_dropout(dropped, torch.device("cuda")) == "torch's dropout"
    assert training_dropout(BertForMaskedLM(preset("bert-debug", vocab_size=64)), torch.device("cpu")) \
        == "torch's dropout"  # no measured choices given
    assert training_dropout(still, torch.device("cpu")) == "none (every dropout probability is 0)"


def test_every_rank_attends_with_rank_0s_choices(monkeypatch):
    """A rank other than 0 measures nothing: it installs the choices rank 0 broadcast."""
    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM
    from bertkit.runtime import probe
    from bertkit.workflows import prepare

    sent = probe.choices(32)
    monkeypatch.setattr(probe, "choices", lambda width: pytest.fail("rank 1 measured"))
    monkeypatch.setattr(prepare, "broadcast_object", lambda value, ctx: sent if value is None else pytest.fail())
    model = BertForMaskedLM(preset("bert-debug", vocab_size=64))
    prepare.use_measured_kernels(model, DistributedContext(rank=1, world_size=2))
    assert model.bert.attention.cpu is sent


def test_bertkit_pretrain_on_a_cpu_runs_bmm_attention_and_records_it(tmp_path, toy_pretraining_data, monkeypatch):
    """The plain command, at the short recipe's dropout 0 in bf16 (the suite's AMD profile): every layer's training
    attention is bmm (with the fill gate at 0: the toy's short instances leave much padding), and
    pretrain_settings.json says so."""
    import json

    from bertkit.cli import main
    from bertkit.kernels import attention as kernels

    monkeypatch.setattr("bertkit.model.attention.MIN_BMM_FILL", 0.0)  # the toy's short instances leave much padding
    calls = []
    real_kernel = kernels.bmm_attention
    monkeypatch.setattr(kernels, "bmm_attention",
                        lambda *a, **k: calls.append(a[0].requires_grad) or real_kernel(*a, **k))
    data, tok = str(toy_pretraining_data["data"]), str(toy_pretraining_data["tok"])
    assert main(["pretrain", "--data", data, "--tokenizer", tok, "--model", "bert-debug", "--recipe", "auto",
                 "--max-steps", "2", "--eval-examples", "8", "--output", str(tmp_path / "run"), "--device", "cpu",
                 "--precision", "bf16"]) == 0
    assert calls.count(True) >= 2 * 2  # two steps x bert-debug's two layers, with a backward
    record = json.loads((tmp_path / "run" / "pretrain_settings.json").read_text())
    assert record["attention"].startswith("fp32 bmm near 32 tokens, SDPA elsewhere; bf16 bmm near 32, 64")


def test_what_kernels_a_model_trains_with_is_recorded_as_json(monkeypatch):
    """`training_kernels` (what each checkpoint records, `Resume.context`): for the run's precision, the lengths at
    which bmm attention runs (the verdicts for the model's attention dropout) and the precisions whose dropout masks
    are counter-based (fp32's too under bf16); words where nothing was measured, on a GPU, or when compiled. The
    verdicts are the suite's probe profile's (tests/assets/probe/amd-epyc.json: bmm in training at 32-256 tokens in
    bf16 and at 32 in fp32; with attention dropout at 32-128 in bf16; counter-based masks in both)."""
    import json

    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM
    from bertkit.workflows.prepare import training_kernels

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    config = preset("bert-debug", vocab_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    still = BertForMaskedLM(config)
    assert training_kernels(still, cpu, "bf16") == {"attention": "SDPA", "dropout": "none"}
    prepare_training(still, TrainConfig(**READY), DistributedContext())
    assert training_kernels(still, cpu, "bf16") == {"attention": {"bf16": [32, 64, 128, 256]}, "dropout": "none"}
    assert training_kernels(still, cpu, "fp32") == {"attention": {"fp32": [32]}, "dropout": "none"}
    dropped = BertForMaskedLM(preset("bert-debug", vocab_size=64))
    assert training_kernels(dropped, cpu, "bf16") == {"attention": "SDPA", "dropout": "torch's"}
    prepare_training(dropped, TrainConfig(**READY), DistributedContext())
    kernels = training_kernels(dropped, cpu, "bf16")
    assert kernels == {"attention": {"bf16": [32, 64, 128]}, "dropout": ["fp32", "bf16"]}
    assert json.loads(json.dumps(kernels)) == kernels
    assert training_kernels(dropped, cpu, "fp32") == {"attention": {"fp32": [32]}, "dropout": ["fp32"]}
    assert training_kernels(dropped, cpu, "bf16", compiled=True) == {"attention": "compiled", "dropout": "compiled"}
    assert training_kernels(dropped, cuda, "bf16") == {"attention": "CUDA", "dropout": "torch's"}
    assert training_kernels(still, cuda, "bf16") == {"attention": "CUDA", "dropout": "none"}
    monkeypatch.setenv("BERTKIT_CPU_KERNELS", "0")
    off = BertForMaskedLM(preset("bert-debug", vocab_size=64))
    prepare_training(off, TrainConfig(**READY), DistributedContext())
    assert training_kernels(off, cpu, "bf16") == {"attention": "SDPA", "dropout": "torch's"}


def test_a_frozen_feature_based_encoder_records_its_inference_kernels():
    """A feature-based model's encoder computes its features as inference does (no backward, no dropout inside):
    the lengths its attention runs bmm at are inference's (the profile's bf16 64 and 128), and whether its dense
    layers are packed (only with the inference copy fine-tuning gives it on a CPU)."""
    from bertkit.config import preset
    from bertkit.model import accelerate_for_inference
    from bertkit.model.bert import BertModel
    from bertkit.model.feature_based import FeatureBasedModel, FeatureHead
    from bertkit.workflows.prepare import training_kernels

    config = preset("bert-debug", vocab_size=64)
    model = FeatureBasedModel(BertModel(config), FeatureHead(2), (-1,), "concat", 0.1)
    prepare_training(model, TrainConfig(**READY), DistributedContext())
    cpu = torch.device("cpu")
    assert training_kernels(model, cpu, "bf16") == {"attention": {"bf16": [64, 128]}, "packed": False,
                                                    "dropout": ["fp32", "bf16"]}
    model.use_encoder_copy(accelerate_for_inference)
    assert training_kernels(model, cpu, "fp32")["packed"] is True
