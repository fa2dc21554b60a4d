"""The in-process runtime (`fednet local`): the same executors, codec and ledger, no sockets."""
from __future__ import annotations

import torch

from fednet.client.executor import Executor
from fednet.config import RunConfig
from fednet.launch.gpus import check_gpus, device_for
from fednet.metrics.accounting import SERVER
from fednet.protocol import decode, encode
from fednet.server.rounds import accept_reply
from fednet.session import Session
from fednet.types import ClientInfo, Failure, Result, Task, client_name
from fednet.wire import record, task_message


def _wire(frames: list) -> list[bytes]:
    """What the network does to frames: a copy into the receiver's memory."""
    return [bytes(f) for f in frames]


class InprocDispatcher:
    """Delivers each task by encoding it, 'sending' the bytes and calling the client's executor."""

    def __init__(self, session: Session) -> None:
        self.s = session
        cfg = session.cfg
        self.executors = {cid: Executor(cid, cfg, session.profiles[cid], device_for(cid, cfg.gpus),
                                        session.run_id) for cid in range(cfg.clients)}

    def alive_clients(self) -> list[ClientInfo]:
        """Every client (none can die in-process)."""
        return [ClientInfo(cid, ex.num_examples, str(ex.device), "inproc", 0, "localhost")
                for cid, ex in self.executors.items()]

    def run_round(self, rnd: int, tasks: list[Task]) -> tuple[list[Result], list[Failure]]:
        """Run the tasks one after another in this process."""
        results: list[Result] = []
        failures: list[Failure] = []
        for task in tasks:
            cid = task.cid
            msg = task_message(task, self.s.run_id)
            frames = _wire(encode(msg))
            n = record(self.s.ledger, msg, frames, SERVER, client_name(cid))
            out = self.executors[cid].on_task(decode(frames), n)
            rframes = _wire(encode(out.reply))
            n2 = record(self.s.ledger, out.reply, rframes, client_name(cid), SERVER)
            got = accept_reply(decode(rframes), cid, n2, self.s.profiles)
            (failures if isinstance(got, Failure) else results).append(got)
        return results, failures


def run_local(cfg: RunConfig, quiet: bool = False, write: bool = True) -> dict:
    """Run a whole experiment in this process; returns the summary dict."""
    check_gpus(cfg.gpus)
    torch.set_num_threads(cfg.train.threads)
    session = Session(cfg, quiet=quiet, write=write)
    session.progress.message(session.describe())
    dispatcher = InprocDispatcher(session)
    try:
        session.driver.run(dispatcher)
    except KeyboardInterrupt:
        session.driver.status = "interrupted"
        raise
    finally:
        summary = session.finish(dispatcher.alive_clients(), {"runtime": "local"})
    return summary
