"""Fixes from the training and generation bug hunt.

* A training step's memory per device is accounted (weights, gradients, optimizer
  state, the activations the backward kernels read, the largest kernel's workspace)
  and a step that does not fit is refused, naming the largest batch that would; a
  kernel that does not fit names itself, not its probe graph.
* GPT-2 trains on every position's logits, not the inference prefill's last token.
* ``generate`` and ``run --generate`` refuse model arguments they set or do not take,
  with one line.
* ``wia-hw train -a NAME=VALUE`` passes builder arguments.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import wia_hw
from wia_hw.cli import cli
from wia_hw.train import Kern, time_kernels, train_iteration, training_kernels, training_memory
from wia_hw.train._parallel import shard_graph
from wia_hw.workloads import bert_large, build, gpt2

CAP = 32 << 30  # wia-npu's HBM


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args))


def _one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wia-hw: error: "), res.output
    return lines[0]


# -- 1. memory ---------------------------------------------------------------------------


def test_saved_activations_are_what_the_backward_kernels_read():
    """BERT saves, per layer, s b h (32 + 2 a s / h) bytes in fp16 (Korthikanti et al.
    without dropout masks: the QKV, output-projection and two FFN linears' inputs, q k
    v, the softmax's output, the GELU's input and two layer norms' inputs)."""
    b, s, h, a, layers = 4, 64, 1024, 16, 3
    tk = training_kernels(bert_large(batch=b, seq=s, layers=layers))
    m = training_memory(tk, CAP)
    per_layer = s * b * h * 32 + 2 * a * s * s * b
    # the embeddings' layer norm input and the pooler's are the rest
    rest = m.activations - layers * per_layer
    assert 0 <= rest <= 2 * s * b * h + 4 * b * h
    p = sum(t.numel for t in tk.params)
    assert m.weights == m.gradients == 2 * p  # fp16 parameters and gradients
    assert m.optimizer_state == 8 * p  # Adam's two fp32 moments
    sgd = training_memory(training_kernels(bert_large(b, s, layers=layers), optimizer="sgd"), CAP)
    assert sgd.optimizer_state == 0 and sgd.activations == m.activations
    # workspace: the largest kernel's dY and dX, the softmax's [B*heads, S, S] or the
    # GELU's [B, S, 4H]
    assert m.workspace == 2 * 2 * max(b * a * s * s, b * s * 4 * h)
    assert m.total == m.weights + m.gradients + m.optimizer_state + m.activations + m.workspace


def test_tensor_parallel_memory_is_one_rank_s_share():
    g = bert_large(batch=4, seq=64, layers=2)
    one = training_memory(training_kernels(g), CAP)
    rank, f, b = shard_graph(g, 2)
    two = training_memory(training_kernels(rank, tp_forward=f, tp_backward=b), CAP)
    assert two.weights < one.weights and two.activations < one.activations
    assert two.optimizer_state * one.weights == one.optimizer_state * two.weights


def test_result_reports_the_memory():
    r = train_iteration(bert_large(batch=2, seq=32, layers=1), cluster="wia-cluster-8")
    m = r.memory
    assert m.capacity == CAP and 0 < m.total < CAP
    assert m.weights == r.param_bytes
    line = next(x for x in r.summary().splitlines() if "Memory:" in x)
    assert line.strip().startswith(f"Memory: {m.total / 2**30:.2f} GiB of 32.00 GiB per device")
    assert "weights" in line and "grads" in line and "optimizer" in line and "activations" in line
    d = r.to_dict()["memory"]
    assert d["total"] == m.total and d["capacity"] == CAP and d["activations"] == m.activations


def test_a_step_that_does_not_fit_is_refused_with_the_batch_that_fits():
    with pytest.raises(wia_hw.WorkloadError) as e:
        train_iteration("bert-large", cluster="wia-cluster-8", batch=128, seq=512)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(
        "train_iteration: a training step of 'bert-large' (batch 128 per replica, seq 512, "
        "dp=8, tp=1, adam) does not fit device memory (wia-npu): it needs 77.87 GiB of "
        "32.00 GiB per device (weights 0.62, grads 0.62, optimizer 2.50, activations 72.13"
    )
    assert "the largest batch that fits is 48 per replica" in msg

    def fits(batch: int) -> bool:
        return training_memory(training_kernels(bert_large(batch, 512)), CAP).fits

    assert fits(48) and not fits(49)


def test_weights_that_do_not_fit_leave_no_batch():
    with pytest.raises(wia_hw.WorkloadError, match=r"no batch fits") as e:
        train_iteration("gpt2", cluster="wia-cluster-8", batch=1, seq=64, size="xl", layers=200)
    assert "weights 11.60, grads 11.60, optimizer 46.42" in str(e.value)


def test_a_graph_too_big_gets_an_estimated_batch():
    with pytest.raises(wia_hw.WorkloadError, match=r"about batch \d+ per replica would fit"):
        train_iteration(bert_large(128, 512), cluster="wia-cluster-8")


def test_cli_train_past_device_memory_is_one_line():
    line = _one_line_error(_cli("train", "bert-large", "-b", "4096", "-s", "512"))
    assert "does not fit device memory (wia-npu)" in line
    assert "largest batch that fits is 48" in line and "training-kernel" not in line


def test_a_kernel_that_does_not_fit_names_itself():
    big = ((65536, 512, 512), "fp16")
    k = Kern("layer0.attention_softmax.grad", "softmax", (big, big), big, "backward")
    spec = wia_hw.open_device("wia-npu").spec
    with pytest.raises(wia_hw.WiaError) as e:
        time_kernels(spec, [k])
    msg = str(e.value)
    assert msg.startswith(
        "backward kernel 'layer0.attention_softmax.grad' (softmax): its input 1 "
        "[65536, 512, 512] fp16 does not fit device memory (wia-npu): cannot allocate"
    )
    assert "training-kernel" not in msg


# -- 2. GPT-2 trains on every position ---------------------------------------------------


def test_gpt2_trains_on_every_position_s_logits():
    b, s = 2, 64
    r = train_iteration("gpt2", cluster="wia-cluster-8", batch=b, seq=s, layers=2)
    fwd = {k.name: k for k in r.kernels.forward}
    assert "lm_head.last_token" not in fwd
    assert fwd["lm_head"].output[0] == (b * s, 50257)
    assert r.kernels.graph.params["phase"] == "train"
    # 6 P T for the parameters (the tied table once for the embedding's gather: its
    # forward reads no FLOPs) and the attention's two bmms, forward and backward
    tk = r.kernels
    flops = sum(k.flops for k in tk.forward + tk.backward)
    p = sum(t.numel for t in tk.params) - 1024 * 768  # the position table: a gather
    attn = 2 * 2 * 2 * b * s * s * 768
    assert flops == pytest.approx(6 * p * b * s + 3 * attn, rel=0.02)


def test_gpt2_inference_graphs_are_not_trained():
    with pytest.raises(wia_hw.WorkloadError, match=r"phase='prefill': logits for the last token"):
        train_iteration(gpt2(batch=1, seq=16, layers=1), cluster="wia-cluster-8")
    with pytest.raises(wia_hw.WorkloadError, match=r"built for inference \(phase='decode'"):
        train_iteration("gpt2", cluster="wia-cluster-8", batch=1, phase="decode", layers=1)
    g = gpt2(batch=1, seq=16, layers=1, phase="train")  # the training forward runs too
    assert wia_hw.run(g).cycles > wia_hw.run(gpt2(batch=1, seq=16, layers=1)).cycles


# -- 3. generation's model arguments -----------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(seq=4), r"^generate: seq is not a model argument here"),
        (dict(phase="decode"), r"^generate: phase is not a model argument here"),
        (dict(kv_len=3), r"^generate: kv_len is not a model argument here"),
        (dict(foo=1), r"^workload 'gpt2': got an unexpected keyword argument 'foo'"),
    ],
)
def test_generate_refuses_model_arguments_it_sets_or_the_model_lacks(kw, match):
    with pytest.raises(wia_hw.WorkloadError, match=match) as e:
        wia_hw.generate("gpt2", new_tokens=2, layers=1, **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("foo=1", "unexpected keyword argument 'foo'"),
        ("phase=decode", "phase is not a model argument"),
        ("new_tokens=3", "(give it as --generate N)"),
        ("prompt_len=3", "(give it as --prompt-len P)"),
        ("ctx=1", "ctx is not a model argument but generation's own"),
        ("seq=4", "seq is not a model argument"),
        ("kv_len=4", "kv_len is not a model argument"),
        ("device=wia-edge", "(give it as --device)"),
    ],
)
def test_cli_generate_builder_args_are_one_line(arg, says):
    assert says in _one_line_error(_cli("run", "gpt2", "--generate", "8", "-a", arg))


