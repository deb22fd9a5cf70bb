"""Test matrices with a controlled spectrum: A = Q T Q^T, T block upper-triangular."""

import math

import torch


def make_matrix(n, top, *, bulk_radius=0.5, nonnormal=0.0, seed=0):
    """Real n x n matrix whose eigenvalues are `top` (complex values with imag != 0 are
    taken with their conjugates) plus a bulk of conjugate pairs/reals in a disk."""
    g = torch.Generator().manual_seed(seed)
    vals = []
    for z in top:
        z = complex(z)
        vals += [z, z.conjugate()] if z.imag != 0 else [z]
    while len(vals) < n:
        r = bulk_radius * math.sqrt(torch.rand(1, generator=g).item())
        phi = 2 * math.pi * torch.rand(1, generator=g).item()
        z = complex(r * math.cos(phi), r * math.sin(phi))
        vals += [z, z.conjugate()] if len(vals) + 2 <= n else [complex(z.real, 0)]
    vals = vals[:n]
    T = torch.zeros(n, n, dtype=torch.float64)
    i = 0
    while i < n:
        z = vals[i]
        if z.imag != 0:
            T[i, i] = T[i + 1, i + 1] = z.real
            T[i, i + 1], T[i + 1, i] = abs(z.imag), -abs(z.imag)
            i += 2
        else:
            T[i, i] = z.real
            i += 1
    if nonnormal:
        T = T + nonnormal * torch.triu(torch.randn(n, n, generator=g, dtype=torch.float64),
                                       diagonal=2) / math.sqrt(n)
    Q = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q
    return Q @ T @ Q.T, torch.tensor(vals, dtype=torch.complex128)


def top_by_modulus(vals, k):
    return vals[torch.argsort(-vals.abs(), stable=True)][:k]


def set_distance(a, b):
    """Two-sided max relative distance between value sets a and b (conjugation-invariant)."""
    a, b = torch.as_tensor(a).flatten(), torch.as_tensor(b).flatten()
    d = (a[:, None] - b[None, :]).abs()
    return max((d.min(1).values / a.abs()).max().item(), (d.min(0).values / b.abs()).max().item())
