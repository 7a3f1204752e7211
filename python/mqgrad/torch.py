"""mqgrad.torch: a PyTorch model as a worker of an mqgrad cluster (the API of horovod.torch).

    import mqgrad.torch as mq

    mq.init()                                   # flags: as mqgrad-worker's (MQGRAD_* variables)
    model = Net()                               # float32 parameters on the CPU
    opt = mq.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())  # joins the run
    sampler = mq.DistributedSampler(len(train_x))
    for step in opt.rounds():                   # the rounds the scheduler issues to this worker
        idx = sampler.indices(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
        loss.backward()
        opt.step(loss)                          # quantize, push, apply the aggregate
        if step.evaluate:
            lo, hi = mq.eval_range(step, len(test_x))
            ...                                 # evaluate test examples [lo, hi)
            mq.report(correct=c, total=hi - lo, loss_sum=s)
    sys.exit(mq.shutdown())

Zero copy: once joined, every registered parameter's data is a view into libmqgrad's flat
float32 parameter array and its ``.grad`` a view into the flat gradient array, so the network
reads and writes what the model computes in place.

The update rule is the run's (the scheduler's ``--optimizer``), applied by libmqgrad on every
replica and on the servers' master copies alike, so replicas cannot drift: the wrapped
optimizer's own rule (momentum, weight decay, Adam, ...) is not used. Its ``param_groups``'
``lr`` is set to each round's learning rate, for display.
"""

import atexit
import signal
import collections
import ctypes
import math
import numbers
import os
import sys
import threading
import time
import warnings

import numpy as np
import torch

from . import _lib

__all__ = [
    "init", "rank", "size", "run", "is_joined", "DistributedOptimizer", "rounds", "Step",
    "broadcast_parameters", "broadcast_optimizer_state", "DistributedSampler", "eval_range",
    "report", "shutdown", "short_name", "layout", "eval_numbers", "NAME_MAX", "TENSORS_MAX",
    "JoinError",
]

NAME_MAX = _lib.NAME_MAX
TENSORS_MAX = _lib.TENSORS_MAX

Step = collections.namedtuple(
    "Step", ["iter", "member", "members", "cursor", "bits", "lr", "evaluate", "eval_limit"])
Step.__doc__ = """One round to compute (mqgrad_step_t).

iter: the round, from 0. member, members: this worker's index in the round's member set and its
size. cursor: the run's data position (DistributedSampler.indices turns it into examples).
bits: the round's bit-width (32: fp32). lr: the round's learning rate. evaluate: after
step(loss), evaluate this member's share of the test set (eval_range) and report() it.
eval_limit: the evaluation's test examples over all members (0: the whole test set)."""

_argv = []          # init()'s flags, passed to mqgrad_join
_current = None     # the DistributedOptimizer whose worker joined (one at a time)
_warned_rule = False


# ---- flags, names, layout (no library needed) -------------------------------------------

def init(argv=None):
    """Records the worker's flags for the join: ARGV is a list of mqgrad-worker flags
    (``['--scheduler', 'tcp://host:7000', '--peer-timeout', '30']``; not the program name).
    None (the default): none, the MQGRAD_* environment variables only (MQGRAD_SCHEDULER,
    MQGRAD_PEER_TIMEOUT, MQGRAD_ITER_TIMEOUT, the key variables, ...). The join itself needs
    the model's parameters: DistributedOptimizer does it."""
    global _argv
    if argv is None:
        _argv = []
        return
    if isinstance(argv, (str, bytes)):
        raise TypeError("init(argv): argv is a list of flags, not one string: %r" % (argv,))
    argv = list(argv)
    for a in argv:
        if not isinstance(a, str):
            raise TypeError("init(argv): every flag must be a str, got %r" % (a,))
        if "\0" in a:
            raise ValueError("init(argv): flag %r contains a NUL byte" % (a,))
    _argv = argv


def short_name(name):
    """The tensor name NAME is registered under: NAME if at most NAME_MAX (63) bytes, else its
    first 20 characters, '~' and its last 42. Names must be printable ASCII."""
    if not isinstance(name, str) or not name:
        raise ValueError("parameter name %r: names are non-empty strings" % (name,))
    if any(not (0x20 <= ord(ch) <= 0x7E) for ch in name):
        raise ValueError("parameter name %r: mqgrad tensor names are printable ASCII" % name)
    if len(name) <= NAME_MAX:
        return name
    return name[:20] + "~" + name[-42:]


class _Entry(object):
    __slots__ = ("name", "cname", "param", "offset", "count", "pview", "gview")

    def __init__(self, name, cname, param, offset, count):
        self.name, self.cname, self.param = name, cname, param
        self.offset, self.count = offset, count
        self.pview = self.gview = None


def _storage_ptr(t):
    try:
        return t.untyped_storage().data_ptr()
    except AttributeError:  # torch < 2.0
        return t.storage().data_ptr()


