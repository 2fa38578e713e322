"""Distributed training state saved on one layout and resumed on another ("resume"; never confused with
activation checkpointing, ``reference.checkpoint``).

``store``: every rank writes its shards (raw bytes, C order) into one file of a staging folder, rank 0
merges their indexes into ``metadata.json`` (each tensor's global shape, dtype, and every shard's
offsets, owner, file, byte offset and block checksums) and publishes the folder with one rename, then
replaces the ``latest`` pointer atomically. ``read_box`` reads any box of any tensor — only the byte
ranges it needs, checksummed — so a rank of another layout takes exactly its own shard.
"""

from reference.resume.store import ResumeError, Shard, finalize, latest, publish, read_box, read_metadata, write_rank

__all__ = ["ResumeError", "Shard", "finalize", "latest", "publish", "read_box", "read_metadata", "write_rank"]
