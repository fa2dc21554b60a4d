"""fednet-example-plugin: FedNova (algorithm), tiny_mlp (model), blobs (dataset)."""
__version__ = "0.1.0"
