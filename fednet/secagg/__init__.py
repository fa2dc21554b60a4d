"""Secure aggregation (Bonawitz et al., CCS 2017; SecAgg+: Bell et al., CCS 2020), as real
messages through fednet's server: the primitives (shamir.py: secret sharing over a prime field;
crypto.py: X25519 key agreement, HKDF, AES-GCM and the AES-CTR mask generator, all from the
`cryptography` library), the neighbour graphs (graph.py), the field and quantization
(field.py), and the protocol's client and server halves (client.py, server.py). No socket, no
torch: the round driver carries the stages as tasks and results (algorithms/secagg.py)."""
