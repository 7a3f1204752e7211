"""PyTorch workers in real clusters: the services as processes over TCP, the real data set,
the paper's CNN written in PyTorch (examples/torch/paper_cnn.py). What a user of
`mqgrad local --worker-exec` sees: the run trains well above chance with the agent choosing
the bits; a C worker and a PyTorch worker of the same model train one run together and every
replica ends equal to the servers' master copies; a PyTorch worker killed mid-run is replaced
and the run completes; a model that is not the run's is refused, saying what differs.

Every process has a deadline. The build is $MQGRAD_BUILD_DIR (default build/)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("MQGRAD_BUILD_DIR", os.path.join(ROOT, "build"))
MQGRAD = os.path.join(BUILD, "tools", "mqgrad")
SERVICES = os.path.join(BUILD, "services")
LIB = os.path.join(BUILD, "common", "libmqgrad.so")
EXAMPLE = os.path.join(ROOT, "examples", "torch", "paper_cnn.py")
PYTHON = sys.executable  # the interpreter running pytest has torch (Debian's /usr/bin/python3)

pytestmark = pytest.mark.skipif(
    not (os.access(MQGRAD, os.X_OK) and os.path.exists(LIB)),
    reason="the build (%s: tools/mqgrad, common/libmqgrad.so) is not there" % BUILD)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("MQGRAD_")]:
        del env[k]  # the caller's shell must not configure the test's services
    env.update(MQGRAD_INSECURE="1", MQGRAD_LIB=LIB, MQGRAD_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(ROOT, "python"))
    env.update(extra)
    return env


def _summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def _local(run_dir, flags, timeout):
    """mqgrad local with FLAGS; its completed process (stdout and stderr as text)."""
    cmd = [MQGRAD, "local", "--run-dir", str(run_dir), "--quiet", "--insecure"] + flags
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)


def _tail(path, n=3000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError as e:
        return str(e)


def test_two_torch_workers_train_the_paper_cnn(tmp_path):
    """2 PyTorch workers, C servers and the agent, 300 iterations of the paper's CNN on
    Fashion-MNIST: above 80 % test accuracy on the whole test set, the bits the agent's. The
    learning rate decays over the last 30 %, as in the demo: a constant rate's last iterate
    swings by a point or two from one evaluation to the next (docs/codec-sweep.md)."""
    run = tmp_path / "run"
    p = _local(run, ["--worker-exec", "%s %s" % (PYTHON, EXAMPLE), "--workers", "2",
                     "--iterations", "300", "--lr-decay", "0.3", "--eval-every", "100",
                     "--eval-limit", "1000", "--final-eval-limit", "0"],
               timeout=1500)
    assert p.returncode == 0, p.stderr[-4000:] + _tail(run / "logs" / "worker-0.log")
    s = _summary(run)
    assert s["status"] == "completed"
    assert s["model"] == "external"
    assert s["policy"] == "mqgrad"
    assert s["final_test_acc"] >= 0.80, s  # on the whole test set
    assert s["params"] == 16221386, s  # the paper's CNN, as the first worker declared it
    with open(run / "metrics.csv") as f:
        head = f.readline().strip().split(",")
        bits = {row.split(",")[head.index("bits")] for row in f if row.strip()}
    assert bits and "32" not in bits, bits  # quantized, at the agent's widths


def test_c_and_torch_workers_train_one_run(tmp_path):
    """mqgrad-worker and a PyTorch worker of the same model (the small CNN) in one run of the
    built-in model: it learns, and both replicas end equal to the server's master copy, bit
    for bit. The PyTorch worker sends its gradient from inside the backward pass (early
    push), the C worker from inside its own."""
    port = _free_port()
    ep = "tcp://127.0.0.1:%d" % port
    run = tmp_path / "run"
    env = _env()
    procs = []
    try:
        procs.append(subprocess.Popen(
            [os.path.join(SERVICES, "mqgrad-scheduler"), "--bind", ep, "--workers", "2",
             "--servers", "1", "--model", "small", "--iterations", "200", "--batch", "32",
             "--lr", "0.05", "--bits", "4", "--threshold", "1000", "--eval-every", "0",
             "--final-eval-limit", "2000", "--run-dir", str(run), "--progress-every", "0"],
            env=env, stderr=open(tmp_path / "scheduler.log", "w")))
        procs.append(subprocess.Popen(
            [os.path.join(SERVICES, "mqgrad-server"), "--scheduler", ep, "--bind",
             "tcp://127.0.0.1:*", "--dump", str(tmp_path / "server.bin")],
            env=env, stderr=open(tmp_path / "server.log", "w")))
        procs.append(subprocess.Popen(
            [os.path.join(SERVICES, "mqgrad-worker"), "--scheduler", ep, "--threads", "1",
             "--dump", str(tmp_path / "c.bin")],
            env=env, stderr=open(tmp_path / "c-worker.log", "w")))
        procs.append(subprocess.Popen(
            [PYTHON, EXAMPLE, "--size", "small", "--scheduler", ep],
            env=_env(MQGRAD_DUMP=str(tmp_path / "torch.bin"), MQGRAD_EARLY_PUSH="1"),
            stdout=open(tmp_path / "torch-worker.log", "w"), stderr=subprocess.STDOUT))
        deadline = time.time() + 600
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = "".join("\n--- %s\n%s" % (n, _tail(tmp_path / n)) for n in
                   ("scheduler.log", "c-worker.log", "torch-worker.log"))
    assert [p.returncode for p in procs] == [0, 0, 0, 0], logs
    s = _summary(run)
    assert s["status"] == "completed", s
    assert s["final_test_acc"] > 0.5, s  # chance is 0.10
    master = (tmp_path / "server.bin").read_bytes()
    assert len(master) > 0
    assert (tmp_path / "c.bin").read_bytes() == master, "the C replica differs from the master"
    assert (tmp_path / "torch.bin").read_bytes() == master, \
        "the PyTorch replica differs from the master"


def _worker_pids(local_pid):
    """The PyTorch worker processes under mqgrad local (sh -c children of its children)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines() if line.strip()]
    children = {}
    for pid, ppid, args in rows:
        children.setdefault(int(ppid), []).append((int(pid), args))
    found, todo = [], [local_pid]
    while todo:
        for pid, args in children.get(todo.pop(), []):
            todo.append(pid)
            if "paper_cnn.py" in args and not args.startswith("/bin/sh"):
                found.append(pid)
    return found