def _check_param(name, p):
    """Refuses what libmqgrad cannot train in place, naming the parameter and what to do."""
    if not isinstance(p, torch.Tensor):
        raise TypeError("parameter %r is a %s, not a torch tensor" % (name, type(p).__name__))
    if p.device.type != "cpu":
        raise ValueError("parameter %r is on %s: mqgrad workers train on the CPU; call "
                         "model.cpu() before DistributedOptimizer" % (name, p.device))
    if p.layout != torch.strided:
        raise TypeError("parameter %r is %s: mqgrad trains dense (strided) parameters"
                        % (name, p.layout))
    if p.dtype != torch.float32:
        raise TypeError("parameter %r is %s: mqgrad trains float32 parameters; call "
                        "model.float()" % (name, p.dtype))


def _named(named_parameters, optimizer):
    """(name, parameter) pairs, from NAMED_PARAMETERS or (None) the optimizer's groups."""
    if named_parameters is None:
        out, i = [], 0
        for g in optimizer.param_groups:
            for p in g["params"]:
                out.append(("param.%d" % i, p))
                i += 1
        return out
    if isinstance(named_parameters, dict) or hasattr(named_parameters, "items"):
        named_parameters = named_parameters.items()
    out = []
    for item in named_parameters:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("named_parameters must be pairs of name and parameter, such as "
                            "model.named_parameters(); got an element %r" % (item,))
        out.append(item)
    return out


def layout(named_parameters, optimizer=None):
    """Checks the parameters and lays them out as libmqgrad will: a list of entries (name,
    registered name, parameter, offset, count) in the given order, and the element total.
    Parameters with requires_grad False and empty ones are not registered (nothing trains
    them). Raises TypeError/ValueError naming the parameter and what is wrong."""
    if named_parameters is None and optimizer is None:
        raise ValueError("layout(): give named_parameters or an optimizer")
    pairs = _named(named_parameters, optimizer)
    entries, total = [], 0
    by_cname, seen, storages = {}, {}, {}
    for name, p in pairs:
        _check_param(name, p)
        if id(p) in seen:
            raise ValueError("parameter %r is the same tensor as %r: name each parameter once"
                             % (name, seen[id(p)]))
        seen[id(p)] = name
        if not p.requires_grad or p.numel() == 0:
            continue
        sp = _storage_ptr(p)
        if sp and sp in storages:
            raise ValueError("parameters %r and %r share storage: mqgrad gives each parameter "
                             "its own place in the flat array, which would untie them"
                             % (storages[sp], name))
        storages[sp] = name
        cname = short_name(name)
        if cname in by_cname:
            raise ValueError("parameters %r and %r have the same registered name %r (names "
                             "over %d bytes are shortened to the first 20 characters, '~' and "
                             "the last 42): rename one" % (by_cname[cname], name, cname,
                                                           NAME_MAX))
        by_cname[cname] = name
        n = p.numel()
        entries.append(_Entry(name, cname, p, total, n))
        total += n
    if not entries:
        raise ValueError("no parameter to train (none given, or none with requires_grad)")
    if len(entries) > TENSORS_MAX:
        raise ValueError("%d parameter tensors: mqgrad registers at most %d (group small ones "
                         "into one parameter, or freeze some with requires_grad=False)"
                         % (len(entries), TENSORS_MAX))
    if optimizer is not None:
        opt_params = {}
        for g in optimizer.param_groups:
            for p in g["params"]:
                opt_params[id(p)] = p
        named_ids = set(seen)
        for p in opt_params.values():
            if id(p) not in named_ids and p.requires_grad:
                raise ValueError("the optimizer has a parameter of shape %s that "
                                 "named_parameters does not name: give every trained "
                                 "parameter (model.named_parameters())" % (tuple(p.shape),))
        for e in entries:
            if id(e.param) not in opt_params:
                raise ValueError("parameter %r is not in the optimizer's param_groups: "
                                 "mqgrad trains every parameter it is given" % e.name)
    return entries, total


# ---- evaluation arithmetic (no library needed) ------------------------------------------

def eval_range(step, test_size):
    """This member's share [lo, hi) of the test examples in an evaluation round: of the first
    LIMIT examples, LIMIT = step.eval_limit (0: all) but at most TEST_SIZE, member m of M
    takes [LIMIT*m//M, LIMIT*(m+1)//M) (as the C workers do)."""
    if isinstance(test_size, bool) or not isinstance(test_size, numbers.Integral) or \
            test_size < 0:
        raise ValueError("test_size must be an integer >= 0, got %r" % (test_size,))
    if step.members < 1 or not 0 <= step.member < step.members:
        raise ValueError("step has member %d of %d" % (step.member, step.members))
    limit = int(test_size)
    if step.eval_limit and step.eval_limit < limit:
        limit = int(step.eval_limit)
    return limit * step.member // step.members, limit * (step.member + 1) // step.members


