"""The job's key: who may talk to its Planner.

``msd launch`` creates ``JOB/job.key`` (mode 0600) holding two CURVE key pairs: the Planner's
(server) and the one every legitimate peer uses (client: roles, the launcher, ``msd status``
and the other commands). The Planner's socket is a CURVE server that admits only that client
key, so a peer without the file completes no handshake: it gets nothing and can send nothing.
The file is JSON of Z85 strings; reading it is what "holding the job's key" means.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import zmq

from msd.errors import LaunchError

KEY_FILE = "job.key"


@dataclass(frozen=True)
class JobKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def create_keys(path: Path) -> JobKeys:
    """New key pairs, written to ``path`` with mode 0600 before any byte of them is."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    keys = JobKeys(server_public, server_secret, client_public, client_secret)
    text = json.dumps({k: v.decode() for k, v in vars(keys).items()}, indent=2)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return keys


def load_keys(path: Path) -> JobKeys:
    """The job's keys; a clear error when the file is missing, unreadable or damaged."""
    try:
        data = json.loads(path.read_text())
        keys = JobKeys(**{k: str(data[k]).encode() for k in JobKeys.__dataclass_fields__})
    except FileNotFoundError:
        raise LaunchError(f"{path} does not exist: this job has no key") from None
    except PermissionError:
        owner_only = "only the job's owner may control it"
        raise LaunchError(f"{path} is not readable by this user: {owner_only}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise LaunchError(f"{path} is not a valid job key ({exc})") from None
    for name, value in vars(keys).items():
        if len(value) != 40:
            raise LaunchError(f"{path}: {name} is not a 40-character Z85 CURVE key")
    return keys
