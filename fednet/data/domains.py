"""Domain groups (docs/algorithms.md §2.5, §2.6) and per-client label permutations (§2.4) of Factorized-FL."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fednet.errors import ConfigError
from fednet.rng import generator

DOMAIN_CLIENTS = 20
"""The domain partition has 5 domains of 4 clients each: client k belongs to domain k // 4."""

CLIENTS_PER_DOMAIN = 4

DIGITS_DOMAINS: tuple[tuple[int, ...], ...] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
"""2.6: five digit pairs."""

CIFAR100_DOMAINS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # 2.5's reconstruction: two coarse superclasses per domain (fine-class names as in CIFAR-100's meta).
    ("household_objects", ("clock", "keyboard", "lamp", "telephone", "television",
                           "bed", "chair", "couch", "table", "wardrobe")),
    ("fruits_and_foods", ("bottle", "bowl", "can", "cup", "plate",
                          "apple", "mushroom", "orange", "pear", "sweet_pepper")),
    ("trees_and_flowers", ("orchid", "poppy", "rose", "sunflower", "tulip",
                           "maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree")),
    ("transport", ("bicycle", "bus", "motorcycle", "pickup_truck", "train",
                   "lawn_mower", "rocket", "streetcar", "tank", "tractor")),
    # GUESS (the paper does not list its Animals classes): large carnivores + large omnivores/herbivores.
    ("animals", ("bear", "leopard", "lion", "tiger", "wolf",
                 "camel", "cattle", "chimpanzee", "elephant", "kangaroo")),
)
"""2.5: the five CIFAR-100 domains of ten fine classes each (the Animals domain is a guess)."""

DOMAIN_DATASETS = ("digits", "cifar100")


def domain_classes(dataset: str, class_names: Sequence[str] | None = None) -> list[np.ndarray]:
    """Sorted int64 class ids of each of the 5 domains; cifar100 needs the dataset's fine-label names."""
    if dataset == "digits":
        return [np.array(g, dtype=np.int64) for g in DIGITS_DOMAINS]
    if dataset == "cifar100":
        names = list(class_names or ())
        if not names:
            raise ConfigError(
                "--partition domain on cifar100 needs the dataset's fine-label names (Dataset.class_names); "
                "load it with load_dataset('cifar100', --data-root) and pass class_names"
            )
        where = {n: i for i, n in enumerate(names)}
        lost = [n for _, group in CIFAR100_DOMAINS for n in group if n not in where]
        if lost:
            raise ConfigError(
                f"--partition domain: the cifar100 class names lack {lost[0]!r} (and {len(lost) - 1} more); "
                "point --data-root at the official CIFAR-100 files"
            )
        return [np.array(sorted(where[n] for n in group), dtype=np.int64) for _, group in CIFAR100_DOMAINS]
    raise ConfigError(
        f"--partition domain is defined for --dataset {' or '.join(DOMAIN_DATASETS)}, not {dataset!r}; "
        "use iid, dirichlet or shards"
    )


def check_domain_clients(num_clients: int) -> None:
    """Raise ConfigError unless num_clients is the 20 the domain partition needs."""
    if int(num_clients) != DOMAIN_CLIENTS:
        raise ConfigError(
            f"--partition domain needs --clients {DOMAIN_CLIENTS} (5 domains x {CLIENTS_PER_DOMAIN} clients), "
            f"got {num_clients}; pass --clients {DOMAIN_CLIENTS}"
        )


def domain_split(labels: np.ndarray, groups: list[np.ndarray], seed: int) -> list[np.ndarray]:
    """Clients 4g..4g+3 share domain g's samples IID (shuffled, sizes differ by at most one)."""
    rng = generator(seed, "partition/domain")
    parts: list[np.ndarray] = []
    for classes in groups:
        idx = rng.permutation(np.flatnonzero(np.isin(labels, classes))).astype(np.int64)
        parts.extend(np.array_split(idx, CLIENTS_PER_DOMAIN))
    return parts


def domain_test_indices(
    test_y: np.ndarray,
    cid: int,
    num_clients: int,
    *,
    dataset: str = "digits",
    class_names: Sequence[str] | None = None,
) -> np.ndarray:
    """Sorted int64 indices of the test samples of client cid's domain (digits: its group's two digits)."""
    check_domain_clients(num_clients)
    if not 0 <= int(cid) < DOMAIN_CLIENTS:
        raise ConfigError(f"client id {cid} is outside 0..{DOMAIN_CLIENTS - 1} for --clients {DOMAIN_CLIENTS}")
    classes = domain_classes(dataset, class_names)[int(cid) // CLIENTS_PER_DOMAIN]
    return np.flatnonzero(np.isin(np.asarray(test_y), classes)).astype(np.int64)


def label_permutation(num_classes: int, seed: int, cid: int) -> np.ndarray:
    """Client cid's private permutation of 0..num_classes-1 (2.4), deterministic in (seed, cid)."""
    if int(num_classes) < 1:
        raise ConfigError(f"label permutation needs at least one class (got {num_classes})")
    return generator(seed, "labels/permutation", client=int(cid)).permutation(int(num_classes)).astype(np.int64)


def client_labels(y: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """The labels as the client sees them: class c becomes perm[c] (apply to its train and test labels)."""
    return np.asarray(perm, dtype=np.int64)[np.asarray(y, dtype=np.int64)]