def _number(what, v):
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise ValueError("report(%s=...): a number, got a tensor of %d elements"
                             % (what, v.numel()))
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError("report(%s=...): a number, got %r" % (what, v))
    return v


def _count(what, v):
    v = _number(what, v)
    if isinstance(v, numbers.Integral):
        v = int(v)
    elif float(v).is_integer():
        v = int(v)
    else:
        raise ValueError("report(%s=...): a whole number, got %r" % (what, v))
    if v < 0:
        raise ValueError("report(%s=...): must be >= 0, got %d" % (what, v))
    return v


def eval_numbers(accuracy=None, loss=None, correct=None, total=None, loss_sum=None):
    """report()'s arguments as mqgrad_evaluated's (correct, total, loss_sum). TOTAL (test
    examples this member evaluated) is required; then exactly one of CORRECT (a count) or
    ACCURACY (a fraction in [0, 1]: correct = round(accuracy * total), which must be a count
    to within 0.01), and exactly one of LOSS_SUM (the summed loss) or LOSS (the mean: loss_sum
    = loss * total)."""
    if total is None:
        raise TypeError("report(): total= (the test examples evaluated) is required")
    total = _count("total", total)
    if (accuracy is None) == (correct is None):
        raise TypeError("report(): give exactly one of correct= (a count) or accuracy= (a "
                        "fraction)")
    if (loss is None) == (loss_sum is None):
        raise TypeError("report(): give exactly one of loss_sum= (summed over the examples) or "
                        "loss= (their mean)")
    if correct is not None:
        correct = _count("correct", correct)
    else:
        accuracy = float(_number("accuracy", accuracy))
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError("report(accuracy=%r): a fraction in [0, 1] (not a percentage)"
                             % accuracy)
        exact = accuracy * total
        correct = int(round(exact))
        if abs(exact - correct) > 0.01:
            raise ValueError("report(accuracy=%r, total=%d): %g correct is not a whole number; "
                             "give correct= instead" % (accuracy, total, exact))
    if correct > total:
        raise ValueError("report(): correct (%d) exceeds total (%d)" % (correct, total))
    if loss_sum is not None:
        loss_sum = float(_number("loss_sum", loss_sum))
    else:
        loss_sum = float(_number("loss", loss)) * total
    return correct, total, loss_sum


# ---- the worker -------------------------------------------------------------------------

def _flat(addr, n):
    """The N floats at ADDR as a torch tensor, no copy."""
    if not addr:
        raise RuntimeError("libmqgrad returned a NULL array")
    arr = (ctypes.c_float * n).from_address(addr)
    t = torch.from_numpy(np.ctypeslib.as_array(arr))
    if t.data_ptr() != addr or t.numel() != n:
        raise RuntimeError("internal: the flat array's tensor is not a view of libmqgrad's "
                           "memory")
    return t


def _same_view(t, v):
    return (t is not None and t.data_ptr() == v.data_ptr() and t.shape == v.shape and
            t.stride() == v.stride() and t.dtype == v.dtype)


def _plain_sgd(optimizer):
    """Why OPTIMIZER is not plain SGD (a list of reasons; empty if it is)."""
    why = []
    if type(optimizer) is not torch.optim.SGD:
        why.append("it is %s" % type(optimizer).__name__)
        return why
    for g in optimizer.param_groups:
        for key in ("momentum", "weight_decay", "dampening"):
            if g.get(key):
                why.append("%s=%g" % (key, g[key]))
        for key in ("nesterov", "maximize"):
            if g.get(key):
                why.append(key)
    if len(set(float(g["lr"]) for g in optimizer.param_groups)) > 1:
        why.append("its param_groups have different learning rates")
    return sorted(set(why))


class _Profile(object):
    """MQGRAD_PROFILE=PATH (off by default; bench/torch_overhead.sh sets it): one line per
    round appended to PATH.<rank>, "iter next pre zero check push post span" in ms: mqgrad_next
    (the wait for the round), the binding before the Step is yielded (lr, accumulation flags,
    zeroing), zero_grad() calls, step() before mqgrad_push (the loss, the checks, gradients
    collected), mqgrad_push's wall time (encode, send, wait, decode in libmqgrad), the binding
    after it (step()'s end, the loop's checks) and the span from the Step to mqgrad_push
    (what libmqgrad counts as the round's compute). Timing only: behaviour is unchanged."""

    def __init__(self, path):
        self.f = open(path, "a")
        self.iter = None
        self.t_got = self.t_resume = None
        self.next = self.pre = self.zero = self.check = self.push = self.post = 0.0
        self.span = 0.0

    def end_round(self, now):
        if self.t_resume is not None:
            self.post += now - self.t_resume
            self.t_resume = None
        if self.iter is not None:
            self.f.write("%d %.3f %.3f %.3f %.3f %.3f %.3f %.3f\n" % (
                self.iter, 1e3 * self.next, 1e3 * self.pre, 1e3 * self.zero, 1e3 * self.check,
                1e3 * self.push, 1e3 * self.post, 1e3 * self.span))
            self.iter = None
        self.next = self.pre = self.zero = self.check = self.push = self.post = 0.0
        self.span = 0.0

    def close(self):
        self.end_round(time.perf_counter())
        self.f.close()


