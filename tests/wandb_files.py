"""Reads the metrics back out of a W&B offline run's `run-<id>.wandb` file (for the tests).

The file: a 7-byte header (":W&B", a magic number, a version), then 32 KiB blocks of
records, each `crc32 (4) | length (2, little-endian) | kind (1) | data`; kind 1 is a whole
record, 2/3/4 its first/middle/last piece; a block's tail shorter than a header is padding.
Each record's data is a `wandb_internal_pb2.Record` protobuf.
"""

import glob
import json
import os
import time

BLOCK = 32 * 1024
HEADER = 7


def records(path: str):
  """The file's `Record` protobufs, in order."""
  from wandb.proto import wandb_internal_pb2 as pb  # pylint: disable=import-outside-toplevel
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", data[:8]
  pos, parts = HEADER, b""
  while pos + HEADER <= len(data):
    left = BLOCK - pos % BLOCK
    if left < HEADER:
      pos += left
      continue
    n, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
    if pos + HEADER + n > len(data):  # a record still being written
      break
    parts += data[pos + HEADER:pos + HEADER + n]
    pos += HEADER + n
    if kind in (1, 4):
      record = pb.Record()
      record.ParseFromString(parts)
      parts = b""
      yield record


def offline_run(workdir: str, wait_s: float = 60.0) -> dict:
  """{"project", "name", "history": [row, ...]} of the one offline run under workdir/wandb.

  W&B's own process writes the file and may still be writing when `finish()` has returned
  (seen on a loaded machine): this waits up to `wait_s` for the run's closing `exit` record.
  """
  deadline = time.monotonic() + wait_s
  while True:
    paths = glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb"))
    done = len(paths) == 1 and any(r.WhichOneof("record_type") == "exit"
                                   for r in records(paths[0]))
    if done or time.monotonic() > deadline:
      break
    time.sleep(0.5)
  assert len(paths) == 1, paths
  out = {"project": None, "name": None, "history": []}
  for r in records(paths[0]):
    kind = r.WhichOneof("record_type")
    if kind == "run":
      out["project"], out["name"] = r.run.project, r.run.display_name
    elif kind == "history":
      out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in r.history.item})
  return out
