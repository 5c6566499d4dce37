"""Reader for the IDX file format of (Fashion-)MNIST.

The IDX format (LeCun et al., MNIST; Xiao et al., 2017, Fashion-MNIST) is a big-endian header
``0x00 0x00 <dtype code> <ndim>``, then ``ndim`` big-endian ``uint32`` sizes, then the data.
The files may be gzip-compressed. Reading them ourselves keeps loading fast and never triggers
a torchvision download attempt.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np
import torch
from torch import Tensor

__all__ = ["read_idx"]

# IDX type code -> (big-endian numpy dtype, torch dtype of the returned tensor)
_IDX_TYPES: dict[int, tuple[str, torch.dtype]] = {
    0x08: (">u1", torch.uint8),
    0x09: (">i1", torch.int8),
    0x0B: (">i2", torch.int16),
    0x0C: (">i4", torch.int32),
    0x0D: (">f4", torch.float32),
    0x0E: (">f8", torch.float64),
}


def read_idx(path: str | os.PathLike[str]) -> Tensor:
    """Read one IDX file (optionally ``.gz``) into a tensor.

    Parameters
    ----------
    path : str or PathLike
        File in IDX format, e.g. ``train-images-idx3-ubyte.gz`` of Fashion-MNIST
        (Xiao et al., 2017; the in-distribution set of LAM, Sec. 4, Table 2).

    Returns
    -------
    Tensor
        Tensor of the file's shape; ``uint8`` for images and labels, otherwise the dtype the
        header names (int8, int16, int32, float32, float64) in native byte order.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the header is malformed or the payload size does not match the header (a truncated
        or corrupted file).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"IDX file not found: {path!r}")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:  # bad gzip stream
        raise ValueError(f"`path` {path!r} is not a readable IDX file: {exc}") from exc
    if len(raw) < 4:
        raise ValueError(f"`path` {path!r} is too short to be an IDX file ({len(raw)} bytes)")
    zero0, zero1, code, ndim = struct.unpack(">BBBB", raw[:4])
    if zero0 != 0 or zero1 != 0 or code not in _IDX_TYPES:
        raise ValueError(
            f"`path` {path!r} has no IDX header (magic bytes {raw[:4].hex()}; expected "
            f"00 00 <type in {sorted(_IDX_TYPES)}> <ndim>)"
        )
    header_end = 4 + 4 * ndim
    if len(raw) < header_end:
        raise ValueError(f"`path` {path!r}: header announces {ndim} dims but the file ends early")
    shape = struct.unpack(f">{ndim}I", raw[4:header_end])
    np_dtype, torch_dtype = _IDX_TYPES[code]
    count = int(np.prod(shape, dtype=np.int64)) if ndim else 1
    itemsize = np.dtype(np_dtype).itemsize
    expected = header_end + count * itemsize
    if len(raw) != expected:
        raise ValueError(
            f"`path` {path!r}: header announces shape {tuple(shape)} ({expected} bytes) "
            f"but the file holds {len(raw)} bytes (truncated or corrupted)"
        )
    arr = np.frombuffer(raw, dtype=np_dtype, count=count, offset=header_end)
    arr = arr.astype(arr.dtype.newbyteorder("="), copy=True).reshape(shape)
    return torch.from_numpy(arr).to(torch_dtype)