class DistributedOptimizer(object):
    """Wraps OPTIMIZER and joins the run with NAMED_PARAMETERS (model.named_parameters(); None:
    the optimizer's parameters, named param.0, param.1, ...) as the model's tensors, in that
    order, their current values as the initial values (the run's first worker's are the
    servers' starting values; every worker starts from the servers' copy).

    Parameters must be float32, on the CPU and dense (TypeError/ValueError otherwise, naming
    the parameter); non-contiguous ones are copied into place. Names over 63 bytes are
    shortened (short_name). Afterwards each parameter's data is a view into libmqgrad's flat
    parameters and its .grad a view into the flat gradients: do not replace them (p.data =
    ..., model.share_memory()); a .grad set to None or replaced is copied back and re-attached
    (zero_grad, step). The update rule is the run's; OPTIMIZER's own rule is not used (a
    warning says so if it is not plain SGD); its param_groups' lr shows the round's rate.
    RuntimeError, with libmqgrad's reason, if the join fails.

    opt.flat_params and opt.flat_grads are libmqgrad's two flat arrays as tensors, valid until
    the worker leaves (shutdown(), or the end of rounds()).

    EARLY_PUSH=True sends gradients as the backward pass finishes them: a hook after each
    parameter's gradient accumulation tells libmqgrad which part of the flat gradient is final
    (mqgrad_ready), and the servers' shards that lie wholly there go, in this worker's order of
    the servers, while the backward pass computes the earlier layers (as Horovod's and DDP's
    hooks do). A push is a whole shard, so with few servers little goes early: on the paper's
    CNN with 2 servers it measured even with pushing at step() (bench/torch_early_push.sh), so
    it is off unless asked for (None: MQGRAD_EARLY_PUSH=1 asks). BACKWARD_PASSES_PER_STEP (as
    Horovod's): the backward passes a round adds up before its gradients are final. With early
    push, a gradient changed after its backward pass (clipping, for example) would have gone
    already: step() refuses it."""

    def __init__(self, optimizer, named_parameters=None, backward_passes_per_step=1,
                 early_push=None):
        global _current
        if not hasattr(optimizer, "param_groups"):
            raise TypeError("DistributedOptimizer(optimizer, ...): a torch.optim optimizer, "
                            "got %r" % (optimizer,))
        if _current is not None and _current._w is not None:
            raise RuntimeError("a DistributedOptimizer has already joined the run in this "
                               "process: one worker per process")
        if isinstance(backward_passes_per_step, bool) or \
                not isinstance(backward_passes_per_step, numbers.Integral) or \
                backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be an integer >= 1, got %r"
                             % (backward_passes_per_step,))
        self.optimizer = optimizer
        self._passes = int(backward_passes_per_step)
        if early_push is None:  # MQGRAD_EARLY_PUSH=1 turns it on without changing the script
            early_push = os.environ.get("MQGRAD_EARLY_PUSH", "0").strip() not in ("0", "")
        self._early = bool(early_push)
        self._thread = threading.get_ident()  # libmqgrad's calls come from one thread
        self._grad_accs = []  # the AccumulateGrad nodes the hooks hang on (kept alive)
        self._done = []       # this round: backward passes finished, per entry
        self._frontier = 0    # entries [frontier:] are final and told (mqgrad_ready)
        self._told_version = None  # flat_grads' version when the last of them was told
        self._w = None
        self._exit_code = None
        self._step = None
        self._members = 0     # the last round's member count (size())
        self._pushed = self._reported = False
        self._acc = []
        self._zeroed = None   # the flat gradient's version when it was last zeroed
        self._prof = None
        self._entries, self._total = layout(named_parameters, optimizer)
        self._lib = _lib.load()
        self._join()
        if os.environ.get("MQGRAD_PROFILE"):
            self._prof = _Profile("%s.%d" % (os.environ["MQGRAD_PROFILE"], self.rank()))
        _current = self
        _register_atexit()
        self._warn_rule()

    # the optimizer's own attributes (param_groups, state, defaults, ...)
    def __getattr__(self, name):
        opt = self.__dict__.get("optimizer")
        if opt is None:
            raise AttributeError(name)
        return getattr(opt, name)

    def __repr__(self):
        return "DistributedOptimizer(%r, tensors=%d, params=%d, %s)" % (
            self.optimizer, len(self._entries), self._total,
            "joined" if self._w is not None else "left")

    def _join(self):
        lib, entries, total = self._lib, self._entries, self._total
        with torch.no_grad():
            init_values = torch.empty(total, dtype=torch.float32)
            for e in entries:
                init_values[e.offset:e.offset + e.count].view_as(e.param).copy_(e.param)
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "mqgrad-torch"
        argv = [prog] + list(_argv)
        names = [a.encode("utf-8") for a in argv]
        c_argv = (ctypes.c_char_p * (len(names) + 1))(*(names + [None]))
        cnames = [e.cname.encode("ascii") for e in entries]
        tensors = (_lib.TensorT * len(entries))()
        for i, e in enumerate(entries):
            tensors[i].name = cnames[i]
            tensors[i].count = e.count
        w = lib.mqgrad_join(len(argv), c_argv, tensors, len(entries), init_values.data_ptr())
        del init_values
        if not w:
            raise JoinError("mqgrad: joining the run failed: %s"
                            % (_lib.error(lib, None) or "(no reason given)"),
                            int(lib.mqgrad_join_code()))
        _leave_on_sigterm()
        self._w = ctypes.c_void_p(w)
        try:
            # autograd adds onto the .grad views: libmqgrad hands each round over with the
            # gradient zero, zeroing what it encodes while it is in cache
            if lib.mqgrad_zero_grads(self._w, 1) != 0:
                raise RuntimeError("mqgrad: %s" % _lib.error(lib, self._w))
            n = lib.mqgrad_nparams(self._w)
            if n != total:
                raise RuntimeError("internal: libmqgrad holds %d parameters, the model %d"
                                   % (n, total))
            r = lib.mqgrad_run(self._w).contents
            self._run = dict((f, getattr(r, f)) for f, _ in _lib.RunT._fields_)
            for k, v in self._run.items():
                if isinstance(v, bytes):
                    self._run[k] = v.decode("utf-8", "replace")
            self.flat_params = _flat(lib.mqgrad_params(self._w), total)
            self.flat_grads = _flat(lib.mqgrad_grads(self._w), total)
            with torch.no_grad():
                for e in entries:
                    sl = slice(e.offset, e.offset + e.count)
                    e.pview = self.flat_params[sl].view(e.param.shape)
                    e.gview = self.flat_grads[sl].view(e.param.shape)
                    e.param.data = e.pview
                    e.param.grad = e.gview
                    if e.param.data_ptr() != e.pview.data_ptr() or \
                            e.param.grad.data_ptr() != e.gview.data_ptr():
                        raise RuntimeError("internal: parameter %r is not a view of libmqgrad's "
                                           "arrays" % e.name)
            self._acc = [False] * len(entries)
            if self._early:
                self._hook_grads()
        except BaseException:
            self._leave()
            raise

    # -- gradients as the backward pass finishes them

    def _hook_grads(self):
        for i, e in enumerate(self._entries):
            # the parameter's AccumulateGrad node: its hooks run once the gradient is in .grad
            # (PyTorch 1.13 has no post-accumulate hook on the tensor itself)
            with torch.enable_grad():
                acc = e.param.expand_as(e.param).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(i))
            self._grad_accs.append(acc)

    def _make_hook(self, i):
        def hook(*_):
            self._grad_final(i)
        return hook

    def _grad_final(self, i):
        if self._w is None or self._step is None or self._pushed or \
                threading.get_ident() != self._thread:
            return
        e = self._entries[i]
        if not _same_view(e.param.grad, e.gview):
            return  # replaced: step() copies it in and sends it
        self._done[i] += 1
        # every accumulation so far is the backward pass's own: step() compares with this
        self._told_version = self.flat_grads._version
        f = self._frontier
        while f > 0 and self._done[f - 1] >= self._passes:
            f -= 1
        if f < self._frontier and self._lib.mqgrad_ready(self._w, self._entries[f].offset) == 0:
            self._frontier = f  # (a refusal: everything goes at step(), which says why)

    def _warn_rule(self):
        global _warned_rule
        why = _plain_sgd(self.optimizer)
        if why and not _warned_rule:
            _warned_rule = True
            warnings.warn(
                "mqgrad applies the run's update rule (%s) to every replica and to the "
                "servers' master copies; the wrapped optimizer's own rule is not used (%s)"
                % (self._run.get("optimizer") or "the scheduler's --optimizer",
                   ", ".join(why)), stacklevel=3)

    # -- state

    def _joined(self, what):
        if self._w is None:
            raise RuntimeError("%s: this worker has left the run (exit code %s)"
                               % (what, self._exit_code))
        return self._w

    @property
    def joined(self):
        return self._w is not None

    def run(self):
        """The run's configuration (mqgrad_run_t) as a dict."""
        return dict(self._run)

    def rank(self):
        return int(self._run["rank"])

    def size(self):
        """The workers of the latest round (an elastic run's count changes as workers join
        and leave); before the first round, the run's rank space (run()['workers'])."""
        self._joined("size")
        return self._members or int(self._run["workers"])

    def accumulates(self, i):
        """Whether tensor I's gradient adds onto what the flat gradient holds (error feedback:
        its residual lives there)."""
        return self._lib.mqgrad_accumulates(self._joined("accumulates"), i) == 1

    # -- gradients

    def _refresh_acc(self):
        w = self._w
        self._acc = [self._lib.mqgrad_accumulates(w, i) == 1
                     for i in range(len(self._entries))]

    def _zero_grads(self, unless_clean=False):
        with torch.no_grad():
            # UNLESS_CLEAN: nothing was written into the flat gradient since it was last
            # zeroed (by this, or by libmqgrad in step()'s push), as its version counter
            # (shared by its views, bumped by autograd's accumulation and every in-place op on
            # them) tells: no second pass over it. Writes that bypass the counter (.data,
            # numpy, ctypes) are not seen.
            if not (unless_clean and self._zeroed == self.flat_grads._version):
                if not any(self._acc):
                    # memset, faster than zero_() on a large array (bench/README.md,
                    # torch_overhead.sh); it bumps no version: _zeroed takes it as it is
                    ctypes.memset(self.flat_grads.data_ptr(), 0, 4 * self._total)
                else:
                    for e, acc in zip(self._entries, self._acc):
                        if not acc:
                            e.gview.zero_()
                self._zeroed = self.flat_grads._version
            for e in self._entries:
                if not _same_view(e.param.grad, e.gview):
                    e.param.grad = e.gview

    def zero_grad(self, set_to_none=False):
        """Zeroes the gradients, except tensors whose gradient accumulates (error feedback
        keeps a residual there). Gradients are never set to None (SET_TO_NONE is ignored):
        they are views of libmqgrad's array. rounds() zeroes them before each round too, so a
        zero_grad() before anything has written into them (autograd's accumulation, in-place
        ops: their version counter) has nothing left to zero and only re-attaches the views."""
        self._joined("zero_grad")
        p = self._prof
        if p is not None:
            t = time.perf_counter()
        self._zero_grads(unless_clean=True)
        if p is not None:
            p.zero += time.perf_counter() - t

    def _check_params(self):
        for e in self._entries:
            p = e.param
            if not _same_view(p.data, e.pview):
                raise RuntimeError(
                    "parameter %r is no longer a view of mqgrad's parameters (its data was "
                    "replaced: p.data = ..., model.share_memory(), a change of dtype or "
                    "device?): its gradient was computed on other values than the run's"
                    % e.name)

    def _check_sent(self):
        # the gradients told final (sent early) must be what the servers got
        changed = self.flat_grads._version != self._told_version
        for e in self._entries[self._frontier:]:
            changed = changed or not _same_view(e.param.grad, e.gview)
        if changed:
            raise RuntimeError(
                "round %d: gradients changed after the backward pass had sent them (clipping, "
                "or a .grad replaced?): create the DistributedOptimizer with early_push=False "
                "to change gradients before step()" % self._step.iter)

    def _collect_grads(self):
        """Makes the flat gradient hold every parameter's gradient: a .grad that is not the
        view any more (set to None, or replaced) is copied in (added, for accumulating
        tensors; None counts as zero) and the view re-attached."""
        with torch.no_grad():
            for e, acc in zip(self._entries, self._acc):
                g = e.param.grad
                if _same_view(g, e.gview):
                    continue
                if g is None:
                    if not acc:
                        e.gview.zero_()
                else:
                    if g.shape != e.gview.shape:
                        raise RuntimeError("parameter %r has a gradient of shape %s, expected "
                                           "%s" % (e.name, tuple(g.shape),
                                                   tuple(e.gview.shape)))
                    if g.is_sparse:
                        g = g.to_dense()
                    if acc:
                        e.gview.add_(g)
                    else:
                        e.gview.copy_(g)
                e.param.grad = e.gview

    def step(self, loss, closure=None):
        """Pushes the round's gradient with its LOSS (a number or a one-element tensor: the
        round's training loss, which the run reports), waits for the servers' aggregates and
        applies them to the parameters (in place). Once per round, inside rounds()."""
        if closure is not None:
            raise TypeError("step(loss): closures are not supported")
        p = self._prof
        if p is not None:
            t_in = time.perf_counter()
        w = self._joined("step")
        if self._step is None or self._pushed:
            raise RuntimeError("step(loss) is called once per round, inside "
                               "`for step in opt.rounds():`")
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError("step(loss): the loss must be one number, got a tensor of %d "
                                 "elements" % loss.numel())
            loss = loss.item()
        loss = float(loss)
        self._check_params()
        if self._frontier < len(self._entries):
            self._check_sent()
        self._collect_grads()
        if p is not None:
            t_call = time.perf_counter()
            p.check += t_call - t_in
            p.span = t_call - p.t_got
        rc = self._lib.mqgrad_push(w, loss)
        if p is not None:
            t_ret = time.perf_counter()
            p.push = t_ret - t_call
        if rc != 0:
            raise RuntimeError("mqgrad: pushing round %d failed: %s"
                               % (self._step.iter, _lib.error(self._lib, w)))
        self._pushed = True
        # libmqgrad zeroed what it encoded (mqgrad_zero_grads): the next round's gradient is
        # zero unless something writes into it before then (the version counter moves)
        self._zeroed = self.flat_grads._version
        if p is not None:
            p.post += time.perf_counter() - t_ret

    def report(self, accuracy=None, loss=None, correct=None, total=None, loss_sum=None):
        """After step(loss) in a round with step.evaluate: this member's evaluation (see
        eval_numbers for the arguments) → mqgrad_evaluated."""
        w = self._joined("report")
        c, t, s = eval_numbers(accuracy, loss, correct, total, loss_sum)
        if self._step is None or not self._step.evaluate:
            raise RuntimeError("report(): only in a round with step.evaluate")
        if not self._pushed:
            raise RuntimeError("report(): call step(loss) first, then evaluate and report")
        if self._reported:
            raise RuntimeError("report(): round %d is already reported" % self._step.iter)
        if self._lib.mqgrad_evaluated(w, c, t, s) != 0:
            raise RuntimeError("mqgrad: reporting the evaluation of round %d failed: %s"
                               % (self._step.iter, _lib.error(self._lib, w)))
        self._reported = True

    # -- rounds

    def rounds(self):
        """Yields a Step for each round this worker is a member of, until the run is over;
        then, or when the loop ends early (break, an exception), the worker leaves the run
        (shutdown() gives its exit code). The parameters are in place for the round and the
        gradients zeroed (but for accumulating tensors) when a Step is yielded. RuntimeError
        with libmqgrad's reason if the worker fails or is stopped."""
        self._joined("rounds")
        lib = self._lib
        st = _lib.StepT()
        p = self._prof
        try:
            while True:
                w = self._joined("rounds")  # shutdown() may have been called in the loop
                if self._step is not None:
                    if not self._pushed:
                        raise RuntimeError("round %d: step(loss) was not called"
                                           % self._step.iter)
                    if not self._reported:
                        raise RuntimeError("round %d asked for an evaluation (step.evaluate): "
                                           "call report(...) after step(loss)"
                                           % self._step.iter)
                if p is not None:
                    p.end_round(time.perf_counter())
                    t_next = time.perf_counter()
                rc = lib.mqgrad_next(w, ctypes.byref(st))
                if p is not None:
                    p.t_got = time.perf_counter()
                    p.next = p.t_got - t_next
                if rc == 0:
                    self._step = None
                    return
                if rc != 1:
                    raise RuntimeError("mqgrad: waiting for the next round failed: %s"
                                       % _lib.error(lib, w))
                step = Step(int(st.iter), int(st.member), int(st.members), int(st.cursor),
                            int(st.bits), float(st.lr), bool(st.evaluate), int(st.eval_limit))
                self._step, self._pushed, self._reported = step, False, not step.evaluate
                self._members = step.members
                for g in self.optimizer.param_groups:
                    g["lr"] = step.lr
                self._refresh_acc()
                self._zero_grads(unless_clean=True)
                self._done = [0] * len(self._entries)
                self._frontier = len(self._entries)
                if p is not None:
                    p.iter = step.iter
                    p.pre = time.perf_counter() - p.t_got
                yield step
                if p is not None:
                    p.t_resume = time.perf_counter()
        finally:
            self._step = None
            self.shutdown()

    # -- leaving

    def _detach(self):
        """Gives every parameter (and gradient) its own copy: libmqgrad frees its arrays."""
        with torch.no_grad():
            for e in self._entries:
                p = e.param
                if e.pview is not None and p.data.data_ptr() == e.pview.data_ptr():
                    p.data = p.data.clone()
                if e.gview is not None and p.grad is not None and \
                        p.grad.data_ptr() == e.gview.data_ptr():
                    p.grad = p.grad.clone()
                e.pview = e.gview = None
        self.flat_params = self.flat_grads = None

    def _leave(self):
        if self._prof is not None:
            self._prof.close()
            self._prof = None
        if self._w is None:
            return self._exit_code
        try:
            self._detach()
        finally:
            self._exit_code = int(self._lib.mqgrad_leave(ctypes.byref(self._w)))
            self._w = None
        return self._exit_code

    def shutdown(self):
        """Leaves the run (at once if it is not over) and returns the worker's exit code: 0
        (the run is over, or it left), 1 (it failed) or 4 (refused). The parameters keep their last values
        as tensors of their own. Idempotent."""
        return self._leave()


