"""On a machine with a CUDA GPU, the kernel tests that call ``backend="triton"`` on CPU tensors check
the compiled kernels instead of the interpreter (which tests/conftest.py turns on only where there is
no GPU): ``on_cuda(fn)`` runs such a call on CUDA copies of its tensor arguments, moved with
``Tensor.to`` (differentiable, so gradients flow back to the test's CPU leaves), and hands the
tensors it returns back on the CPU. Elsewhere, for every other backend, and for a call whose tensors
are all on the GPU already, the call is unchanged."""

import functools

import torch
from torch.utils._pytree import tree_map


def on_cuda(fn):
    if not torch.cuda.is_available():
        return fn

    def there(x):
        return x.to("cuda") if isinstance(x, torch.Tensor) else x

    def back(x):
        return x.cpu() if isinstance(x, torch.Tensor) else x

    @functools.wraps(fn)
    def run(*args, **kwargs):
        tensors = [x for x in (*args, *kwargs.values()) if isinstance(x, torch.Tensor)]
        if kwargs.get("backend") != "triton" or all(t.is_cuda for t in tensors):
            return fn(*args, **kwargs)
        out = fn(*[there(a) for a in args], **{k: there(v) for k, v in kwargs.items()})
        assert all(t.is_cuda for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return tree_map(back, out)

    return run
