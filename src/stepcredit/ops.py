"""Small tensor helpers shared by the maths: masked reductions, group statistics, shape checks.

All functions are pure; masks are bool with True meaning "counts".
"""

from __future__ import annotations

import functools

import torch


def check_shape(name: str, x: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    """Raise ValueError unless ``x`` has ``len(shape)`` dims matching every non-None entry."""
    if x.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape, strict=True)):
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(x.shape)}")


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x`` where ``mask`` is True."""
    z = torch.where(mask, x, 0.0)
    return z.sum() if dim is None else z.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (0 where nothing counts)."""
    n = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / n.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, *, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected by default, as torch.var)."""
    mean = masked_mean(x, mask)
    n = mask.sum().to(x.dtype)
    var = masked_sum((x - mean) ** 2, mask) / n.clamp(min=1)
    if unbiased:
        var = var * n / (n - 1).clamp(min=1)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries; masked-out entries become 0."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, 0.0)


def group_index(group_B: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to 0..K-1; returns (dense ids [B], K)."""
    uniq, inv = torch.unique(group_B, return_inverse=True)
    return inv, int(uniq.numel())


def group_stats(
    x_B: torch.Tensor, group_B: torch.Tensor, valid_B: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response (mean, unbiased std, count) of its group, over valid members only.

    Singleton groups get mean 0 and std 1 (the convention of verl's GRPO), so their advantage is x.
    """
    if valid_B is None:
        valid_B = torch.ones_like(x_B, dtype=torch.bool)
    gid, k = group_index(group_B)
    w = valid_B.to(x_B.dtype)
    xz = torch.where(valid_B, x_B, 0.0)
    cnt = torch.zeros(k, dtype=x_B.dtype, device=x_B.device).index_add_(0, gid, w)
    s = torch.zeros(k, dtype=x_B.dtype, device=x_B.device).index_add_(0, gid, xz)
    mean = s / cnt.clamp(min=1)
    dev = torch.where(valid_B, x_B - mean[gid], 0.0)
    ss = torch.zeros(k, dtype=x_B.dtype, device=x_B.device).index_add_(0, gid, dev * dev)
    std = torch.sqrt(ss / (cnt - 1).clamp(min=1))
    single = cnt <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gid], std[gid], cnt[gid]


def reverse_cumsum(x_BT: torch.Tensor) -> torch.Tensor:
    """out[:, t] = sum_{t' >= t} x[:, t']."""
    return torch.flip(torch.cumsum(torch.flip(x_BT, dims=[1]), dim=1), dims=[1])


def last_token_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Index of the last True of each row (0 for an empty row)."""
    T = mask_BT.shape[1]
    pos = torch.arange(T, device=mask_BT.device).expand_as(mask_BT)
    return torch.where(mask_BT, pos, torch.zeros_like(pos)).max(dim=1).values


@functools.lru_cache(maxsize=64)
def _scan_weights(
    discount: float, K: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_KK, head_K) of :func:`discounted_reverse_cumsum`: W[j, i] = c^(j - i) for j >= i (else 0) and
    head[j] = c^j (W's first column), each power computed directly in float64 (read-only, shared)."""
    with torch.inference_mode(False):  # cached: never an inference tensor a later autograd call can't use
        k = torch.arange(K, device=device, dtype=torch.float64)
        lag_KK = k[:, None] - k[None, :]  # j - i
        pw_KK = torch.pow(torch.tensor(discount, dtype=torch.float64, device=device), lag_KK.clamp(min=0))
        W_KK = torch.where(lag_KK >= 0, pw_KK, 0.0).to(dtype)
        return W_KK, W_KK[:, 0].contiguous()


def discounted_reverse_cumsum(
    x_BT: torch.Tensor, *, discount: float, block: int = 16, overwrite: bool = False
) -> torch.Tensor:
    """out[:, t] = sum_{k >= 0} discount^k x[:, t + k], without a loop over time.

    Blocked matrix form of the linear recurrence y_t = x_t + c y_{t+1} (c = ``discount``):
    within a block of K tokens y = x W with W[j, i] = c^(j - i) for j >= i. Block starts
    s_n = (x W)[n, 0] + c^K s_(n+1) obey the same recurrence with discount c^K, solved by recursion on
    the (T / K)-long sequence of (x W)[:, 0] = x head (head_j = c^j, a matrix-vector product). The
    carry c^(K - i) s_(n+1) that token i of block n receives from the next block is folded into the
    input before the one full product: adding c s_(n+1) to the block's last input x[n, K-1] adds
    c^(K-1-i) c s_(n+1) to every y[n, i]. Every weight is a power c^k <= 1 computed directly (no c^-t
    rescaling), so nothing overflows and underflow only drops negligible terms: stable for any T with
    0 <= c <= 1. ``overwrite=True`` lets the function use ``x_BT`` as its scratch (a caller's fresh
    temporary: one full-size copy fewer).
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    B, T = x_BT.shape
    if T == 0 or discount == 0.0:
        return x_BT if overwrite else x_BT.clone()
    if discount == 1.0:
        return reverse_cumsum(x_BT)
    K = min(block, T)
    N = -(-T // K)
    pad = N * K - T
    if pad:
        x = torch.nn.functional.pad(x_BT, (0, pad))  # a new tensor: ours to write
    else:
        x = x_BT if overwrite and x_BT.is_contiguous() else x_BT.clone(memory_format=torch.contiguous_format)
    x_BNK = x.view(B, N, K)
    W_KK, head_K = _scan_weights(float(discount), K, x_BT.dtype, x_BT.device)
    if N > 1:
        y0_BN = torch.matmul(x_BNK, head_K)
        start_BN = discounted_reverse_cumsum(y0_BN, discount=discount**K, block=block, overwrite=True)
        x_BNK[:, :-1, K - 1].add_(start_BN[:, 1:], alpha=discount)
    y_BNK = torch.matmul(x_BNK, W_KK)
    return y_BNK.view(B, N * K)[:, :T] if pad else y_BNK.view(B, T)


def group_token_stats(
    x_BT: torch.Tensor, mask_BT: torch.Tensor, group_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response (mean, unbiased std, count) of the entries of ``x_BT`` where ``mask_BT`` holds,
    pooled over every response of its group (e.g. all step rewards of a group, DeepSeekMath 4.1.3).

    A group with at most one counted entry gets mean 0 and std 1 (the singleton convention of
    :func:`group_stats`).
    """
    gid, k = group_index(group_B)
    xz = torch.where(mask_BT, x_BT, 0.0)
    cnt = torch.zeros(k, dtype=x_BT.dtype, device=x_BT.device).index_add_(
        0, gid, mask_BT.sum(1).to(x_BT.dtype)
    )
    s = torch.zeros(k, dtype=x_BT.dtype, device=x_BT.device).index_add_(0, gid, xz.sum(1))
    mean = s / cnt.clamp(min=1)
    dev = torch.where(mask_BT, x_BT - mean[gid][:, None], 0.0)
    ss = torch.zeros(k, dtype=x_BT.dtype, device=x_BT.device).index_add_(0, gid, (dev * dev).sum(1))
    std = torch.sqrt(ss / (cnt - 1).clamp(min=1))
    single = cnt <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gid], std[gid], cnt[gid]


def is_right_padded(mask_BT: torch.Tensor) -> bool:
    """True when every row's True entries form a prefix (no masked token before a counted one)."""
    if mask_BT.shape[1] < 2:
        return True
    # compared as bytes: bool comparisons and reductions take a slower path on CPU (~2x here); the
    # "any" is a max over the comparison's bytes: torch's bool any() is not vectorised on CPU (2.0 ms
    # against 0.05 ms for the uint8 max at 1024 x 4096, one thread; issue 48's profile)
    u = mask_BT.view(torch.uint8) if mask_BT.dtype == torch.bool else mask_BT
    later_BT = u[:, 1:] > u[:, :-1]
    return later_BT.numel() == 0 or not bool(later_BT.view(torch.uint8).max())


def whiten_zeroed(x_BT: torch.Tensor, mask_BT: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """The result of :func:`masked_whiten` (``shift_mean=True``) as a new tensor, for an ``x_BT`` that
    is already 0 wherever ``mask_BT`` is False (``x_BT`` is not modified).

    Same statistics (mean and Bessel-corrected variance over the masked entries, ``eps`` inside the
    square root) in as few full-size passes as possible: on large batches memory traffic, not
    arithmetic, is the cost. The sum of squares is taken per row (``vector_norm``) and added up in
    float64. The masked write is a ``where`` with a Python scalar: on CPU a product with the bool mask
    or a 0-dim zero tensor takes a type-promotion / broadcasting path that is 2-4x slower.
    """
    n = torch.count_nonzero(mask_BT.view(torch.uint8) if mask_BT.dtype == torch.bool else mask_BT).clamp(
        min=1
    )
    mean = float(x_BT.sum() / n)
    # off the mask: mean - mean, exactly 0; on it: x - mean (one full-size pass fewer than x - mean first)
    out = torch.where(mask_BT, x_BT, mean).sub_(mean)
    if out.dim() == 1:
        ss = torch.linalg.vector_norm(out).double().square()
    else:
        ss = torch.linalg.vector_norm(out, dim=-1).double().square().sum()
    var = ss / (n - 1).clamp(min=1)
    return out.mul_(torch.rsqrt(var + eps).to(out.dtype))
