"""mqgrad.torch without a cluster: parameter checks, names, the ctypes layouts, the evaluation
arithmetic and report()'s arguments, the zero-copy views and the round protocol against a
stand-in library (fakelib), and a join that fails against the real libmqgrad.

    /usr/bin/python3 -m pytest tests/python
"""
import ctypes
import os
import re
import time
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import mqgrad._lib as L
import mqgrad.torch as mq
from fakelib import FakeLib


def sgd(params):
    return torch.optim.SGD(params, lr=0.1)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.out = nn.Linear(2, 1)


# ---- parameters ---------------------------------------------------------------------------

def test_float64_refused_naming_the_parameter():
    m = Tiny().double()
    with pytest.raises(TypeError) as e:
        mq.layout(m.named_parameters(), sgd(m.parameters()))
    assert str(e.value) == ("parameter 'fc.weight' is torch.float64: mqgrad trains float32 "
                            "parameters; call model.float()")


def test_float16_refused():
    p = nn.Parameter(torch.zeros(3, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"'h' is torch.float16: mqgrad trains float32"):
        mq.layout([("h", p)])


def test_non_cpu_refused():
    p = nn.Parameter(torch.empty(4, device="meta"))
    with pytest.raises(ValueError) as e:
        mq.layout([("w", p)])
    assert "parameter 'w' is on meta: mqgrad workers train on the CPU" in str(e.value)


def test_sparse_refused():
    p = torch.zeros(3, 3).to_sparse().requires_grad_()
    with pytest.raises(TypeError, match="dense"):
        mq.layout([("s", p)])


def test_non_contiguous_accepted_in_logical_order():
    base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    p = nn.Parameter(base.t())  # 3 x 2, not contiguous
    assert not p.is_contiguous()
    q = nn.Parameter(torch.ones(2))
    entries, total = mq.layout([("t", p), ("q", q)])
    assert total == 8
    assert [(e.cname, e.offset, e.count) for e in entries] == [("t", 0, 6), ("q", 6, 2)]


def test_frozen_and_empty_parameters_not_registered():
    a = nn.Parameter(torch.ones(2))
    frozen = nn.Parameter(torch.ones(3), requires_grad=False)
    empty = nn.Parameter(torch.ones(0))
    entries, total = mq.layout([("a", a), ("frozen", frozen), ("empty", empty)])
    assert [e.name for e in entries] == ["a"] and total == 2


def test_same_parameter_twice_refused():
    a = nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="'b' is the same tensor as 'a'"):
        mq.layout([("a", a), ("b", a)])


def test_shared_storage_refused():
    base = torch.zeros(4)
    a, b = nn.Parameter(base[:2]), nn.Parameter(base[2:])
    with pytest.raises(ValueError, match="share storage"):
        mq.layout([("a", a), ("b", b)])


def test_too_many_tensors_refused():
    ps = [("p%d" % i, nn.Parameter(torch.ones(1))) for i in range(mq.TENSORS_MAX + 1)]
    with pytest.raises(ValueError, match="129 parameter tensors: mqgrad registers at most 128"):
        mq.layout(ps)
    mq.layout(ps[:mq.TENSORS_MAX])


def test_optimizer_and_names_must_agree():
    m = Tiny()
    other = nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match="named_parameters does not name"):
        mq.layout(m.named_parameters(), sgd(list(m.parameters()) + [other]))
    with pytest.raises(ValueError, match="'fc.weight' is not in the optimizer"):
        mq.layout(m.named_parameters(), sgd(m.out.parameters()))


def test_named_parameters_none_uses_the_optimizer():
    m = Tiny()
    entries, total = mq.layout(None, sgd(m.parameters()))
    assert [e.cname for e in entries] == ["param.0", "param.1", "param.2", "param.3"]
    assert total == 6 + 2 + 2 + 1


def test_named_parameters_must_be_pairs():
    m = Tiny()
    with pytest.raises(TypeError, match="pairs of name and parameter"):
        mq.layout(list(m.parameters()), sgd(m.parameters()))


