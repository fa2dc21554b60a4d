"""The simulated network and compute settings (--latency and the options beside it): one
group of config/settings.py's RunConfig, declared here to keep that module by job."""
from __future__ import annotations

from dataclasses import dataclass

from fednet.config.declare import setting

LATENCY_PRESETS = ("none", "lan", "wan", "hetero")


@dataclass(frozen=True)
class LatencyConfig:
    """Per-client simulated compute speed and links; real=True also sleeps the delays."""

    preset: str = setting(
        "lan", f"Client profiles: {', '.join(LATENCY_PRESETS)} or a CSV/JSON file "
        "(rtt_s, up_bps, down_bps in bytes/s or with a unit: 100Mbit, 12.5MB; train_flops_per_s "
        "or compute_s_per_sample; `fednet calibrate` writes one)", option="--latency", metavar="PRESET|FILE")
    file: str = setting("", "The profiles' CSV/JSON file (set by --latency FILE)",
                        option="--latency", metavar="PRESET|FILE")
    real: bool = setting(False, "Also sleep the simulated delays (demonstrations); figures use "
                         "the virtual clock", option="--real-time/--virtual-time")
    time_scale: float = setting(1.0, "Multiplier on slept delays in --real-time mode", gt=0,
                                option="--time-scale")
    shaped: bool = setting(
        False, "With --real-time: the network itself runs every transfer at the profiles' rates "
        "(e.g. tc tbf per host), so only the latencies and the compute are slept, not the "
        "transfers", option="--shaped-links/--simulated-links")
    availability: str = setting(
        "", "When clients are online: always, offline:F[:S], diurnal[:DAY[:ON]] or a CSV/JSON "
        "trace (client,start,end in simulated seconds)", option="--availability",
        shown="always")
    server_bandwidth: float = setting(
        0.0, "The server's link, each way, shared fairly by concurrent server<->client transfers "
        "(peer hand-offs do not use it): 100Mbit, 1Gbit, 12.5MB (a plain number is bytes/s; a "
        "TOML file may give the text)", ge=0, option="--server-bandwidth", metavar="RATE",
        shown="unlimited", note="0: unlimited")
    deadline: float = setting(
        0.0, "Simulated seconds per round; results that arrive later are stragglers (counted, "
        "not aggregated)", ge=0, option="--deadline", metavar="S", shown="none", note="0: none")
    over_select: float = setting(
        1.0, "Select ceil(F x the round's target) clients and keep the first target results to "
        "arrive", ge=1, le=100, option="--over-select", metavar="F")
    server_profile: str = setting(
        "xeon-core", "The server's compute rates: xeon-core (one server core), none (free) or a "
        "JSON file of rates (`fednet calibrate --server-out` writes this host's); its "
        "aggregation is charged on the clock at them", option="--server-profile",
        metavar="PRESET|FILE")
