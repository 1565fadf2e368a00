"""The SQL statements of pathlock, built once with SQLAlchemy Core.

Pure construction, no execution: the modules that run transactions (the
grant, the release, the queue, renewal, the reaper) run these. Statements
whose shape depends on a request (how many exclusive and shared paths) are
cached per shape; everything that varies is a bind parameter, so SQLAlchemy
compiles each shape once.

Every time is the database's clock (``UTC_TIMESTAMP(6)`` on MySQL,
independent of the session time zone). What differs between databases is
spelled by constructs of :mod:`pathlock.dialects`, compiled once per
dialect, so each statement is written once.

- :mod:`~pathlock._statements.common`: the pieces every statement is built from;
- :mod:`~pathlock._statements.conflicts`: a request's searches for conflicting locks and requests;
- :mod:`~pathlock._statements.grants`: a grant's rows and the customer's row written with them;
- :mod:`~pathlock._statements.lean`: the grant without searches, and the release without
  a read of the queue;
- :mod:`~pathlock._statements.leases`: a lease's own rows taken up, released, renewed;
- :mod:`~pathlock._statements.queue`: the queue of waiting requests, and what a waiter watches;
- :mod:`~pathlock._statements.lookups`: what callers and operators look up;
- :mod:`~pathlock._statements.upkeep`: a node's release, the reaper, the recount.
"""