# ---- names --------------------------------------------------------------------------------

def test_short_names_unchanged():
    assert mq.short_name("fc1.w") == "fc1.w"
    n63 = "a" * 63
    assert mq.short_name(n63) == n63


def test_long_names_shortened_deterministically():
    name = "encoder.layers.11.attention.self_attention.query_key_value.weight_extra"
    assert len(name) > 63
    s = mq.short_name(name)
    assert len(s) == 63
    assert s == name[:20] + "~" + name[-42:]
    assert s == mq.short_name(name)


def test_duplicate_after_shortening_refused():
    a = "x" * 30 + "A" + "y" * 50
    b = "x" * 30 + "B" + "y" * 50
    assert mq.short_name(a) == mq.short_name(b)
    with pytest.raises(ValueError, match="same registered name"):
        mq.layout([(a, nn.Parameter(torch.ones(1))), (b, nn.Parameter(torch.ones(1)))])


def test_unprintable_names_refused():
    for bad in ["", "caf\u00e9", "tab\there"]:
        with pytest.raises(ValueError):
            mq.short_name(bad)


# ---- the C structures ---------------------------------------------------------------------

def offsets(struct):
    return {f: getattr(struct, f).offset for f, _ in struct._fields_}


def test_struct_layouts():
    # mqgrad.h on x86-64 / aarch64 (LP64): natural alignment
    assert ctypes.sizeof(L.TensorT) == 16
    assert offsets(L.TensorT) == {"name": 0, "count": 8}
    assert ctypes.sizeof(L.RunT) == 264
    assert offsets(L.RunT) == {"rank": 0, "workers": 4, "servers": 8, "batch": 12, "seed": 16,
                               "model": 24, "dataset": 40, "codec": 56, "optimizer": 184,
                               "threshold": 248, "l2": 256}
    assert ctypes.sizeof(L.StepT) == 40
    assert offsets(L.StepT) == {"iter": 0, "member": 8, "members": 12, "cursor": 16,
                                "bits": 24, "lr": 28, "evaluate": 32, "eval_limit": 36}


HEADER = os.path.join(os.path.dirname(__file__), "..", "..", "common", "include", "mqgrad",
                      "mqgrad.h")
C_TYPES = {"uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64, "int": ctypes.c_int,
           "float": ctypes.c_float, "char": ctypes.c_char, "const char *": ctypes.c_char_p}


def header_fields(text, name):
    """The fields (name, ctypes type) of typedef struct NAME in the header's text."""
    body = re.search(r"typedef struct \{([^}]*)\} %s;" % name, text).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    out = []
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        m = re.match(r"^(.*?)\s*\b(\w+)\s*(?:\[(\d+)\])?$", decl)
        ctype, field, dim = m.group(1).strip(), m.group(2), m.group(3)
        t = C_TYPES[ctype.replace(" *", " *")]
        out.append((field, t * int(dim) if dim else t))
    return out


@pytest.mark.skipif(not os.path.exists(HEADER), reason="not a source checkout (no mqgrad.h)")
def test_structs_match_the_header():
    with open(HEADER) as f:
        text = f.read()
    for struct, name in ((L.TensorT, "mqgrad_tensor_t"), (L.RunT, "mqgrad_run_t"),
                         (L.StepT, "mqgrad_step_t")):
        want = header_fields(text, name)
        got = [(f, t) for f, t in struct._fields_]
        assert [f for f, _ in got] == [f for f, _ in want], name
        for (f, t), (_, u) in zip(got, want):
            assert ctypes.sizeof(t) == ctypes.sizeof(u) and \
                getattr(t, "_type_", t) == getattr(u, "_type_", u), (name, f, t, u)
    m = re.search(r"#define MQGRAD_NAME_MAX (\d+)", text)
    assert int(m.group(1)) == L.NAME_MAX
    assert int(re.search(r"#define MQGRAD_TENSORS_MAX (\d+)", text).group(1)) == L.TENSORS_MAX
    assert int(re.search(r"#define MQGRAD_API_VERSION (\d+)", text).group(1)) == L.API_VERSION


