# Reproduces a bad-input call on CPU tensors: q batch 2, k/v batch 1 must raise a RuntimeError.
import faulthandler
faulthandler.enable()
import torch
import flashattn._C  # noqa: F401
q = torch.randn(2, 5, 4, 8)
k = torch.randn(1, 7, 2, 8)
v = torch.randn(1, 7, 2, 8)
for args in ((q, k.double(), v), (q, k, v)):
    try:
        torch.ops.flashattn.fwd(*args, 0.35, False, True)
        print("no error")
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0])