class JoinError(RuntimeError):
    """A worker could not join the run; exit_code is what the process should end with: 4 when
    the scheduler refused it (its model is not the run's, the run is over: starting it again
    as it is cannot help, and mqgrad local does not), 1 otherwise."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def _on_sigterm(signum, frame):
    # SystemExit unwinds the training loop: rounds() leaves the run on its way out, so the
    # scheduler takes this worker out at once (compose's stop and scale-down send SIGTERM)
    raise SystemExit(0)


def _leave_on_sigterm():
    """SIGTERM leaves the run, as it does mqgrad-worker, unless the program handles it."""
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: the program's own business
        pass


def _require(what):
    if _current is None:
        raise RuntimeError("mqgrad.torch.%s: the worker has not joined a run: create the "
                           "DistributedOptimizer first (joining needs the model's "
                           "parameters)" % what)
    return _current


def is_joined():
    return _current is not None and _current._w is not None


def rank():
    """This worker's rank in the run (0 .. size() - 1)."""
    return _require("rank()").rank()


def size():
    """The workers of the latest round, as hvd.size() (an elastic run's count changes as
    workers join and leave); before the first round, the run's rank space."""
    return _require("size()").size()


def run():
    """The run's configuration (mqgrad_run_t) as a dict: rank, workers, servers, batch, seed,
    model, dataset, codec, optimizer, threshold, l2."""
    return _require("run()").run()


