"""Database servers that the tests and the benchmarks start for themselves:
a private MariaDB server (:mod:`servers.private_mariadb`) and a 3-node Galera
cluster on loopback (:mod:`servers.galera_cluster`). Not part of the pathlock
package: they run from a checkout of the repository."""
