"""pathlock on a 3-node MariaDB Galera cluster: what customer affinity changes.

    .venv/bin/python -m pathlock.bench.cluster [--seconds S] [--quick]
                                               [--output PATH | --no-report]

Run from the root of a checkout of the repository: it starts a private 3-node
cluster on 127.0.0.1 with ``servers/galera_cluster.py`` (root only, about
10 s), which is not part of the installed package. It migrates pathlock's
schema through node 1, runs the experiments below side by side, prints the
figures as it goes, writes a markdown report (default
``docs/BENCHMARKS-CLUSTER.md``, from the current directory) and stops the
cluster. Importing this package needs no checkout; only a run does.

1. Hot path: six clients lock one path of one customer over and over, without
   and with affinity.
2. Many customers: six clients lock 1-2 random paths of random customers out of
   60, without affinity, with affinity, and "single writer" (every client lists
   the nodes in the same order, so all traffic goes through node 1).
3. Uncontended latency: one client, acquire + release of a fresh path, through
   a Galera node against the plain shared MariaDB server on port 3306, and
   through a Galera node with causal reads on (pathlock's default) and off.

Clients are spawned processes (six; client ``i`` lists the nodes starting from
node ``i % 3``: two clients per node, as app servers list their nearest node
first), started once. Each variant runs in rounds that alternate with the other
variants of its experiment; every round starts at a barrier, each client builds
its own ``PathLockManager`` for it and sends its figures back through a queue.
A benchmark, not a test: nothing here asserts a time.

The modules, in the order a run uses them:

- ``__main__``: the command line; the run from start to report.
- ``settings``: the fixed numbers (clients, rounds, hold, timeouts, customers).
- ``environment``: the machine and the servers: CPU use, versions, the plain
  server's database, each customer's home node.
- ``experiments``: the cluster (``servers.galera_cluster``, imported only
  when a run starts it), the client team, the rounds of each variant.
- ``clients``: what runs in a client process: the loops that lock and time.
- ``figures``: the figures summed up per variant (percentiles and means come
  from :mod:`pathlock.bench.stats`).
- ``report``: the markdown report.
"""