# ---- evaluation ---------------------------------------------------------------------------

def S(member, members, eval_limit=0, evaluate=True):
    return mq.Step(5, member, members, 0, 32, 0.1, evaluate, eval_limit)


def test_eval_range_splits_the_limit():
    assert mq.eval_range(S(0, 1), 10000) == (0, 10000)
    assert mq.eval_range(S(0, 3, 1000), 10000) == (0, 333)
    assert mq.eval_range(S(1, 3, 1000), 10000) == (333, 666)
    assert mq.eval_range(S(2, 3, 1000), 10000) == (666, 1000)
    assert mq.eval_range(S(1, 2, 50000), 10000) == (5000, 10000)  # limit above the test set
    for members in (1, 2, 3, 7, 64):
        for limit in (0, 1, 5, 999):
            got = [mq.eval_range(S(m, members, limit), 1000) for m in range(members)]
            total = limit or 1000
            assert got[0][0] == 0 and got[-1][1] == total
            assert all(got[i][1] == got[i + 1][0] for i in range(members - 1))


def test_eval_range_validates():
    with pytest.raises(ValueError):
        mq.eval_range(S(0, 1), -1)
    with pytest.raises(ValueError):
        mq.eval_range(S(2, 2), 100)


def test_report_numbers():
    assert mq.eval_numbers(correct=80, total=100, loss_sum=35.0) == (80, 100, 35.0)
    assert mq.eval_numbers(accuracy=0.8, total=100, loss=0.35) == (80, 100, pytest.approx(35.0))
    c, t, s = mq.eval_numbers(accuracy=torch.tensor(0.873), total=torch.tensor(1000),
                              loss=torch.tensor(0.5))
    assert (c, t) == (873, 1000) and s == pytest.approx(500.0)
    assert mq.eval_numbers(accuracy=0.0, total=0, loss_sum=0.0) == (0, 0, 0.0)


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(correct=1, loss=1.0), TypeError, "total= .* is required"),
    (dict(total=10, loss=1.0), TypeError, "exactly one of correct"),
    (dict(total=10, correct=1, accuracy=0.1, loss=1.0), TypeError, "exactly one of correct"),
    (dict(total=10, correct=1), TypeError, "exactly one of loss_sum"),
    (dict(total=10, correct=1, loss=1.0, loss_sum=10.0), TypeError, "exactly one of loss_sum"),
    (dict(total=10, accuracy=85.0, loss=1.0), ValueError, "not a percentage"),
    (dict(total=10, accuracy=0.55, loss=1.0), ValueError, "not a whole number"),
    (dict(total=10, correct=11, loss=1.0), ValueError, "exceeds total"),
    (dict(total=10, correct=-1, loss=1.0), ValueError, ">= 0"),
    (dict(total=10.5, correct=1, loss=1.0), ValueError, "whole number"),
    (dict(total=10, correct="3", loss=1.0), TypeError, "a number"),
    (dict(total=10, correct=3, loss=torch.ones(2)), ValueError, "2 elements"),
])
def test_report_validates(kwargs, err, match):
    with pytest.raises(err, match=match):
        mq.eval_numbers(**kwargs)


# ---- state before a join ------------------------------------------------------------------

def test_before_the_join():
    for fn in (mq.rank, mq.size, mq.run):
        with pytest.raises(RuntimeError, match="create the DistributedOptimizer first"):
            fn()
    with pytest.raises(RuntimeError, match="create the DistributedOptimizer first"):
        mq.DistributedSampler(10).indices(S(0, 1))
    assert mq.shutdown() is None


def test_init_validates():
    mq.init(["--scheduler", "tcp://h:7000"])
    assert mq._argv == ["--scheduler", "tcp://h:7000"]
    mq.init()
    assert mq._argv == []
    with pytest.raises(TypeError):
        mq.init("--scheduler tcp://h:7000")
    with pytest.raises(TypeError):
        mq.init([1])