def test_cli_generate_passes_model_arguments():
    res = _cli("run", "gpt2", "--generate", "2", "-a", "layers=1", "-a", "batch=2", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["batch"] == 2 and d["provenance"]["generate"]["layers"] == 1


# -- 4. train -a -------------------------------------------------------------------------


def test_cli_train_takes_builder_arguments():
    res = _cli("train", "gemm", "-a", "M=256", "-a", "N=128", "-a", "K=64", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["param_bytes"] == 64 * 128 * 2
    args = ("train", "gpt2", "-b", "2", "-s", "32", "-a", "size=medium", "-a", "layers=1")
    res = _cli(*args, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["workload"] == "gpt2-medium" and d["batch"] == 2 and d["seq"] == 32
    g = build("gpt2", size="medium", layers=1)
    assert d["param_bytes"] == g.weight_bytes


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("-a", "dp=4"), "-a dp=4: dp is not a builder argument but the training step's own"),
        (("-a", "algorithm=ring"), "(give it as --algo)"),
        (("-b", "2", "-a", "batch=3"), "-a batch=3 contradicts --batch 2"),
        (("-a", "foo=1"), "unexpected keyword argument 'foo'"),
        (("-a", "M"), "must read NAME=VALUE"),
    ],
)
def test_cli_train_bad_builder_arguments_are_one_line(args, says):
    res = _cli("train", "gpt2", "-a", "layers=1", *args)
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert says in res.output


def test_train_help_documents_arg():
    out = _cli("train", "--help").output
    assert "-a, --arg NAME=VALUE" in out and "wia-hw train gemm -a M=4096" in out
