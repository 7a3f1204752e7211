"""mqgrad: train your own model as a worker of an mqgrad cluster.

The PyTorch API is ``mqgrad.torch`` (modelled on Horovod's ``horovod.torch``)::

    import mqgrad.torch as mq

    mq.init()
    opt = mq.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters())
    sampler = mq.DistributedSampler(len(train_set))
    for step in opt.rounds():
        ...

``mqgrad._lib`` is the ctypes binding of libmqgrad (common/include/mqgrad/mqgrad.h). Importing
this package loads nothing: the library is loaded when a worker joins a run.
"""

__version__ = "0.1.0"
API_VERSION = 1  # MQGRAD_API_VERSION this package was written for