def test_broadcast_is_a_noop():
    m = Tiny()
    before = [p.detach().clone() for p in m.parameters()]
    mq.broadcast_parameters(m.state_dict(), root_rank=0)
    mq.broadcast_parameters(m.named_parameters())
    mq.broadcast_parameters(list(m.parameters()))
    mq.broadcast_optimizer_state(sgd(m.parameters()), root_rank=0)
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    with pytest.raises(TypeError):
        mq.broadcast_parameters([("a", 1)])
    with pytest.raises(ValueError):
        mq.broadcast_parameters(m.state_dict(), root_rank=-1)


# ---- the binding against a stand-in library ----------------------------------------------

@pytest.fixture
def fake(monkeypatch):
    lib = FakeLib()
    monkeypatch.setattr(L, "_LIB", lib)
    return lib


def flat_range(opt, t, which="params"):
    flat = getattr(opt, "flat_" + which)
    lo = flat.data_ptr()
    return lo <= t.data_ptr() < lo + 4 * flat.numel()


def test_join_makes_parameters_views(fake):
    m = Tiny()
    w_t = nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3).t())  # not contiguous
    m.wt = w_t
    values = {n: p.detach().clone() for n, p in m.named_parameters()}
    mq.init(["--peer-timeout", "5"])
    opt = mq.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    assert fake.argv[1:] == ["--peer-timeout", "5"]
    # a module's own parameters come first in named_parameters()
    assert fake.names == ["wt", "fc.weight", "fc.bias", "out.weight", "out.bias"]
    assert fake.counts == [6, 6, 2, 2, 1]
    assert fake.init[:6].tolist() == [0, 3, 1, 4, 2, 5]  # the transposed values, in order
    assert opt.flat_params.data_ptr() == fake.params.ctypes.data
    assert opt.flat_grads.data_ptr() == fake.grads.ctypes.data
    off = 0
    for n, p in m.named_parameters():
        assert p.data_ptr() == fake.params.ctypes.data + 4 * off
        assert p.grad.data_ptr() == fake.grads.ctypes.data + 4 * off
        assert torch.equal(p.detach(), values[n])
        off += p.numel()
    assert m.wt.is_contiguous()
    fake.params[6] = 42.0  # the library's array is the parameter
    assert m.fc.weight[0, 0].item() == 42.0
    assert mq.rank() == 1 and mq.size() == 2
    r = mq.run()
    assert r["codec"] == "qsgd" and r["batch"] == 4 and r["l2"] == pytest.approx(1e-4)
    with pytest.raises(RuntimeError, match="already joined"):
        mq.DistributedOptimizer(sgd(m.parameters()), named_parameters=m.named_parameters())
    assert mq.shutdown() == 0


def test_rounds_push_and_leave(fake):
    fake.evaluate = {1}
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    sampler = mq.DistributedSampler(10)
    x = torch.randn(10, 3)
    seen = []
    for step in opt.rounds():
        assert float(opt.flat_grads.abs().sum()) == 0.0  # zeroed before the round
        assert opt.param_groups[0]["lr"] == pytest.approx(fake.lr)
        idx = sampler.indices(step)
        assert idx.dtype == torch.int64 and idx.numel() == 4
        seen.append(idx.tolist())
        before = m.fc.weight.detach().clone()
        opt.zero_grad()
        loss = m.out(m.fc(x[idx])).pow(2).mean()
        loss.backward()
        g = m.fc.weight.grad.detach().clone()
        assert flat_range(opt, m.fc.weight.grad, "grads")
        opt.step(loss)
        assert fake.pushed[-1][0] == pytest.approx(loss.item())
        assert torch.allclose(m.fc.weight.detach(), before - fake.lr * g)  # updated in place
        if step.evaluate:
            lo, hi = mq.eval_range(step, 100)
            assert (lo, hi) == (50, 100)
            mq.report(accuracy=0.5, loss=0.25, total=hi - lo)
    # member 1 of 2 with batch 4 at cursor iter*8: positions cursor+4 .. +7 (mod 10)
    assert seen == [[4, 5, 6, 7], [2, 3, 4, 5], [0, 1, 2, 3]]
    assert fake.evaluated == [(25, 50, 12.5)]
    assert fake.left == 1 and not opt.joined
    assert mq.shutdown() == 0 and fake.left == 1  # idempotent
    # the parameters outlive the library's arrays, with their last values
    assert opt.flat_params is None
    assert torch.allclose(m.fc.weight.detach().reshape(-1),
                          torch.from_numpy(fake.params[:6]))
    assert m.fc.weight.data_ptr() != fake.params.ctypes.data


