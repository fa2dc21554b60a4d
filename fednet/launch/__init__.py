"""Starting clients on one machine: the warm zygote, client spawning, fednet clients."""
