"""Process and platform utilities (a leaf: imports nothing from fednet but fednet.errors).

proc.py: parent-death signal, SIGTERM as an interrupt, open-file limits, memory readings;
gpus.py: --gpus parsing and device pinning; hugepages.py: 2 MiB pages before a large fork;
packing.py: --clients-per-process auto; malloc.py: freed memory kept for big models.
"""