def test_the_gradient_is_zero_at_each_round_without_a_pass_of_the_bindings(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    assert fake.zero == 1  # libmqgrad zeroes what it encodes
    x = torch.randn(4, 3)
    for step in opt.rounds():
        if step.iter == 1:
            # the library below kept the pushed gradient: a binding that trusts libmqgrad (no
            # pass of its own over the array) hands it over as the library left it
            assert float(opt.flat_grads.min()) == 3.0 == float(opt.flat_grads.max())
            fake.zero = 1
        else:
            assert float(opt.flat_grads.abs().sum()) == 0.0
        opt.zero_grad()
        loss = m.out(m.fc(x)).sum()
        loss.backward()
        opt.step(loss)
        if step.iter == 0:
            fake.zero, fake.clean = 0, True
            fake.grads[:] = 3.0
        elif step.iter == 1:
            m.fc.bias.grad.add_(1.0)  # written after the push: the binding zeroes it again
    assert step.iter == 2 and fake.left == 1


def test_replaced_or_none_grads_are_copied_in(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    x = torch.randn(4, 3)
    for step in opt.rounds():
        opt.optimizer.zero_grad(set_to_none=True)  # PyTorch then makes new grad tensors
        loss = m.out(m.fc(x)).sum()
        loss.backward()
        assert not flat_range(opt, m.fc.weight.grad, "grads")
        expect = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        m.out.bias.grad = None  # counts as zero
        expect[-1] = 0
        opt.step(loss)
        assert torch.allclose(torch.from_numpy(fake.pushed[-1][1]), expect)
        assert flat_range(opt, m.fc.weight.grad, "grads")  # re-attached
        break
    assert fake.left == 1


def test_accumulating_tensors_keep_their_residual(fake):
    fake.acc = {0}  # fc.weight: error feedback
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    x = torch.randn(4, 3)
    grads = []
    for step in opt.rounds():
        residual = m.fc.weight.grad.detach().clone()
        opt.zero_grad()
        assert torch.equal(m.fc.weight.grad, residual)  # kept
        assert float(m.fc.bias.grad.abs().sum()) == 0.0
        loss = m.out(m.fc(x)).sum()
        loss.backward()
        grads.append(m.fc.weight.grad.detach().clone() - residual)
        opt.step(loss)
        if step.iter == 0:
            continue
        # pushed: the new gradient added onto half the previous push
        pushed = torch.from_numpy(fake.pushed[-1][1][:6]).reshape(2, 3)
        prev = torch.from_numpy(fake.pushed[-2][1][:6]).reshape(2, 3)
        assert torch.allclose(pushed, 0.5 * prev + grads[-1], atol=1e-6)


def test_accumulating_tensor_replaced_grad_is_added(fake):
    fake.acc = {0}
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    for step in opt.rounds():
        fake.grads[:6] = 1.0  # a residual
        m.fc.weight.grad = torch.full((2, 3), 2.0)  # replaced by the user
        opt.step(0.0)
        assert fake.pushed[-1][1][:6].tolist() == [3.0] * 6
        break


def test_round_protocol_errors(fake):
    fake.evaluate = {0}
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    with pytest.raises(RuntimeError, match="once per round"):
        opt.step(0.0)
    gen = opt.rounds()
    step = next(gen)
    with pytest.raises(RuntimeError, match="call step\\(loss\\) first"):
        mq.report(correct=1, total=2, loss_sum=0.0)
    opt.step(torch.tensor(1.5))
    with pytest.raises(RuntimeError, match="once per round"):
        opt.step(1.0)
    with pytest.raises(RuntimeError, match="asked for an evaluation"):
        next(gen)
    assert fake.left == 1 and not opt.joined  # the failure left the run
    with pytest.raises(RuntimeError, match="has left the run"):
        opt.zero_grad()


def test_step_without_push_refused(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    gen = opt.rounds()
    next(gen)
    with pytest.raises(RuntimeError, match="round 0: step\\(loss\\) was not called"):
        next(gen)


def test_replaced_parameter_data_refused(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    for step in opt.rounds():
        m.fc.bias.data = torch.zeros(2)
        with pytest.raises(RuntimeError, match="'fc.bias' is no longer a view"):
            opt.step(0.0)
        break


def test_break_leaves(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    for step in opt.rounds():
        opt.step(0.0)
        break
    assert fake.left == 1
    assert m.fc.weight.data_ptr() != fake.params.ctypes.data


def test_shutdown_inside_the_loop(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    with pytest.raises(RuntimeError, match="has left the run"):
        for step in opt.rounds():
            opt.step(0.0)
            assert mq.shutdown() == 0
    assert fake.left == 1 and fake.iter == 1


def test_exception_in_the_loop_leaves(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    with pytest.raises(KeyError):
        for step in opt.rounds():
            raise KeyError("user code failed")
    assert fake.left == 1


def test_warns_once_when_not_plain_sgd(fake):
    m = Tiny()
    with pytest.warns(UserWarning, match=r"run's update rule \(sgd\).*momentum=0.9"):
        opt = mq.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                                      m.named_parameters())
    opt.shutdown()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mq.DistributedOptimizer(torch.optim.Adam(m.parameters()), m.named_parameters())
    mq.shutdown()


def test_plain_sgd_does_not_warn(fake):
    m = Tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())


# ---- the real library ---------------------------------------------------------------------

def test_missing_library_names_what_was_tried(monkeypatch):
    monkeypatch.setenv("MQGRAD_LIB", "/nonexistent/libmqgrad.so")
    with pytest.raises(OSError) as e:
        L.load()
    assert "$MQGRAD_LIB: /nonexistent/libmqgrad.so: no such file" in str(e.value)
    monkeypatch.delenv("MQGRAD_LIB")
    monkeypatch.setattr(L, "_candidates", lambda: [("the source checkout's build",
                                                    "/nowhere/libmqgrad.so"),
                                                   ("find_library('mqgrad')", None)])
    with pytest.raises(OSError) as e:
        L.load()
    assert "/nowhere/libmqgrad.so: no such file" in str(e.value)
    assert "find_library('mqgrad'): nothing found" in str(e.value)


@pytest.fixture
def no_mqgrad_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("MQGRAD_") and k != "MQGRAD_LIB":
            monkeypatch.delenv(k)


def test_join_fails_clearly_without_a_scheduler(real_lib, no_mqgrad_env):
    m = Tiny()
    before = m.fc.weight.detach().clone()
    mq.init(["--scheduler", "tcp://127.0.0.1:1", "--peer-timeout", "1", "--insecure"])
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    took = time.monotonic() - t0
    assert 0.5 < took < 10, took  # waited for the scheduler, about the peer timeout
    msg = str(e.value)
    prefix = "mqgrad: joining the run failed: "
    assert msg.startswith(prefix) and len(msg) > len(prefix) + 5, msg
    assert "no reason given" not in msg and "127.0.0.1:1" in msg, msg
    assert not mq.is_joined()
    assert torch.equal(m.fc.weight.detach(), before)  # the model is untouched
    assert m.fc.weight.grad is None
    with pytest.raises(RuntimeError, match="create the DistributedOptimizer first"):
        mq.rank()


def test_join_reads_the_environment(real_lib, no_mqgrad_env, monkeypatch):
    monkeypatch.setenv("MQGRAD_SCHEDULER", "tcp://127.0.0.1:1")
    monkeypatch.setenv("MQGRAD_PEER_TIMEOUT", "1")
    monkeypatch.setenv("MQGRAD_INSECURE", "1")
    m = Tiny()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="joining the run failed"):
        mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    assert 0.5 < time.monotonic() - t0 < 10


def test_join_with_bad_flags_fails_at_once(real_lib, no_mqgrad_env):
    m = Tiny()
    mq.init(["--scheduler", "tcp://127.0.0.1:1"])  # no keys and not --insecure
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="joining the run failed: .+"):
        mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    assert time.monotonic() - t0 < 0.5


# ---- gradients sent as the backward pass finishes them -----------------------------------

def test_backward_tells_the_library_what_is_final(fake):
    """The hooks after each parameter's accumulation tell mqgrad_ready the falling offset
    from which everything is final, the last layer first; what was told is what step() sends;
    a backward pass outside a round tells nothing."""
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(), early_push=True)
    x = torch.randn(4, 3)
    for step in opt.rounds():
        before = len(fake.readies)
        opt.zero_grad()
        loss = m.out(m.fc(x)).pow(2).mean()
        loss.backward()
        told = fake.readies[before:]
        offsets = [f for _, f, _ in told]
        # fc.weight 0..5, fc.bias 6..7, out.weight 8..9, out.bias 10
        assert offsets == sorted(offsets, reverse=True) and offsets[-1] == 0, offsets
        assert offsets[0] >= 8  # the output layer, before the first layer is done
        for it, f, g in told:
            assert it == step.iter
            assert np.array_equal(g, fake.grads[f:])  # final when told: nothing changed since
        opt.step(loss)
    n = len(fake.readies)
    m.out(m.fc(x)).sum().backward()  # after the run: not a round
    assert len(fake.readies) == n


def test_gradient_changed_after_backward_refused_unless_late(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(), early_push=True)
    x = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="early_push=False"):
        for step in opt.rounds():
            loss = m.out(m.fc(x)).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)  # in place, after it went
            opt.step(loss)
    assert mq.shutdown() == 0


