"""Starting runs on one machine: the warm zygote, client spawning and GPU pinning."""