def rounds(optimizer=None):
    """The rounds of OPTIMIZER (default: the joined one): optimizer.rounds()."""
    return (optimizer or _require("rounds()")).rounds()


def report(accuracy=None, loss=None, correct=None, total=None, loss_sum=None):
    """The joined worker's report() of this round's evaluation."""
    return _require("report()").report(accuracy=accuracy, loss=loss, correct=correct,
                                       total=total, loss_sum=loss_sum)


def shutdown():
    """Leaves the run; the worker's exit code (0 the run is over or it left, 1 failed, 4 refused), None
    if no worker joined. Also run at exit."""
    if _current is None:
        return None
    return _current.shutdown()


_atexit_done = False


def _register_atexit():
    global _atexit_done
    if not _atexit_done:
        _atexit_done = True
        atexit.register(shutdown)


def broadcast_parameters(params, root_rank=0):
    """Horovod's call, accepted for porting: nothing to do. PARAMS is a state_dict, or
    named_parameters() pairs, or tensors. Parameters registered with the DistributedOptimizer
    need no broadcast: the run's first worker gives the servers their starting values, and
    every worker pulls the servers' copy before its first round, so all start equal (from the
    first worker's values, whatever ROOT_RANK says). Other tensors (buffers such as
    BatchNorm's running statistics) are not sent: each worker keeps its own."""
    if isinstance(params, dict) or hasattr(params, "items"):
        params = list(params.items())
    for item in params:
        t = item[1] if isinstance(item, tuple) else item
        if not isinstance(t, torch.Tensor):
            raise TypeError("broadcast_parameters: expected tensors or (name, tensor) pairs, "
                            "got %r" % (item,))
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral) or \
            root_rank < 0:
        raise ValueError("root_rank must be a rank >= 0, got %r" % (root_rank,))


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Horovod's call, accepted for porting: nothing to do. The update rule's state (momentum,
    ...) is the run's, kept by libmqgrad identically on every replica."""
    if not hasattr(optimizer, "param_groups"):
        raise TypeError("broadcast_optimizer_state: an optimizer, got %r" % (optimizer,))


