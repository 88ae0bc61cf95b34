# ruff: noqa
import sys; sys.path.insert(0, ".")
import course, torch
from solutions.kernels import layernorm, rmsnorm
M, N = int(sys.argv[1]), int(sys.argv[2])
x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(w)
for _ in range(3): layernorm(x, w, b, 1e-5)
for _ in range(3): rmsnorm(x, w, 1e-6)
torch.cuda.synchronize()