def test_late_push_allows_clipping(fake):
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(), early_push=False)
    x = torch.randn(4, 3)
    for step in opt.rounds():
        loss = m.out(m.fc(x)).pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
        g = fake.grads.copy()
        opt.step(loss)
        assert np.array_equal(fake.pushed[-1][1], g)  # the clipped gradient went
        assert float(np.linalg.norm(g)) <= 1e-3 * 1.0001
    assert fake.readies == []


def test_backward_passes_per_step(fake):
    """Two backward passes add up before anything is final: nothing is told after the first."""
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(),
                                  backward_passes_per_step=2, early_push=True)
    x = torch.randn(4, 3)
    for step in opt.rounds():
        before = len(fake.readies)
        m.out(m.fc(x[:2])).pow(2).mean().backward()
        assert len(fake.readies) == before
        loss = m.out(m.fc(x[2:])).pow(2).mean()
        loss.backward()
        assert fake.readies[-1][1] == 0
        opt.step(loss)
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ValueError, match="backward_passes_per_step"):
            mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters(),
                                    backward_passes_per_step=bad)


@pytest.mark.parametrize("env,told", [(None, False), ("0", False), ("1", True)])
def test_early_push_off_unless_asked(fake, monkeypatch, env, told):
    if env is None:
        monkeypatch.delenv("MQGRAD_EARLY_PUSH", raising=False)
    else:
        monkeypatch.setenv("MQGRAD_EARLY_PUSH", env)
    m = Tiny()
    opt = mq.DistributedOptimizer(sgd(m.parameters()), m.named_parameters())
    x = torch.randn(4, 3)
    for step in opt.rounds():
        loss = m.out(m.fc(x)).pow(2).mean()
        loss.backward()
        opt.step(loss)
    assert bool(fake.readies) == told and len(fake.pushed) == fake.nrounds