class DistributedSampler(object):
    """The training examples of each round: indices(step) → the int64 indices (a LongTensor of
    the run's batch) of this member's examples in a training set of DATASET_SIZE, from the
    run's seeded per-epoch permutation (the one the C workers use), so a round's members take
    disjoint examples and an epoch takes each once. OPTIMIZER: the joined one by default. The
    returned tensor is reused: it holds the indices until the next call."""

    def __init__(self, dataset_size, optimizer=None):
        if isinstance(dataset_size, bool) or not isinstance(dataset_size, numbers.Integral) or \
                dataset_size < 1:
            raise ValueError("dataset_size must be an integer >= 1, got %r" % (dataset_size,))
        self.dataset_size = int(dataset_size)
        self._opt = optimizer
        self._buf = None

    def indices(self, step):
        opt = self._opt or _require("DistributedSampler.indices()")
        w = opt._joined("DistributedSampler.indices")
        batch = int(opt._run["batch"])
        if self._buf is None or self._buf.numel() != batch:
            self._buf = torch.empty(batch, dtype=torch.int64)
        pos = step.cursor + step.member * batch
        if opt._lib.mqgrad_examples(w, self.dataset_size, pos, batch,
                                    self._buf.data_ptr()) != 0:
            raise RuntimeError("mqgrad: the examples of round %d: %s"
                               % (step.iter, _lib.error(opt._lib, w)))
        return self._buf
