"""pathlock's decisions, without I/O: a lock request's steps (:mod:`.flow`),
the queue's rules (:mod:`.fairness`), the values they decide on
(:mod:`.records`), what a manager remembers of its customers to choose the
cheapest way of its next operation (:mod:`.hints`), the renewal schedule
(:mod:`.schedule`), and the checks and sizes of what callers give
(:mod:`.validation`, :mod:`.limits`).

Nothing here loads SQLAlchemy, the tables, the statements or the dialects
(``tests/unit/test_layers.py`` imports each module alone and fails if it
does): the synchronous API, the asyncio API's greenlets and the tests run the
same code, and the drivers around it do the talking to the database.
"""
