"""A small, independent safetensors reader for the oracle tests (json + numpy only), so the
C writer is checked against the format itself rather than against a library built from it."""
import json
import struct

import numpy as np

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32,
           "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    """Returns (tensors: dict name -> numpy array, metadata: dict). BF16 is widened to float32."""
    with open(path, "rb") as f:
        blob = f.read()
    assert len(blob) >= 8, f"{path}: shorter than the 8-byte header length"
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), f"{path}: header of {n} bytes runs past the end"
    assert (8 + n) % 8 == 0, f"{path}: header not padded to 8 bytes"
    text = blob[8:8 + n].decode("utf-8")
    assert text.startswith("{") and text.rstrip(" ") == text.rstrip(), f"{path}: padding is not spaces"
    header = json.loads(text)
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), f"{path}: non-string metadata"
    tensors, spans = {}, []
    for name, e in header.items():
        dt = _DTYPES[e["dtype"]]
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert end - begin == count * np.dtype(dt).itemsize, f"{path}: {name}: size mismatch"
        assert begin % np.dtype(dt).itemsize == 0, f"{path}: {name}: misaligned"
        arr = np.frombuffer(data[begin:end], dtype=dt).reshape(e["shape"])
        if e["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = arr.copy()
        spans.append((begin, end, name))
    pos = 0
    for begin, end, name in sorted(spans):
        assert begin == pos, f"{path}: {name} starts at {begin}, expected {pos} (gap or overlap)"
        pos = end
    assert pos == len(data), f"{path}: {len(data) - pos} bytes after the last tensor"
    return tensors, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array} in the order given (F32/F16/I32/I64/U8), header padded with
    spaces to 8 bytes, as an independent counterpart of the C writer."""
    names = {np.dtype(v).str[1:]: k for k, v in _DTYPES.items() if k != "BF16"}
    header, offset, chunks = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        raw = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype.str[1:]], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        chunks.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))