def test_torch_worker_killed_and_replaced(tmp_path):
    """A PyTorch worker killed mid-run: the run goes on with the other, mqgrad local starts
    it again, it joins (pulling the parameters) and the run completes, having learned."""
    run = tmp_path / "run"
    cmd = [MQGRAD, "local", "--run-dir", str(run), "--quiet", "--insecure", "--worker-exec",
           "%s %s --size small" % (PYTHON, EXAMPLE), "--model", "small", "--workers", "2",
           "--min-workers", "1", "--iterations", "400", "--eval-every", "0",
           "--final-eval-limit", "2000", "--lr", "0.05", "--threshold", "1000"]
    p = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        metrics = run / "metrics.csv"
        deadline = time.time() + 300
        while time.time() < deadline:  # until the run is well under way
            if metrics.exists() and sum(1 for _ in open(metrics)) > 60:
                break
            time.sleep(0.5)
        pids = _worker_pids(p.pid)
        assert len(pids) == 2, pids
        os.kill(pids[0], signal.SIGKILL)
        out, err = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-4000:]
    assert "it is started again" in err, err[-4000:]
    s = _summary(run)
    assert s["status"] == "completed" and s["final_test_acc"] > 0.5, s
    events = (run / "events.jsonl").read_text()
    assert '"worker_lost"' in events, events[-3000:]
    assert '"worker_joined"' in events, events[-3000:]


def test_layout_mismatch_refused(tmp_path):
    """A PyTorch worker whose model is not the run's: refused at once, with the first tensor
    that differs, and its process ends with the refusal's exit code."""
    port = _free_port()
    ep = "tcp://127.0.0.1:%d" % port
    sched = subprocess.Popen(
        [os.path.join(SERVICES, "mqgrad-scheduler"), "--bind", ep, "--workers", "1",
         "--servers", "1", "--model", "paper", "--run-dir", str(tmp_path / "run"),
         "--start-timeout", "60"], env=_env(), stderr=subprocess.DEVNULL)
    try:
        w = subprocess.run([PYTHON, EXAMPLE, "--size", "small", "--scheduler", ep],
                           env=_env(MQGRAD_PEER_TIMEOUT="20"), capture_output=True, text=True,
                           timeout=120)
    finally:
        sched.kill()
        sched.wait()
    text = w.stdout + w.stderr
    assert w.returncode != 0, text
    assert "the model differs from the run's (built-in paper): tensor 0 'conv1.w' has 200 " \
           "elements, the run's has 1600" in text, text[-3000:]


def test_external_model_resumes_from_its_checkpoint(tmp_path):
    """A run of the workers' own model, interrupted: --resume goes on from the servers' shard
    checkpoints of that layout (no worker's values are taken again) and completes."""
    run = tmp_path / "run"
    cmd = [MQGRAD, "local", "--run-dir", str(run), "--quiet", "--insecure", "--worker-exec",
           "%s %s --size small" % (PYTHON, EXAMPLE), "--workers", "2", "--iterations", "300",
           "--checkpoint-every", "50", "--eval-every", "0", "--final-eval-limit", "2000",
           "--lr", "0.05", "--threshold", "1000"]
    p = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and p.poll() is None:
            if (run / "checkpoint.json").exists() and \
                    sum(1 for _ in open(run / "metrics.csv")) > 120:
                break
            time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, err[-3000:]
    assert _summary(run)["status"] == "interrupted"
    done = json.loads((run / "checkpoint.json").read_text())["iter"]
    assert done >= 50
    r = subprocess.run([MQGRAD, "local", "--resume", str(run)], env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    s = _summary(run)
    assert s["status"] == "completed" and s["iterations"] == 300, s
    assert s["final_test_acc"] > 0.5, s
    logs = (run / "logs" / "server-0.log").read_text() + \
        (run / "logs" / "server-1.log").read_text()
    for shard in (0, 1):
        assert "resumed shard %d from its checkpoint of iteration %d" % (shard, done) in logs, \
            logs[-3000:]
