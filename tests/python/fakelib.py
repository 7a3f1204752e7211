"""A stand-in for libmqgrad with its ctypes calling conventions, for the binding's tests without
a cluster: it keeps the flat arrays in numpy, issues ROUNDS rounds (evaluating in those of
EVALUATE), applies plain SGD on push and, for the tensors in ACC (error feedback), leaves half
of the pushed gradient in the gradient array as the residual; asked to (mqgrad_zero_grads), it
zeroes the others on push, and the whole array but for them at a round that follows no push."""
import ctypes

import numpy as np

from mqgrad import _lib


class FakeLib(object):
    def __init__(self, rounds=3, evaluate=(), acc=(), batch=4, lr=0.5, optimizer=b"sgd",
                 members=2, member=1):
        self.nrounds, self.evaluate, self.acc = rounds, set(evaluate), set(acc)
        self.batch, self.lr, self.members, self.member = batch, lr, members, member
        self.run = _lib.RunT(rank=1, workers=2, servers=1, batch=batch, seed=7, model=b"external",
                             dataset=b"fashion-mnist", codec=b"qsgd", optimizer=optimizer,
                             threshold=1000, l2=1e-4)
        self.iter = 0
        self.pushed, self.evaluated, self.left, self.readies = [], [], 0, []
        self.argv = self.names = self.counts = None
        self.params = self.grads = None
        self.zero = 0          # mqgrad_zero_grads
        self.clean = False     # the last round was pushed, and zeroed so

    def mqgrad_join(self, argc, argv, tensors, n, init):
        self.argv = [argv[i].decode() for i in range(argc)]
        assert argv[argc] is None
        self.names = [tensors[i].name.decode() for i in range(n)]
        self.counts = [tensors[i].count for i in range(n)]
        total = sum(self.counts)
        self.init = np.ctypeslib.as_array((ctypes.c_float * total).from_address(init)).copy()
        self.params = self.init.copy()
        self.grads = np.full(total, 99.0, dtype=np.float32)  # garbage until zeroed
        self.offsets = np.cumsum([0] + self.counts)
        return 4242

    def _w(self, w):
        assert w.value == 4242

    def mqgrad_run(self, w):
        self._w(w)
        return ctypes.pointer(self.run)

    def mqgrad_nparams(self, w):
        return self.params.size

    def mqgrad_params(self, w):
        return self.params.ctypes.data

    def mqgrad_grads(self, w):
        return self.grads.ctypes.data

    def mqgrad_accumulates(self, w, i):
        return 1 if i in self.acc else 0

    def mqgrad_zero_grads(self, w, on):
        self._w(w)
        self.zero = on
        return 0

    def _zero_others(self):
        for i in range(len(self.counts)):
            if i not in self.acc:
                self.grads[self.offsets[i]:self.offsets[i + 1]] = 0

    def mqgrad_next(self, w, ref):
        self._w(w)
        if self.iter >= self.nrounds:
            return 0
        st = ref._obj
        st.iter, st.member, st.members = self.iter, self.member, self.members
        st.cursor = self.iter * self.members * self.batch
        st.bits, st.lr = 4, self.lr
        st.evaluate = 1 if self.iter in self.evaluate else 0
        st.eval_limit = 1000
        if self.zero and not self.clean:
            self._zero_others()
        self.clean = False
        self.iter += 1
        return 1

    def mqgrad_ready(self, w, frm):
        self._w(w)
        assert 0 <= frm <= self.params.size
        self.readies.append((self.iter - 1, frm, self.grads[frm:].copy()))
        return 0

    def mqgrad_push(self, w, loss):
        self._w(w)
        self.pushed.append((loss, self.grads.copy()))
        self.params -= self.lr * self.grads
        for i in self.acc:
            a, b = self.offsets[i], self.offsets[i + 1]
            self.grads[a:b] *= 0.5
        if self.zero:
            self._zero_others()
            self.clean = True
        return 0

    def mqgrad_evaluated(self, w, correct, total, loss_sum):
        self.evaluated.append((correct, total, loss_sum))
        return 0

    def mqgrad_examples(self, w, size, pos, n, out):
        arr = np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(out))
        arr[:] = (pos + np.arange(n)) % size
        return 0

    def mqgrad_error(self, w):
        return b"fake error"

    def mqgrad_leave(self, ref):
        ref._obj.value = None
        self.left += 1
        return 0
