"""The server's registered clients (server/book.ClientBook): a process's clients are one
record, a lone client its own ClientInfo; reads are a Mapping's, equal to the per-client dict
it replaced, and each client's record is built only when read."""
from __future__ import annotations

import numpy as np

from fednet.server.book import ClientBook
from fednet.types import ClientInfo


def test_the_book_reads_as_the_dict_of_records_it_replaced():
    built: list[int] = []

    def size(c):
        built.append(c)
        return 100 + c

    book = ClientBook(20, size)
    book.add_process(np.array([4, 5, 6, 7], np.int64), "cpu", 11, "h1")
    book[2] = ClientInfo(2, 102, "cuda:0", "tcp://x:1", 12, "h2")
    book.add_process(np.array([9, 10], np.int64), "cuda:1", 13, "h3")
    assert built == []  # nothing built yet
    plain = {c: ClientInfo(c, 100 + c, "cpu", "", 11, "h1") for c in (4, 5, 6, 7)}
    plain[2] = ClientInfo(2, 102, "cuda:0", "tcp://x:1", 12, "h2")
    plain.update({c: ClientInfo(c, 100 + c, "cuda:1", "", 13, "h3") for c in (9, 10)})
    assert len(book) == 7 and sorted(book) == sorted(plain) and dict(book) == plain
    assert 5 in book and 3 not in book and 25 not in book and -1 not in book and "a" not in book
    assert book.get(3) is None and book[10] == plain[10]
    assert book.process_of(5) == ("h1", 11) and book.process_of(2) == ("h2", 12)
    assert book.process_of(3) is None
    assert book.roster().devices() == {"cpu": 4, "cuda:0": 1, "cuda:1": 2}
    assert list(book.roster(np.array([2, 9], np.int64))) == [plain[2], plain[9]]


def test_a_lone_registration_and_a_process_replace_each_other():
    book = ClientBook(10, lambda c: 1)
    book.add_process(np.arange(5, dtype=np.int64), "cpu", 1, "h")
    book[3] = ClientInfo(3, 1, "cpu", "tcp://peer", 2, "h")  # client 3 came again, alone
    assert len(book) == 5 and book[3].endpoint == "tcp://peer" and book.process_of(3) == ("h", 2)
    book.add_process(np.array([3, 4, 8], np.int64), "cuda:0", 3, "g")  # a process took them
    assert len(book) == 6 and book[3].endpoint == "" and book[3].device == "cuda:0"
    assert book.ids().tolist() == [0, 1, 2, 3, 4, 8]
    assert book.roster().devices() == {"cpu": 3, "cuda:0": 3}


def test_a_process_whose_clients_registered_one_by_one_is_one_record():
    """A process whose batch was refused claims each id alone (client/enroll.py): each
    READY(readys) names one id, and the process keeps one record for them all."""
    book = ClientBook(1000, lambda c: 1)
    for cid in range(1000):
        book.add_process(np.array([cid], np.int64), "cpu", 77, "h")
    book.add_process(np.array([5], np.int64), "cpu", 78, "h")  # another process took id 5
    assert len(book) == 1000 and len(book.procs) == 2
    assert book.process_of(4) == ("h", 77) and book.process_of(5) == ("h", 78)
    assert book.roster().devices() == {"cpu": 1000}
