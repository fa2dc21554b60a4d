"""The device classes' protocol and server rates (fednet/opcount.py's operations, a second):
the clients' edge class (beside network/latency.EDGE_FLOPS) and the server classes of
--server-profile. Counting and converting are fednet/opcount.py's.

These presets are estimates (sources beside each rate). A host's own rates are measured, not
estimated: `fednet calibrate` times each primitive fednet runs (fednet/secagg/rates.py) and
writes the client rates into the --latency profile it writes, and with --server-out every rate
into a server profile for --server-profile FILE. On this project's 2-core machine (one core,
shared; the figures vary by up to 2x between runs): X25519 1.7e4-3.3e4/s, HKDF 1.7e5-3.2e5/s,
sealed shares 3.6e5-5.2e5/s, AES-CTR 0.6e9-6e9 bytes/s and 1.2e5 keystream setups/s, Shamir
1.1e8-1.8e8 multiply-adds/s, unmask replies 3.5e4/s (each taken with the caches cold, as a
round takes it; 1.2e5/s back to back) and the shares in them 2e6-3.5e6/s, secrets rebuilt
2e5-2.8e5/s, the shares read into them 1.7e6-2.1e6/s and those looked through beyond them
2e7/s, the Lagrange weights' element operations
6.8e8/s, normal draws 5e7-1e8/s, streamed sums 1e9-2e9 element ops/s, stable argsort 2.6e8-2.7e8
compare-moves/s, float64 x @ x.T 6e10-2e11 counted FLOP/s on one BLAS thread, codec passes
2e9-3.7e9/s and SecAgg's field passes (quantize and pack on 12.6 M values) 2.5e9/s: the
xeon-core class's order."""
from __future__ import annotations

from fednet.opcount import CLIENT_RATES, OPS, RATES, Ops, add, seconds

__all__ = ["CLIENT_RATES", "DEFAULT_SERVER", "EDGE", "OPS", "Ops", "RATES", "SERVERS", "add",
           "seconds"]

# ---- device classes -----------------------------------------------------------------------------
EDGE: dict[str, float] = {
    # A Raspberry Pi 4 class device (Cortex-A72, 1.5 GHz, no ARMv8 crypto extensions), one core.
    "prg_per_s": 65e6,      # cryptsetup benchmark on a Pi 4: aes-cbc 256b 62.2 MiB/s
                            # (blog.stackframe.dev/46); CTR runs the same rounds
    "aead_per_s": 40e3,     # a 116-byte AES-GCM seal: the AES bytes above plus software GHASH
                            # and the call (~25 us; estimate)
    "x25519_per_s": 7e3,    # ~200k cycles a scalar multiplication in portable C (estimate)
    "kdf_per_s": 5e4,       # HKDF-SHA256: ~8 SHA-256 compressions and the call (estimate)
    "shamir_per_s": 1e8,    # numpy int64 multiply-add-mod (estimate)
    "noise_per_s": 3e7,     # numpy normal draws (estimate: ~1/3 of an x86 core's)
    "code_per_s": 4e8,      # a codec's numpy passes over float32 (a Pi 4's ~4 GB/s of memory
                            # bandwidth, a read and a write of 4 bytes each; estimate)
    "select_per_s": 6e7,    # elements of a top-k selection (argpartition; estimate: ~1/5 of an
                            # x86 core's, as its scalar integer throughput)
    "field_per_s": 3e8,     # SecAgg's field passes (secagg/field.quantize's float64 and pack's
                            # bit unpacking; estimate: the code rate above times this host's
                            # field/code ratio, 2.5e9 / 3.5e9 measured in one process)
}
"""The presets' typical client's protocol rates (beside network/latency.EDGE_FLOPS); a client
of a preset that is k times slower at training is k times slower at these too. A host's are
measured with `fednet calibrate` (which writes them into its profile)."""

SERVERS: dict[str, dict[str, float]] = {
    "xeon-core": {
        # One core of a current x86 server (AVX-512, AES-NI; e.g. a Xeon of 2.9 GHz): peak
        # float64 FMA 2 x 8 x 2 x 2.9 GHz = 93 GFLOP/s, ~65 % in a one-thread BLAS product;
        # ~1 G streamed element operations a second (one core's ~10 GB/s of memory traffic);
        # the primitives at the rates of the `cryptography` wheels' OpenSSL with AES-NI and
        # their Python call (estimates of the same kind as `fednet calibrate` measures). The
        # unmasking's share handling (reply, taken, rebuilt, held) is Python and numpy calls on
        # a few values each, bound by the interpreter (a reply taken cold), and its weights
        # int64 multiply-mods: this host's order (estimates); a stable argsort ~3.5 ns a
        # compare-move (estimate).
        "gemm_per_s": 60e9, "stream_per_s": 1e9, "prg_per_s": 2e9, "aead_per_s": 3e5,
        "x25519_per_s": 2.5e4, "kdf_per_s": 2e5, "shamir_per_s": 5e8, "mask_per_s": 1.2e5,
        "reply_per_s": 4e4, "taken_per_s": 3e6, "secret_per_s": 2.5e5, "rebuilt_per_s": 2e6,
        "held_per_s": 2e7, "lagrange_per_s": 6e8,
        "noise_per_s": 1e8, "sort_per_s": 3e8, "code_per_s": 2.5e9, "select_per_s": 4e8,
        "field_per_s": 2e9,  # (its unpack of a codec grid's inputs, secagg/cost.summed; this
        # host's 2.5e9 field passes/s, the order of the code rate's estimate above)
    },
    "none": {},  # the server computes for free (the clock before issue 52)
}
"""Server classes for --server-profile (or a JSON file of {op}_per_s rates: `fednet calibrate
--server-out FILE` measures this host's)."""

DEFAULT_SERVER = "xeon-core"
