import triton
import triton.language as tl


@triton.jit
def ln_loop(x_ptr, w_ptr, b_ptr, y_ptr, N, stride, eps, BLOCK: tl.constexpr,
            NC: tl.constexpr, CONST_N: tl.constexpr, SHIFT_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if CONST_N:
        n = NC
        st = NC
    else:
        n = N
        st = stride
    x_row = x_ptr + row * st
    if SHIFT_BLOCK:
        first = tl.load(x_row + tl.arange(0, BLOCK)).to(tl.float32)
        shift = tl.sum(first, axis=0) / BLOCK
    else:
        shift = tl.load(x_row).to(tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    acc2 = tl.zeros([BLOCK], tl.float32)
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        d = tl.where(m, x - shift, 0.0)
        acc += d
        acc2 += d * d
    s = tl.sum(acc, axis=0)
    s2 = tl.sum(acc2, axis=0)
    md = s / n
    rstd = tl.rsqrt(tl.maximum(s2 / n - md * md, 0.0) + eps)
    mean = shift + md
    y_row = y_ptr + row * st
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        m = cols < n
        x = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        w = tl.load(w_ptr + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        b = tl.load(b_ptr + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        tl.store(y_row + cols, ((x - mean) * rstd * w + b).to(y_ptr.dtype.element_ty), mask=m)


