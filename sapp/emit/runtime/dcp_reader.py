"""Reading a DCP checkpoint without running code from it.

torch.distributed.checkpoint's FileSystemReader unpickles `.metadata` with plain `pickle.load`, so a
checkpoint from someone else could run any code on --resume (a REDUCE of os.system), and a metadata
entry of DCP's "bytes" kind is read back with `torch.load(weights_only=False)`.  SafeReader reads the
same file with an unpickler that builds only DCP's metadata classes, torch.Size, dtypes and plain
containers, admits only tensor entries (sapp writes nothing else; tensors are read by torch with
weights_only=True), and only storage files that are plain names inside the checkpoint directory."""
from __future__ import annotations

import io
import os
import pickle

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_md

from .train_state import CheckpointError

_MD = "torch.distributed.checkpoint.metadata"
# what torch 2.x writes into .metadata (read off real checkpoints of plain, FSDP2 and TP states)
ALLOWED = {(_MD, n) for n in ("Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                              "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"),          # torch.strided etc. from their names
    ("pathlib", "PosixPath"), ("pathlib._local", "PosixPath"),        # StorageMeta.checkpoint_id
    ("collections", "OrderedDict")}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("a persistent id")


def load_metadata(raw: bytes, where: str) -> dcp_md.Metadata:
    """DCP Metadata from the bytes of a .metadata file, or a CheckpointError naming what was refused."""
    try:
        md = _Unpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{where} asks to build {str(e)[:100]}, which a checkpoint's metadata never holds; "
                              "refusing it (the file was not written by torch.distributed.checkpoint or was "
                              "altered)") from None
    except Exception as e:          # noqa: BLE001 - truncated or garbled bytes
        raise CheckpointError(f"{where} is not readable DCP metadata ({type(e).__name__})") from None
    _check(md, where)
    return md


def _check(md, where: str) -> None:
    if not isinstance(md, dcp_md.Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise CheckpointError(f"{where} holds a {type(md).__name__}, not DCP metadata")
    for k, v in md.state_dict_metadata.items():
        if not isinstance(k, str) or not isinstance(v, dcp_md.TensorStorageMetadata):
            raise CheckpointError(f"{where}: entry {str(k)[:80]!r} is a {type(v).__name__}, not a tensor; sapp "
                                  "checkpoints hold tensors only")
        for c in v.chunks if isinstance(v.chunks, list) else [None]:
            dims = (getattr(c, "offsets", None), getattr(c, "sizes", None))
            if not all(isinstance(d, (tuple, list)) and all(_count(x) for x in d) for d in dims):
                raise CheckpointError(f"{where}: entry {k[:80]!r} has a chunk without non-negative integer offsets and "
                                      "sizes; the file was altered")
    storage = md.storage_data if md.storage_data is not None else {}
    if not isinstance(storage, dict):
        raise CheckpointError(f"{where}: its storage table is a {type(storage).__name__}, not DCP's; the file was altered")
    for idx, info in storage.items():
        rel = getattr(info, "relative_path", None)
        if (not isinstance(rel, str) or not rel or os.path.basename(rel) != rel or rel in (".", "..")
                or getattr(info, "transform_descriptors", None)):
            raise CheckpointError(f"{where}: storage of {getattr(idx, 'fqn', idx)!s:.80} points at {str(rel)[:80]!r}, "
                                  "not a plain file of the checkpoint")
        if not (_count(getattr(info, "offset", None)) and _count(getattr(info, "length", None))):
            raise CheckpointError(f"{where}: storage of {getattr(idx, 'fqn', idx)!s:.80} has no non-negative integer "
                                  "offset and length; the file was altered")


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read(path: str) -> dcp_md.Metadata:
    """The checkpoint directory's metadata, read safely."""
    where = os.path.join(path, ".metadata")
    try:
        with open(where, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(f"cannot read {where} ({e.strerror or type(e).__name__})") from None
    return load_metadata(raw, where)


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata comes from `read` (dcp.load(..., storage_reader=SafeReader(p)))."""

    def read_metadata(self, *args, **kwargs):
        md = read(str(self.path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = dcp_md.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md
