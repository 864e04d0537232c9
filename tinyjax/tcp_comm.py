"""The processes of `tinyjax.distributed.initialize(coordinator_address, num_processes, process_id)` (JAX's way to
start several processes by hand, without an MPI launcher), joined over TCP: `TcpComm` is the part of an MPI
communicator that tinyjax.distributed uses, so the rest of it runs unchanged over either.

Process 0 listens at the coordinator address; every process opens a listener of its own and tells the coordinator
where; then each pair of processes holds one connection (the standard library's multiprocessing.connection: framed,
authenticated messages), the higher rank dialing the lower. A thread per connection receives every message into a
mailbox keyed by (communicator, kind, tag), so a send never waits for its receiver to be ready and the processes may
run their collectives' steps in different orders (tinyjax.distributed.ProcessGroup tags them). A peer whose
connection closes (it exited or aborted) fails every wait on it at once, with a message, instead of a hang.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import socket
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy as np

COMM_TYPE_SHARED = "shared"  # Split_type's kind: the processes of one machine (MPI.COMM_TYPE_SHARED's role)
CONNECT_TIMEOUT_S = float(os.environ.get("TINYJAX_CONNECT_TIMEOUT_S", "120"))


def _authkey(address: str) -> bytes:
  """The key every process of one job authenticates its connections with: TINYJAX_DISTRIBUTED_KEY when set (a
  secret shared by the job's processes: set it on a network others can reach, since messages are pickles), else one
  derived from the coordinator address (which keeps other jobs' processes out, not an attacker)."""
  secret = os.environ.get("TINYJAX_DISTRIBUTED_KEY") or f"tinyjax:{address}"
  return hashlib.sha256(secret.encode()).digest()


def _dial(address: tuple[str, int], authkey: bytes, what: str) -> Connection:
  """A connection to `address`, retrying while its listener is not up yet (CONNECT_TIMEOUT_S at most)."""
  start = time.perf_counter()
  while True:
    try: return Client(address, authkey=authkey)
    except (ConnectionRefusedError, FileNotFoundError, OSError):
      if time.perf_counter() - start > CONNECT_TIMEOUT_S:
        raise TimeoutError(f"tinyjax.distributed: could not reach {what} at {address[0]}:{address[1]} within "
                           f"{CONNECT_TIMEOUT_S:.0f} s (TINYJAX_CONNECT_TIMEOUT_S): is process 0 running, and the "
                           "address right?") from None
      time.sleep(0.05)


class _Request:
  """A non-blocking operation: `Test()` says whether it finished (and finishes a receive when its message is in);
  `idle(seconds)` waits that long at most for a message to come in (a waiter that spun instead would hold the GIL
  from the receiving threads: 44 ms per data-parallel step, 6 ms per message)."""

  def __init__(self, test: Any = None, links: Any = None):
    self._test, self._links = test, links

  def Test(self) -> bool:  # noqa: N802  (mpi4py's name)
    return True if self._test is None else self._test()

  def idle(self, seconds: float) -> None:
    if self._links is not None:
      with self._links.changed: self._links.changed.wait(seconds)


class _Links:
  """The connections of this process to every other one, their receiving threads and the mailbox they fill."""

  def __init__(self, rank: int, connections: dict[int, Connection]):
    self.rank, self.connections = rank, connections
    self.mailbox: dict[tuple, list] = {}
    self.dead: dict[int, str] = {}
    self.changed = threading.Condition()
    self.send_locks = {peer: threading.Lock() for peer in connections}
    for peer, connection in connections.items():
      with socket.socket(fileno=os.dup(connection.fileno())) as view:  # small messages go out at once (no Nagle)
        view.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
      threading.Thread(target=self._receive, args=(peer, connection), daemon=True,
                       name=f"tinyjax-tcp-{peer}").start()

  def _receive(self, peer: int, connection: Connection) -> None:
    while True:
      try: key, payload = pickle.loads(connection.recv_bytes())
      except (EOFError, OSError):
        with self.changed:
          self.dead[peer] = "its connection closed (the process exited or aborted)"
          self.changed.notify_all()
        return
      if key == ("abort",):  # a peer aborted the job (an error, or a wait that timed out): so does this process
        import sys
        print(f"tinyjax.distributed: process {peer} aborted the job", file=sys.stderr, flush=True)
        os._exit(int(payload or b"1"))
      with self.changed:
        self.mailbox.setdefault((peer, *key), []).append(payload)
        self.changed.notify_all()

  def send(self, peer: int, key: tuple, payload: bytes) -> None:
    if peer in self.dead: raise RuntimeError(f"tinyjax.distributed: process {peer} is gone: {self.dead[peer]}")
    with self.send_locks[peer]:  # (one frame per message: two small writes wait on TCP's delayed ACK, ~40 ms)
      self.connections[peer].send_bytes(pickle.dumps((key, payload), protocol=pickle.HIGHEST_PROTOCOL))

  def take(self, peer: int, key: tuple) -> bytes | None:
    """The first message from `peer` under `key`, if it came; RuntimeError if the peer is gone and it did not."""
    with self.changed:
      queue = self.mailbox.get((peer, *key))
      if queue:
        payload = queue.pop(0)
        if not queue: del self.mailbox[(peer, *key)]
        return payload
      if peer in self.dead: raise RuntimeError(f"tinyjax.distributed: process {peer} is gone: {self.dead[peer]}")
      return None

  def wait(self, peer: int, key: tuple) -> bytes:
    while (payload := self.take(peer, key)) is None:
      with self.changed: self.changed.wait(0.05)
    return payload


class TcpComm:
  """An MPI-communicator-like group of processes over `_Links`: `ranks` are the world ranks of its members in its
  own rank order. Collectives (allgather, barriers, Split) number their messages in call order, the same in every
  member, as MPI's must be called."""

  def __init__(self, links: _Links, ranks: list[int], name: tuple = ()):
    self.links, self.ranks, self.name = links, ranks, name
    self.rank = ranks.index(links.rank)
    self.count = 0  # collectives called so far

  def Get_rank(self) -> int: return self.rank  # noqa: N802  (mpi4py's names, here and below)
  def Get_size(self) -> int: return len(self.ranks)  # noqa: N802

  def Isend(self, value: np.ndarray, dest: int, tag: int) -> _Request:  # noqa: N802
    self.links.send(self.ranks[dest], (self.name, "p2p", tag), np.ascontiguousarray(value).tobytes())
    return _Request()

  def Irecv(self, buffer: np.ndarray, source: int, tag: int) -> _Request:  # noqa: N802
    peer, key = self.ranks[source], (self.name, "p2p", tag)

    def test() -> bool:
      payload = self.links.take(peer, key)
      if payload is None: return False
      buffer[...] = np.frombuffer(payload, dtype=buffer.dtype).reshape(buffer.shape)
      return True
    return _Request(test, self.links)

  def _exchange(self, value: Any) -> _Request:
    """Start sending `value` to every other member under the next collective's number; the request's `result` is
    every member's value in rank order once all came."""
    self.count += 1
    key, payload = (self.name, "collective", self.count), pickle.dumps(value)
    for member, peer in enumerate(self.ranks):
      if member != self.rank: self.links.send(peer, key, payload)
    values: dict[int, Any] = {self.rank: value}

    def test() -> bool:
      for member, peer in enumerate(self.ranks):
        if member not in values and (got := self.links.take(peer, key)) is not None: values[member] = pickle.loads(got)
      return len(values) == len(self.ranks)
    request = _Request(test, self.links)
    request.values = values
    return request

  def allgather(self, value: Any) -> list:
    request = self._exchange(value)
    while not request.Test():
      with self.links.changed: self.links.changed.wait(0.05)
    return [request.values[member] for member in range(len(self.ranks))]

  def Ibarrier(self) -> _Request: return self._exchange(None)  # noqa: N802
  def Barrier(self) -> None: self.allgather(None)  # noqa: N802

  def Split(self, color: int, key: int) -> TcpComm:  # noqa: N802
    everyone = self.allgather((color, key))
    members = sorted((k, member) for member, (c, k) in enumerate(everyone) if c == color)
    return TcpComm(self.links, [self.ranks[member] for _, member in members], self.name + (("split", color),))

  def Split_type(self, kind: str) -> TcpComm:  # noqa: N802
    hosts = self.allgather(socket.gethostname())
    members = [member for member, host in enumerate(hosts) if host == hosts[self.rank]]
    return TcpComm(self.links, [self.ranks[member] for member in members], self.name + (("host", hosts[self.rank]),))

  def Abort(self, code: int = 1) -> None:  # noqa: N802
    """End the job: tell every other process to exit (with `code`), then exit at once, as MPI_Abort does."""
    for peer in list(self.links.connections):
      try: self.links.send(peer, ("abort",), str(code).encode())
      except (OSError, RuntimeError, ValueError): pass
    os._exit(code)


def connect(coordinator_address: str, num_processes: int, process_id: int) -> TcpComm:
  """The world communicator of the processes started with this coordinator address: process 0 gathers where every
  process listens and tells everyone; then the higher rank of each pair dials the lower."""
  host, _, port = coordinator_address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError(f"coordinator_address must be 'host:port', got {coordinator_address!r}")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id {process_id} must be in [0, num_processes={num_processes})")
  authkey = _authkey(coordinator_address)
  # where the others reach this process: on the coordinator's loopback address when it is one (one machine, nothing
  # listening beyond it), else on this host's name
  loopback = host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")
  own = Listener((host if process_id == 0 or loopback else "0.0.0.0", int(port) if process_id == 0 else 0),
                 authkey=authkey)
  me = (host if process_id == 0 or loopback else socket.gethostname(), own.address[1])
  if process_id == 0:
    table = {0: (host, int(port))}
    registrations = []
    for _ in range(num_processes - 1):
      connection = own.accept()
      rank, address = pickle.loads(connection.recv_bytes())
      if rank in table or not 0 < rank < num_processes:
        raise ValueError(f"tinyjax.distributed: two processes registered as process {rank}, or it is out of range")
      table[rank] = address
      registrations.append((rank, connection))
    for _, connection in registrations: connection.send_bytes(pickle.dumps(table))
    connections = dict(registrations)  # (each registration stays as the pair's connection)
  else:
    connection = _dial((host, int(port)), authkey, "the coordinator")
    connection.send_bytes(pickle.dumps((process_id, me)))
    table = pickle.loads(connection.recv_bytes())
    connections = {0: connection}
  for peer in range(1, process_id):  # dial the lower ranks (0 is connected already), then take the higher ones' calls
    connections[peer] = _dial(table[peer], authkey, f"process {peer}")
    connections[peer].send_bytes(pickle.dumps(process_id))
  for _ in range(num_processes - 1 - max(process_id, 0) if process_id else 0):
    connection = own.accept()
    connections[pickle.loads(connection.recv_bytes())] = connection
  return TcpComm(_Links(process_id, connections), list(range(num_processes)))
