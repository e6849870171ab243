"""Triton kernel of block-sparse tree attention (see nbs/api/3-forward/12_tree_attention.ipynb).

One program computes one `BLOCK_M`-row block of queries for one (batch, head) pair. It walks only the key blocks that
the host listed as non-empty for its query block (a compressed-sparse-row index: `block_ptr`, `block_idx`), applies the
element mask inside each block unless the host marked the block as full (`block_full`), and keeps a flash-attention
style online softmax in fp32. Query rows that see no key at all come out as zeros.

Without a CUDA device the kernel runs under Triton's interpreter, which `triton.jit` chooses when the environment
variable `TRITON_INTERPRET=1` is set at decoration time, i.e. when this module is imported. `dyspec_nb/__init__.py`, the
one place that sets it, does so (unless it is already set) when `torch.cuda.is_available()` is False, and this module
is `dyspec_nb.kernels.tree_attention`, so the package's `__init__` has always run first. triton.language must not have
been imported before (transformers imports it), or the interpreted kernel cannot call triton's own helpers.

Triton 3.9's interpreter multiplies the raw bit patterns of bfloat16 tiles in `tl.dot` (triton-lang/triton#11584, not
supported there), so under the interpreter bf16 tiles are converted to fp32 before each product (`DOT_F32`); compiled
kernels multiply bf16 and fp16 tiles directly on tensor cores.
"""
import os
import torch
import dyspec_nb              # its __init__ chooses TRITON_INTERPRET (the one place), before @triton.jit runs below
import triton
import triton.language as tl

INTERPRET = os.environ.get('TRITON_INTERPRET', '0') == '1'   # how the kernel below is decorated
if INTERPRET and type(tl.zeros).__name__ != 'InterpretedFunction':
    # triton.language decorates its own helpers (tl.zeros, tl.max, tl.sum) when it is first imported; if that happened
    # without TRITON_INTERPRET=1 (transformers imports triton), the interpreted kernel cannot call them.
    raise ImportError("TRITON_INTERPRET=1 was set after triton.language had been imported (transformers imports it); "
                      "set it before the first import of transformers or triton, e.g. import dyspec_nb.tree_attention first")
LOG2E = 1.4426950408889634


@triton.jit
def _tree_attn_fwd(Q, K, V, Mask, BlockPtr, BlockIdx, BlockFull, Out,
                   stride_qb, stride_qh, stride_qm, stride_qd,       # Q: [B, H, n, D]
                   stride_kb, stride_kh, stride_kn, stride_kd,       # K: [B, Hkv, N, D]
                   stride_vb, stride_vh, stride_vn, stride_vd,       # V: [B, Hkv, N, D]
                   stride_mm, stride_mn,                             # Mask: uint8 [n, N], 1 = attend
                   stride_ob, stride_oh, stride_om, stride_od,       # Out: [B, H, n, D]
                   H, N_Q, N_K, D, qk_scale,                         # qk_scale = scale * log2(e)
                   GROUP: tl.constexpr,                              # H // Hkv query heads per kv head
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   HEAD_DIM: tl.constexpr,                           # D rounded up to a power of two >= 16
                   INPUT_PRECISION: tl.constexpr,                    # "ieee" for fp32 inputs (no TF32 rounding), else None
                   DOT_F32: tl.constexpr):                           # multiply in fp32 (the interpreter with bf16 inputs)
    pid_m = tl.program_id(0)                                          # query block
    pid_bh = tl.program_id(1)                                         # batch * H + head
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUP                                                   # the kv head this query head reads

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                  # [BLOCK_M] query rows
    offs_d = tl.arange(0, HEAD_DIM)                                   # [HEAD_DIM]
    row_ok = offs_m < N_Q
    d_ok = offs_d < D

    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)     # [BLOCK_M, HEAD_DIM]
    if DOT_F32: q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)               # running row maximum (log2 units)
    l_i = tl.zeros([BLOCK_M], tl.float32)                             # running softmax denominator
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)                   # running numerator @ V

    start = tl.load(BlockPtr + pid_m)
    end = tl.load(BlockPtr + pid_m + 1)
    k_base = K + b * stride_kb + hk * stride_kh
    v_base = V + b * stride_vb + hk * stride_vh
    for t in range(start, end):                                       # only the non-empty key blocks
        kb = tl.load(BlockIdx + t)
        offs_n = kb * BLOCK_N + tl.arange(0, BLOCK_N)                 # [BLOCK_N] key columns
        col_ok = offs_n < N_K
        kT = tl.load(k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                     mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # [HEAD_DIM, BLOCK_N]
        if DOT_F32: kT = kT.to(tl.float32)
        s = tl.dot(q, kT, input_precision=INPUT_PRECISION) * qk_scale   # [BLOCK_M, BLOCK_N] fp32, log2 units
        full = tl.load(BlockFull + t)
        if full == 0:                                                  # a partial block: apply the element mask
            mk = tl.load(Mask + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn,
                         mask=row_ok[:, None] & col_ok[None, :], other=0)   # [BLOCK_M, BLOCK_N]
            s = tl.where(mk != 0, s, float('-inf'))
        m_new = tl.maximum(m_i, tl.max(s, 1))                          # [BLOCK_M]
        m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)          # a row with nothing seen yet: no NaN
        alpha = tl.math.exp2(m_i - m_safe)                             # rescales the old sums
        p = tl.math.exp2(s - m_safe[:, None])                          # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, HEAD_DIM]
        if DOT_F32: v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i > 0, l_i, 1.0)                               # rows that saw no key: 0 / 1 = 0
    out = acc / l_safe[:, None]
    tl.store(Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def launch(q, k, v, mask_u8, block_ptr, block_idx, block_full, scale, block_size, num_warps=4, num_stages=2):
    """Run the kernel; no checks (the notebook's `tree_attention` validates and builds the index).

    q: [B, H, n, D]; k, v: [B, Hkv, N, D]; mask_u8: uint8 [n, N]; block_ptr: int32 [ceil(n/b) + 1];
    block_idx: int32 [nnz]; block_full: uint8 [nnz]. Returns out: [B, H, n, D] in q's dtype."""
    B, H, n, D = q.shape
    N = k.shape[2]
    out = torch.empty((B, H, n, D), dtype=q.dtype, device=q.device)
    head_dim = max(16, triton.next_power_of_2(D))
    grid = (triton.cdiv(n, block_size), B * H)
    _tree_attn_fwd[grid](q, k, v, mask_u8, block_ptr, block_idx, block_full, out,
                         *q.stride(), *k.stride(), *v.stride(), *mask_u8.stride(), *out.stride(),
                         H, n, N, D, float(scale) * LOG2E,
                         GROUP=H // k.shape[1], BLOCK_M=block_size, BLOCK_N=block_size, HEAD_DIM=head_dim,
                         INPUT_PRECISION='ieee' if q.dtype == torch.float32 else None,   # None: the default for fp16/bf16
                         DOT_F32=INTERPRET and q.dtype == torch.bfloat16,   # triton-lang/triton#11584
                         num_warps=num_warps, num_stages=num_stages)
    return out
