"""server/tasks.TaskBook without a socket: tasks out, queued, handed on, answered, failed."""
from __future__ import annotations

from fednet.server.tasks import TaskBook
from fednet.types import Failure, Task


def _book(max_inflight=0, sent=None, fail_send=()):
    sent = [] if sent is None else sent

    def send(task):
        sent.append(task.task_id)
        if task.task_id in fail_send:
            book.fail(task.task_id, "client unreachable")
    book = TaskBook(max_inflight, 0, lambda c: c, send)
    return book, sent


def test_tasks_go_out_under_the_window_and_follow_ups_join_the_queue():
    sent = []
    book, _ = _book(max_inflight=2, sent=sent)
    follow = []

    def on_reply(done):
        follow.append(done.task_id)
        return [Task(done.task_id + 100, 0, [9])] if done.task_id < 100 else []
    book.start([Task(1, 0, [0]), Task(2, 0, [1]), Task(3, 0, [2])], on_reply)
    book.fill()
    assert sent == [1, 2] and list(book.pending) == [1, 2] and len(book.queue) == 1
    book.answered(1)
    book.fail(2, "boom")  # its follow-up (102) is queued behind task 3 and sent
    assert sent == [1, 2, 3, 102] and follow == [2]
    results, failures = book.end()
    assert results == [] and [f.task_id for f in failures] == [2]
    assert book.on_reply is None and not book.queue


def test_a_hand_off_moves_the_holder_and_holders_fail_their_tasks():
    book, _ = _book()
    book.start([Task(1, 0, [4, 5, 6]), Task(2, 0, [5])], None)
    book.fill()
    assert book.holding(book.pending[1]) == 4
    book.handed(1, 2)  # the model went on to client 6
    book.fail_holders(lambda c: c == 6, lambda c: f"client {c} died")
    assert list(book.pending) == [2]
    assert [(f.task_id, f.reason) for f in book.replies] == [(1, "client 6 died")]


def test_a_time_out_fails_what_is_out_and_what_never_left():
    book, sent = _book(max_inflight=1)
    book.start([Task(1, 0, [0]), Task(2, 0, [1])], lambda done: [Task(9, 0, [0])])
    book.fill()
    book.time_out("no progress")
    _, failures = book.end()
    assert sent == [1] and sorted(f.task_id for f in failures) == [1, 2]
    assert all(isinstance(f, Failure) for f in failures)
    assert any("never sent" in f.reason for f in failures) and not book.pending


def test_failed_sends_do_not_recurse():
    book, sent = _book(fail_send=set(range(1, 3001)))
    book.start([Task(i, 0, [0]) for i in range(1, 3001)], lambda done: [])
    book.fill()
    _, failures = book.end()
    assert len(failures) == 3000 == len(sent) and not book.pending


def test_a_stage_time_out_fails_the_silent_and_sends_the_next_stage():
    """A staged round (secure aggregation): the stage's silent tasks fail as dropouts and the
    follow-ups their failures release go out; the book still accepts, and its deadline restarts."""
    book, sent = _book()
    nxt = {2: [Task(10, 0, [0]), Task(11, 0, [1])]}  # the next stage, once task 2 is done

    def on_reply(done):
        return nxt.pop(done.task_id, [])
    book.start([Task(1, 0, [0]), Task(2, 0, [1])], on_reply)
    book.fill()
    book.answered(1)
    book.reply(_result(1))
    before = book.progress
    book.stage_time_out("no progress within --round-timeout 3s (a stage's deadline)")
    assert sent == [1, 2, 10, 11] and list(book.pending) == [10, 11]
    assert book.accepting and book.progress >= before
    _, failures = book.end()
    assert [(f.task_id, f.cid) for f in failures] == [(2, 1)]
    assert "a stage's deadline" in failures[0].reason


def _result(tid):
    from fednet.types import Result
    return Result(tid, 0, 0, {}, {}, 1)
